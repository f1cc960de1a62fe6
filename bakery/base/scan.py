"""Streaming one base layer once: fetch and digest, decompress and diff_id, read it as the engine's
tar reader would, and keep what is wanted; whiteouts and paths normalised as the engine applies them."""

from __future__ import annotations

import fnmatch
import gc
import gzip
import hashlib
import io
import itertools
import queue
import re
import sys
import tarfile
import threading
import zlib
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..errors import InputError, IntegrityError
from ..oci.refs import Descriptor
from ..oci.tarscan import TarError, TarReader
from .layercache import LayerCache, Staged

if TYPE_CHECKING:  # zstandard is imported only for a zstd layer
    from zstandard import ZstdDecompressionReader

WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
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
    import zstandard  # only a zstd layer pays for it

    source = _Pieces(lambda: next(pieces, b""))
    reader = zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True)  # type: ignore[arg-type]  # reads only read(n)
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

    def __init__(self, chunks: Generator[bytes, None, None], decode):
        self.chunks, self.decode = chunks, decode
        self.hasher = hashlib.sha256()
        self.compressed: queue.Queue[object] = queue.Queue(DEPTH)  # chunks, then _END or _Failed
        self.decoded: queue.Queue[object] = queue.Queue(DEPTH)
        self.fetch_error: BaseException | None = None
        self.last: object = None  # _END or _Failed, once the caller has taken it
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
            assert isinstance(item, bytes)  # all else the fetch puts is _END or _Failed
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
            assert self.fetch_error is not None  # kept before the fetch put its _Failed
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
        assert isinstance(item, bytes)  # _decode puts pieces, _END or _Failed
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


def decompressed(media_type: str, raw) -> io.IOBase | ZstdDecompressionReader:
    if "zstd" in media_type:
        import zstandard

        return zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
    if media_type.endswith(("gzip", "+gzip")):
        return gzip.GzipFile(fileobj=raw)
    if media_type.endswith(("tar", ".tar")):
        return raw
    raise InputError(f"unsupported layer media type {media_type!r}")


class Scanned(NamedTuple):
    """What one pass over a layer gave: its index, {path: sha256} of the files kept in the cache,
    and {path: blob name} of those the sink took (a toolchain's files, base/extract.py)."""
    index: dict  # type: ignore[assignment]  # the field hides tuple.index, which nothing calls
    found: dict[str, str]
    taken: dict[str, str]


class BlobSource(Protocol):
    """What a layer is read from: a Registry, or anything that streams a blob as it does."""

    def stream_blob(self, repo: str, desc: Descriptor, label: str | None = None) -> Generator[bytes, None, None]: ...


def scan_layer(registry: BlobSource, repo: str, desc: Descriptor, wanted: set[str],
               cache: LayerCache, keep: tuple[str, ...] = (), sink=None, budget: KeptBudget | None = None) -> Scanned:
    """Stream one layer: list everything in it, keep the contents of `wanted` regular files
    and of those matching a `keep` pattern (files known to be needed later, e.g. dist-info), and
    hand the regular files `sink` wants to it (base/extract.py's Sink).

    Nothing is recorded in the cache until the layer's digest has been checked, so a corrupt
    download leaves no trace. Members are read by tarscan, as the engine will unpack them; a layer
    it cannot read that way, or that the engines would unpack differently (_Layer), refuses the base.
    """
    cache.downloads += 1
    with cache.staged() as staged:  # kept files reach the cache once the digest holds
        return _scan(registry, repo, desc, wanted, staged, keep, sink, budget)


