"""Overlays: patched vLLM/AITER files, verified against the exact base bytes they replace.

overlays/overlays.yaml registers each overlay; overlays/overlays.lock pins, for one base digest,
the sha256 of each target before and after. The build is the gate: any drift stops it with the
overlay, the target, both hashes and the next command to run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import inputs, patch as patch_mod
from .errors import InputError, IntegrityError
from .layer import write_blob

SITE = "/usr/local/lib/python3.12/dist-packages"
PACKAGE_ROOTS = (f"{SITE}/vllm/", f"{SITE}/aiter/")
KINDS = ("patch", "new-file", "upstream-backport")
STATUSES = ("required", "superseded", "already-upstream", "absent", "not-applicable")
UNPATCHED = ("already-upstream", "absent", "not-applicable")  # audit records: no patch file
ENTRY_KEYS = {"id": str, "target": str, "upstream": dict, "patch": str, "kind": str, "reason": str,
              "status": str, "platforms": list, "note": str}
UPSTREAM_KEYS = {"repo": str, "ref": str, "path": str}
LOCK_SCHEMA = "bakery.overlays.lock/v1"


@dataclass(frozen=True)
class Overlay:
    id: str
    target: str  # absolute path in the image
    upstream: dict
    patch_path: Path | None
    patch_bytes: bytes | None
    kind: str
    reason: str
    status: str
    platforms: tuple[str, ...]

    @property
    def baked(self) -> bool:
        return self.status == "required"

    @property
    def relative(self) -> str:
        """The target as patches name it: relative to dist-packages."""
        return self.target[len(SITE) + 1:]

    @property
    def patch_sha256(self) -> str | None:
        return hashlib.sha256(self.patch_bytes).hexdigest() if self.patch_bytes is not None else None

    def parsed(self) -> patch_mod.Patch:
        return patch_mod.parse(self.patch_bytes, str(self.patch_path))


def load(path: Path) -> list[Overlay]:
    """Read and check overlays.yaml: keys, kinds, targets inside the package roots, patch files."""
    data = inputs.load_yaml(path, {"overlays": list})
    seen: dict[str, str] = {}
    out = []
    for i, entry in enumerate(data["overlays"] or []):
        where = f"{path}: overlays[{i}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected a mapping")
        inputs.check_keys(entry, ENTRY_KEYS, where,
                          required={"id", "target", "upstream", "kind", "reason", "status", "platforms"})
        where = f"{path}: overlay {entry['id']!r}"
        inputs.check_keys(entry["upstream"], UPSTREAM_KEYS, f"{where}: upstream")
        if entry["kind"] not in KINDS:
            raise InputError(f"{where}: kind {entry['kind']!r} is not one of {', '.join(KINDS)}")
        if entry["status"] not in STATUSES:
            raise InputError(f"{where}: status {entry['status']!r} is not one of {', '.join(STATUSES)}")
        target = entry["target"]
        if ".." in PurePosixPath(target).parts or not target.startswith(PACKAGE_ROOTS) \
                or str(PurePosixPath(target)) != target:
            raise InputError(f"{where}: target {target!r} must be a normalized path under "
                             f"{' or '.join(PACKAGE_ROOTS)}")
        if entry["id"] in {o.id for o in out}:
            raise InputError(f"{where}: duplicate id")
        if entry["status"] == "required":
            if target in seen:
                raise InputError(f"{where}: target {target} is already overlaid by {seen[target]!r}; "
                                 f"merge them into one patch")
            seen[target] = entry["id"]
        patch_path, patch_bytes = None, None
        if entry.get("patch"):
            patch_path = path.parent / entry["patch"]
            if ".." in Path(entry["patch"]).parts:
                raise InputError(f"{where}: patch {entry['patch']!r} must be inside {path.parent}")
            try:
                patch_bytes = patch_path.read_bytes()
            except FileNotFoundError:
                raise InputError(f"{where}: patch file {patch_path} is missing") from None
        elif entry["status"] not in UNPATCHED:
            raise InputError(f"{where}: needs a patch file (only {', '.join(UNPATCHED)} have none)")
        overlay = Overlay(entry["id"], target, entry["upstream"], patch_path, patch_bytes, entry["kind"],
                          entry["reason"], entry["status"], tuple(entry["platforms"]))
        if patch_bytes is not None:
            _check_patch_names_target(overlay)
        out.append(overlay)
    return out


def _check_patch_names_target(overlay: Overlay) -> None:
    p = overlay.parsed()
    new_file = overlay.kind == "new-file"
    expected_old = "/dev/null" if new_file else overlay.relative
    if p.old_path != expected_old or p.new_path != overlay.relative:
        raise InputError(f"overlay {overlay.id!r}: patch {overlay.patch_path.name} touches "
                         f"{p.new_path if p.new_path != '/dev/null' else p.old_path}, not its target "
                         f"{overlay.relative}")


# -- the lock -------------------------------------------------------------------------------------

def lock_document(base_ref: str, entries: list[dict]) -> dict:
    return {"schema": LOCK_SCHEMA, "base": base_ref, "overlays": sorted(entries, key=lambda e: e["id"])}


def write_lock(path: Path, document: dict) -> None:
    write_blob(path, json.dumps(document, indent=2, sort_keys=True).encode() + b"\n")


def read_lock(path: Path) -> dict:
    return inputs.load_json(path, LOCK_SCHEMA, "overlays lock", "create it from the pinned base with `invoke lock`")


@dataclass(frozen=True)
class Applied:
    overlay: Overlay
    base_sha256: str | None  # None for a new file
    result: bytes

    @property
    def result_sha256(self) -> str:
        return hashlib.sha256(self.result).hexdigest()

    def lock_entry(self) -> dict:
        return {"id": self.overlay.id, "target": self.overlay.target, "patch_sha256": self.overlay.patch_sha256,
                "base_sha256": self.base_sha256, "result_sha256": self.result_sha256}


def _base_bytes(overlay: Overlay, found) -> bytes | None:
    """The target's bytes in the base; refuses symlinks and other non-files."""
    if found is None:
        return None
    if found.kind not in ("file", "hardlink"):
        raise InputError(f"overlay {overlay.id!r}: target {overlay.target} is a {found.kind} in the base"
                         + (f" (-> {found.linkname})" if found.linkname else "")
                         + "; overlay the file it points to instead")
    return found.data


