"""Overlays: patched vLLM/AITER files, verified against the exact base bytes they replace.

overlays/overlays.yaml registers each overlay; overlays/overlays.lock pins, for one base digest,
the sha256 of each target before and after. The build is the gate: any drift stops it with the
overlay, the target, both hashes and the next command to run.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .. import schema
from ..errors import InputError, IntegrityError
from ..files import is_staging, rewrite
from . import patch as patch_mod, proof_spec

SITE = "/usr/local/lib/python3.12/dist-packages"
PACKAGE_ROOTS = (f"{SITE}/vllm/", f"{SITE}/aiter/")
KINDS = ("patch", "new-file", "upstream-backport")
STATUSES = ("required", "superseded", "already-upstream", "absent", "not-applicable")
UNPATCHED = ("already-upstream", "absent", "not-applicable")  # audit records: no patch file
ENTRY_KEYS = {"id": str, "target": str, "upstream": dict, "patch": str, "kind": str, "reason": str,
              "status": str, "platforms": list, "note": str, "proof": dict, "probe": list, "by_hand": str,
              "defect": dict}
PROBE_KEYS = {"present": str, "absent": str, "file": str, "path": str, "why": str}
UPSTREAM_KEYS = {"repo": str, "ref": str, "path": str}
# the upstream defect an overlay fixes (or an audit record is about), as upstream names it: the VEX
# statement's vulnerability. id and aliases are https URLs of the issue, advisory, PR or commit
DEFECT_KEYS = {"id": str, "aliases": list}
DEFECT_URL = re.compile(r"https://[A-Za-z0-9.-]+/[A-Za-z0-9._~/#%+-]{1,200}")
LOCK_SCHEMA = "bakery.overlays.lock/v1"


@dataclass(frozen=True)
class Overlay:
    """One entry of overlays.yaml, checked: the target, its patch (and ports), its proof and probes."""
    id: str
    target: str  # absolute path in the image
    upstream: dict
    patch_path: Path | None
    patch_bytes: bytes | None
    kind: str
    reason: str
    status: str
    platforms: tuple[str, ...]
    proof: proof_spec.ProofSpec | None = None
    ports: tuple[tuple[str, Path, bytes], ...] = ()  # (target sha256 it applies to, patch file, bytes)
    probe: tuple[dict, ...] = ()  # an audit record's conditions: what must be true of a base for it to hold
    by_hand: str | None = None  # what of the record only a person (or the hardware) can check
    defect: dict | None = None  # {id, aliases}: the upstream defect, where upstream names it

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

    @property
    def patch_data(self) -> bytes:
        """The patch's bytes: only a baked overlay (status required) has one."""
        if self.patch_bytes is None:
            raise InputError(f"overlay {self.id!r} has no patch")
        return self.patch_bytes

    @property
    def patch_name(self) -> str:
        """The patch file's name, for messages."""
        return self.patch_path.name if self.patch_path else "(no patch)"

    def parsed(self) -> patch_mod.Patch:
        return patch_mod.parse(self.patch_data, str(self.patch_path))

    def for_target(self, original: bytes | None) -> Overlay:
        """This overlay with the patch written for these target bytes: a port whose file is named
        by their sha256, else the main patch."""
        sha = hashlib.sha256(original).hexdigest() if original is not None else None
        for port_sha, path, data in self.ports:
            if port_sha == sha:
                return dataclasses.replace(self, patch_path=path, patch_bytes=data)
        return self