def _scan(registry: BlobSource, repo: str, desc: Descriptor, wanted: set[str], staged: Staged,
          keep: tuple[str, ...], sink, budget: KeptBudget | None = None) -> Scanned:
    import zstandard  # a layer is streamed: what the warm path never needs

    decode = _decoder(desc.media_type)
    layer = _Layer(wanted, re.compile("|".join(f"(?:{fnmatch.translate(k)})" for k in keep)) if keep else None,
                   staged, sink, budget)
    pipe = _LayerPipe(registry.stream_blob(repo, desc, label=f"layer {desc.digest.hex[:12]}"), decode)
    # While the tar reader runs Python, a stage coming back from zlib or hashlib waits for the GIL
    # up to the switch interval, for each piece: 5 ms would stall it longer than the work itself.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(min(interval, SWITCH_S))
    try:
        reader = TarReader(pipe.stream)
        for member in reader:
            layer.take(member, reader)
        diff_id = pipe.finish()
        layer.finish()
    except Ambiguous as e:
        pipe.abandon(e)
        raise IntegrityError(f"layer {desc.digest} of {repo}: {e}: no image builder writes it, and the engines "
                             f"may unpack it apart or fail on it; the base is refused") from None
    except TooLarge as e:
        pipe.abandon(e)
        raise IntegrityError(f"layer {desc.digest} of {repo}: {e}; the base is refused") from None
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
    staged.commit()
    index = {"entries": layer.entries, "whiteouts": sorted(layer.whiteouts), "opaque": sorted(layer.opaque),
             "late": sorted(layer.late),
             "files": {}, "diff_id": diff_id}
    return Scanned(index, layer.found, layer.taken)


class KeptBudget:
    """What a base's layers may still keep in the cache, together: charged by each file kept, before
    it is read, in whichever process scans its layer (the processes share it: a pool forked after it
    was made), so no layer keeps past it however far the others have run."""

    def __init__(self, limit: int, spent: int = 0):
        import multiprocessing

        self.limit = limit
        self.left = multiprocessing.get_context("fork").Value("q", limit - spent)

    def charge(self, size: int) -> bool:
        with self.left.get_lock():
            if size > self.left.value:
                self.left.value = -1  # the base is refused: every later file too
                return False
            self.left.value -= size
            return True


_budget: KeptBudget | None = None  # a pool worker's, from share_budget


def share_budget(budget: KeptBudget | None) -> None:
    """A pool worker's initializer: the base's budget, inherited (a forked process's memory), and
    the cyclic collector on, which a build turns off in its own process (a worker streams layer
    after layer, each leaving a little for it)."""
    global _budget
    _budget = budget
    gc.enable()


def index_into_cache(job) -> tuple[int, dict, dict]:
    """In a worker process: stream one layer, record its index and kept files in the cache, and
    hand the index back (unpickling it beats parsing the JSON again), with what the sink took."""
    from ..oci.registry import Registry

    registry, repo, desc, keep, root, sink = job
    desc = Descriptor.from_json(desc)
    cache = LayerCache(Path(root))
    index, found, taken = scan_layer(Registry(registry), repo, desc, set(), cache, keep, sink, _budget)
    index["files"].update(found)
    cache.save_index(desc, index)
    return cache.downloads, index, taken


KEPT_LIMIT = 256 << 20
# what one layer's kept files may add up to: a ROCm base keeps tens of MiB (copyright texts, dist-info
# METADATA and RECORD); a hostile layer of thousands of 256 MiB files of zeros compresses to almost
# nothing and would fill the cache's disk to its reserve
KEPT_BYTES_LIMIT = 512 << 20  # (and the base's together: filesystem.IMAGE_KEPT_LIMIT)
# what a path may be: Linux's PATH_MAX and NAME_MAX (an engine fails past them), and a depth no image
# has (each folder is a level of the walks that make and remove a toolchain's files)
NAME_BYTES, COMPONENT_BYTES, DEPTH = 4096, 255, 256
# layers streamed at once: all of a base (up to this), since which layer costs most is not known
# before it is read (a small blob of many small files costs more than a big one of few)
WORKERS = 8


# what one layer's index may hold: a ROCm base's largest layer names a few hundred thousand entries;
# a hostile one of tens of millions (their tar headers compress to almost nothing) would exhaust memory
ENTRIES_LIMIT = 2_000_000  # entries, whiteouts and opaque markers of one layer
NAMES_LIMIT = 256 << 20  # characters of their names and link targets (a long name may be 1 MiB)


