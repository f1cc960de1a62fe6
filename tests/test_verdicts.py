"""Proof verdicts that travel: proven once, pushed beside the kernel artifact, signed by the sign
job, and taken by a fresh runner only under a release key's signature (issue 29)."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import pytest

import test_hip
from bakery.errors import IntegrityError
from bakery.oci.refs import Reference
from bakery.oci.registry import OCI_MANIFEST, Registry
from bakery.oci.store import RegistryStore
from bakery.proofs import runner as prove
from bakery.trust import attest as attest_mod, keys, provenance, record as record_file, sign
from bakery.trust.record import BuildRecord
from support import invoke, last_line
from test_hip import PASSWORD, trusting

# test_hip's fixtures, bound here so that pytest finds them for this module's tests
pinned_toolchain, release_keys = test_hip.pinned_toolchain, test_hip.release_keys


def without_verdicts(where: Path) -> Path:
    """This machine's caches as a fresh runner has them: no proof verdict (base files, views and
    compiled kernels stay, so only the proofs are what differs)."""
    src = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
    dest = where / f"cache-{uuid.uuid4().hex[:6]}"
    for part in ("layers", "files", "views", "hip"):
        if (src / part).exists():
            shutil.copytree(src / part, dest / part)
    return dest


def signer(keys_dir: Path, name: str) -> sign.Signer:
    os.environ.update(PASSWORD)
    try:
        return sign.Signer(keys.load_private(keys_dir / name / "release.key"))
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]


def record(project: Path) -> dict:
    return json.loads((project / "out" / "build-record.json").read_text())


def test_a_fresh_runner_takes_signed_verdicts_and_proves_what_is_not(project, registry, fixture_base,
                                                                     pinned_toolchain, release_keys, tmp_path):
    repo = f"verdicts/img-{uuid.uuid4().hex[:8]}"
    env = {"BAKERY_TOOLCHAIN": pinned_toolchain}
    build = ["build", "--base", str(fixture_base), *trusting(project, release_keys, fixture_base)]
    # --reprove: proven here whatever this machine holds, and pushed as proof-<key> artifacts
    first = invoke(project, *build, "--push", f"{registry}/{repo}:1", "--reprove", env=env)
    assert first.returncode == 0, first.stderr
    verdicts = record(project)["verdicts"]
    assert verdicts and {v["origin"] for v in verdicts} == {"proven"}
    assert {(v["side"], v["verdict"]) for v in verdicts} == {("stock", "BROKEN"), ("overlaid", "FIXED")}
    reg = Registry(registry)
    for v in verdicts:
        _, _, digest = reg.get_manifest(Reference(registry, repo, f"proof-{v['key']}"))
        assert v["artifact"] == f"{registry}/{repo}@{digest}"

    # not signed yet: a fresh runner does not take them (one checked here, the rest the same rule)
    one = next(v for v in verdicts if v["overlay"] == "cpu-kv-transfer-fence" and v["side"] == "stock")
    store = prove.SignedVerdicts(RegistryStore(Reference(registry, repo), reg), _trust(project, release_keys, fixture_base, reg), log=lambda m: None)
    assert store.fetch(one["key"]) is None

    signed = invoke(project, "attest", last_line(first), "--key", str(release_keys / "k" / "release.key"),
                    env=PASSWORD)
    assert signed.returncode == 0, signed.stderr
    assert signed.stderr.count("proof verdict ") == len(verdicts)

    # a fresh runner: no verdict cached, every one taken from the registry under its signature
    second = invoke(project, *build, "--push", f"{registry}/{repo}:2",
                    env={**env, "BAKERY_CACHE": str(without_verdicts(tmp_path))})
    assert second.returncode == 0, second.stderr
    assert last_line(second) == last_line(first)
    again = record(project)["verdicts"]
    assert [(v["key"], v["verdict"], v["artifact"]) for v in again] == \
        [(v["key"], v["verdict"], v["artifact"]) for v in verdicts]
    assert {v["origin"] for v in again} == {"registry"}
    deps = provenance.predicate(BuildRecord.from_json(record(project)))["buildDefinition"]["resolvedDependencies"]
    assert {d["uri"] for d in deps if d["name"].startswith("proof verdict: ")} == \
        {f"docker://{v['artifact']}" for v in verdicts}

    # a registry writer: an unsigned FIXED over a stock verdict, one signed by a key the policy does
    # not list, and a release-signed verdict of another key moved under this tag: none is taken
    fence, swiglu, sampler = (next(v for v in verdicts if v["overlay"] == o and v["side"] == side) for o, side in
                              (("cpu-kv-transfer-fence", "stock"), ("exact-swiglu-clamp-kernel", "stock"),
                               ("deterministic-sampler-topk-topp", "overlaid")))
    lie = prove.Verdict("FIXED", "all good", key=fence["key"])
    _, push_lie = prove.verdict_artifact(RegistryStore(Reference(registry, repo), reg), lie)
    push_lie()
    foreign, push_foreign = prove.verdict_artifact(RegistryStore(Reference(registry, repo), reg), prove.Verdict("FIXED", "fine", key=swiglu["key"]))
    push_foreign()
    attest_mod.sign_verdict(named(foreign, swiglu["key"], "FIXED"),
                            signer(release_keys, "other"))
    moved = Reference.parse(next(v for v in verdicts if v["overlay"] == "cpu-kv-transfer-fence"
                                 and v["side"] == "overlaid")["artifact"])
    reg.put_manifest(repo, f"proof-{sampler['key']}", reg.get_manifest(moved)[0], OCI_MANIFEST)
    third = invoke(project, *build, "--push", f"{registry}/{repo}:3",
                   env={**env, "BAKERY_CACHE": str(without_verdicts(tmp_path))})
    assert third.returncode == 0, third.stderr  # proven here instead: stock BROKEN, overlaid FIXED
    assert last_line(third) == last_line(first)
    origins = {(v["overlay"], v["side"]): (v["origin"], v["verdict"]) for v in record(project)["verdicts"]}
    assert origins[("cpu-kv-transfer-fence", "stock")] == ("proven", "BROKEN")
    assert origins[("exact-swiglu-clamp-kernel", "stock")] == ("proven", "BROKEN")
    assert origins[("deterministic-sampler-topk-topp", "overlaid")] == ("proven", "FIXED")
    assert sum(o == "registry" for o, _ in origins.values()) == len(verdicts) - 3
    assert "signed by 0 of 1 required release key" in third.stderr
    assert f"judges {moved_key(reg, moved)}, not {sampler['key']}" in third.stderr


def named(artifact: Reference, key: str, verdict: str) -> record_file.Verdict:
    """A build record's entry for a verdict proven here and pushed to `artifact`."""
    return record_file.Verdict("o", "stock", key, verdict, "proven", artifact)


