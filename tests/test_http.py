"""The registry client's HTTP (bakery/oci/http.py), against real servers: TLS verified (a real
registry serving TLS with a CA made here), proxies from the environment (a forward proxy written
here, CONNECT and plain), and connections kept alive only when an answer was read to its end."""

from __future__ import annotations

import contextlib
import datetime
import functools
import ipaddress
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from bakery.dev import stack
from bakery.oci.http import ConnectionFailed, Connections
from bakery.oci.refs import Descriptor, Reference
from bakery.oci.registry import OCI_MANIFEST, Registry
from bakery.oci.transport import Transport, origin


def _certificates(folder: Path, names: list[str]) -> tuple[Path, Path, Path]:
    """(CA certificate, leaf certificate, leaf key): a CA made here and a leaf for `names` it signed."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bakery test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=30))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    alt = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = folder / "ca.pem", folder / "leaf.pem", folder / "leaf.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return paths


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory, registry):
    """(host:port, CA file) of a real registry (distribution) serving TLS on loopback with a
    certificate for 127.0.0.1 from a CA made here."""
    folder = tmp_path_factory.mktemp("tls-registry")
    ca, cert, key = _certificates(folder, ["127.0.0.1"])
    port = _free_port()
    config = yaml.safe_load(stack.registry_config(port, folder / "data"))
    config["http"]["tls"] = {"certificate": str(cert), "key": str(key)}
    (folder / "config.yml").write_text(yaml.safe_dump(config))
    binary = _registry_binary()
    with open(folder / "registry.log", "ab") as log:
        server = subprocess.Popen([binary, "serve", str(folder / "config.yml")], stdout=log, stderr=log)
    try:
        _wait_for(port)
        yield f"127.0.0.1:{port}", ca
    finally:
        server.terminate()
        server.wait(10)


def _wait_for(port: int) -> None:
    """Until something listens on 127.0.0.1:port (30 seconds at most)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _over_tls(host: str) -> Registry:
    """A Registry client that speaks TLS to `host`: loopback registries speak plain HTTP by policy
    (transport.scheme_for), so this one is pointed at https by hand to test the client's TLS path."""
    transport = Transport(host)
    transport.base = f"https://{host}"
    transport.origin = origin(transport.base)
    return Registry(host, transport)


