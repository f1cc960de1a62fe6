"""The registry client against the real CNCF distribution server (and a faulty proxy in front)."""

from __future__ import annotations

import base64
import json
import time

import pytest

from bakery.dev import stack
from bakery.errors import AuthError, IntegrityError, RegistryError, TransientError
from bakery.oci.http import Connections
from bakery.oci.refs import Descriptor, Digest, Reference
from bakery.oci.registry import OCI_MANIFEST, RESUMES, Registry
from bakery.oci.transport import Credentials, Transport
from proxy import Fault, FaultyProxy
from tokenserver import TokenServer, make_signing_material

BASIC_PORT, TOKEN_PORT, TOKEN_SERVICE_PORT = 5001, 5002, 5003


def blob(n: int, seed: int) -> bytes:
    return bytes((i * 131 + seed) % 251 for i in range(n))


def upload(reg: Registry, repo: str, data: bytes) -> Descriptor:
    desc = Descriptor.of("application/octet-stream", data)
    reg.upload_blob(repo, desc, lambda: iter([data]))
    return desc


def image_manifest(config: Descriptor, layers: list[Descriptor]) -> bytes:
    return json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                       "config": {**config.to_json(), "mediaType": "application/vnd.oci.image.config.v1+json"},
                       "layers": [{**layer.to_json(), "mediaType": "application/vnd.oci.image.layer.v1.tar"}
                                  for layer in layers]}).encode()


def test_monolithic_and_chunked_uploads_round_trip(registry):
    reg = Registry(registry)
    small, large = blob(1000, 1), blob(40 << 20, 2)  # large goes up in PATCH chunks
    for data in (small, large):
        desc = upload(reg, "test/blobs", data)
        assert reg.blob_exists("test/blobs", desc.digest)
        assert reg.fetch_blob("test/blobs", desc) == data


def test_existing_blob_is_not_uploaded_again(registry):
    data = blob(5000, 3)
    upload(Registry(registry), "test/head", data)
    with FaultyProxy(registry, []) as proxy:
        upload(Registry(proxy.host), "test/head", data)
    assert [m for m, _ in proxy.seen] == ["HEAD"]


def test_cross_repository_mount(registry):
    reg = Registry(registry)
    desc = upload(reg, "test/mount-src", blob(3000, 4))
    with FaultyProxy(registry, []) as proxy:
        assert Registry(proxy.host).mount_blob("test/mount-dst", desc.digest, "test/mount-src")
    assert reg.blob_exists("test/mount-dst", desc.digest)
    assert any(m == "POST" and "mount=" in p for m, p in proxy.seen)
    assert not any(m in ("PATCH", "PUT") for m, _ in proxy.seen)


def test_registry_refuses_manifest_whose_blobs_are_missing(registry):
    reg = Registry(registry)
    config = upload(reg, "test/missing", b"{}")
    ghost = Descriptor.of("application/octet-stream", b"never uploaded")
    with pytest.raises(RegistryError, match="BLOB_UNKNOWN"):
        reg.put_manifest("test/missing", "ghost", image_manifest(config, [ghost]), OCI_MANIFEST)
    with pytest.raises(RegistryError, match="not found"):
        reg.get_manifest(Reference(registry, "test/missing", "ghost"))


def test_retries_503_and_dropped_connections(registry):
    data = blob(20000, 5)
    desc = upload(Registry(registry), "test/retry", data)
    faults = [("GET", "/blobs/", "503"), ("GET", "/blobs/", "drop"), ("HEAD", "/blobs/", "503")]
    with FaultyProxy(registry, faults) as proxy:
        reg = Registry(proxy.host)
        assert reg.blob_exists("test/retry", desc.digest)
        assert reg.fetch_blob("test/retry", desc) == data
    assert not proxy.faults, "every fault was hit"
    assert sum(1 for m, p in proxy.seen if m == "GET" and "/blobs/" in p) == 3


def _resume_case(registry: str, name: str) -> tuple[bytes, Descriptor, str]:
    data = blob(6 << 20, 11) + b"%d" % time.time_ns()
    return data, upload(Registry(registry), f"test/{name}", data), f"/v2/test/{name}/blobs/"


