"""Where an image and its signatures live: a registry repository or an OCI layout directory.

Both read every blob and manifest through a digest check; attest and verify use only this.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from ..errors import EnvironmentProblem, InputError, IntegrityError, NotFound, malformed
from ..files import atomic_file, one_each
from .layer import write_blob
from .refs import Descriptor, Digest, Reference
from .registry import OCI_INDEX, OCI_MANIFEST, Registry, check_digest, check_document_size
from .transport import DOCUMENT_LIMIT

REF_NAME = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20


def signature_tag(digest: Digest, suffix: str) -> str:
    """cosign's tag scheme: sha256-<hex>.sig / .att"""
    return f"{digest.algorithm}-{digest.hex}.{suffix}"


class RegistryStore:
    def __init__(self, ref: Reference, registry: Registry | None = None):
        self.ref, self.repo = ref, ref.repository
        self.registry = registry or Registry(ref.registry)

    def manifest(self, reference: str) -> bytes | None:
        ref = Reference(self.ref.registry, self.repo, None, Digest.parse(reference)) if reference.startswith("sha256:") \
            else Reference(self.ref.registry, self.repo, reference)
        try:
            return self.registry.get_manifest(ref)[0]
        except NotFound:
            return None

    def stream(self, desc: Descriptor) -> Iterator[bytes]:
        return self.registry.stream_blob(self.repo, desc)

    def document(self, desc: Descriptor, what: str) -> bytes:
        """A small blob read whole (signature payload, envelope, config): at most 4 MiB."""
        return self.registry.fetch_document(self.repo, desc, what)

    def put_blob(self, data: bytes, media_type: str) -> Descriptor:
        desc = Descriptor.of(media_type, data)
        self.registry.upload_blob(self.repo, desc, lambda: iter([data]))
        return desc

    def put_stream(self, desc: Descriptor, open_source) -> None:
        """Store a blob from a re-openable stream of its bytes (never whole in memory)."""
        self.registry.upload_blob(self.repo, desc, open_source)

    def put_manifest(self, tag: str | None, body: bytes, media_type: str = OCI_MANIFEST) -> Digest:
        """A manifest (or index) by its digest, then under `tag` unless None."""
        digest = self.registry.put_manifest(self.repo, str(Digest.of(body)), body, media_type)
        return self.registry.put_manifest(self.repo, tag, body, media_type) if tag else digest

    def put_index(self, tag: str, body: bytes) -> Digest:
        return self.put_manifest(tag, body, OCI_INDEX)

    def locked(self, wait: bool = True):
        """A registry keeps its own order: nothing to hold here (LayoutStore.locked holds a layout)."""
        return contextlib.nullcontext(self)


