"""Signatures, SBOM and provenance, checked by someone else's verifiers: Debian 13's cosign,
securesystemslib's DSSE, spdx-tools. Each must accept ours and reject what it should."""

from __future__ import annotations

import base64
import copy
import gzip
import json
import os
import subprocess

import pytest

from bakery.errors import InputError
from bakery.inputs import overlays as overlays_mod
from bakery.oci.refs import Descriptor, Digest, Reference
from bakery.oci.registry import OCI_MANIFEST, Registry
from bakery.oci.store import RegistryStore, signature_tag
from bakery.trust import attest as attest_mod, keys, record as record_file, sign
from support import ROOT, dev_policy, invoke, last_line

COSIGN = ROOT / ".tools" / "bin" / "cosign"
PASSWORD = {"BAKERY_KEY_PASSWORD": "correct horse battery staple"}


@pytest.fixture(scope="module")
def keypair(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    result = invoke(ROOT, "keygen", "--out", str(d), env=PASSWORD)
    assert result.returncode == 0, result.stderr
    return d / "release.key", d / "release.pub"


@pytest.fixture(scope="module")
def other_keypair(tmp_path_factory):
    d = tmp_path_factory.mktemp("other-keys")
    assert invoke(ROOT, "keygen", "--out", str(d), env=PASSWORD).returncode == 0
    return d / "release.key", d / "release.pub"


@pytest.fixture(scope="module")
def policy(fixture_base, tmp_path_factory):
    return dev_policy(tmp_path_factory.mktemp("policy") / "policy.yaml", fixture_base)


def build_and_attest(project, registry, fixture_base, keypair, repo, epoch, logs):
    out = project / f"out-{repo.replace('/', '-')}"
    built = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/{repo}:1", "--out", str(out),
                   env={"SOURCE_DATE_EPOCH": str(epoch)})
    assert built.returncode == 0, built.stderr
    ref = last_line(built)
    attested = invoke(project, "attest", ref, "--record", str(out / "build-record.json"), "--key", str(keypair[0]),
                      env=PASSWORD)
    assert attested.returncode == 0, attested.stderr
    logs += [built.stdout, built.stderr, attested.stdout, attested.stderr]
    return Reference.parse(ref), out / "build-record.json"


@pytest.fixture(scope="module")
def signed(registry, fixture_base, fixture_lock, keypair, tmp_path_factory):
    """Two signed images (A and B differ only in SOURCE_DATE_EPOCH), their records and the logs."""
    from support import copy_project

    project = copy_project(tmp_path_factory.mktemp("attest") / "project", fixture_lock)
    # a clone of a local path, as CI's is: its origin is a path, which must still give URIs (SPDX)
    subprocess.run(["git", "-C", str(project), "remote", "remove", "origin"], capture_output=True)
    subprocess.run(["git", "-C", str(project), "remote", "add", "origin", "../upstream.git"], check=True)
    logs: list[str] = []
    a = build_and_attest(project, registry, fixture_base, keypair, "signed/a", 1700000000, logs)
    b = build_and_attest(project, registry, fixture_base, keypair, "signed/b", 1700000001, logs)
    return {"project": project, "a": a, "b": b, "logs": logs}


def cosign(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(COSIGN), *args, "--insecure-ignore-tlog=true", "--allow-http-registry"],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": "/tmp"})


def verify(project, ref, pub, policy, *extra) -> subprocess.CompletedProcess:
    return invoke(project, "verify", str(ref), "--key", str(pub), "--policy", str(policy), *extra)


# -- keys -----------------------------------------------------------------------------------------

def test_private_key_is_encrypted_and_private(keypair):
    key, pub = keypair
    assert b"ENCRYPTED PRIVATE KEY" in key.read_bytes()
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert b"BEGIN PUBLIC KEY" in pub.read_bytes()
    with pytest.raises(Exception, match="wrong password"):
        os.environ["BAKERY_KEY_PASSWORD"] = "wrong"
        try:
            keys.load_private(key)
        finally:
            del os.environ["BAKERY_KEY_PASSWORD"]


def test_keygen_refuses_to_overwrite(keypair):
    result = invoke(ROOT, "keygen", "--out", str(keypair[0].parent), env=PASSWORD)
    assert result.returncode == 2 and "refusing to overwrite" in result.stderr


