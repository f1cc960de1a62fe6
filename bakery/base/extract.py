"""A toolchain's files as a folder: what the compile of hip/ runs in, made from an image's layers.

The toolchain is an image (the ROCm base itself, in production): its layers are streamed once,
read as the engines unpack them (scan.py, and the filesystem's check across layers), and the
files a compile can need are written into a folder, layer by layer as an engine would apply them
(whiteouts and opaque folders first, then the layer's entries, parents before children). What a
compile never reads is left out by the recipe's `exclude` patterns (a ROCm install's kernel
libraries and tuning databases are most of its bytes). No Docker engine, no pull, no unpacked copy
of what is left out: the folder is all the disk it takes.

Every file is written below an open folder, never through a path: a link in the image is made as a
link and never followed while the folder is made. Modes are made plain (folders 0755, files 0644
or 0755, no set-id bit): the compile runs as another uid and only reads them.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, overload

from ..errors import EnvironmentProblem, IntegrityError
from ..files import staging_dir
from .filesystem import BaseFilesystem

MOUNT_POINTS = ("tmp", "proc", "dev", "src", "out")  # where the sandbox binds: plain empty folders
RESERVE = 1 << 30  # what the folder's filesystem keeps free while it is written
SCHEMA = 1  # bump when how a folder is made changes: older folders are then made again


@dataclass(frozen=True)
class Selection:
    """Which of an image's paths the compile may read: all but those under an `exclude` pattern
    (a shell pattern matching the path itself or a folder above it)."""
    exclude: tuple[str, ...] = ()

    def key(self) -> str:
        return hashlib.sha256(json.dumps([SCHEMA, sorted(self.exclude)]).encode()).hexdigest()

    def matcher(self) -> Callable[[str], bool]:
        """path -> is it taken (compiled once)."""
        if not self.exclude:
            return lambda path: True
        left_out = re.compile("|".join(f"(?:{fnmatch.translate(p)[:-2]})" for p in self.exclude) + r"(?:/|\Z)")
        return lambda path: left_out.match(path) is None


class Sink:
    """What a layer's pass hands the toolchain's regular files to: each is written once, under its
    sha256 and whether it is executable, in `blobs`, while the filesystem keeps RESERVE free. It
    travels to the worker processes that stream the layers."""

    def __init__(self, selection: Selection, blobs: Path):
        self.selection, self.blobs = selection, blobs
        self._wants: Callable[[str], bool] | None = None

    def __getstate__(self):
        return {"selection": self.selection, "blobs": self.blobs, "_wants": None}

    def wants(self, path: str) -> bool:
        if self._wants is None:
            self._wants = self.selection.matcher()
        return self._wants(path)

    def store(self, chunks, size: int, mode: int) -> str:
        keep_free(self.blobs.parent, size)
        h = hashlib.sha256()
        fd, tmp = tempfile.mkstemp(dir=self.blobs, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    h.update(chunk)
                    f.write(chunk)
            name = f"{h.hexdigest()}.{'x' if mode & 0o111 else 'r'}"
            os.chmod(tmp, 0o755 if mode & 0o111 else 0o644)
            os.replace(tmp, self.blobs / name)
        except OSError as e:
            os.unlink(tmp) if os.path.exists(tmp) else None
            raise EnvironmentProblem(f"cannot write the toolchain's files in {_lasting(self.blobs.parent)}: "
                                     f"{e.strerror}; free space, or set BAKERY_CACHE to a larger disk") from None
        return name


def keep_free(folder: Path, size: int = 0) -> None:
    """EnvironmentProblem naming the cache unless `size` more bytes fit under `folder` with RESERVE
    left free."""
    free = shutil.disk_usage(folder).free
    if free - size < RESERVE:
        raise EnvironmentProblem(f"the toolchain's files do not fit in {_lasting(folder)}: "
                                 f"{free / 2**30:.1f} GiB free, and {RESERVE / 2**30:.0f} GiB must stay free; "
                                 f"free space, or set BAKERY_CACHE to a larger disk")


@dataclass(frozen=True)
class Root:
    """A toolchain's files as a folder, and the environment its image sets (PATH and the rest)."""
    path: Path
    env: dict
    files: int
    size: int


ENV_LIMIT = 256 << 10  # an image's Env is a few variables


