"""The tamper corpus: one table of what an attacker (or an accident) changes, the exit code it
must produce, and the check that must fire, across `invoke build` and `invoke verify`.

Each case starts from an honest state (a fresh project copy, or a fresh copy of an honest signed
image in a repository of its own), changes one thing, and asserts that exact check, not only a
non-zero exit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from bakery.errors import InputError, IntegrityError
from bakery.inputs import hip, hip_compile, kernel_artifact
from bakery.oci import referrers
from bakery.oci.manifest import Manifest
from bakery.oci.refs import Descriptor, Digest, Reference
from bakery.oci.registry import OCI_MANIFEST, Registry
from bakery.oci.store import RegistryStore, signature_tag
from bakery.release import smoke_report
from bakery.trust import attest as attest_mod, keys, provenance, sign
from bakery.trust.record import BuildRecord
from proxy import FaultyProxy
from support import ROOT, cold_compile_cache, copy_project, dev_policy, invoke, last_line, passing_report

PASSWORD = {"BAKERY_KEY_PASSWORD": "pw"}
FENCE_ID = "cpu-kv-transfer-fence"
SLSA, SPDX, TEST_RESULT = provenance.SLSA_PREDICATE, provenance.SPDX_PREDICATE, provenance.TEST_RESULT_PREDICATE
MI300X = {"name": "mi300x-runner", "gpus": 8, "gfx_arch": "gfx942", "compute_units": 304,
          "driver_version": "6.10.5", "rocm_version": "6.4.1"}


def slug(case: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", case.lower()).strip("-")


@pytest.fixture(scope="module")
def tamper_keys(tmp_path_factory):
    """Key pairs: k/release, k/smoke (the project's two roles) and other/release (a stranger's)."""
    root = tmp_path_factory.mktemp("keys")
    for role, where in (("release", "k"), ("smoke", "k"), ("release", "other")):
        assert invoke(ROOT, "keygen", "--role", role, "--out", str(root / where), env=PASSWORD).returncode == 0
    os.environ.update(PASSWORD)
    try:
        signers = {name: sign.Signer(keys.load_private(root / d / f"{r}.key"))
                   for name, d, r in (("release", "k", "release"), ("smoke", "k", "smoke"), ("other", "other", "release"))}
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    return {"root": root, "signers": signers}


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

    from bakery.inputs.patch import unified_diff

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


def variant_base(ctx, edit_config) -> Reference:
    """The fixture base with its config edited (layers mounted, untouched), pushed by digest."""
    reg, base = Registry(ctx["registry"]), ctx["base"]
    body, _, _ = reg.get_manifest(base)
    manifest = json.loads(body)
    config = edit_config(json.loads(reg.fetch_blob(base.repository, Descriptor.from_json(manifest["config"]))))
    repo = f"tamper/base-{ctx['slug']}"
    for layer in manifest["layers"]:
        reg.mount_blob(repo, Digest.parse(layer["digest"]), base.repository)
    desc = Descriptor.of(manifest["config"]["mediaType"], config)
    reg.upload_blob(repo, desc, lambda: iter([config]))
    manifest["config"] = desc.to_json()
    digest = reg.put_manifest(repo, "latest", json.dumps(manifest).encode(), manifest["mediaType"])
    return Reference(ctx["registry"], repo, None, digest)


def diff_id_swapped(p, ctx):
    """A base whose config names other layer contents than its layers decompress to."""
    def edit(config):
        config["rootfs"]["diff_ids"][-1] = "sha256:" + "9" * 64
        return json.dumps(config).encode()
    return ["--base", str(variant_base(ctx, edit))]


def config_over_4_mib(p, ctx):
    return ["--base", str(variant_base(ctx, lambda c: json.dumps(c).encode() + b" " * (5 << 20)))]


def credentials_sent_elsewhere(p, ctx):
    """A registry that points uploads at another origin (which forwards to the same storage): our
    login must not go there, and the push fails on that server's 401 instead."""
    elsewhere = FaultyProxy(ctx["basic_registry"], []).__enter__()
    proxy = FaultyProxy(ctx["basic_registry"], [], location_host=elsewhere.host).__enter__()
    ctx["cleanup"] += [lambda: proxy.__exit__(None, None, None), lambda: elsewhere.__exit__(None, None, None)]
    ctx["env"].update(BAKERY_REGISTRY_USER="alice", BAKERY_REGISTRY_PASSWORD="s3cret", BAKERY_REGISTRY_HOSTS=proxy.host)
    ctx["push"] = f"{proxy.host}/tamper/creds:1"
    ctx["after"].append(lambda: elsewhere.authorization and all(a is None for _, _, a in elsewhere.authorization))
    return ["--base", str(ctx["base"])]


