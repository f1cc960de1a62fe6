"""provenance/policy.yaml: whose keys may sign what (roles, thresholds), which sources, builders and
repositories are allowed, and what `invoke verify` demands beyond a valid signature; validated on load."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from pathlib import Path

from .. import schema
from ..errors import InputError
from ..oci.refs import Reference
from ..project import Project
from . import keyless
from .provenance import REBUILD_PREDICATE, SLSA_PREDICATE, SPDX_PREDICATE, TEST_RESULT_PREDICATE, VEX_PREDICATE

# Whose keys may sign a statement of each predicate type. The type is read from the signed
# statement itself, never from a label beside it; a type not listed here no key may sign.
SIGNED_BY = {SLSA_PREDICATE: "release", SPDX_PREDICATE: "release", VEX_PREDICATE: "release",
             TEST_RESULT_PREDICATE: "smoke", REBUILD_PREDICATE: "rebuilder"}
SMOKE_SPEC = "provenance/smoke.yaml"
POLICY_KEYS = {"roles": dict, "allowed_sources": list, "allowed_builders": list, "allowed_repositories": list,
               "allow_dirty": bool, "base": str, "require_smoke": bool, "require_rebuilds": int, "smoke_spec": str,
               "smoke_arch": str,
               "smoke_compute_units": int, "signature_formats": list, "keyless": dict}
# release: image signature, SBOM, provenance; smoke: the MI300X result; rebuilder: "I rebuilt it"
ROLES = ("release", "smoke", "rebuilder")
SIGNATURE_FORMATS = ("tag", "bundle")  # cosign's .sig/.att tags; Sigstore bundles (v0.3) as OCI referrers


@dataclass(frozen=True)
class Role:
    """Who may sign one kind of statement (the in-toto layout idea): its keys and how many must sign."""
    name: str
    keys: tuple  # public keys
    threshold: int = 1


@dataclass(frozen=True)
class Policy:
    """What `invoke verify` demands beyond valid bytes; validated on load."""
    roles: dict  # "release" | "smoke" -> Role
    allowed_sources: tuple[str, ...]  # source repositories (shell-style patterns)
    allowed_builders: tuple[str, ...]  # builder ids (shell-style patterns; "local" for a laptop build)
    allowed_repositories: tuple[str, ...]  # where our signatures may say the image was pushed (patterns)
    allow_dirty: bool
    base: str
    require_smoke: bool
    smoke_spec: str  # sha256 hex of the smoke spec a smoke result must have run (default: the committed one)
    smoke_arch: str = "gfx942"  # the GPU a smoke result must come from: an MI300X is gfx942 with 304 CUs
    smoke_compute_units: int = 304  # (MI300A and MI308X are gfx942 too, with 228 and 80)
    require_rebuilds: int = 0  # distinct rebuilder keys that must attest a matching rebuild
    signature_formats: tuple[str, ...] = SIGNATURE_FORMATS  # what attest writes; verify reads either
    identities: dict = field(default_factory=dict)  # role -> keyless.RoleIdentity (signing without keys)
    trusted_root: Path | None = None  # the trusted_root.json keyless bundles are checked against, offline

    def may_sign(self, role: str) -> bool:
        """Whether anything here can vouch for the role: a key, or a keyless identity."""
        return bool(self.roles[role].keys) or role in self.identities

    def role_for(self, predicate_type: str) -> Role | None:
        """The role whose keys may sign a statement of this type; None: no key may."""
        name = SIGNED_BY.get(predicate_type)
        return self.roles[name] if name else None

    def source_allowed(self, source: str) -> bool:
        return any(fnmatch.fnmatchcase(source, p) for p in self.allowed_sources)

    def builder_allowed(self, builder: str) -> bool:
        return any(fnmatch.fnmatchcase(builder, p) for p in self.allowed_builders)

    def repository_allowed(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, p) for p in self.allowed_repositories)


ROLE_KEYS = {"keys": list, "threshold": int}


def load_policy(path: Path, project: Path, keys: dict | None = None) -> Policy:
    """The verification policy. Its base defaults to the pin in image/base.yaml; keys given on the
    command line ({role: [public key file]}) are added to the policy's own."""
    from ..base.spec import load_spec

    doc = schema.load_yaml(path, POLICY_KEYS, required={"allowed_sources", "allowed_builders", "allowed_repositories"})
    for field_name in ("allowed_sources", "allowed_builders", "allowed_repositories"):
        if not doc[field_name] or not all(isinstance(v, str) for v in doc[field_name]):
            raise InputError(f"{path}: {field_name} must list at least one entry (strings)")
    roles = {}
    for name in ROLES:
        entry = (doc.get("roles") or {}).get(name) or {}
        schema.check_keys(entry, ROLE_KEYS, f"{path}: roles.{name}", required=set())
        files = [Path(path).parent / k for k in entry.get("keys") or []] + list((keys or {}).get(name) or [])
        threshold = entry.get("threshold", 1)
        if threshold < 1:
            raise InputError(f"{path}: roles.{name}.threshold must be at least 1")
        if name == "rebuilder" and threshold != 1:
            raise InputError(f"{path}: roles.rebuilder.threshold must be 1 (each rebuilder signs its own rebuild); "
                             f"how many must agree is require_rebuilds")
        roles[name] = Role(name, _public_keys(files), threshold)
    unknown = set(doc.get("roles") or {}) - set(ROLES)
    if unknown:
        raise InputError(f"{path}: unknown role(s) {', '.join(sorted(unknown))}; roles: {', '.join(ROLES)}")
    _one_role_per_key(roles, path)
    identities, trusted_root = keyless.load_identities(doc.get("keyless"), path)
    for name in identities:
        if roles[name].threshold != 1:  # one identity is one signer: k of n has no keyless spelling
            raise InputError(f"{path}: roles.{name}.threshold is {roles[name].threshold}, and the role signs keyless "
                             f"too (one workflow identity, one signer): a threshold over 1 cannot be met by it")
    base = doc.get("base")
    return Policy(roles, tuple(doc["allowed_sources"]), tuple(doc["allowed_builders"]),
                  tuple(doc["allowed_repositories"]), bool(doc.get("allow_dirty", False)),
                  str(Reference.parse_pinned(base, f"{path}: base") if base else
                      load_spec(Project(project).base_yaml).image),
                  bool(doc.get("require_smoke", False)), _smoke_spec(doc.get("smoke_spec"), project, path),
                  doc.get("smoke_arch") or "gfx942", doc.get("smoke_compute_units") or 304,
                  int(doc.get("require_rebuilds") or 0), _formats(doc.get("signature_formats"), path),
                  identities, trusted_root)


