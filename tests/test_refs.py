"""References and digests: parsing rules that the rest of the pipeline relies on."""

import pytest

from bakery.errors import InputError
from bakery.oci.refs import Descriptor, Digest, Reference

PIN = "sha256:e68d18b2ba50298661bfc49baf01158fbf036645c2362cccf3e8a7a79fe6c69a"


def test_docker_hub_short_names_are_made_explicit():
    ref = Reference.parse(f"vllm/vllm-openai-rocm@{PIN}")
    assert (ref.registry, ref.repository, ref.tag, str(ref.digest)) == \
           ("docker.io", "vllm/vllm-openai-rocm", None, PIN)
    assert Reference.parse("ubuntu:24.04").repository == "library/ubuntu"


def test_registry_with_port_and_tag():
    ref = Reference.parse("127.0.0.1:5000/a/b:v1")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == ("127.0.0.1:5000", "a/b", "v1", None)
    assert str(ref) == "127.0.0.1:5000/a/b:v1"


@pytest.mark.parametrize("text", ["vllm/vllm-openai-rocm:nightly", "vllm/vllm-openai-rocm", "ghcr.io/x/y:latest"])
def test_pinned_reference_refuses_tags(text):
    with pytest.raises(InputError, match="has no digest"):
        Reference.parse_pinned(text)


@pytest.mark.parametrize("text", ["sha256:abc", "md5:" + "0" * 32, "sha256:" + "G" * 64, "sha256" + "0" * 64])
def test_bad_digests_are_refused(text):
    with pytest.raises(InputError):
        Digest.parse(text)


def test_bad_repository_names_are_refused():
    with pytest.raises(InputError):
        Reference.parse("Registry.example/UPPER/case")


def test_descriptor_round_trip():
    d = Descriptor.of("application/octet-stream", b"hello", {"k": "v"})
    assert Descriptor.from_json(d.to_json()) == d
    assert d.to_json()["digest"] == "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"


@pytest.mark.parametrize("tag", ["v1\n", "nightly\n", "v1.0.0+b1", ".hidden", "x" * 129])
def test_a_tag_is_checked_whole(tag):
    """A trailing newline is no part of a tag a registry takes (nor of a log line's one line)."""
    from bakery.oci.refs import check_tag

    with pytest.raises(InputError):
        check_tag(tag)
    assert check_tag("nightly-2026.12.01_x") == "nightly-2026.12.01_x"
