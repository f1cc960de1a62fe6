"""Files and folders written whole or not at all, and the one canonical JSON encoding.

Every writer in bakery goes through here: a reader (another build, a crash's next run) sees the
old bytes or the new ones, never a part. Callers keep their own error wording; the mechanics live
once.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import json
import os
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from . import crashpoint
from .errors import EnvironmentProblem, InputError, IntegrityError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _name_the_folder(e: BaseException, folder: Path) -> None:
    """A write() that runs out of space names no file: the error then names the folder whose disk
    is full, so the one line a user sees says where to free space (errors.foreign)."""
    if isinstance(e, OSError) and e.errno in DISK_FULL:
        e.filename = str(folder)


ABANDONED_AFTER = 60  # seconds unchanged and unlocked: a staging name no live writer holds
_swept: set[Path] = set()  # folders this process has cleared of abandoned staging names


def is_staging(name: str) -> bool:
    """A name atomic_file, atomic_dir or staging_dir gives what it fills (.partial-X, .NAME.partial-X):
    a writer's, live or killed, never an entry; a reader listing a folder passes over it."""
    return name.startswith(".") and ".partial-" in name


def _hold(fd: int) -> None:
    """Mark a staging file or folder as being filled: the lock goes with the process, a kill included."""
    fcntl.flock(fd, fcntl.LOCK_EX)


_held = threading.local()  # .names: the one_at_a_time locks this thread holds


@contextmanager
def one_at_a_time(lock: Path) -> Iterator[None]:
    """Held while the block runs, by one process of this machine at a time (the others wait): two
    test runs side by side start a server or build a fixture once, not twice over each other. A
    block inside another of the same lock just runs (a second flock of this process would wait on
    the first)."""
    name, names = os.path.abspath(lock), _held.__dict__.setdefault("names", set())
    if name in names:
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another thread of this process waits here as well
        names.add(name)
        try:
            yield
        finally:
            names.discard(name)


def remove_tree(path: Path | str, _retried: set[str] | None = None) -> None:
    """rmtree that also goes through folders left without our write or read permission: a compile
    may chmod 0500 what it made, and for any user but root that stops a plain rmtree (tempfile's
    TemporaryDirectory makes each such folder 0700 and tries again: so does this). Only for a tree
    no live process writes in; links are removed, never followed; nothing here fails."""
    retried = set() if _retried is None else _retried

    def again(func, name: str, exc_info) -> None:
        if not issubclass(exc_info[0], PermissionError) or name in retried:
            return
        retried.add(name)
        try:
            for folder in ([os.path.dirname(name)] if name != str(path) else []) + [name]:
                if stat.S_ISDIR(os.lstat(folder).st_mode):
                    os.chmod(folder, 0o700)
            if stat.S_ISDIR(os.lstat(name).st_mode):
                remove_tree(name, retried)
            else:
                os.unlink(name)
        except OSError:
            pass

    shutil.rmtree(path, onerror=again)


def remove_abandoned(folder: Path, pattern: str, now: float) -> None:
    """Staging names a killed writer left in folder (a toolchain's folder is gigabytes): removed when
    no process holds them and they have not changed for a minute (a writer that has just made its
    name has not locked it yet). `now` is on the file system's clock: the mtime of the caller's own
    staging name, just made (a process clock a year ahead, as under faketime, would take a name made a
    moment ago for one a year old). Removed under the lock, so two cleaners never race; anything else
    (a link, a FIFO, one another user keeps) is left alone, and never fails the write that looked."""
    for name in glob.glob(glob.escape(str(folder)) + "/" + pattern):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            found = os.fstat(fd)
            if not (stat.S_ISREG(found.st_mode) or stat.S_ISDIR(found.st_mode)) or \
                    now - found.st_mtime < ABANDONED_AFTER:
                continue
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: being filled now
            if os.stat(name, follow_symlinks=False).st_ino != found.st_ino:
                continue  # another cleaner took it, and a writer has made a new one since
            if stat.S_ISDIR(found.st_mode):
                remove_tree(name)
            else:
                os.unlink(name)
        except OSError:
            continue
        finally:
            os.close(fd)