def _push_and_pull(reg: Registry, repo: str, size: int) -> None:
    data = bytes(range(256)) * (size // 256)
    desc = Descriptor.of("application/octet-stream", data)
    reg.upload_blob(repo, desc, lambda: iter([data]))
    config = b"{}"
    config_desc = Descriptor.of("application/vnd.oci.image.config.v1+json", config)
    reg.upload_blob(repo, config_desc, lambda: iter([config]))
    manifest = (b'{"schemaVersion":2,"mediaType":"%s","config":%s,"layers":[%s]}'
                % (OCI_MANIFEST.encode(), _json(config_desc), _json(desc)))
    pushed = reg.put_manifest(repo, "tls", manifest, OCI_MANIFEST)
    body, _, digest = reg.get_manifest(Reference.parse(f"{reg.name}/{repo}:tls"))
    assert body == manifest and digest == pushed
    assert reg.fetch_blob(repo, desc) == data
    assert reg.manifest_is(repo, "tls", pushed)


def _json(desc: Descriptor) -> bytes:
    import json

    return json.dumps(desc.to_json(), sort_keys=True).encode()


def test_a_registry_over_tls_verified_against_the_named_ca(tls_registry, monkeypatch):
    """Pushes (one PUT, and PATCH chunks past 8 MiB), pulls and HEADs over TLS, verified against
    REQUESTS_CA_BUNDLE (the variable requests read, kept for the users who set it)."""
    host, ca = tls_registry
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
    _push_and_pull(_over_tls(host), "tls/small", 4096)
    _push_and_pull(_over_tls(host), "tls/chunked", 9 << 20)


def test_a_certificate_from_another_ca_is_refused(tls_registry, monkeypatch):
    host, _ = tls_registry
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with pytest.raises(ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED"):
        Connections().send("GET", f"https://{host}/v2/", {}, None)


def test_a_certificate_for_another_name_is_refused(tmp_path, monkeypatch):
    """A certificate the CA signed, but for another name than the one asked for."""
    import ssl

    ca, cert, key = _certificates(tmp_path, ["registry.example.com"])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with _Server(_Answer, context) as server:
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
        with pytest.raises(ConnectionFailed, match="CERTIFICATE_VERIFY_FAILED.*(mismatch|match)"):
            Connections().send("GET", f"https://127.0.0.1:{server.server_address[1]}/", {}, None)


def _registry_binary() -> str:
    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        pytest.fail("docker-registry is not installed: run scripts/bootstrap.sh")
    return binary


class _Recording(ThreadingHTTPServer):
    """A test server and what its handlers record: client ports (_Answer), the proxied requests
    (_ForwardProxy), the addresses a trap was reached at (_Trap); and the blob a _Blob serves."""
    ports: list[int]
    seen: list[tuple[str, str, str | None]]
    hits: list[str]
    blob: bytes


class _Answer(BaseHTTPRequestHandler):
    """A small answer to anything; each request's client port recorded (one port, one connection)."""
    protocol_version = "HTTP/1.1"
    server: _Recording
    body = b"x" * 100_000

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.ports.append(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(self.body)

    do_HEAD = do_GET


class _Server:
    def __init__(self, handler, tls=None, address=("127.0.0.1", 0)):
        self.server = _Recording(address, handler)
        self.server.ports, self.server.seen = [], []
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]

    def __enter__(self) -> _Recording:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.server

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_a_connection_is_kept_only_after_an_answer_read_to_its_end():
    """HEAD, then two whole GETs: one connection. A GET closed after its first piece leaves unread
    bytes on its connection, which is closed, not reused: the next request opens another."""
    with _Server(_Answer) as server:
        conns = Connections()
        url = f"http://127.0.0.1:{server.server_address[1]}/x"
        conns.send("HEAD", url, {}, None).close()
        for _ in range(2):
            assert conns.send("GET", url, {}, None).content == _Answer.body
        assert len(set(server.ports)) == 1
        partly = conns.send("GET", url, {}, None)
        next(partly.iter_content(1000))
        partly.close()
        assert conns.send("GET", url, {}, None).content == _Answer.body
        assert len(server.ports) == 5 and len(set(server.ports)) == 2


def test_a_connection_the_server_closed_meanwhile_is_not_used():
    """An idle kept-alive connection the server has closed is noticed before a request is sent on it."""
    class Closing(_Answer):
        def do_GET(self):
            super().do_GET()
            self.close_connection = True  # and say nothing about it: the client sees the socket end

    with _Server(Closing) as server:
        conns = Connections()
        url = f"http://127.0.0.1:{server.server_address[1]}/x"
        assert conns.send("GET", url, {}, None).content == _Answer.body
        time.sleep(0.2)
        assert conns.send("GET", url, {}, None).content == _Answer.body  # not a ConnectionFailed
        assert len(set(server.ports)) == 2


class _ForwardProxy(BaseHTTPRequestHandler):
    """A forward proxy: CONNECT tunnels, and plain requests by their absolute URL. Records
    (method, target, Proxy-Authorization)."""
    protocol_version = "HTTP/1.1"
    server: _Recording

    def log_message(self, *args):
        pass

    def do_CONNECT(self):
        self.server.seen.append(("CONNECT", self.path, self.headers.get("Proxy-Authorization")))
        host, port = self.path.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        self.send_response(200)
        self.end_headers()
        self.close_connection = True
        sockets = [self.connection, upstream]
        try:
            while True:
                ready, _, _ = select.select(sockets, [], [], 10)
                if not ready:
                    return
                for s in ready:
                    data = s.recv(65536)
                    if not data:
                        return
                    (upstream if s is self.connection else self.connection).sendall(data)
        finally:
            upstream.close()

    def do_GET(self):
        import http.client
        import urllib.parse

        self.server.seen.append((self.command, self.path, self.headers.get("Proxy-Authorization")))
        url = urllib.parse.urlsplit(self.path)
        assert url.hostname, self.path  # a forward proxy is asked by absolute URL
        conn = http.client.HTTPConnection(url.hostname, url.port)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-authorization"}
        conn.request(self.command, url.path + (f"?{url.query}" if url.query else ""), headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data) if self.command != "HEAD" else resp.length or 0))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_HEAD = do_GET


def _clear_proxies(monkeypatch):
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)


def test_https_goes_through_the_environments_proxy_by_connect(tls_registry, monkeypatch):
    """HTTPS_PROXY: a CONNECT tunnel, TLS verified end to end through it (the proxy sees no byte in clear)."""
    host, ca = tls_registry
    _clear_proxies(monkeypatch)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca))
    with _Server(_ForwardProxy) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://who:pass%21@127.0.0.1:{proxy.server_address[1]}")
        _push_and_pull(_over_tls(host), "tls/proxied", 4096)
    assert proxy.seen and {(m, t) for m, t, _ in proxy.seen} == {("CONNECT", host)}
    assert {a for _, _, a in proxy.seen} == {"Basic d2hvOnBhc3Mh"}  # who:pass!, unquoted


