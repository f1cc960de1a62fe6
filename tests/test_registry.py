"""The registry client against the real CNCF distribution server (and a faulty proxy in front)."""

from __future__ import annotations

import base64
import json
import subprocess
import time

import pytest

from bakery import stack
from bakery.errors import AuthError, IntegrityError, RegistryError
from bakery.refs import Descriptor, Reference
from bakery.registry import OCI_MANIFEST, Registry
from bakery.transport import Credentials, Transport

from proxy import FaultyProxy
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
                       "layers": [{**l.to_json(), "mediaType": "application/vnd.oci.image.layer.v1.tar"}
                                  for l in layers]}).encode()


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
    from bakery.store import RegistryStore

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
    from bakery.transport import scheme_for

    monkeypatch.delenv("BAKERY_INSECURE_REGISTRIES", raising=False)
    assert scheme_for(host) == scheme


@pytest.mark.parametrize("realm, allowed", [
    ("https://auth.example.com/token", True), ("http://127.0.0.1:5003/token", True),
    ("http://auth.example.com/token", False), ("http://127.example.com/token", False), ("ftp://x/token", False),
])
def test_basic_credentials_go_only_to_an_https_or_loopback_realm(realm, allowed):
    from bakery.transport import realm_may_receive_credentials

    assert realm_may_receive_credentials(realm) is allowed


def test_environment_credentials_only_for_the_registries_they_name(monkeypatch):
    from bakery.errors import InputError
    from bakery.transport import load_credentials

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


def test_unreachable_registry_is_one_clear_error():
    with pytest.raises(RegistryError, match=r"unreachable \(after 5 attempts\)"):
        Registry("127.0.0.1:9").blob_exists("x/y", Descriptor.of("", b"").digest)


# -- authentication, against registries configured for it -------------------------------------

@pytest.fixture(scope="module")
def basic_registry():
    htpasswd = stack.state_dir() / "htpasswd"
    htpasswd.write_text(subprocess.run(["htpasswd", "-Bbn", "alice", "s3cret"], capture_output=True,
                                       text=True, check=True).stdout)
    auth = {"htpasswd": {"realm": "bakery-test", "path": str(htpasswd)}}
    return stack.ensure_registry(BASIC_PORT, auth=auth, name="registry-basic")


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