def test_private_key_never_leaks(signed, keypair, registry):
    """Scan the image's layers, the logs, the build record and the attestations for the key."""
    os.environ.update(PASSWORD)
    try:
        private = keys.load_private(keypair[0])
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    from cryptography.hazmat.primitives import serialization

    secrets = [private.private_numbers().private_value.to_bytes(32, "big"),
               private.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()),
               keypair[0].read_bytes().splitlines()[1]]  # a line of the encrypted PEM
    secrets += [base64.b64encode(s) for s in secrets[:2]] + [secrets[0].hex().encode()]
    ref, record = signed["a"]
    haystacks = [record.read_bytes()] + [s.encode() for s in signed["logs"]]
    reg = Registry(registry)
    for tag in (str(ref.digest), signature_tag(ref.digest, "sig"), signature_tag(ref.digest, "att")):
        body, _, _ = reg.get_manifest(Reference(registry, ref.repository, None if tag.startswith("sha256:") else tag,
                                                Digest.parse(tag) if tag.startswith("sha256:") else None))
        manifest = json.loads(body)
        for d in [manifest["config"]] + manifest["layers"]:
            blob = reg.fetch_blob(ref.repository, Descriptor.from_json(d))
            haystacks.append(gzip.decompress(blob) if blob[:2] == b"\x1f\x8b" else blob)
    for secret in secrets:
        assert not any(secret in h for h in haystacks)


# -- our own verify, and idempotence -------------------------------------------------------------------

def test_verify_accepts_and_summarizes(signed, keypair, policy):
    ref, _ = signed["a"]
    result = verify(signed["project"], ref, keypair[1], policy)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and last_line(result) == f"verified {ref}"
    assert "overlays: /usr/local/lib/python3.12/dist-packages/vllm/" in result.stdout
    assert "python: amd-aiter 0.1.7.post2.dev18, vllm 0.26.0" in result.stdout


def test_signature_and_attestations_name_the_image_as_their_subject(signed, registry):
    """What registries with the OCI 1.1 referrers API index (the local one has none: 404)."""
    ref, _ = signed["a"]
    reg = Registry(registry)
    image = reg.get_manifest(ref)[0]
    for suffix, artifact_type in (("sig", "application/vnd.dev.cosign.simplesigning.v1+json"),
                                  ("att", "application/vnd.dsse.envelope.v1+json")):
        body = json.loads(reg.get_manifest(Reference(registry, ref.repository, signature_tag(ref.digest, suffix)))[0])
        assert body["subject"] == {"mediaType": OCI_MANIFEST, "digest": str(ref.digest), "size": len(image)}
        assert body["artifactType"] == artifact_type
    assert reg.transport.request("GET", f"/v2/{ref.repository}/referrers/{ref.digest}", ok=(200, 404)).status_code == 404


def test_attest_is_idempotent(signed, keypair, registry):
    ref, record = signed["a"]
    reg = Registry(registry)
    before = [reg.get_manifest(Reference(registry, ref.repository, signature_tag(ref.digest, s)))[2] for s in ("sig", "att")]
    again = invoke(signed["project"], "attest", str(ref), "--record", str(record), "--key", str(keypair[0]), env=PASSWORD)
    assert again.returncode == 0, again.stderr
    after = [reg.get_manifest(Reference(registry, ref.repository, signature_tag(ref.digest, s)))[2] for s in ("sig", "att")]
    assert before == after


def test_attest_refuses_a_record_of_another_image(signed, keypair):
    ref_a, _ = signed["a"]
    _, record_b = signed["b"]
    result = invoke(signed["project"], "attest", str(ref_a), "--record", str(record_b), "--key", str(keypair[0]),
                    env=PASSWORD)
    assert result.returncode == 2 and "build record describes" in result.stderr


def test_offline_verify_of_an_oci_layout(signed, keypair, policy, fixture_base, tmp_path):
    """Air-gapped: build into a layout, attest inside it, verify it with no registry involved."""
    project = signed["project"]
    layout = tmp_path / "layout"
    built = invoke(project, "build", "--base", str(fixture_base), "--layout", str(layout), "--out", str(tmp_path / "o"))
    ref = last_line(built)
    assert invoke(project, "attest", ref, "--record", str(tmp_path / "o" / "build-record.json"), "--layout", str(layout),
                  "--key", str(keypair[0]), env=PASSWORD).returncode == 0
    ok = verify(project, ref, keypair[1], policy, "--layout", str(layout))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    sig = layout / "blobs" / "sha256"
    payload = next(p for p in sig.iterdir() if b"cosign container image signature" in p.read_bytes())
    payload.write_bytes(payload.read_bytes().replace(b"image signature", b"image signaturf"))
    bad = verify(project, ref, keypair[1], policy, "--layout", str(layout))
    assert bad.returncode == 5 and "FAIL signature valid" in bad.stdout


