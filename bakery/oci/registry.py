"""OCI distribution API client: every blob read is checked against its digest."""

from __future__ import annotations

import hashlib
import json
import re
import time
import urllib.parse
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

from .. import untrusted
from ..errors import PARSE_ERRORS, IntegrityError, NotFound, RegistryError, TransientError
from ..files import atomic_file, atomic_write
from ..project import cache_dir
from .http import ConnectionFailed
from .progress import Progress
from .refs import Descriptor, Digest, Reference
from .transport import DOCUMENT_LIMIT, QUOTED_LIMIT, Transport, backoff

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
MANIFEST_TYPES = (OCI_MANIFEST, DOCKER_MANIFEST)
ACCEPT = ", ".join(MANIFEST_TYPES + INDEX_TYPES)

CHUNK = 1 << 20
MONOLITHIC_LIMIT = 8 << 20  # larger blobs go up in PATCH chunks
UPLOAD_CHUNK = 32 << 20
UPLOAD_SESSIONS = 3  # a session that fails transiently is cancelled and started over
RESUMES = 4  # a blob's transfer that breaks off is resumed where it stopped, this many times
CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20}|\*)")


def pull(repo: str) -> tuple[str, ...]:
    return (f"repository:{repo}:pull",)


def push(repo: str, *also_pull: str) -> tuple[str, ...]:
    return (f"repository:{repo}:pull,push",) + tuple(f"repository:{r}:pull" for r in also_pull)