def apply_all(overlays: list[Overlay], base_files: dict) -> list[Applied]:
    """Apply every required overlay exactly to the base bytes (no lock involved)."""
    applied = []
    for o in overlays:
        if not o.baked:
            continue
        original = _base_bytes(o, base_files.get(o.target.lstrip("/")))
        if original is None and o.kind != "new-file":
            raise InputError(f"overlay {o.id!r}: target {o.target} does not exist in the base; "
                             f"run `invoke rebase --base NEW@DIGEST` to see what changed")
        if original is not None and o.kind == "new-file":
            raise InputError(f"overlay {o.id!r}: new-file target {o.target} already exists in the base")
        try:
            result, _ = patch_mod.apply(o.parsed(), original or b"")
        except patch_mod.PatchConflict as e:
            raise IntegrityError(f"overlay {o.id!r}: patch {o.patch_path.name} does not apply exactly to "
                                 f"{o.target} ({e}); run `invoke rebase --base REF@DIGEST` and refresh the patch") from None
        applied.append(Applied(o, hashlib.sha256(original).hexdigest() if original is not None else None, result))
    return applied


def verify_against_lock(applied: list[Applied], lock: dict, base_ref: str, lock_path: Path) -> None:
    """The build's gate: same base, same base bytes, same result, every overlay accounted for."""
    if lock["base"] != base_ref:
        raise IntegrityError(f"{lock_path} is for base {lock['base']}, not {base_ref}: run "
                             f"`invoke rebase --base {base_ref}` to check and re-lock the overlays")
    locked = {e["id"]: e for e in lock["overlays"]}
    for a in applied:
        entry = locked.get(a.overlay.id)
        where = f"overlay {a.overlay.id!r} ({a.overlay.target})"
        if entry is None:
            raise IntegrityError(f"{where} is not in {lock_path}: run `invoke lock`")
        if entry["base_sha256"] != a.base_sha256:
            raise IntegrityError(f"{where}: base file has sha256 {a.base_sha256}, lock expects "
                                 f"{entry['base_sha256']}: the base changed under the overlay; run "
                                 f"`invoke rebase --base {base_ref}`")
        if entry["patch_sha256"] != a.overlay.patch_sha256:
            raise IntegrityError(f"{where}: patch has sha256 {a.overlay.patch_sha256}, lock expects "
                                 f"{entry['patch_sha256']}: the patch was edited; run `invoke lock`")
        if entry["result_sha256"] != a.result_sha256:
            raise IntegrityError(f"{where}: result has sha256 {a.result_sha256}, lock expects "
                                 f"{entry['result_sha256']}; run `invoke lock` if the change is intended")
    extra = set(locked) - {a.overlay.id for a in applied}
    if extra:
        raise IntegrityError(f"{lock_path} locks overlays that are not required: {', '.join(sorted(extra))}; "
                             f"run `invoke lock`")