# -- independent verifiers --------------------------------------------------------------------------

def test_cosign_accepts_signature_and_every_attestation(signed, keypair):
    ref, _ = signed["a"]
    assert cosign("verify", "--key", str(keypair[1]), str(ref)).returncode == 0
    for kind in ("slsaprovenance1", "spdxjson", "openvex"):
        result = cosign("verify-attestation", "--key", str(keypair[1]), "--type", kind, str(ref))
        assert result.returncode == 0, result.stderr


def envelopes(registry, ref) -> dict:
    reg = Registry(registry)
    body, _, _ = reg.get_manifest(Reference(registry, ref.repository, signature_tag(ref.digest, "att")))
    return {layer["annotations"]["predicateType"]: reg.fetch_blob(ref.repository, Descriptor.from_json(layer))
            for layer in json.loads(body)["layers"]}


def test_securesystemslib_verifies_our_dsse(signed, keypair, other_keypair, registry):
    from securesystemslib.dsse import Envelope
    from securesystemslib.exceptions import VerificationError
    from securesystemslib.signer import SSlibKey

    def sslib_key(pub):
        public = keys.load_public(pub)
        return SSlibKey(keys.keyid(public), "ecdsa", "ecdsa-sha2-nistp256", {"public": keys.public_pem(public).decode()})

    ref, _ = signed["a"]
    for blob in envelopes(registry, ref).values():
        env = Envelope.from_dict(json.loads(blob))
        accepted = env.verify([sslib_key(keypair[1])], 1)
        assert list(accepted) == [keys.keyid(keys.load_public(keypair[1]))]
        with pytest.raises(VerificationError):
            env.verify([sslib_key(other_keypair[1])], 1)
        tampered = json.loads(blob)
        tampered["payload"] = base64.b64encode(base64.b64decode(tampered["payload"]) + b" ").decode()
        with pytest.raises(VerificationError):
            Envelope.from_dict(tampered).verify([sslib_key(keypair[1])], 1)