class Registry:
    """One registry host. Repositories are passed per call; the transport is shared."""

    def __init__(self, registry: str, transport: Transport | None = None):
        self.name = registry
        self.transport = transport or Transport(registry)

    # -- manifests -----------------------------------------------------------------------
    def get_manifest(self, ref: Reference, cached: bool = False) -> tuple[bytes, str, Digest]:
        """Fetch a manifest or index by tag or digest; a digest reference is verified. With `cached`,
        a digest reference read from this registry and repository before, and verified then, is
        answered from this machine's copy, verified again (its bytes are what the digest names)."""
        kept = _kept_path("manifests", self.name, ref.repository, ref.digest) if cached and ref.digest else None
        if kept is not None and ref.digest is not None:
            body = _read_kept(kept, ref.digest, None)
            media_type = _own_media_type(body) if body is not None else None
            if body is not None and media_type:
                return body, media_type, ref.digest
        where = str(ref.digest or ref.tag or "latest")
        resp = self.transport.request("GET", f"/v2/{ref.repository}/manifests/{where}",
                                      scopes=pull(ref.repository), headers={"Accept": ACCEPT}, ok=(200, 404))
        if resp.status_code == 404:
            raise NotFound(f"manifest {ref} not found on {self.name}: check the name and digest, "
                           f"or mirror it with `invoke mirror`")
        body = resp.content
        digest = Digest.of(body)
        if ref.digest and digest != ref.digest:
            raise IntegrityError(f"manifest {ref}: registry returned bytes with digest {digest}, "
                                 f"expected {ref.digest}; the registry or a proxy is serving wrong content")
        echoed = resp.headers.get("Docker-Content-Digest")
        if echoed and echoed != str(digest):
            raise IntegrityError(f"manifest {ref}: {self.name} says its digest is {_quoted(echoed)}, but the bytes it sent are "
                                 f"{digest}; the registry or a proxy lies about the digest: nothing kept")
        media_type = resp.headers.get("Content-Type", "").split(";")[0].strip()
        try:
            said = json.loads(body).get("mediaType")
            media_type = said if isinstance(said, str) and said else media_type
        except PARSE_ERRORS:  # not JSON, JSON that is not an object, or nested past Python's recursion
            raise IntegrityError(f"manifest {ref} is not a JSON object") from None
        if kept is not None and _own_media_type(body):  # its bytes say all the answer holds
            keep_verified(kept, body)
        return body, media_type, digest

    def manifest_is(self, repo: str, reference: str, digest: Digest) -> bool:
        """Does REPO:reference (a tag or digest) already name exactly the manifest `digest`? One
        HEAD; a registry that does not echo the digest says no (the caller pushes)."""
        resp = self.transport.request("HEAD", f"/v2/{repo}/manifests/{reference}", scopes=pull(repo),
                                      headers={"Accept": ACCEPT}, ok=(200, 404))
        return resp.status_code == 200 and resp.headers.get("Docker-Content-Digest") == str(digest)

    def manifest_exists(self, repo: str, digest: Digest) -> bool:
        resp = self.transport.request("HEAD", f"/v2/{repo}/manifests/{digest}", scopes=pull(repo),
                                      headers={"Accept": ACCEPT}, ok=(200, 404))
        return resp.status_code == 200

    def put_manifest(self, repo: str, reference: str, body: bytes, media_type: str,
                     also_pull: tuple[str, ...] = ()) -> Digest:
        """PUT a manifest under a tag or its digest; call only after every blob it names exists."""
        digest = Digest.of(body)
        resp = self.transport.request("PUT", f"/v2/{repo}/manifests/{reference}", scopes=push(repo, *also_pull),
                                      headers={"Content-Type": media_type}, body=body, ok=(201, 202))
        echoed = resp.headers.get("Docker-Content-Digest")
        if echoed and echoed != str(digest):
            raise IntegrityError(f"registry stored manifest as {_quoted(echoed)}, we sent {digest}")
        return digest

    def delete_manifest(self, repo: str, digest: Digest) -> bool:
        """DELETE REPO@digest (and with it every tag naming it); False where it was already gone. A
        registry that refuses deletes is one error saying so."""
        resp = self.transport.request("DELETE", f"/v2/{repo}/manifests/{digest}", scopes=push(repo),
                                      ok=(200, 202, 404, 405))
        if resp.status_code == 405:
            raise RegistryError(f"{self.name}/{repo} refuses deletes (HTTP 405): allow them (docker-registry: "
                                f"storage.delete.enabled, or REGISTRY_STORAGE_DELETE_ENABLED=true; GHCR deletes "
                                f"package versions through GitHub's API instead)")
        return resp.status_code != 404

    # -- blobs ---------------------------------------------------------------------------
    def blob_exists(self, repo: str, digest: Digest) -> bool:
        resp = self.transport.request("HEAD", f"/v2/{repo}/blobs/{digest}", scopes=pull(repo), ok=(200, 404))
        return resp.status_code == 200

    def stream_blob(self, repo: str, desc: Descriptor, label: str | None = None) -> Generator[bytes, None, None]:
        """Yield a blob's bytes; raise IntegrityError at the end if digest or size is wrong. A transfer
        that breaks off is resumed where it stopped (a Range request; a registry that answers with
        the whole blob has what we hold skipped), at most RESUMES times: the digest, checked over
        every byte yielded, is what makes the joined pieces trustworthy, not the registry's word."""
        path = f"/v2/{repo}/blobs/{desc.digest}"
        hasher, size, resumed = hashlib.sha256(), 0, 0
        progress = Progress(label or f"{self.name}/{repo} {desc.digest.hex[:12]}", desc.size)
        try:
            while True:
                resp = self.transport.request("GET", path, scopes=pull(repo), stream=True, ok=(200, 206, 404),
                                              headers={"Range": f"bytes={size}-"} if size else None)
                try:
                    if resp.status_code == 404:
                        raise NotFound(f"blob {desc.digest} not found in {self.name}/{repo}")
                    skip = _bytes_to_skip(resp.status_code, resp.headers.get("Content-Range"), size,
                                          f"{self.name}/{repo} {desc.digest}")
                    for chunk in resp.iter_content(CHUNK):
                        if skip:
                            chunk, skip = chunk[skip:], max(0, skip - len(chunk))
                            if not chunk:
                                continue
                        hasher.update(chunk)
                        size += len(chunk)
                        if size > desc.size:  # never read past what the descriptor promises
                            break
                        progress.update(len(chunk))
                        yield chunk
                    break
                except ConnectionFailed as e:
                    if size >= desc.size:
                        break  # all it promised came: the digest says whether it is the blob
                    if resumed == RESUMES:
                        raise TransientError(
                            f"blob {desc.digest} from {self.name}/{repo}: the transfer broke off after {size} of "
                            f"{desc.size} bytes ({e}), {RESUMES} times resumed; retry") from None
                    resumed += 1
                    time.sleep(backoff(resumed - 1))
                finally:
                    resp.close()
        finally:
            progress.close()
        check_digest(desc, hasher.hexdigest(), size, f"{self.name}/{repo}")

    def fetch_blob(self, repo: str, desc: Descriptor) -> bytes:
        return b"".join(self.stream_blob(repo, desc))

    def fetch_document(self, repo: str, desc: Descriptor, what: str, cached: bool = False) -> bytes:
        """A config, signature payload or envelope: refused before any byte is read when its
        descriptor claims more than 4 MiB (a document, unlike a layer, is read whole into memory).
        With `cached`, one read from this registry and repository before (and verified then) is
        answered from this machine's copy, verified again against the descriptor."""
        check_document_size(desc, what)
        kept = _kept_path("documents", self.name, repo, desc.digest) if cached else None
        if kept is not None:
            data = _read_kept(kept, desc.digest, desc.size)
            if data is not None:
                return data
        data = self.fetch_blob(repo, desc)  # checked against the descriptor
        if kept is not None:
            keep_verified(kept, data)
        return data

    def download_blob(self, repo: str, desc: Descriptor, dest: Path) -> Path:
        """Download to a temporary file beside dest, then rename: dest is whole or absent."""
        with atomic_file(dest) as out:
            for chunk in self.stream_blob(repo, desc):
                out.write(chunk)
        return dest

    def mount_blob(self, repo: str, digest: Digest, from_repo: str) -> bool:
        """Ask the registry to link a blob from another repository; True if it did."""
        try:
            resp = self.transport.request("POST", f"/v2/{repo}/blobs/uploads/?mount={digest}&from={from_repo}",
                                          scopes=push(repo, from_repo), ok=(201, 202))
        except TransientError:  # a POST is not resent; the upload that follows starts afresh (and finds
            return False  # the blob there, if the mount took and only its answer was lost)
        if resp.status_code == 201:
            return True
        self._cancel(resp, repo)  # the registry opened an upload instead; we upload ourselves
        return False

    def upload_blob(self, repo: str, desc: Descriptor, open_source: Callable[[], Iterator[bytes]]) -> None:
        """Upload a blob unless present: one PUT when small, PATCH chunks when large.

        open_source returns a fresh iterator of the blob's bytes, so a failed upload can start over.
        """
        if self.blob_exists(repo, desc.digest):
            return
        for attempt in range(UPLOAD_SESSIONS):  # POST and PATCH are never resent: a failed session starts over
            try:
                return self._upload_once(repo, desc, open_source)
            except TransientError:
                if attempt + 1 == UPLOAD_SESSIONS:
                    raise
                time.sleep(0.5 * 2 ** attempt)

    def _upload_once(self, repo: str, desc: Descriptor, open_source) -> None:
        if desc.size <= MONOLITHIC_LIMIT:
            data = b"".join(open_source())
            check_digest(desc, hashlib.sha256(data).hexdigest(), len(data), "upload source")
            location = self._start_upload(repo)
            try:
                self._finish_upload(repo, desc, location, data, {"Content-Type": "application/octet-stream"})
            except BaseException:
                self._cancel_location(location, repo)
                raise
            return
        self._upload_chunked(repo, desc, open_source)

    def _upload_chunked(self, repo: str, desc: Descriptor, open_source) -> None:
        location = self._start_upload(repo)
        hasher, offset = hashlib.sha256(), 0
        progress = Progress(f"upload {repo} {desc.digest.hex[:12]}", desc.size)
        try:
            for chunk in _rechunk(open_source(), UPLOAD_CHUNK):
                hasher.update(chunk)
                end = offset + len(chunk) - 1
                resp = self.transport.request(
                    "PATCH", location, scopes=push(repo), body=chunk, ok=(202, 204),  # ggcr's registry: 204
                    headers={"Content-Type": "application/octet-stream",
                             "Content-Range": f"{offset}-{end}", "Content-Length": str(len(chunk))})
                location = _location(self.transport, resp)
                offset = end + 1
                progress.update(len(chunk))
            check_digest(desc, hasher.hexdigest(), offset, "upload source")
            self._finish_upload(repo, desc, location, b"", {"Content-Length": "0"})
        except BaseException:
            self._cancel_location(location, repo)
            raise
        finally:
            progress.close()

    def _finish_upload(self, repo: str, desc: Descriptor, location: str, data: bytes, headers: dict) -> None:
        """The upload's closing PUT, naming the digest. A PUT resent after its answer was lost finds
        the session closed (404): the blob being there then is the first PUT's doing."""
        try:
            resp = self.transport.request("PUT", _add_query(location, f"digest={desc.digest}"), scopes=push(repo),
                                          headers=headers, body=data, ok=(201,))
        except NotFound:
            if self.blob_exists(repo, desc.digest):
                return
            raise
        echoed = resp.headers.get("Docker-Content-Digest")
        if echoed and echoed != str(desc.digest):
            raise IntegrityError(f"registry stored blob as {_quoted(echoed)}, we sent {desc.digest}")

    def _start_upload(self, repo: str) -> str:
        resp = self.transport.request("POST", f"/v2/{repo}/blobs/uploads/", scopes=push(repo), ok=(202,))
        return _location(self.transport, resp)

    def _cancel(self, resp, repo: str) -> None:
        if resp.headers.get("Location"):
            self._cancel_location(_location(self.transport, resp), repo)

    def _cancel_location(self, location: str, repo: str) -> None:
        try:
            self.transport.request("DELETE", location, scopes=push(repo), ok=(204, 404, 405))
        except RegistryError:
            pass  # best effort: the registry expires abandoned uploads itself