# -- bytecode -------------------------------------------------------------------------------------

def stale_bytecode(targets: list[str], present: list[str]) -> list[str]:
    """The base's __pycache__ entries for overlaid modules: a .pyc whose recorded source size and
    mtime still match (a same-size edit) would run instead of the overlay, so they are deleted."""
    out = []
    for target in targets:
        p = PurePosixPath(target)
        if p.suffix != ".py":
            continue
        prefix = f"{str(p.parent).lstrip('/')}/__pycache__/{p.stem}."
        out += [f"/{q}" for q in present if q.startswith(prefix) and q.endswith(".pyc")]
    return sorted(out)


# -- rebase -------------------------------------------------------------------------------------

APPLIES, OFFSET, CONFLICTS, MISSING, UPSTREAM = ("applies", "applies-with-offset", "conflicts",
                                                 "target-missing", "already-upstream")
BY_HAND = "check-by-hand"  # an audit record: no patch, so nothing to apply


def rebase_status(overlay: Overlay, found) -> tuple[str, str, Applied | None]:
    """How one overlay fares on a new base: (status, detail, applied result if it applies exactly)."""
    try:
        original = _base_bytes(overlay, found)
    except InputError as e:
        return CONFLICTS, str(e), None
    if original is None and overlay.kind != "new-file":
        return MISSING, "target not in the new base", None
    p = overlay.parsed()
    try:
        result, _ = patch_mod.apply(p, original or b"")
        applied = Applied(overlay, hashlib.sha256(original).hexdigest() if original is not None else None, result)
        return APPLIES, "", applied
    except patch_mod.PatchConflict as exact:
        try:
            result, worst = patch_mod.apply(p, original or b"", allow_offset=True)
        except patch_mod.PatchConflict as e:
            if original is not None and _already_applied(p, original):
                return UPSTREAM, "the new base already contains the change", None
            return CONFLICTS, str(e), None
        return OFFSET, f"{exact}; refresh with `invoke rebase --refresh`", \
            Applied(overlay, hashlib.sha256(original).hexdigest(), result)


def _already_applied(p: patch_mod.Patch, original: bytes) -> bool:
    """Does the base already hold every hunk's new side?"""
    lines = original.splitlines(keepends=True)
    return all(any(tuple(lines[i:i + len(h.new)]) == h.new for i in range(len(lines) - len(h.new) + 1))
               for h in p.hunks)
