"""image/base.yaml and resolving a pinned base (through an index) on a real registry."""

from __future__ import annotations

import json

import pytest

from bakery.base import spec as base_mod
from bakery.errors import InputError
from bakery.oci.refs import Descriptor, Reference
from bakery.oci.registry import OCI_INDEX, Registry
from support import ROOT


def test_default_pin_is_the_seed_nightly():
    spec = base_mod.load_spec(ROOT / "image" / "base.yaml")
    assert str(spec.image) == ("docker.io/vllm/vllm-openai-rocm@sha256:"
                               "e68d18b2ba50298661bfc49baf01158fbf036645c2362cccf3e8a7a79fe6c69a")
    assert spec.platform == "linux/amd64"


@pytest.mark.parametrize("body, message", [
    ("image: vllm/vllm-openai-rocm:nightly\nplatform: linux/amd64\n", "has no digest"),
    ("image: vllm/x@sha256:" + "a" * 64 + "\nplatform: linux/amd64\ncolour: red\n", "unknown key"),
    ("image: [unclosed\n", "not valid YAML"),
    ("platform: linux/amd64\n", "missing key"),
    ("image: vllm/x@sha256:" + "a" * 64 + "\nplatform: amd64\n", "os/arch"),
])
def test_bad_base_yaml(tmp_path, body, message):
    (tmp_path / "base.yaml").write_text(body)
    with pytest.raises(InputError, match=message):
        base_mod.load_spec(tmp_path / "base.yaml")


def test_mirror_is_read_with_the_same_digest(tmp_path):
    (tmp_path / "base.yaml").write_text("image: vllm/x@sha256:" + "a" * 64 +
                                        "\nplatform: linux/amd64\nmirror: registry.example/mirror/x\n")
    spec = base_mod.load_spec(tmp_path / "base.yaml")
    assert str(spec.source) == "registry.example/mirror/x@sha256:" + "a" * 64
    assert spec.image.name == "docker.io/vllm/x"


def test_index_resolves_to_linux_amd64(registry, fixture_base, tmp_path):
    """An index whose first entry is another platform: the amd64 manifest must be chosen."""
    reg = Registry(registry)
    amd64 = base_mod.resolve(reg, fixture_base, "linux/amd64")
    # a second, different image for the arm64 slot: the fixture's config with one label changed
    config = amd64.config
    config.setdefault("config", {})["Labels"] = {"arch": "pretend-arm64"}
    cfg = json.dumps(config).encode()
    cfg_desc = Descriptor.of(amd64.config_descriptor.media_type, cfg)
    repo = fixture_base.repository
    reg.upload_blob(repo, cfg_desc, lambda: iter([cfg]))
    other = json.loads(amd64.manifest_bytes)
    other["config"] = cfg_desc.to_json()
    other_bytes = json.dumps(other).encode()
    other_digest = reg.put_manifest(repo, "arm64-stand-in", other_bytes, amd64.manifest_media_type)
    index = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
        {"mediaType": amd64.manifest_media_type, "digest": str(other_digest), "size": len(other_bytes),
         "platform": {"os": "linux", "architecture": "arm64"}},
        {"mediaType": amd64.manifest_media_type, "digest": str(amd64.manifest_digest),
         "size": len(amd64.manifest_bytes), "platform": {"os": "linux", "architecture": "amd64"}},
    ]}).encode()
    index_digest = reg.put_manifest(repo, "multi", index, OCI_INDEX)
    resolved = base_mod.resolve(reg, Reference(registry, repo, None, index_digest), "linux/amd64")
    assert resolved.manifest_digest == amd64.manifest_digest
    assert resolved.index_digest == index_digest
    with pytest.raises(InputError, match="no linux/s390x image"):
        base_mod.resolve(reg, Reference(registry, repo, None, index_digest), "linux/s390x")


