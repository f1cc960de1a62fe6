"""Sigstore bundles (v0.3, key mode) as OCI referrers, on a registry with the referrers API
(go-containerregistry's pkg/registry) and one without (Debian's docker-registry 2.8: the spec's
fallback tag). Judged by cosign 3.1 (Debian sid), which reads bundles, and by our verify; where a
bundle and a tag signature both exist they must agree. The image is a small one pushed here: what
is signed, not how big, is under test (tests/test_attest.py signs a real build)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from bakery.dev import stack
from bakery.oci import referrers
from bakery.oci.refs import Digest, Reference
from bakery.oci.registry import OCI_MANIFEST, Registry
from bakery.oci.store import RegistryStore, signature_tag
from bakery.trust import attest, bundle, keys, policy as policy_mod, provenance, sign, verify
from bakery.trust.statement import Statement
from support import ROOT

COSIGN3 = ROOT / ".tools" / "bin" / "cosign3"
SLSA = provenance.SLSA_PREDICATE
SMOKE = provenance.TEST_RESULT_PREDICATE


@pytest.fixture(scope="module", params=["api", "fallback"])
def where(request, registry):
    """(registry host, how it lists referrers)."""
    if request.param == "api":
        return stack.ensure_referrers_registry(), referrers.API
    return registry, "the fallback tag"


def signer() -> sign.Signer:
    return sign.Signer(ec.generate_private_key(ec.SECP256R1()))


def pem(tmp_path, s: sign.Signer, name: str) -> str:
    path = tmp_path / f"{name}.pub"
    path.write_bytes(keys.public_pem(s.private_key.public_key()))
    return str(path)


def image(host: str, name: str) -> Reference:
    """A one-layer image of its own, a fresh digest each run (the registries outlive a test run)."""
    store = RegistryStore(Reference(host, f"bundles/{name}", "1"))
    layer = store.put_blob(os.urandom(64), "application/vnd.oci.image.layer.v1.tar")
    config = store.put_blob(json.dumps({"architecture": "amd64", "os": "linux",
                                        "rootfs": {"type": "layers", "diff_ids": [str(layer.digest)]}}).encode(),
                            "application/vnd.oci.image.config.v1+json")
    body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": config.to_json(),
                       "layers": [layer.to_json()]}).encode()
    digest = store.put_manifest("1", body)
    return Reference(host, f"bundles/{name}", None, digest)


def bundles(store, ref: Reference) -> list:
    """(predicate type, bundle bytes, hint) of each bundle the listing names."""
    read = [bundle.read_referrer(store, r, ref.pin, "referrer") for r in referrers.listing(store, ref.pin).referrers]
    return [r for r in read if r is not None]


def rules(*signers: sign.Signer) -> policy_mod.Policy:
    release = policy_mod.Role("release", tuple(s.private_key.public_key() for s in signers))
    return policy_mod.Policy({"release": release, "smoke": policy_mod.Role("smoke", ()),
                              "rebuilder": policy_mod.Role("rebuilder", ())}, ("*",), ("local",), ("127.0.0.1:*/*",),
                             True, "", False, "")


def cosign3(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(COSIGN3), *args, "--insecure-ignore-tlog=true", "--allow-http-registry"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": "/tmp"})


def provenance_of(ref: Reference, builder: str) -> bytes:
    return Statement.about(ref, SLSA, {"runDetails": {"builder": {"id": builder}}}).raw


def test_cosign3_reads_our_bundles_where_the_registry_lists_them(where, tmp_path):
    host, via = where
    key = signer()
    ref = image(host, f"both-{via[:8].replace(' ', '')}")
    store = RegistryStore(ref)
    attest.sign_image(store, ref, key)
    attest.attach(store, ref, {SLSA: provenance_of(ref, "local")}, key)
    listing = referrers.listing(store, ref.pin)
    assert listing.via.startswith(via) and len(bundles(store, ref)) == 2
    # cosign 3 reads the bundles (not the tags: delete those and it still passes, below)
    assert cosign3("verify", "--key", pem(tmp_path, key, "k"), str(ref)).returncode == 0
    att = cosign3("verify-attestation", "--key", pem(tmp_path, key, "k"), "--type", "slsaprovenance1", str(ref))
    assert att.returncode == 0, att.stderr
    wrong = cosign3("verify", "--key", pem(tmp_path, signer(), "other"), str(ref))
    assert wrong.returncode != 0
    found = verify.cosign_signers(store, ref.pin, rules(key).roles["release"], rules(key))
    assert found is not None and found.by == {key.keyid}, found
    assert found.read == [f"tag {signature_tag(ref.pin, 'sig')}", f"1 bundle(s) via {listing.via}"]


def test_bundles_alone_verify_with_cosign3_and_ours(where, tmp_path):
    host, via = where
    key = signer()
    ref = image(host, f"bundle-only-{via[:8].replace(' ', '')}")
    store = RegistryStore(ref)
    attest.sign_image(store, ref, key, ("bundle",))
    attest.attach(store, ref, {SLSA: provenance_of(ref, "local")}, key, ("bundle",))
    assert store.manifest(signature_tag(ref.pin, "sig")) is None and store.manifest(signature_tag(ref.pin, "att")) is None
    assert cosign3("verify", "--key", pem(tmp_path, key, "k"), str(ref)).returncode == 0
    assert cosign3("verify-attestation", "--key", pem(tmp_path, key, "k"), "--type", "slsaprovenance1",
                   str(ref)).returncode == 0
    policy = rules(key)
    found = verify.cosign_signers(store, ref.pin, policy.roles["release"], policy)
    assert found is not None and found.by == {key.keyid} and found.read[0].startswith("1 bundle(s) via " + via)
    report = verify.Report()
    assert verify._attestations(store, ref, policy, report)[SLSA].builder == "local"
    assert not report.failures, report.checks


def test_a_bundle_and_a_tag_signature_by_different_keys_disagree(where):
    """Both keys are release keys and each signature is valid alone: a verifier reading tags would
    count one key, one reading bundles the other. Refused, in one line."""
    host, via = where
    a, b = signer(), signer()
    ref = image(host, f"disagree-{via[:8].replace(' ', '')}")
    store = RegistryStore(ref)
    attest.sign_image(store, ref, a, ("bundle",))
    attest.sign_image(store, ref, b, ("tag",))
    policy = rules(a, b)
    found = verify.cosign_signers(store, ref.pin, policy.roles["release"], policy)
    assert found is not None and found.by == set() and len(found.reasons) == 1
    assert "the tag signature (by 1 release key(s)) and the bundle signature (by 1) disagree" in found.reasons[0]
    with pytest.raises(Exception, match="disagree"):
        verify.require_signed(store, ref, policy, "image")


def test_statements_that_differ_between_formats_are_refused(where):
    """A provenance in the bundles and another under the .att tag, both signed by the release key."""
    host, via = where
    key = signer()
    ref = image(host, f"differ-{via[:8].replace(' ', '')}")
    store = RegistryStore(ref)
    attest.attach(store, ref, {SLSA: provenance_of(ref, "local")}, key, ("bundle",))
    attest.attach(store, ref, {SLSA: provenance_of(ref, "elsewhere")}, key, ("tag",))
    report = verify.Report()
    found = verify._attestations(store, ref, rules(key), report)
    assert SLSA not in found
    assert [f for f in report.failures if "differ" in f] == [
        f"the {SLSA} statements under the tag and in the bundles differ: refused (a verifier reading either format "
        f"must see the same statements)"]


def test_a_new_statement_supersedes_the_bundle_of_its_type(where):
    """A FAILED smoke result then a PASSED one: one bundle of that type stays listed, as the .att tag
    keeps one layer per type (verify refuses two of one type)."""
    host, via = where
    key = signer()
    ref = image(host, f"supersede-{via[:8].replace(' ', '')}")
    store = RegistryStore(ref)
    for result in ("FAILED", "PASSED"):
        attest.attach(store, ref, {SMOKE: Statement.about(ref, SMOKE, {"result": result}).raw}, key)
    attest.attach(store, ref, {SLSA: provenance_of(ref, "local")}, key)
    assert sorted(kind for kind, _, _ in bundles(store, ref)) == sorted([SMOKE, SLSA])
    payloads = [json.loads(sign.read_envelope(bundle.envelope_of(data, "r"), "r")[1]) for _, data, _ in bundles(store, ref)]
    assert {p["predicate"].get("result") for p in payloads if p["predicateType"] == SMOKE} == {"PASSED"}


def test_a_bundle_with_a_certificate_is_not_read_in_key_mode():
    data = json.dumps({"mediaType": bundle.BUNDLE, "dsseEnvelope": {},
                       "verificationMaterial": {"certificate": {"rawBytes": "AA=="}}}).encode()
    with pytest.raises(Exception, match="not a public key"):
        bundle.envelope_of(data, "bundle")
    with pytest.raises(Exception, match="not application/vnd.dev.sigstore.bundle.v0.3"):
        bundle.envelope_of(json.dumps({"mediaType": "application/vnd.dev.sigstore.bundle+json;version=0.2",
                                       "dsseEnvelope": {}, "verificationMaterial": {}}).encode(), "bundle")


def test_a_bundle_copied_from_another_image_is_refused(where, tmp_path):
    """Image A's signature bundle, attached to image B as its referrer: the statement names A."""
    host, via = where
    key = signer()
    a, b = (image(host, f"copied-{n}-{via[:8].replace(' ', '')}") for n in ("a", "b"))
    store = RegistryStore(b)
    envelope = sign.envelope(key, bundle.signature_statement(a))
    desc = store.put_blob(bundle.of_envelope(envelope), bundle.BUNDLE)
    referrers.attach(store, b.pin, bundle.referrer_manifest(store, desc, b, bundle.COSIGN_SIGN), bundle.BUNDLE, {})
    policy = rules(key)
    found = verify.cosign_signers(store, b.pin, policy.roles["release"], policy)
    assert found is not None and found.by == set()
    assert found.reasons == [f"signature is for {a.pin}, not {b.pin} (copied from another image)"]
    assert cosign3("verify", "--key", pem(tmp_path, key, "k"), str(b)).returncode != 0


