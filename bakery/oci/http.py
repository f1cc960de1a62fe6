"""HTTP/1.1 for the registry client, on the standard library: connections kept alive per origin
and shared by threads, TLS verified against certifi's bundle (or REQUESTS_CA_BUNDLE /
CURL_CA_BUNDLE, as requests did), proxies from the environment. Bodies are never decoded: a blob's
bytes are the bytes its digest names. Nothing here knows registries (transport.py does).

requests did this before; importing it was a third of a warm build's own time."""

from __future__ import annotations

import base64
import email.errors
import http.client
import json
import os
import select
import socket
import ssl
import threading
import time
import urllib.parse

from .. import __version__
from ..broker_client import UnixConnection
from ..errors import TransientError

USER_AGENT = f"bakery/{__version__}"
TIMEOUT = (10, 300)  # connect, each read
# a body's reading may wait PACE[0] seconds, plus a second for each PACE[1] bytes that came: a server
# sending a byte before each read's timeout would otherwise hold a request for ever. 32 KiB/s is a
# quarter of a 1 Mbit/s link; only time spent waiting on the socket counts, not a slow consumer's
PACE = (60.0, 32 << 10)
IDLE_PER_ORIGIN = 8  # kept-alive connections kept per origin (a push runs a few blobs at once)
MAX_HEADERS = 100  # header fields of an answer, as http.client bounds its header lines


class _Watchdog:
    """Deadlines for whole exchanges, not single reads: a socket whose deadline passes is shut down,
    so the read under way ends at once. A per-read timeout alone lets a server that sends a byte
    before each one hold a request for ever, in places our code never sees between reads: its
    interim 100 answers, header lines, a chunk's size line, a chunked body's trailer lines. One
    thread for the process, started on first use."""

    def __init__(self) -> None:
        self._due: dict[int, tuple[float, socket.socket]] = {}
        self._fired: set[int] = set()
        self._next = float("inf")
        self._tokens = iter(range(1, 1 << 62))
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:  # a child has no watching thread: it starts its own on first use
        self._due, self._fired, self._next = {}, set(), float("inf")
        self._cond, self._thread = threading.Condition(), None

    def arm(self, sock: socket.socket, seconds: float) -> int:
        when = time.monotonic() + max(0.0, seconds)
        with self._cond:
            token = next(self._tokens)
            self._due[token] = (when, sock)
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="bakery-http-deadlines", daemon=True)
                self._thread.start()
            if when < self._next:  # later ones are seen when the thread wakes for an earlier one
                self._next = when
                self._cond.notify()
        return token

    def disarm(self, token: int) -> bool:
        """True when the deadline had passed and the socket was shut down."""
        with self._cond:
            self._due.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _watch(self) -> None:
        with self._cond:
            while True:
                now = time.monotonic()
                for token, (when, sock) in list(self._due.items()):
                    if when <= now:
                        del self._due[token]
                        self._fired.add(token)
                        try:  # the plain socket's: an SSLSocket's own would drop its state under a reader
                            socket.socket.shutdown(sock, socket.SHUT_RDWR)
                        except OSError:
                            pass
                self._next = min((when for when, _ in self._due.values()), default=float("inf"))
                self._cond.wait(None if self._next == float("inf") else self._next - now)


DEADLINES = _Watchdog()
SEND_PIECE = 1 << 20  # a body sent in pieces: the socket's timeout bounds each sendall whole, not each byte


class _SendTooSlow(OSError):
    pass


def _send_paced(conn: http.client.HTTPConnection, body: bytes, pace: tuple[float, float]) -> None:
    """A large body (an upload's 32 MiB chunk) given the pace a download gets: PACE[0] seconds plus a
    second for each PACE[1] bytes. Sent whole under the socket's read timeout, a chunk failed on any
    link slower than 32 MiB in 300 s (about 110 KiB/s); sent without a deadline, a server reading a
    byte at a time could hold it for ever."""
    allowed = pace[0] + len(body) / pace[1]
    token = DEADLINES.arm(conn.sock, allowed)
    try:
        view = memoryview(body)
        for start in range(0, len(body), SEND_PIECE):
            conn.send(view[start:start + SEND_PIECE])
    except OSError:
        if DEADLINES.disarm(token):
            raise _SendTooSlow(f"the request's {len(body)} bytes did not go within {allowed:g} s") from None
        raise
    if DEADLINES.disarm(token):  # shut just after the last piece went: the answer cannot come
        raise _SendTooSlow(f"the request's {len(body)} bytes did not go within {allowed:g} s")