def moved_key(reg: Registry, ref: Reference) -> str:
    from bakery.oci.refs import Descriptor

    config = Descriptor.from_json(json.loads(reg.get_manifest(ref)[0])["config"])
    return json.loads(reg.fetch_document(ref.repository, config, "config"))["key"]


def _trust(project: Path, keys_dir: Path, base, reg: Registry):
    from bakery.trust import policy
    from support import dev_policy

    return policy.release_signed(dev_policy(project.parent / "p.yaml", base), project,
                                 (keys_dir / "k" / "release.pub",), reg)


def test_the_sign_job_signs_only_the_verdict_the_record_says(registry, release_keys):
    """A build record naming a verdict artifact whose bytes say otherwise gets no signature."""
    reg, repo = Registry(registry), f"verdicts/sign-{uuid.uuid4().hex[:8]}"
    key = "ab" * 32
    ref, push = prove.verdict_artifact(RegistryStore(Reference(registry, repo), reg), prove.Verdict("BROKEN", "the defect is there", key=key))
    push()
    with pytest.raises(IntegrityError, match="says BROKEN, the build record FIXED: not signed"):
        attest_mod.sign_verdict(named(ref, key, "FIXED"), signer(release_keys, "k"))
    with pytest.raises(IntegrityError, match=f"judges {key}, not {'cd' * 32}"):
        attest_mod.sign_verdict(named(ref, "cd" * 32, "BROKEN"),
                                signer(release_keys, "k"))
    done = attest_mod.sign_verdict(named(ref, key, "BROKEN"), signer(release_keys, "k"))
    assert done["artifact"] == str(ref)


