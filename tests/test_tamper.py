"""The tamper corpus: one table of what an attacker (or an accident) changes, the exit code it
must produce, and the check that must fire, across `invoke build` and `invoke verify`.

Each case starts from an honest state (a fresh project copy, or a fresh copy of an honest signed
image in a repository of its own), changes one thing, and asserts that exact check, not only a
non-zero exit.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import yaml

from bakery import attest as attest_mod, keys, sign, smoke
from bakery.refs import Descriptor, Digest, Reference
from bakery.registry import OCI_MANIFEST, Registry
from bakery.store import RegistryStore, signature_tag

from conftest import ROOT, copy_project, dev_policy, invoke, last_line
from proxy import FaultyProxy

PASSWORD = {"BAKERY_KEY_PASSWORD": "pw"}
FENCE_ID = "cpu-kv-transfer-fence"


# -- build: the project or the registry is tampered with ---------------------------------------------

def lock_of(p):
    return json.loads((p / "overlays" / "overlays.lock").read_text())


def edit_lock(p, overlay_id, key, value):
    doc = lock_of(p)
    next(e for e in doc["overlays"] if e["id"] == overlay_id)[key] = value
    (p / "overlays" / "overlays.lock").write_text(json.dumps(doc))


def edit(path: Path, old: str, new: str):
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def patch_context_changed(p, ctx):
    edit(p / "overlays" / "patches" / f"{FENCE_ID}.patch", "             else torch.Event(enable_timing=True)",
         "             else torch.Event(enable_timing=False)")


def fix_neutered_and_relocked(p, ctx):
    """The fence patch replaced by a harmless-looking edit of the same file, and the lock edited by
    hand to match (`invoke lock` refuses to pin it): every hash agrees, only the proof sees that the
    race is back."""
    import hashlib

    from bakery.patch import unified_diff

    sha = next(e["base_sha256"] for e in lock_of(p)["overlays"] if e["id"] == FENCE_ID)
    stock = (p / "overlays" / "stock" / sha).read_bytes()
    neutered = stock.replace(b"        if self.gpu_to_cpu:\n", b"        if self.gpu_to_cpu:  # reviewed\n", 1)
    assert neutered != stock
    patch = unified_diff(stock, neutered, "vllm/v1/kv_offload/cpu/gpu_worker.py")
    (p / "overlays" / "patches" / f"{FENCE_ID}.patch").write_bytes(patch)
    edit_lock(p, FENCE_ID, "patch_sha256", hashlib.sha256(patch).hexdigest())
    edit_lock(p, FENCE_ID, "result_sha256", hashlib.sha256(neutered).hexdigest())


def lock_for_another_base(p, ctx):
    doc = lock_of(p)
    doc["base"] = "docker.io/x/y@sha256:" + "3" * 64
    (p / "overlays" / "overlays.lock").write_text(json.dumps(doc))


def stock_altered(p, ctx):
    path = p / "overlays" / "stock" / next(e["base_sha256"] for e in lock_of(p)["overlays"] if e["id"] == FENCE_ID)
    path.write_bytes(path.read_bytes() + b"# edited\n")


def stock_removed(p, ctx):
    (p / "overlays" / "stock" / next(e["base_sha256"] for e in lock_of(p)["overlays"] if e["id"] == FENCE_ID)).unlink()


def port_renamed(p, ctx):
    ports = p / "overlays" / "patches" / "ports" / "independent-draft-gumbel"
    sha = next(e["base_sha256"] for e in lock_of(p)["overlays"] if e["id"] == "independent-draft-gumbel")
    next(ports.glob("*.patch")).rename(ports / f"{sha}.patch")


def port_unknown_base(p, ctx):
    port = p / "overlays" / "patches" / "ports" / FENCE_ID / f"{'ab' * 32}.patch"
    port.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(p / "overlays" / "patches" / f"{FENCE_ID}.patch", port)


def table_altered(p, ctx):
    path = p / "tuning" / "dsv4-mi300x-a8w8-blockscale-bpreshuffle-ck.prefill-m2688.csv"
    path.write_text(path.read_text().replace("11.2214", "11.2215", 1))


def table_for_another_gpu(p, ctx):
    edit(p / "tuning" / "tuning.yaml", "    sha256: 5227c3e2619f107a911e55baef706b26766f3c608687cfdb2fc0f84c236096d9\n", "")
    path = p / "tuning" / "dsv4-a8w8-blockscale-tuned-gemm.mi300x.prefill-m2688.csv"
    path.write_text(path.read_text().replace("gfx942,304,", "gfx950,256,", 1))


def base_served_with_other_bytes(p, ctx):
    """The registry answers the pinned digest with another manifest (a proxy in between)."""
    body = b'{"schemaVersion": 2, "mediaType": "' + OCI_MANIFEST.encode() + b'", "config": {}, "layers": []}'
    ref = ctx["base"]
    proxy = FaultyProxy(ctx["registry"], [], {f"/v2/{ref.repository}/manifests/{ref.digest}":
                                              (200, {"Content-Type": OCI_MANIFEST}, body)}).__enter__()
    ctx["cleanup"].append(lambda: proxy.__exit__(None, None, None))
    return ["--base", f"{proxy.host}/{ref.repository}@{ref.digest}"]


def base_layer_corrupted(p, ctx):
    ref = ctx["base"]
    proxy = FaultyProxy(ctx["registry"], [("GET", "/blobs/", "corrupt")] * 20).__enter__()
    ctx["cleanup"].append(lambda: proxy.__exit__(None, None, None))
    ctx["env"]["BAKERY_CACHE"] = str(p / "cold-cache")  # a warm cache would never read the layers
    return ["--base", f"{proxy.host}/{ref.repository}@{ref.digest}"]


BUILD_CASES = [
    ("patch context edited", patch_context_changed, 5, "does not apply exactly"),
    ("fix neutered and re-locked", fix_neutered_and_relocked, 5, f"overlay '{FENCE_ID}': its proof says BROKEN"),
    ("lock: result sha256 edited", lambda p, c: edit_lock(p, FENCE_ID, "result_sha256", "0" * 64), 5,
     "lock expects 0000000000000000000000000000000000000000000000000000000000000000"),
    ("lock: base sha256 edited", lambda p, c: edit_lock(p, FENCE_ID, "base_sha256", "1" * 64), 5,
     "the base changed under the overlay"),
    ("lock: patch sha256 edited", lambda p, c: edit_lock(p, FENCE_ID, "patch_sha256", "2" * 64), 5,
     "the patch was edited"),
    ("lock: for another base", lock_for_another_base, 5, "is for base docker.io/x/y@sha256:3333"),
    ("stock bytes altered", stock_altered, 5, "name must be its sha256"),
    ("stock bytes removed", stock_removed, 5, "overlays/stock does not hold"),
    ("port named for other bytes", port_renamed, 5, "does not apply exactly to the bytes it is named for"),
    ("port for an unknown base", port_unknown_base, 2, "an unknown base"),
    ("tuning table altered", table_altered, 5, "tuning.yaml says 0e58ab92"),
    ("tuning table for another GPU", table_for_another_gpu, 2, "1 of 8 rows are for gfx950 with cu_num 256"),
    ("patch aimed at another file", lambda p, c: edit(p / "overlays" / "patches" / f"{FENCE_ID}.patch",
                                                      "+++ b/vllm/v1/kv_offload/cpu/gpu_worker.py",
                                                      "+++ b/vllm/envs.py"), 2, "not its target"),
    ("base pinned by tag", lambda p, c: ["--base", f"{c['base'].registry}/{c['base'].repository}:latest"], 2,
     "has no digest: pin it as NAME@sha256"),
    ("base digest unknown", lambda p, c: ["--base", f"{c['base'].registry}/{c['base'].repository}@sha256:" + "4" * 64],
     3, "not found on"),
    ("registry serves other bytes for the pin", base_served_with_other_bytes, 5, "registry returned bytes with digest"),
    ("registry serves a corrupt layer", base_layer_corrupted, 5, "does not match its descriptor"),
    ("SOURCE_DATE_EPOCH not a number", lambda p, c: c["env"].update(SOURCE_DATE_EPOCH="yesterday"), 2,
     "is not a whole number of seconds"),
    ("unknown key in image.yaml", lambda p, c: (p / "image" / "image.yaml").write_text(
        (p / "image" / "image.yaml").read_text() + "entrypiont: [/bin/sh]\n"), 2, "unknown key(s) entrypiont"),
]


@pytest.mark.parametrize("case, mutate, code, check", BUILD_CASES, ids=[c[0] for c in BUILD_CASES])
def test_build_refuses(case, mutate, code, check, tmp_path, registry, fixture_base, fixture_lock):
    project = copy_project(tmp_path / "project", fixture_lock)
    ctx = {"base": fixture_base, "registry": registry, "env": {}, "cleanup": []}
    try:
        extra = mutate(project, ctx)  # arguments for the build, or anything else for none
        extra = extra if isinstance(extra, list) else ["--base", str(fixture_base)]
        result = invoke(project, "build", *extra, "--push", f"{registry}/tamper/build:{len(case)}", env=ctx["env"])
    finally:
        for undo in ctx["cleanup"]:
            undo()
    assert "Traceback" not in result.stderr, result.stderr
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
    assert result.returncode == code and len(errors) == 1 and check in errors[0], result.stderr
    assert not (project / "out" / "build-record.json").exists()


# -- verify: the registry is tampered with ------------------------------------------------------------

@pytest.fixture(scope="module")
def honest(registry, fixture_base, fixture_lock, tmp_path_factory):
    """One honest image, signed and attested with the release key, smoke-attested with the smoke key."""
    root = tmp_path_factory.mktemp("tamper")
    project = copy_project(root / "project", fixture_lock)
    for role, where in (("release", "k"), ("smoke", "k"), ("release", "other")):
        assert invoke(project, "keygen", "--role", role, "--out", str(root / where), env=PASSWORD).returncode == 0
    built = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/tamper/honest:1")
    ref = Reference.parse(last_line(built))
    assert invoke(project, "attest", str(ref), "--key", str(root / "k" / "release.key"), env=PASSWORD).returncode == 0
    os.environ.update(PASSWORD)
    try:
        signers = {name: sign.Signer(keys.load_private(root / d / f"{r}.key"))
                   for name, d, r in (("release", "k", "release"), ("smoke", "k", "smoke"), ("other", "other", "release"))}
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    record = json.loads((project / "out" / "build-record.json").read_text())
    report = {"image": str(ref), "result": "PASSED", "passed": ["health", "http", "regression", "vram"], "failed": [],
              "regression_compared": 4}
    smoke.attach_report(RegistryStore(ref), ref, report, b"spec", signers["smoke"])
    return {"project": project, "root": root, "ref": ref, "record": record, "signers": signers, "base": fixture_base,
            "report": report}


def clone(h, name: str) -> Reference:
    """The honest image with its .sig and .att, in a repository of its own (blobs mounted)."""
    reg, src = Registry(h["ref"].registry), h["ref"]
    dest = Reference(src.registry, f"tamper/{name}", None, src.digest)
    for tag in (str(src.digest), signature_tag(src.digest, "sig"), signature_tag(src.digest, "att")):
        body, media_type, _ = reg.get_manifest(Reference(src.registry, src.repository, None if tag.startswith("sha256:")
                                                         else tag, Digest.parse(tag) if tag.startswith("sha256:") else None))
        doc = json.loads(body)
        for d in [doc["config"]] + doc["layers"]:
            reg.mount_blob(dest.repository, Digest.parse(d["digest"]), src.repository)
        reg.put_manifest(dest.repository, tag, body, media_type)
    return dest


def att_layers(ref: Reference) -> tuple[Registry, dict, str]:
    reg = Registry(ref.registry)
    tag = signature_tag(ref.digest, "att")
    return reg, json.loads(reg.get_manifest(Reference(ref.registry, ref.repository, tag))[0]), tag


def drop_predicate(kind):
    def mutate(h, ref):
        reg, doc, tag = att_layers(ref)
        doc["layers"] = [l for l in doc["layers"] if l["annotations"]["predicateType"] != kind]
        reg.put_manifest(ref.repository, tag, json.dumps(doc).encode(), OCI_MANIFEST)
    return mutate


def delete_tag(suffix):
    def mutate(h, ref):
        reg = Registry(ref.registry)
        # the distribution server cannot delete tags without a config flag: point the tag at an empty artifact
        empty = RegistryStore(ref).put_blob(b"{}", "application/vnd.oci.image.config.v1+json")
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": empty.to_json(), "layers": []})
        reg.put_manifest(ref.repository, signature_tag(ref.digest, suffix), body.encode(), OCI_MANIFEST)
    return mutate


def reattest(record_edit=None, signer="release", smoke_signer=None, smoke_report=None):
    def mutate(h, ref):
        record = json.loads(json.dumps(h["record"]))
        if record_edit:
            record_edit(record)
        record["manifest"]["digest"] = str(ref.digest)
        attest_mod.attest(RegistryStore(ref), ref, record, h["signers"][signer])
        if smoke_signer:
            smoke.attach_report(RegistryStore(ref), ref, {**h["report"], "image": str(ref), **(smoke_report or {})},
                                b"spec", h["signers"][smoke_signer])
    return mutate


def envelope_payload_swapped(h, ref):
    """The provenance's payload rewritten (base changed), the old signature kept."""
    reg, doc, tag = att_layers(ref)
    layer = next(l for l in doc["layers"] if l["annotations"]["predicateType"] == "https://slsa.dev/provenance/v1")
    env = json.loads(reg.fetch_blob(ref.repository, Descriptor.from_json(layer)))
    statement = json.loads(base64.b64decode(env["payload"]))
    statement["predicate"]["buildDefinition"]["externalParameters"]["base"] = "docker.io/evil/base@sha256:" + "5" * 64
    env["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    blob = json.dumps(env).encode()
    desc = Descriptor.of(layer["mediaType"], blob)
    reg.upload_blob(ref.repository, desc, lambda: iter([blob]))
    layer.update(digest=str(desc.digest), size=desc.size)
    reg.put_manifest(ref.repository, tag, json.dumps(doc).encode(), OCI_MANIFEST)


def signature_malformed(h, ref):
    reg = Registry(ref.registry)
    sig = signature_tag(ref.digest, "sig")
    doc = json.loads(reg.get_manifest(Reference(ref.registry, ref.repository, sig))[0])
    doc["layers"][0]["annotations"]["dev.cosignproject.cosign/signature"] = "%%% not base64 %%%"
    reg.put_manifest(ref.repository, sig, json.dumps(doc).encode(), OCI_MANIFEST)


def unsigned_image_under_our_name(h, ref):
    """The base itself pushed under our image's repository: a real image, none of our signatures."""
    reg = Registry(ref.registry)
    body, media_type, digest = reg.get_manifest(h["base"])
    for d in [json.loads(body)["config"]] + json.loads(body)["layers"]:
        reg.mount_blob(ref.repository, Digest.parse(d["digest"]), h["base"].repository)
    reg.put_manifest(ref.repository, "unsigned", body, media_type)
    return Reference(ref.registry, ref.repository, None, digest)


def policy_with(**over):
    def make(h, path):
        return dev_policy(path, h["base"], **over)
    return make


def threshold_two(h, path):
    dev_policy(path, h["base"])
    doc = yaml.safe_load(path.read_text())
    doc["roles"] = {"release": {"keys": [str(h["root"] / "other" / "release.pub")], "threshold": 2}}
    path.write_text(yaml.safe_dump(doc))
    return path


def same_key_twice(h, path):
    """threshold 2, met on paper by listing the one real key twice (a copy under another name)."""
    dev_policy(path, h["base"])
    copy = path.parent / "release-copy.pub"
    shutil.copy(h["root"] / "k" / "release.pub", copy)
    doc = yaml.safe_load(path.read_text())
    doc["roles"] = {"release": {"keys": [str(h["root"] / "k" / "release.pub"), str(copy)], "threshold": 2}}
    path.write_text(yaml.safe_dump(doc))
    return path


GITHUB = ["https://github.com/dsv4-mi300x/bakery/.github/workflows/release.yml@refs/tags/v*"]
VERIFY_CASES = [
    # (case, mutate(h, ref) -> None | other ref, policy(h, path) | None, require smoke, the check that must fire)
    ("unsigned image under our name", unsigned_image_under_our_name, None, False, "FAIL signature manifest"),
    ("signed with another key", reattest(signer="other"), None, False, "not signed by a release key of the policy"),
    ("signature malformed", signature_malformed, None, False, "FAIL signature valid for this digest, by 0 of 1"),
    ("attestations pointed at an empty artifact", delete_tag("att"), None, False,
     "FAIL SBOM (SPDX 2.3) attestation present and signed"),
    ("signature pointed at an empty artifact", delete_tag("sig"), None, False, "FAIL signature valid for this digest"),
    ("SBOM removed", drop_predicate("https://spdx.dev/Document"), None, False,
     "FAIL SBOM (SPDX 2.3) attestation present and signed"),
    ("provenance removed", drop_predicate("https://slsa.dev/provenance/v1"), None, False,
     "FAIL SLSA provenance attestation present and signed"),
    ("provenance payload swapped, signature kept", envelope_payload_swapped, None, False,
     "signed by 0 of 1 required release key(s)"),
    ("provenance names another base", reattest(lambda r: r["base"].update(pinned="docker.io/x/y@sha256:" + "6" * 64)),
     None, False, "FAIL provenance base is the pinned"),
    ("provenance from a dirty checkout", reattest(lambda r: r["source"].update(dirty=True)),
     policy_with(allow_dirty=False), False, "FAIL built from a checkout with uncommitted or untracked changes"),
    ("provenance from an unlisted builder", None, policy_with(allowed_builders=GITHUB), False,
     "FAIL builder local is an allowed builder"),
    ("provenance from an unlisted source", None, policy_with(allowed_sources=["https://github.com/dsv4-mi300x/bakery"]),
     False, "is an allowed repository"),
    ("signature names an unlisted repository", None, policy_with(allowed_repositories=["ghcr.io/other/*"]), False,
     "which the policy's allowed_repositories do not list"),
    ("fewer signers than the threshold", None, threshold_two, False, "by 1 of 2 required release key(s)"),
    ("one key listed twice to meet the threshold", None, same_key_twice, False,
     "attestation https://spdx.dev/Document signed by 1 of 2 required release key(s)"),
    ("SBOM and provenance signed by the smoke key", reattest(signer="smoke"), None, False,
     "signed by 0 of 1 required release key(s)"),
    ("smoke result signed by the release key", reattest(smoke_signer="release"), None, True,
     "signed by 0 of 1 required smoke key(s)"),
    ("smoke PASSED that compared nothing", reattest(smoke_signer="smoke", smoke_report={"regression_compared": 0}),
     None, True, "(result PASSED, 0 outputs compared)"),
    ("smoke FAILED", reattest(smoke_signer="smoke", smoke_report={"result": "FAILED", "failed": ["vram"]}), None, True,
     "(result FAILED"),
    ("smoke RECORDED", reattest(smoke_signer="smoke", smoke_report={"result": "RECORDED", "regression_compared": 0}),
     None, True, "(result RECORDED"),
    ("no smoke result at all", drop_predicate("https://in-toto.io/attestation/test-result/v0.1"), None, True,
     "(none attached"),
]


@pytest.mark.parametrize("case, mutate, policy, require_smoke, check", VERIFY_CASES, ids=[c[0] for c in VERIFY_CASES])
def test_verify_refuses(case, mutate, policy, require_smoke, check, honest, tmp_path):
    ref = clone(honest, re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-"))
    ref = (mutate(honest, ref) if mutate else None) or ref
    policy_path = (policy or policy_with())(honest, tmp_path / "policy.yaml")
    keyargs = ["--key", str(honest["root"] / "k" / "release.pub"), "--smoke-key", str(honest["root"] / "k" / "smoke.pub")]
    result = invoke(honest["project"], "verify", str(ref), *keyargs, "--policy", str(policy_path),
                    *(["--require-smoke"] if require_smoke else []))
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 5 and check in result.stdout, result.stdout + result.stderr


def test_the_honest_image_verifies(honest, tmp_path):
    """The control: the same clone, unchanged, passes with smoke required."""
    ref = clone(honest, "control")
    keyargs = ["--key", str(honest["root"] / "k" / "release.pub"), "--smoke-key", str(honest["root"] / "k" / "smoke.pub")]
    result = invoke(honest["project"], "verify", str(ref), *keyargs, "--policy",
                    str(policy_with()(honest, tmp_path / "p.yaml")), "--require-smoke")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_corpus_is_at_least_thirty_cases():
    assert len(BUILD_CASES) + len(VERIFY_CASES) >= 30