class ConnectionFailed(TransientError):
    """Refused, reset, timed out, a TLS failure, or a body cut short: nothing a retry cannot mend."""


def failure(e: BaseException) -> ConnectionFailed:
    return ConnectionFailed(f"{type(e).__name__}: {str(e)[:200]}")


class Response:
    """One answer, its body unread until asked for. Reading it whole gives its connection back for
    the next request; closing it early closes the connection."""

    def __init__(self, raw: http.client.HTTPResponse, url: str, done, pace: tuple[float, float] = PACE,
                 sock: socket.socket | None = None) -> None:
        self.status_code = raw.status
        self._sock = sock  # what the deadlines shut down (None: the pace is checked between reads only)
        self.headers = raw.headers  # case-insensitive, like requests'
        self.url = url
        self._raw, self._done = raw, done
        self._content: bytes | None = None
        self._cut = False
        self._pace, self._waited, self._received = pace, 0.0, 0

    def iter_content(self, size: int):
        """The body in pieces of at most `size` bytes, each as soon as it came (one read, so that the
        pace is checked between a trickle's bytes); ConnectionFailed when it breaks off or falls
        behind the pace."""
        grace, rate = self._pace
        while True:
            began = time.monotonic()
            # the pace's time left bounds the read as a whole (a chunk's size line, its trailers)
            token = DEADLINES.arm(self._sock, grace + self._received / rate - self._waited) if self._sock else None
            try:
                piece, broke = self._raw.read1(size), None
            except (OSError, http.client.HTTPException, ValueError) as e:  # ValueError: a read of a shut socket
                piece, broke = b"", e
            if token is not None and DEADLINES.disarm(token):  # whatever the read then said
                self.close()
                raise self._too_slow(time.monotonic() - began)
            if broke is not None:
                self.close()
                raise failure(broke) from None
            if not piece:
                if self._raw.length:  # the server closed before the length it announced: cut short
                    self._cut = True
                    self.close()
                    raise failure(http.client.IncompleteRead(b"", self._raw.length))
                self.close()
                return
            self._received += len(piece)
            if self._waited + time.monotonic() - began > grace + self._received / rate:
                self.close()
                raise self._too_slow(time.monotonic() - began)
            self._waited += time.monotonic() - began
            yield piece

    def _too_slow(self, this_read: float) -> ConnectionFailed:
        grace, rate = self._pace
        return ConnectionFailed(f"too slow: under the {rate:.0f} bytes/s a body must average after its first "
                                f"{grace:g} s ({self._waited + this_read:.1f} s waited)")

    @property
    def content(self) -> bytes:
        if self._content is None:
            self._content = b"".join(self.iter_content(1 << 20))
        return self._content

    @content.setter
    def content(self, body: bytes) -> None:
        self._content = body

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.content)

    def close(self) -> None:
        """Give the connection back if the answer was read to its end, else close it."""
        if self._done is None:
            return
        done, self._done = self._done, None
        raw = self._raw
        if not raw.isclosed() and raw.length == 0:  # a HEAD's, or an empty body: ended, once read
            try:
                raw.read()
            except (OSError, http.client.HTTPException):
                pass
        reusable = raw.isclosed() and not raw.will_close and not self._cut
        raw.close()
        done(reusable)

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _tls_context() -> ssl.SSLContext:
    """Verifying against REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE (a file, or a folder of hashed
    certificates, as requests took them), else certifi's bundle; host names checked."""
    found = os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE")
    if found and os.path.isdir(found):
        return ssl.create_default_context(capath=found)
    if not found:
        import certifi

        found = certifi.where()
    return ssl.create_default_context(cafile=found)


