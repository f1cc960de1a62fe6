"""The keys and policy a task is given on its command line, as the trust layer takes them."""

from __future__ import annotations

from pathlib import Path

from ..project import Project


def role_keys(release: str | None = None, smoke: str | None = None, rebuilders=None) -> dict:
    """{role: [public key paths]} from --key/--release-key, --smoke-key and --rebuilder-key."""
    keys = {"release": [Path(release)] if release else [], "smoke": [Path(smoke)] if smoke else []}
    if rebuilders is not None:
        keys["rebuilder"] = [Path(k) for k in rebuilders]
    return keys


def load_policy(project: Path, policy: str | None, keys: dict):
    """The verification policy (default: provenance/policy.yaml) with the keys given on the command line."""
    from ..trust import policy as policy_mod

    return policy_mod.load_policy(Path(policy) if policy else Project(project).policy, project, keys)


def kernel_trust(project: Path, key: str | None, policy: str | None, registry):
    """None, or what a kernel artifact must carry (a release-key signature) to be used instead of compiling."""
    from ..trust import policy as policy_mod

    return policy_mod.release_signed(Path(policy) if policy else Project(project).policy, project,
                                     (Path(key),) if key else (), registry)


def check_signer(keyless: bool, key: str | None, signing: bool = True) -> None:
    """Refuse --keyless with --key (or with nothing to sign) now, before a long run that ends in signing."""
    from ..errors import InputError

    if keyless and key:
        raise InputError("--keyless signs as the workflow identity, --key with a key: give one")
    if keyless and not signing:
        raise InputError("--keyless says how to sign, and nothing is signed here: add --attest")


def signer_for(role: str, keyless: bool = False, trust_config: str | None = None, key: str | None = None):
    """What signs for `role`: its encrypted private key (--key FILE, else the role's environment
    variable), or with --keyless the workflow identity of this job's OIDC token."""
    from ..trust import keyless as keyless_mod, keys, sign

    check_signer(keyless, key)
    if keyless:
        return keyless_mod.ambient_signer(Path(trust_config) if trust_config else None)
    return sign.Signer(keys.load_private(Path(key) if key else None, keys.ENV_OF_ROLE[role]))
