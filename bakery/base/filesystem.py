"""Read files out of a base image without unpacking it: stream layers, honour whiteouts.

Each layer is streamed at most once per set of missing files; what a layer holds (its index)
and every file taken from it are cached by digest, so a warm build downloads nothing.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from .. import untrusted
from ..errors import IntegrityError
from ..oci.refs import Descriptor, Digest
from ..oci.registry import Registry
from .layercache import LayerCache
from .scan import WORKERS, KeptBudget, folders_above, index_into_cache, normalize, scan_layer, share_budget
from .spec import Image

# a ROCm base names a few hundred thousand entries in all; each costs a few hundred bytes in memory
IMAGE_ENTRIES_LIMIT = 4_000_000
# the files a base's layers keep in the cache, together (a ROCm base: tens of MiB), charged as each
# is read (scan.KeptBudget) by whatever scans a layer (the pool's workers, a layer streamed again for
# a file a link names), the layers cached already counted first: a thousand layers each within their
# own limit (scan.KEPT_BYTES_LIMIT) cannot fill the disk
IMAGE_KEPT_LIMIT = 2 << 30
_TOO_MUCH_KEPT = ("the files its layers keep (copyright texts, package metadata, sources) add up to more than "
                  "{} MiB together, past what bakery keeps for one image; refused")


def _kept_bytes(index: dict) -> int:
    """What a layer's index says its kept files hold (their sizes as its tar headers gave them)."""
    return sum(index["entries"][p][1] for p in index["files"] if p in index["entries"])


@dataclass(frozen=True)
class BaseFile:
    """A file as the merged base filesystem shows it."""

    path: str
    kind: str  # file | symlink | hardlink | dir | other
    mode: int
    size: int
    linkname: str
    layer: str  # digest of the layer it comes from
    sha256: str | None = None  # set for extracted regular files
    data: bytes | None = None


def starting_with(ordered: list[str], prefix: str) -> Iterator[str]:
    """The items of a sorted list that start with `prefix`: bisected to, then read while they match
    (islice would step through every item before them, which paths times whiteouts made hours)."""
    at = bisect.bisect_left(ordered, prefix)
    while at < len(ordered) and ordered[at].startswith(prefix):
        yield ordered[at]
        at += 1


def _hidden_by(index: dict, path: str) -> bool:
    """Does this layer delete `path`, or hide the directory it lives in?"""
    if path in index["whiteouts"]:
        return True
    parents = [str(p) for p in PurePosixPath(path).parents if str(p) != "."]
    return any(p in index["whiteouts"] or p in index["opaque"] or
               (p in index["entries"] and index["entries"][p][0] != "dir") for p in parents)


class _Merged:
    """What layers applied bottom up hold, path by path (a kind each, and each folder's names), so
    that whiteouts and replacements remove a subtree at the cost of what it holds."""

    def __init__(self):
        self.kinds: dict[str, str] = {}
        self.names: dict[str, set[str]] = {}  # folder -> the paths directly in it

    def kind(self, path: str) -> str | None:
        return self.kinds.get(path)

    def _remove(self, path: str, itself: bool = True) -> None:
        stack = list(self.names.pop(path, ()))
        if itself:
            self.kinds.pop(path, None)
            self.names.get(path.rpartition("/")[0], set()).discard(path)
        while stack:
            gone = stack.pop()
            self.kinds.pop(gone, None)
            stack.extend(self.names.pop(gone, ()))

    def _put(self, path: str, kind: str) -> None:
        self.kinds[path] = kind
        child, parent = path, path.rpartition("/")[0]
        while True:  # the folders above it, as the engines make them
            self.names.setdefault(parent, set()).add(child)
            if not parent or self.kinds.get(parent) == "dir":
                break
            self.kinds[parent] = "dir"
            child, parent = parent, parent.rpartition("/")[0]

    def apply(self, index: dict) -> None:
        """A layer as an engine applies it: its opaque folders emptied, its whiteouts removed, then
        each entry replacing what was there (a folder merging with a folder)."""
        for folder in index["opaque"]:
            self._remove(folder, itself=False)
            self._put(folder, "dir")
        for gone in index["whiteouts"]:
            self._remove(gone)
            parent = gone.rpartition("/")[0]
            if parent:
                self._put(parent, "dir")
        for path, (kind, *_rest) in index["entries"].items():
            if kind != "dir" or self.kinds.get(path) not in (None, "dir"):
                self._remove(path)
            self._put(path, kind if kind != "hardlink" else "file")