# -- a registry's listing is only where to look (the attacker review of 2026-12-06) --------------------

def put_listing(store, subject: Reference, entries: list[dict]) -> None:
    """The fallback tag's index as a pusher may write it."""
    store.put_index(referrers.fallback_tag(subject.pin), json.dumps(
        {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries}).encode())


def entry(store, digest, artifact_type: str) -> dict:
    body = store.manifest(str(digest))
    return {"mediaType": OCI_MANIFEST, "digest": str(digest), "size": len(body), "artifactType": artifact_type}


def test_mirror_never_deletes_what_a_pushed_listing_names_that_is_not_a_referrer(registry):
    """A pusher lists image B in A's fallback index at the mirror; mirroring A must leave B be."""
    from bakery.oci import mirror

    key = signer()
    a, b = image(registry, "mirror-src"), image(registry, "mirror-victim")
    attest.sign_image(RegistryStore(a), a, key)
    dest = RegistryStore(Reference(registry, b.repository, None))  # A is copied into B's repository
    put_listing(dest, a, [entry(dest, b.pin, bundle.BUNDLE)])
    mirror.copy_signed(RegistryStore(a), a, dest, log=lambda line: None)
    assert dest.manifest(str(b.pin)) is not None


def test_a_referrer_marked_a_bundle_anywhere_is_judged_not_skipped(registry):
    """cosign 3 takes the listing's artifactType: a manifest it reads as a bundle must not be one we
    pass over because the manifest's own artifactType says otherwise."""
    key = signer()
    ref = image(registry, "marked")
    store = RegistryStore(ref)
    attest.sign_image(store, ref, key)
    envelope = sign.envelope(key, provenance_of(ref, "an old statement"))
    desc = store.put_blob(bundle.of_envelope(envelope), bundle.BUNDLE)
    doc = json.loads(bundle.referrer_manifest(store, desc, ref, SLSA))
    del doc["artifactType"]
    body = json.dumps(doc).encode()
    store.put_manifest(None, body)
    listed = json.loads(store.manifest(referrers.fallback_tag(ref.pin)) or b"")["manifests"]
    put_listing(store, ref, listed + [{**entry(store, Digest.of(body), bundle.BUNDLE)}])
    found, _, reasons = verify._bundles(store, ref.pin)
    assert reasons == [f"referrer {Digest.of(body)}: marked a bundle, but not one {bundle.BUNDLE} layer under that "
                       f"artifactType: refused"]


