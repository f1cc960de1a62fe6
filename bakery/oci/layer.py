"""Deterministic layers: same files in, same bytes out, whatever the host, clock or umask."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import sys
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..errors import EnvironmentProblem, InputError
from ..files import atomic_write
from .refs import Descriptor, Digest

OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
GZIP_LEVEL = 9


@dataclass(frozen=True)
class FileEntry:
    """One file to add: absolute path in the image, bytes, and whether it is executable."""

    path: str
    data: bytes
    executable: bool = False

    def __post_init__(self):
        p = PurePosixPath(self.path)
        if not p.is_absolute() or ".." in p.parts or str(p) != self.path:
            raise InputError(f"image path {self.path!r} must be absolute and normalized, without '..'")

    @property
    def mode(self) -> int:
        return 0o755 if self.executable else 0o644

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


@dataclass(frozen=True)
class Layer:
    """A written layer blob and what the image config and record need to know about it."""

    descriptor: Descriptor
    diff_id: Digest
    path: Path
    comment: str
    files: tuple[FileEntry, ...]
    deletions: tuple[str, ...] = ()


def _info(name: str, epoch: int, mode: int, kind=tarfile.REGTYPE, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def whiteout_name(path: str) -> str:
    """The OCI whiteout entry that deletes `path` from lower layers."""
    p = PurePosixPath(path)
    return str(p.parent / f".wh.{p.name}")[1:]


def tar_bytes(files: tuple[FileEntry, ...], epoch: int, deletions: tuple[str, ...] = ()) -> bytes:
    """An uncompressed tar: parents first, sorted, fixed owner/mode/mtime, no PAX records.

    `deletions` are absolute paths removed from lower layers (as OCI whiteouts)."""
    paths = sorted(f.path for f in files)
    if len(set(paths)) != len(paths):
        raise InputError(f"two files claim the same image path: {sorted({p for p in paths if paths.count(p) > 1})}")
    every = [f.path for f in files] + list(deletions)
    dirs = sorted({str(parent)[1:] for path in every for parent in PurePosixPath(path).parents if str(parent) != "/"})
    by_path = {f.path[1:]: f for f in files}
    by_path.update({whiteout_name(d): FileEntry("/" + whiteout_name(d), b"") for d in deletions})
    buf = io.BytesIO()
    # GNU format: long names without PAX headers (which would carry host timestamps).
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name in sorted(set(dirs) | set(by_path)):
            if name in by_path:
                f = by_path[name]
                tar.addfile(_info(name, epoch, f.mode, size=len(f.data)), io.BytesIO(f.data))
            else:
                tar.addfile(_info(name + "/", epoch, 0o755, tarfile.DIRTYPE))
    return buf.getvalue()


def gzip_bytes(data: bytes) -> bytes:
    """gzip with a fixed header: no file name, mtime 0, fixed level."""
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, compresslevel=GZIP_LEVEL, mtime=0) as gz:
        gz.write(data)
    return out.getvalue()


def gzip_kept(raw: bytes, diff_id: Digest, kept: Path | None) -> bytes:
    """gzip_bytes(raw), or the stream kept under `kept` for this tar (by its diff_id, this zlib and
    the level): compressing at level 9 is most of a warm build's layer writing. A kept stream is
    used only if it carries our fixed header and inflates to exactly `raw`, whole; else it is
    dropped with a warning and made again."""
    if kept is None:
        return gzip_bytes(raw)
    path = kept / f"zlib-{zlib.ZLIB_RUNTIME_VERSION}-{GZIP_LEVEL}" / f"{diff_id.hex}.gz"
    stream = _read_kept(path, len(raw) + len(raw) // 100 + 1024)  # deflate never grows a tar by more
    if stream is not None:
        if _inflates_to(stream, raw):
            return stream
        print(f"warning: dropped a gzip cache entry {diff_id.hex[:12]} that does not inflate to its tar; "
              f"compressing again", file=sys.stderr)
    blob = gzip_bytes(raw)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, blob)
    except OSError as e:
        print(f"warning: could not keep a compressed layer in {path.parent}: {e.strerror}", file=sys.stderr)
    return blob


def _read_kept(path: Path, limit: int) -> bytes | None:
    """A kept stream's bytes: None when absent; one that is not a regular file of at most `limit`
    bytes, or cannot be read, is one warning and None (a FIFO does not block the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as e:
        print(f"warning: ignored the gzip cache entry {path.name[:12]} ({e.strerror}); compressing again",
              file=sys.stderr)
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            print(f"warning: ignored the gzip cache entry {path.name[:12]} (not a regular file of at most {limit} "
                  f"bytes); compressing again", file=sys.stderr)
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(limit + 1)
    except OSError as e:
        print(f"warning: ignored the gzip cache entry {path.name[:12]} ({e.strerror}); compressing again",
              file=sys.stderr)
        return None
    finally:
        os.close(fd)


def _inflates_to(stream: bytes, raw: bytes) -> bool:
    if stream[:10] != gzip_bytes(b"")[:10]:  # a header of its own would change the digest
        return False
    inflate = zlib.decompressobj(wbits=31)
    try:
        out = inflate.decompress(stream, len(raw) + 1)  # never more than the tar (a bomb stops here)
    except zlib.error:
        return False
    return out == raw and inflate.eof and not inflate.unused_data and not inflate.unconsumed_tail


def write_layer(files: tuple[FileEntry, ...], epoch: int, blobs: Path, comment: str,
                deletions: tuple[str, ...] = (), kept: Path | None = None) -> Layer:
    """Build a layer and store it as blobs/sha256/<hex>; a failed write leaves nothing behind.
    With `kept` (a cache folder), a stream compressed before for the same tar is reused."""
    raw = tar_bytes(files, epoch, deletions)
    diff_id = Digest.of(raw)
    blob = gzip_kept(raw, diff_id, kept)
    desc = Descriptor.of(OCI_LAYER_GZIP, blob)
    path = blobs / "sha256" / desc.digest.hex
    write_blob(path, blob)
    return Layer(desc, diff_id, path, comment, tuple(sorted(files, key=lambda f: f.path)),
                 tuple(sorted(deletions)))


def write_blob(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same directory, then rename."""
    if path.name == hashlib.sha256(data).hexdigest() and path.exists():
        return  # content-addressed and already there
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EnvironmentProblem(f"cannot write under {path.parent}: {e.strerror}") from None
    try:
        atomic_write(path, data, durable=True)
    except OSError as e:
        hint = "the disk is full: free space or choose another --out/--layout" if e.errno == 28 else e.strerror
        raise EnvironmentProblem(f"writing {path.name[:12]} to {path.parent}: {hint}; nothing was kept") from None