def _bytes_to_skip(status: int, content_range: str | None, held: int, what: str) -> int:
    """How much of an answer to a Range request from `held` repeats what is held: all of it for a
    200 (a registry may ignore Range), none for a 206 that starts there; any other 206 is refused
    (it would join the wrong bytes, which only the digest at the end would catch)."""
    if status != 206:
        return held
    found = CONTENT_RANGE.fullmatch((content_range or "").strip())
    if not held or found is None or int(found.group(1)) != held:
        raise RegistryError(f"{what}: asked for the bytes from {held}, the registry answered with the range "
                            f"{untrusted.safe(content_range or 'none', limit=QUOTED_LIMIT)}")
    return 0


def _quoted(header: str) -> str:
    """A header's value in a message: the registry's text, on one line, inert, at most a few hundred
    characters (a digest is 71), so that what we say after it is still read."""
    return untrusted.safe(header, limit=QUOTED_LIMIT)


def verified_dir() -> Path:
    """Where this machine keeps what it verified (BAKERY_CACHE/verified): documents by digest and
    answers of checks, each keyed by all that decided it and checked again when read."""
    return cache_dir("verified")


def _kept_path(kind: str, registry: str, repo: str, digest: Digest) -> Path:
    """A document read by digest from one registry and repository: where its verified copy is kept."""
    where = hashlib.sha256(f"{registry}/{repo}@{digest}".encode()).hexdigest()
    return verified_dir() / kind / f"{where}.{digest.hex}"