def test_plain_http_goes_through_the_proxy_by_absolute_url_unless_no_proxy_says(registry, monkeypatch):
    _clear_proxies(monkeypatch)
    pushed = Registry(registry)
    data = b"through the proxy"
    desc = Descriptor.of("application/octet-stream", data)
    pushed.upload_blob("proxy/plain", desc, lambda: iter([data]))
    with _Server(_ForwardProxy) as proxy:
        monkeypatch.setenv("http_proxy", f"127.0.0.1:{proxy.server_address[1]}")
        assert Registry(registry).fetch_blob("proxy/plain", desc) == data
        assert proxy.seen == [("GET", f"http://{registry}/v2/proxy/plain/blobs/{desc.digest}", None)]
        monkeypatch.setenv("NO_PROXY", "example.com,127.0.0.1")
        assert Registry(registry).fetch_blob("proxy/plain", desc) == data
        assert len(proxy.seen) == 1


def test_an_unreachable_host_is_a_connection_failure_not_a_traceback():
    with pytest.raises(ConnectionFailed, match="Connection refused|ConnectionRefused"):
        Connections().send("GET", f"http://127.0.0.1:{_free_port()}/v2/", {}, None)
    for url in ("http://[x/v2/", "http://127.0.0.1:9/v2/\u00e9", "ftp://127.0.0.1/v2/"):
        with pytest.raises(ConnectionFailed, match="InvalidURL"):
            Connections().send("GET", url, {}, None)


