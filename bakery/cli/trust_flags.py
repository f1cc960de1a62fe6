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
    from ..bake.pipeline import Options

    return Options.from_flags(project, key=key, policy=policy).kernel_trust(registry)
