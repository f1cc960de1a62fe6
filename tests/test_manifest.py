"""Manifest.parse: the one reader of the image manifests bakery gets from stores (registries, base
builders, signers). Whatever way one is malformed is one IntegrityError naming it."""

from __future__ import annotations

import json

import pytest

from bakery.errors import IntegrityError
from bakery.oci.manifest import Manifest

DIGEST = "sha256:" + "ab" * 32
LAYER = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": DIGEST, "size": 3,
         "annotations": {"org.opencontainers.image.title": "a.so"}}
GOOD = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.example", "annotations": {"k": "v"},
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": DIGEST, "size": 2},
        "layers": [LAYER, LAYER]}


def test_a_manifest_gives_its_config_layers_and_artifact_type():
    m = Manifest.parse(json.dumps(GOOD).encode(), "manifest x")
    assert str(m.config.digest) == DIGEST and m.config.size == 2
    assert [layer.annotations["org.opencontainers.image.title"] for layer in m.layers] == ["a.so", "a.so"]
    assert m.blobs == (m.config, *m.layers)
    assert (m.artifact_type, m.annotations) == ("application/vnd.example", {"k": "v"})


@pytest.mark.parametrize("body", [
    b"not json",
    b"[]",
    json.dumps({**GOOD, "config": None}).encode(),
    json.dumps({k: v for k, v in GOOD.items() if k != "layers"}).encode(),
    json.dumps({**GOOD, "layers": [{"mediaType": "x", "size": 1}]}).encode(),  # no digest
    json.dumps({**GOOD, "layers": [{**LAYER, "digest": "sha256:short"}]}).encode(),
    json.dumps({**GOOD, "annotations": ["k"]}).encode(),
    json.dumps({**GOOD, "layers": "all of them"}).encode(),
    json.dumps({**GOOD, "layers": {}}).encode(),  # read as no layers before
    json.dumps({**GOOD, "layers": ""}).encode(),
])
def test_a_malformed_manifest_is_one_integrity_error_naming_it(body):
    with pytest.raises(IntegrityError, match=r"^manifest of somewhere is malformed \("):
        Manifest.parse(body, "manifest of somewhere")


def test_past_the_layer_limit_is_refused_before_any_descriptor_is_read():
    body = json.dumps({**GOOD, "layers": [LAYER] * 3}).encode()
    assert len(Manifest.parse(body, "m", layer_limit=3).layers) == 3
    with pytest.raises(IntegrityError, match="it lists 4 layers, past the 3 it may"):
        Manifest.parse(json.dumps({**GOOD, "layers": [LAYER] * 4}).encode(), "m", layer_limit=3)


def _object(*pairs: tuple[str, str]) -> str:
    """A JSON object written pair by pair (each value as JSON text), so a key can come twice."""
    return "{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in pairs) + "}"


