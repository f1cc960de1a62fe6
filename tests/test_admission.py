"""The admission policies (`invoke policy --k8s DIR`): checked against each controller's own CRD
schema, vendored from its repository (tests/data/crds/VENDORED.json), as the API server would take
them: valid, and with no field it would prune. No cluster, policy-controller or Kyverno runs here:
what they would decide is not shown, only that they are given what we mean."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]  # no stubs; check-jsonschema brings it
import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from bakery.errors import InputError
from bakery.release.deploy import admission
from bakery.trust import keys as keys_mod
from bakery.trust.policy import Policy, Role
from support import ROOT, invoke

CRDS = ROOT / "tests" / "data" / "crds"
REPOSITORY = "ghcr.io/dsv4-mi300x/vllm-dsv4-flash-mi300x"


def test_the_vendored_crds_are_the_bytes_their_record_names():
    record = json.loads((CRDS / "VENDORED.json").read_text())
    for name, entry in record["files"].items():
        assert hashlib.sha256((CRDS / name).read_bytes()).hexdigest() == entry["sha256"], name
    assert sorted(p.name for p in CRDS.iterdir()) == sorted([*record["files"], "VENDORED.json"])


def schema_of(crd_file: str, api_version: str) -> dict:
    crd = yaml.safe_load((CRDS / crd_file).read_text())
    version = api_version.split("/")[1]
    return next(v for v in crd["spec"]["versions"] if v["name"] == version)["schema"]["openAPIV3Schema"]


def pruned(doc, schema: dict, where: str = "") -> list[str]:
    """The fields the API server would drop (structural schemas prune what they do not name): each a
    part of the policy silently lost."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(doc, dict):
        named = schema.get("properties")
        if named is None:
            extra = schema.get("additionalProperties")
            return [p for k, v in doc.items() for p in pruned(v, extra, f"{where}.{k}")] if isinstance(extra, dict) \
                else []
        kept = ("apiVersion", "kind", "metadata") if where == "" else ()  # every object's, whatever its schema
        return [f"{where}.{k}" for k in doc if k not in named and k not in kept] + \
            [p for k, v in doc.items() if k in named for p in pruned(v, named[k], f"{where}.{k}")]
    if isinstance(doc, list) and isinstance(schema.get("items"), dict):
        return [p for i, v in enumerate(doc) for p in pruned(v, schema["items"], f"{where}[{i}]")]
    return []


def accepted(doc: dict, crd_file: str) -> list[str]:
    """Why the API server would not take doc as written: schema errors, then pruned fields."""
    schema = schema_of(crd_file, doc["apiVersion"])
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]
    return errors + [f"{p}: not in the schema (pruned)" for p in pruned(doc, schema)]


def key() -> ec.EllipticCurvePublicKey:
    return ec.generate_private_key(ec.SECP256R1()).public_key()


def policy_with(release=1, smoke=1, rebuilders=1, release_threshold=1, require_rebuilds=1) -> Policy:
    roles = {"release": Role("release", tuple(key() for _ in range(release)), release_threshold),
             "smoke": Role("smoke", tuple(key() for _ in range(smoke)), 1),
             "rebuilder": Role("rebuilder", tuple(key() for _ in range(rebuilders)), 1)}
    return Policy(roles, ("https://github.com/dsv4-mi300x/bakery",), ("local",), (REPOSITORY,), False,
                  f"{REPOSITORY}@sha256:{'0' * 64}", True, "ab" * 32, require_rebuilds=require_rebuilds)


