"""The layer cache (BAKERY_CACHE/layers, files, views): what each base layer holds and the files taken
from it, by digest, so a warm build downloads nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .. import untrusted
from ..errors import EnvironmentProblem
from ..files import atomic_write, remove_tree, staging_dir
from ..oci.refs import Descriptor, Digest
from ..project import cache_dir

VIEW_SCHEMA = 3  # bump when how paths or globs are resolved changes: older views are then dropped
INDEX_SCHEMA = 4  # bump when what a layer's pass checks or records changes: older indexes are made again
# what the cache's disk keeps free as a layer's kept files are staged (each up to 256 MiB): a file a
# base makes us keep never takes the disk's last bytes, whatever else writes there
RESERVE = 4 << 20


class LayerCache:
    """layers/<hex>.json: what a layer holds; files/<sha256>: contents taken from layers;
    views/<image hex>.json: what builds resolved in an image, so a warm build reads no layer index
    (a production base's indexes hold hundreds of thousands of entries)."""

    def __init__(self, root: Path | None = None):
        self.root = root or cache_dir()
        (self.root / "layers").mkdir(parents=True, exist_ok=True)
        (self.root / "files").mkdir(parents=True, exist_ok=True)
        self.downloads = 0  # layers streamed by this process: a warm build keeps it at 0
        self._indexes: dict = {}  # layer digest -> index, checked once per process

    def index(self, desc: Descriptor) -> dict | None:
        """What a layer holds, if cached: the entry must name this layer and match its checksum
        (read from disk and checked once per process)."""
        if desc.digest not in self._indexes:
            index = self._load_checked(self.root / "layers" / f"{desc.digest.hex}.json",
                                       {"layer": str(desc.digest), "schema": INDEX_SCHEMA},
                                       f"layer index {desc.digest.hex[:12]}")
            if index is None or "diff_id" not in index:  # absent, dropped, or made before diff_ids were kept
                return None
            self._indexes[desc.digest] = index
        return self._indexes[desc.digest]

    def save_index(self, desc: Descriptor, index: dict) -> None:
        self._save_checked(self.root / "layers" / f"{desc.digest.hex}.json",
                           {"layer": str(desc.digest), "schema": INDEX_SCHEMA}, index)
        self.remember(desc, index)

    def remember(self, desc: Descriptor, index: dict) -> None:
        """An index this process made (or a worker of it handed over): no need to read it back."""
        self._indexes[desc.digest] = index

    def has_index(self, desc: Descriptor) -> bool:
        """An index is on disk (checked when it is loaded: a bad one is dropped then)."""
        return (self.root / "layers" / f"{desc.digest.hex}.json").is_file()

    def view(self, image: Digest) -> dict:
        """What earlier builds resolved in this image (paths and glob results): an image is
        immutable, so they hold for as long as the entry matches its checksum and schema."""
        path = self.root / "views" / f"{image.hex}.json"
        view = self._load_checked(path, {"image": str(image), "schema": VIEW_SCHEMA}, f"image view {image.hex[:12]}")
        if view is not None and not _view_shaped(view):
            self._drop(path, f"image view {image.hex[:12]} (it is not shaped as a view)")
            view = None
        return view or {"paths": {}, "globs": {}}

    def save_view(self, image: Digest, view: dict) -> None:
        self._save_checked(self.root / "views" / f"{image.hex}.json", {"image": str(image), "schema": VIEW_SCHEMA},
                           view)

    def _load_checked(self, path: Path, names: dict, what: str):
        """The JSON body of an entry whose first line is `names` plus the body's sha256; None when
        absent, or dropped with one warning when it does not match."""
        try:
            header, _, body = path.read_bytes().partition(b"\n")
            said = json.loads(header)
            if isinstance(said, dict) and said.get("schema") != names.get("schema") and \
                    all(said.get(k) == v for k, v in names.items() if k != "schema"):
                return None  # made by another version of bakery: made again, and replaced, without a word
            if said != {**names, "sha256": hashlib.sha256(body).hexdigest()}:
                raise ValueError("it does not match its checksum")
            return json.loads(body)
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as e:
            self._drop(path, f"{what} ({e})")
            return None

    @staticmethod
    def _save_checked(path: Path, names: dict, document) -> None:
        """One header line (`names` and the body's sha256), then the document itself."""
        # not files.canonical_json: a layer's paths may hold undecodable bytes (surrogateescape),
        # which only ASCII escapes carry through JSON and back
        body = json.dumps(document, sort_keys=True, separators=(",", ":")).encode()
        header = json.dumps({**names, "sha256": hashlib.sha256(body).hexdigest()}, sort_keys=True).encode()
        _atomic_write(path, header + b"\n" + body)

    def content(self, sha256: str) -> bytes | None:
        """A cached file's bytes, checked against the sha256 they are stored under; None if absent
        or dropped (a poisoned entry is deleted with one warning, and the caller fetches it again)."""
        path = self.root / "files" / sha256
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != sha256:
            self._drop(path, f"file {sha256[:12]} (its bytes do not match their sha256)")
            return None
        return data

    def stored_size(self, sha256: str) -> int | None:
        """The size of a cached file's bytes, without reading them (None: not cached)."""
        try:
            return (self.root / "files" / sha256).stat().st_size
        except FileNotFoundError:
            return None

    def has_content(self, sha256: str) -> bool:
        return self.content(sha256) is not None

    def store(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / "files" / digest
        if self.content(digest) is None:
            _atomic_write(path, data)
        return digest

    @contextmanager
    def staged(self) -> Iterator[Staged]:
        """Where one layer's pass puts the files it keeps: a staging folder in files/ (held while
        this process lives; a killed run's is removed by the next), moved into the cache by
        commit() once the layer's digest has held, and removed whatever happens."""
        with staging_dir(self.root / "files" / "kept") as folder:
            try:
                yield Staged(self, folder)
            finally:
                remove_tree(folder)

    @staticmethod
    def _drop(path: Path, what: str) -> None:
        print(f"warning: dropped a corrupt cache entry, {untrusted.safe(what)}; fetching it again", file=sys.stderr)
        path.unlink(missing_ok=True)


class Staged:
    """Kept files of one layer's pass, staged until its digest holds (LayerCache.staged)."""

    def __init__(self, cache: LayerCache, folder: Path):
        self.cache, self.folder = cache, folder
        self.names: set[str] = set()

    def store(self, data: bytes) -> str:
        """Stage the bytes (unless the cache holds them), RESERVE left free on the disk; their sha256."""
        digest = hashlib.sha256(data).hexdigest()
        if digest in self.names or self.cache.content(digest) is not None:
            return digest
        free = shutil.disk_usage(self.folder).free
        if free - len(data) < RESERVE:
            raise EnvironmentProblem(f"a file of {len(data):,} bytes the base's scan keeps does not fit in "
                                     f"{self.folder.parent}: {free:,} bytes free, and {RESERVE >> 20} MiB must stay "
                                     f"free; free space or set BAKERY_CACHE")
        try:
            (self.folder / digest).write_bytes(data)
        except OSError as e:
            raise EnvironmentProblem(f"cannot write {self.folder / digest}: {e.strerror}; free space or set "
                                     f"BAKERY_CACHE") from None
        self.names.add(digest)
        return digest

    def commit(self) -> None:
        """Every staged file into the cache, under its sha256 (the layer's digest has held)."""
        for digest in sorted(self.names):
            os.replace(self.folder / digest, self.cache.root / "files" / digest)


def _view_shaped(view) -> bool:
    """{"paths": {path: None | [layer, kind, mode, size, link, sha256]}, "globs": {pattern: [path]},
    "diff_ids": [the config's diff_ids, once every layer was checked against them] (optional),
    "merge_checked": true, once the layers were found to merge alike in every engine (optional)}"""
    return isinstance(view, dict) and {"paths", "globs"} <= set(view) <= {"paths", "globs", "diff_ids", "merge_checked"} and \
        view.get("merge_checked", True) is True and \
        isinstance(view["paths"], dict) and isinstance(view["globs"], dict) and \
        all(isinstance(d, str) for d in view.get("diff_ids", [])) and \
        all(e is None or (isinstance(e, list) and len(e) == 6) for e in view["paths"].values()) and \
        all(isinstance(g, list) and all(isinstance(p, str) for p in g) for g in view["globs"].values())


def _atomic_write(path: Path, data: bytes) -> None:
    try:
        atomic_write(path, data)
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {path}: {e.strerror}; free space or set BAKERY_CACHE") from None