def image_env(config: dict) -> dict:
    """The Env of an image config as the engine starts a container with it (PATH defaulted); one
    that no process could be given (an odd name, a NUL, past ENV_LIMIT) refuses the image."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    given = config.get("config") if isinstance(config, dict) else None
    items = given.get("Env") if isinstance(given, dict) else None
    if not isinstance(items, list) or sum(len(str(i)) for i in items) > ENV_LIMIT:
        if items in (None, []):
            return env
        raise IntegrityError(f"the toolchain image's Env is not a list of at most {ENV_LIMIT} bytes: refused")
    for item in items:
        name, sep, value = str(item).partition("=")
        if not isinstance(item, str) or not sep or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or "\0" in value:
            raise IntegrityError(f"the toolchain image's Env holds {str(item)[:60]!r}, not NAME=VALUE: refused")
        env[name] = value
    return env


def toolchain_root(fs: BaseFilesystem, selection: Selection, cache: Path, log=print) -> Root:
    """The image's files the selection takes, as a folder under `cache`: made once per image and
    selection (its layers streamed once, through the layer cache), then reused."""
    dest = cache / _folder_name(fs, selection)
    made = _made(dest)
    if made is not None:
        return Root(dest / "root", image_env(fs.image.config), made["files"], made["size"])
    cache.mkdir(parents=True, exist_ok=True)
    keep_free(cache)  # refused before a gigabyte of layers is streamed, not at the first file
    shutil.rmtree(dest, ignore_errors=True)  # made by another version of bakery, or not whole: made again
    size = sum(d.size for d in fs.image.layers)
    log(f"taking the toolchain's files out of {fs.image.ref} ({len(fs.image.layers)} layers, "
        f"{size / 2**30:.2f} GiB compressed) into {dest}")
    with staging_dir(dest) as tmp:  # locked while filled: a killed extraction's is cleared by the next
        _fill(fs, selection, dest, tmp)
    made = _made(dest) or {}  # ours, or the one another command renamed into place first
    log(f"toolchain's files: {made.get('files')} files, {made.get('size', 0) / 2**30:.2f} GiB")
    return Root(dest / "root", image_env(fs.image.config), made.get("files", 0), made.get("size", 0))


def _fill(fs: BaseFilesystem, selection: Selection, dest: Path, tmp: Path) -> None:
    try:
        blobs = tmp / "blobs"
        blobs.mkdir()
        taken = fs.prefetch(Sink(selection, blobs))
        assert taken is not None  # with a sink, prefetch says what it took from each layer
        fs.check_layers()
        fs.check_merge()
        files, total = apply_layers([fs._index(d, set()) for d in fs.image.layers], taken, selection, tmp / "root",
                                    blobs)
        shutil.rmtree(blobs)  # each file lives on under its name in the root (a hard link)
        (tmp / "toolchain.json").write_text(json.dumps({"schema": SCHEMA, "image": str(fs.image.manifest_digest),
                                                        "exclude": list(selection.exclude), "files": files,
                                                        "size": total}))
        try:
            os.rename(tmp, dest)  # whole, or not there: a folder in its place was made whole by another command
        except OSError:
            if _made(dest) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _made(dest: Path) -> dict | None:
    """A folder made before: its record is whole and of this schema (the folder is renamed into
    place only once made, so a record means a whole folder)."""
    try:
        made = json.loads((dest / "toolchain.json").read_text())
        return made if made.get("schema") == SCHEMA and (dest / "root").is_dir() else None
    except (OSError, ValueError, AttributeError):
        return None


EXPANSION = 3  # unpacked bytes per compressed byte, where no layer index says (ROCm's gzip layers: about 1:3)


def space_needed(fs: BaseFilesystem, selection: Selection, cache: Path) -> tuple[int, str]:
    """(bytes the toolchain's files take once out of the layers, and how that is known): 0 where
    they are out already; the selection's own size where every layer's index is cached; else an
    estimate from the compressed size (what the layers hold is known only once they are read)."""
    if _made(cache / _folder_name(fs, selection)) is not None:
        return 0, "already taken out"
    exact = selected_size(fs, selection)
    if exact is not None:
        return exact, "exact, from the layers' indexes"
    compressed = sum(d.size for d in fs.image.layers)
    return compressed * EXPANSION, (f"an estimate, {EXPANSION}x its {compressed / 2**30:.1f} GiB compressed; "
                                    f"the writing stops before the disk is full")


def check_space(needed: int, where: Path, how: str) -> int:
    """The bytes free at `where` (or the folder above it that exists); EnvironmentProblem with the
    numbers unless `needed` fits with RESERVE left."""
    probe = where
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free - needed < RESERVE:
        raise EnvironmentProblem(f"the toolchain's files take {needed / 2**30:.1f} GiB ({how}) at {where}, which has "
                                 f"{free / 2**30:.1f} GiB free ({RESERVE / 2**30:.0f} GiB must stay free): free space, "
                                 f"or set BAKERY_CACHE to a larger disk (a hosted runner's /mnt)")
    return free


def _folder_name(fs: BaseFilesystem, selection: Selection) -> str:
    return f"{fs.image.manifest_digest.hex[:32]}-{selection.key()[:16]}"


def selected_size(fs: BaseFilesystem, selection: Selection) -> int | None:
    """Bytes of the regular files the selection takes, from the layers' cached indexes (each
    layer's files as the layers above leave them; a hard link takes none, and the same bytes twice
    are counted twice, so the folder takes at most this); None while a layer has no index yet."""
    if not all(fs.cache.has_index(d) for d in fs.image.layers):
        return None
    merged: dict[str, int]
    takes, merged = selection.matcher(), {}
    for desc in fs.image.layers:
        index = fs.cache.index(desc)
        if index is None:
            return None
        gone, emptied = set(index["whiteouts"]), set(index["opaque"])
        if gone or emptied:  # each path's folders looked up in the two sets: not paths times whiteouts
            merged = {path: size for path, size in merged.items() if not _removed(path, gone, emptied)}
        for path, (kind, size, _mode, _link) in index["entries"].items():
            merged.pop(path, None)
            if kind == "file" and takes(path):
                merged[path] = size
    return sum(merged.values())


def _removed(path: str, gone: set[str], emptied: set[str]) -> bool:
    """Does a layer with these whiteouts and opaque folders remove `path` of the layers below?"""
    if path in gone:
        return True
    while "/" in path:
        path = path.rpartition("/")[0]
        if path in gone or path in emptied:
            return True
    return False


# -- applying layers to a folder, below open folders -------------------------------------------------

class _Tree:
    """A folder we write into: each path reached from the root through folders opened one by one
    without following a link (O_NOFOLLOW), the open ones kept as a stack along the current path."""

    def __init__(self, root: Path):
        root.mkdir(mode=0o755)
        os.chmod(root, 0o755)
        self.stack = [("", os.open(root, os.O_RDONLY | os.O_DIRECTORY))]

    def close(self) -> None:
        for _, fd in self.stack:
            os.close(fd)
        self.stack = []

    @overload
    def parent(self, path: str, make: Literal[True] = True) -> tuple[int, str]: ...
    @overload
    def parent(self, path: str, make: bool) -> tuple[int, str] | None: ...

    def parent(self, path: str, make: bool = True) -> tuple[int, str] | None:
        """(an fd of the folder `path` lies in, its last name), making missing folders (0755), or
        None where one is missing and `make` is false."""
        folder, _, name = path.rpartition("/")
        parts = folder.split("/") if folder else []
        depth = 0
        while depth < len(parts) and depth + 1 < len(self.stack) and self.stack[depth + 1][0] == parts[depth]:
            depth += 1
        for _, fd in self.stack[depth + 1:]:
            os.close(fd)
        del self.stack[depth + 1:]
        for part in parts[depth:]:
            at = self.stack[-1][1]
            try:
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=at)
            except FileNotFoundError:
                if not make:
                    return None
                os.mkdir(part, 0o755, dir_fd=at)
                fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=at)
            except (NotADirectoryError, OSError) as e:  # a file or a link where a folder must be: the checks missed it
                if isinstance(e, FileNotFoundError):
                    raise
                raise IntegrityError(f"/{path}: a folder above it is not a folder ({e.strerror})") from None
            os.fchmod(fd, 0o755)  # as made, whatever the umask: the compile runs as another uid
            self.stack.append((part, fd))
        return self.stack[-1][1], name

    def remove(self, path: str) -> None:
        """Whatever is at path (a folder with all it holds), if anything."""
        found = self.parent(path, make=False)
        if found is not None:
            _remove(*found)

    def kind(self, path: str) -> int | None:
        """What is at path (stat's S_IFMT), or None; makes no folder."""
        found = self.parent(path, make=False)
        if found is None:
            return None
        at, name = found
        try:
            return stat.S_IFMT(os.stat(name, dir_fd=at, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            return None


def _room(root: Path) -> None:
    """Folders and links take blocks and inodes too: RESERVE of the disk, and inodes, stay free."""
    st = os.statvfs(root)
    if st.f_bavail * st.f_frsize < RESERVE or (st.f_files and st.f_favail < 10_000):
        raise EnvironmentProblem(f"the toolchain's files do not fit in {_lasting(root.parent)}: "
                                 f"{st.f_bavail * st.f_frsize / 2**30:.1f} GiB and {st.f_favail} inodes free; free "
                                 f"space, or set BAKERY_CACHE to a larger disk")


def _lasting(folder: Path) -> Path:
    """The folder a message names: the cache a work folder (.NAME.partial-XXXX) is made in, not the
    work folder, which is gone by the time the message is read."""
    while ".partial-" in folder.name:
        folder = folder.parent
    return folder


def _place(blob: Path, at: int, name: str) -> None:
    """The blob at name: a hard link to it, or a copy where the blob has as many links as its
    filesystem allows (the same bytes in tens of thousands of files)."""
    import errno

    try:
        os.link(blob, name, dst_dir_fd=at)
    except OSError as e:
        if e.errno != errno.EMLINK:
            raise
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, blob.stat().st_mode & 0o777,
                     dir_fd=at)
        with open(blob, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def _remove(at: int, name: str) -> None:
    try:
        mode = os.stat(name, dir_fd=at, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(name, dir_fd=at)
    else:
        os.unlink(name, dir_fd=at)


def apply_layers(indexes: list[dict], taken: list[dict], selection: Selection, root: Path,
                 blobs: Path) -> tuple[int, int]:
    """Apply each layer's index to `root`, bottom up, as an engine applies a layer (and as the layer
    checks make order within a layer irrelevant): its opaque folders emptied of what lies below,
    its whiteouts removed, then its entries in path order (a folder merged with one below, anything
    else replacing what was there), hard links last. Only what the selection takes; files are hard
    links to their blobs. Returns (files, bytes) of the regular files the root ends with."""
    takes = selection.matcher()
    tree = _Tree(root)
    try:
        for index, took in zip(indexes, taken, strict=True):
            # the engines make the folders a whiteout or an opaque marker lies in, given or not
            for folder in index["opaque"]:  # emptied of what lies below it in the layers under this one
                if not takes(folder):
                    continue
                at, name = tree.parent(folder)
                if tree.kind(folder) != stat.S_IFDIR:
                    _remove(at, name)
                    os.mkdir(name, 0o755, dir_fd=at)
                    os.chmod(name, 0o755, dir_fd=at)
                inside = tree.parent(folder + "/-")[0]
                for name in os.listdir(inside):
                    _remove(inside, name)
            for gone in index["whiteouts"]:
                if takes(gone):
                    _remove(*tree.parent(gone))
            links = []
            for made, path in enumerate(sorted(index["entries"])):
                kind, _size, mode, link = index["entries"][path]
                if not takes(path):
                    continue
                if made % 4096 == 0:
                    _room(root)
                at, name = tree.parent(path)
                if kind == "dir":
                    if tree.kind(path) != stat.S_IFDIR:
                        _remove(at, name)
                        os.mkdir(name, 0o755, dir_fd=at)
                        os.chmod(name, 0o755, dir_fd=at)
                    continue
                _remove(at, name)
                if kind == "file":
                    _place(blobs / took[path], at, name)
                elif kind == "symlink":
                    os.symlink(link, name, dir_fd=at)
                elif kind == "hardlink":
                    links.append(path)
                # devices and FIFOs are not made: a compile reads none, and an ordinary user cannot
            for path in links:  # the inode of a file this same layer gave (scan.py names the file itself)
                target = index["entries"][path][3]
                if target in took:  # a link to a file the selection leaves out is left out too
                    at, name = tree.parent(path)
                    _place(blobs / took[target], at, name)
        for point in MOUNT_POINTS:
            if tree.kind(point) != stat.S_IFDIR:
                tree.remove(point)
                at, name = tree.parent(point)
                os.mkdir(name, 0o755, dir_fd=at)
                os.chmod(name, 0o755, dir_fd=at)
    finally:
        tree.close()
    files, inodes = 0, {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            info = os.lstat(os.path.join(folder, name))
            if stat.S_ISREG(info.st_mode):
                files += 1
                inodes[info.st_ino] = info.st_size  # a hard link, or the same bytes again, takes no more disk
    return files, sum(inodes.values())
