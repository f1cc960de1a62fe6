"""Bad input: one clear line on stderr, a non-zero exit, no traceback, nothing half-written."""

from __future__ import annotations

import json
import subprocess

import pytest

from bakery.oci.refs import Reference
from bakery.oci.registry import Registry
from proxy import FaultyProxy
from support import ROOT, invoke


def one_clear_line(result) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    return errors[0]


def test_unknown_yaml_key(project, fixture_base):
    (project / "image" / "image.yaml").write_text(
        (project / "image" / "image.yaml").read_text() + "entrypiont: [/bin/sh]\n")
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base)))
    assert "unknown key(s) entrypiont" in line and "image.yaml" in line
    assert not (project / "out").exists()


def test_tag_only_base(project):
    result = invoke(project, "build", "--base", "vllm/vllm-openai-rocm:nightly")
    line = one_clear_line(result)
    assert result.returncode == 2 and "has no digest" in line and "NAME@sha256" in line


def test_unreachable_registry(project):
    result = invoke(project, "build", "--base", "127.0.0.1:9/x/y@sha256:" + "a" * 64)
    line = one_clear_line(result)
    assert result.returncode == 3 and "unreachable" in line


def test_missing_input_file(project, fixture_base):
    (project / "image" / "selfcheck.py").unlink()
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base)))
    assert "selfcheck.py" in line and "is not a file" in line


def test_digest_mismatch_on_download(project, registry, fixture_base, tmp_path):
    """A proxy flips one byte of the base config: the build stops, nothing is pushed or recorded."""
    with FaultyProxy(registry, [("GET", "/blobs/", "corrupt")]) as proxy:
        base = f"{proxy.host}/{fixture_base.repository}@{fixture_base.digest}"
        result = invoke(project, "build", "--base", base, "--push", f"{registry}/test/never:v1",
                        env={"BAKERY_CACHE": str(tmp_path / "cache")})
    line = one_clear_line(result)
    assert result.returncode == 5 and "does not match" in line
    assert not (project / "out" / "build-record.json").exists()
    with pytest.raises(Exception, match="not found"):
        Registry(registry).get_manifest(Reference(registry, "test/never", "v1"))


