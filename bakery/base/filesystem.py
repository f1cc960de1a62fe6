"""Read files out of a base image without unpacking it: stream layers, honour whiteouts.

Each layer is streamed at most once per set of missing files; what a layer holds (its index)
and every file taken from it are cached by digest, so a warm build downloads nothing.
"""

from __future__ import annotations

import bisect
import fnmatch
import gzip
import hashlib
import io
import itertools
import json
import multiprocessing
import queue
import re
import sys
import tarfile
import threading
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Iterator

import zstandard

from ..errors import EnvironmentProblem, InputError, IntegrityError
from ..files import atomic_write
from ..oci.refs import Descriptor, Digest
from ..oci.registry import Registry
from ..oci.tarscan import TarError, TarReader
from ..project import cache_dir
from .spec import Image

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
VIEW_SCHEMA = 1  # bump when how paths or globs are resolved changes: older views are then dropped
_KIND = {tarfile.REGTYPE: "file", tarfile.AREGTYPE: "file", tarfile.DIRTYPE: "dir", tarfile.SYMTYPE: "symlink",
         tarfile.LNKTYPE: "hardlink"}


def normalize(path: str) -> str:
    """'/usr/x', './usr/x' and 'usr/x/' all name 'usr/x'."""
    if path and path[0] not in "./" and path[-1] != "/" and "//" not in path and "/." not in path:
        return path  # already normal: no empty, "." or ".." part can hide in it (most tar members)
    parts = [p for p in path.split("/") if p and p != "."]  # str ops: once per tar member
    if ".." in parts:
        raise InputError(f"path {path!r} contains '..'")
    return "/".join(parts)


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
            index = self._load_checked(self.root / "layers" / f"{desc.digest.hex}.json", {"layer": str(desc.digest)},
                                       f"layer index {desc.digest.hex[:12]}")
            if index is None or "diff_id" not in index:  # absent, dropped, or made before diff_ids were kept
                return None
            self._indexes[desc.digest] = index
        return self._indexes[desc.digest]

    def save_index(self, desc: Descriptor, index: dict) -> None:
        self._save_checked(self.root / "layers" / f"{desc.digest.hex}.json", {"layer": str(desc.digest)}, index)
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
            if json.loads(header) != {**names, "sha256": hashlib.sha256(body).hexdigest()}:
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

    def has_content(self, sha256: str) -> bool:
        return self.content(sha256) is not None

    def store(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / "files" / digest
        if self.content(digest) is None:
            _atomic_write(path, data)
        return digest

    @staticmethod
    def _drop(path: Path, what: str) -> None:
        print(f"warning: dropped a corrupt cache entry, {what}; fetching it again", file=sys.stderr)
        path.unlink(missing_ok=True)


def _view_shaped(view) -> bool:
    """{"paths": {path: None | [layer, kind, mode, size, link, sha256]}, "globs": {pattern: [path]},
    "diff_ids": [the config's diff_ids, once every layer was checked against them] (optional)}"""
    return isinstance(view, dict) and {"paths", "globs"} <= set(view) <= {"paths", "globs", "diff_ids"} and \
        isinstance(view["paths"], dict) and isinstance(view["globs"], dict) and \
        all(isinstance(d, str) for d in view.get("diff_ids", [])) and \
        all(e is None or (isinstance(e, list) and len(e) == 6) for e in view["paths"].values()) and \
        all(isinstance(g, list) and all(isinstance(p, str) for p in g) for g in view["globs"].values())


PIECE = 4 << 20  # the most decompressed bytes per hand-over: each hand-over costs a GIL switch
DEPTH = 3  # pieces waiting at each hand-over: a layer's pass holds ~20 MiB, whatever the layer's size
SWITCH_S = 0.001  # the GIL switch interval while a layer streams (Python's default: 5 ms)


class _Pieces:
    """A read(n)-only stream over pieces of bytes (`next_piece` gives b"" at the end): read(n) gives
    n bytes unless the stream ends, as TarReader wants, and a read within one piece is one slice."""

    def __init__(self, next_piece):
        self.next_piece, self.buf, self.pos = next_piece, b"", 0

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        buf, pos = self.buf, self.pos
        if 0 <= n <= len(buf) - pos:  # the common case: a header, or a skip within one piece
            self.pos = pos + n
            return buf[pos:pos + n]
        # across pieces: views of them, copied once by the join (a 1 GiB member is skipped in 1 MiB reads)
        parts, have = [memoryview(buf)[pos:]], len(buf) - pos
        self.buf, self.pos = b"", 0
        while n < 0 or have < n:
            piece = self.next_piece()
            if not piece:
                break
            if 0 <= n < have + len(piece):  # keep the rest of this piece for the next read
                self.buf, self.pos = piece, n - have
                piece = memoryview(piece)[:n - have]
            parts.append(piece)
            have += len(piece)
        return b"".join(parts)

    def skip(self, n: int) -> int:
        """Drop up to n bytes without copying them (a big member's data the index does not keep);
        how many were dropped (fewer only where the stream ends)."""
        done = 0
        while done < n:
            left = len(self.buf) - self.pos
            if not left:
                self.buf, self.pos = self.next_piece(), 0
                if not self.buf:
                    break
                continue
            step = min(left, n - done)
            self.pos += step
            done += step
        return done


def _gunzip(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """Decompressed pieces of a gzip stream, read as GzipFile reads it: members one after another,
    zero bytes after a member skipped, each member's CRC and length checked (by zlib), a stream
    that ends inside a member an EOFError. zlib on large pieces, not GzipFile's 8 KiB reads, and
    at most PIECE bytes out per call, so a compression bomb cannot swell memory."""
    inflate, pending, members = None, False, 0
    for data in pieces:
        while data or pending:
            if inflate is None:
                if members:  # after a member, GzipFile skips zero padding (not before the first)
                    data = data.lstrip(b"\0")
                    if not data:
                        break
                inflate, members = zlib.decompressobj(wbits=31), members + 1
            out = inflate.decompress(data, PIECE)
            pending = len(out) == PIECE  # zlib may hold more output for input it already took
            data = inflate.unconsumed_tail
            if out:
                yield out
            if inflate.eof:  # the next member, if any, starts in what this one left
                data, inflate, pending = inflate.unused_data, None, False
    if inflate is not None:
        raise EOFError("Compressed file ended before the end-of-stream marker was reached")


def _unzstd(pieces: Iterator[bytes]) -> Iterator[bytes]:
    reader = zstandard.ZstdDecompressor().stream_reader(_Pieces(lambda: next(pieces, b"")), read_across_frames=True)
    while piece := reader.read(PIECE):
        yield piece


def _decoder(media_type: str):
    """What turns a layer's blob into its tar stream, piece by piece (as `decompressed` reads it)."""
    if "zstd" in media_type:
        return _unzstd
    if media_type.endswith(("gzip", "+gzip")):
        return _gunzip
    if media_type.endswith(("tar", ".tar")):
        return lambda pieces: pieces
    raise InputError(f"unsupported layer media type {media_type!r}")


class _Failed:
    """What a stage hands on in place of a piece when it fails: the next stage raises it."""

    def __init__(self, error: BaseException):
        self.error = error


class _Upstream(Exception):
    """The fetch failed: the decoding stage hands that failure on instead of its own."""


_END = object()  # a stage is done: the pieces before it are all there is


class _LayerPipe:
    """One layer's bytes through three threads, so that on two cores the stages overlap: `fetch`
    (HTTP receive and the blob's sha256, inside stream_blob), `decode` (decompression and the
    diff_id's sha256, on pieces of PIECE bytes), and the caller, which reads the tar stream with
    read(n). hashlib and zlib (and zstd) let go of the GIL on large buffers, so the stages run
    truly at once; the queues between them are bounded, so memory stays flat. The tar reader reads
    `stream`.

    The diff_id is the sha256 of everything decoded, the tar's end padding that the reader leaves
    unread included. The blob's digest is checked when stream_blob ends; `finish` waits for it."""

    def __init__(self, chunks: Iterator[bytes], decode):
        self.chunks, self.decode = chunks, decode
        self.hasher = hashlib.sha256()
        self.compressed, self.decoded = queue.Queue(DEPTH), queue.Queue(DEPTH)
        self.fetch_error: BaseException | None = None
        self.last = None  # _END or _Failed, once the caller has taken it
        self.stop = threading.Event()  # the caller reads no more: decode no further, but fetch to the end
        self.cancel = threading.Event()  # nobody wants the rest: fetch no further either
        self.threads = [threading.Thread(target=self._fetch, daemon=True, name="layer-fetch"),
                        threading.Thread(target=self._decode, daemon=True, name="layer-decode")]
        self.stream = _Pieces(self._next_decoded)
        for t in self.threads:
            t.start()

    def _put(self, q: queue.Queue, item, until: threading.Event) -> bool:
        """Put, unless `until` is set first (the reader of `q` has gone): False then."""
        while not until.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def _fetch(self) -> None:
        end = _END
        try:
            for chunk in self.chunks:  # stream_blob hashes each chunk, and checks the digest at its end
                if self.cancel.is_set() or not self._put(self.compressed, chunk, self.cancel):
                    break
        except BaseException as e:  # a bad digest, a broken transfer: the caller raises it
            self.fetch_error, end = e, _Failed(e)
        finally:
            self.chunks.close()  # in this thread, the one iterating it: gives the connection back
        self._put(self.compressed, end, self.cancel)

    def _compressed_pieces(self) -> Iterator[bytes]:
        while True:
            try:
                item = self.compressed.get(timeout=0.1)
            except queue.Empty:
                if self.cancel.is_set():  # the fetch was cancelled before it could say it ended
                    return
                continue
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise _Upstream()
            if item:  # b"" would read as the end downstream
                yield item

    def _decode(self) -> None:
        pieces = self._compressed_pieces()
        try:
            for piece in self.decode(pieces):
                if self.stop.is_set():
                    break
                if not piece:  # b"" means the end to _Pieces
                    continue
                self.hasher.update(piece)
                if not self._put(self.decoded, piece, self.stop):
                    break
            else:
                self._put(self.decoded, _END, self.stop)
        except _Upstream:
            self._put(self.decoded, _Failed(self.fetch_error), self.stop)
        except BaseException as e:  # not decodable: the caller raises it, once the digest was checked
            self._put(self.decoded, _Failed(e), self.stop)
        finally:  # let the fetch run to its end, where the digest is checked
            try:
                for _ in pieces:
                    if self.cancel.is_set():
                        break
            except _Upstream:  # the fetch failed: it keeps its error for abandon()
                pass

    def _next_decoded(self) -> bytes:
        item = self.last or self.decoded.get()
        if isinstance(item, _Failed):
            self.last = item  # raised again by any later read
            raise item.error
        if item is _END:
            self.last = item
            return b""
        return item

    def finish(self) -> str:
        """Read what the tar reader left (end blocks, padding) and name the whole stream; the blob's
        digest has been checked once the decoded stream ends."""
        while self.stream.read(PIECE):
            pass
        for t in self.threads:
            t.join()
        return f"sha256:{self.hasher.hexdigest()}"

    def abandon(self, error: BaseException) -> None:
        """The layer is unreadable (`error`): decode no further, but fetch to the end, so that a
        bad digest, the better diagnosis, is raised here first (unless `error` is the fetch's own)."""
        self.stop.set()
        for t in self.threads:
            t.join()
        if self.fetch_error is not None and self.fetch_error is not error:
            raise self.fetch_error

    def close(self) -> None:
        """Whatever happened, no thread is left waiting on us (they end by themselves: a thread
        in a read from the network may take until its timeout)."""
        self.stop.set()
        self.cancel.set()


def decompressed(media_type: str, raw) -> io.IOBase:
    if "zstd" in media_type:
        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    if media_type.endswith(("gzip", "+gzip")):
        return gzip.GzipFile(fileobj=raw)
    if media_type.endswith(("tar", ".tar")):
        return raw
    raise InputError(f"unsupported layer media type {media_type!r}")


def scan_layer(registry: Registry, repo: str, desc: Descriptor, wanted: set[str],
               cache: LayerCache, keep: tuple[str, ...] = ()) -> tuple[dict, dict[str, str]]:
    """Stream one layer: list everything in it, keep the contents of `wanted` regular files
    and of those matching a `keep` pattern (files known to be needed later, e.g. dist-info).

    Returns (index, {path: sha256}); nothing is recorded in the cache until the layer's digest
    has been checked, so a corrupt download leaves no trace. Members are read by tarscan, as the
    engine will unpack them; a layer it cannot read that way refuses the base.
    """
    cache.downloads += 1
    entries, whiteouts, opaque, found = {}, [], [], {}
    decode = _decoder(desc.media_type)
    keep = re.compile("|".join(f"(?:{fnmatch.translate(k)})" for k in keep)) if keep else None
    pipe = _LayerPipe(registry.stream_blob(repo, desc, label=f"layer {desc.digest.hex[:12]}"), decode)
    # While the tar reader runs Python, a stage coming back from zlib or hashlib waits for the GIL
    # up to the switch interval, for each piece: 5 ms would stall it longer than the work itself.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_S))
    try:
        reader = TarReader(pipe.stream)
        for member in reader:
            _take(member, reader.read_data, entries, whiteouts, opaque, found, wanted, keep, cache)
        diff_id = pipe.finish()
    except (TarError, EOFError, OSError, zlib.error, zstandard.ZstdError, ValueError, UnicodeError) as e:
        pipe.abandon(e)  # a bad digest is the better diagnosis: raised from here when the fetch saw one
        raise IntegrityError(f"layer {desc.digest} of {repo} is not a readable {desc.media_type} "
                             f"({type(e).__name__}: {e}); the image is corrupt or hostile") from None
    except BaseException as e:  # a member path with "..", a kept file past its cap: still the digest first
        pipe.abandon(e)
        raise
    finally:
        pipe.close()
        sys.setswitchinterval(interval)
    index = {"entries": entries, "whiteouts": sorted(whiteouts), "opaque": sorted(opaque), "files": {},
             "diff_id": diff_id}
    return index, found


def _index_into_cache(job) -> tuple[int, dict]:
    """In a worker process: stream one layer, record its index and kept files in the cache, and
    hand the index back (unpickling it beats parsing the JSON again)."""
    from ..oci.registry import Registry

    registry, repo, desc, keep, root = job
    desc = Descriptor.from_json(desc)
    cache = LayerCache(Path(root))
    index, found = scan_layer(Registry(registry), repo, desc, set(), cache, keep)
    index["files"].update(found)
    cache.save_index(desc, index)
    return cache.downloads, index


KEPT_LIMIT = 256 << 20
# layers streamed at once: all of a base (up to this), since which layer costs most is not known
# before it is read (a small blob of many small files costs more than a big one of few)
WORKERS = 8


def _take(member, read_data, entries, whiteouts, opaque, found, wanted, keep, cache) -> None:
    """Record one tar member: a whiteout, an opaque marker, or an entry (kept if wanted)."""
    path = normalize(member.name)
    parent, _, name = path.rpartition("/")
    if name == OPAQUE:
        opaque.append(parent)
        return
    if name.startswith(WHITEOUT):
        whiteouts.append(f"{parent}/{name[len(WHITEOUT):]}" if parent else name[len(WHITEOUT):])
        return
    kind = _KIND.get(member.type, "other")
    entries[path] = [kind, member.size, member.mode, normalize(member.linkname) if kind == "hardlink"
                     else member.linkname]
    if kind == "file" and (path in wanted or (keep is not None and keep.match(path))):
        if member.size > KEPT_LIMIT:  # kept files are sources and METADATA: read whole, so capped
            raise TarError(f"{path} is {member.size} bytes, past the {KEPT_LIMIT} a file we read may be")
        found[path] = cache.store(read_data(member))


def _hidden_by(index: dict, path: str) -> bool:
    """Does this layer delete `path`, or hide the directory it lives in?"""
    if path in index["whiteouts"]:
        return True
    parents = [str(p) for p in PurePosixPath(path).parents if str(p) != "."]
    return any(p in index["whiteouts"] or p in index["opaque"] or
               (p in index["entries"] and index["entries"][p][0] != "dir") for p in parents)


class BaseFilesystem:
    """The merged view of an image's layers, read lazily through the cache."""

    def __init__(self, registry: Registry, image: Image, cache: LayerCache | None = None,
                 keep: tuple[str, ...] = ()):
        self.registry, self.image = registry, image
        self.cache = cache or LayerCache()
        self.keep = keep  # patterns worth keeping on a layer's first pass
        self._view: dict | None = None
        self._sorted: dict = {}
        self._diff_ids = {}  # layer digest -> the diff_id the config lists for it
        for desc, diff_id in zip(image.layers, self.diff_ids):
            if self._diff_ids.setdefault(desc.digest, diff_id) != diff_id:
                raise IntegrityError(f"base {image.ref}: layer {desc.digest} appears twice with different diff_ids "
                                     f"in its config; the image is corrupt or hostile")

    @property
    def diff_ids(self) -> list[str]:
        return [str(d) for d in (self.image.config.get("rootfs") or {}).get("diff_ids") or []]

    def _checked(self, desc: Descriptor, index: dict) -> dict:
        """An index whose decompressed layer is the one the config names (its diff_id)."""
        if index["diff_id"] != self._diff_ids[desc.digest]:
            n = self.image.layers.index(desc)
            raise IntegrityError(f"base {self.image.ref}: layer {n + 1} of {len(self.image.layers)} ({desc.digest}) "
                                 f"decompresses to {index['diff_id']}, but the image config lists diff_id "
                                 f"{self._diff_ids[desc.digest]}; the base is corrupt or hostile: refused")
        return index

    def _index(self, desc: Descriptor, wanted: set[str]) -> dict:
        index = self.cache.index(desc)
        missing = {p for p in wanted if index is None or
                   (p in index["entries"] and index["entries"][p][0] == "file" and
                    not self.cache.has_content(index["files"].get(p, "-")))}
        if index is not None and not missing:
            return self._checked(desc, index)
        fresh, found = scan_layer(self.registry, self.image.ref.repository, desc, missing or set(), self.cache,
                                  self.keep if index is None else ())
        if index is not None:
            fresh["files"] = {k: v for k, v in index["files"].items() if self.cache.has_content(v)}
        fresh["files"].update(found)
        self.cache.save_index(desc, fresh)
        return self._checked(desc, fresh)

    def check_layers(self) -> None:
        """Every layer decompresses to the diff_id its config lists. Once per image: the view keeps
        the diff_ids it checked (the image's digest fixes its config, so they cannot change)."""
        if self.view.get("diff_ids") == self.diff_ids:
            return
        for desc in self.image.layers:
            self._index(desc, set())
        self.view["diff_ids"] = self.diff_ids
        self.cache.save_view(self.image.manifest_digest, self.view)

    def prefetch(self) -> None:
        """Index every layer that has no cached index yet, in parallel processes (largest first):
        fetching, hashing, decompressing and parsing a tar overlap across layers and cores, and
        each worker leaves its index and kept files in the cache. With `keep` naming every file the
        caller will read, each layer is streamed once."""
        todo = sorted((d for d in self.image.layers if not self.cache.has_index(d)), key=lambda d: -d.size)
        if len(todo) < 2:
            return
        jobs = [(self.registry.name, self.image.ref.repository, d.to_json(), self.keep, str(self.cache.root))
                for d in todo]
        with ProcessPoolExecutor(min(len(todo), WORKERS), mp_context=multiprocessing.get_context("fork")) \
                as pool:
            for desc, (downloads, index) in zip(todo, pool.map(_index_into_cache, jobs)):
                self.cache.downloads += downloads
                self.cache.remember(desc, self._checked(desc, index))

    def _sorted_paths(self, desc: Descriptor, index: dict) -> list[str]:
        """The index's paths in order (once per index and process): a glob bisects to its prefix."""
        known = self._sorted.get(desc.digest)
        if known is None or known[0] is not index:
            known = self._sorted[desc.digest] = (index, sorted(index["entries"]))
        return known[1]

    def _locate(self, path: str) -> tuple[Descriptor, list] | None:
        """Top-down: the first layer that holds `path` or hides it decides."""
        for desc in reversed(self.image.layers):
            index = self._index(desc, set())
            if path in index["entries"]:
                return desc, index["entries"][path]
            if _hidden_by(index, path):
                return None
        return None

    @property
    def view(self) -> dict:
        if self._view is None:
            self._view = self.cache.view(self.image.manifest_digest)
        return self._view

    def _from_view(self, path: str) -> BaseFile | None | bool:
        """The view's answer for `path` (None: absent), or False where it has none or the file's
        cached bytes are gone or bad."""
        if path not in self.view["paths"]:
            return False
        entry = self.view["paths"][path]
        if entry is None:
            return None
        layer, kind, mode, size, link, sha = entry
        data = self.cache.content(sha) if sha else None
        if kind in ("file", "hardlink") and data is None:
            return False
        return BaseFile(path, kind, mode, size, link, layer, sha, data)

    def read(self, paths: Iterable[str]) -> dict[str, BaseFile | None]:
        """Resolve each path (from the view when it knows it, else through the layers); regular
        files come back with their bytes, checked against their sha256."""
        out, unknown = {}, set()
        for p in {normalize(p) for p in paths}:
            known = self._from_view(p)
            if known is False:
                unknown.add(p)
            else:
                out[p] = known
        if unknown:
            found = self._read_layers(unknown)
            for p, f in found.items():
                if f is None or f.kind not in ("file", "hardlink") or f.data is not None:
                    self.view["paths"][p] = None if f is None else [f.layer, f.kind, f.mode, f.size, f.linkname,
                                                                     f.sha256]
            self.cache.save_view(self.image.manifest_digest, self.view)
            out.update(found)
        return {p: out[p] for p in sorted(out)}

    def _read_layers(self, wanted: set[str]) -> dict[str, BaseFile | None]:
        located = {p: self._locate(p) for p in wanted}
        for _ in range(2):  # a hardlink's target is fetched in a second pass
            by_layer: dict[Descriptor, set[str]] = {}
            for p, hit in located.items():
                if hit and hit[1][0] in ("file", "hardlink"):
                    target = p if hit[1][0] == "file" else hit[1][3]
                    by_layer.setdefault(hit[0], set()).add(target)
            for desc, want in by_layer.items():
                self._index(desc, want)
        out = {}
        for p in sorted(wanted):
            hit = located[p]
            if hit is None:
                out[p] = None
                continue
            desc, (kind, size, mode, link) = hit
            source = link if kind == "hardlink" else p
            index = self._index(desc, {source} if kind in ("file", "hardlink") else set())
            sha = index["files"].get(source) if kind in ("file", "hardlink") else None
            data = self.cache.content(sha) if sha else None
            if sha and data is None:  # dropped as corrupt just now: stream the layer again
                sha = self._index(desc, {source})["files"].get(source)
                data = self.cache.content(sha) if sha else None
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
        hidden_indexes = []
        matches = re.compile(fnmatch.translate(pattern)).match
        prefix = re.split(r"[*?\[]", pattern, maxsplit=1)[0]  # only paths under it can match
        for desc in reversed(self.image.layers):
            index = self._index(desc, set())
            paths = self._sorted_paths(desc, index)
            for path in itertools.takewhile(lambda p: p.startswith(prefix),
                                            itertools.islice(paths, bisect.bisect_left(paths, prefix), None)):
                if path not in present and matches(path) and \
                        not any(_hidden_by(h, path) or path in h["whiteouts"] for h in hidden_indexes):
                    present[path] = True
            hidden_indexes.append(index)
        return sorted(present)


def _atomic_write(path: Path, data: bytes) -> None:
    try:
        atomic_write(path, data)
    except OSError as e:
        raise EnvironmentProblem(f"cannot write {path}: {e.strerror}; free space or set BAKERY_CACHE") from None