class _Short(_Answer):
    """Announces 100,000 bytes, sends half, closes."""

    def do_GET(self):
        self.server.ports.append(self.client_address[1])
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body[:len(self.body) // 2])
        self.wfile.flush()
        self.close_connection = True


def test_a_body_cut_short_of_its_length_is_a_connection_failure_and_its_connection_is_not_kept():
    """http.client gives b"" at a close before Content-Length is met; that is a body cut short
    (retried as transient by the callers), never a shorter whole answer."""
    with _Server(_Short) as server:
        conns = Connections()
        with pytest.raises(ConnectionFailed, match="IncompleteRead"):
            conns.send("GET", f"http://127.0.0.1:{server.server_address[1]}/x", {}, None).content  # noqa: B018 (reading it raises)
        assert not any(conns._idle.values())


def test_a_blob_the_registry_cuts_short_reaches_the_rebuild_as_cut_short_not_as_other_bytes(registry, tmp_path,
                                                                                            monkeypatch):
    """The broker relays a registry's answer into the rebuild's sandbox. When the registry breaks
    off mid-body, the broker ends the connection: it writes nothing more into an answer it began
    (an error page there would be read as the blob's bytes, and the sandbox would wait for the rest).
    Resuming is off here, so that the cut itself is what the client inside reports."""
    from bakery.errors import TransientError
    from bakery.oci import registry as registry_mod
    from bakery.release import broker
    from proxy import FaultyProxy

    monkeypatch.setattr(registry_mod, "RESUMES", 0)

    data = bytes(range(256)) * 4096
    desc = Descriptor.of("application/octet-stream", data)
    Registry(registry).upload_blob("relay/cut", desc, lambda: iter([data]))
    with FaultyProxy(registry, [("GET", f"/blobs/{desc.digest}", "truncate")]) as proxy:
        with broker.serve(tmp_path, broker.Grant(proxy.host, "relay/cut", None, tmp_path)) as socket_path:
            inside = Registry(proxy.host, Transport(proxy.host, connections=Connections(str(socket_path))))
            started = time.monotonic()
            with pytest.raises(TransientError, match="broke off"):
                inside.fetch_blob("relay/cut", desc)
            assert time.monotonic() - started < 30
            assert inside.fetch_blob("relay/cut", desc) == data  # the fault was once: a retry gets it whole


def test_a_redirect_is_followed_only_over_https_to_a_public_address():
    """A hostile registry's Location: plain http, a cloud's metadata service, a LAN address or
    loopback are refused (loopback and plain http only where the registry itself is on loopback)."""
    from bakery.oci.transport import judge_hop, origin

    def redirect_refused(registry, url):
        return judge_hop(registry, url).refused

    public = origin("https://ghcr.io/v2/")
    local = origin("http://127.0.0.1:5000/v2/")
    assert redirect_refused(public, "https://ghcr.io/v2/x/blobs/sha256:1") is None  # its own origin
    assert redirect_refused(public, "https://8.8.8.8/blob") is None
    for where in ("http://8.8.8.8/blob", "https://169.254.169.254/latest/meta-data/", "https://10.0.0.5/x",
                  "https://192.168.1.1/x", "https://127.0.0.1:5000/x", "https://[::1]/x", "https://[fe80::1]/x",
                  "https://[::ffff:169.254.169.254]/x", "https://localhost/x", "https://0.0.0.0/x"):
        assert redirect_refused(public, where), where
    assert redirect_refused(local, "http://127.0.0.1:5001/blob") is None  # a test registry behind a proxy
    assert redirect_refused(local, "https://169.254.169.254/") and redirect_refused(local, "http://10.0.0.5/")
    # followed at the address judged; a token service may be on a LAN, never a metadata service
    assert judge_hop(public, "https://8.8.8.8/blob").address == "8.8.8.8"
    assert judge_hop(public, "https://10.0.0.5/token", private_ok=True).address == "10.0.0.5"
    for where in ("https://169.254.169.254/token", "https://[fd00:ec2::254]/token", "https://100.100.100.200/t",
                  "https://127.0.0.1/token", "https://100.64.0.1/", "https://198.18.0.1/", "https://240.0.0.1/"):
        assert judge_hop(public, where, private_ok=True).refused, where
    # an IPv6 address is judged by the IPv4 one it carries (6to4, NAT64's prefix); what Python calls
    # global but is not the internet is refused (shared address space, site-local, IETF assignments)
    for where in ("https://[2002:a9fe:a9fe::1]/", "https://[64:ff9b::a00:5]/", "https://[fec0::1]/",
                  "https://192.0.0.8/", "https://100.64.0.1/", "https://[::]/", "https://[2001:db8::1]/"):
        assert redirect_refused(public, where), where
    assert redirect_refused(public, "https://[64:ff9b::808:808]/") is None  # a public address through NAT64


# where a hostile registry sends a blob's read: a cloud's metadata service and a LAN service, by
# plain http and https, by address, as an IPv4-mapped IPv6 address, and by a name that resolves to one
_TRAPPED = ("http://169.254.169.254/latest/meta-data/iam/security-credentials/",
            "https://169.254.169.254/latest/meta-data/", "http://10.0.0.5/admin", "https://10.0.0.5/admin",
            "https://[::ffff:10.0.0.5]/admin", "https://metadata.internal/latest/meta-data/")
_SECRET = b"the instance's credentials"


class _Trap(BaseHTTPRequestHandler):
    """The service behind a private or link-local address: every connection is recorded as it
    arrives, before a byte is read (a TLS handshake reaches it as much as a GET does); a GET gets
    the secret."""
    protocol_version = "HTTP/1.1"
    server: _Recording

    def log_message(self, *args):
        pass

    def setup(self):
        super().setup()
        host, port = self.connection.getsockname()[:2]  # the address the trap was reached at
        self.server.hits.append(f"{host}:{port}")

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(_SECRET)))
        self.end_headers()
        self.wfile.write(_SECRET)


class _Blob(BaseHTTPRequestHandler):
    """A blob store: the server's `blob` for any GET."""
    protocol_version = "HTTP/1.1"
    server: _Recording

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.server.blob)))
        self.end_headers()
        self.wfile.write(self.server.blob)


