"""Bad input: one clear line on stderr, a non-zero exit, no traceback, nothing half-written."""

from __future__ import annotations

import subprocess

import pytest

from bakery.oci.refs import Reference
from bakery.oci.registry import Registry

from support import invoke
from proxy import FaultyProxy


def one_clear_line(result) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [l for l in result.stderr.splitlines() if l.startswith("error:")]
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