def load(path: Path) -> list[Overlay]:
    """Read and check overlays.yaml: keys, kinds, targets inside the package roots, patch files."""
    data = schema.load_yaml(path, {"overlays": list})
    seen: dict[str, str] = {}
    out: list[Overlay] = []
    for i, entry in enumerate(data["overlays"] or []):
        where = f"{path}: overlays[{i}]"
        if not isinstance(entry, dict):
            raise InputError(f"{where}: expected a mapping")
        required = {"id", "target", "upstream", "kind", "reason", "status", "platforms"}
        schema.check_keys(entry, ENTRY_KEYS, where, required=required)
        for key in sorted(k for k in required if entry[k] is None):  # check_keys lets null through
            raise InputError(f"{where}: {key} must be a {ENTRY_KEYS[key].__name__}, not null")
        where = f"{path}: overlay {entry['id']!r}"
        schema.check_keys(entry["upstream"], UPSTREAM_KEYS, f"{where}: upstream")
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
                          entry["reason"], entry["status"], tuple(entry["platforms"]),
                          proof_spec.load_spec(entry.get("proof"), path.parent, f"{where}: proof"),
                          _ports(path.parent, entry["id"], where), _probe(entry.get("probe"), target, where),
                          entry.get("by_hand"), _defect(entry.get("defect"), where, entry["upstream"]["repo"]))
        if overlay.defect and overlay.status in UNPATCHED and not overlay.probe:
            # the release key signs `not_affected` for it: a base must be checked to still hold that
            raise InputError(f"{where}: an audit record that names a defect needs a probe (what a base must "
                             f"hold for the VEX's not_affected to be true of it)")
        if patch_bytes is not None:
            _check_patch_names_target(overlay)
        for port_sha, port_path, port_bytes in overlay.ports:
            _check_port(path.parent, dataclasses.replace(overlay, patch_path=port_path, patch_bytes=port_bytes), port_sha)
        out.append(overlay)
    return out


def _defect(entry: dict | None, where: str, upstream_repo: str) -> dict | None:
    """The defect is named in the overlay's own upstream repository (its issue, PR, commit or
    advisory): the release key signs `fixed` under that id, so it may not be any URL at all."""
    if entry is None:
        return None
    schema.check_keys(entry, DEFECT_KEYS, f"{where}: defect", required=set(DEFECT_KEYS))
    if not isinstance(entry["aliases"], list):
        raise InputError(f"{where}: defect aliases must be a list of URLs")
    for url in [entry["id"], *entry["aliases"]]:
        if not isinstance(url, str) or not DEFECT_URL.fullmatch(url):
            raise InputError(f"{where}: defect {url!r} is not an https URL of an issue, advisory, PR or commit")
    repo = re.escape(upstream_repo.rstrip("/").removesuffix(".git"))
    if not re.fullmatch(repo + r"/((issues|pull)/[0-9]{1,9}|commit/[0-9a-f]{7,40}|security/advisories/GHSA(-[23456789cfghjmpqrvwx]{4}){3})",
                        entry["id"]):
        raise InputError(f"{where}: defect id {entry['id']!r} is not an issue, PR, commit or advisory of "
                         f"{upstream_repo}, the overlay's upstream")
    return {"id": entry["id"], "aliases": list(entry["aliases"])}


PORTS = "patches/ports"  # patches/ports/<id>/<sha256 of the target bytes it applies to>.patch


def _check_port(folder: Path, port: Overlay, sha: str) -> None:
    """A port must name stored stock bytes and apply exactly to them: else nothing is built with it."""
    _check_patch_names_target(port)
    stock = read_stock(folder, sha)
    if stock is None:
        raise InputError(f"overlay {port.id!r}: port {port.patch_name} names target bytes {sha} that "
                         f"{folder / STOCK} does not hold: an unknown base; add them with `invoke lock --base "
                         f"REF@DIGEST` on that base, or delete the port")
    try:
        patch_mod.apply(port.parsed(), stock)
    except patch_mod.PatchConflict as e:
        raise IntegrityError(f"overlay {port.id!r}: port {port.patch_name} does not apply exactly to the bytes "
                             f"it is named for ({e}): its name must be the sha256 of the target it was written "
                             f"against") from None


