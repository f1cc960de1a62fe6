"""Where the image runs: node policies that let a host pull and run only what our release keys signed.

`invoke policy --containers DIR` renders, from provenance/policy.yaml, the files that podman,
CRI-O and OpenShift (containers/image) enforce on every pull: `policy.json` (reject by default;
our repositories and their mirrors only with a sigstore signature by the release keys, the signed
identity bound to the allowed repository) and `registries.d/bakery.yaml` (read signatures from
the registry's cosign-style attachments). The keys go beside them. Install DIR's contents as
/etc/containers (the key paths in policy.json point there). Pure functions; the task writes.
"""

from __future__ import annotations

import json
from pathlib import Path

from ...errors import InputError
from ...trust import keys as keys_mod
from ...trust.policy import Policy

INSTALLED = Path("/etc/containers")  # where DIR's contents are meant to be installed
KEYS_DIR = "bakery-keys"


def exact_repository(repository: str, what: str) -> str:
    """One repository, HOST/NAMESPACE/NAME: a shorter scope (a registry, a namespace) would admit
    every repository under it; a pattern, tag or digest is not a scope."""
    parts = repository.split("/")
    if any(c in repository for c in "*?[@") or ":" in parts[-1] or len(parts) < 3 or not all(parts) \
            or repository != repository.lower():
        raise InputError(f"{what} {repository!r}: a node policy's scope is one exact repository (HOST/NAMESPACE/NAME, "
                         f"lowercase, no pattern, tag or digest); list each repository the nodes pull from")
    return repository


def _requirements(key_paths: list[str], threshold: int, identity: dict) -> list[dict]:
    """containers-policy ANDs the requirements of a scope; each sigstoreSigned one accepts any of
    its keys. So threshold 1 is one requirement over all keys, and all-of-n is one per key; k of n
    in between has no spelling there."""
    if threshold == 1:
        return [{"type": "sigstoreSigned", "keyPaths": key_paths, "signedIdentity": identity}]
    if threshold == len(key_paths):
        return [{"type": "sigstoreSigned", "keyPath": k, "signedIdentity": identity} for k in key_paths]
    raise InputError(f"roles.release.threshold {threshold} of {len(key_paths)} keys cannot be enforced by "
                     f"containers-policy (it can say one of the keys, or all of them)")


def containers_policy(policy: Policy, mirrors: dict[str, str], installed: Path = INSTALLED,
                      accept: tuple[str, ...] = ()) -> dict[str, bytes]:
    """{relative path: bytes} of the node policy: policy.json, registries.d/bakery.yaml and the
    release keys. `accept` lists other repositories the nodes pull unsigned (the pause image, the
    proxy, a device plugin: default reject refuses them too). `mirrors` maps a mirror repository
    to the allowed repository it copies; a pull
    from the mirror must carry the original's signature, copied with it (exactRepository: the
    signature must name the original; remapIdentity would be the natural spelling, but podman 5.4
    then demands the exact reference, which a cosign signature, naming only the repository, never
    has: containers/container-libs#373)."""
    release = policy.roles["release"]
    if not release.keys:
        raise InputError("the policy lists no release key: a node policy without one would refuse everything "
                         "(add keys under roles.release in provenance/policy.yaml, or pass --key FILE)")
    distinct = list({keys_mod.keyid(k): k for k in release.keys}.values())  # one key listed twice is one signer
    files = {f"{KEYS_DIR}/release-{i}.pub": keys_mod.public_pem(k) for i, k in enumerate(distinct)}
    key_paths = [str(installed / name) for name in files]
    scopes = {}
    for repository in policy.allowed_repositories:
        scopes[exact_repository(repository, "allowed_repositories:")] = _requirements(
            key_paths, release.threshold, {"type": "matchRepository"})
    for mirror, original in sorted(mirrors.items()):
        if original not in scopes or mirror in scopes:
            raise InputError(f"--mirror {mirror}={original}: the original must be in allowed_repositories and the "
                             f"mirror not")
        scopes[exact_repository(mirror, "--mirror")] = _requirements(
            key_paths, release.threshold, {"type": "exactRepository", "dockerRepository": original})
    for other in accept:
        if exact_repository(other, "--accept") in scopes:
            raise InputError(f"--accept {other}: our own repositories are never accepted unsigned")
        scopes[other] = [{"type": "insecureAcceptAnything"}]
    document = {"default": [{"type": "reject"}], "transports": {"docker": scopes}}
    files["policy.json"] = (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
    signed = sorted(set(scopes) - set(accept))
    attachments = "".join(f"  {scope}:\n    use-sigstore-attachments: true\n" for scope in signed)
    files["registries.d/bakery.yaml"] = ("# read our images' signatures from the registry (cosign's .sig tags)\n"
                                         "docker:\n" + attachments).encode()
    return files


def parse_mirrors(given: list[str]) -> dict[str, str]:
    """--mirror MIRROR/REPO=ORIGINAL/REPO, each once."""
    mirrors = {}
    for item in given:
        mirror, sep, original = item.partition("=")
        if not sep or not mirror or not original or mirror == original or mirror in mirrors:
            raise InputError(f"--mirror {item!r}: say MIRROR_HOST/REPO=ORIGINAL_HOST/REPO, each mirror once")
        mirrors[mirror] = original
    return mirrors


def unenforced(policy) -> str:
    """What the verification policy demands beyond the release signature, which a node's
    policy.json cannot check (podman and CRI-O verify signatures, not attestations); '' if nothing."""
    asked = (["a passing MI300X smoke result"] if policy.require_smoke else []) + \
        ([f"{policy.require_rebuilds} matching rebuild(s)"] if policy.require_rebuilds else [])
    return " or ".join(asked)