def test_a_verdict_whose_parts_are_gone_is_proven_here_not_fatal(registry):
    """A registry writer who deletes a signature's payload blob makes the signature check meet a 404
    (a registry here keeps every blob a manifest names, so the check raising NotFound stands in for
    it): the verdict is not taken and the build proves it; the registry being down still fails."""
    from bakery.errors import NotFound, TransientError

    reg, repo = Registry(registry), f"verdicts/gone-{uuid.uuid4().hex[:8]}"
    key = "ef" * 32
    _, push = prove.verdict_artifact(RegistryStore(Reference(registry, repo), reg), prove.Verdict("BROKEN", "the defect is there", key=key))
    push()
    said: list[str] = []

    def deleted(ref, what):
        raise NotFound(f"blob of the signature of {ref} is gone")

    assert prove.SignedVerdicts(RegistryStore(Reference(registry, repo), reg), deleted, said.append).fetch(key) is None

    def refused(ref, what):
        raise IntegrityError(f"{what} {ref} is signed by 0 of 1 required release key(s)")

    assert prove.SignedVerdicts(RegistryStore(Reference(registry, repo), reg), refused, said.append).fetch(key) is None
    assert len(said) == 1 and "proving here" in said[0]

    def down(ref, what):
        raise TransientError("the registry did not answer")

    with pytest.raises(TransientError):
        prove.SignedVerdicts(RegistryStore(Reference(registry, repo), reg), down, said.append).fetch(key)


def test_a_build_that_takes_nothing_signed_loads_no_signature_code(tmp_path):
    """What a warm build does about signatures: make its release trust (from a key, or from a policy
    whose roles name none, read at once), and make the statements attest will sign, to fail before a
    push. None checks a signature, so none loads the signature code (cryptography, verify, sign,
    keys): the warm no-op's time is the imports'."""
    import subprocess
    import sys

    code = """if True:
        import sys
        from pathlib import Path
        from bakery.bake import pipeline
        from bakery.bake.options import Options
        from bakery.oci.refs import Reference
        from bakery.trust import record
        here, policy = Path("."), Path(sys.argv[1])
        store = type("Store", (), {"registry": None})
        trust = pipeline.release_trust(Options(here, keys=(here / "release.pub",)), store)  # not read until a check
        pipeline.release_trust(Options(here, policy=policy), store)  # read now: it may name a keyless signer
        rec = record.read(here / "tests" / "data" / "build-record.json")
        pipeline.check_attestable(rec, Reference.parse(rec.outputs[0]["reference"]))
        assert callable(trust)
        print(sorted(m for m in sys.modules if m.split(".")[0] == "cryptography" or
                     m in ("bakery.trust.verify", "bakery.trust.sign", "bakery.trust.keys")))
    """
    policy = tmp_path / "policy.yaml"  # its roles name no key, as the keyless release workflow's
    policy.write_text("allowed_sources: [s]\nallowed_builders: [b]\nallowed_repositories: [r]\n")
    said = subprocess.run([sys.executable, "-c", code, str(policy)], cwd=Path(__file__).parent.parent,
                          capture_output=True, text=True)
    assert said.returncode == 0, said.stderr
    assert said.stdout.strip() == "[]"