def _ports(folder: Path, overlay_id: str, where: str) -> tuple:
    """The overlay's ports: one patch per target version, named by that version's sha256."""
    ports = []
    for path in sorted((folder / PORTS / overlay_id).glob("*")):
        if is_staging(path.name):
            continue  # a rebase's write in progress, or one a kill stopped (the next write removes it)
        sha = path.name.removesuffix(".patch")
        if not path.name.endswith(".patch") or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise InputError(f"{where}: port {path} must be named <sha256 of the target it applies to>.patch")
        ports.append((sha, path, path.read_bytes()))
    return tuple(ports)


def _probe(conditions: list | None, target: str, where: str) -> tuple[dict, ...]:
    """probe: [{present|absent: REGEX | file: present|absent, path: IMAGE PATH (default: the target),
    why: THE FACT IT CHECKS}]."""
    out = []
    for i, c in enumerate(conditions or []):
        here = f"{where}: probe[{i}]"
        if not isinstance(c, dict):
            raise InputError(f"{here}: expected a mapping")
        schema.check_keys(c, PROBE_KEYS, here, required={"why"})
        kinds = [k for k in ("present", "absent", "file") if k in c]
        if len(kinds) != 1 or c.get("file", "present") not in ("present", "absent"):
            raise InputError(f"{here}: give exactly one of present: REGEX, absent: REGEX, file: present|absent")
        try:
            re.compile(c.get("present") or c.get("absent") or "")
        except re.error as e:
            raise InputError(f"{here}: not a regular expression: {e}") from None
        out.append({"path": c.get("path", target), **c})
    return tuple(out)


def probe_holds(overlay: Overlay, files: dict) -> tuple[bool, str]:
    """Does an audit record still hold on a base? files: {image path: bytes of a regular file, what
    else is there, described (str: pipeline.probe_files), or None where nothing is}."""
    failed = []
    for c in overlay.probe:
        data = files.get(c["path"])
        if isinstance(data, str):  # a link or a folder: the code may be reached through it, or lie in it
            failed.append(f"{c['path']} is {data} in this base, not a regular file or nothing, so '{c['why']}' "
                          f"cannot be checked")
            continue
        if "file" in c:
            ok = (data is not None) == (c["file"] == "present")
        elif data is None:  # a pattern cannot hold, or fail to, in a file that is not there
            failed.append(f"{c['path']} is not in this base (moved or removed?), so '{c['why']}' cannot be checked")
            continue
        else:
            found = re.search((c.get("present") or c["absent"]).encode(), data, re.M) is not None
            ok = found if "present" in c else not found
        if not ok:
            failed.append(c["why"])
    if failed:
        return False, "no longer true on this base: " + "; ".join(failed)
    return True, "; ".join(c["why"] for c in overlay.probe)


def _check_patch_names_target(overlay: Overlay) -> None:
    p = overlay.parsed()
    new_file = overlay.kind == "new-file"
    expected_old = "/dev/null" if new_file else overlay.relative
    if p.old_path != expected_old or p.new_path != overlay.relative:
        raise InputError(f"overlay {overlay.id!r}: patch {overlay.patch_name} touches "
                         f"{p.new_path if p.new_path != '/dev/null' else p.old_path}, not its target "
                         f"{overlay.relative}")


# -- the lock -------------------------------------------------------------------------------------

HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class LockEntry:
    """One required overlay, pinned: the target's stock sha256 (None: a new file), the patch's and
    the overlaid result's."""
    id: str
    target: str
    patch_sha256: str
    base_sha256: str | None
    result_sha256: str

    def to_json(self) -> dict:
        return {"id": self.id, "target": self.target, "patch_sha256": self.patch_sha256,
                "base_sha256": self.base_sha256, "result_sha256": self.result_sha256}


