"""What a compile of hip/ made: taken from the sandbox's /out as hostile (exactly the expected names,
regular files, no link followed), and the cache entry they fill (done.json and the outputs it
records by sha256), checked before it is used and before another writer's is kept."""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

from ..errors import IntegrityError
from .hip import Recipe

OUTPUT_LIMIT = 1 << 30  # a compiled extension is tens of MiB


def expected_outputs(recipe: Recipe) -> set[str]:
    return {"toolchain.txt"} | {f"{e.name}{suffix}" for e in recipe.extensions for suffix in (".so", ".schema")}


def take_outputs(folder: Path, expected: set[str], into: Path) -> dict[str, str]:
    """{name: sha256} of what the compile left in /out, copied into `into` (ours: as root, /out was
    the sandbox uid's, which another process of that uid could change later). The compile runs the
    base's code, so what it leaves is read as hostile: exactly the expected names, each a regular
    file (a symbolic link would make us read, hash and push a file of the host's), opened without
    following links."""
    import os
    import stat

    os.chmod(folder, 0o700)  # whatever the container made of its /out's mode
    found = {e.name: e for e in os.scandir(folder)}
    unexpected, missing = sorted(set(found) - expected), sorted(expected - set(found))
    if unexpected or missing:
        left = ", ".join(repr(n)[:80] for n in unexpected[:5]) or "nothing unexpected"
        raise IntegrityError(f"the compile left {left} and lacks {', '.join(missing) or 'nothing'} in /out: "
                             f"refused (the toolchain image is broken or hostile)")
    outputs = {}
    for name in sorted(found):
        info = found[name].stat(follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode) or info.st_size > OUTPUT_LIMIT:
            raise IntegrityError(f"compile output {name} is not a regular file of at most {OUTPUT_LIMIT} bytes (a "
                                 f"symbolic link, FIFO, device, folder or a giant): refused, nothing of it read "
                                 f"(the toolchain image is hostile)")
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f, open(into / name, "wb") as copy:
            h = hashlib.sha256()
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                copy.write(chunk)
            outputs[name] = h.hexdigest()
    return outputs


def outputs_whole(out: Path) -> str | None:
    """Pure check of a cached compile: None when it is done and every output is still the bytes
    recorded when it was made; else why not ("absent" when there is none)."""
    try:
        recorded = json.loads((out / "done.json").read_text())["sha256"]
        if all(hashlib.sha256((out / name).read_bytes()).hexdigest() == sha for name, sha in recorded.items()):
            return None
        return "an output does not match its recorded sha256"
    except FileNotFoundError:
        return "absent" if not out.exists() else "it is incomplete"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"its record is unreadable ({e})"


def outputs_ok(out: Path) -> bool:
    """A cached compile, whole (outputs_whole). A poisoned one is deleted with one warning, so it is
    compiled again."""
    why = outputs_whole(out)
    if why in (None, "absent"):
        return why is None
    print(f"warning: dropped a corrupt compile cache entry {out.name} ({why}); compiling again", file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)
    return False


def recorded_outputs(out: Path) -> dict[str, str]:
    """{name: sha256} the entry's done.json records: what a cached entry, checked whole a moment
    before, vouches for."""
    try:
        recorded = json.loads((out / "done.json").read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise IntegrityError(f"the compile cache entry {out} went or changed while this run read it ({e}); "
                             f"another run replaced it: run again") from None
    return {str(k): str(v) for k, v in recorded.items()}


def read_accepted(out: Path, name: str, accepted: dict[str, str]) -> bytes:
    """One output's bytes, read once, and only when they are the ones `accepted` names: another run
    may have put a whole entry of other bytes under the name since this one chose its own (a
    fetched artifact's, or its compile's), and the record would name its origin for those."""
    changed = f"the compile cache entry {out} changed while this run read it"
    try:
        data = (out / name).read_bytes()
    except OSError as e:
        raise IntegrityError(f"{changed} ({name}: {e.strerror or e}); another run replaced it: run again") from None
    if hashlib.sha256(data).hexdigest() != accepted.get(name):
        raise IntegrityError(f"{changed} ({name} holds other bytes than it chose); another run replaced it: run again")
    return data


def same_outputs(sha256: dict):
    """atomic_dir's keep: another writer's entry stays when it is whole and holds the very bytes this
    one does (what this writer records as its origin, compiled or fetched, stays true); any other is
    replaced (never deleted here: a reader of it may be a moment behind its writer)."""
    def keep(out: Path) -> bool:
        try:
            return outputs_whole(out) is None and json.loads((out / "done.json").read_text())["sha256"] == sha256
        except (OSError, ValueError, KeyError):
            return False
    return keep