def test_disk_full_during_layer_write(project, fixture_base, tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12k", "tmpfs", str(small)], check=True)
    try:
        result = invoke(project, "build", "--base", str(fixture_base), "--out", str(small / "out"))
        line = one_clear_line(result)
        assert result.returncode == 6 and "disk is full" in line
        leftovers = [p for p in small.rglob("*") if p.is_file()]
        assert not [p for p in leftovers if p.name.startswith(".partial")], leftovers
        assert not (small / "out" / "build-record.json").exists()
    finally:
        subprocess.run(["umount", str(small)], check=True)


def test_layout_into_a_non_layout_directory(project, fixture_base, tmp_path):
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    line = one_clear_line(invoke(project, "build", "--base", str(fixture_base), "--layout", str(tmp_path / "precious")))
    assert "not an OCI layout" in line
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"


def test_no_engine_is_one_line_with_the_environment_exit_code(project, tmp_path):
    """The Docker SDK's own exception never reaches the user as a traceback (the fixture is built by
    Docker; a build needs no engine at all)."""
    result = invoke(project, "fixture", "--registry", "127.0.0.1:5000",
                    env={"DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"})
    line = one_clear_line(result)
    assert result.returncode == 6 and "Docker" in line, result.stderr


def test_a_toolchain_named_by_tag_is_refused_in_one_line(project, fixture_base):
    """The compile's toolchain is read from its registry by digest (a tag could move under a rebuild)."""
    result = invoke(project, "build", "--base", str(fixture_base), env={"BAKERY_TOOLCHAIN": "bakery-toolchain:none"})
    line = one_clear_line(result)
    assert result.returncode == 2 and "toolchain image 'bakery-toolchain:none' has no digest" in line, result.stderr


# -- what a registry says, shown inert: its error bodies and headers are its own text ------------

# a new line that forges a workflow command (GitHub's runner acts on a line starting with ::), a
# carriage return that does the same where \r ends a line, a screen clear and a bidi override
HOSTILE = "no\n::error::forged\r::add-mask::forged\x1b[2J\u202edenrof"


def hostile_image(registry: str, repo: str):
    """A one-layer image of fresh bytes (the registry's storage outlives a run), pushed for real."""
    import io
    import tarfile
    import time

    from support import push_image

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = b"%d" % time.time_ns()
        info = tarfile.TarInfo("stamp")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return push_image(registry, repo, [raw.getvalue()])


def shown_inert(result) -> str:
    """The one error line, after checking that nothing of the registry's text can act anywhere in
    the output: no line of it starts a workflow command, no control character (an escape sequence,
    a carriage return) or bidi override is written raw, and the registry's text stays on the error
    line (a raw new line in it would start a line of the registry's choosing). invoke() reads the
    output as text with universal newlines, so a raw \\r shows as a line break here."""
    import unicodedata

    line = one_clear_line(result)
    out = result.stdout + result.stderr
    assert not [line for line in out.splitlines() if line.lstrip().startswith("::")], out
    assert not [c for c in out if c != "\n" and unicodedata.category(c) in ("Cc", "Cf")], ascii(out)
    assert not [line for line in out.splitlines() if "forged" in line and not line.startswith("error:")], out
    return line


@pytest.mark.parametrize("where, status, body, code", [
    ("manifests", 400, json.dumps({"errors": [{"code": "DENIED\n::error::code", "message": HOSTILE}]}), 3),
    ("manifests", 500, HOSTILE, 3),  # retried, then given up: the last answer is quoted
    ("blobs", 403, json.dumps({"errors": [{"code": "DENIED", "message": HOSTILE, "detail": HOSTILE}]}), 3),
    ("blobs", 418, HOSTILE * 50, 3),  # a plain body, long: only its start is quoted
], ids=["manifest-400-json", "manifest-500-plain", "blob-403-json", "blob-418-plain-long"])
def test_a_registrys_hostile_error_text_is_one_inert_line(registry, tmp_path, where, status, body, code):
    """A registry writes its error bodies: `invoke mirror` from it fails with one line that quotes
    them escaped, and the progress lines before it (a blob's copy) are as inert."""
    src = hostile_image(registry, "test/hostile-errors")
    config_or_manifest = f"/v2/test/hostile-errors/{where}/" + \
        (str(src.digest) if where == "manifests" else str(_config_of(registry, src)))
    hostile = {config_or_manifest: (status, {"Content-Type": "application/json"}, body.encode())}
    with FaultyProxy(registry, [], hostile) as proxy:
        result = invoke(ROOT, "mirror", "--base", f"{proxy.host}/test/hostile-errors@{src.digest}",
                        "--to", f"{registry}/test/hostile-copy-{tmp_path.name}",
                        env={"BAKERY_CACHE": str(tmp_path / "cache")})
    assert any(p == config_or_manifest for _, p in proxy.seen), "the hostile answer was served"
    line = shown_inert(result)
    assert result.returncode == code and f"HTTP {status}" in line, result.stderr
    assert "forged" in line, "the registry's words are still shown, escaped"
    assert len(line) < 2000, f"a hostile body is quoted in part, not whole: {len(line)} characters"


def _config_of(registry: str, ref):
    """The config blob's digest: the first blob `invoke mirror` copies, after a progress line."""
    from bakery.oci.manifest import Manifest

    body, _, _ = Registry(registry).get_manifest(ref)
    return Manifest.parse(body, "test image").blobs[0].digest


@pytest.mark.parametrize("echoed", [
    "sha256:\x1b[2J::error::forged" + "\u202e".encode().decode("latin-1"),  # U+202E as its UTF-8 bytes
    "::error::forged" + "f" * 20000,  # long: a header line may be 64 KiB
    "sha256:0\r\n ::error::forged",  # a folded header: Python's parser keeps the \r\n in the value
], ids=["controls", "long", "folded"])
def test_a_hostile_docker_content_digest_is_one_inert_line(registry, tmp_path, echoed):
    """The registry names the manifest's digest in a header; one that is not the bytes' digest is
    refused (integrity, exit 5), quoting it inert, in part, and on the error line alone."""
    src = hostile_image(registry, "test/hostile-digest")
    body, media_type, _ = Registry(registry).get_manifest(src)
    path = f"/v2/test/hostile-digest/manifests/{src.digest}"
    hostile = {path: (200, {"Content-Type": media_type, "Docker-Content-Digest": echoed}, body)}
    with FaultyProxy(registry, [], hostile) as proxy:
        result = invoke(ROOT, "mirror", "--base", f"{proxy.host}/test/hostile-digest@{src.digest}",
                        "--to", f"{registry}/test/hostile-copy-{tmp_path.name}",
                        env={"BAKERY_CACHE": str(tmp_path / "cache")})
    assert (("GET", path) in proxy.seen), "the hostile answer was served"
    line = shown_inert(result)
    if "\r\n " in echoed:  # a folded header is a malformed answer to the client itself (issue 50 item 8)
        assert result.returncode == 3 and "a folded header line (obs-fold)" in line, result.stderr
        return
    assert result.returncode == 5 and "lies about the digest" in line, result.stderr
    assert "forged" in line and len(line) < 1000, line