@dataclass(frozen=True)
class Lock:
    """overlays.lock: for one base digest, every required overlay's entry, sorted by id."""
    base: str
    overlays: tuple[LockEntry, ...]

    @classmethod
    def of(cls, base_ref: str, entries) -> Lock:
        return cls(base_ref, tuple(sorted(entries, key=lambda e: e.id)))

    def entry(self, overlay_id: str) -> LockEntry | None:
        return next((e for e in self.overlays if e.id == overlay_id), None)

    def to_json(self) -> dict:
        return {"schema": LOCK_SCHEMA, "base": self.base, "overlays": [e.to_json() for e in self.overlays]}

    @classmethod
    def from_json(cls, doc: dict, where: Path) -> Lock:
        """Checked on load: a lock someone edited into another shape is one clear error, not a KeyError."""
        def entry(e, i) -> LockEntry:
            keys = {"id", "target", "patch_sha256", "base_sha256", "result_sha256"}
            if not isinstance(e, dict) or set(e) != keys or not all(isinstance(e[k], str) for k in keys - {"base_sha256"}) \
                    or not all(HEX64.fullmatch(e[k]) for k in ("patch_sha256", "result_sha256")) \
                    or not (e["base_sha256"] is None or isinstance(e["base_sha256"], str) and HEX64.fullmatch(e["base_sha256"])):
                raise InputError(f"{where}: overlays[{i}] must be {{{', '.join(sorted(keys))}}} with sha256 hex "
                                 f"(base_sha256 null for a new file): run `invoke lock`")
            return LockEntry(e["id"], e["target"], e["patch_sha256"], e["base_sha256"], e["result_sha256"])

        if set(doc) != {"schema", "base", "overlays"} or not isinstance(doc["base"], str) \
                or not isinstance(doc["overlays"], list):
            raise InputError(f"{where}: a lock is {{schema, base, overlays: [...]}}: run `invoke lock`")
        return cls(doc["base"], tuple(entry(e, i) for i, e in enumerate(doc["overlays"])))


def write_lock(path: Path, lock: Lock) -> None:
    rewrite(path, json.dumps(lock.to_json(), indent=2, sort_keys=True).encode() + b"\n")


def read_lock(path: Path) -> Lock:
    doc = schema.load_json(path, LOCK_SCHEMA, "overlays lock", "create it from the pinned base with `invoke lock`")
    return Lock.from_json(doc, path)


@dataclass(frozen=True)
class Applied:
    """An overlay applied to the base's bytes of its target: the stock bytes and the result."""
    overlay: Overlay  # with the patch that was applied (a port, where one matched the bytes)
    base_sha256: str | None  # None for a new file
    result: bytes
    original: bytes | None = None

    @property
    def result_sha256(self) -> str:
        return hashlib.sha256(self.result).hexdigest()

    def lock_entry(self) -> LockEntry:
        patch_sha256 = hashlib.sha256(self.overlay.patch_data).hexdigest()  # a baked overlay's patch
        return LockEntry(self.overlay.id, self.overlay.target, patch_sha256, self.base_sha256, self.result_sha256)


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
        o = o.for_target(original)
        try:
            result, _ = patch_mod.apply(o.parsed(), original or b"")
        except patch_mod.PatchConflict as e:
            raise IntegrityError(f"overlay {o.id!r}: patch {o.patch_name} does not apply exactly to "
                                 f"{o.target} ({e}); run `invoke rebase --base REF@DIGEST` and refresh the patch") from None
        applied.append(Applied(o, hashlib.sha256(original).hexdigest() if original is not None else None, result,
                               original))
    return applied