@contextmanager
def staging_dir(dest: Path) -> Iterator[Path]:
    """A new sibling folder of dest to fill, locked while this process lives (so the next writer's
    remove_abandoned leaves it be), after clearing what killed writers left there."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.partial-"))
        held = os.open(staging, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as e:
        _name_the_folder(e, dest.parent)
        raise
    try:
        _hold(held)
        remove_abandoned(dest.parent, f".{glob.escape(dest.name)}.partial-*", os.fstat(held).st_mtime)
        yield staging
    finally:
        os.close(held)


@contextmanager
def atomic_file(path: Path, *, durable: bool = False) -> Iterator[BinaryIO]:
    """A temporary file beside path to write into; on a clean exit it replaces path, on any
    exception (an interrupt included) it is removed. durable: fsync before the rename."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
    except OSError as e:
        _name_the_folder(e, path.parent)
        raise
    try:
        _hold(fd)
        if path.parent not in _swept:
            _swept.add(path.parent)
            remove_abandoned(path.parent, ".partial-*", os.fstat(fd).st_mtime)
        with os.fdopen(fd, "wb") as out:
            yield out
            if durable:
                out.flush()
                os.fsync(out.fileno())
        crashpoint.reached(f"write {path}")
        os.replace(tmp, path)
        crashpoint.reached(f"wrote {path}")
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        _name_the_folder(e, path.parent)
        raise


def atomic_write(path: Path, data: bytes, *, durable: bool = False) -> None:
    with atomic_file(path, durable=durable) as out:
        out.write(data)


def rewrite(path: Path, data: bytes) -> None:
    """A file of the user's checkout replaced whole (a kill leaves the old bytes or the new), its
    permission bits kept (never setuid, setgid or sticky); a new one, or one that was a symbolic link
    (replaced by the file, its target's mode not taken), gets 0666 less the umask, as an editor's
    would (atomic_file's own is 0600)."""
    try:
        info = path.lstat()
        mode = stat.S_IMODE(info.st_mode) & 0o777 if stat.S_ISREG(info.st_mode) else 0o666 & ~_umask()
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    with atomic_file(path, durable=True) as out:
        out.write(data)
        os.fchmod(out.fileno(), mode)


