"""`invoke mirror`: the pinned base copied by digest into your own registry, builds read it there."""

from __future__ import annotations

from bakery.dev import stack
from bakery.oci.registry import Registry
from support import invoke, last_line


def test_mirror_then_build_from_the_mirror(project, registry, fixture_base):
    other = stack.ensure_registry(5004, name="registry-other")
    result = invoke(project, "mirror", "--base", str(fixture_base), "--to", f"{other}/mirror/vllm-openai-rocm")
    assert result.returncode == 0, result.stderr
    mirrored = last_line(result)
    assert mirrored == f"{other}/mirror/vllm-openai-rocm@{fixture_base.digest}"  # same digest, byte for byte
    base_yaml = project / "image" / "base.yaml"
    base_yaml.write_text(f"image: {fixture_base}\nplatform: linux/amd64\nmirror: {other}/mirror/vllm-openai-rocm\n")
    from_mirror = invoke(project, "build", "--push", f"{other}/mirror-built/x:1")
    assert from_mirror.returncode == 0, from_mirror.stderr
    direct = invoke(project, "build", "--base", str(fixture_base), "--out", str(project / "out2"))
    # reading from the mirror changes nothing about the image
    assert last_line(from_mirror).split("@")[1] == last_line(direct).split("@")[1]
    assert "resolving base " + mirrored in from_mirror.stderr


def test_mirror_within_one_registry_mounts(registry, fixture_base, project):
    result = invoke(project, "mirror", "--base", str(fixture_base), "--to", f"{registry}/mirror/same")
    assert result.returncode == 0, result.stderr
    assert "copying blob" not in result.stderr
    assert Registry(registry).manifest_exists("mirror/same", fixture_base.digest)