def forged_kernel_artifact(signer: str | None):
    """Whoever can push to the image's repository puts kernels-<key> there: the real outputs with a
    trojan in the .so, its config consistent. Unsigned, or signed by a key the policy does not list;
    the build is given the release key and a cold compile cache (so it would take the artifact)."""
    def mutate(p, ctx):
        recipe, cache = hip.load(p / "hip"), Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
        key = hip_compile.compile_recipe(recipe, Reference.parse_pinned(os.environ["BAKERY_TOOLCHAIN"]), cache / "hip", log=lambda m: None).key
        outputs = p.parent / "forged-kernels"
        shutil.copytree(cache / "hip" / key[:24], outputs)
        so = outputs / "_C_stable_libtorch.so"
        so.write_bytes(so.read_bytes() + b"\0trojan")
        done = json.loads((outputs / "done.json").read_text())
        done["sha256"]["_C_stable_libtorch.so"] = hashlib.sha256(so.read_bytes()).hexdigest()
        (outputs / "done.json").write_text(json.dumps(done))
        artifact = kernel_artifact.push_artifact(RegistryStore(Reference(ctx["registry"], ctx["repo"])), key, outputs)
        if signer:
            attest_mod.sign_artifact(artifact, ctx["keys"]["signers"][signer])
        ctx["env"]["BAKERY_CACHE"] = str(cold_compile_cache(p.parent))
        return ["--base", str(ctx["base"]), "--key", str(ctx["keys"]["root"] / "k" / "release.pub"),
                "--policy", str(dev_policy(p.parent / "policy.yaml", ctx["base"]))]
    return mutate


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
    # a hostile base or registry (issue 17: transport bounded and scoped)
    ("base config diff_ids do not match its layers", diff_id_swapped, 5,
     "but the image config lists diff_id sha256:9999"),
    ("base config over 4 MiB", config_over_4_mib, 5, "over the 4194304-byte limit for a document"),
    ("upload Location on another origin", credentials_sent_elsewhere, 4,
     "credentials go only to the registry's own origin"),
    # whoever can push to the image's repository chooses no kernels (issue 17: kernels only from a trusted hand)
    ("kernel artifact unsigned", forged_kernel_artifact(None), 5,
     "is signed by 0 of 1 required release key(s) (it has no signature manifest"),
    ("kernel artifact signed by a foreign key", forged_kernel_artifact("other"), 5,
     "(not signed by a release key of the policy); refused: a kernel artifact is used only when a release key "
     "signed it. Compile here instead with `invoke build --recompile`"),
]


@pytest.mark.parametrize("case, mutate, code, check", BUILD_CASES, ids=[c[0] for c in BUILD_CASES])
def test_build_refuses(case, mutate, code, check, tmp_path, registry, basic_registry, fixture_base, fixture_lock,
                       tamper_keys):
    project = copy_project(tmp_path / "project", fixture_lock)
    ctx = {"base": fixture_base, "registry": registry, "basic_registry": basic_registry, "env": {}, "cleanup": [],
           "after": [], "slug": slug(case), "repo": f"tamper/build-{slug(case)}", "keys": tamper_keys}
    ctx["push"] = f"{registry}/{ctx['repo']}:1"
    try:
        extra = mutate(project, ctx)  # arguments for the build, or anything else for none
        extra = extra if isinstance(extra, list) else ["--base", str(fixture_base)]
        result = invoke(project, "build", *extra, "--push", ctx["push"], env=ctx["env"])
    finally:
        for undo in ctx["cleanup"]:
            undo()
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == code and len(errors) == 1 and check in errors[0], result.stderr
    assert not (project / "out" / "build-record.json").exists()
    assert all(check() for check in ctx["after"])


# -- verify: the registry is tampered with ------------------------------------------------------------

def honest_report(ref: Reference, **over) -> dict:
    """A smoke report as `invoke smoke` writes it on an MI300X (none exists here: the host facts are
    those of one, written by hand; the signing and checking around them are real)."""
    return passing_report(str(ref), **{"host": MI300X, **over})  # a case's own host replaces the MI300X


SPEC = (ROOT / "provenance" / "smoke.yaml").read_bytes()


@pytest.fixture(scope="module")
def honest(registry, fixture_base, fixture_lock, tamper_keys, tmp_path_factory):
    """One honest image, signed and attested with the release key, smoke-attested with the smoke key."""
    root = tamper_keys["root"]
    project = copy_project(tmp_path_factory.mktemp("tamper") / "project", fixture_lock)
    built = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/tamper/honest:1")
    ref = Reference.parse(last_line(built))
    assert invoke(project, "attest", str(ref), "--key", str(root / "k" / "release.key"), env=PASSWORD).returncode == 0
    record = json.loads((project / "out" / "build-record.json").read_text())
    smoke_report.attach_report(RegistryStore(ref), ref, honest_report(ref), SPEC, tamper_keys["signers"]["smoke"])
    return {"project": project, "root": root, "ref": ref, "record": record, "signers": tamper_keys["signers"],
            "base": fixture_base}


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
    for desc in referrers.listing(RegistryStore(src), src.pin).manifests():  # its bundles, attached as they were
        body = reg.get_manifest(src.with_digest(desc.digest))[0]
        manifest = Manifest.parse(body, "referrer")
        for d in manifest.blobs:
            reg.mount_blob(dest.repository, d.digest, src.repository)
        referrers.attach(RegistryStore(dest), dest.pin, body, str(manifest.artifact_type), manifest.annotations)
    return dest


def att_layers(ref: Reference) -> tuple[Registry, dict, str]:
    reg = Registry(ref.registry)
    tag = signature_tag(ref.pin, "att")
    return reg, json.loads(reg.get_manifest(Reference(ref.registry, ref.repository, tag))[0]), tag


def put_att(ref: Reference, doc: dict) -> None:
    reg, _, tag = att_layers(ref)
    reg.put_manifest(ref.repository, tag, json.dumps(doc).encode(), OCI_MANIFEST)


def drop_predicate(kind):
    def mutate(h, ref, ctx):
        _, doc, _ = att_layers(ref)
        doc["layers"] = [layer for layer in doc["layers"] if layer["annotations"]["predicateType"] != kind]
        put_att(ref, doc)
    return mutate


def delete_tag(suffix):
    def mutate(h, ref, ctx):
        reg = Registry(ref.registry)
        # the distribution server cannot delete tags without a config flag: point the tag at an empty artifact
        empty = RegistryStore(ref).put_blob(b"{}", "application/vnd.oci.image.config.v1+json")
        body = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": empty.to_json(), "layers": []})
        reg.put_manifest(ref.repository, signature_tag(ref.digest, suffix), body.encode(), OCI_MANIFEST)
    return mutate