def _redirects_in_this_namespace(folder: Path) -> None:
    """The scenario of the test below, run in the namespaces it makes (no address here leads off
    this machine): what happened goes to folder/seen.json, for the test to judge."""
    from bakery.errors import BakeryError
    from bakery.release import broker
    from proxy import FaultyProxy

    ip = shutil.which("ip") or "/usr/sbin/ip"
    subprocess.run([ip, "link", "set", "lo", "up"], check=True)
    for address in ("10.0.0.5/32", "169.254.169.254/32"):
        subprocess.run([ip, "address", "add", address, "dev", "lo"], check=True)
    # names of this namespace alone (its mount namespace is its own too): the one a Location names, and the
    # traps' addresses, which their servers look up as they start; nothing asks DNS
    (folder / "hosts").write_text("127.0.0.1 localhost\n10.0.0.5 lan.internal\n169.254.169.254 metadata.internal\n")
    subprocess.run(["mount", "--bind", str(folder / "hosts"), "/etc/hosts"], check=True)

    port = _free_port()
    (folder / "config.yml").write_text(stack.registry_config(port, folder / "data"))
    with open(folder / "registry.log", "ab") as log:
        server = subprocess.Popen([_registry_binary(), "serve",
                                   str(folder / "config.yml")], stdout=log, stderr=log)
    seen: dict[str, Any] = {}
    hits: list[str] = []
    try:
        _wait_for(port)
        registry = f"127.0.0.1:{port}"
        data = b"the base's layer"
        desc = Descriptor.of("application/octet-stream", data)
        Registry(registry).upload_blob("base/layers", desc, lambda: iter([data]))
        path = f"/v2/base/layers/blobs/{desc.digest}"
        with contextlib.ExitStack() as running:
            for address in ("10.0.0.5", "169.254.169.254"):
                for trap_port in (80, 443):
                    running.enter_context(_Server(_Trap, address=(address, trap_port))).hits = hits
            # the control: each target is there, and our own client reaches it when sent there directly
            for where in _TRAPPED:
                try:
                    seen.setdefault("direct", {})[where] = Connections().send("GET", where, {}, None).content.decode()
                except ConnectionFailed as e:  # https to a trap speaking plain http: reached all the same
                    seen["direct"][where] = str(e)
            seen["direct hits"], hits[:] = hits[:], []

            # the registry (the proxy in front of the real one, on loopback) answers the blob's GET with a 307
            proxy = running.enter_context(FaultyProxy(registry, []))
            socket_path = running.enter_context(broker.serve(folder, broker.Grant(proxy.host, "base/layers", None,
                                                                                  folder)))
            inside = Registry(proxy.host, Transport(proxy.host, connections=Connections(str(socket_path))))
            for where in _TRAPPED:
                proxy.overrides[path] = (307, {"Location": where}, b"")
                try:
                    ours = "followed: " + Registry(proxy.host).fetch_blob("base/layers", desc).decode()
                except BakeryError as e:
                    ours = f"{type(e).__name__}: {e}"
                # as the sandboxed rebuild asks the broker: the registry's own URL, over the socket
                relayed = Connections(str(socket_path)).send("GET", f"http://{proxy.host}{path}", {}, None)
                seen.setdefault("redirected", {})[where] = [ours, relayed.status_code,
                                                            relayed.content.decode(errors="replace")]
            # the rebuild's own client, through the broker: one error, not retried (the refusal would be the same)
            asked = len(proxy.seen)
            try:
                inside.fetch_blob("base/layers", desc)
            except BakeryError as e:
                seen["inside"] = [f"{type(e).__name__}: {e}", len(proxy.seen) - asked]
            # a token service the registry names at a metadata service (by address, and by a name)
            for realm in ("https://169.254.169.254/token", "https://metadata.internal/token"):
                proxy.overrides[path] = (401, {"WWW-Authenticate": f'Bearer realm="{realm}",service="x"'}, b"")
                try:
                    Registry(proxy.host).fetch_blob("base/layers", desc)
                except BakeryError as e:
                    seen.setdefault("realms", {})[realm] = f"{type(e).__name__}: {e}"
            # an upload's Location, which the registry hands us to PUT our blob to (and DELETE, if it fails)
            for lan in ("169.254.169.254", "10.0.0.5"):
                with FaultyProxy(registry, [], location_host=lan) as pushed:
                    other = lan.encode() + b" gets no blob of ours"
                    try:
                        Registry(pushed.host).upload_blob("base/pushed", Descriptor.of("application/octet-stream",
                                                                                      other), functools.partial(iter, [other]))
                        seen.setdefault("uploads", {})[lan] = "uploaded"
                    except BakeryError as e:
                        seen.setdefault("uploads", {})[lan] = f"{type(e).__name__}: {e}"
            seen["redirected hits"] = hits[:]

            # a name that resolves to a loopback address when judged and to a LAN address when asked again
            # (a hostile DNS server's rebinding; this process's resolver stands in for it): the connection
            # goes to the address judged, a blob store there (https, its certificate for the name), never
            # to the LAN service
            import ssl

            ca, cert, key = _certificates(folder, ["rebind.internal"])
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(cert, key)
            store = running.enter_context(_Server(_Blob, tls))
            store.blob, tls_port = data, store.server_address[1]
            running.enter_context(_Server(_Trap, address=("10.0.0.5", tls_port))).hits = hits
            os.environ["REQUESTS_CA_BUNDLE"] = str(ca)
            answers = {"rebind.internal": ["127.0.0.1", "10.0.0.5"]}
            resolve = socket.getaddrinfo

            def rebinding(host, port, *rest, **named):
                if host in answers:
                    host = answers[host].pop(0) if len(answers[host]) > 1 else answers[host][0]
                return resolve(host, port, *rest, **named)

            proxy.overrides[path] = (307, {"Location": f"https://rebind.internal:{tls_port}{path}"}, b"")
            socket.getaddrinfo = rebinding
            try:
                seen["rebound"] = Registry(proxy.host).fetch_blob("base/layers", desc).decode()
            except BakeryError as e:
                seen["rebound"] = f"{type(e).__name__}: {e}"
            finally:
                socket.getaddrinfo = resolve
            seen["rebound hits"] = hits[:]

            # a redirect the rule allows, from the registry on loopback to another loopback port (the real
            # registry itself), is followed by both: only the real registry holds these bytes
            proxy.overrides[path] = (307, {"Location": f"http://{registry}{path}"}, b"")
            seen["allowed"] = [Registry(proxy.host).fetch_blob("base/layers", desc).decode(),
                               inside.fetch_blob("base/layers", desc).decode()]
    finally:
        server.terminate()
        server.wait(10)
        (folder / "seen.json").write_text(json.dumps(seen, indent=1))