def test_a_blob_transfer_that_breaks_off_is_resumed_where_it_stopped(registry):
    """A reset or a short body mid-blob failed the whole read (a base layer's scan, publish's download
    of a base layer, a kernel artifact's fetch: the command ended, exit 3); the mirror's upload
    started the blob over. Now the read goes on from the byte it reached, with a Range request."""
    data, desc, path = _resume_case(registry, "resume")
    script = [Fault("reset", 1, "GET", "/blobs/"), Fault("short", 2, "GET", "/blobs/")]
    with FaultyProxy(registry, [], script=script) as proxy:
        assert Registry(proxy.host).fetch_blob("test/resume", desc) == data
    asked = [r for m, p, r in proxy.ranges if m == "GET" and p.startswith(path)]
    assert len(asked) == 3 and asked[0] is None, asked
    starts = [int(r.removeprefix("bytes=").removesuffix("-")) for r in asked[1:]]
    assert 0 < starts[0] < starts[1] < len(data), asked  # each from where the last broke off, not from 0


def test_a_registry_that_answers_a_range_with_the_whole_blob_has_what_is_held_skipped(registry):
    """Range is optional to a server: a 200 carries the blob from its first byte again."""
    data, desc, path = _resume_case(registry, "resume-whole")
    whole: dict[str, tuple[int, dict[str, str], bytes]] = {path + str(desc.digest): (200, {}, data)}  # the answer to every request after the first
    with FaultyProxy(registry, [], whole, script=[Fault("reset", 1, "GET", "/blobs/")]) as proxy:
        assert Registry(proxy.host).fetch_blob("test/resume-whole", desc) == data
    assert [r is not None for m, _, r in proxy.ranges if m == "GET"] == [False, True]


def test_a_resumed_blob_is_still_checked_against_its_digest(registry):
    """The joined pieces are trusted for their digest alone: a second answer of other bytes fails it."""
    data, desc, path = _resume_case(registry, "resume-other")
    other: dict[str, tuple[int, dict[str, str], bytes]] = {path + str(desc.digest): (200, {}, data[:-1] + bytes([data[-1] ^ 1]))}
    with FaultyProxy(registry, [], other, script=[Fault("reset", 1, "GET", "/blobs/")]) as proxy:
        with pytest.raises(IntegrityError, match="does not match its descriptor"):
            Registry(proxy.host).fetch_blob("test/resume-other", desc)


def test_a_range_answered_from_another_byte_is_refused(registry):
    data, desc, path = _resume_case(registry, "resume-range")
    elsewhere = {path + str(desc.digest): (206, {"Content-Range": f"bytes 0-{len(data) - 1}/{len(data)}"}, data)}
    with FaultyProxy(registry, [], elsewhere, script=[Fault("reset", 1, "GET", "/blobs/")]) as proxy:
        with pytest.raises(RegistryError, match="asked for the bytes from"):
            Registry(proxy.host).fetch_blob("test/resume-range", desc)


def test_a_transfer_that_keeps_breaking_off_ends_after_its_resumes(registry):
    data, desc, path = _resume_case(registry, "resume-always")
    with FaultyProxy(registry, [], script=[Fault("reset", 1, "GET", "/blobs/", times=100)]) as proxy:
        with pytest.raises(TransientError, match=f"{RESUMES} times resumed"):
            Registry(proxy.host).fetch_blob("test/resume-always", desc)
    assert sum(1 for m, p, _ in proxy.ranges if m == "GET" and p.startswith(path)) == RESUMES + 1


