"""Admission policies for Kubernetes: what a cluster checks before it runs one of our images.

`invoke policy --k8s DIR` renders, from provenance/policy.yaml (key mode), two policies that say the
same thing in the two admission controllers ops use:

- sigstore policy-controller: ClusterImagePolicy objects. Every policy that matches an image must
  pass (AND), and within one any authority may (OR): so one policy per role (the release signature,
  the smoke result, the rebuild), and, for a threshold of all its keys, one per key.
- Kyverno: one ClusterPolicy whose verifyImages rule asks for the release signature (`count` of its
  keys: a threshold), the smoke result and the rebuild attestation, each by its role's keys.

Each asks of the smoke result what can be read from its signed predicate: PASSED, both sides
launched by the gate, the pinned spec's sha256, the GPU the policy names; of the rebuild, that it
matched. A key's signatures are checked without a transparency log (none is used); a role the
policy signs keyless (keyless.roles) is matched by its workflow identity, issuer and certificate
subject, against the public Sigstore instance's roots and logs (each controller's default; a
private instance needs the controller's own trust-root resource). Pure functions; the task writes. No cluster runs them here: they are checked against each
controller's own CRD schema (tests/test_admission.py).
"""

from __future__ import annotations

import re

import yaml

from ...errors import InputError
from ...trust import keys as keys_mod
from ...trust.policy import ROLES, SMOKE_SPEC, Policy, Role
from ...trust.provenance import REBUILD_PREDICATE, TEST_RESULT_PREDICATE
from .node_policy import exact_repository

POLICY_CONTROLLER = "policy.sigstore.dev/v1beta1"
KYVERNO = "kyverno.io/v1"


def _pems(role: Role) -> list[str]:
    """The role's distinct keys, PEM text (one key listed twice is one signer)."""
    return [keys_mod.public_pem(k).decode() for k in {keys_mod.keyid(k): k for k in role.keys}.values()]


def _repositories(policy: Policy) -> list[str]:
    return [exact_repository(r, "allowed_repositories:") for r in policy.allowed_repositories]


def _needed(policy: Policy, name: str) -> int:
    """How many of the role's keys must have signed: its threshold (release, smoke), or the policy's
    require_rebuilds, at least one (each rebuilder signs its own rebuild). A role signed keyless
    (its workflow identity) is one signer."""
    role = policy.roles[name]
    needed = max(1, policy.require_rebuilds) if name == "rebuilder" else role.threshold
    if name in policy.identities:
        if needed != 1:
            raise InputError(f"{needed} {name} signatures are asked for, and the role signs keyless too (one "
                             f"workflow identity): admission can say one signature of either, not {needed}")
        return 1
    if not role.keys:
        raise InputError(f"the policy lists no {name} key, and admission would ask for its signature: add keys "
                         f"under roles.{name} in provenance/policy.yaml, or pass --{'key' if name == 'release' else name + '-key'} FILE")
    if needed > len(_pems(role)):
        raise InputError(f"{needed} {name} signature(s) are asked for, and the policy lists {len(_pems(role))} "
                         f"distinct {name} key(s)")
    return needed


def smoke_conditions(policy: Policy) -> dict:
    """What admission asks of the signed smoke predicate: {path in the predicate: value}."""
    return {"result": "PASSED", "report.launched.candidate": True, "report.launched.reference": True,
            "report.host.gfx_arch": policy.smoke_arch, "report.host.compute_units": policy.smoke_compute_units,
            f"configuration[?name=='{SMOKE_SPEC}'].digest.sha256 | [0]": policy.smoke_spec}


def _cue(policy: Policy, name: str) -> str:
    """The CUE a matching attestation's statement must unify with (policy-controller evaluates the
    in-toto statement; structs stay open, so other fields may be there)."""
    if name == "rebuilder":
        return "predicate: match: true\n"
    c = smoke_conditions(policy)
    # the spec is the first configuration entry the smoke writes (smoke_report.statement)
    return (f'predicate: result: "{c["result"]}"\n'
            f"predicate: report: launched: {{candidate: true, reference: true}}\n"
            f'predicate: report: host: {{gfx_arch: "{policy.smoke_arch}", compute_units: {policy.smoke_compute_units}}}\n'
            f'predicate: configuration: [{{name: "{SMOKE_SPEC}", digest: sha256: "{policy.smoke_spec}"}}, ...]\n')


PREDICATES = {"smoke": TEST_RESULT_PREDICATE, "rebuilder": REBUILD_PREDICATE}