def reattest(record_edit=None, signer="release", smoke_signer=None, report_fields=None, spec=SPEC):
    def mutate(h, ref, ctx):
        record = json.loads(json.dumps(h["record"]))
        if record_edit:
            record_edit(record)
        record["manifest"]["digest"] = str(ref.digest)
        attest_mod.attest(RegistryStore(ref), ref, BuildRecord.from_json(record), h["signers"][signer],
                          sign_kernels=False)
        if smoke_signer:
            smoke_report.attach_report(RegistryStore(ref), ref, honest_report(ref, **(report_fields or {})), spec,
                                       h["signers"][smoke_signer])
    return mutate


def add_layer(ref: Reference, envelope: bytes, annotation: str, replace: str | None = None) -> None:
    """Append a DSSE layer to the .att manifest (or put it in place of the layer annotated `replace`)."""
    reg, doc, _ = att_layers(ref)
    desc = RegistryStore(ref).put_blob(envelope, attest_mod.DSSE)
    layer = Descriptor(attest_mod.DSSE, desc.digest, desc.size,
                       {attest_mod.SIGNATURE_ANNOTATION: "", "predicateType": annotation}).to_json()
    if replace:
        doc["layers"] = [layer for layer in doc["layers"] if layer["annotations"]["predicateType"] != replace]
    doc["layers"].append(layer)
    put_att(ref, doc)


def release_key_forges_a_smoke_result(h, ref, ctx):
    """Issue 17's first forgery: no MI300X ran; the release key signs a PASSED test result that
    compared outputs, and its layer is annotated as another type (the one the release key may sign)."""
    drop_predicate(TEST_RESULT)(h, ref, ctx)
    statement = smoke_report.statement(ref, honest_report(ref), SPEC)
    add_layer(ref, sign.envelope(h["signers"]["release"], statement), "https://example.com/scan/v1")


def smoke_key_stands_in_for_the_provenance(h, ref, ctx):
    """Issue 17's second forgery: the key on the runner that executes the candidate replaces the SLSA
    provenance with its own statement of it, annotated as a smoke result."""
    _, doc, _ = att_layers(ref)
    layer = next(layer for layer in doc["layers"] if layer["annotations"]["predicateType"] == SLSA)
    env = json.loads(Registry(ref.registry).fetch_blob(ref.repository, Descriptor.from_json(layer)))
    statement = base64.b64decode(env["payload"])
    add_layer(ref, sign.envelope(h["signers"]["smoke"], statement), TEST_RESULT, replace=SLSA)


def second_statement(kind: str, signer: str, edit):
    """A second, validly signed statement of a type already there: which one counts may not be chosen."""
    def mutate(h, ref, ctx):
        _, doc, _ = att_layers(ref)
        layer = next(layer for layer in doc["layers"] if layer["annotations"]["predicateType"] == kind)
        env = json.loads(Registry(ref.registry).fetch_blob(ref.repository, Descriptor.from_json(layer)))
        statement = json.loads(base64.b64decode(env["payload"]))
        edit(statement["predicate"])
        add_layer(ref, sign.envelope(h["signers"][signer], json.dumps(statement).encode()), kind)
    return mutate