class LayoutStore:
    """An OCI image layout; tags are index.json entries named by org.opencontainers.image.ref.name."""

    def __init__(self, path: Path, create: bool = False):
        self.path = Path(path)
        self._read: tuple | None = None  # index.json's (file identity, document), last read
        if create and not (self.path / "oci-layout").exists():
            if self.path.exists() and any(self.path.iterdir()):
                raise InputError(f"{self.path} exists and is not an OCI layout: choose an empty or new directory")
            write_blob(self.path / "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            write_blob(self.path / "index.json", json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX,
                                                             "manifests": []}).encode())
        if not (self.path / "oci-layout").exists():
            raise InputError(f"{self.path} is not an OCI image layout (no oci-layout file)")

    @staticmethod
    def _open(path: Path, what: str):
        """A file of the layout, opened only if it is a regular file (a layout can come from anyone:
        a link to /dev/zero or a FIFO would have us read forever)."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise IntegrityError(f"{what} {path} is not a regular file: refused")
        return os.fdopen(fd, "rb")

    def _read_document(self, path: Path, what: str) -> bytes:
        """A small file of the layout read whole: refused past 4 MiB."""
        try:
            with self._open(path, what) as f:
                data = f.read(DOCUMENT_LIMIT + 1)
        except OSError as e:
            raise IntegrityError(f"{what} {path} cannot be read ({e.strerror}): refused") from None
        if len(data) > DOCUMENT_LIMIT:
            raise IntegrityError(f"{what} {path} is over the {DOCUMENT_LIMIT}-byte limit for a document; refused")
        return data

    def _index(self) -> dict:
        """index.json, read as Go's decoder (containers/image, skopeo) would agree with: an object
        holding one key twice, or two keys that differ only in case (Go matches fields ignoring case,
        the last one winning), is refused. Read again only when the file was replaced."""
        path = self.path / "index.json"
        try:
            seen = os.stat(path)
            identity = (seen.st_ino, seen.st_mtime_ns, seen.st_size)
        except OSError:
            identity = None
        if identity is None or self._read is None or self._read[0] != identity:
            with malformed(f"{path}"):
                self._read = (identity, json.loads(self._read_document(path, "index"), object_pairs_hook=one_each))
        return self._read[1]  # read-only: a writer changes a copy (put_manifest, drop)

    def _blob_path(self, digest: Digest) -> Path:
        return self.path / "blobs" / digest.algorithm / digest.hex

    def manifest(self, reference: str) -> bytes | None:
        if reference.startswith("sha256:"):
            digest = Digest.parse(reference)
        else:
            with malformed(f"{self.path / 'index.json'}"):
                named = [m for m in self._index()["manifests"]
                         if (m.get("annotations") or {}).get(REF_NAME) == reference]
                if not named:
                    return None
                digest = Digest.parse(named[0]["digest"])
        path = self._blob_path(digest)
        if not os.path.lexists(path):
            return None
        data = self._read_document(path, "manifest")
        if Digest.of(data) != digest:
            raise IntegrityError(f"{path}: content does not match its digest {digest}")
        return data

    def stream(self, desc: Descriptor) -> Iterator[bytes]:
        """A blob in chunks (a ROCm layer is several GB); IntegrityError at the end if it is not desc."""
        try:
            f = self._open(self._blob_path(desc.digest), "blob")
        except FileNotFoundError:
            raise IntegrityError(f"blob {desc.digest} missing from layout {self.path}") from None
        except OSError as e:
            raise IntegrityError(f"blob {desc.digest} of layout {self.path} cannot be read ({e.strerror})") from None
        hasher, size = hashlib.sha256(), 0
        with f:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                hasher.update(chunk)
                size += len(chunk)
                if size > desc.size:
                    break
                yield chunk
        check_digest(desc, hasher.hexdigest(), size, str(self.path))

    def document(self, desc: Descriptor, what: str) -> bytes:
        """A small blob read whole (signature payload, envelope, config): at most 4 MiB."""
        check_document_size(desc, what)
        return b"".join(self.stream(desc))

    def put_blob(self, data: bytes, media_type: str) -> Descriptor:
        desc = Descriptor.of(media_type, data)
        write_blob(self._blob_path(desc.digest), data)
        return desc

    def put_stream(self, desc: Descriptor, open_source) -> None:
        """Write to a temporary file, check digest and size, then rename: whole or absent."""
        dest = self._blob_path(desc.digest)
        if dest.exists():
            try:
                for _ in self.stream(desc):
                    pass
                return
            except IntegrityError:
                print(f"warning: {dest} did not match its digest; writing it again", file=sys.stderr)
        with atomic_file(dest) as out:  # a source that does not match its digest leaves nothing
            hasher, size = hashlib.sha256(), 0
            for chunk in open_source():
                hasher.update(chunk)
                size += len(chunk)
                out.write(chunk)
            check_digest(desc, hasher.hexdigest(), size, "copy source")

    def put_file(self, desc: Descriptor, source: Path) -> None:
        """A blob already on this disk, checked by whoever made it (a verified cache entry, a layer
        just written): hard-linked where it can be, else copied; several GB are never read twice."""
        dest = self._blob_path(desc.digest)
        if dest.exists():  # a manifest may name one blob twice (an empty layer)
            return
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, dest)
        except OSError:
            try:
                shutil.copyfile(source, dest)
            except OSError as e:
                hint = "the disk is full" if e.errno == 28 else e.strerror
                raise EnvironmentProblem(f"writing {dest.name[:12]} to {dest.parent}: {hint}; nothing was kept") from None

    def put_manifest(self, tag: str | None, body: bytes, media_type: str = OCI_MANIFEST) -> Digest:
        """A manifest (or index) as a blob, then named `tag` in index.json unless None."""
        desc = self.put_blob(body, media_type)
        if tag is None:
            return desc.digest
        index = dict(self._index())
        index["manifests"] = [m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) != tag]
        index["manifests"].append(Descriptor(media_type, desc.digest, desc.size, {REF_NAME: tag}).to_json())
        index.setdefault("mediaType", OCI_INDEX)
        write_blob(self.path / "index.json", json.dumps(index, sort_keys=True, indent=1).encode())
        return desc.digest

    def put_index(self, tag: str, body: bytes) -> Digest:
        return self.put_manifest(tag, body, OCI_INDEX)

    # -- what prune needs: the names, a lock, and the blobs nothing kept reaches ----------------------

    def names(self) -> tuple[dict[str, Digest], set[Digest]]:
        """({name: digest} of index.json's named entries, the digests of its unnamed ones). A name
        given to two digests is refused: which one a reader takes is up to the reader (ours takes the
        first, another may take the last)."""
        named: dict[str, Digest] = {}
        unnamed: set[Digest] = set()
        with malformed(f"{self.path / 'index.json'}"):
            for entry in self._index()["manifests"]:
                notes = entry.get("annotations") or {}
                digest, name = Digest.parse(entry["digest"]), notes.get(REF_NAME) if isinstance(notes, dict) else 0
                if name is None:
                    unnamed.add(digest)
                elif not isinstance(name, str):
                    raise IntegrityError(f"{self.path}/index.json has an entry whose annotations or name are not text: "
                                         f"refused")
                elif named.setdefault(name, digest) != digest:
                    raise IntegrityError(f"{self.path}/index.json names two manifests {name!r}: readers disagree on "
                                         f"which it is; refused (remove one entry)")
        return named, unnamed

    def index_digest(self) -> Digest:
        return Digest.of(self._read_document(self.path / "index.json", "index"))

    @contextlib.contextmanager
    def locked(self, wait: bool = True):
        """The layout to ourselves while we write (a blob goes in before the entry that names it, and
        index.json is read, changed and written whole): writers wait their turn; prune (wait=False)
        is refused at once while anyone writes, rather than collect a copy's blobs."""
        try:
            fd = os.open(self.path / "oci-layout", os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as e:
            raise IntegrityError(f"{self.path}/oci-layout cannot be opened ({e.strerror}): refused") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise IntegrityError(f"{self.path}/oci-layout is not a regular file: refused")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                raise EnvironmentProblem(f"{self.path} is being written (a mirror or attest holds it): run again when "
                                         f"it is done") from None
            yield self
        finally:
            os.close(fd)

    def drop(self, digests: set[Digest], planned: Digest) -> None:
        """index.json without the entries of these digests, in one atomic write, if it is still the
        index.json the plan was made from (`planned`, its digest): a tool that takes no lock may have
        written since."""
        if not digests:
            return
        if self.index_digest() != planned:
            raise EnvironmentProblem(f"{self.path}/index.json changed since prune read it (something wrote to the "
                                     f"layout): nothing deleted; run it again")
        index = dict(self._index())
        index["manifests"] = [m for m in index["manifests"] if Digest.parse(m["digest"]) not in digests]
        write_blob(self.path / "index.json", json.dumps(index, sort_keys=True, indent=1).encode())

    def _blob_folder(self) -> int:
        """blobs/sha256 opened as the folder it is in this layout, never through a link: a layout
        can come from anyone, and what prune removes must lie in it."""
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name in ("blobs", "sha256"):
                try:
                    inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                except OSError as e:
                    raise IntegrityError(f"{self.path}: its {name} is not a folder of its own ({e.strerror}): "
                                         f"refused") from None
                os.close(fd)
                fd = inner
            return fd
        except BaseException:
            os.close(fd)
            raise

    def unreachable(self, roots: set[Digest]) -> dict[str, int]:
        """{blob file name under blobs/sha256: its size} that no root reaches, following every
        descriptor a manifest or index holds anywhere (its config, layers, manifests, blobs, ...: more
        kept is safe, less is not). A root that is no manifest, or one a kept manifest names that is
        not here, stops it (the layout is already broken; collecting would hide it). Links, folders
        and names that are no digest are left alone."""
        folder = self._blob_folder()
        try:
            present = {e.name: e.stat(follow_symlinks=False).st_size for e in os.scandir(folder)
                       if e.is_file(follow_symlinks=False) and len(e.name) == 64
                       and all(c in "0123456789abcdef" for c in e.name)}
        finally:
            os.close(folder)
        reached: set[str] = set()
        todo = [(d, True, True) for d in sorted(roots, key=str)]  # (digest, a root, needed)
        while todo:
            digest, root, needed = todo.pop()
            if digest.algorithm != "sha256":
                raise IntegrityError(f"{self.path}: a kept manifest is {digest}; only sha256 is read: nothing "
                                     f"collected")
            if digest.hex in reached or (digest.hex not in present and not needed):
                continue
            if digest.hex not in present:
                raise IntegrityError(f"{self.path} lacks {digest}, which a kept manifest needs: nothing collected")
            reached.add(digest.hex)
            if present[digest.hex] > DOCUMENT_LIMIT:
                if root:
                    raise IntegrityError(f"{self.path}: kept {digest} is past {DOCUMENT_LIMIT} bytes, no manifest: "
                                         f"nothing collected")
                continue  # a layer: it names nothing
            body = self._read_document(self._blob_path(digest), "blob")
            if Digest.of(body) != digest:
                raise IntegrityError(f"{self._blob_path(digest)} does not match its digest: nothing collected")
            todo += [(d, False, need) for d, need in _named(body, digest, root)]
        return {name: size for name, size in present.items() if name not in reached}

    def remove_blobs(self, names: list[str], log=lambda m: None) -> None:
        """Remove these files of blobs/sha256 (unreachable's names), through the folder itself."""
        folder = self._blob_folder()
        try:
            for i, name in enumerate(names, 1):
                try:
                    os.unlink(name, dir_fd=folder)
                except FileNotFoundError:
                    pass
                log(f"removed {i}/{len(names)}: {name[:12]}")
        finally:
            os.close(folder)


def _named(body: bytes, digest: Digest, root: bool) -> list[tuple[Digest, bool]]:
    """Every digest a document names in a descriptor, wherever it lies, each with whether it is
    needed (a manifest's config, layers or blobs, an index's manifests) or only kept if there (a
    subject, a digest in a config); a blob that is not JSON (a layer) names nothing. A root must be
    a manifest or index: a JSON object."""
    try:
        doc = json.loads(body, object_pairs_hook=one_each)
    except (ValueError, RecursionError):
        if root:
            raise IntegrityError(f"kept {digest} is not a manifest or index (not a JSON object with its keys once "
                                 f"each): nothing collected") from None
        return []
    if not isinstance(doc, dict):
        if root:
            raise IntegrityError(f"kept {digest} is not a manifest or index: nothing collected")
        return []
    needed = {id(d) for key in ("config", "layers", "manifests", "blobs")
              for d in ([doc[key]] if isinstance(doc.get(key), dict) else
                        doc[key] if isinstance(doc.get(key), list) else [])
              if isinstance(d, dict)}
    found, todo = [], [doc]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            value = node.get("digest")
            if isinstance(value, str) and value.startswith("sha256:"):
                try:
                    found.append((Digest.parse(value), id(node) in needed))
                except InputError:
                    pass  # not a digest: it names nothing we could keep
            todo += list(node.values())
        elif isinstance(node, list):
            todo += node
    return found


def open_store(ref: Reference, layout: Path | None):
    return LayoutStore(layout) if layout else RegistryStore(ref)