def test_a_bundle_of_another_image_in_the_listing_is_refused_and_never_superseded(registry):
    key = signer()
    a, b = image(registry, "subject-a"), image(registry, "subject-b")
    store_b = RegistryStore(b)
    attest.attach(store_b, b, {SLSA: provenance_of(b, "local")}, key, ("bundle",))
    b_bundle = bundles(store_b, b)
    store_a = RegistryStore(Reference(registry, b.repository, None, a.pin))
    body = RegistryStore(a).manifest(str(a.pin))
    assert body is not None
    for d in json.loads(body)["layers"] + [json.loads(body)["config"]]:  # image A beside B, as a pusher may
        Registry(registry).mount_blob(b.repository, Digest.parse(d["digest"]), a.repository)
    store_a.put_manifest(None, body)
    b_referrer = json.loads(store_b.manifest(referrers.fallback_tag(b.pin)) or b"")["manifests"]
    put_listing(store_a, a, b_referrer)
    _, _, reasons = verify._bundles(store_a, a.pin)
    assert len(reasons) == 1 and f"a bundle about {b.pin}, listed as a referrer of {a.pin}: refused" in reasons[0]
    attest.attach(store_a, a, {SLSA: provenance_of(a, "local")}, key, ("bundle",))  # supersedes its own only
    assert bundles(store_b, b) == b_bundle