def test_failed_upload_posts_and_patches_are_not_resent_the_session_starts_over(registry):
    """POST opens a session and PATCH appends to it: resending either could act twice. A failed
    one makes the client cancel the session and start a fresh one with fresh bytes."""
    salt = b"%d" % time.time_ns()  # new bytes: the registry's storage outlives a run
    small, large = blob(20000, 8) + salt, blob(9 << 20, 9) + salt  # large: PATCH chunks
    faults = [("POST", "/blobs/uploads/", "503"), ("PATCH", "/blobs/uploads/", "drop")]
    with FaultyProxy(registry, faults) as proxy:
        reg = Registry(proxy.host)
        a, b = upload(reg, "test/sessions", small), upload(reg, "test/sessions", large)
    assert not proxy.faults, "every fault was hit"
    assert Registry(registry).fetch_blob("test/sessions", a) == small
    assert Registry(registry).fetch_blob("test/sessions", b) == large
    methods = [m for m, p in proxy.seen if "/blobs/uploads/" in p]
    # small: POST (503, not resent), POST, PUT; large: POST, PATCH (dropped), DELETE, POST, PATCH..., PUT
    assert methods[:3] == ["POST", "POST", "PUT"]
    assert methods[3:6] == ["POST", "PATCH", "DELETE"] and methods[6] == "POST" and methods[-1] == "PUT"


def test_a_missing_manifest_is_told_by_status_not_text(registry):
    """A 404 whose body says something else is still 'not there'; a 500 saying 'not found' is not."""
    from bakery.oci.store import RegistryStore

    store = RegistryStore(Reference(registry, "test/nowhere", "latest"))
    assert store.manifest("no-such-tag") is None
    with FaultyProxy(registry, [("GET", "/manifests/", "503")] * 5) as proxy:
        with pytest.raises(RegistryError, match="HTTP 503"):
            RegistryStore(Reference(proxy.host, "test/nowhere", "latest")).manifest("no-such-tag")


@pytest.mark.parametrize("host, scheme", [
    ("127.0.0.1:5000", "http"), ("127.1.2.3", "http"), ("[::1]:5000", "http"), ("localhost:5000", "http"),
    ("127.example.com", "https"), ("127.0.0.1.nip.io:5000", "https"), ("ghcr.io", "https"), ("10.0.0.1:5000", "https"),
])
def test_plain_http_only_to_loopback_addresses(host, scheme, monkeypatch):
    from bakery.oci.transport import scheme_for

    monkeypatch.delenv("BAKERY_INSECURE_REGISTRIES", raising=False)
    assert scheme_for(host) == scheme


@pytest.mark.parametrize("realm, allowed", [
    ("https://auth.example.com/token", True), ("http://127.0.0.1:5003/token", True),
    ("http://auth.example.com/token", False), ("http://127.example.com/token", False), ("ftp://x/token", False),
])
def test_basic_credentials_go_only_to_an_https_or_loopback_realm(realm, allowed):
    from bakery.oci.transport import realm_may_receive_credentials

    assert realm_may_receive_credentials(realm) is allowed


def test_environment_credentials_only_for_the_registries_they_name(monkeypatch):
    from bakery.errors import InputError
    from bakery.oci.transport import load_credentials

    monkeypatch.setenv("DOCKER_CONFIG", "/nonexistent")
    monkeypatch.setenv("BAKERY_REGISTRY_USER", "bob")
    monkeypatch.setenv("BAKERY_REGISTRY_PASSWORD", "hunter2")
    monkeypatch.delenv("BAKERY_REGISTRY_HOSTS", raising=False)
    with pytest.raises(InputError, match="BAKERY_REGISTRY_HOSTS is not"):
        load_credentials("ghcr.io")
    monkeypatch.setenv("BAKERY_REGISTRY_HOSTS", "ghcr.io,registry.internal:5000")
    assert load_credentials("ghcr.io") == Credentials("bob", "hunter2")
    assert load_credentials("registry.internal:5000") == Credentials("bob", "hunter2")
    assert load_credentials("evil.example.com") is None


def test_corrupted_download_is_refused_and_leaves_nothing(registry, tmp_path):
    desc = upload(Registry(registry), "test/corrupt", blob(10000, 6))
    with FaultyProxy(registry, [("GET", "/blobs/", "corrupt")]) as proxy:
        with pytest.raises(IntegrityError, match="does not match"):
            Registry(proxy.host).download_blob("test/corrupt", desc, tmp_path / "blob")
    assert list(tmp_path.iterdir()) == []