def _read_kept(path: Path, digest: Digest, size: int | None) -> bytes | None:
    """The kept bytes, only if they are still what the digest (and size) name; else None (read again)."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if hashlib.sha256(data).hexdigest() != digest.hex or (size is not None and len(data) != size):
        return None
    return data


def _own_media_type(body: bytes) -> str | None:
    """The mediaType a manifest's own (digest-checked) bytes declare; None if they declare none."""
    try:
        found = json.loads(body).get("mediaType")
    except PARSE_ERRORS:
        return None
    return found if isinstance(found, str) and found else None


def keep_verified(path: Path, data: bytes) -> None:
    """Keep verified bytes, whole or not at all; a cache that cannot be written is skipped."""
    try:
        atomic_write(path, data)
    except OSError:
        pass


def check_document_size(desc: Descriptor, what: str) -> None:
    if desc.size > DOCUMENT_LIMIT:
        raise IntegrityError(f"{what} ({desc.digest}) claims {desc.size} bytes, over the {DOCUMENT_LIMIT}-byte limit "
                             f"for a document; refused without reading it (the registry or image is hostile)")


def check_digest(desc: Descriptor, hexdigest: str, size: int, where: str) -> None:
    if hexdigest != desc.digest.hex or size != desc.size:
        raise IntegrityError(
            f"blob from {where} does not match its descriptor: expected {desc.digest} ({desc.size} bytes), "
            f"got sha256:{hexdigest} ({size} bytes); nothing was kept. Retry; if it persists the source is corrupt")


def _location(transport: Transport, resp) -> str:
    """Where an upload continues: the Location header, made absolute."""
    location = resp.headers.get("Location")
    if not location:
        raise RegistryError(f"{transport.registry} answered an upload step without a Location header: it is not a "
                            f"distribution registry, or it is broken")
    try:
        return urllib.parse.urljoin(resp.url or transport.base, location)
    except ValueError:
        raise RegistryError(f"{transport.registry} answered an upload step with an unreadable Location "
                            f"{location[:100]!r}") from None


def _add_query(url: str, query: str) -> str:
    return url + ("&" if "?" in url else "?") + query


def _rechunk(chunks: Iterator[bytes], size: int) -> Iterator[bytes]:
    buf = bytearray()
    for chunk in chunks:
        buf += chunk
        while len(buf) >= size:
            yield bytes(buf[:size])
            del buf[:size]
    if buf:
        yield bytes(buf)