def test_each_policy_is_valid_against_its_crd_and_loses_no_field_to_pruning():
    p = policy_with(release=2, release_threshold=2, rebuilders=2)
    files = {name: yaml.safe_load(body) for name, body in admission.admission_files(p).items()}
    assert sorted(files) == ["kyverno/bakery-verify-images.yaml", "policy-controller/bakery-rebuilder.yaml",
                             "policy-controller/bakery-release-0.yaml", "policy-controller/bakery-release-1.yaml",
                             "policy-controller/bakery-smoke.yaml"]
    for name, doc in files.items():
        crd = "kyverno-clusterpolicies.yaml" if name.startswith("kyverno/") else \
            "policy-controller-clusterimagepolicy.yaml"
        assert accepted(doc, crd) == [], name
    # the checker can fail: a misspelt field is pruned, a wrong type refused
    kyverno = files["kyverno/bakery-verify-images.yaml"]
    kyverno["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["count"] = "two"
    kyverno["spec"]["rules"][0]["verifyImages"][0]["requried"] = True
    said = accepted(kyverno, "kyverno-clusterpolicies.yaml")
    assert any("'two' is not of type 'integer'" in s for s in said) and \
        any(s.endswith("verifyImages[0].requried: not in the schema (pruned)") for s in said), said


def test_what_each_controller_is_asked_is_what_verify_asks_of_a_release():
    p = policy_with(release=3, release_threshold=2, rebuilders=2, require_rebuilds=2)
    kyverno = admission.kyverno_policy(p)
    rule = kyverno["spec"]["rules"][0]["verifyImages"][0]
    assert rule["imageReferences"] == [f"{REPOSITORY}@*", f"{REPOSITORY}:*"]
    assert rule["attestors"][0]["count"] == 2 and len(rule["attestors"][0]["entries"]) == 3  # 2 of 3 release keys
    smoke, rebuild = rule["attestations"]
    assert smoke["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    asked = {c["key"]: c["value"] for c in smoke["conditions"][0]["all"]}
    assert asked == {"{{ result }}": "PASSED", "{{ report.launched.candidate }}": True,
                     "{{ report.launched.reference }}": True, "{{ report.host.gfx_arch }}": "gfx942",
                     "{{ report.host.compute_units }}": 304,
                     "{{ configuration[?name=='provenance/smoke.yaml'].digest.sha256 | [0] }}": "ab" * 32}
    assert rebuild["attestors"][0]["count"] == 2 and rebuild["conditions"][0]["all"][0]["key"] == "{{ match }}"
    pems = [keys_mod.public_pem(k).decode() for k in p.roles["smoke"].keys]
    assert [e["keys"]["publicKeys"] for e in smoke["attestors"][0]["entries"]] == pems  # the smoke key, no other
    # policy-controller says "any of" within a policy and "each of" across: 2 of 3 has no spelling there
    with pytest.raises(InputError, match="2 of 3 release keys cannot be said to policy-controller"):
        admission.cluster_image_policies(p)
    cips = admission.cluster_image_policies(policy_with(release=2))
    release = cips["bakery-release.yaml"]["spec"]
    assert release["images"] == [{"glob": f"{REPOSITORY}@**"}, {"glob": f"{REPOSITORY}:**"}]
    assert len(release["authorities"]) == 2 and all("attestations" not in a for a in release["authorities"])
    smoked = cips["bakery-smoke.yaml"]["spec"]["authorities"][0]["attestations"][0]
    assert smoked["predicateType"] == "https://in-toto.io/attestation/test-result/v0.1"
    assert 'predicate: result: "PASSED"' in smoked["policy"]["data"] and "ab" * 32 in smoked["policy"]["data"]


def test_invoke_policy_k8s_writes_the_files_and_refuses_what_it_cannot_say(tmp_path):
    env = {"BAKERY_KEY_PASSWORD": "pw"}
    for role in ("release", "smoke", "rebuilder"):
        assert invoke(ROOT, "keygen", "--role", role, "--out", str(tmp_path / "k"), env=env).returncode == 0
    keys = ["--key", str(tmp_path / "k" / "release.pub"), "--smoke-key", str(tmp_path / "k" / "smoke.pub"),
            "--rebuilder-key", str(tmp_path / "k" / "rebuilder.pub")]
    done = invoke(ROOT, "policy", "--k8s", str(tmp_path / "out"), *keys)
    assert done.returncode == 0, done.stderr
    written = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.yaml"))
    assert written == ["kyverno/bakery-verify-images.yaml", "policy-controller/bakery-rebuilder.yaml",
                       "policy-controller/bakery-release.yaml", "policy-controller/bakery-smoke.yaml"]
    for args, said in ((["--k8s", str(tmp_path / "o2"), *keys[:2]], "the policy lists no smoke key"),
                       (["--k8s", str(tmp_path / "o3"), "--containers", str(tmp_path / "o4"), *keys],
                        "say which policy: --containers DIR"),
                       (["--containers", str(tmp_path / "o5"), *keys], "--smoke-key and --rebuilder-key are for --k8s")):
        refused = invoke(ROOT, "policy", *args)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        assert not any(Path(a).exists() for a in args if a.startswith(str(tmp_path / "o")))


def test_keyless_roles_are_rendered_by_workflow_identity_and_valid_against_each_crd():
    """Keyless only (no keys) and, for the release role, a migration policy accepting its key or
    its workflow identity: each controller is asked for the identity's issuer and subject."""
    import dataclasses
    import re

    from bakery.trust.keyless import GITHUB_ISSUER, RoleIdentity

    workflows = {"release": "build-and-sign", "smoke": "smoke", "rebuilder": "rebuild"}
    identities = {r: RoleIdentity(r, GITHUB_ISSUER, "dsv4-mi300x/bakery", f".github/workflows/{w}.yml", "refs/tags/v*")
                  for r, w in workflows.items()}
    p = dataclasses.replace(policy_with(release=1, smoke=0, rebuilders=0), identities=identities)
    files = {name: yaml.safe_load(body) for name, body in admission.admission_files(p).items()}
    for name, doc in files.items():
        crd = "kyverno-clusterpolicies.yaml" if name.startswith("kyverno/") else \
            "policy-controller-clusterimagepolicy.yaml"
        assert accepted(doc, crd) == [], name
    release = files["policy-controller/bakery-release.yaml"]["spec"]["authorities"]
    assert [sorted(a) for a in release] == [["key", "name"], ["keyless", "name"]]
    subject = release[1]["keyless"]["identities"][0]["subjectRegExp"]
    assert re.fullmatch(subject, "https://github.com/dsv4-mi300x/bakery/.github/workflows/build-and-sign.yml@refs/tags/v1.2.3")
    assert not re.fullmatch(subject, "https://github.com/dsv4-mi300x/bakery/.github/workflows/smoke.yml@refs/tags/v1.2.3")
    assert not re.fullmatch(subject, "https://github.com/dsv4-mi300x/bakery/.github/workflows/build-and-sign.yml@refs/heads/main")
    smoke = files["policy-controller/bakery-smoke.yaml"]["spec"]["authorities"]
    assert len(smoke) == 1 and smoke[0]["keyless"]["identities"][0]["issuer"] == GITHUB_ISSUER
    assert smoke[0]["attestations"][0]["predicateType"] == admission.PREDICATES["smoke"]
    rule = files["kyverno/bakery-verify-images.yaml"]["spec"]["rules"][0]["verifyImages"][0]
    assert [sorted(e) for e in rule["attestors"][0]["entries"]] == [["keys"], ["keyless"]]
    assert rule["attestors"][0]["entries"][1]["keyless"]["additionalExtensions"] == {
        "githubWorkflowRepository": "dsv4-mi300x/bakery", "githubWorkflowTrigger": "push"}
    assert rule["attestors"][0]["count"] == 1
    assert [a["attestors"][0]["entries"][0]["keyless"]["subjectRegExp"].split("/")[-3] for a in rule["attestations"]] \
        == [r"smoke\.yml@refs", r"rebuild\.yml@refs"]
