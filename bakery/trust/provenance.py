"""SLSA v1 provenance (an in-toto Statement v1) from the build record, and provenance/policy.yaml."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from pathlib import Path

from .. import schema
from ..errors import InputError
from ..files import canonical_json
from ..oci.refs import Reference
from ..project import Project
from .record import BuildRecord

STATEMENT = "https://in-toto.io/Statement/v1"
SLSA_PREDICATE = "https://slsa.dev/provenance/v1"
SPDX_PREDICATE = "https://spdx.dev/Document"
TEST_RESULT_PREDICATE = "https://in-toto.io/attestation/test-result/v0.1"
REBUILD_PREDICATE = "https://github.com/dsv4-mi300x/bakery/rebuild/v1"  # `invoke reproduce --attest`
BUILD_TYPE = "https://github.com/dsv4-mi300x/bakery/build/v1"
# Whose keys may sign a statement of each predicate type. The type is read from the signed
# statement itself, never from a label beside it; a type not listed here no key may sign.
SIGNED_BY = {SLSA_PREDICATE: "release", SPDX_PREDICATE: "release", TEST_RESULT_PREDICATE: "smoke",
             REBUILD_PREDICATE: "rebuilder"}
SMOKE_SPEC = "provenance/smoke.yaml"
POLICY_KEYS = {"roles": dict, "allowed_sources": list, "allowed_builders": list, "allowed_repositories": list,
               "allow_dirty": bool, "base": str, "require_smoke": bool, "require_rebuilds": int, "smoke_spec": str,
               "smoke_arch": str,
               "smoke_compute_units": int}


def statement(subject: Reference, predicate_type: str, predicate: dict) -> bytes:
    """An in-toto Statement v1 about one image digest, serialized deterministically."""
    body = {"_type": STATEMENT, "subject": [{"name": subject.name, "digest": {"sha256": subject.digest.hex}}],
            "predicateType": predicate_type, "predicate": predicate}
    return canonical_json(body)


def predicate(record: BuildRecord) -> dict:
    """The SLSA v1 predicate: what was built from what, by whom; nothing recomputed."""
    src, base = record.source, record.base
    deps = [{"uri": f"docker://{base.pinned}", "digest": {"sha256": base.pinned.digest.hex}, "name": "base image"},
            {"uri": f"git+{src.repository}@{src.revision}", "digest": {"gitCommit": src.revision},
             "name": "source"}]
    if base.manifest_digest != base.pinned.digest:  # the pin named an index: add the platform image
        deps.insert(1, {"uri": f"docker://{base.name}@{base.manifest_digest}",
                        "digest": {"sha256": base.manifest_digest.hex}, "name": f"base image ({base.platform})"})
    deps += [{"name": i.path, "digest": {"sha256": i.sha256}} for i in record.inputs]
    for artifact in record.artifacts:
        deps += [{"name": s.path, "digest": {"sha256": s.sha256}} for s in artifact.sources
                 if not any(d.get("name") == s.path for d in deps)]
    kernels = record.kernels.artifact
    if kernels:  # the OCI artifact the baked .so files came from (or were pushed as)
        deps.append({"uri": f"docker://{kernels.name}@{kernels.digest}", "digest": {"sha256": kernels.digest.hex},
                     "name": "kernel artifact"})
    # proof verdicts this build took, signed, instead of proving (the others it proved: byproducts)
    verdicts = [v for v in record.verdicts if v.artifact]
    deps += [{"uri": f"docker://{v.artifact.name}@{v.artifact.digest}", "digest": {"sha256": v.artifact.digest.hex},
              "name": f"proof verdict: {v.overlay} ({v.side})", "annotations": {"verdict": v.verdict}}
             for v in verdicts if v.origin == "registry"]
    byproducts = [{"name": a.path, "digest": {"sha256": a.sha256},
                   "annotations": {"arch": a.arch, "toolchain": a.toolchain}} for a in record.artifacts]
    byproducts += [{"name": f"layer: {l.comment}", "digest": {"sha256": l.descriptor.digest.hex},
                    "mediaType": l.descriptor.media_type} for l in record.layers]
    # each baked overlay's proof: the code that judged it, and what it said on stock and overlaid bytes
    byproducts += [{"name": f"proof: {o.id}", "digest": {"sha256": o.proof["code_sha256"]},
                    "annotations": {"stock": o.proof["stock"], "overlaid": o.proof["overlaid"],
                                    "script": o.proof["script"], "reason": o.proof["reason"]}}
                   for o in record.overlays if o.baked and (o.proof or {}).get("code_sha256")]
    byproducts += [{"uri": f"docker://{v.artifact.name}@{v.artifact.digest}",
                    "digest": {"sha256": v.artifact.digest.hex},
                    "name": f"proof verdict: {v.overlay} ({v.side})", "annotations": {"verdict": v.verdict}}
                   for v in verdicts if v.origin == "proven"]
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE,
            "externalParameters": {
                "base": str(base.pinned),
                "platform": base.platform,
                "source": {"repository": src.repository, "revision": src.revision, "dirty": src.dirty},
                "overlaysLock": {"sha256": record.overlays_lock.sha256, "base": record.overlays_lock.base},
                "sourceDateEpoch": src.source_date_epoch,
            },
            "internalParameters": {"tools": record.tools},
            "resolvedDependencies": deps,
        },
        "runDetails": {
            "builder": {"id": record.builder.id},
            "metadata": {"invocationId": record.builder.invocation, "startedOn": record.started,
                         "finishedOn": record.finished},
            "byproducts": byproducts,
        },
    }


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
    from . import keys as keys_mod
    from ..base.spec import load_spec

    doc = schema.load_yaml(path, POLICY_KEYS, required={"allowed_sources", "allowed_builders", "allowed_repositories"})
    for field_name in ("allowed_sources", "allowed_builders", "allowed_repositories"):
        if not doc[field_name] or not all(isinstance(v, str) for v in doc[field_name]):
            raise InputError(f"{path}: {field_name} must list at least one entry (strings)")
    roles = {}
    for name in keys_mod.ROLES:
        entry = (doc.get("roles") or {}).get(name) or {}
        schema.check_keys(entry, ROLE_KEYS, f"{path}: roles.{name}", required=set())
        files = [Path(path).parent / k for k in entry.get("keys") or []] + list((keys or {}).get(name) or [])
        threshold = entry.get("threshold", 1)
        if threshold < 1:
            raise InputError(f"{path}: roles.{name}.threshold must be at least 1")
        if name == "rebuilder" and threshold != 1:
            raise InputError(f"{path}: roles.rebuilder.threshold must be 1 (each rebuilder signs its own rebuild); "
                             f"how many must agree is require_rebuilds")
        roles[name] = Role(name, tuple(keys_mod.load_public(f) for f in files), threshold)
    unknown = set(doc.get("roles") or {}) - set(keys_mod.ROLES)
    if unknown:
        raise InputError(f"{path}: unknown role(s) {', '.join(sorted(unknown))}; roles: {', '.join(keys_mod.ROLES)}")
    _one_role_per_key(roles, path)
    base = doc.get("base")
    return Policy(roles, tuple(doc["allowed_sources"]), tuple(doc["allowed_builders"]),
                  tuple(doc["allowed_repositories"]), bool(doc.get("allow_dirty", False)),
                  str(Reference.parse_pinned(base, f"{path}: base") if base else
                      load_spec(Project(project).base_yaml).image),
                  bool(doc.get("require_smoke", False)), _smoke_spec(doc.get("smoke_spec"), project, path),
                  doc.get("smoke_arch") or "gfx942", doc.get("smoke_compute_units") or 304,
                  int(doc.get("require_rebuilds") or 0))


def _one_role_per_key(roles: dict, path: Path) -> None:
    """A key vouches for one thing: the same key (by its keyid) in two roles does not load."""
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