class BaseFilesystem:
    """The merged view of an image's layers, read lazily through the cache."""

    def __init__(self, registry: Registry, image: Image, cache: LayerCache | None = None,
                 keep: tuple[str, ...] = ()):
        self.registry, self.image = registry, image
        self.cache = cache or LayerCache()
        self.keep = keep  # patterns worth keeping on a layer's first pass
        self._view: dict | None = None
        self._sorted: dict = {}
        self._made: dict = {}
        self._counted: set = set()  # layers whose entries are in _entries
        self._entries = 0
        self._kept = 0  # bytes of the files the counted layers keep in the cache
        self._places = Counter(d.digest for d in image.layers)  # a layer listed twice counts twice
        self._diff_ids: dict[Digest, str] = {}  # layer digest -> the diff_id the config lists for it
        for desc, diff_id in zip(image.layers, self.diff_ids, strict=True):
            if self._diff_ids.setdefault(desc.digest, diff_id) != diff_id:
                raise IntegrityError(f"base {image.ref}: layer {desc.digest} appears twice with different diff_ids "
                                     f"in its config; the image is corrupt or hostile")

    @property
    def diff_ids(self) -> list[str]:
        return [str(d) for d in (self.image.config.get("rootfs") or {}).get("diff_ids") or []]

    def _checked(self, desc: Descriptor, index: dict) -> dict:
        """An index whose decompressed layer is the one the config names (its diff_id), and which
        keeps the image's indexes together within IMAGE_ENTRIES_LIMIT."""
        if index["diff_id"] != self._diff_ids[desc.digest]:
            n = self.image.layers.index(desc)
            raise IntegrityError(f"base {self.image.ref}: layer {n + 1} of {len(self.image.layers)} ({desc.digest}) "
                                 f"decompresses to {index['diff_id']}, but the image config lists diff_id "
                                 f"{self._diff_ids[desc.digest]}; the base is corrupt or hostile: refused")
        if desc.digest not in self._counted:  # a layer's entries are fixed by its digest: counted once a place it is at
            self._counted.add(desc.digest)
            self._entries += self._places[desc.digest] * (len(index["entries"]) + len(index["whiteouts"]) + len(index["opaque"]))
            self._kept += _kept_bytes(index)
        if self._entries > IMAGE_ENTRIES_LIMIT:
            raise IntegrityError(f"base {self.image.ref}: its layers name more than {IMAGE_ENTRIES_LIMIT:,} entries "
                                 f"together, past what bakery holds in memory for one image; refused")
        if self._kept > IMAGE_KEPT_LIMIT:
            raise IntegrityError(f"base {self.image.ref}: {_TOO_MUCH_KEPT.format(IMAGE_KEPT_LIMIT >> 20)}")
        return index

    def _index(self, desc: Descriptor, wanted: set[str]) -> dict:
        index = self.cache.index(desc)
        missing = {p for p in wanted if index is None or
                   (p in index["entries"] and index["entries"][p][0] == "file" and
                    not self.cache.has_content(index["files"].get(p, "-")))}
        if index is not None and not missing:
            return self._checked(desc, index)
        self._count_cached()  # the budget below starts from what every cached layer keeps
        counted = desc.digest in self._counted  # then what this pass keeps besides is counted here
        fresh, found, _ = scan_layer(self.registry, self.image.ref.repository, desc, missing or set(), self.cache,
                                     self.keep if index is None else (), budget=KeptBudget(IMAGE_KEPT_LIMIT, self._kept))
        if counted:
            self._kept += sum(fresh["entries"][p][1] for p in found if p in fresh["entries"])
        if index is not None:
            fresh["files"] = {k: v for k, v in index["files"].items() if self.cache.has_content(v)}
        fresh["files"].update(found)
        self.cache.save_index(desc, fresh)
        return self._checked(desc, fresh)

    def _count_cached(self) -> None:
        """Every cached layer of the image counted (its entries and kept bytes), before a layer is
        streamed: a budget started from the layers this process happened to touch let a new layer
        keep its 512 MiB over what the cached ones already hold."""
        for d in self.image.layers:
            if d.digest not in self._counted and (index := self.cache.index(d)) is not None:
                self._checked(d, index)

    def check_layers(self) -> None:
        """Every layer decompresses to the diff_id its config lists. Once per image: the view keeps
        the diff_ids it checked (the image's digest fixes its config, so they cannot change)."""
        if self.view.get("diff_ids") == self.diff_ids:
            return
        for desc in self.image.layers:
            self._index(desc, set())
        self.view["diff_ids"] = self.diff_ids
        self.cache.save_view(self.image.manifest_digest, self.view)

    def prefetch(self, sink=None) -> list[dict] | None:
        """Index every layer that has no cached index yet, in parallel processes (largest first):
        fetching, hashing, decompressing and parsing a tar overlap across layers and cores, and
        each worker leaves its index and kept files in the cache. With `keep` naming every file the
        caller will read, each layer is streamed once. With `sink` (base/extract.py), every layer is
        streamed, and what it took from each is returned, in the layers' order."""
        todo = list({d.digest: d for d in self.image.layers  # a layer listed twice is streamed once
                     if sink is not None or not self.cache.has_index(d)}.values())
        if len(todo) < 2 and sink is None:
            return None
        taken: dict = {}
        # what the layers cached already keep counts first: a second try keeps nothing past the budget
        streamed = {d.digest for d in todo}
        cached = [self.cache.index(d) for d in {d.digest: d for d in self.image.layers}.values()
                  if d.digest not in streamed]
        budget = KeptBudget(IMAGE_KEPT_LIMIT, sum(_kept_bytes(i) for i in cached if i is not None))
        if budget.left.value < 0:
            raise IntegrityError(f"base {self.image.ref}: {_TOO_MUCH_KEPT.format(IMAGE_KEPT_LIMIT >> 20)}")
        if len(todo) == 1:  # one layer: no pool to start
            index, found, taken[todo[0].digest] = scan_layer(self.registry, self.image.ref.repository, todo[0], set(),
                                                             self.cache, self.keep, sink, budget)
            index["files"].update(found)
            self.cache.save_index(todo[0], self._checked(todo[0], index))
        elif todo:
            import multiprocessing  # only a cold pass pays for the process pool's imports
            from concurrent.futures import ProcessPoolExecutor

            todo.sort(key=lambda d: -d.size)
            jobs = [(self.registry.name, self.image.ref.repository, d.to_json(), self.keep, str(self.cache.root), sink)
                    for d in todo]
            with ProcessPoolExecutor(min(len(todo), WORKERS), mp_context=multiprocessing.get_context("fork"),
                                     initializer=share_budget, initargs=(budget,)) as pool:
                try:
                    for desc, (downloads, index, took) in zip(todo, pool.map(index_into_cache, jobs), strict=True):
                        self.cache.downloads += downloads
                        self.cache.remember(desc, self._checked(desc, index))
                        taken[desc.digest] = took
                except BaseException:
                    pool.shutdown(cancel_futures=True)  # the layers not begun are not streamed
                    raise
        return [taken[d.digest] for d in self.image.layers] if sink is not None else None

    def check_merge(self) -> None:
        """Where a layer writes under a folder it does not give itself, that folder must be a folder
        (or nothing) in the layers below: not a link, which containerd follows inside the root while
        Docker's overlay2 puts a folder over it, and not a file, which containerd fails on and
        overlay2 hides. Refused otherwise, naming the layer and the path. Once per image: the view
        keeps the answer (the image's digest fixes its layers)."""
        if self.view.get("merge_checked"):
            return
        indexes = [self._index(d, set()) for d in self.image.layers]
        merged = _Merged()  # the layers below the one checked, as they stand together: one pass, bottom up
        for n, upper in enumerate(indexes):
            pending = folders_above(upper["entries"], upper["whiteouts"], upper["opaque"]) - upper["entries"].keys()
            # what it whites out or empties is found through the folders above it, even where the layer gives
            # them itself (an engine may apply the whiteout before the folder that replaces a link)
            pending |= folders_above({}, upper["whiteouts"], upper["opaque"])
            # and a folder it gives only after names under it: those were written through what was below
            pending |= set(upper.get("late", ()))
            for path in sorted(pending):
                kind = merged.kind(path)
                if kind not in (None, "dir"):
                    raise IntegrityError(
                        f"base {self.image.ref}: layer {n + 1} of {len(indexes)} ({self.image.layers[n].digest}) "
                        f"writes under /{untrusted.safe(path)}, which the layers below give as {kind}: the engines "
                        f"would not unpack it alike (a write through a link, or into a file); refused")
            merged.apply(upper)
        self.view["merge_checked"] = True
        self.cache.save_view(self.image.manifest_digest, self.view)

    def _sorted_paths(self, desc: Descriptor, index: dict) -> list[str]:
        """The index's paths in order (once per index and process): a glob bisects to its prefix."""
        known = self._sorted.get(desc.digest)
        if known is None or known[0] is not index:
            known = self._sorted[desc.digest] = (index, sorted(index["entries"]))
        return known[1]

    def _locate(self, path: str) -> tuple[Descriptor, list] | None:
        """Top-down: the first layer that holds `path` or hides it decides. A layer that gives names,
        whiteouts or an opaque marker under `path` without `path` itself makes it a folder, as every
        engine does (a layer below that gives the folder itself says what it is)."""
        implied = None
        for desc in reversed(self.image.layers):
            index = self._index(desc, set())
            if path in index["entries"]:
                entry = index["entries"][path]
                return (desc, entry) if implied is None or entry[0] == "dir" else implied
            if _hidden_by(index, path):
                return implied
            if implied is None and path in self._folders(desc, index):
                implied = desc, ["dir", 0, 0o755, ""]
        return implied

    def _folders(self, desc: Descriptor, index: dict) -> set[str]:
        """Every folder the layer makes, given or not: those its entries, whiteouts and opaque
        markers lie in (once per index and process)."""
        known = self._made.get(desc.digest)
        if known is None or known[0] is not index:
            known = self._made[desc.digest] = (index, folders_above(index["entries"], index["whiteouts"],
                                                                    index["opaque"]))
        return known[1]

    @property
    def view(self) -> dict:
        if self._view is None:
            self._view = self.cache.view(self.image.manifest_digest)
        return self._view

    def _bytes(self, sha: str, limit: int | None) -> bytes | int | None:
        """A kept file's bytes; its size instead where that is past limit (its bytes are not read);
        None where they are not cached (or were bad, and dropped)."""
        size = self.cache.stored_size(sha) if limit is not None else None
        if size is not None and limit is not None and size > limit:  # size: only asked for with a limit
            return size
        return self.cache.content(sha)

    def _from_view(self, path: str, limit: int | None = None) -> BaseFile | None | Literal[False]:
        """The view's answer for `path` (None: absent), or False where it has none or the file's
        cached bytes are gone or bad."""
        if path not in self.view["paths"]:
            return False
        entry = self.view["paths"][path]
        if entry is None:
            return None
        layer, kind, mode, size, link, sha = entry
        data = self._bytes(sha, limit) if sha else None
        if kind in ("file", "hardlink") and data is None:
            return False
        if isinstance(data, int):
            return BaseFile(path, kind, mode, data, link, layer, sha, None)
        return BaseFile(path, kind, mode, size, link, layer, sha, data)

    def kinds(self, paths: Iterable[str]) -> dict[str, tuple[str, str] | None]:
        """(kind, link target) of each path as the merged view has it, fetching no file's bytes."""
        out = {}
        for p in {normalize(p) for p in paths}:
            hit = self._locate(p)
            out[p] = (hit[1][0], hit[1][3]) if hit else None
        return {p: out[p] for p in sorted(out)}

    def read(self, paths: Iterable[str], limit: int | None = None) -> dict[str, BaseFile | None]:
        """Resolve each path (from the view when it knows it, else through the layers); regular
        files come back with their bytes, checked against their sha256. A file past `limit` bytes
        comes back with its size and no bytes (none are read: a reader of many files of a hostile
        base holds at most limit bytes for each)."""
        out, unknown = {}, set()
        for p in {normalize(p) for p in paths}:
            known = self._from_view(p, limit)
            if known is False:
                unknown.add(p)
            else:
                out[p] = known
        if unknown:
            found = self._read_layers(unknown, limit)
            for p, f in found.items():
                if f is None or f.kind not in ("file", "hardlink") or f.data is not None:
                    self.view["paths"][p] = None if f is None else [f.layer, f.kind, f.mode, f.size, f.linkname,
                                                                     f.sha256]
            self.cache.save_view(self.image.manifest_digest, self.view)
            out.update(found)
        return {p: out[p] for p in sorted(out)}

    def _read_layers(self, wanted: set[str], limit: int | None = None) -> dict[str, BaseFile | None]:
        located = {p: self._locate(p) for p in wanted}
        for _ in range(2):  # a hardlink's target is fetched in a second pass
            by_layer: dict[Descriptor, set[str]] = {}
            for p, hit in located.items():
                if hit and hit[1][0] in ("file", "hardlink"):
                    target = p if hit[1][0] == "file" else hit[1][3]
                    by_layer.setdefault(hit[0], set()).add(target)
            for desc, want in by_layer.items():
                self._index(desc, want)
        out: dict[str, BaseFile | None] = {}
        for p in sorted(wanted):
            hit = located[p]
            if hit is None:
                out[p] = None
                continue
            desc, (kind, size, mode, link) = hit
            source = link if kind == "hardlink" else p
            index = self._index(desc, {source} if kind in ("file", "hardlink") else set())
            sha = index["files"].get(source) if kind in ("file", "hardlink") else None
            data = self._bytes(sha, limit) if sha else None
            if sha and data is None:  # dropped as corrupt just now: stream the layer again
                sha = self._index(desc, {source})["files"].get(source)
                data = self._bytes(sha, limit) if sha else None
            if isinstance(data, int):  # past the caller's limit: its size, not its bytes
                out[p] = BaseFile(p, kind, mode, data, link, str(desc.digest), sha, None)
                continue
            out[p] = BaseFile(p, kind, mode, len(data) if data is not None else size, link, str(desc.digest),
                              sha, data)
        return out

    def glob(self, pattern: str) -> list[str]:
        """Paths present in the merged filesystem that match a shell pattern."""
        if pattern not in self.view["globs"]:
            self.view["globs"][pattern] = self._glob_layers(pattern)
            self.cache.save_view(self.image.manifest_digest, self.view)
        return list(self.view["globs"][pattern])

    def _glob_layers(self, pattern: str) -> list[str]:
        present: dict[str, bool] = {}
        hidden_indexes: list[dict] = []
        matches = re.compile(fnmatch.translate(pattern)).match
        prefix = re.split(r"[*?\[]", pattern, maxsplit=1)[0]  # only paths under it can match
        for desc in reversed(self.image.layers):
            index = self._index(desc, set())
            paths = self._sorted_paths(desc, index)
            for path in starting_with(paths, prefix):
                if path not in present and matches(path) and \
                        not any(_hidden_by(h, path) or path in h["whiteouts"] for h in hidden_indexes):
                    present[path] = True
            hidden_indexes.append(index)
        return sorted(present)
