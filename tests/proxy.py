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
`authorization` records each request's Authorization header.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests


class FaultyProxy:
    def __init__(self, upstream: str, faults: list[tuple[str, str, str]], overrides: dict | None = None,
                 location_host: str | None = None):
        self.upstream, self.faults, self.seen = upstream, list(faults), []
        self.overrides = dict(overrides or {})
        self.location_host = location_host  # where upload Locations point (default: this proxy)
        self.authorization = []  # (method, path, the Authorization header or None), per request
        self.sent = 0  # bytes of override bodies written before the client stopped reading
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy.seen.append((self.command, self.path))
                proxy.authorization.append((self.command, self.path, self.headers.get("Authorization")))
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
                                        data=body, allow_redirects=False, timeout=60)
                data = resp.content if self.command != "HEAD" else b""
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
                size = resp.headers.get("Content-Length") if self.command == "HEAD" else str(len(data))
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
                else:
                    self.wfile.write(data)

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

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