def _fields(doc: dict, *more: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple((k, json.dumps(v)) for k, v in doc.items()) + more


WITHOUT = {k: {n: v for n, v in GOOD.items() if n != k} for k in ("config", "layers")}
CONFIG: dict = dict(GOOD["config"])  # type: ignore[call-overload]  # GOOD mixes value types
CASES = {  # what Go's decoder (cosign, skopeo, containerd) reads as one field, and Python's as two
    "layers twice in two cases": _object(*_fields(GOOD, ("LAYERS", "[]"))),
    "config twice": _object(*_fields(GOOD, ("config", json.dumps({**CONFIG, "size": 9})))),
    "a layer's digest in two cases": _object(*_fields(WITHOUT["layers"], (
        "layers", "[" + _object(*_fields(LAYER, ("Digest", json.dumps("sha256:" + "cd" * 32)))) + "]"))),
    "the config's size in two cases": _object(*_fields(WITHOUT["config"], (
        "config", _object(*_fields(CONFIG, ("SIZE", "7")))))),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_field_go_reads_as_one_and_python_as_two_is_refused(case):
    """Before, Python's exact keys read the first of each pair, while a Go reader takes the last
    case-insensitive match: the manifest would name other blobs to each."""
    json.loads(CASES[case])  # well-formed JSON: what refuses it is the case rule
    with pytest.raises(IntegrityError, match="twice"):
        Manifest.parse(CASES[case].encode(), "manifest x")


def test_annotations_are_a_go_map_whose_keys_are_exact():
    body = json.dumps({**GOOD, "annotations": {"k": "v", "K": "w"},
                       "layers": [{**LAYER, "annotations": {"t": "1", "T": "2"}}]}).encode()
    m = Manifest.parse(body, "manifest x")
    assert m.annotations == {"k": "v", "K": "w"} and m.layers[0].annotations == {"t": "1", "T": "2"}


@pytest.mark.parametrize("size", ['"3"', "3.0", "true"], ids=["a string", "a float", "a bool"])
def test_a_size_go_would_not_decode_as_int64_is_refused(size):
    body = json.dumps({**GOOD, "layers": [{**LAYER, "size": "SIZE"}]}).encode().replace(b'"SIZE"', size.encode())
    with pytest.raises(IntegrityError, match="size"):
        Manifest.parse(body, "manifest x")


def test_an_index_entrys_platform_and_a_referrers_listing_are_read_as_go_reads_them():
    """The base's index: an entry whose platform says os twice would be linux/amd64 to Python and
    another platform to Go (containerd, Docker). A referrers index with its manifests twice would
    list other referrers to cosign. Both are refused."""
    from bakery.base.spec import select_platform
    from bakery.files import Fields
    from bakery.oci import referrers

    entry = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": DIGEST, "size": 3}
    platform = _object(("os", '"linux"'), ("architecture", '"amd64"'), ("OS", '"windows"'))
    index = _object(("manifests", "[" + _object(*_fields(entry, ("platform", platform))) + "]"))
    with pytest.raises(ValueError, match="twice"):
        select_platform(json.loads(index, object_pairs_hook=Fields.of), "linux/amd64", "index x")
    assert json.loads(index)["manifests"][0]["platform"]["os"] == "linux"  # what Python alone would read
    listing = _object(("schemaVersion", "2"), ("manifests", json.dumps([entry])), ("Manifests", "[]"))
    with pytest.raises(IntegrityError, match="twice"):
        referrers._parse(listing.encode(), "referrers x")


@pytest.mark.parametrize("spelled", ["Platform", "PLATFORM"])
def test_an_index_entry_spelling_platform_otherwise_is_refused(spelled):
    """Alone, with no twin: Go takes "Platform" for the entry's platform and would pick that entry
    for linux/amd64; Python read no platform there and picked another entry."""
    from bakery.base.spec import select_platform
    from bakery.files import Fields

    entry = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": DIGEST, "size": 3}
    other = {**entry, "digest": "sha256:" + "cd" * 32, "platform": {"os": "linux", "architecture": "amd64"}}
    index = json.dumps({"manifests": [{**entry, spelled: {"os": "linux", "architecture": "amd64"}}, other]})
    with pytest.raises(ValueError, match="Go reads them as one"):
        select_platform(json.loads(index, object_pairs_hook=Fields.of), "linux/amd64", "index x")


@pytest.mark.parametrize("key", ["\u017fize", "Size", "SIZE"], ids=["long s", "Size", "SIZE"])
def test_a_descriptor_spelling_size_otherwise_is_refused(key):
    body = json.dumps({**GOOD, "layers": [{**{k: v for k, v in LAYER.items() if k != "size"}, key: 3}]}).encode()
    with pytest.raises(IntegrityError, match="Go reads them as one"):
        Manifest.parse(body, "manifest x")


def test_keys_go_keeps_apart_are_not_taken_for_twins():
    """Python's casefold makes the ligature \ufb01 "fi" (and \u00df "ss"); Go's fold keeps them apart,
    so "con\ufb01g" is neither a twin of "config" nor the field: taken, and ignored as Go ignores it."""
    body = json.dumps({**GOOD, "con\ufb01g": 1, "cla\u00dfes": 2}).encode()
    assert Manifest.parse(body, "manifest x").config.size == 2


@pytest.mark.parametrize("size", [-1, 1 << 63], ids=["negative", "past int64"])
def test_a_size_no_blob_can_have_is_refused(size):
    with pytest.raises(IntegrityError, match="size"):
        Manifest.parse(json.dumps({**GOOD, "layers": [{**LAYER, "size": size}]}).encode(), "manifest x")


def test_descriptor_annotations_must_be_an_object_of_strings():
    for given in (["pa", "qb"], {"k": 1}):
        with pytest.raises(IntegrityError, match="annotations"):
            Manifest.parse(json.dumps({**GOOD, "layers": [{**LAYER, "annotations": given}]}).encode(), "m")


def test_a_referrers_subject_is_read_as_go_reads_it():
    """The subject says which image a referrer (a Sigstore bundle) is about: with its digest twice
    in two cases, Python read the first and cosign the last (one image to each)."""
    subject = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": DIGEST, "size": 3}
    read = Manifest.parse(json.dumps({**GOOD, "subject": subject}).encode(), "m").subject
    assert read is not None and str(read.digest) == DIGEST
    twice = _object(*_fields(GOOD, ("subject", _object(*_fields(subject, ("Digest", json.dumps("sha256:" + "cd" * 32)))))))
    with pytest.raises(IntegrityError, match="twice"):
        Manifest.parse(twice.encode(), "m")


@pytest.mark.parametrize("change", [{"digest": 5}, {"mediaType": 5}, {"mediaType": ["a"]}],
                         ids=["digest a number", "mediaType a number", "mediaType a list"])
def test_a_descriptor_field_of_the_wrong_type_is_one_integrity_error(change):
    """Before: an AttributeError out of the digest's parser (a traceback), or a media type that
    failed later, where a layer's compression is picked."""
    with pytest.raises(IntegrityError, match="malformed"):
        Manifest.parse(json.dumps({**GOOD, "layers": [{**LAYER, **change}]}).encode(), "manifest x")


def test_a_manifest_nested_past_recursion_has_no_media_type_and_no_traceback():
    from bakery.oci import registry

    assert registry._own_media_type(b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}") is None


@pytest.mark.parametrize("index", [b'{"manifests": [], "Manifests": []}', b'{"manifests": null}',
                                   b'{"manifests": [{"mediaType": "x", "digest": 5, "size": 1}]}'],
                         ids=["manifests twice", "manifests null", "a digest a number"])
def test_mirroring_a_malformed_index_is_one_integrity_error(index):
    from bakery.oci import mirror
    from bakery.oci.refs import Digest, Reference
    from bakery.oci.registry import OCI_INDEX

    class Upstream:
        def get_manifest(self, ref):
            return index, OCI_INDEX, Digest.of(index)

    src = Reference.parse("127.0.0.1:1/upstream/x@" + str(Digest.of(index)))
    with pytest.raises(IntegrityError, match="index"):
        mirror.copy(src, Reference.parse("127.0.0.1:2/ours/x"), {"127.0.0.1:1": Upstream(), "127.0.0.1:2": object()},
                    log=lambda m: None)


@pytest.mark.parametrize("body", [json.dumps(GOOD).encode("utf-16"), b"\xef\xbb\xbf" + json.dumps(GOOD).encode(),
                                  json.dumps({**GOOD, "mediaType": ["x"]}).encode(),
                                  json.dumps({**GOOD, "artifactType": {}}).encode()],
                         ids=["UTF-16", "a byte order mark", "mediaType a list", "artifactType an object"])
def test_a_manifest_go_would_not_decode_is_refused(body):
    """Python's json.loads guesses UTF-16 and skips a BOM; Go's decoder takes neither. A media type
    that is no string went on to a request header (a traceback in http.client)."""
    with pytest.raises(IntegrityError, match="malformed"):
        Manifest.parse(body, "manifest x")


def test_mirroring_an_index_nested_deep_stops_at_its_depth():
    from bakery.oci import mirror
    from bakery.oci.refs import Digest, Reference
    from bakery.oci.registry import OCI_INDEX

    child = {"mediaType": OCI_INDEX, "digest": DIGEST, "size": 3}
    index = json.dumps({"schemaVersion": 2, "manifests": [child, child]}).encode()  # itself, twice, forever
    asked = []

    class Upstream:
        def get_manifest(self, ref):
            asked.append(ref)
            return index, OCI_INDEX, Digest.of(index)

    with pytest.raises(IntegrityError, match="nested past"):
        mirror.copy(Reference.parse("127.0.0.1:1/up/x@" + DIGEST), Reference.parse("127.0.0.1:2/ours/x"),
                    {"127.0.0.1:1": Upstream(), "127.0.0.1:2": object()}, log=lambda m: None)
    assert len(asked) == mirror.INDEX_DEPTH + 1  # one child of each level, not two