def envelope_payload_swapped(h, ref, ctx):
    """The provenance's payload rewritten (base changed), the old signature kept."""
    reg, doc, tag = att_layers(ref)
    layer = next(layer for layer in doc["layers"] if layer["annotations"]["predicateType"] == SLSA)
    env = json.loads(reg.fetch_blob(ref.repository, Descriptor.from_json(layer)))
    statement = json.loads(base64.b64decode(env["payload"]))
    statement["predicate"]["buildDefinition"]["externalParameters"]["base"] = "docker.io/evil/base@sha256:" + "5" * 64
    env["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    blob = json.dumps(env).encode()
    desc = Descriptor.of(layer["mediaType"], blob)
    reg.upload_blob(ref.repository, desc, lambda: iter([blob]))
    layer.update(digest=str(desc.digest), size=desc.size)
    reg.put_manifest(ref.repository, tag, json.dumps(doc).encode(), OCI_MANIFEST)


def signature_malformed(h, ref, ctx):
    reg = Registry(ref.registry)
    sig = signature_tag(ref.digest, "sig")
    doc = json.loads(reg.get_manifest(Reference(ref.registry, ref.repository, sig))[0])
    doc["layers"][0]["annotations"]["dev.cosignproject.cosign/signature"] = "%%% not base64 %%%"
    reg.put_manifest(ref.repository, sig, json.dumps(doc).encode(), OCI_MANIFEST)


def unsigned_image_under_our_name(h, ref, ctx):
    """The base itself pushed under our image's repository: a real image, none of our signatures."""
    reg = Registry(ref.registry)
    body, media_type, digest = reg.get_manifest(h["base"])
    for d in [json.loads(body)["config"]] + json.loads(body)["layers"]:
        reg.mount_blob(ref.repository, Digest.parse(d["digest"]), h["base"].repository)
    reg.put_manifest(ref.repository, "unsigned", body, media_type)
    return Reference(ref.registry, ref.repository, None, digest)


def oversized_layer(suffix: str):
    """A .sig or .att layer whose descriptor claims 5 MiB (a real blob of that size is there)."""
    def mutate(h, ref, ctx):
        reg = Registry(ref.registry)
        tag = signature_tag(ref.digest, suffix)
        doc = json.loads(reg.get_manifest(Reference(ref.registry, ref.repository, tag))[0])
        big = b" " * (5 << 20)
        desc = RegistryStore(ref).put_blob(big, doc["layers"][0]["mediaType"])
        doc["layers"][0].update(digest=str(desc.digest), size=desc.size)
        reg.put_manifest(ref.repository, tag, json.dumps(doc).encode(), OCI_MANIFEST)
    return mutate


def served_by_proxy(suffix: str, status: int, body):
    """A registry (a proxy in front of the real one) that answers one manifest with `body`."""
    def mutate(h, ref, ctx):
        tag = str(ref.digest) if suffix == "image" else signature_tag(ref.digest, suffix)
        proxy = FaultyProxy(ref.registry, [], {f"/v2/{ref.repository}/manifests/{tag}":
                                               (status, {"Content-Type": OCI_MANIFEST}, body)}).__enter__()
        ctx["cleanup"].append(lambda: proxy.__exit__(None, None, None))
        ctx["after"].append(lambda: proxy.sent < 32 << 20)  # an endless body was not read on and on
        return Reference(proxy.host, ref.repository, None, ref.digest)
    return mutate


def endless(chunk: bytes):
    def body():
        while True:
            yield chunk
    return body


def older_passed_restored(h, ref, ctx):
    """Issue 28: a registry writer, with no key, puts the smoke key's PASSED envelope back after a
    FAILED that this machine's verify has seen (both real envelopes of the smoke key)."""
    reg, doc, _ = att_layers(ref)
    passed = next(Descriptor.from_json(layer) for layer in doc["layers"] if layer["annotations"]["predicateType"] == TEST_RESULT)
    envelope = reg.fetch_blob(ref.repository, passed)
    smoke_report.attach_report(RegistryStore(ref), ref, honest_report(ref, result="FAILED", failed=["vram"], run=7,
                                                               finished="2026-12-01T10:00:00Z"),
                        SPEC, h["signers"]["smoke"])
    seen = invoke(h["project"], "verify", str(ref), *keyargs(h), "--policy",
                  str(policy_with()(h, h["root"] / f"ledger-{ref.digest.hex[:8]}.yaml")), "--require-smoke")
    assert seen.returncode == 5 and "(result FAILED" in seen.stdout, seen.stdout + seen.stderr
    attest_mod.attach_envelopes(RegistryStore(ref), ref, {TEST_RESULT: envelope})


def policy_with(**over):
    def make(h, path):
        return dev_policy(path, h["base"], **over)
    return make


def roles_policy(roles: dict):
    """The dev policy with these roles ({name: {keys: [paths under the key root], threshold}})."""
    def make(h, path):
        dev_policy(path, h["base"])
        doc = yaml.safe_load(path.read_text())
        doc["roles"] = {name: {"keys": [str(h["root"] / k) for k in role["keys"]], "threshold": role.get("threshold", 1)}
                        for name, role in roles.items()}
        path.write_text(yaml.safe_dump(doc))
        return path
    return make


def same_key_twice(h, path):
    """threshold 2, met on paper by listing the one real key twice (a copy under another name)."""
    shutil.copy(h["root"] / "k" / "release.pub", h["root"] / "release-copy.pub")
    return roles_policy({"release": {"keys": ["k/release.pub", "release-copy.pub"], "threshold": 2}})(h, path)


GITHUB = ["https://github.com/dsv4-mi300x/bakery/.github/workflows/release.yml@refs/tags/v*"]
VERIFY_CASES = [
    # (case, mutate(h, ref, ctx) -> None | other ref, policy(h, path) | None, require smoke, exit code, the check)
    ("unsigned image under our name", unsigned_image_under_our_name, None, False, 5, "FAIL signature manifest"),
    ("signed with another key", reattest(signer="other"), None, False, 5, "not signed by a release key of the policy"),
    ("signature malformed", signature_malformed, None, False, 5, "FAIL signature valid for this digest, by 0 of 1"),
    ("attestations pointed at an empty artifact", delete_tag("att"), None, False, 5,
     "FAIL SBOM (SPDX 2.3) attestation present and signed"),
    ("signature pointed at an empty artifact", delete_tag("sig"), None, False, 5, "FAIL signature valid for this digest"),
    ("SBOM removed", drop_predicate(SPDX), None, False, 5, "FAIL SBOM (SPDX 2.3) attestation present and signed"),
    ("provenance removed", drop_predicate(SLSA), None, False, 5, "FAIL SLSA provenance attestation present and signed"),
    ("provenance payload swapped, signature kept", envelope_payload_swapped, None, False, 5,
     "signed by 0 of 1 required release key(s)"),
    ("provenance names another base", reattest(lambda r: r["base"].update(pinned="docker.io/x/y@sha256:" + "6" * 64)),
     None, False, 5, "FAIL provenance base is the pinned"),
    ("provenance from a dirty checkout", reattest(lambda r: r["source"].update(dirty=True)),
     policy_with(allow_dirty=False), False, 5, "FAIL built from a checkout with uncommitted or untracked changes"),
    ("provenance from an unlisted builder", None, policy_with(allowed_builders=GITHUB), False, 5,
     "FAIL builder local is an allowed builder"),
    ("provenance from an unlisted source", None, policy_with(allowed_sources=["https://github.com/dsv4-mi300x/bakery"]),
     False, 5, "is an allowed repository"),
    ("signature names an unlisted repository", None, policy_with(allowed_repositories=["ghcr.io/other/*"]), False, 5,
     "which the policy's allowed_repositories do not list"),
    ("fewer signers than the threshold", None,
     roles_policy({"release": {"keys": ["other/release.pub"], "threshold": 2}}), False, 5,
     "by 1 of 2 required release key(s)"),
    ("one key listed twice to meet the threshold", None, same_key_twice, False, 5,
     f"attestation {SPDX} signed by 1 of 2 required release key(s)"),
    ("SBOM and provenance signed by the smoke key", reattest(signer="smoke"), None, False, 5,
     "signed by 0 of 1 required release key(s)"),
    ("smoke result signed by the release key", reattest(smoke_signer="release"), None, True, 5,
     "signed by 0 of 1 required smoke key(s)"),
    ("smoke PASSED that compared nothing", reattest(smoke_signer="smoke", report_fields={"ab": {"paths": [
        {"path": "dspark", "compared": 0}, {"path": "native", "compared": 0}]}}), None, True, 5,
     "(result PASSED, no A/B)"),
    ("smoke PASSED against a server started elsewhere", reattest(smoke_signer="smoke", report_fields={
        "launched_container": False, "launched": {"candidate": False, "reference": False}}), None, True, 5,
     "FAIL the gate launched this digest and its reference itself (a result against an --endpoint says what"),
    ("smoke PASSED against a reference at an endpoint", reattest(smoke_signer="smoke", report_fields={
        "launched": {"candidate": True, "reference": False}}), None, True, 5,
     "FAIL the gate launched this digest and its reference itself"),
    ("smoke FAILED", reattest(smoke_signer="smoke", report_fields={"result": "FAILED", "failed": ["vram"]}), None, True,
     5, "(result FAILED"),
    ("smoke RECORDED", reattest(smoke_signer="smoke", report_fields={"result": "RECORDED", "regression_compared": 0}),
     None, True, 5, "(result RECORDED"),
    ("no smoke result at all", drop_predicate(TEST_RESULT), None, True, 5, "(none attached"),
    ("an older PASSED put back over a FAILED this machine saw", older_passed_restored, None, True, 5,
     "FAIL no later FAILED result for this digest and spec in this machine's smoke ledger (this PASSED finished"),
    # issue 17: roles from what is signed
    ("release key forges a smoke result under another annotation", release_key_forges_a_smoke_result, None, True, 5,
     f"attestation layer annotated https://example.com/scan/v1 holds a statement of type {TEST_RESULT}: refused"),
    ("smoke key stands in for the provenance", smoke_key_stands_in_for_the_provenance, None, False, 5,
     f"attestation layer annotated {TEST_RESULT} holds a statement of type {SLSA}: refused"),
    ("two provenance statements for one digest", second_statement(SLSA, "release", lambda p: p["runDetails"].update(
        builder={"id": GITHUB[0].replace("*", "1.0.0")})), None, False, 5,
     f"2 signed statements of type {SLSA} for this digest: refused"),
    ("two smoke results for one digest", second_statement(TEST_RESULT, "smoke", lambda p: p.update(result="FAILED")),
     None, True, 5, f"2 signed statements of type {TEST_RESULT} for this digest: refused"),
    ("one key in two roles", None, roles_policy({"release": {"keys": ["k/release.pub"]},
                                                 "smoke": {"keys": ["k/release.pub"]}}), False, 2,
     "is listed in roles release and smoke: one key vouches for one thing"),
    # issue 17: a smoke result bound to its spec and host
    ("smoke result for an older spec", reattest(smoke_signer="smoke", spec=SPEC.replace(b"seeds: 120", b"seeds: 12", 1)),
     None, True, 5, "(it ran sha256:"),
    ("smoke result from another GPU", reattest(smoke_signer="smoke", report_fields={
        "host": {**MI300X, "gfx_arch": "gfx90a", "compute_units": 104}}), None, True, 5,
     "FAIL the smoke ran on a gfx942 GPU with 304 CUs (it reports PASSED on gfx90a, 104 CUs"),
    ("smoke result from an MI300A (gfx942, 228 CUs)", reattest(smoke_signer="smoke", report_fields={
        "host": {**MI300X, "compute_units": 228}}), None, True, 5,
     "FAIL the smoke ran on a gfx942 GPU with 304 CUs (it reports PASSED on gfx942, 228 CUs"),
    # issue 17: transport bounded
    ("image manifest over 4 MiB, endless", served_by_proxy("image", 200, endless(b"{" * 65536)), None, False, 5,
     "is over the 4194304-byte limit for it; refused after reading"),
    ("signature manifest over 4 MiB", served_by_proxy("sig", 200, b" " * (5 << 20)), None, False, 5,
     "announces 5242880 bytes, over the 4194304-byte limit"),
    ("attestation manifest error body over 64 KiB", served_by_proxy("att", 403, endless(b"x" * 4096)), None, False, 5,
     "error body: the response is over the 65536-byte limit"),
    ("signature payload over 4 MiB", oversized_layer("sig"), None, False, 5,
     "claims 5242880 bytes, over the 4194304-byte limit"),
    ("DSSE envelope over 4 MiB", oversized_layer("att"), None, False, 5,
     "claims 5242880 bytes, over the 4194304-byte limit"),
]


def keyargs(h) -> list[str]:
    return ["--key", str(h["root"] / "k" / "release.pub"), "--smoke-key", str(h["root"] / "k" / "smoke.pub")]


@pytest.mark.parametrize("case, mutate, policy, require_smoke, code, check", VERIFY_CASES,
                         ids=[c[0] for c in VERIFY_CASES])
def test_verify_refuses(case, mutate, policy, require_smoke, code, check, honest, tmp_path):
    ref = clone(honest, slug(case))
    ctx: dict[str, list] = {"cleanup": [], "after": []}
    try:
        ref = (mutate(honest, ref, ctx) if mutate else None) or ref
        policy_path = (policy or policy_with())(honest, tmp_path / "policy.yaml")
        result = invoke(honest["project"], "verify", str(ref), *keyargs(honest), "--policy", str(policy_path),
                        *(["--require-smoke"] if require_smoke else []))
    finally:
        for undo in ctx["cleanup"]:
            undo()
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == code and check in result.stdout + result.stderr, result.stdout + result.stderr
    assert f"verified {ref}" not in result.stdout
    assert all(after() for after in ctx["after"])


def test_a_machine_that_never_saw_the_failure_cannot_tell_a_restored_passed(honest, tmp_path, monkeypatch):
    """What still holds (docs/security.md says so): the ledger is this machine's. A verifier that never saw
    the FAILED (another machine, or this one with its ledger gone) accepts the PASSED put back."""
    ref = clone(honest, "ledger-elsewhere")
    older_passed_restored(honest, ref, {})
    monkeypatch.setenv("BAKERY_SMOKE_LEDGER", str(tmp_path / "another-machine.json"))
    result = invoke(honest["project"], "verify", str(ref), *keyargs(honest), "--policy",
                    str(policy_with()(honest, tmp_path / "p.yaml")), "--require-smoke")
    assert result.returncode == 0 and "ok   no later FAILED result" in result.stdout, result.stdout + result.stderr


def test_the_honest_image_verifies(honest, tmp_path):
    """The control: the same clone, unchanged, passes with smoke required and says what ran it."""
    ref = clone(honest, "control")
    result = invoke(honest["project"], "verify", str(ref), *keyargs(honest), "--policy",
                    str(policy_with()(honest, tmp_path / "p.yaml")), "--require-smoke")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "smoke: PASSED on gfx942, 304 CUs, driver 6.10.5, ROCm 6.4.1" in result.stdout
    assert f"ok   the smoke ran the pinned spec provenance/smoke.yaml sha256:{hashlib.sha256(SPEC).hexdigest()}" \
        in result.stdout


def committed(project: Path, message: str) -> str:
    git = ["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "commit", "-qam", message], check=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


def test_an_earlier_release_is_judged_by_what_its_own_revision_committed(honest, tmp_path):
    """Issue 49: the release workflow's reference is the last promoted release, which ran the smoke
    spec and built the base committed at its own revision, not today's. Verified as of that revision
    (the one its signed provenance names) it passes; with today's pins it fails on both; a revision
    outside HEAD's history, one this checkout lacks, or one the git tag does not name is refused."""
    from bakery.cli import release as release_cmd, smoke as smoke_cmd

    project = copy_project(tmp_path / "p")
    base_yaml = project / "image" / "base.yaml"
    base_yaml.write_text(re.sub(r"(?m)^image: .*$", f"image: {honest['base']}", base_yaml.read_text()))
    then = committed(project, "the release's revision: the fixture base, the spec it smoked")
    subprocess.run(["git", "-C", str(project), "tag", "v1.0.0", then], check=True)
    spec_then = (project / "provenance" / "smoke.yaml").read_bytes()
    (project / "provenance" / "smoke.yaml").write_bytes(spec_then + b"# a later revision changed the spec\n")
    committed(project, "today: another spec")
    side = subprocess.run(["git", "-C", str(project), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           "commit-tree", f"{then}^{{tree}}", "-p", then, "-m", "a branch never merged"],
                          check=True, capture_output=True, text=True).stdout.strip()
    today = dev_policy(tmp_path / "policy.yaml", "127.0.0.1:5000/other/base@sha256:" + "2" * 64)

    def verified(revision: str, tag: str | None = None, as_of: bool = True) -> list[str]:
        ref = clone(honest, f"as-of-{revision[:8]}")
        reattest(lambda r: r["source"].update(revision=revision), smoke_signer="smoke", spec=spec_then)(honest, ref, {})
        report = release_cmd.verify(project, str(ref), key=str(honest["root"] / "k" / "release.pub"),
                                    smoke_key=str(honest["root"] / "k" / "smoke.pub"), policy=str(today),
                                    require_smoke=True, as_of=smoke_cmd._committed_at(project, tag) if as_of else None)
        return report.report.failures

    assert verified(then, "v1.0.0") == []
    todays = verified(then, as_of=False)
    assert any(f.startswith("provenance base is the pinned 127.0.0.1:5000/other/base@") for f in todays), todays
    assert any("an older or other spec" in f for f in todays), todays
    # the first failure is the cause (today's pins, then used, fail after it)
    assert verified(side)[0] == (f"the reference was built from {side[:12]}, which is not in this checkout's "
                                 f"history: not an earlier release of this line")
    assert verified("3" * 40)[0] == (f"the reference was built from {'3' * 12}, which this checkout does not have "
                                     f"(a shallow clone? check out with fetch-depth: 0)")
    # the registry's v2.0.0 moved onto this release: git's v2.0.0 names no such commit
    assert verified(then, "v2.0.0")[0] == (f"the registry's v2.0.0 was built from {then[:12]}, but this checkout's git "
                                        f"tag v2.0.0 is absent: the registry tag was moved, or the git tags "
                                           f"were not fetched")
    # named by hand as REPO:TAG (the gate's --reference), a release tag is held to git's tag of that
    # name too (fifth attacker review: a hand-named tag was tied to no git tag)
    dev_policy(project / "provenance" / "policy.yaml", "127.0.0.1:5000/other/base@sha256:" + "2" * 64)
    ref = clone(honest, "as-of-by-hand")
    reattest(lambda r: r["source"].update(revision=then), smoke_signer="smoke", spec=spec_then)(honest, ref, {})
    registry = Registry(ref.registry)
    body, media_type, _ = registry.get_manifest(ref)
    for tag in ("v1.0.0", "v2.0.0"):
        registry.put_manifest(ref.repository, tag, body, media_type)
    keys = (str(honest["root"] / "k" / "release.pub"), str(honest["root"] / "k" / "smoke.pub"))
    taken = smoke_cmd._reference(project, ref, f"{ref.registry}/{ref.repository}:v1.0.0", None, True, lambda m: None,
                                 *keys)[0]
    assert (taken.kind, taken.image) == ("promoted", str(ref))
    with pytest.raises(IntegrityError, match="the registry's v2.0.0 was built from .*, but this checkout's git tag "
                                             "v2.0.0 is absent"):
        smoke_cmd._reference(project, ref, f"{ref.registry}/{ref.repository}:v2.0.0", None, True, lambda m: None, *keys)
    # a tag that is no release tag is held to nothing in git: named so, it is refused (sixth review)
    registry.put_manifest(ref.repository, "latest", body, media_type)
    with pytest.raises(InputError, match="name a release by its release tag .REPO:v1.2.3"):
        smoke_cmd._reference(project, ref, f"{ref.registry}/{ref.repository}:latest", None, True, lambda m: None, *keys)


def test_verify_without_a_smoke_key_notes_the_result_it_cannot_judge(honest, tmp_path):
    """Ops who check only the release signature (no --smoke-key, smoke not required) get a pass that
    says the smoke result was not checked, and no smoke line in the summary."""
    ref = clone(honest, "no-smoke-key")
    result = invoke(honest["project"], "verify", str(ref), "--key", str(honest["root"] / "k" / "release.pub"),
                    "--policy", str(policy_with()(honest, tmp_path / "p.yaml")))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"ok   attestation {TEST_RESULT} not checked: no smoke key given" in result.stdout
    assert "smoke:" not in result.stdout


def test_the_release_key_signs_no_kernel_artifact_but_the_one_the_image_baked(honest):
    """The sign job signs the artifact the build record names only if it holds the .so files the
    record says were baked (a record naming another artifact is refused, nothing signed)."""
    record = json.loads(json.dumps(honest["record"]))
    record["artifacts"][0]["sha256"] = "0" * 64
    artifact = Reference.parse(record["kernels"]["artifact"])
    with pytest.raises(IntegrityError, match="does not hold exactly the files the build record says the image baked "
                                             "\\(_C_stable_libtorch\\)"):
        attest_mod.sign_artifact(artifact, honest["signers"]["release"], BuildRecord.from_json(record).artifacts)
    assert attest_mod.sign_artifact(artifact, honest["signers"]["release"],
                                    BuildRecord.from_json(honest["record"]).artifacts)


# -- invoke attach: a signed result carried from a job without push rights ---------------------------

def smoke_envelope(h, ref, signer="smoke") -> bytes:
    """What `invoke smoke --attest --envelope FILE` writes on the MI300X runner."""
    return sign.envelope(h["signers"][signer], smoke_report.statement(ref, honest_report(ref), SPEC))


def test_attach_pushes_a_smoke_result_that_verifies(honest, tmp_path):
    ref = clone(honest, "attach-ok")
    drop_predicate(TEST_RESULT)(honest, ref, {})
    (tmp_path / "smoke.dsse").write_bytes(smoke_envelope(honest, ref))
    attached = invoke(honest["project"], "attach", str(ref), "--envelope", str(tmp_path / "smoke.dsse"),
                      "--key", str(honest["root"] / "k" / "smoke.pub"))
    assert attached.returncode == 0, attached.stderr
    ok = invoke(honest["project"], "verify", str(ref), *keyargs(honest), "--policy",
                str(policy_with()(honest, tmp_path / "p.yaml")), "--require-smoke")
    assert ok.returncode == 0, ok.stdout + ok.stderr


def provenance_by_smoke_key(h, ref) -> bytes:
    """The smoke key's own statement of the provenance type, for ref (the sabotage of issue 17's review)."""
    _, doc, _ = att_layers(ref)
    layer = next(layer for layer in doc["layers"] if layer["annotations"]["predicateType"] == SLSA)
    env = json.loads(Registry(ref.registry).fetch_blob(ref.repository, Descriptor.from_json(layer)))
    return sign.envelope(h["signers"]["smoke"], base64.b64decode(env["payload"]))


@pytest.mark.parametrize("what, code, check", [
    ("signed by the release key", 5, "no valid signature"),  # not the smoke key given
    ("about another image", 2, "is about sha256:"),
    ("a provenance signed by the smoke key", 2, f"holds a statement of type {SLSA}, which the smoke role does not sign"),
    ("a signature that is not text", 5, "a malformed signature (TypeError)"),
])
def test_attach_refuses_what_would_not_verify(what, code, check, honest, tmp_path):
    ref = clone(honest, slug(f"attach-{what}"))
    drop_predicate(TEST_RESULT)(honest, ref, {})
    _, before, _ = att_layers(ref)
    other = Reference(ref.registry, ref.repository, None, Digest.parse("sha256:" + "1" * 64))
    envelope = {"signed by the release key": lambda: smoke_envelope(honest, ref, "release"),
                "about another image": lambda: smoke_envelope(honest, other),
                "a provenance signed by the smoke key": lambda: provenance_by_smoke_key(honest, ref),
                "a signature that is not text": lambda: json.dumps({**json.loads(smoke_envelope(honest, ref)),
                                                                    "signatures": [{"keyid": "", "sig": 5}]}).encode(),
                }[what]()
    (tmp_path / "smoke.dsse").write_bytes(envelope)
    refused = invoke(honest["project"], "attach", str(ref), "--envelope", str(tmp_path / "smoke.dsse"),
                     "--key", str(honest["root"] / "k" / "smoke.pub"))
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == code and len(errors) == 1 and check in errors[0], refused.stderr
    assert att_layers(ref)[1] == before  # nothing attached


# -- cosign, judging the same forgeries with one role's key and type ----------------------------------

COSIGN = ROOT / ".tools" / "bin" / "cosign"
COSIGN_CASES = [  # (verify case, predicate type, the role whose key cosign is given)
    ("release key forges a smoke result under another annotation", TEST_RESULT, "smoke"),
    ("smoke key stands in for the provenance", SLSA, "release"),
    ("smoke result signed by the release key", TEST_RESULT, "smoke"),
    ("SBOM and provenance signed by the smoke key", SLSA, "release"),
    ("SBOM and provenance signed by the smoke key", SPDX, "release"),
    ("provenance payload swapped, signature kept", SLSA, "release"),
]


def cosign(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(COSIGN), *args, "--insecure-ignore-tlog=true", "--allow-http-registry"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": "/tmp"})


@pytest.mark.parametrize("case, kind, role", COSIGN_CASES, ids=[f"{c[0]} ({c[1].rsplit('/', 2)[-2]})"
                                                                  for c in COSIGN_CASES])
def test_cosign_agrees_with_our_refusal(case, kind, role, honest):
    """cosign verify-attestation --type KIND --key ROLE.pub refuses what we refuse: it too takes the
    type from the signed statement, so with the key of the role that must sign that type, a
    statement signed by another key does not count."""
    mutate = next(c[1] for c in VERIFY_CASES if c[0] == case)
    ref = clone(honest, f"cosign-{slug(case)}-{role}")
    mutate(honest, ref, {"cleanup": [], "after": []})
    result = cosign("verify-attestation", "--type", kind, "--key", str(honest["root"] / "k" / f"{role}.pub"), str(ref))
    assert result.returncode != 0, result.stdout + result.stderr


@pytest.mark.parametrize("kind, role", [(TEST_RESULT, "smoke"), (SLSA, "release"), (SPDX, "release")])
def test_cosign_accepts_the_honest_image(kind, role, honest):
    """The control beside the cosign cases: the same commands accept the unchanged image."""
    ref = clone(honest, "cosign-control")
    result = cosign("verify-attestation", "--type", kind, "--key", str(honest["root"] / "k" / f"{role}.pub"), str(ref))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_corpus_is_at_least_fifty_cases():
    assert len(BUILD_CASES) + len(VERIFY_CASES) >= 50


# -- invoke deploy --compose: nothing starts unless the digest verifies (issue 19) -----------------

STAND_IN_COMPOSE = """\
# A stand-in for image/compose.yaml where no GPU exists: the same variables, the image's self-check
# instead of vLLM (no /dev/kfd here), and a stand-in proxy that prints the Caddyfile it was given.
services:
  inference:
    image: ${BAKERY_IMAGE:?}
    entrypoint: ["/usr/local/bin/bakery-selfcheck"]
    volumes: ["${MODEL_SNAPSHOT:?}:/models/DeepSeek-V4-Flash-0731:ro"]
    restart: "no"
  proxy:
    image: ${BAKERY_PROXY_IMAGE:?}
    entrypoint: ["cat", "/etc/caddy/Caddyfile"]
    volumes: ["${BAKERY_DEPLOY_DIR:?}/Caddyfile:/etc/caddy/Caddyfile:ro"]
    restart: "no"
"""


def deploy_compose(h, ref, tmp_path, name):
    (tmp_path / "compose.yaml").write_text(STAND_IN_COMPOSE)
    (tmp_path / "snapshot").mkdir(exist_ok=True)
    policy = dev_policy(tmp_path / "policy.yaml", h["base"])
    env = {"PATH": f"{ROOT / '.tools' / 'bin'}:{os.environ['PATH']}"}
    return invoke(h["project"], "deploy", "--compose", str(tmp_path / name), "--image", str(ref),
                  "--proxy-image", str(h["base"]), "--snapshot", str(tmp_path / "snapshot"),
                  "--hostname", "api.internal", "--internal-tls", "--allow", "10.0.0.0/8",
                  "--compose-file", str(tmp_path / "compose.yaml"), *keyargs(h), "--policy", str(policy), env=env)


def project_containers(name: str) -> list[str]:
    listed = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"label=com.docker.compose.project={name}"],
                            capture_output=True, text=True, check=True)
    return listed.stdout.split()


def test_deploy_compose_verifies_then_starts_the_stack(honest, tmp_path):
    ref = clone(honest, "deploy-ok")
    result = deploy_compose(honest, ref, tmp_path, "deploy-ok")
    try:
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"verified {ref}" in result.stdout
        assert f"BAKERY_IMAGE={ref}\n" in (tmp_path / "deploy-ok" / ".env").read_text()
        started = project_containers("deploy-ok")
        assert len(started) == 2
        subprocess.run(["docker", "wait", *started], capture_output=True, check=True)
        shown = [subprocess.run(["docker", "logs", c], capture_output=True, text=True) for c in started]
        logs = "".join(s.stdout + s.stderr for s in shown)
        assert "bakery-selfcheck: " in logs and "remote_ip 10.0.0.0/8" in logs
    finally:
        for c in project_containers("deploy-ok"):
            subprocess.run(["docker", "rm", "-f", c], capture_output=True)


def test_deploy_compose_starts_nothing_for_a_digest_that_does_not_verify(honest, tmp_path):
    """No smoke result on the digest: verify (smoke required) refuses, so no file is written and no
    container exists."""
    ref = clone(honest, "deploy-unsmoked")
    drop_predicate(TEST_RESULT)(honest, ref, {})
    result = deploy_compose(honest, ref, tmp_path, "deploy-unsmoked")
    assert result.returncode != 0 and f"verified {ref}" not in result.stdout
    assert not (tmp_path / "deploy-unsmoked").exists()
    assert project_containers("deploy-unsmoked") == []
