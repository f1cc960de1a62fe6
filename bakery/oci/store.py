"""Where an image and its signatures live: a registry repository or an OCI layout directory.

Both read every blob and manifest through a digest check; attest and verify use only this.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

from ..errors import EnvironmentProblem, InputError, IntegrityError, NotFound, malformed
from ..files import atomic_file
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


class LayoutStore:
    """An OCI image layout; tags are index.json entries named by org.opencontainers.image.ref.name."""

    def __init__(self, path: Path, create: bool = False):
        self.path = Path(path)
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
        with malformed(f"{self.path / 'index.json'}"):
            return json.loads(self._read_document(self.path / "index.json", "index"))

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
        index = self._index()
        index["manifests"] = [m for m in index["manifests"] if (m.get("annotations") or {}).get(REF_NAME) != tag]
        index["manifests"].append(Descriptor(media_type, desc.digest, desc.size, {REF_NAME: tag}).to_json())
        index.setdefault("mediaType", OCI_INDEX)
        write_blob(self.path / "index.json", json.dumps(index, sort_keys=True, indent=1).encode())
        return desc.digest

    def put_index(self, tag: str, body: bytes) -> Digest:
        return self.put_manifest(tag, body, OCI_INDEX)


def open_store(ref: Reference, layout: Path | None):
    return LayoutStore(layout) if layout else RegistryStore(ref)
