"""What a sandboxed rebuild may ask of this machine: the pinned base's bytes and the compile.

`invoke reproduce` runs the released revision's build code in the sandbox (sandbox.py): no
network, no Docker socket, no credential. Two things of the outside that build needs come through
one Unix socket, served here by our code, bound into the sandbox:

- the base: GET or HEAD of /v2/REPO/manifests/DIGEST and /v2/REPO/blobs/DIGEST, for the base's
  registry and repository only, by digest only; fetched with this machine's credentials, which
  never cross (the code inside checks every digest itself, as it does against a registry);
- the compile: POST /bakery/compile {"toolchain", "shell"}: the shell runs as every build's
  compile does (hip_compile.run_compile: over the toolchain's own files, in the sandbox, no network, the
  sources read-only, the compile's limits), in the one toolchain this rebuild was given, over the
  revision's hip/ folder as we name it, never as the request does; the outputs come back in the
  answer (regular files, capped), so we write nothing into a folder the sandbox controls.

Anything else is refused (403). The client side (broker_client.py, used by transport.py and hip_compile.py) takes this path when the
sandbox sets BAKERY_BROKER_SOCKET.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import os
import re
import socketserver
import stat
import tempfile
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..broker_client import OUTPUTS_LIMIT, unix_name
from ..errors import BakeryError, EnvironmentProblem, IntegrityError, TransientError, foreign
from ..files import remove_tree, staging_dir
from ..oci.refs import Reference

SHELL_LIMIT = 1 << 20  # the compile script: a few KiB
OUTPUT_FILES = 64
LOG_LIMIT = 64 << 10
TMPDIR_ELSEWHERE = "give the rebuild a TMPDIR on a larger disk"  # where the broker's compile writes
COMPILES = 4  # a build compiles once; a few retries at most
CONNECTIONS = 32  # at once: the build fetches a few layers concurrently
# the distribution spec's repository grammar
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
BLOB_PATH = re.compile(rf"/v2/(?P<repo>{_COMPONENT}(?:/{_COMPONENT})*)/(?P<kind>manifests|blobs)/"
                       r"(?P<digest>sha256:[0-9a-f]{64})")


@dataclass(frozen=True)
class Grant:
    """What this rebuild may ask for: one base repository, one toolchain, one hip/ folder."""
    registry: str  # as the base reference names it
    repository: str
    toolchain: str | None
    hip: Path


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    grant: Grant
    compiles: int = 0
    closed: bool = False  # the rebuild is over: no compile may start
    over: threading.Event  # set with closed: a compile still running is stopped
    compiling: threading.Lock
    slots: threading.BoundedSemaphore
    problems: list[str]

    def server_bind(self) -> None:
        assert isinstance(self.server_address, str)  # serve() names the socket by its path
        with unix_name(self.server_address) as name:  # a long work folder's path is past AF_UNIX's limit
            self.socket.bind(name)

    def process_request(self, request, client_address) -> None:
        if not self.slots.acquire(blocking=False):  # past CONNECTIONS at once: closed, not queued
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.slots.release()


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, *args) -> None:  # the build's own log says what it fetched
        pass

    def address_string(self) -> str:
        return "sandbox"

    def do_GET(self) -> None:  # noqa: N802 (http.server's names)
        self._route("GET")

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's names)
        self._route("HEAD")

    def do_POST(self) -> None:  # noqa: N802 (http.server's names)
        self._route("POST")

    def _route(self, method: str) -> None:
        self._begun = False
        try:
            path = self.path.split("?", 1)[0]
            if method == "POST" and path == "/bakery/compile":
                self._compile()
            elif method in ("GET", "HEAD") and path == "/v2/":
                self._answer(200, b"{}")
            elif method in ("GET", "HEAD") and (found := BLOB_PATH.fullmatch(path)) and self._granted(found):
                self._relay(method, path, found.group("repo"))
            else:
                self._answer(403, f"not granted to a rebuild: {method} {path[:200]}".encode())
        except TransientError as e:  # the code inside retries it, as it would the registry's 5xx
            self._answer(502, str(e).encode())
        except BakeryError as e:  # a refusal (a redirect not followed, a login missing): the same each time
            self._refuse(e)
        except Exception as e:  # a bug of ours, or the machine (a full disk): one answer, not a dropped connection
            if isinstance(problem := foreign(e), EnvironmentProblem):
                self._refuse(problem)
            elif getattr(self, "_begun", False):  # an answer under way takes nothing more (it would read as its bytes)
                self.close_connection = True
            else:
                self._answer(502, f"the broker failed: {type(e).__name__}: {str(e)[:300]}".encode())

    def _refuse(self, e: BakeryError) -> None:
        if isinstance(e, EnvironmentProblem):  # this machine's (a full disk): the rebuild says it as its own error
            self.server.problems.append(str(e))
        if getattr(self, "_begun", False):
            self.close_connection = True
        else:
            self._answer(403, str(e).encode())

    def _granted(self, found: re.Match) -> bool:
        from ..oci.transport import api_host

        grant = self.server.grant
        host = self.headers.get("Host", "")
        return host == api_host(grant.registry) and found.group("repo") == grant.repository

    def _relay(self, method: str, path: str, repo: str) -> None:
        """The registry's answer for one digest, streamed; the sandbox verifies the bytes."""
        from ..oci.registry import ACCEPT, Registry, pull

        registry = Registry(self.server.grant.registry)
        # identity: the bytes relayed are the bytes the Content-Length and the digest speak of
        resp = registry.transport.request(method, path, scopes=pull(repo), ok=(200, 404), stream=True,
                                          headers={"Accept": ACCEPT, "Accept-Encoding": "identity"})
        with resp:
            self._begun = True
            self.send_response(resp.status_code)
            # the bytes as the registry sent them, with what frames them: encoded or not, the code
            # inside decodes and checks them as it would from the registry
            for name in ("Content-Type", "Content-Length", "Content-Encoding", "Docker-Content-Digest"):
                if name in resp.headers:
                    self.send_header(name, resp.headers[name])
            if "Content-Length" not in resp.headers:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if method == "GET":
                try:
                    for chunk in resp.iter_content(1 << 20):
                        self.wfile.write(chunk)
                except BakeryError:
                    # the answer has begun: nothing more may be written into it (a 502 would be read as
                    # the blob's bytes); the connection ends short, which the code inside sees as such
                    self.close_connection = True

    def _compile(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 < length <= SHELL_LIMIT:
            return self._answer(413, b"a compile request is a small JSON document")
        try:
            request = json.loads(self.rfile.read(length))
            toolchain, shell = str(request["toolchain"]), str(request["shell"])
        except (ValueError, KeyError, TypeError):
            return self._answer(400, b'a compile request is {"toolchain": ..., "shell": ...}')
        grant = self.server.grant
        if toolchain != grant.toolchain:
            return self._answer(403, f"this rebuild compiles in {grant.toolchain}, not {toolchain[:100]}".encode())
        from ..inputs import hip, hip_compile
        from ..project import cache_dir

        with self.server.compiling:  # one at a time, COMPILES in all
            if self.server.closed or self.server.compiles >= COMPILES:
                return self._answer(429, f"this rebuild has had its {COMPILES} compiles, or is over".encode())
            self.server.compiles += 1
            # the revision's recipe says which of the toolchain's files a compile reads (a hostile one can only
            # ask for more of them, within the disk the extraction keeps free); we take them out, outside
            files = hip_compile.toolchain_files(Reference.parse_pinned(toolchain, "toolchain image"),
                                                hip.load(grant.hip).toolchain, cache_dir(create=True) / "toolchains",
                                                log=lambda m: None)
            # locked while it is filled: one a killed rebuild left (up to OUT_LIMIT) goes with the next compile
            with staging_dir(Path(tempfile.gettempdir()) / "bakery-broker") as out:
                try:
                    # TMPDIR, not `out`, is named: `out` is removed with the answer
                    hip_compile.room_to_compile(Path(tempfile.gettempdir()), TMPDIR_ELSEWHERE)
                    status, logs = hip_compile.run_compile(files, grant.hip, shell, out, stop=self.server.over)
                    if status != 0:  # stopped by the watch as the disk filled, or the compiler's write failed
                        hip_compile.room_to_compile(Path(tempfile.gettempdir()), TMPDIR_ELSEWHERE)
                    found = _outputs(out)
                finally:
                    remove_tree(out)  # what the compile left may be 0500: not a plain rmtree's to take
        self._answer(200, json.dumps({"status": status, "logs": logs[-LOG_LIMIT:], "files": found}).encode())

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def _outputs(folder: Path) -> dict[str, str]:
    """{name: base64} of the regular files the compile left (it runs the base's code: no link
    followed, a capped count and size)."""
    os.chmod(folder, 0o700)
    found: dict[str, str]
    found, total = {}, 0
    for entry in sorted(os.scandir(folder), key=lambda e: e.name)[:OUTPUT_FILES + 1]:
        info = entry.stat(follow_symlinks=False)
        if len(found) == OUTPUT_FILES or not stat.S_ISREG(info.st_mode) or total + info.st_size > OUTPUTS_LIMIT:
            raise IntegrityError(f"the compile left {entry.name[:80]!r}: not a regular file, or past "
                                 f"{OUTPUT_FILES} files or {OUTPUTS_LIMIT} bytes (the toolchain image is hostile)")
        total += info.st_size
        with os.fdopen(os.open(entry.path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            found[entry.name] = base64.b64encode(f.read(OUTPUTS_LIMIT + 1)).decode()
    return found


@contextmanager
def serve(folder: Path, grant: Grant, problems: list[str] | None = None):
    """The broker on folder/broker.sock while the block runs (the folder is bound into the sandbox).
    `problems` gets each of this machine's problems it met (a full disk): the rebuild's own error,
    whatever the code inside makes of the refusal."""
    path = folder / "broker.sock"
    server = _Server(str(path), _Handler)
    if os.geteuid() == 0:  # the sandbox's code is the host's uid 65534 then: it alone may connect
        from ..sandbox import UID

        os.chown(path, UID, UID)
    os.chmod(path, 0o600)
    server.grant, server.over, server.problems = grant, threading.Event(), problems if problems is not None else []
    server.compiling, server.slots = threading.Lock(), threading.BoundedSemaphore(CONNECTIONS)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield path
    finally:
        server.closed = True  # a compile still queued starts no more, one running is stopped
        server.over.set()
        server.shutdown()
        server.server_close()
        path.unlink(missing_ok=True)
