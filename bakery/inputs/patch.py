"""Unified diffs, applied exactly: every hunk at its stated line, every context line equal.

Pure functions over bytes. `locate` also finds where a hunk would fit elsewhere, which is what
`invoke rebase` tries as a candidate (then proves); a build never accepts an offset.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from ..errors import InputError

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True)
class Hunk:
    """One hunk of a unified diff: where it starts, the lines it replaces and their replacement."""
    old_start: int  # 1-based; 0 for a hunk that adds to an empty file
    old: tuple[bytes, ...]  # lines with their line endings
    new: tuple[bytes, ...]


@dataclass(frozen=True)
class Patch:
    """A single-file unified diff, parsed."""
    old_path: str  # as in the header, without a/ (or "/dev/null")
    new_path: str
    hunks: tuple[Hunk, ...]


class PatchConflict(Exception):
    """A hunk does not apply exactly; carries where it would fit, if anywhere."""

    def __init__(self, hunk_number: int, offset: int | None, places: int = 1):
        super().__init__(f"hunk {hunk_number} does not apply" +
                         (f" at its line (fits {offset:+d} lines away)" if offset is not None and places == 1 else
                          f" at its line, and fits {places} places elsewhere: which one is meant is a person's "
                          f"call" if places > 1 else ""))
        self.hunk_number, self.offset, self.places = hunk_number, offset, places


def _strip_prefix(path: bytes) -> str:
    text = path.split(b"\t")[0].decode("utf-8").strip()
    return text[2:] if text.startswith(("a/", "b/")) else text


@functools.lru_cache(maxsize=64)
def parse(data: bytes, where: str) -> Patch:
    """Parse a single-file unified diff; refuse binary patches, CRLF and multi-file diffs. Kept by
    its arguments (a Patch is immutable): a build reads each overlay's patch in four checks."""
    if b"\r" in data:
        raise InputError(f"{where}: has CRLF line endings; convert it with `dos2unix` "
                         f"(and set `git config core.autocrlf input`)")
    if b"GIT binary patch" in data or re.search(rb"^Binary files .* differ$", data, re.M):
        raise InputError(f"{where}: is a binary patch; overlays must be text diffs")
    lines = data.splitlines(keepends=True)
    headers = [i for i, line in enumerate(lines) if line.startswith(b"--- ") and i + 1 < len(lines)
               and lines[i + 1].startswith(b"+++ ")]
    if not headers:
        raise InputError(f"{where}: no unified diff header (--- / +++) found")
    if len(headers) > 1:
        raise InputError(f"{where}: touches more than one file; one patch file per overlay target")
    i = headers[0]
    old_path, new_path = _strip_prefix(lines[i][4:]), _strip_prefix(lines[i + 1][4:])
    hunks, i = [], i + 2
    while i < len(lines):
        m = _HUNK.match(lines[i])
        if not m:
            raise InputError(f"{where}: line {i + 1}: expected a hunk header '@@ -a,b +c,d @@'")
        old_count = int(m.group(2)) if m.group(2) is not None else 1
        new_count = int(m.group(4)) if m.group(4) is not None else 1
        old: list[bytes]
        new: list[bytes]
        old, new, i = [], [], i + 1
        while i < len(lines) and (len(old) < old_count or len(new) < new_count):
            line = lines[i]
            tag, body = line[:1], line[1:]
            if tag == b" ":
                old.append(body)
                new.append(body)
            elif tag == b"-":
                old.append(body)
            elif tag == b"+":
                new.append(body)
            elif line == b"\n":  # an editor stripped the space of an empty context line
                old.append(b"\n")
                new.append(b"\n")
            else:
                raise InputError(f"{where}: line {i + 1}: unexpected {line[:20]!r} inside a hunk")
            i += 1
            if i < len(lines) and lines[i].startswith(b"\\ No newline at end of file"):
                target = new if tag == b"+" else old if tag == b"-" else None
                for side in ([target] if target is not None else [old, new]):
                    side[-1] = side[-1].rstrip(b"\n")
                i += 1
        if len(old) != old_count or len(new) != new_count:
            raise InputError(f"{where}: hunk at line {int(m.group(1))} is truncated")
        hunks.append(Hunk(int(m.group(1)), tuple(old), tuple(new)))
    if not hunks:
        raise InputError(f"{where}: contains no hunks")
    return Patch(old_path, new_path, tuple(hunks))


def _matches(lines: list[bytes], at: int, old: tuple[bytes, ...]) -> bool:
    return at >= 0 and tuple(lines[at:at + len(old)]) == old


def _fits_elsewhere(lines: list[bytes], at: int, old: tuple[bytes, ...], cursor: int) -> list[int]:
    """Every place after the previous hunk where the hunk's old lines match, as offsets from `at`,
    nearest first."""
    hits = [p for p in range(cursor, len(lines) - len(old) + 1) if _matches(lines, p, old)] if old else []
    return sorted((p - at for p in hits), key=abs)


def apply(patch: Patch, original: bytes, allow_offset: bool = False) -> tuple[bytes, int]:
    """Apply hunks in order; return (result, largest |offset| used). Raises PatchConflict. An
    offset is taken only where the hunk fits one place: two would make the nearest a guess."""
    lines = original.splitlines(keepends=True)
    out, cursor, worst = [], 0, 0
    for n, hunk in enumerate(patch.hunks, 1):
        at = (hunk.old_start - 1 if hunk.old_start > 0 else 0) if hunk.old else hunk.old_start
        if not _matches(lines, at, hunk.old):
            offsets = _fits_elsewhere(lines, at, hunk.old, cursor)
            if len(offsets) != 1 or not allow_offset:
                raise PatchConflict(n, offsets[0] if offsets else None, len(offsets))
            at += offsets[0]
            worst = max(worst, abs(offsets[0]))
        out.extend(lines[cursor:at])
        out.extend(hunk.new)
        cursor = at + len(hunk.old)
    out.extend(lines[cursor:])
    return b"".join(out), worst


def unified_diff(old: bytes, new: bytes, path: str) -> bytes:
    """A unified diff with 3 lines of context, as `diff -u` writes it (rebase writes ported patches with it)."""
    import difflib

    a = [line.decode("utf-8") for line in old.splitlines(keepends=True)]
    b = [line.decode("utf-8") for line in new.splitlines(keepends=True)]
    text = "".join(difflib.unified_diff(a, b, f"a/{path}", f"b/{path}", n=3))
    return text.encode("utf-8")