def release_signed(policy_path: Path, project: Path, keys: tuple[Path, ...], registry):
    """What a kernel artifact (or a proof verdict) must carry to be used: a cosign signature by the
    policy's release keys or its release workflow's keyless identity (threshold, allowed
    repositories), checked by trust(REF@DIGEST, what), which raises unless it holds. None where the
    policy names neither. With keys there is one, so the policy is read, and the signature code
    loaded, when a signature is first checked (a warm build checks none)."""
    import functools

    load = functools.lru_cache(maxsize=1)(lambda: load_policy(policy_path, project, {"release": list(keys)}))
    if not keys and not load().may_sign("release"):
        return None

    def trust(ref: Reference, what: str = "kernel artifact") -> None:
        from ..oci.store import RegistryStore
        from .verify import require_signed

        require_signed(RegistryStore(ref, registry), ref, load(), what)

    return trust


def _formats(given: list | None, path: Path) -> tuple[str, ...]:
    if given is None:
        return SIGNATURE_FORMATS
    if not given or len(set(given)) != len(given) or not set(given) <= set(SIGNATURE_FORMATS):
        raise InputError(f"{path}: signature_formats must list one or both of {', '.join(SIGNATURE_FORMATS)}, "
                         f"each once")
    return tuple(f for f in SIGNATURE_FORMATS if f in given)


def signature_formats(project: Path) -> tuple[str, ...]:
    """What attest, attach, smoke and reproduce write: the project policy's signature_formats."""
    return load_policy(Project(project).policy, project).signature_formats


def _public_keys(files: list[Path]) -> tuple:
    """Each file's public key. The key code (cryptography) loads only where a role names a key: a
    policy of keyless roles, read by a warm build, loads none."""
    if not files:
        return ()
    from . import keys as keys_mod

    return tuple(keys_mod.load_public(f) for f in files)


def _one_role_per_key(roles: dict, path: Path) -> None:
    """A key vouches for one thing: the same key (by its keyid) in two roles does not load."""
    if not any(role.keys for role in roles.values()):
        return
    from . import keys as keys_mod

    holders: dict[str, set] = {}
    for role in roles.values():
        for key in role.keys:
            holders.setdefault(keys_mod.keyid(key), set()).add(role.name)
    shared = {k: r for k, r in holders.items() if len(r) > 1}
    if shared:
        keyid, names = next(iter(sorted(shared.items())))
        raise InputError(f"{path}: key {keyid[:16]} is listed in roles {' and '.join(sorted(names))}: one key vouches "
                         f"for one thing; give each role its own key (`invoke keygen --role ROLE`)")


def _smoke_spec(pinned: str | None, project: Path, path: Path) -> str:
    """The smoke spec a result must have run: the policy's sha256:<hex>, else the committed file's."""
    import hashlib

    if pinned:
        from ..oci.refs import Digest

        try:
            return Digest.parse(pinned).hex
        except InputError as e:
            raise InputError(f"{path}: smoke_spec: {e}") from None
    try:
        return hashlib.sha256((project / SMOKE_SPEC).read_bytes()).hexdigest()
    except OSError as e:
        raise InputError(f"{path}: no smoke_spec given and {SMOKE_SPEC} cannot be read ({e.strerror})") from None