def verify_against_lock(applied: list[Applied], lock: Lock, base_ref: str, lock_path: Path) -> None:
    """The build's gate: same base, same base bytes, same result, every overlay accounted for."""
    if lock.base != base_ref:
        raise IntegrityError(f"{lock_path} is for base {lock.base}, not {base_ref}: run "
                             f"`invoke rebase --base {base_ref}` to check and re-lock the overlays")
    locked = {e.id: e for e in lock.overlays}
    for a in applied:
        entry = locked.get(a.overlay.id)
        where = f"overlay {a.overlay.id!r} ({a.overlay.target})"
        if entry is None:
            raise IntegrityError(f"{where} is not in {lock_path}: run `invoke lock`")
        if entry.base_sha256 != a.base_sha256:
            raise IntegrityError(f"{where}: base file has sha256 {a.base_sha256}, lock expects "
                                 f"{entry.base_sha256}: the base changed under the overlay; run "
                                 f"`invoke rebase --base {base_ref}`")
        if entry.patch_sha256 != a.overlay.patch_sha256:
            raise IntegrityError(f"{where}: patch has sha256 {a.overlay.patch_sha256}, lock expects "
                                 f"{entry.patch_sha256}: the patch was edited; run `invoke lock`")
        if entry.result_sha256 != a.result_sha256:
            raise IntegrityError(f"{where}: result has sha256 {a.result_sha256}, lock expects "
                                 f"{entry.result_sha256}; run `invoke lock` if the change is intended")
    extra = set(locked) - {a.overlay.id for a in applied}
    if extra:
        raise IntegrityError(f"{lock_path} locks overlays that are not required: {', '.join(sorted(extra))}; "
                             f"run `invoke lock`")


# -- stock bytes ----------------------------------------------------------------------------------

STOCK = "stock"  # overlays/stock/<sha256>: the stock bytes of every target a lock or a port names


def store_stock(folder: Path, data: bytes) -> str:
    """Keep one version of a target's stock bytes, named by its sha256 (so rebase and prove need
    no old base, which upstream may have deleted)."""
    sha = hashlib.sha256(data).hexdigest()
    path = folder / STOCK / sha
    if not (path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha):
        rewrite(path, data)
    return sha


def read_stock(folder: Path, sha: str) -> bytes | None:
    """Stored stock bytes by sha256, checked against their name; None if not stored."""
    path = folder / STOCK / sha
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    found = hashlib.sha256(data).hexdigest()
    if found != sha:
        raise IntegrityError(f"{path} holds bytes with sha256 {found}: a stored file's name must be its sha256; "
                             f"restore it with `git checkout -- {path}` or re-run `invoke lock` on its base")
    return data


def check_stock(folder: Path, lock: Lock, lock_path: Path) -> None:
    """The build's check of the stored stock bytes: every file is named by its sha256, and every
    locked target's stock bytes are there."""
    for path in sorted((folder / STOCK).glob("*")):
        if not is_staging(path.name):  # a write in progress, or one a kill stopped
            read_stock(folder, path.name)
    for entry in lock.overlays:
        if entry.base_sha256 and read_stock(folder, entry.base_sha256) is None:
            raise IntegrityError(f"overlay {entry.id!r}: {lock_path} names stock bytes {entry.base_sha256} "
                                 f"that {folder / STOCK} does not hold: run `invoke lock` (or rebase) on the base")


# -- bytecode -------------------------------------------------------------------------------------

def shadow_patterns(targets: list[str]) -> list[str]:
    """For each overlaid module, what Python's import system would take before (or instead of) its
    .py, as glob patterns over the base: its cached bytecode of any tag (__pycache__/NAME.*.pyc, used
    while its recorded source size and mtime still match, a same-size edit), and an extension module
    of any ABI tag beside it (NAME.so, NAME.*.so: extensions come before source in each folder)."""
    out = []
    for target in targets:
        p = PurePosixPath(target)
        if p.suffix == ".py":
            folder = str(p.parent).lstrip("/")
            out += [f"{folder}/__pycache__/{glob.escape(p.stem)}.*.pyc", f"{folder}/{glob.escape(p.stem)}.so",
                    f"{folder}/{glob.escape(p.stem)}.*.so"]
    return sorted(set(out))