def test_progress_is_shown_for_transfers_over_a_second(registry, capsys):
    desc = upload(Registry(registry), "test/slow", blob(100000, 7))
    with FaultyProxy(registry, [("GET", "/blobs/", "slow")]) as proxy:
        Registry(proxy.host).fetch_blob("test/slow", desc)
    err = capsys.readouterr().err
    assert "of 97.7 KiB" in err and "done" in err
    Registry(registry).fetch_blob("test/slow", desc)  # fast: silent
    assert capsys.readouterr().err == ""


@pytest.mark.slow
def test_unreachable_registry_is_one_clear_error():
    with pytest.raises(RegistryError, match=r"unreachable \(after 5 attempts\)"):
        Registry("127.0.0.1:9").blob_exists("x/y", Descriptor.of("", b"").digest)


# -- authentication, against registries configured for it -------------------------------------

def test_basic_auth_refuses_anonymous_with_next_step(basic_registry, monkeypatch):
    monkeypatch.delenv("BAKERY_REGISTRY_USER", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", "/nonexistent")
    with pytest.raises(AuthError, match="docker login 127.0.0.1:5001"):
        Registry(basic_registry).blob_exists("test/basic", Descriptor.of("", b"").digest)


def test_basic_auth_from_docker_config(basic_registry, tmp_path, monkeypatch):
    config = {"auths": {basic_registry: {"auth": base64.b64encode(b"alice:s3cret").decode()}}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    reg = Registry(basic_registry)
    desc = upload(reg, "test/basic", b"basic auth works")
    assert reg.fetch_blob("test/basic", desc) == b"basic auth works"


def test_basic_auth_wrong_password(basic_registry):
    reg = Registry(basic_registry, Transport(basic_registry, Credentials("alice", "wrong")))
    with pytest.raises(AuthError, match="access denied"):
        reg.blob_exists("test/basic", Descriptor.of("", b"").digest)


@pytest.fixture(scope="module")
def token_registry():
    key, cert = make_signing_material(stack.state_dir() / "token")
    server = TokenServer(key, cert, "bakery-test", "bakery-test-issuer", {"bob": "hunter2"}, TOKEN_SERVICE_PORT)
    auth = {"token": {"realm": server.realm, "service": "bakery-test", "issuer": "bakery-test-issuer",
                      "rootcertbundle": str(cert)}}
    host = stack.ensure_registry(TOKEN_PORT, auth=auth, name="registry-token")
    yield host, server
    server.close()


def test_bearer_token_flow_push_and_pull(token_registry, monkeypatch):
    host, server = token_registry
    monkeypatch.setenv("BAKERY_REGISTRY_USER", "bob")
    monkeypatch.setenv("BAKERY_REGISTRY_PASSWORD", "hunter2")
    monkeypatch.setenv("BAKERY_REGISTRY_HOSTS", host)
    reg = Registry(host)
    data = b"bearer works %d" % time.time_ns()  # new bytes: the registry's storage outlives a run
    desc = upload(reg, "test/token", data)
    assert reg.fetch_blob("test/token", desc) == data
    assert ("bob", ["repository:test/token:pull,push"]) in server.requests


def test_bearer_token_anonymous_cannot_push(token_registry, monkeypatch):
    host, _ = token_registry
    monkeypatch.delenv("BAKERY_REGISTRY_USER", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", "/nonexistent")
    with pytest.raises(AuthError):
        upload(Registry(host), "test/token-anon", b"should not land %d" % time.time_ns())


# -- what a hostile registry can and cannot make us do ----------------------------------------------

def alice(host: str) -> Transport:
    return Transport(host, Credentials("alice", "s3cret"))


def test_an_upload_location_on_another_origin_gets_no_credentials(basic_registry):
    """The registry (proxy A) answers POST with a Location on another origin (B, which forwards to
    the same registry): B must see no Authorization header, and its 401 must not be answered."""
    data = b"to another origin %d" % time.time_ns()
    with FaultyProxy(basic_registry, []) as elsewhere, \
            FaultyProxy(basic_registry, [], location_host=elsewhere.host) as proxy:
        reg = Registry(proxy.host, alice(proxy.host))
        with pytest.raises(AuthError, match="credentials go only to the registry's own origin"):
            upload(reg, "test/elsewhere", data)
    assert elsewhere.authorization and all(auth is None for _, _, auth in elsewhere.authorization)
    assert any(auth for m, _, auth in proxy.authorization if m == "POST")  # the registry's own origin got them


def test_the_same_upload_on_the_registrys_own_origin_goes_through(basic_registry):
    """The control: without the detour, the same credentials push the same way."""
    data = b"own origin %d" % time.time_ns()
    with FaultyProxy(basic_registry, []) as proxy:
        desc = upload(Registry(proxy.host, alice(proxy.host)), "test/elsewhere", data)
    assert Registry(basic_registry, alice(basic_registry)).fetch_blob("test/elsewhere", desc) == data
    assert all(auth for m, _, auth in proxy.authorization if m in ("PUT", "PATCH"))


def test_a_redirect_to_another_origin_is_followed_without_credentials(basic_registry):
    """Registries send blob reads to storage elsewhere (S3, a CDN): followed, credentials withheld."""
    desc = upload(Registry(basic_registry, alice(basic_registry)), "test/redirect", b"stored elsewhere")
    with FaultyProxy("127.0.0.1:9", [], {"/bucket/blob": (200, {}, b"stored elsewhere")}) as storage:
        redirect = {f"/v2/test/redirect/blobs/{desc.digest}":
                    (307, {"Location": f"http://{storage.host}/bucket/blob"}, b"")}
        with FaultyProxy(basic_registry, [], redirect) as proxy:
            reg = Registry(proxy.host, alice(proxy.host))
            assert not reg.blob_exists("test/redirect", Digest.of(b"absent"))  # logs in: basic auth from now on
            assert reg.fetch_blob("test/redirect", desc) == b"stored elsewhere"
    assert proxy.authorization[-1][0] == "GET" and proxy.authorization[-1][2].startswith("Basic ")
    assert storage.authorization == [("GET", "/bucket/blob", None)]


def endless(chunk: bytes = b"{" * 65536):
    def body():
        while True:
            yield chunk
    return body


def test_a_manifest_over_4_mib_is_refused_without_reading_on(registry):
    """An endless manifest of no announced length: we stop at 4 MiB, the server could send forever."""
    digest = "sha256:" + "7" * 64
    with FaultyProxy(registry, [], {f"/v2/test/huge/manifests/{digest}": (200, {"Content-Type": OCI_MANIFEST},
                                                                          endless())}) as proxy:
        with pytest.raises(IntegrityError, match="over the 4194304-byte limit"):
            Registry(proxy.host).get_manifest(Reference.parse(f"{proxy.host}/test/huge@{digest}"))
        time.sleep(0.5)
    assert 4 << 20 < proxy.sent < 32 << 20  # what socket buffers hold beyond the limit, not gigabytes


def test_a_manifest_announced_over_4_mib_is_refused_before_its_body(registry):
    body = b" " * (5 << 20)
    with FaultyProxy(registry, [], {"/v2/test/huge/manifests/big": (200, {"Content-Type": OCI_MANIFEST}, body)}) \
            as proxy:
        with pytest.raises(IntegrityError, match="announces 5242880 bytes, over the 4194304-byte limit"):
            Registry(proxy.host).get_manifest(Reference.parse(f"{proxy.host}/test/huge:big"))


def test_an_error_body_over_64_kib_is_refused(registry):
    with FaultyProxy(registry, [], {"/v2/test/huge/manifests/err": (403, {}, endless(b"x" * 4096))}) as proxy:
        with pytest.raises(RegistryError, match="error body: the response is over the 65536-byte limit"):
            Registry(proxy.host).get_manifest(Reference.parse(f"{proxy.host}/test/huge:err"))


def test_a_document_claiming_over_4_mib_is_not_fetched(registry):
    desc = Descriptor("application/vnd.oci.image.config.v1+json", Digest.parse("sha256:" + "8" * 64), 5 << 20)
    with FaultyProxy(registry, []) as proxy:
        with pytest.raises(IntegrityError, match="claims 5242880 bytes, over the 4194304-byte limit"):
            Registry(proxy.host).fetch_document("test/huge", desc, "config")
    assert proxy.seen == []


def test_a_not_found_answer_is_read_only_up_to_64_kib(registry):
    """A 404 is an answer we expect (and then ignore the body of): it gets the error bodies' bound."""
    with FaultyProxy(registry, [], {"/v2/test/huge/manifests/gone": (404, {}, endless(b"x" * 4096))}) as proxy:
        with pytest.raises(IntegrityError, match="over the 65536-byte limit"):
            Registry(proxy.host).get_manifest(Reference.parse(f"{proxy.host}/test/huge:gone"))


def test_an_upload_answer_without_location_is_one_clear_error(registry):
    with FaultyProxy(registry, [], {"/v2/test/noloc/blobs/uploads/": (202, {}, b"")}) as proxy:
        with pytest.raises(RegistryError, match="without a Location header"):
            upload(Registry(proxy.host), "test/noloc", b"no location %d" % time.time_ns())


def test_a_redirect_to_an_unreadable_location_is_one_clear_error(registry):
    digest = "sha256:" + "6" * 64
    with FaultyProxy(registry, [], {f"/v2/test/odd/manifests/{digest}": (307, {"Location": "http://[::1"}, b"")}) \
            as proxy:
        with pytest.raises(RegistryError, match="unreadable Location"):
            Registry(proxy.host).get_manifest(Reference.parse(f"{proxy.host}/test/odd@{digest}"))


def test_a_layout_index_over_4_mib_is_refused(tmp_path):
    from bakery.oci.store import LayoutStore

    (tmp_path / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (tmp_path / "index.json").write_bytes(b'{"manifests": []' + b" " * (5 << 20) + b"}")
    with pytest.raises(IntegrityError, match="over the 4194304-byte limit"):
        LayoutStore(tmp_path).manifest("latest")


def test_a_redirect_with_an_endless_body_is_followed_without_reading_it(registry):
    """A redirect's body is never read (requests' Session read it whole even when not following it)."""
    desc = upload(Registry(registry), "test/redirect-body", b"the blob itself")
    with FaultyProxy("127.0.0.1:9", [], {"/bucket/blob": (200, {}, b"the blob itself")}) as storage:
        redirect = {f"/v2/test/redirect-body/blobs/{desc.digest}":
                    (307, {"Location": f"http://{storage.host}/bucket/blob"}, endless(b"r" * 65536))}
        with FaultyProxy(registry, [], redirect) as proxy:
            assert Registry(proxy.host).fetch_blob("test/redirect-body", desc) == b"the blob itself"
            time.sleep(0.5)
    assert proxy.sent < 32 << 20


class NoSend(Connections):
    def send(self, method, url, headers, body, timeout=None, address=None):
        raise AssertionError(f"sent a request to {url}")


@pytest.mark.parametrize("realm", ["http://169.254.169.254/latest/meta-data", "file:///etc/passwd", "ftp://x/token",
                                   "https://[x"])
def test_an_https_registry_cannot_send_us_to_a_plain_token_service(realm):
    """The realm comes from the registry's 401: a plain one would make us fetch an internal URL for it.
    Nothing is requested (the session refuses to send anything)."""
    transport = Transport("registry.example.com", connections=NoSend())
    with pytest.raises(AuthError, match="refused \\(an https registry's must be https"):
        transport._fetch_token({"realm": realm, "service": "x"}, ("repository:a/b:pull",))


def test_a_plain_registry_may_name_only_a_token_service_on_its_own_host():
    transport = Transport("127.0.0.1:5999", connections=NoSend())  # loopback: plain http
    with pytest.raises(AuthError, match="a plain one's must be on its own host"):
        transport._fetch_token({"realm": "http://127.0.0.2:80/token"}, ("repository:a/b:pull",))
    with pytest.raises(AuthError, match="refused"):
        transport._fetch_token({"realm": "https://[x"}, ())  # unparsable: one clear error, not a crash


@pytest.mark.parametrize("make", ["link to /dev/zero", "fifo"])
def test_a_layout_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path, make):
    """A layout handed over by anyone: index.json as a link to an endless device, or a FIFO that
    never answers, is refused instead of read (both would hang or exhaust memory)."""
    import os

    from bakery.oci.store import LayoutStore

    (tmp_path / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    if make == "fifo":
        os.mkfifo(tmp_path / "index.json")
    else:
        (tmp_path / "index.json").symlink_to("/dev/zero")
    with pytest.raises(IntegrityError, match="index"):
        LayoutStore(tmp_path).manifest("latest")


def test_a_netrc_default_entry_goes_nowhere(registry, tmp_path, monkeypatch):
    """requests filled Authorization from ~/.netrc for any host a URL names (a `default` entry for
    all of them): not ours. A redirect target, and the registry itself, see no such header."""
    (tmp_path / "netrc").write_text("default login leaked password from-netrc\n")
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    desc = upload(Registry(registry), "test/netrc", b"netrc must not leak")
    with FaultyProxy("127.0.0.1:9", [], {"/bucket/blob": (200, {}, b"netrc must not leak")}) as storage:
        redirect = {f"/v2/test/netrc/blobs/{desc.digest}": (307, {"Location": f"http://{storage.host}/bucket/blob"}, b"")}
        with FaultyProxy(registry, [], redirect) as proxy:
            assert Registry(proxy.host).fetch_blob("test/netrc", desc) == b"netrc must not leak"
    assert [a for _, _, a in proxy.authorization + storage.authorization] == [None, None]


@pytest.mark.parametrize("token", ["a\r\nX-Injected: 1", "t\u0100ken", "two words"])
def test_a_token_no_header_can_carry_is_refused_in_one_line(token):
    """The token service is the registry's to name: a token with CR/LF, a space or a character past
    Latin-1 would otherwise break (or smuggle into) the next request's Authorization header."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Service(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path.startswith("/token"):
                body, status, headers = json.dumps({"token": token}).encode(), 200, {}
            else:
                realm = f"http://127.0.0.1:{self.connection.getsockname()[1]}/token"
                body, status = b"{}", 401
                headers = {"WWW-Authenticate": f'Bearer realm="{realm}",service="x"'}
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Service)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        host = f"127.0.0.1:{server.server_address[1]}"
        with pytest.raises(AuthError, match="not printable ASCII"):
            Registry(host).get_manifest(Reference.parse(f"{host}/a/b:latest"))
    finally:
        server.shutdown()
        server.server_close()


def test_the_warning_about_a_plain_token_service_shows_its_realm_inert(monkeypatch, capsys):
    """The registry names the realm in its WWW-Authenticate; the warning that credentials are withheld
    from it quotes it, and so does the error that follows. No request is sent: the transport's send
    fails at once."""
    from bakery.oci import transport
    from bakery.oci.http import ConnectionFailed

    monkeypatch.setenv("BAKERY_INSECURE_REGISTRIES", "registry.internal:5000")
    t = transport.Transport("registry.internal:5000", Credentials("bob", "hunter2"))

    def refuse(*args, **kwargs):
        raise ConnectionFailed("not sent")

    monkeypatch.setattr(t, "_send_once", refuse)
    monkeypatch.setattr(transport.time, "sleep", lambda s: None)
    with pytest.raises(RegistryError, match="unreachable") as raised:
        t._fetch_token({"realm": "http://registry.internal:5000/t\x1b]0;owned\x07\n::error::forged"}, ())
    err = capsys.readouterr().err
    assert "credentials withheld" in err and "\x1b" not in err and "\\x1b]0;owned\\x07\\x0a::error::forged" in err
    # the error's one line is the edge's to print (it keeps line breaks of ours): the realm has none
    assert "\\x1b]0;owned\\x07\\x0a::error::forged unreachable" in str(raised.value), raised.value