class TooLarge(Exception):
    """A layer past what one index may hold."""


class Ambiguous(Exception):
    """A layer the engines would unpack differently from one another (or from what we read), or
    that does what no image builder writes: a name twice, a write through a link, a whiteout of
    what the layer itself adds, a hard link to what the layer does not hold."""


def clean(name: str) -> str:
    """A member's name as the engines clean it (Go's path.Clean, relative to the root): no leading
    '/', no '.' or empty parts, '..' taken back lexically. '' is the root itself. A name that climbs
    out of the root is one containerd keeps inside and Docker refuses: Ambiguous."""
    if name and name[0] not in "./" and name[-1] != "/" and "//" not in name and "/." not in name:
        return name  # already clean: most members
    parts: list[str] = []
    for part in name.split("/"):
        if part == "..":
            if not parts:
                raise Ambiguous(f"{name!r} climbs out of the root")
            parts.pop()
        elif part and part != ".":
            parts.append(part)
    return "/".join(parts)


class _Layer:
    """One layer's members as they stream: its index, the files kept in the cache or taken by the
    sink, and the checks that need this layer alone. After them, in an accepted layer no name is
    given twice, nothing is written under what the layer makes a link or a file, nothing it whites
    out is also given, and each hard link names a file the layer gave before it: then the order of
    its members no longer matters, and every engine unpacks it alike (what lower layers hold is
    checked across layers, by the filesystem)."""

    def __init__(self, wanted: set[str], keep, staged: Staged, sink, budget: KeptBudget | None = None):
        self.wanted, self.keep, self.staged, self.sink, self.budget = wanted, keep, staged, sink, budget
        self.entries: dict[str, list] = {}
        self.whiteouts: list[str] = []
        self.opaque: list[str] = []
        self.found: dict[str, str] = {}
        self.taken: dict[str, str] = {}
        self.named: set[str] = set()  # every path the layer names, entries and whiteouts alike
        self.characters = 0  # of the names and link targets it gives
        self.kept_bytes = 0  # of the files it keeps, as their headers say before they are read
        self.above: set[str] = set()  # the folders every name so far lies in
        self.late: list[str] = []  # folders it gives after a name under them

    def _name(self, path: str, what: str) -> None:
        if path in self.named:
            raise Ambiguous(f"it names {path!r} twice (the second time as {what})")
        self.named.add(path)

    def take(self, member, reader) -> None:
        """Record one member: a whiteout, an opaque marker, or an entry (kept or taken if wanted)."""
        path = clean(member.name)
        if not path:
            return  # the root folder itself: its metadata, which no engine applies to the root
        self.characters += len(path) + len(member.linkname)
        if len(self.named) >= ENTRIES_LIMIT or self.characters > NAMES_LIMIT:
            raise TooLarge(f"it names more than {ENTRIES_LIMIT:,} entries or {NAMES_LIMIT >> 20} MiB of names, "
                           f"past what one layer's index may hold")
        if len(path) > COMPONENT_BYTES and (len(path.encode("utf-8", "surrogateescape")) > NAME_BYTES or
                                           path.count("/") >= DEPTH or
                                           max(len(c.encode("utf-8", "surrogateescape")) for c in path.split("/"))
                                           > COMPONENT_BYTES):
            raise Ambiguous(f"it names {path[:80]!r}... ({len(path)} characters), past what a Linux path may be "
                            f"({NAME_BYTES} bytes, {COMPONENT_BYTES} a name, {DEPTH} folders deep)")
        parent, _, name = path.rpartition("/")
        if member.type == tarfile.DIRTYPE and path in self.above:
            # an engine that applies in order writes what came before through whatever the folder
            # replaces (a lower layer's link, say): check_merge looks below it as if it were not given
            self.late.append(path)
        folder = parent
        while folder and folder not in self.above:
            self.above.add(folder)
            folder = folder.rpartition("/")[0]
        if WHITEOUT + WHITEOUT in parent and any(p.startswith(WHITEOUT + WHITEOUT) for p in parent.split("/")):
            raise Ambiguous(f"it holds {path!r}, under an AUFS metadata folder")
        if name.startswith(WHITEOUT):
            if name == OPAQUE:
                if not parent:  # overlayfs ignores it on a layer's root, a naive applier empties the root
                    raise Ambiguous(f"it holds {path!r}, an opaque marker on the root itself")
                self._name(path, "an opaque marker")
                self.opaque.append(parent)
                return
            if name.startswith(WHITEOUT + WHITEOUT):  # AUFS's own folders: each engine does its own thing
                raise Ambiguous(f"it holds {path!r}, an AUFS metadata name")
            if name[len(WHITEOUT):] in ("", ".", ".."):  # a whiteout of the folder it is in, or of the one above
                raise Ambiguous(f"it holds {path!r}, a whiteout of no name")
            gone = f"{parent}/{name[len(WHITEOUT):]}" if parent else name[len(WHITEOUT):]
            self._name(gone, "a whiteout")
            self.whiteouts.append(gone)
            return
        self._name(path, "an entry")
        kind = _KIND.get(member.type, "other")
        link = member.linkname
        if kind == "hardlink":
            link = clean(link)
            target = self.entries.get(link)
            if target is None or target[0] not in ("file", "hardlink"):
                raise Ambiguous(f"{path!r} is a hard link to {link!r}, which is not a file this layer gave before it")
            if target[0] == "hardlink":  # the same inode: named by the file itself, so no chain is walked later
                link = target[3]
        self.entries[path] = [kind, member.size, member.mode, link]
        if kind != "file":
            return
        keep = path in self.wanted or (self.keep is not None and self.keep.match(path))
        take = self.sink is not None and self.sink.wants(path)
        if keep and member.size > KEPT_LIMIT:  # kept files are sources and METADATA: read whole, so capped
            raise TarError(f"{path} is {member.size} bytes, past the {KEPT_LIMIT} a file we read may be")
        if keep:
            self.kept_bytes += member.size
            if self.kept_bytes > KEPT_BYTES_LIMIT:
                raise TooLarge(f"the files it keeps (copyright texts, package metadata, sources) add up to more "
                               f"than {KEPT_BYTES_LIMIT >> 20} MiB, past what one layer's pass may stage")
            if self.budget is not None and not self.budget.charge(member.size):
                raise TooLarge(f"the files the base's layers keep add up to more than {self.budget.limit >> 20} MiB "
                               f"together, past what bakery keeps for one image")
            data = reader.read_data(member)
            self.found[path] = self.staged.store(data)
            if take:
                self.taken[path] = self.sink.store(iter([data]), member.size, member.mode)
        elif take:
            self.taken[path] = self.sink.store(reader.data(member), member.size, member.mode)

    def finish(self) -> None:
        """The checks that need the whole layer: nothing under a file or link it gives, nothing
        under or at what it whites out (the same name twice is refused as it comes)."""
        below = folders_above(self.entries, self.whiteouts, self.opaque)
        for path in sorted(below):
            entry = self.entries.get(path)
            if entry is not None and entry[0] != "dir":
                under = "a link" if entry[0] in ("symlink", "hardlink") else "not a folder"
                raise Ambiguous(f"it writes under {path!r}, which it gives as {entry[0]} ({under})")
        for gone in self.whiteouts:
            if gone in below:
                raise Ambiguous(f"it whites out {gone!r} and gives what lies under it")


def folders_above(entries, whiteouts, opaque) -> set[str]:
    """Every folder that a layer's entries, whiteouts and opaque markers lie in (their proper
    ancestors), whether the layer gives it as an entry or not."""
    above: set[str] = set(opaque)
    for path in itertools.chain(entries, whiteouts, opaque):
        while True:
            path = path.rpartition("/")[0]
            if not path or path in above:
                break
            above.add(path)
    return above
