"""A deliberately unreliable HTTP proxy in front of a real registry, for retry and integrity tests.

faults is a list of (method, path-substring, action) consumed in order of matching:
  "503"     answer 503 once
  "drop"    close the connection without answering
  "corrupt" forward, but flip one byte of the body
  "slow"    forward the body in small pieces over ~2 seconds
  "truncate" forward the headers (full Content-Length) and half the body, then close
  "header:NAME=VALUE" forward, with that response header replaced
overrides maps a request path to (status, headers, body) served instead of the registry's answer:
hostile documents whose digests the test computes, so that parsing, not only hashing, is tested.
A body that is a callable yields chunks of an endless answer (`sent` counts what got out).
location_host sends upload Locations to another server (another origin) instead of this proxy;
`authorization` records each request's Authorization header, `ranges` its Range header.

script is a list of Fault: one fault at the k-th request that matches (all requests, or those of a
method and/or a path substring), and for `times` matching requests from there (a persistent fault:
a large number). Its actions, what a registry or the network in front of it does:
  "500" "502" "503" "429"  answer that status (Retry-After: N with retry_after=N), not forwarded
  "405"           answer 405 Method Not Allowed, not forwarded (a registry that takes no DELETE: GHCR)
  "reset"         forwarded; the headers and half the body sent, then a TCP reset (SO_LINGER 0);
                  an answer without a body is reset before its headers: applied, the answer lost
  "short"         forwarded; the whole Content-Length announced, half the body sent, then closed
  "stall"         not forwarded; nothing sent for stall_s seconds (past the client's read timeout)
  "stall-body"    forwarded; the headers and half the body sent, then nothing for stall_s seconds
  "trickle"       forwarded; the headers, then the body a byte every trickle_every seconds (each
                  read gets one before its timeout) until the client hangs up, or for trickle_for
                  seconds, then closed (a client that never gives up sees the body cut short then)
  "wrong-digest"  forwarded, Docker-Content-Digest replaced by another digest
  "foreign-location"  forwarded, the Location sent to `to` (another server: another origin)
`events` records (monotonic time, method, path, the scripted action or None) per request.
"""

from __future__ import annotations

import hashlib
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests

STATUSES = ("500", "502", "503", "429", "405")
WRONG_DIGEST = "sha256:" + hashlib.sha256(b"not what was sent").hexdigest()


@dataclass
class Fault:
    action: str
    at: int = 1  # the k-th matching request, from 1
    method: str = ""  # "" matches any
    path: str = ""  # a substring of the path; "" matches any
    times: int = 1
    retry_after: int | None = None
    to: str = ""  # foreign-location: host:port of the other server

    def __str__(self) -> str:
        where = " ".join(p for p in (self.method, self.path) if p) or "any"
        extra = f" Retry-After {self.retry_after}" if self.retry_after is not None else ""
        return f"{self.action}{extra} at {where} #{self.at}" + (f" x{self.times}" if self.times > 1 else "")


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that gave up and hung up: expected
            super().handle_error(request, client_address)


