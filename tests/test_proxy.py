"""The seed's front proxy, tested for real: Debian's Caddy runs the Caddyfile `bakery.release.deploy.caddy.caddyfile`
renders, in front of a stand-in upstream (vLLM cannot run here: no GPU; the stand-in answers every
path and streams its body in two parts, two seconds apart). TLS is Caddy's internal CA, whose root
the client trusts; a second loopback address plays a client outside the allowed CIDRs.
"""

from __future__ import annotations

import http.client
import http.server
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time

import pytest

from bakery.release.deploy import caddy as nodes

pytestmark = pytest.mark.skipif(shutil.which("caddy") is None, reason="needs caddy (scripts/bootstrap.sh installs it)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Upstream(http.server.BaseHTTPRequestHandler):
    """Answers any path 200 with a body of known length, "first" at once and "second" two seconds
    later (a proxy buffers such a body unless told to flush each write; vLLM's event streams are
    chunked, which Caddy flushes anyway: the known length makes the test see the setting)."""

    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(200)
        self.send_header("X-Upstream-Saw", self.path)
        self.send_header("Content-Length", "13")
        self.end_headers()
        self.wfile.write(b"first\n")
        self.wfile.flush()
        time.sleep(2.0)
        self.wfile.write(b"second\n")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def proxy(tmp_path_factory):
    home = tmp_path_factory.mktemp("caddy")
    upstream = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    (home / "Caddyfile").write_bytes(nodes.caddyfile(f"localhost:{port}", None, ["127.0.0.1/32"],
                                                     f"127.0.0.1:{upstream.server_address[1]}", internal_tls=True))
    env = {**os.environ, "XDG_DATA_HOME": str(home / "data"), "XDG_CONFIG_HOME": str(home / "config"),
           "HOME": str(home)}
    caddy = subprocess.Popen(["caddy", "run", "--config", str(home / "Caddyfile"), "--adapter", "caddyfile"],
                             env=env, stdout=subprocess.DEVNULL, stderr=open(home / "caddy.log", "wb"))
    root = home / "data" / "caddy" / "pki" / "authorities" / "local" / "root.crt"
    deadline = time.monotonic() + 30
    while not root.exists() or not _listening(port):
        assert caddy.poll() is None and time.monotonic() < deadline, (home / "caddy.log").read_text()
        time.sleep(0.2)
    yield port, ssl.create_default_context(cafile=str(root))
    caddy.terminate()
    caddy.wait(10)
    upstream.shutdown()


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def get(proxy, path: str, source: str = "127.0.0.1", seen: list | None = None) -> tuple[int, bytes, float, float]:
    """(status, body, seconds to the first body bytes, seconds to the end), over verified TLS; the
    path the upstream saw is appended to `seen`."""
    port, context = proxy
    conn = http.client.HTTPSConnection("localhost", port, context=context, source_address=(source, 0), timeout=20)
    started = time.monotonic()
    conn.request("GET", path)
    response = conn.getresponse()
    if seen is not None:
        seen.append(response.getheader("X-Upstream-Saw"))
    first = response.read1(65536)
    first_at = time.monotonic() - started
    rest = response.read()
    conn.close()
    return response.status, first + rest, first_at, time.monotonic() - started


@pytest.mark.parametrize("path", nodes.API_PATHS)
@pytest.mark.slow  # seconds: `invoke test --fast` skips it
def test_an_api_path_from_an_allowed_source_reaches_vllm_over_tls(proxy, path):
    status, body, _, _ = get(proxy, path)
    assert status == 200 and body == b"first\nsecond\n"


@pytest.mark.parametrize("path", ["/", "/v1/admin", "/v1/chat/completions/../../debug", "/generate2", "/metrics/x",
                                  "/v1/models/", "/docs"])
@pytest.mark.slow
def test_any_other_path_is_403(proxy, path):
    assert get(proxy, path)[0] == 403


@pytest.mark.parametrize("asked, canonical", [("/v1//models", "/v1/models"), ("/x/../v1/models", "/v1/models"),
                                              ("/V1/MODELS", "/v1/models"),  # Caddy matches paths without case
                                              ("/v1/completions?stream=true", "/v1/completions?stream=true")])
@pytest.mark.slow
def test_vllm_sees_only_the_canonical_path(proxy, asked, canonical):
    """A spelling Caddy cleans to match an allowed path reaches vLLM as that path, query kept."""
    seen: list[str] = []
    assert get(proxy, asked, seen=seen)[0] == 200 and seen == [canonical]


@pytest.mark.slow
def test_a_source_outside_the_allowed_cidrs_is_403(proxy):
    status, body, _, _ = get(proxy, "/v1/chat/completions", source="127.0.0.2")
    assert status == 403 and b"second" not in body


@pytest.mark.slow
def test_streamed_tokens_are_not_buffered(proxy):
    """The upstream sends its first part, then waits two seconds: the client has it long before."""
    status, body, first_at, done_at = get(proxy, "/v1/completions")
    assert status == 200 and done_at >= 1.9 and first_at < 1.0, (first_at, done_at)


@pytest.mark.slow
def test_plain_http_gets_nothing(proxy):
    port, _ = proxy
    conn = http.client.HTTPConnection("localhost", port, timeout=10)
    conn.request("GET", "/health")
    response = conn.getresponse()
    assert response.status == 400 and b"HTTP request to an HTTPS server" in response.read()


def test_the_renderer_refuses_what_it_cannot_enforce():
    from bakery.errors import InputError

    with pytest.raises(InputError, match="at least one source CIDR"):
        nodes.caddyfile("api.example.com", "ops@example.com", [], "inference:8000", internal_tls=False)
    with pytest.raises(InputError, match="does not appear to be an IPv4 or IPv6 network"):
        nodes.caddyfile("api.example.com", "ops@example.com", ["10.0.0.0/33"], "inference:8000", internal_tls=False)
    with pytest.raises(InputError, match="ACME needs a contact"):
        nodes.caddyfile("api.example.com", None, ["10.0.0.0/8"], "inference:8000", internal_tls=False)
    with pytest.raises(InputError, match="a DNS name"):
        nodes.caddyfile("api.example.com { }", "ops@example.com", ["10.0.0.0/8"], "inference:8000", False)
    with pytest.raises(InputError, match="not port 80: HTTPS only"):
        nodes.caddyfile("api.example.com:80", "ops@example.com", ["10.0.0.0/8"], "inference:8000", False)
    with pytest.raises(InputError, match="is no allowlist"):
        nodes.caddyfile("api.example.com", "ops@example.com", ["0.0.0.0/0"], "inference:8000", False)
    with pytest.raises(InputError, match="has host bits set"):  # 10.1.2.3/8 would silently be 10.0.0.0/8
        nodes.caddyfile("api.example.com", "ops@example.com", ["10.1.2.3/8"], "inference:8000", False)
    with pytest.raises(InputError, match="overlaps the stack's own network"):
        nodes.caddyfile("api.example.com", "ops@example.com", ["192.0.0.0/16"], "inference:8000", False)