@pytest.mark.stack  # it starts a docker-registry of its own, in its namespace
def test_a_redirect_to_a_private_or_link_local_address_reaches_nothing_there_directly_or_through_the_broker(
        tmp_path):
    """A hostile registry answers a blob's GET with a 307 to a cloud's metadata service or a LAN
    service. Our client (Registry.fetch_blob) and the rebuild broker (asked over its socket, as the
    sandboxed rebuild asks it) refuse it with one error naming where it pointed, the broker relays
    none of that service's bytes, and nothing connects to it; the control shows each target there and
    reached when asked directly, and a redirect the rule allows followed by both.

    No packet may leave loopback on a test machine, even one that fails, so the targets exist only in
    a network namespace of the test's own (with a user namespace to be allowed to make it, and a
    mount namespace for its /etc/hosts), on its loopback device; all of it runs in a child there.
    The registry is a real one (distribution) behind tests/proxy.py, which serves the redirect: what
    is under test is our client and broker, not the registry."""
    code = (f"import sys; sys.path[:0] = {[str(Path(__file__).parent.parent), str(Path(__file__).parent)]!r}; "
            f"import test_http; test_http._redirects_in_this_namespace(__import__('pathlib').Path({str(tmp_path)!r}))")
    # a uid other than 0 inside: as root, broker.serve gives its socket to uid 65534, not mapped here;
    # --keep-caps lets it add the addresses and bind ports 80 and 443 all the same; --kill-child and
    # the pid namespace end the registry with the child, whatever happens
    ran = subprocess.run(["unshare", "--map-user=1000", "--map-group=1000", "--keep-caps", "--net", "--mount",
                          "--pid", "--kill-child", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp_path)})
    seen = json.loads((tmp_path / "seen.json").read_text()) if (tmp_path / "seen.json").exists() else {}
    assert ran.returncode == 0, ran.stderr[-3000:] + json.dumps(seen, indent=1)

    # the control: every target answers, and was hit, when our client is sent there directly
    for where in _TRAPPED:
        reached = seen["direct"][where]
        assert reached == _SECRET.decode() if where.startswith("http:") else "SSL" in reached, (where, reached)
    assert len(seen["direct hits"]) == len(_TRAPPED), seen["direct hits"]
    assert {h.split(":")[0] for h in seen["direct hits"]} == {"10.0.0.5", "169.254.169.254"}

    assert seen["redirected hits"] == []  # nothing connected to any target, neither ours nor the broker's
    for where in _TRAPPED:
        ours, status, relayed = seen["redirected"][where]
        named = where.split("/")[2].strip("[]")
        # the broker answers the sandbox with the refusal, never with the target's bytes
        assert status == 403 and "not followed" in relayed and named in relayed, (where, status, relayed)
        assert ours.startswith("RegistryError: GET: 127.0.0.1:") and "not followed" in ours, (where, ours)
        assert named in ours and ours.count("redirected to") == 1, (where, ours)
        assert _SECRET.decode() not in ours + relayed

    for lan, said in seen["uploads"].items():
        assert said.startswith("RegistryError: ") and "sent us to" in said and lan in said, (lan, said)
    said, asked = seen["inside"]
    assert said.startswith("RegistryError: GET ") and "HTTP 403" in said and "not followed" in said and asked == 1, \
        seen["inside"]
    for realm, said in seen["realms"].items():
        assert said.startswith("AuthError: ") and "169.254.169.254" in said and "refused" in said, (realm, said)

    assert seen["rebound"] == "the base's layer" and seen["rebound hits"] == [], (seen["rebound"], seen["rebound hits"])
    assert seen["allowed"] == ["the base's layer"] * 2