class FaultyProxy:
    def __init__(self, upstream: str, faults: list[tuple[str, str, str]], overrides: dict | None = None,
                 location_host: str | None = None, script: Sequence[Fault] = (), stall_s: float = 3.0,
                 trickle_every: float = 0.25, trickle_for: float = 10.0):
        self.upstream, self.faults = upstream, list(faults)
        self.seen: list[tuple[str, str]] = []  # (method, path), per request
        self.script, self.matched = list(script), [0] * len(script)
        self.stall_s = stall_s
        self.events: list[tuple[float, str, str, str | None]] = []  # (when, method, path, the fault's action)
        self.trickle_every, self.trickle_for = trickle_every, trickle_for
        self._lock = threading.Lock()
        self.overrides = dict(overrides or {})
        self.location_host = location_host  # where upload Locations point (default: this proxy)
        self.authorization: list[tuple[str, str, str | None]] = []  # (method, path, the Authorization header or None), per request
        self.sent = 0  # bytes of override bodies written before the client stopped reading
        self.ranges: list[tuple[str, str, str | None]] = []  # (method, path, the Range header or None), per request
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                scripted = proxy._scripted(self.command, self.path)
                proxy.seen.append((self.command, self.path))
                proxy.events.append((time.monotonic(), self.command, self.path, scripted.action if scripted else None))
                proxy.authorization.append((self.command, self.path, self.headers.get("Authorization")))
                proxy.ranges.append((self.command, self.path, self.headers.get("Range")))
                if scripted:
                    return self._scripted(scripted, body)
                if self.path in proxy.overrides:
                    status, headers, data = proxy.overrides[self.path]
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    if callable(data):  # an endless body, of no announced length: chunked
                        self.send_header("Transfer-Encoding", "chunked")
                        self.end_headers()
                        try:
                            for chunk in data():
                                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                                proxy.sent += len(chunk)
                            self.wfile.write(b"0\r\n\r\n")
                        except OSError:  # the client hung up: what it took is in proxy.sent
                            self.close_connection = True
                        return
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                    return
                action = proxy._take(self.command, self.path)
                if action == "503":
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if action == "drop":
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
                resp = requests.request(self.command, f"http://{proxy.upstream}{self.path}", headers=headers,
                                        data=body, allow_redirects=False, timeout=60, stream=True)
                # an answer passed on as it is streams through (a client's short read timeout holds);
                # one to be altered is read whole first
                whole = action is not None or "Content-Length" not in resp.headers
                data = resp.content if whole and self.command != "HEAD" else b""
                if action == "corrupt" and data:
                    data = data[:-1] + bytes([data[-1] ^ 0xFF])
                self.send_response(resp.status_code)
                replaced = dict([action[len("header:"):].split("=", 1)]) if action and action.startswith("header:") \
                    else {}
                for k, v in resp.headers.items():
                    if k.lower() in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        continue
                    if k.lower() == "location":
                        v = v.replace(proxy.upstream, proxy.location_host or f"127.0.0.1:{proxy.port}")
                        if v.startswith("/") and proxy.location_host:
                            v = f"http://{proxy.location_host}{v}"
                    self.send_header(k, replaced.pop(k, v))
                for k, v in replaced.items():
                    self.send_header(k, v)
                size = str(len(data)) if whole and self.command != "HEAD" else resp.headers.get("Content-Length")
                self.send_header("Content-Length", size or "0")
                self.end_headers()
                if action == "truncate":
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                if action == "slow":
                    step = max(1, len(data) // 10)
                    for i in range(0, len(data), step):
                        self.wfile.write(data[i:i + step])
                        self.wfile.flush()
                        time.sleep(0.2)
                elif whole:
                    self.wfile.write(data)
                elif self.command != "HEAD":
                    for chunk in resp.iter_content(1 << 20):
                        self.wfile.write(chunk)

            def _scripted(self, fault: Fault, body: bytes | None) -> None:
                if fault.action in STATUSES:
                    self.send_response(int(fault.action))
                    if fault.retry_after is not None:
                        self.send_header("Retry-After", str(fault.retry_after))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if fault.action == "stall":
                    time.sleep(proxy.stall_s)
                    self.close_connection = True
                    return
                resp = requests.request(self.command, f"http://{proxy.upstream}{self.path}", data=body, timeout=60,
                                        allow_redirects=False, headers={k: v for k, v in self.headers.items()
                                                                        if k.lower() not in ("host", "content-length")})
                data = resp.content if self.command != "HEAD" else b""
                if fault.action == "reset" and not data:  # the registry acted; its answer is lost
                    return self._reset()
                self.send_response(resp.status_code)
                for k, v in resp.headers.items():
                    if k.lower() in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                        continue
                    if k.lower() == "location":
                        v = v.replace(proxy.upstream, fault.to if fault.action == "foreign-location" else proxy.host)
                    if k.lower() == "docker-content-digest" and fault.action == "wrong-digest":
                        v = WRONG_DIGEST
                    self.send_header(k, v)
                announced = resp.headers.get("Content-Length") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", announced or "0")
                self.end_headers()
                if fault.action == "trickle":
                    ends = time.monotonic() + proxy.trickle_for
                    try:
                        for i in range(len(data)):
                            if time.monotonic() > ends:
                                break
                            self.wfile.write(data[i:i + 1])
                            self.wfile.flush()
                            time.sleep(proxy.trickle_every)
                    except OSError:  # the client gave up on it
                        pass
                    self.close_connection = True
                    return
                if fault.action in ("reset", "short", "stall-body"):
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    if fault.action == "reset":
                        return self._reset()
                    if fault.action == "stall-body":
                        time.sleep(proxy.stall_s)
                    self.close_connection = True
                    return
                self.wfile.write(data)

            def _reset(self) -> None:
                """Close with a TCP reset, not a FIN: what a dying middlebox or a killed server sends."""
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                self.connection.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _scripted(self, method: str, path: str) -> Fault | None:
        """Count this request against every scripted fault it matches; the first one due, if any."""
        due = None
        with self._lock:
            for i, fault in enumerate(self.script):
                if (fault.method or method) == method and fault.path in path:
                    self.matched[i] += 1
                    if due is None and fault.at <= self.matched[i] < fault.at + fault.times:
                        due = fault
        return due

    def hits(self) -> list[tuple[str, str, str]]:
        """(method, path, action) of each request a scripted fault was injected into."""
        return [(m, p, a) for _, m, p, a in self.events if a]

    def _take(self, method: str, path: str) -> str | None:
        for i, (m, sub, action) in enumerate(self.faults):
            if m == method and sub in path:
                del self.faults[i]
                return action
        return None

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