def stale_bytecode(targets: list[str], present: list[str]) -> list[str]:
    """What of `present` (paths the shadow_patterns matched) would run instead of an overlaid module:
    deleted (whited out) in the overlays' layer, so the overlay is what Python imports."""
    out = []
    for target in targets:
        p = PurePosixPath(target)
        if p.suffix != ".py":
            continue
        folder = str(p.parent).lstrip("/")
        cached, ext = f"{folder}/__pycache__/{p.stem}.", f"{folder}/{p.stem}."
        out += [f"/{q}" for q in present if (q.startswith(cached) and q.endswith(".pyc") and "/" not in q[len(cached):])
                or (q.startswith(ext) and q.endswith(".so") and "/" not in q[len(ext):])]
    return sorted(out)


def stand_in_patterns(target: str) -> list[str]:
    """Where NAME.py is not, what Python's import system would import as that module instead, as glob
    patterns over the base: an extension module of any ABI tag, or bytecode without its source
    (NAME.pyc beside it); the folder NAME is package_shadows'."""
    p = PurePosixPath(target)
    if p.suffix != ".py":
        return []
    stem = f"{str(p.parent).lstrip('/')}/{glob.escape(p.stem)}"
    return [f"{stem}.so", f"{stem}.*.so", f"{stem}.pyc"]


def package_shadows(targets: list[str]) -> list[str]:
    """For each overlaid module NAME.py (not a package's __init__), the folder NAME beside it: a
    package of the same name is what Python imports, and the overlaid file would never run."""
    return sorted({str(PurePosixPath(t).with_suffix("")).lstrip("/") for t in targets
                   if t.endswith(".py") and PurePosixPath(t).stem != "__init__"})


# -- rebase: ways to carry an overlay onto new bytes ---------------------------------------------

EXACT, OFFSET, KNOWN_PORT, MERGED = "exact", "offset", "known port", "merged"
BY_HAND = "check-by-hand"  # an audit record: no patch, so nothing to carry or prove


def merge3(ours: bytes, old: bytes, new: bytes) -> tuple[bytes, int]:
    """git merge-file: (merged bytes, number of conflicts; the bytes then carry the markers)."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="bakery-merge-") as tmp:
        paths = [Path(tmp) / n for n in ("ours", "old", "new")]
        for path, data in zip(paths, (ours, old, new), strict=True):
            path.write_bytes(data)
        done = subprocess.run(["git", "merge-file", "-p", "-L", "ours", "-L", "old base", "-L", "new base",
                               *map(str, paths)], capture_output=True)
    if done.returncode < 0 or done.returncode > 127:
        raise InputError(f"git merge-file failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout, done.returncode


def candidates(overlay: Overlay, new: bytes, old: bytes | None) -> tuple[list[tuple[str, bytes]], bytes | None]:
    """Ways to carry `overlay` onto the new target bytes, in the order rebase tries them: the main
    patch and every known port exactly, then with offsets, then a 3-way merge from the old target
    bytes. Returns the distinct results and, if the merge conflicted, its marked-up text."""
    found: list[tuple[str, bytes]] = []

    def add(how: str, result: bytes) -> None:
        if all(result != r for _, r in found):
            found.append((how, result))

    patches = [(None, overlay.patch_path, overlay.patch_data)] + list(overlay.ports)
    for allow_offset in (False, True):  # every patch exactly (a port written for these bytes fits), then moved
        for n, (_, path, data) in enumerate(patches):
            try:
                result, _ = patch_mod.apply(patch_mod.parse(data, str(path)), new, allow_offset=allow_offset)
            except patch_mod.PatchConflict:
                continue
            add(KNOWN_PORT if n else (OFFSET if allow_offset else EXACT), result)
    conflicted = None
    if old is not None:
        try:
            ours, _ = patch_mod.apply(overlay.for_target(old).parsed(), old)
        except patch_mod.PatchConflict:
            ours = None
        if ours is not None:
            merged, conflicts = merge3(ours, old, new)
            if conflicts:
                conflicted = merged
            else:
                add(MERGED, merged)
    return found, conflicted
