"""Caches that trust nothing: each cache is poisoned on disk, and the next build must notice, say
so in one warning line, fetch or make the entry again, and produce the same image digest."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support import invoke, last_line

CACHE = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))


@pytest.fixture
def warm(project, fixture_base):
    """A built project (so every cache holds its entries) and the digest it gives."""
    result = invoke(project, "build", "--base", str(fixture_base), "--layout", str(project / "out" / "layout0"))
    assert result.returncode == 0, result.stderr
    return project, last_line(result), json.loads((project / "out" / "build-record.json").read_text())


def rebuild(project, fixture_base, *extra) -> tuple[str, list[str]]:
    result = invoke(project, "build", "--base", str(fixture_base), *extra)
    assert result.returncode == 0, result.stderr
    return last_line(result), [line for line in result.stderr.splitlines() if line.startswith("warning:")]


def poison(path: Path, data: bytes | None = None) -> None:
    """Replace the entry with other bytes (its last bit flipped, or data) as a new file: a hardlinked
    copy elsewhere (test_crash's starting caches) stays intact."""
    if data is None:
        data = path.read_bytes()
        data = data[:-1] + bytes([data[-1] ^ 0x01]) if data else b"x"
    tmp = path.with_name(path.name + ".poison")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def test_a_poisoned_file_content_is_dropped_and_read_again(warm, fixture_base):
    project, digest, record = warm
    stock = next(o["base_sha256"] for o in record["overlays"] if o["id"] == "cpu-kv-transfer-fence")
    poison(CACHE / "files" / stock)
    again, warnings = rebuild(project, fixture_base)
    assert again == digest
    assert len(warnings) == 1 and f"file {stock[:12]}" in warnings[0]


def test_a_poisoned_layer_index_is_dropped_and_the_layer_read_again(warm, fixture_base):
    project, digest, record = warm
    top = record["base"]["layers"][-1]["digest"].split(":")[1]
    path = CACHE / "layers" / f"{top}.json"
    header, _, body = path.read_bytes().partition(b"\n")
    index = json.loads(body)
    index["whiteouts"].append("usr/local/lib/python3.12/dist-packages/vllm")  # would hide vLLM
    poison(path, header + b"\n" + json.dumps(index).encode())
    (CACHE / "views" / f"{record['base']['manifest']['digest'].split(':')[1]}.json").unlink()  # else unread
    again, warnings = rebuild(project, fixture_base)
    assert again == digest
    assert len(warnings) == 1 and f"layer index {top[:12]}" in warnings[0]


def test_a_poisoned_image_view_is_dropped_and_resolved_again(warm, fixture_base):
    """The view maps the fence's target to the bytes of another cached base file (the checksum
    line left as it was): the build must notice, resolve through the layers again, same digest."""
    project, digest, record = warm
    image = record["base"]["manifest"]["digest"].split(":")[1]
    path = CACHE / "views" / f"{image}.json"
    header, _, body = path.read_bytes().partition(b"\n")
    view = json.loads(body)
    fence = next(o for o in record["overlays"] if o["id"] == "cpu-kv-transfer-fence")
    other = next(o for o in record["overlays"] if o["id"] == "exact-swiglu-clamp-kernel")
    view["paths"][fence["target"].lstrip("/")][5] = other["base_sha256"]
    poison(path, header + b"\n" + json.dumps(view).encode())
    again, warnings = rebuild(project, fixture_base)
    assert again == digest
    assert len(warnings) == 1 and f"image view {image[:12]}" in warnings[0]


def test_a_poisoned_base_blob_is_not_linked_into_a_layout(warm, fixture_base):
    from bakery.oci.refs import Descriptor
    from bakery.oci.store import LayoutStore

    project, digest, record = warm
    layer = record["base"]["layers"][0]
    poison(CACHE / "blobs" / "sha256" / layer["digest"].split(":")[1])
    again, warnings = rebuild(project, fixture_base, "--layout", str(project / "out" / "layout1"))
    assert again == digest and len(warnings) == 1 and "corrupt cached blob" in warnings[0]
    blob = b"".join(LayoutStore(project / "out" / "layout1").stream(Descriptor.from_json(layer)))  # checks the digest
    assert len(blob) == layer["size"]


def test_a_poisoned_compile_output_is_compiled_again_to_the_same_bytes(warm, fixture_base):
    project, digest, record = warm
    shared_objects = list((CACHE / "hip").glob("*/_C_stable_libtorch.so"))
    assert shared_objects
    for so in shared_objects:
        poison(so)
    again, warnings = rebuild(project, fixture_base)
    assert again == digest  # compiling is reproducible: the same image
    assert len(warnings) == 1 and "corrupt compile cache entry" in warnings[0]