class Connections:
    """Kept-alive connections, one request at a time on each, shared by threads. With
    `unix_socket`, every request goes to that socket in plain HTTP, its Host header naming the
    registry asked for (the rebuild's broker answers for it); proxies are not asked then."""

    def __init__(self, unix_socket: str | None = None, timeout: tuple[float, float] = TIMEOUT,
                 pace: tuple[float, float] = PACE) -> None:
        self.unix_socket, self.timeout, self.pace = unix_socket, timeout, pace
        self._idle: dict[tuple, list] = {}
        self._lock = threading.Lock()
        self._tls: ssl.SSLContext | None = None

    def send(self, method: str, url: str, headers: dict, body: bytes | None,
             timeout: tuple[float, float] | None = None, address: str | None = None) -> Response:
        """One exchange: the request sent and the answer's status and headers read; its body is left
        for the caller. ConnectionFailed when no answer came. `address`: connect to it rather than to
        the host resolved anew (a name judged by its address stays at it); the URL's host still
        names the server, for TLS and the Host header."""
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError as e:
            raise ConnectionFailed(f"InvalidURL: {str(e)[:200]}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname or not url.isascii():
            raise ConnectionFailed(f"InvalidURL: {url[:200]!r} is not an http(s) URL in ASCII")
        key = (parts.scheme, parts.hostname.lower(), port, address)
        proxy = None if self.unix_socket else _proxy_for(parts.scheme, url)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        hdrs = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity", **headers}
        if self.unix_socket or proxy:
            hdrs["Host"] = parts.netloc.rpartition("@")[2]  # never a user:password the URL may carry
        if proxy and parts.scheme == "http":  # a plain request through a proxy names the whole URL
            target = url
            if proxy.username is not None:
                hdrs["Proxy-Authorization"] = _basic(proxy)
        conn = self._take(key) or self._open(key, proxy, timeout or self.timeout)
        token, fired = None, False
        try:
            conn.putrequest(method, target, skip_host="Host" in hdrs, skip_accept_encoding=True)
            for name, value in hdrs.items():
                conn.putheader(name, value)
            if body is not None and not any(n.lower() == "content-length" for n in hdrs):
                conn.putheader("Content-Length", str(len(body)))
            elif body is None and method in ("POST", "PUT", "PATCH") and \
                    not any(n.lower() == "content-length" for n in hdrs):
                conn.putheader("Content-Length", "0")
            if body is None or len(body) <= SEND_PIECE:
                conn.endheaders(body)
            else:
                conn.endheaders()
                _send_paced(conn, body, self.pace)
            # the status, interim answers and headers, all within one read timeout: not one per byte
            token = DEADLINES.arm(conn.sock, (timeout or self.timeout)[1]) if conn.sock else None
            try:
                raw = conn.getresponse()
            finally:
                fired = token is not None and DEADLINES.disarm(token)
            if fired:  # its end of headers may be the shut socket's end: no answer at all
                raise ConnectionResetError("shut at its deadline")
            # obs-fold, which RFC 9112 5.2 lets a recipient refuse: http.client keeps its line break in
            # the value, and a proxy or cache on the way may read the line as a header of its own
            if any("\n" in value or "\r" in value for value in raw.headers.values()) or any(
                    isinstance(d, email.errors.FirstHeaderLineIsContinuationDefect) for d in raw.headers.defects):
                raise http.client.HTTPException("a folded header line (obs-fold)")
            # the parser splits lines at a bare CR too: 100 lines of 64 KiB could be two million headers
            if len(raw.headers) > MAX_HEADERS:
                raise http.client.HTTPException(f"more than {MAX_HEADERS} header fields")
        except (OSError, http.client.HTTPException, ValueError) as e:  # ValueError: CR/LF or non-Latin-1 in a header
            conn.close()
            if isinstance(e, _SendTooSlow):
                raise ConnectionFailed(str(e)) from None
            if fired:
                raise ConnectionFailed(f"no whole answer's head within {(timeout or self.timeout)[1]:g} s") from None
            raise failure(e) from None
        return Response(raw, url, lambda reusable: self._give_back(key, conn, reusable), self.pace, conn.sock)

    def _open(self, key: tuple, proxy, timeout) -> http.client.HTTPConnection:
        scheme, host, port, address = key
        conn: http.client.HTTPConnection
        try:
            if self.unix_socket:
                conn = UnixConnection(self.unix_socket, timeout[0])
            elif scheme == "https":
                if self._tls is None:
                    self._tls = _tls_context()
                conn = http.client.HTTPSConnection(host, port, timeout=timeout[0], context=self._tls)
                if proxy:  # the tunnel made here, not by http.client's set_tunnel: see _tunnel
                    conn._create_connection = (  # type: ignore[attr-defined]  # http.client's own hook: not in typeshed
                        lambda *_: _tunnel(proxy, host, port, timeout))
            elif proxy:
                conn = http.client.HTTPConnection(proxy.hostname, proxy.port or 80, timeout=timeout[0])
            else:
                conn = http.client.HTTPConnection(host, port, timeout=timeout[0])
            if address and not (proxy or self.unix_socket):  # http.client's hook for making its socket
                conn._create_connection = (  # type: ignore[attr-defined]  # http.client's own hook: not in typeshed
                    lambda _, *rest, **named: socket.create_connection((address, port), *rest, **named))
            conn.response_class = _Response
            conn.connect()  # under the connect timeout; sending and each read get the longer one
            conn.sock.settimeout(timeout[1])
        except (OSError, http.client.HTTPException, ValueError) as e:
            raise failure(e) from None
        return conn

    def _take(self, key: tuple) -> http.client.HTTPConnection | None:
        """An idle connection the server has not closed meanwhile (one it closed reads as ready)."""
        while True:
            with self._lock:
                idle = self._idle.get(key)
                conn = idle.pop() if idle else None
            if conn is None:
                return None
            try:
                dropped = conn.sock is None or bool(select.select([conn.sock], [], [], 0)[0])
            except (OSError, ValueError):
                dropped = True
            if not dropped:
                return conn
            conn.close()

    def _give_back(self, key: tuple, conn: http.client.HTTPConnection, reusable: bool) -> None:
        # to the broker, a connection per request, as before: each one kept alive would hold one of
        # its few threads
        if reusable and conn.sock is not None and not self.unix_socket:
            with self._lock:
                idle = self._idle.setdefault(key, [])
                if len(idle) < IDLE_PER_ORIGIN:
                    idle.append(conn)
                    return
        conn.close()


class _Lines:
    """An answer's file as http.client reads it, refusing a line with a CR anywhere but before its
    LF: the header parser splits lines at a bare CR too, so the 100 lines of 64 KiB http.client
    allows became two million headers (374 MiB and 2.6 s an answer) before any count could refuse
    them. Everything else is the file's own."""

    def __init__(self, fp):
        self._fp = fp

    def readline(self, limit: int = -1) -> bytes:
        line = self._fp.readline(limit)
        text = line[:-2] if line.endswith(b"\r\n") else line[:-1] if line.endswith(b"\n") else line
        if b"\r" in text:
            raise http.client.HTTPException("a bare CR in a line of the answer")
        return line

    def __getattr__(self, name: str):
        return getattr(self._fp, name)


class _Response(http.client.HTTPResponse):
    """http.client's response, its lines read through _Lines."""

    def __init__(self, sock, *args, **kwargs):
        super().__init__(sock, *args, **kwargs)
        self.fp = _Lines(self.fp)  # type: ignore[assignment]  # the file, its readline checked


def _tunnel(proxy: urllib.parse.SplitResult, host: str, port: int, timeout: tuple[float, float]) -> socket.socket:
    """A socket to host:port through the proxy's CONNECT tunnel, the proxy's answer read as a
    response's head is: within the read timeout as a whole, and no more than http.client's 100
    header lines. http.client's own tunnel counted no lines and had only each read's timeout, so a
    proxy sending a byte before each could hold a connect for ever."""
    sock = socket.create_connection((proxy.hostname, proxy.port or 80), timeout[0])
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    auth = f"Proxy-Authorization: {_basic(proxy)}\r\n" if proxy.username is not None else ""
    token = DEADLINES.arm(sock, timeout[1])
    try:
        try:
            sock.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n".encode())
            answer = _Response(sock, method="CONNECT")
            try:
                answer.begin()  # its status line and headers: HTTPException past 100 lines
            finally:
                answer.close()  # what it read of the socket, not the socket
        finally:
            if DEADLINES.disarm(token):  # whatever the reading said (a shut socket reads as an end)
                raise TimeoutError(f"the proxy's answer to CONNECT did not come whole within {timeout[1]:g} s")
        if answer.status != 200:
            raise OSError(f"Tunnel connection failed: {answer.status} {answer.reason.strip()}")
    except BaseException:
        sock.close()
        raise
    return sock


def _basic(url: urllib.parse.SplitResult) -> str:
    raw = f"{urllib.parse.unquote(url.username or '')}:{urllib.parse.unquote(url.password or '')}".encode()
    return "Basic " + base64.b64encode(raw).decode()


def _proxy_for(scheme: str, url: str) -> urllib.parse.SplitResult | None:
    """The proxy the environment names for this URL (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY,
    either case), as requests read them; None for none."""
    if not any(name.lower().endswith("_proxy") for name in os.environ):
        return None  # the usual case, without importing urllib.request
    import urllib.request

    proxies = urllib.request.getproxies_environment()
    chosen = proxies.get(scheme) or proxies.get("all")
    if not chosen or urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]  # public, not in typeshed
            urllib.parse.urlsplit(url).netloc, proxies):
        return None
    if "://" not in chosen:
        chosen = "http://" + chosen
    proxy = urllib.parse.urlsplit(chosen)
    if proxy.scheme != "http" or not proxy.hostname:
        raise ConnectionFailed(f"the proxy {chosen[:100]!r} that the environment names is not http://HOST[:PORT]")
    return proxy