def cluster_image_policies(policy: Policy) -> dict[str, dict]:
    """{file name: ClusterImagePolicy}: one per role, or one per key where all of a role's keys
    must sign (policy-controller can say "any of these keys" or, across policies, "each of them")."""
    images = [{"glob": f"{r}{tail}"} for r in _repositories(policy) for tail in ("@**", ":**")]
    out = {}
    # every role: what a cluster runs is what a release is, signed, smoke-tested on an MI300X and rebuilt
    # (promote's demands), whatever `invoke verify` asks by default
    for name in ROLES:
        needed, pems = _needed(policy, name), _pems(policy.roles[name])
        if 1 < needed < len(pems):
            raise InputError(f"{needed} of {len(pems)} {name} keys cannot be said to policy-controller (any one of "
                             f"them, or each of them); Kyverno's policy says it (attestors count)")
        groups = [pems] if needed == 1 else [[pem] for pem in pems]
        for g, group in enumerate(groups):
            authorities = []
            signers: list[dict] = [{"key": {"data": pem, "hashAlgorithm": "sha256"}} for pem in group]
            if name in policy.identities:  # any authority of a policy may pass: the key(s) or the identity
                signers.append({"keyless": {"identities": [_identity(policy, name)]}})
            for k, signer in enumerate(signers):
                authority: dict = {"name": f"{name}-{g + k}", **signer}
                if name in PREDICATES:
                    authority["attestations"] = [{"name": f"{name}-statement", "predicateType": PREDICATES[name],
                                                  "policy": {"type": "cue", "data": _cue(policy, name)}}]
                authorities.append(authority)
            title = f"bakery-{name}" + (f"-{g}" if len(groups) > 1 else "")
            out[f"{title}.yaml"] = {"apiVersion": POLICY_CONTROLLER, "kind": "ClusterImagePolicy",
                                    "metadata": {"name": title},
                                    "spec": {"images": images, "authorities": authorities}}
    return out


def _identity(policy: Policy, name: str) -> dict:
    """The role's workflow identity as both controllers match it: the issuer, and the certificate's
    subject (the Build Signer URI) as an RE2 expression from the policy's pattern."""
    identity = policy.identities[name]
    return {"issuer": identity.issuer, "subjectRegExp": "^" + re.escape(identity.signer_uri).replace(r"\*", ".*") + "$"}


def _attestor(policy: Policy, name: str) -> dict:
    keys = {"signatureAlgorithm": "sha256", "rekor": {"ignoreTlog": True}, "ctlog": {"ignoreSCT": True}}
    entries: list[dict] = [{"keys": {"publicKeys": pem, **keys}} for pem in _pems(policy.roles[name])]
    if name in policy.identities:  # checked against the transparency log and CT log of the public instance
        identity = policy.identities[name]
        entries.append({"keyless": {**_identity(policy, name), "rekor": {"url": "https://rekor.sigstore.dev"},
                                    "additionalExtensions": {"githubWorkflowRepository": identity.repository,
                                                             "githubWorkflowTrigger": identity.trigger}}})
    return {"count": _needed(policy, name), "entries": entries}


def kyverno_policy(policy: Policy) -> dict:
    """One Kyverno ClusterPolicy: every Pod's image of our repositories must carry the release
    signature (threshold: attestors count), and the smoke and rebuild attestations the policy asks for."""
    attestations = []
    for name in ROLES[1:]:
        conditions = ({"match": True} if name == "rebuilder" else smoke_conditions(policy))
        attestations.append({"predicateType": PREDICATES[name], "attestors": [_attestor(policy, name)],
                             "conditions": [{"all": [{"key": f"{{{{ {path} }}}}", "operator": "Equals",
                                                      "value": value} for path, value in conditions.items()]}]})
    rule = {"imageReferences": [f"{r}{tail}" for r in _repositories(policy) for tail in ("@*", ":*")],
            "failureAction": "Enforce", "mutateDigest": True, "verifyDigest": True, "required": True,
            "attestors": [_attestor(policy, "release")], "attestations": attestations}
    return {"apiVersion": KYVERNO, "kind": "ClusterPolicy", "metadata": {"name": "bakery-verify-images"},
            "spec": {"background": False, "webhookTimeoutSeconds": 30,
                     "rules": [{"name": "bakery-signed-smoked-rebuilt",
                                "match": {"any": [{"resources": {"kinds": ["Pod"]}}]},
                                "verifyImages": [rule]}]}}


class _Dumper(yaml.SafeDumper):
    """Multi-line text (a PEM key, a CUE policy) as a literal block, as people write these files."""


_Dumper.add_representer(str, lambda dumper, value: dumper.represent_scalar(
    "tag:yaml.org,2002:str", value, style="|" if "\n" in value else None))


def admission_files(policy: Policy) -> dict[str, bytes]:
    """{relative path: bytes}: policy-controller/*.yaml and kyverno/bakery-verify-images.yaml."""
    def text(doc: dict) -> bytes:
        return yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1000).encode()

    files = {f"policy-controller/{name}": text(doc) for name, doc in cluster_image_policies(policy).items()}
    files["kyverno/bakery-verify-images.yaml"] = text(kyverno_policy(policy))
    return files