def _umask() -> int:
    """The process's umask, read without setting it (setting it, even back, races other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    umask = os.umask(0o022)  # no /proc: the only other way
    os.umask(umask)
    return umask


@contextmanager
def atomic_dir(dest: Path, *, keep: Callable[[Path], bool] | None = None) -> Iterator[Path]:
    """A sibling folder to fill; on a clean exit it takes dest's place, on any exception it is
    removed and dest is left as it was. An old dest is renamed aside before the new one takes its
    name and removed after, so a kill leaves the old folder or the new one (or, between the two
    renames, none), never a half-deleted one under dest's name. keep(dest): a dest another writer
    finished meanwhile that is good as it is stays, and this one is dropped (first one wins: a
    reader of the first never sees it vanish)."""
    with staging_dir(dest) as staging:
        aside = None
        try:
            yield staging
            if keep is not None and dest.is_dir() and keep(dest):
                shutil.rmtree(staging, ignore_errors=True)
                return
            if os.path.lexists(dest):
                aside = dest.parent / f".{dest.name}.partial-old-{secrets.token_hex(6)}"
                os.rename(dest, aside)  # under a staging name: a kill now leaves it to the next writer
            crashpoint.reached(f"fill {dest}")
            try:
                os.replace(staging, dest)
            except OSError as e:  # another writer's took the name since: good as it is, it stays
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST) or keep is None or not keep(dest):
                    raise
                shutil.rmtree(staging, ignore_errors=True)
            crashpoint.reached(f"filled {dest}")
        except BaseException as e:
            remove_tree(staging)  # a failed compile's /out may hold folders it made 0500: not a plain rmtree's to take
            if aside is not None and not os.path.lexists(dest):
                with suppress(OSError):  # the new one did not take the name: the old one keeps it
                    os.rename(aside, dest)
                    aside = None
            _name_the_folder(e, dest.parent)
            raise
        finally:
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)


def one_each(pairs: list) -> dict:
    """A JSON object whose keys are one each, ignoring case (json.loads's object_pairs_hook): Go's
    decoder matches keys without case and keeps the last, Python's keeps the exact one, so an object
    with a key twice would be one document to a Go reader (cosign, skopeo) and another to us."""
    if _twice(pairs):
        raise ValueError(f"a key appears twice, or twice in different cases: {sorted(k for k, _ in pairs)[:8]}")
    return dict(pairs)


def _twice(pairs: list) -> bool:
    return len({go_fold(k) for k, _ in pairs}) != len(pairs)


def go_fold(key: str) -> str:
    """A key as Go's encoding/json matches it against a struct field's name: without case, each
    character by its simple fold (so U+017F LONG S is s, U+212A KELVIN SIGN is k; but ß is not ss,
    nor the ligature \ufb06 st: Go keeps those apart, and so does this)."""
    if key.isascii():  # nearly every key: ASCII's simple fold is its lower case
        return key.lower()

    def one(c: str) -> str:
        folded = c.casefold()
        if len(folded) == 1:
            return folded
        lower = c.lower()
        return lower if len(lower) == 1 else c

    return "".join(one(c) for c in key)


def no_constant(name: str):
    """json.loads's parse_constant: NaN and Infinity, which Python reads and Go's decoder refuses."""
    raise ValueError(f"{name} is no JSON number")


def finite_float(text: str) -> float:
    """json.loads's parse_float: a number past float64 (1e400), which Python reads as infinity and
    Go's decoder refuses."""
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is past a float64")
    return value


class Fields(dict):
    """A JSON object (json.loads's object_pairs_hook: Fields.of) that remembers whether a key came
    twice, or twice in different cases: for a document where only some objects are Go structs
    (one_each's rule) and others Go maps, whose keys are exact."""
    twice = False

    @classmethod
    def of(cls, pairs: list) -> Fields:
        found = cls(pairs)
        found.twice = _twice(pairs)
        return found


def go_struct(value, what: str, fields: frozenset[str] = frozenset()):
    """value, where it is an object a Go reader decodes into a struct with these fields: refused
    (ValueError) where a key is in it twice, or twice in different cases (parsed with Fields.of), or
    where a key Go would take for one of the fields is not spelled as the field (Go reads
    "Platform" or "ſize" as platform or size; Python reads neither). Other keys both ignore."""
    if isinstance(value, Fields) and value.twice:
        raise ValueError(f"{what} holds a key twice, or twice in different cases: {sorted(value)[:8]}")
    if isinstance(value, dict) and fields:
        named = {go_fold(f): f for f in fields}
        odd = sorted(k for k in value if k not in fields and go_fold(k) in named)
        if odd:
            raise ValueError(f"{what} spells {odd[0]!r} for its field {named[go_fold(odd[0])]!r} (Go reads them as "
                             f"one; Python does not)")
    return value


def go_document(body: bytes, what: str, fields: frozenset[str]):
    """A JSON document a Go reader decodes into a struct with these fields (a manifest, an index, a
    config), read as Go reads it or refused (ValueError): strict UTF-8 (json.loads would guess UTF-16
    or skip a BOM, which Go refuses), no NaN, Infinity or number past a float64, and go_struct's rule
    for its own keys."""
    return go_struct(json.loads(body.decode("utf-8"), object_pairs_hook=Fields.of, parse_constant=no_constant,
                                parse_float=finite_float), what, fields)


def canonical_json(value, what: str = "a document") -> bytes:
    """Sorted keys, no spaces, UTF-8 as is (as Go's encoder writes it): the bytes that are hashed or
    signed. One encoder, so two callers never disagree on the same value, non-ASCII included. JSON
    can spell a surrogate (\\udc80), which has no UTF-8: such a value is refused, not crashed on."""
    try:  # NaN and Infinity are no JSON: Go's decoder refuses them
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except ValueError as e:
        raise IntegrityError(f"{what} holds a number JSON has no spelling for ({e})") from None
    try:
        return text.encode()
    except UnicodeEncodeError as e:
        raise IntegrityError(f"{what} holds {text[e.start:e.end].encode('unicode_escape').decode()}, surrogate "
                             f"code points: not Unicode text, so no UTF-8 bytes to hash or sign") from None


def write_tree(dest: Path, files: dict[str, bytes]) -> None:
    """All the files or none: written in a sibling folder, which then becomes dest (new or empty)."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise InputError(f"{dest} exists and is not an empty directory: give a new or empty one")
    try:
        with atomic_dir(dest) as staging:
            for name, data in files.items():
                (staging / name).parent.mkdir(parents=True, exist_ok=True)
                (staging / name).write_bytes(data)
                (staging / name).chmod(0o644)
            staging.chmod(0o755)
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {dest}: {e.strerror}") from None