def test_a_retry_after_of_non_ascii_digits_is_read_as_none_not_a_crash():
    """str.isdigit takes "²" and float() does not: a registry's Retry-After of "²" was an internal
    error (exit 1) instead of a wait of our own choosing (found by review)."""
    from bakery.oci import transport

    said = transport.retry_after_seconds  # what asked_wait reads a 429's or 503's header with
    assert said("7") == 7.0
    assert said("²") is None and said("٣") is None


@contextlib.contextmanager
def _dripping(head: bytes, drip: bytes, every: float = 0.2):
    """A server that sends `head`, then `drip` every `every` s for as long as the client listens:
    each piece in time for any per-read timeout. Yields its URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    over = threading.Event()

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            try:
                conn.sendall(head)
                while not over.wait(every):
                    conn.sendall(drip)
            except OSError:
                pass  # the client gave up: what the test wants

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v2/x/blobs/sha256:0"
    finally:
        over.set()
        listener.close()


def _gives_up_in(seconds: float, exchange) -> ConnectionFailed:
    """The ConnectionFailed `exchange` ends in, within `seconds` (a thread, so that a hang fails the test)."""
    ended: list = []

    def run():
        try:
            exchange()
            ended.append(None)
        except ConnectionFailed as e:
            ended.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert ended and ended[0] is not None, f"still held after {seconds:.0f} s" if not ended else "no failure"
    return ended[0]


@pytest.mark.parametrize("head, drip, said", [
    # 100 Continue for ever: http.client reads interim answers in one getresponse(), no count limit
    (b"", b"HTTP/1.1 100 Continue\r\n\r\n", "no whole answer's head within 1 s"),
    # a header line at a time, up to http.client's 100 headers
    (b"HTTP/1.1 200 OK\r\n", b"X-Drip: 1\r\n", "no whole answer's head within 1 s"),
    # a chunked body's trailer lines: read within one read1(), no count limit
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nA\r\n0\r\n", b"X-Trailer: 1\r\n", "too slow"),
])
def test_a_server_that_drips_bytes_where_our_code_sees_no_read_is_given_up_in_time(head, drip, said):
    """Found by review: the pace was checked between the body's reads only, and a per-read timeout
    lets a byte every 299 s through. Each of these held a request for ever (the test's 10 s here)."""
    with _dripping(head, drip) as url:
        conns = Connections(timeout=(1, 1), pace=(1.0, 32 << 10))
        failed = _gives_up_in(10, lambda: conns.send("GET", url, {}, None).content)
    assert said in str(failed), failed


@contextlib.contextmanager
def _reading_at(bytes_per_second: int | None):
    """A server that reads a request's body at `bytes_per_second` (None: not at all, once its head
    came), then answers 201. Its receive buffer is kept small, so the client's sending waits on it.
    Yields its URL and what it received."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # inherited by what it accepts
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    over = threading.Event()
    received: dict[str, int] = {"body": 0}

    def serve():
        conn, _ = listener.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(1)
            length = int(data.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            try:
                while received["body"] < length:
                    if bytes_per_second is None:
                        over.wait()
                        return
                    piece = conn.recv(min(bytes_per_second // 16, length - received["body"]))
                    if not piece:
                        return
                    received["body"] += len(piece)
                    over.wait(len(piece) / bytes_per_second)
                conn.sendall(b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass  # the client gave up

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v2/x/blobs/uploads/1", received
    finally:
        over.set()
        listener.close()


def test_an_upload_on_a_link_slower_than_its_size_per_read_timeout_goes_through():
    """A chunk's body went in one sendall, which the socket's timeout (the read timeout, 300 s)
    bounds whole: an upload's 32 MiB chunk failed on any link under about 110 KiB/s. Scaled down
    here: 24 MiB at 4 MiB/s under a 1 s read timeout; the pace (32 KiB/s) is what bounds it now."""
    body = os.urandom(24 << 20)
    with _reading_at(4 << 20) as (url, received):
        conns = Connections(timeout=(1, 1), pace=(1.0, 32 << 10))
        resp = conns.send("PATCH", url, {}, body)
    assert resp.status_code == 201 and received["body"] == len(body), (resp.status_code, received)


def test_an_upload_the_server_stops_reading_is_given_up_at_its_pace():
    """Sent in pieces, each under the socket's timeout, a body could be held a timeout per piece by a
    server taking a little before each: the whole body has a download's pace as its deadline. Here
    1 s plus 1 s per 16 MiB, under a 30 s read timeout that bounded the one sendall before."""
    body = bytes(24 << 20)
    with _reading_at(None) as (url, _):
        conns = Connections(timeout=(1, 30), pace=(1.0, 16 << 20))
        failed = _gives_up_in(10, lambda: conns.send("PATCH", url, {}, body))
    assert "did not go within 2.5 s" in str(failed), failed


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Said: 1\r\n folded\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Said: 1\r\n\tfolded\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n X-Said: folded\r\nContent-Length: 0\r\n\r\n",  # after the status line: dropped, silently
])
def test_a_folded_header_line_is_a_malformed_answer(head):
    """RFC 9112 5.2 lets a recipient refuse obs-fold (a line begun by a space or a tab): http.client
    took it, keeping its line break in the value, where another reader sees a header of its own."""
    with _dripping(head, b"") as url:
        with pytest.raises(ConnectionFailed, match="folded header line"):
            Connections(timeout=(1, 1)).send("GET", url, {}, None)


@pytest.mark.parametrize("head", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nX-Said: a\r b\r\n\r\n",
    # http.client counts lines at LF; its parser splits them at a bare CR as well
    b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + b"Y: 1\r" * 500 + b"\r\n\r\n",
    b"HTTP/1.1 200 OK\rX-Said: 1\r\nContent-Length: 0\r\n\r\n",
])
def test_a_bare_carriage_return_in_the_head_is_a_malformed_answer(head):
    """A bare CR inside a line: the value keeps it (no LF for the fold check to see), or the parser
    makes a header of each piece, past the count of lines http.client bounds (second review)."""
    with _dripping(head, b"") as url:
        with pytest.raises(ConnectionFailed, match="a bare CR in a line of the answer"):
            Connections(timeout=(1, 1)).send("GET", url, {}, None)


def test_a_head_of_bare_carriage_returns_is_refused_as_it_is_read_not_after_parsing(monkeypatch):
    """Third attacker review: 99 lines of 64 KiB of `a:\\rb:\\r...` became two million headers, 374 MiB
    and 2.6 s an answer, before the count refused them; for a registry's answer and a proxy's answer
    to CONNECT alike. A line with a bare CR is refused as it is read: memory stays the head's size."""
    import tracemalloc

    lines = b"".join(b"X" + b"a:\rb" * 13000 + b"\r\n" for _ in range(99))
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n" + lines + b"\r\n"
    tracemalloc.start()
    try:
        with _dripping(head, b"") as url:
            with pytest.raises(ConnectionFailed, match="a bare CR in a line of the answer"):
                Connections(timeout=(1, 5)).send("GET", url, {}, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
    _clear_proxies(monkeypatch)
    with _dripping(b"HTTP/1.1 200 Connection established\r\n", b"X: a\rb\r\n\r\n") as url:
        monkeypatch.setenv("HTTPS_PROXY", url.split("/v2/")[0])
        with pytest.raises(ConnectionFailed, match="a bare CR in a line of the answer"):
            Connections(timeout=(1, 5)).send("GET", "https://registry.example/v2/", {}, None)


@pytest.mark.parametrize("drip, every, timeout, said", [
    # a header line in time for each read's timeout
    (b"X-Drip: 1\r\n", 0.2, (1, 1), "the proxy's answer to CONNECT did not come whole within 1 s"),
    # header lines without end, as fast as they go, under a deadline past the test's: their count ends it
    (b"X-Drip: 1\r\n" * 100, 0.01, (1, 60), "got more than 100 headers"),
])
def test_a_proxy_that_drips_or_never_ends_its_answer_to_connect_is_given_up_in_time(monkeypatch, drip, every,
                                                                                    timeout, said):
    """HTTPS_PROXY: http.client read the answer to CONNECT with each read's timeout only and no count
    of its header lines, so a proxy held the connect for ever (the test's 10 s here)."""
    _clear_proxies(monkeypatch)
    with _dripping(b"HTTP/1.1 200 Connection established\r\n", drip, every) as url:
        monkeypatch.setenv("HTTPS_PROXY", url.split("/v2/")[0])
        conns = Connections(timeout=timeout)
        failed = _gives_up_in(10, lambda: conns.send("GET", "https://registry.example/v2/", {}, None))
    assert said in str(failed), failed