@pytest.mark.parametrize("listing, says", [
    ({"manifests": [{"mediaType": OCI_MANIFEST, "size": 1}]}, "an entry without a digest"),
    ({"manifests": [{"mediaType": OCI_MANIFEST, "digest": "sha512:" + "a" * 128, "size": 1}]}, "not named by a sha256"),
    ({"manifests": "x"}, "manifests is not a list"),
])
def test_a_malformed_listing_is_an_integrity_error(listing, says):
    from bakery.errors import IntegrityError

    with pytest.raises(IntegrityError, match=says):
        referrers._parse(json.dumps(listing).encode(), "listing")


def test_a_rebuilder_key_with_two_words_for_one_digest_is_not_counted():
    """An old match=True put back beside the rebuilder's newer match=False."""
    ref = Reference("r.example", "x", None, Digest("sha256", "ab" * 32))
    report = verify.Report()
    verify._rebuilds([({"k1"}, {"match": True, "result": str(ref.digest)}),
                      ({"k1"}, {"match": False, "result": "sha256:" + "cd" * 32})], ref, 1, report)
    assert report.failures[0].startswith("1 rebuilder key(s) signed more than one rebuild statement")
    assert "rebuilt to this digest by 0 of 1" in report.failures[1]


def test_verify_lists_and_reads_each_referrer_once(registry):
    """The signature and the attestations are judged from one reading of the listing: a registry
    that lists 256 referrers is asked for each once, not once per check."""
    key = signer()
    ref = image(registry, "read-once")
    store = RegistryStore(ref)
    attest.sign_image(store, ref, key)
    attest.attach(store, ref, {SLSA: provenance_of(ref, "local")}, key)
    asked: list[str] = []
    original = store.manifest

    def counting(reference: str):
        asked.append(reference)
        return original(reference)

    store.manifest = counting  # type: ignore[method-assign]
    verify.verify(store, ref, rules(key), blobs=False)
    listed = [str(r.descriptor.digest) for r in referrers.listing(RegistryStore(ref), ref.pin).referrers]
    assert len(listed) == 2 and all(asked.count(d) == 1 for d in listed), asked
    assert asked.count(referrers.fallback_tag(ref.pin)) == 1


def test_a_statement_holding_its_type_in_two_cases_is_refused_as_cosign_finds_none(where, tmp_path):
    """From the attacker's side: a signed statement saying predicateType test-result (PASSED) and,
    in capitals, SLSA provenance. cosign 3 reads no attestation of either type from it; Python's
    json read it as a PASSED smoke result. Readers that disagree: verify refuses it."""
    host, via = where
    key = signer()
    ref = image(host, f"twocase-{via[:8].replace(' ', '')}")
    store = RegistryStore(ref)
    attest.sign_image(store, ref, key)
    raw = json.dumps({"_type": "https://in-toto.io/Statement/v1", "predicateType": SMOKE,
                      "predicate": {"result": "PASSED"},
                      "subject": [{"name": ref.name, "digest": {"sha256": ref.pin.hex}}], "PREDICATETYPE": SLSA})
    attest.attach(store, ref, {SMOKE: raw.encode()}, key)
    for kind in (SMOKE, SLSA):
        found = cosign3("verify-attestation", "--key", pem(tmp_path, key, "k"), "--type", kind, str(ref))
        assert found.returncode != 0 and "none of the attestations matched" in found.stderr, found.stderr
    report = verify.Report()
    policy = rules(key)
    policy.roles["smoke"] = dataclasses.replace(policy.roles["release"], name="smoke")  # it may sign smoke results too
    assert verify._attestations(store, ref, policy, report) == {}
    assert any("not an in-toto statement" in f and "twice" in f for f in report.failures), report.failures
