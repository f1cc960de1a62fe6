"""Manifest.parse: the one reader of the image manifests bakery gets from stores (registries, base
builders, signers). Whatever way one is malformed is one IntegrityError naming it."""

from __future__ import annotations

import json

import pytest

from bakery.errors import IntegrityError
from bakery.oci.manifest import Manifest

DIGEST = "sha256:" + "ab" * 32
LAYER = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": DIGEST, "size": 3,
         "annotations": {"org.opencontainers.image.title": "a.so"}}
GOOD = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.example", "annotations": {"k": "v"},
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": DIGEST, "size": 2},
        "layers": [LAYER, LAYER]}


def test_a_manifest_gives_its_config_layers_and_artifact_type():
    m = Manifest.parse(json.dumps(GOOD).encode(), "manifest x")
    assert str(m.config.digest) == DIGEST and m.config.size == 2
    assert [layer.annotations["org.opencontainers.image.title"] for layer in m.layers] == ["a.so", "a.so"]
    assert m.blobs == (m.config, *m.layers)
    assert (m.artifact_type, m.annotations) == ("application/vnd.example", {"k": "v"})


@pytest.mark.parametrize("body", [
    b"not json",
    b"[]",
    json.dumps({**GOOD, "config": None}).encode(),
    json.dumps({k: v for k, v in GOOD.items() if k != "layers"}).encode(),
    json.dumps({**GOOD, "layers": [{"mediaType": "x", "size": 1}]}).encode(),  # no digest
    json.dumps({**GOOD, "layers": [{**LAYER, "digest": "sha256:short"}]}).encode(),
    json.dumps({**GOOD, "annotations": ["k"]}).encode(),
    json.dumps({**GOOD, "layers": "all of them"}).encode(),
    json.dumps({**GOOD, "layers": {}}).encode(),  # read as no layers before
    json.dumps({**GOOD, "layers": ""}).encode(),
])
def test_a_malformed_manifest_is_one_integrity_error_naming_it(body):
    with pytest.raises(IntegrityError, match=r"^manifest of somewhere is malformed \("):
        Manifest.parse(body, "manifest of somewhere")


def test_past_the_layer_limit_is_refused_before_any_descriptor_is_read():
    body = json.dumps({**GOOD, "layers": [LAYER] * 3}).encode()
    assert len(Manifest.parse(body, "m", layer_limit=3).layers) == 3
    with pytest.raises(IntegrityError, match="it lists 4 layers, past the 3 it may"):
        Manifest.parse(json.dumps({**GOOD, "layers": [LAYER] * 4}).encode(), "m", layer_limit=3)
