"""No tracebacks, ever. A hostile proxy in front of the real registry serves mutated manifests,
indexes, configs, layer tars and headers, and cuts bodies short; whatever it serves, reading a
base and verifying an image end in a result or in one BakeryError (one `error:` line at the CLI,
with its exit code), never another exception, a tag or a partial file.

The documents are hostile but consistently hashed where the test chooses (the pin names the
mutated manifest's digest), so the parsers are exercised, not only the digest checks.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
import tempfile
from pathlib import Path

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings, strategies as st

from bakery.base import spec as base_mod
from bakery.base.filesystem import BaseFilesystem
from bakery.base.layercache import LayerCache
from bakery.errors import BakeryError
from bakery.oci.refs import Reference
from bakery.oci.registry import OCI_INDEX, OCI_MANIFEST, Registry
from proxy import FaultyProxy
from support import invoke

SITE = "usr/local/lib/python3.12/dist-packages"
PATHS = [f"{SITE}/vllm/v1/kv_offload/cpu/gpu_worker.py", f"{SITE}/vllm/envs.py", "etc/os-release"]
MEDIA = {"tar": "application/vnd.oci.image.layer.v1.tar", "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
         "zstd": "application/vnd.oci.image.layer.v1.tar+zstd"}
REPO = "fuzz/base"
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


names = st.one_of(st.sampled_from(PATHS + [f"{SITE}/vllm", f"{SITE}/.wh..wh..opq", f"{SITE}/vllm/.wh.envs.py",
                                           "../../etc/passwd", "/abs/path", "", "./", "a/" * 60 + "deep"]),
                  st.text(min_size=1, max_size=40))
entries = st.lists(st.tuples(names, st.sampled_from(["file", "dir", "symlink", "hardlink", "fifo"]),
                             st.binary(max_size=64), names), max_size=6)


def tar_of(items) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, kind, data, link in items:
            info = tarfile.TarInfo(name or "x")
            info.type = {"file": tarfile.REGTYPE, "dir": tarfile.DIRTYPE, "symlink": tarfile.SYMTYPE,
                         "hardlink": tarfile.LNKTYPE, "fifo": tarfile.FIFOTYPE}[kind]
            info.linkname = link if kind in ("symlink", "hardlink") else ""
            info.size = len(data) if kind == "file" else 0
            tar.addfile(info, io.BytesIO(data) if kind == "file" else None)
    return out.getvalue()


def compress(data: bytes, kind: str) -> bytes:
    if kind == "gzip":
        return gzip.compress(data, mtime=0)
    if kind == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


@st.composite
def mutated(draw, data: bytes) -> bytes:
    """Some bytes flipped, cut, or inserted (or left alone)."""
    op = draw(st.sampled_from(["keep", "flip", "cut", "insert", "garbage"]))
    if op == "keep" or not data:
        return data
    at = draw(st.integers(0, len(data) - 1))
    if op == "flip":
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    if op == "cut":
        return data[:at]
    if op == "insert":
        return data[:at] + draw(st.binary(min_size=1, max_size=16)) + data[at:]
    return draw(st.binary(max_size=64))


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids,
                                                                                     max_size=3), max_leaves=8)


@st.composite
def hostile_base(draw):
    """(overrides for the proxy, the digest to pin): a layer, a config, a manifest and maybe an
    index, one of them hostile (the rest valid, so that the hostile one is reached), each served
    under the digest of the bytes served."""
    hostile_part = draw(st.sampled_from(["layer", "layer", "layer", "config", "manifest", "index", "none"]))

    def maybe(part, data: bytes) -> bytes:
        return draw(mutated(data)) if part == hostile_part else data

    kind = draw(st.sampled_from(list(MEDIA)))
    raw = tar_of(draw(entries))
    layer = maybe("layer", compress(raw, kind))
    config_doc = {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": [sha(raw)]}}
    if hostile_part == "config":
        config_doc = draw(st.sampled_from([config_doc, {"rootfs": None}, {"rootfs": {"diff_ids": 7}}, []]))
    config = maybe("config", json.dumps(config_doc).encode())
    layer_desc = {"mediaType": MEDIA[kind], "digest": sha(layer), "size": len(layer)}
    manifest_doc = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(config),
                               "size": len(config)},
                    "layers": [layer_desc]}
    ctype = OCI_MANIFEST
    if hostile_part == "manifest":
        layer_desc["mediaType"] = draw(st.sampled_from([MEDIA[kind], MEDIA["gzip"], "text/plain"]))
        layer_desc["size"] = draw(st.sampled_from([len(layer), 0, len(layer) + 1, -1]))
        if draw(st.booleans()):
            manifest_doc[draw(st.sampled_from(["config", "layers", "mediaType"]))] = draw(json_values)
        ctype = draw(st.sampled_from([OCI_MANIFEST, "application/json", "text/html; charset=x", ""]))
    manifest = maybe("manifest", json.dumps(manifest_doc).encode())
    served = {f"/v2/{REPO}/blobs/{sha(layer)}": (200, {}, layer), f"/v2/{REPO}/blobs/{sha(config)}": (200, {}, config),
              f"/v2/{REPO}/manifests/{sha(manifest)}": (200, {"Content-Type": ctype}, manifest)}
    top = sha(manifest)
    if hostile_part == "index" or draw(st.booleans()):
        platform = {"os": "linux", "architecture": "amd64"}
        if hostile_part == "index":
            platform = draw(st.sampled_from([platform, {"os": "linux"}, None, "amd64"]))
        index = maybe("index", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
            {"mediaType": OCI_MANIFEST, "digest": sha(manifest), "size": len(manifest),
             "platform": platform}]}).encode())
        served[f"/v2/{REPO}/manifests/{sha(index)}"] = (200, {"Content-Type": OCI_INDEX}, index)
        top = sha(index)
    return served, top


@pytest.fixture(scope="module")
def hostile(registry):
    with FaultyProxy(registry, []) as proxy:
        yield proxy


@SETTINGS
@given(case=hostile_base())
def test_reading_a_hostile_base_ends_in_a_result_or_one_bakery_error(hostile, case):
    served, top = case
    hostile.overrides = served
    reg = Registry(hostile.host)
    with tempfile.TemporaryDirectory() as cache:
        try:
            image = base_mod.resolve(reg, Reference.parse(f"{hostile.host}/{REPO}@{top}"), "linux/amd64")
            fs = BaseFilesystem(reg, image, LayerCache(Path(cache)))
            fs.read(PATHS)
            fs.glob(f"{SITE}/*")
        except BakeryError:
            pass


@st.composite
def hostile_signature(draw, signed_manifest: bytes):
    doc = json.loads(signed_manifest)
    if draw(st.booleans()):
        doc[draw(st.sampled_from(["layers", "config"]))] = draw(json_values)
    layers = doc.get("layers") if isinstance(doc, dict) else None
    if draw(st.booleans()) and isinstance(layers, list) and layers and isinstance(layers[0], dict):
        layers[0]["annotations"] = draw(st.one_of(json_values, st.dictionaries(
            st.sampled_from(["dev.cosignproject.cosign/signature", "predicateType"]), st.text(max_size=20))))
    return draw(mutated(json.dumps(doc).encode()))


@pytest.fixture(scope="module")
def signed_image(registry, fixture_base, fixture_lock, tmp_path_factory):
    from support import copy_project, dev_policy, last_line

    project = copy_project(tmp_path_factory.mktemp("fuzz") / "project", fixture_lock)
    env = {"BAKERY_KEY_PASSWORD": "pw"}
    keys = tmp_path_factory.mktemp("fuzz-keys")
    assert invoke(project, "keygen", "--out", str(keys), env=env).returncode == 0
    ref = last_line(invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/fuzz/signed:1"))
    assert invoke(project, "attest", ref, "--key", str(keys / "release.key"), env=env).returncode == 0
    return project, Reference.parse(ref), keys / "release.pub", dev_policy(keys / "policy.yaml", fixture_base)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_verifying_against_hostile_signatures_fails_checks_never_crashes(hostile, signed_image, data):
    from bakery.oci.store import RegistryStore, signature_tag
    from bakery.trust import policy as policy_mod, verify

    project, ref, pub, policy_path = signed_image
    upstream = Registry(ref.registry)
    served = {}
    for suffix in ("sig", "att"):
        tag = signature_tag(ref.digest, suffix)
        body, _, _ = upstream.get_manifest(Reference(ref.registry, ref.repository, tag))
        if data.draw(st.booleans()):
            served[f"/v2/{ref.repository}/manifests/{tag}"] = (200, {"Content-Type": OCI_MANIFEST},
                                                               data.draw(hostile_signature(body)))
    hostile.overrides = served
    policy = policy_mod.load_policy(policy_path, project, {"release": [pub]})
    mirror = Reference(hostile.host, ref.repository, None, ref.digest)
    report = verify.verify(RegistryStore(mirror), mirror, policy, blobs=False)
    assert report.checks  # a report, whatever was served

    def parses(body: bytes) -> bool:
        try:
            return isinstance(json.loads(body).get("layers"), list)
        except (ValueError, AttributeError):
            return False

    if any(not parses(body) for _, _, body in served.values()):
        assert report.failures  # what cannot be read cannot pass


@pytest.mark.parametrize("fault", [("GET", "/manifests/", "truncate"), ("GET", "/blobs/", "truncate"),
                                   ("GET", "/manifests/", "header:Content-Type=text/html"),
                                   ("GET", "/manifests/", "header:Content-Length=1")])
def test_a_cut_or_lying_response_is_one_clean_line_and_leaves_nothing(registry, fixture_base, project, fault):
    """Through the CLI, as a user meets it: one `error:` line, a BakeryError exit code, no record,
    no tag at the destination."""
    with FaultyProxy(registry, [fault] * 6) as proxy:
        base = f"{proxy.host}/{fixture_base.repository}@{fixture_base.digest}"
        env = {"BAKERY_CACHE": str(project / "cold-cache")}  # a warm cache would never ask for the blobs
        result = invoke(project, "build", "--base", base, "--push", f"{registry}/fuzz/cut:1", env=env)
    if result.returncode == 0:  # a lie the checks could see through (the digest still matched)
        return
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and result.returncode in (2, 3, 4, 5, 6), result.stderr
    assert not (project / "out" / "build-record.json").exists()
    assert not Registry(registry).manifest_exists("fuzz/cut", Reference.parse("x@sha256:" + "0" * 64).pin)
    from bakery.errors import NotFound

    with pytest.raises(NotFound):
        Registry(registry).get_manifest(Reference(registry, "fuzz/cut", "1"))