def test_spdx_tools_validate_our_sbom(signed, registry, tmp_path):
    ref, _ = signed["a"]
    statement = json.loads(base64.b64decode(json.loads(envelopes(registry, ref)["https://spdx.dev/Document"])["payload"]))
    sbom = statement["predicate"]
    rels = {(r["spdxElementId"].split("-")[1], r["relationshipType"]) for r in sbom["relationships"]}
    assert {("Patch", "PATCH_APPLIED"), ("Overlay", "GENERATED_FROM"), ("Overlay", "FILE_MODIFIED"),
            ("Image", "CONTAINS")} <= rels
    path = tmp_path / "sbom.spdx.json"
    path.write_text(json.dumps(sbom))
    ok = subprocess.run([str(ROOT / ".venv" / "bin" / "pyspdxtools"), "-i", str(path)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    broken = copy.deepcopy(sbom)
    broken["relationships"].append({"spdxElementId": "SPDXRef-Image", "relationshipType": "CONTAINS",
                                    "relatedSpdxElement": "SPDXRef-Nowhere"})
    path.write_text(json.dumps(broken))
    bad = subprocess.run([str(ROOT / ".venv" / "bin" / "pyspdxtools"), "-i", str(path)], capture_output=True, text=True)
    assert bad.returncode != 0


def test_sbom_and_provenance_carry_each_overlay_proof(signed, registry):
    """The signed statements say, per baked overlay, which proof code judged it and what it said."""
    ref, _ = signed["a"]
    found = envelopes(registry, ref)
    predicate = lambda kind: json.loads(base64.b64decode(json.loads(found[kind])["payload"]))["predicate"]  # noqa: E731 (one line, used twice below)
    code = {o.id: o.proof.code_sha256 for o in overlays_mod.load(ROOT / "overlays" / "overlays.yaml")
            if o.baked and o.proof and o.proof.script}
    proofs = {b["name"].removeprefix("proof: "): b for b in predicate("https://slsa.dev/provenance/v1")["runDetails"]
              ["byproducts"] if b["name"].startswith("proof: ")}
    assert {k: b["digest"]["sha256"] for k, b in proofs.items()} == code
    assert {(b["annotations"]["stock"], b["annotations"]["overlaid"]) for b in proofs.values()} == {("BROKEN", "FIXED")}
    spdx = predicate("https://spdx.dev/Document")
    comments = [p.get("comment", "") for p in spdx["packages"] + spdx["files"]]
    for overlay_id, sha in code.items():
        assert any(f"overlay {overlay_id} " in c and f"code sha256 {sha}): stock BROKEN, overlaid FIXED" in c
                   for c in comments), overlay_id
    assert any("sparse-mla-prefill-bh64" in c and "no proof runs off the hardware" in c for c in comments)


def test_sbom_and_provenance_are_deterministic(signed, registry, keypair):
    """Attesting the same record twice gives byte-identical envelopes (RFC 6979 signatures)."""
    ref, record = signed["a"]
    os.environ.update(PASSWORD)
    try:
        signer = sign.Signer(keys.load_private(keypair[0]))
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    first = envelopes(registry, ref)
    attest_mod.attest(RegistryStore(ref), ref, record_file.read(record), signer)
    assert envelopes(registry, ref) == first


# -- tampering: each must fail our verify and cosign, with a reason ------------------------------------

def expect_failure(project, ref, pub, policy, reason):
    result = verify(project, ref, pub, policy)
    assert result.returncode == 5, result.stdout + result.stderr
    assert reason in result.stdout + result.stderr, result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_tamper_retagged_image(signed, keypair, policy, registry, fixture_base):
    ref, _ = signed["a"]
    reg = Registry(registry)
    body, media_type, _ = reg.get_manifest(fixture_base)
    for d in [json.loads(body)["config"]] + json.loads(body)["layers"]:
        reg.mount_blob("signed/retag", Digest.parse(d["digest"]), fixture_base.repository)
    reg.put_manifest("signed/retag", "1", body, media_type)  # someone else's image under our name
    tagged = f"{registry}/signed/retag:1"
    expect_failure(signed["project"], tagged, keypair[1], policy, "FAIL signature manifest")
    assert cosign("verify", "--key", str(keypair[1]), tagged).returncode != 0


def test_tamper_one_byte_in_one_layer(signed, keypair, policy, registry):
    ref, _ = signed["a"]
    reg = Registry(registry)
    manifest = json.loads(reg.get_manifest(ref)[0])
    config = json.loads(reg.fetch_blob(ref.repository, Descriptor.from_json(manifest["config"])))
    last = Descriptor.from_json(manifest["layers"][-1])
    raw = bytearray(gzip.decompress(reg.fetch_blob(ref.repository, last)))
    at = raw.index(b"set -eu")  # inside the entrypoint script
    raw[at] ^= 0x01
    blob = gzip.compress(bytes(raw), mtime=0)
    layer = Descriptor.of(last.media_type, blob)
    reg.upload_blob(ref.repository, layer, lambda: iter([blob]))
    config["rootfs"]["diff_ids"][-1] = str(Digest.of(bytes(raw)))
    cfg = json.dumps(config).encode()
    cfg_desc = Descriptor.of(manifest["config"]["mediaType"], cfg)
    reg.upload_blob(ref.repository, cfg_desc, lambda: iter([cfg]))
    manifest["layers"][-1], manifest["config"] = layer.to_json(), cfg_desc.to_json()
    reg.put_manifest(ref.repository, "tampered", json.dumps(manifest).encode(), OCI_MANIFEST)
    tampered = f"{ref.name}:tampered"
    expect_failure(signed["project"], tampered, keypair[1], policy, "FAIL signature manifest")
    assert cosign("verify", "--key", str(keypair[1]), tampered).returncode != 0


def test_tamper_signed_with_another_key(signed, keypair, other_keypair, policy):
    ref, record = signed["b"]
    assert invoke(signed["project"], "attest", str(ref), "--record", str(record), "--key", str(other_keypair[0]),
                  env=PASSWORD).returncode == 0
    try:
        expect_failure(signed["project"], ref, keypair[1], policy, "not signed by a release key of the policy")
        assert cosign("verify", "--key", str(keypair[1]), str(ref)).returncode != 0
    finally:  # restore B's good signature for the tests after this one
        assert invoke(signed["project"], "attest", str(ref), "--record", str(record), "--key", str(keypair[0]),
                      env=PASSWORD).returncode == 0


def copy_tag(registry, ref_from, ref_to, suffix):
    reg = Registry(registry)
    body, media_type, _ = reg.get_manifest(Reference(registry, ref_from.repository, signature_tag(ref_from.digest, suffix)))
    for d in [json.loads(body)["config"]] + json.loads(body)["layers"]:
        reg.mount_blob(ref_to.repository, Digest.parse(d["digest"]), ref_from.repository)
    reg.put_manifest(ref_to.repository, signature_tag(ref_to.digest, suffix), body, media_type)


def test_tamper_signature_copied_from_another_digest(signed, keypair, policy, registry, fixture_base, tmp_path):
    ref_a, _ = signed["a"]
    project = signed["project"]
    # C: an unsigned build; A's signature copied onto it
    built = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/signed/a:c",
                   "--out", str(tmp_path / "c"), env={"SOURCE_DATE_EPOCH": "1700000002"})
    ref_c = Reference.parse(last_line(built))
    copy_tag(registry, ref_a, ref_c, "sig")
    expect_failure(project, ref_c, keypair[1], policy, f"signature is for {ref_a.digest}")
    assert cosign("verify", "--key", str(keypair[1]), str(ref_c)).returncode != 0


def test_tamper_attestation_about_another_subject(signed, keypair, policy, registry):
    ref_a, _ = signed["a"]
    ref_b, record_b = signed["b"]
    good = Registry(registry).get_manifest(Reference(registry, ref_b.repository, signature_tag(ref_b.digest, "att")))[0]
    copy_tag(registry, ref_a, ref_b, "att")
    try:
        expect_failure(signed["project"], ref_b, keypair[1], policy, f"(it names sha256:{ref_a.digest.hex})")
        assert cosign("verify-attestation", "--key", str(keypair[1]), "--type", "slsaprovenance1",
                      str(ref_b)).returncode != 0
    finally:
        Registry(registry).put_manifest(ref_b.repository, signature_tag(ref_b.digest, "att"), good, OCI_MANIFEST)


@pytest.mark.parametrize("predicate, cosign_type, says", [
    ("https://spdx.dev/Document", "spdxjson", "FAIL SBOM (SPDX 2.3) attestation present"),
    ("https://openvex.dev/ns", "openvex", "FAIL VEX (OpenVEX 0.2.0) attestation present"),
])
def test_tamper_attestation_missing(signed, keypair, policy, registry, predicate, cosign_type, says):
    ref_b, _ = signed["b"]
    reg = Registry(registry)
    tag = signature_tag(ref_b.digest, "att")
    good = reg.get_manifest(Reference(registry, ref_b.repository, tag))[0]
    manifest = json.loads(good)
    manifest["layers"] = [layer for layer in manifest["layers"] if layer["annotations"]["predicateType"] != predicate]
    reg.put_manifest(ref_b.repository, tag, json.dumps(manifest).encode(), OCI_MANIFEST)
    try:
        expect_failure(signed["project"], ref_b, keypair[1], policy, says)
        assert cosign("verify-attestation", "--key", str(keypair[1]), "--type", cosign_type, str(ref_b)).returncode != 0
    finally:
        reg.put_manifest(ref_b.repository, tag, good, OCI_MANIFEST)


def test_tamper_provenance_naming_another_base(signed, keypair, policy, registry, tmp_path):
    ref_b, record_b = signed["b"]
    record = json.loads(record_b.read_text())
    other = "docker.io/vllm/vllm-openai-rocm@sha256:" + "0" * 64
    record["base"]["pinned"] = other
    forged = tmp_path / "record.json"
    forged.write_text(json.dumps(record))
    assert invoke(signed["project"], "attest", str(ref_b), "--record", str(forged), "--key", str(keypair[0]),
                  env=PASSWORD).returncode == 0
    try:
        expect_failure(signed["project"], ref_b, keypair[1], policy, f"(it names {other})")
        cue = tmp_path / "policy.cue"
        cue.write_text(f'predicate: buildDefinition: externalParameters: base: "{json.loads(record_b.read_text())["base"]["pinned"]}"\n')
        result = cosign("verify-attestation", "--key", str(keypair[1]), "--type", "slsaprovenance1", "--policy", str(cue),
                        str(ref_b))
        assert result.returncode != 0
    finally:
        assert invoke(signed["project"], "attest", str(ref_b), "--record", str(record_b), "--key", str(keypair[0]),
                      env=PASSWORD).returncode == 0
    # and with the honest provenance the same cosign policy passes
    assert cosign("verify-attestation", "--key", str(keypair[1]), "--type", "slsaprovenance1", "--policy", str(cue),
                  str(ref_b)).returncode == 0


# -- mirrors and how an image was built --------------------------------------------------------------

@pytest.fixture(scope="module")
def mirror_registry():
    from bakery.dev import stack

    return stack.ensure_registry(5004, name="registry-mirror")


def test_a_mirrored_image_verifies_by_digest(signed, keypair, policy, mirror_registry, fixture_base, tmp_path):
    """The usual internal-mirror set-up: image, .sig and .att copied by digest to another registry
    (and to an OCI layout). The signature still names where it was signed; the policy lists that."""
    ref, _ = signed["a"]
    copied = invoke(signed["project"], "mirror", "--image", str(ref), "--to", f"{mirror_registry}/internal/dsv4:mirrored")
    assert copied.returncode == 0, copied.stderr
    mirrored = last_line(copied)
    assert mirrored == f"{mirror_registry}/internal/dsv4@{ref.digest}"
    ok = verify(signed["project"], mirrored, keypair[1], policy)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert cosign("verify", "--key", str(keypair[1]), mirrored).returncode == 0  # cosign agrees
    strict = dev_policy(tmp_path / "strict.yaml", fixture_base, allowed_repositories=[f"{mirror_registry}/*"])
    refused = verify(signed["project"], mirrored, keypair[1], strict)
    assert refused.returncode == 5
    assert f"signature names repository {ref.name}, which the policy's allowed_repositories do not list" \
        in refused.stdout
    layout = tmp_path / "layout"
    assert invoke(signed["project"], "mirror", "--image", str(ref), "--layout", str(layout)).returncode == 0
    offline = verify(signed["project"], ref, keypair[1], policy, "--layout", str(layout))
    assert offline.returncode == 0, offline.stdout + offline.stderr


def test_cosign3_reads_the_bundles_of_a_real_build_with_or_without_the_referrers_api(signed, keypair, policy):
    """attest writes both formats: cosign 3.1 reads the bundles, through the fallback tag on
    docker-registry 2.8 and through the referrers API on a copy (go-containerregistry's registry,
    which `invoke mirror` fills with the bundles as referrers); verify says which it read."""
    from bakery.dev import stack
    from test_bundles import cosign3

    ref, _ = signed["a"]
    copied = invoke(signed["project"], "mirror", "--image", str(ref),
                    "--to", f"{stack.ensure_referrers_registry()}/internal/dsv4:mirrored")
    assert copied.returncode == 0, copied.stderr
    for where, via in ((str(ref), f"bundle(s) via the fallback tag sha256-{ref.pin.hex}"),
                       (last_line(copied), "bundle(s) via the referrers API")):
        assert cosign3("verify", "--key", str(keypair[1]), where).returncode == 0
        for kind in ("slsaprovenance1", "spdxjson", "openvex"):
            result = cosign3("verify-attestation", "--key", str(keypair[1]), "--type", kind, where)
            assert result.returncode == 0, (kind, result.stderr)
        ok = verify(signed["project"], where, keypair[1], policy)
        assert ok.returncode == 0 and via in ok.stdout, ok.stdout + ok.stderr


def test_mirroring_an_unsigned_image_is_refused_and_tags_nothing(signed, mirror_registry, registry, fixture_base):
    built = invoke(signed["project"], "build", "--base", str(fixture_base), "--push", f"{registry}/unsigned/x:1",
                   "--out", str(signed["project"] / "out-unsigned"))
    ref = Reference.parse(last_line(built))
    result = invoke(signed["project"], "mirror", "--image", str(ref), "--to", f"{mirror_registry}/unsigned/x:1")
    assert result.returncode == 2 and "has no signature (sha256-" in result.stderr and "invoke attest" in result.stderr
    assert Registry(mirror_registry).manifest_exists("unsigned/x", ref.pin) is False


def test_provenance_binds_builder_source_and_a_clean_checkout(signed, keypair, registry, fixture_base, tmp_path):
    (signed["project"] / "image" / "untracked.txt").write_text("not committed\n")  # a dirty checkout
    try:
        ref, record = build_and_attest(signed["project"], registry, fixture_base, keypair, "signed/dirty", 1700000002,
                                       [])
    finally:
        (signed["project"] / "image" / "untracked.txt").unlink()
    rec = json.loads(record.read_text())
    assert rec["builder"]["id"] == "local" and rec["source"]["dirty"] is True
    assert rec["source"]["repository"] != "https://github.com/dsv4-mi300x/bakery"  # not a constant any more
    assert verify(signed["project"], ref, keypair[1], dev_policy(tmp_path / "dev.yaml", fixture_base)).returncode == 0
    cases: list[tuple[dict, str]] = [
        ({"allow_dirty": False}, "FAIL built from a checkout with uncommitted or untracked changes"),
        ({"allowed_builders": ["https://github.com/dsv4-mi300x/bakery/.github/workflows/release.yml@refs/tags/v*"]},
         "FAIL builder local is an allowed builder (a build from elsewhere"),
        ({"allowed_sources": ["https://github.com/dsv4-mi300x/bakery"]},
         f"FAIL provenance source {rec['source']['repository']} is an allowed repository"),
    ]
    for over, line in cases:
        result = verify(signed["project"], ref, keypair[1], dev_policy(tmp_path / "p.yaml", fixture_base, **over))
        assert result.returncode == 5 and line in result.stdout, (over, result.stdout)
        assert "Traceback" not in result.stderr


def test_builder_and_source_come_from_the_ci_environment(monkeypatch, tmp_path):
    from bakery.bake import record as record_mod

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_SERVER_URL", "https://github.com")
    monkeypatch.setenv("GITHUB_REPOSITORY", "acme/bakery-fork")
    monkeypatch.setenv("GITHUB_WORKFLOW_REF", "acme/bakery-fork/.github/workflows/release.yml@refs/tags/v1.2.0")
    monkeypatch.setenv("GITHUB_RUN_ID", "42")
    assert record_mod.builder().id == "https://github.com/acme/bakery-fork/.github/workflows/release.yml@refs/tags/v1.2.0"
    assert record_mod.source_repository(tmp_path, None) == "https://github.com/acme/bakery-fork"
    monkeypatch.delenv("GITHUB_ACTIONS")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", "git@github.com:acme/bakery.git"], check=True)
    def origin():
        return record_mod._git_started(tmp_path, "remote", "get-url", "origin")

    assert record_mod.source_repository(tmp_path, origin()) == "https://github.com/acme/bakery"
    subprocess.run(["git", "-C", str(tmp_path), "remote", "set-url", "origin", "/srv/git/bakery.git"], check=True)
    assert record_mod.source_repository(tmp_path, origin()) == "file:///srv/git/bakery"  # a URI, as SPDX needs


def test_the_source_is_the_checkouts_head_its_time_and_whether_anything_is_uncommitted(monkeypatch, tmp_path):
    """read_source asks git once for each (HEAD with its commit time in one process), against
    `git rev-parse HEAD` and the commit time the commit was given."""
    from bakery.bake import record as record_mod

    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    with pytest.raises(InputError, match="is not a git checkout with a commit"):
        record_mod.read_source(tmp_path)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a").write_text("a")
    subprocess.run([*git, "add", "a"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "a"], check=True,
                   env={**os.environ, "GIT_COMMITTER_DATE": "@1700000123 +0000"})
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    clean = record_mod.read_source(tmp_path)
    assert (clean.revision, clean.dirty, clean.source_date_epoch) == (head, False, 1700000123)
    assert clean.repository == f"file://{tmp_path}"  # no origin
    (tmp_path / "b").write_text("untracked")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000999")
    dirty = record_mod.read_source(tmp_path)
    assert (dirty.revision, dirty.dirty, dirty.source_date_epoch) == (head, True, 1700000999)


def keyless_release(signed, fixture_base, registry, tmp_path, name: str):
    """The signed fixture image copied to signed/NAME and attested by `invoke attest --keyless` as the
    release workflow's signing job would run it (the OIDC token in SIGSTORE_ID_TOKEN, from the GitHub
    stand-in), against the Sigstore stand-in; a policy naming each role's workflow and no key.
    Returns (image, record, policy, the stand-in's folder)."""
    import shutil

    from bakery.dev import stack
    from bakery.dev.github_stand_in import oidc_token
    from test_keyless import ISSUER, REPO, TAG, WORKFLOWS

    trust = stack.ensure_sigstore_stand_in()
    ref, record = signed["a"]
    reg = Registry(registry)
    body, media_type, _ = reg.get_manifest(ref)
    for d in [json.loads(body)["config"]] + json.loads(body)["layers"]:
        reg.mount_blob(f"signed/{name}", Digest.parse(d["digest"]), ref.repository)
    reg.put_manifest(f"signed/{name}", str(ref.digest), body, media_type)
    image = f"{registry}/signed/{name}@{ref.digest}"
    attested = invoke(signed["project"], "attest", image, "--record", str(record), "--keyless", "--trust-config",
                      str(trust / "trust_config.json"), env={"SIGSTORE_ID_TOKEN": oidc_token(REPO, WORKFLOWS["release"],
                                                                                           TAG)})
    assert attested.returncode == 0, attested.stderr
    shutil.copy(trust / "trusted_root.json", tmp_path / "trusted_root.json")
    policy = dev_policy(tmp_path / "policy.yaml", fixture_base, keyless={
        "trusted_root": "trusted_root.json", "roles": {role: {"issuer": ISSUER, "repository": REPO, "workflow": w,
                                                             "ref": "refs/tags/v*"} for role, w in WORKFLOWS.items()}})
    return image, record, policy, trust


def test_attest_keyless_then_verify_by_the_release_workflows_identity(signed, fixture_base, registry, tmp_path):
    """`invoke verify` with a policy naming the release workflow's identity and no key, and cosign
    3.1 from the same trusted root; a release signed again by the smoke workflow is refused."""
    from bakery.dev.github_stand_in import oidc_token
    from test_keyless import REPO, TAG, WORKFLOWS, cosign3

    image, record, policy, trust = keyless_release(signed, fixture_base, registry, tmp_path, "keyless")
    ok = invoke(signed["project"], "verify", image, "--policy", str(policy))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "signature valid for this digest, by 1 of 1 required release key(s)" in ok.stdout
    assert cosign3(trust, image, WORKFLOWS["release"]).returncode == 0  # the log checked too, offline
    smoke = oidc_token(REPO, WORKFLOWS["smoke"], TAG)  # the smoke job's identity signs no release
    again = invoke(signed["project"], "attest", image, "--record", str(record), "--keyless", "--trust-config",
                   str(trust / "trust_config.json"), env={"SIGSTORE_ID_TOKEN": smoke})
    assert again.returncode == 0, again.stderr
    refused = invoke(signed["project"], "verify", image, "--policy", str(policy))
    assert refused.returncode == 5 and "not the release role's identity" in refused.stdout, refused.stdout


def test_the_rebuilder_and_the_smoke_job_sign_keyless_as_their_own_workflows(signed, fixture_base, registry,
                                                                             tmp_path):
    """`invoke attest-rebuild --keyless` as the rebuild workflow, and the smoke workflow's keyless
    result (what `invoke smoke --attest --keyless --envelope F` writes) carried by `invoke attach`
    with no key: verify then counts the smoke result and one rebuild by identity alone. A smoke
    result signed by the release workflow is refused by attach, and nothing is attached."""
    import secrets

    from bakery.dev.github_stand_in import oidc_token
    from bakery.release import reproduce, smoke_report
    from bakery.trust import keyless
    from support import passing_report
    from test_keyless import REPO, TAG, WORKFLOWS

    # a repository of its own each run: the registry outlives the session, and what it holds is judged
    image, _, policy, trust = keyless_release(signed, fixture_base, registry, tmp_path,
                                              f"keyless-roles-{secrets.token_hex(4)}")
    ref = Reference.parse(image)
    config = trust / "trust_config.json"
    manifest, _, _ = Registry(registry).get_manifest(ref)
    reproduce.write_outcome(tmp_path / "outcome.json", ref, manifest, [])
    rebuilt = invoke(signed["project"], "attest-rebuild", image, "--outcome", str(tmp_path / "outcome.json"),
                     "--policy", str(policy), "--keyless", "--trust-config", str(config),
                     env={"SIGSTORE_ID_TOKEN": oidc_token(REPO, WORKFLOWS["rebuilder"], TAG)})
    assert rebuilt.returncode == 0 and rebuilt.stdout.rstrip().endswith("(match)"), rebuilt.stdout + rebuilt.stderr
    statement = smoke_report.statement(ref, passing_report(image), (ROOT / "provenance" / "smoke.yaml").read_bytes())
    for who, code in (("release", 5), ("smoke", 0)):
        signed_by = keyless.KeylessSigner(oidc_token(REPO, WORKFLOWS[who], TAG), config)
        (tmp_path / f"smoke-{who}.json").write_bytes(signed_by.bundle(statement))
        attached = invoke(signed["project"], "attach", image, "--envelope", str(tmp_path / f"smoke-{who}.json"),
                          "--policy", str(policy))
        errors = [line for line in attached.stderr.splitlines() if line.startswith("error:")]
        assert attached.returncode == code, attached.stderr
        assert not code or (len(errors) == 1 and "not the smoke role's identity" in errors[0]), attached.stderr
        if who == "release":
            judged = invoke(signed["project"], "verify", image, "--policy", str(policy), "--require-smoke")
            assert judged.returncode != 0 and "smoke" in judged.stdout, judged.stdout  # nothing was attached
    ok = invoke(signed["project"], "verify", image, "--policy", str(policy), "--require-smoke", "--require-rebuilds",
                "1")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    with_key = invoke(signed["project"], "attach", image, "--envelope", str(tmp_path / "smoke-smoke.json"),
                      "--key", str(tmp_path / "policy.yaml"))
    assert with_key.returncode == 2 and "a keyless bundle" in with_key.stderr, with_key.stderr
