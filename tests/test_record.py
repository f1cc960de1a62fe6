"""The build record as typed values: it reads back to the bytes it was written with, the SBOM and
provenance made from it are the bytes the dict-reading code made, and a record of another shape is
one input error that names the key.

tests/data/build-record.json is a record a build wrote here, with the branches a demo build does not
take filled in by hand: an index pin, a proof verdict taken from a registry and one proven and
pushed, and a layout output.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest

from bakery.errors import InputError
from bakery.oci.refs import Reference
from bakery.trust import provenance, record
from bakery.trust.statement import Statement

RECORD = Path(__file__).parent / "data" / "build-record.json"

# sha256 of what provenance.statement gave for tests/data/build-record.json at 2a46207, the last
# commit that read the record as a dict by key (computed there, not here). The SBOM's pin was
# retired when the SBOM grew the base's OS and dpkg packages (issue 39): tests/test_sbom.py checks it
PROVENANCE_BEFORE = "5806126d3943335a46a73c07298f4249498b20793791e542e70569ebc863fdb8"


def raw() -> dict:
    return json.loads(RECORD.read_bytes())


def test_a_record_reads_back_to_the_bytes_it_was_written_with(tmp_path):
    rec = record.read(RECORD)
    record.write(tmp_path / "again.json", rec)
    assert (tmp_path / "again.json").read_bytes() == RECORD.read_bytes()


def test_the_provenance_is_the_bytes_the_dict_code_gave():
    rec = record.read(RECORD)
    subject = Reference.parse(rec.outputs[0]["reference"])
    statement = Statement.about(subject, provenance.SLSA_PREDICATE, provenance.predicate(rec)).raw
    assert hashlib.sha256(statement).hexdigest() == PROVENANCE_BEFORE


def test_its_digests_and_references_are_values():
    rec = record.read(RECORD)
    assert rec.manifest.digest.hex == raw()["manifest"]["digest"].split(":")[1]
    assert rec.base.pinned.digest == rec.base.index_digest != rec.base.manifest_digest
    assert rec.kernels.artifact and rec.kernels.artifact.digest is not None
    assert {v.origin for v in rec.verdicts if v.artifact} == {"registry", "proven"}


def edited(path: str, value=..., drop: bool = False) -> dict:
    doc = copy.deepcopy(raw())
    *parents, last = path.split(".")
    at = doc
    for key in parents:
        at = at[int(key)] if isinstance(at, list) else at[key]
    last = int(last) if isinstance(at, list) else last
    if drop:
        del at[last]
    else:
        at[last] = value
    return doc


@pytest.mark.parametrize("doc, says", [
    (edited("manifest.digest", drop=True), "manifest has other keys"),
    (edited("source.signed_by", "me"), "source has other keys"),
    (edited("files.0.size", "12"), "files[0].size must be int"),
    (edited("files.0.layer", True), "files[0].layer must be int"),
    (edited("source.dirty", 0), "source.dirty must be bool"),
    (edited("manifest.digest", "sha256:abc"), "manifest.digest is not a sha256 digest"),
    (edited("layers.0.diff_id", "md5:00"), "layers[0].diff_id is not a sha256 digest"),
    (edited("layers.0.urls", ["http://x"]), "layers[0] must be a descriptor"),
    (edited("overlays", {"id": "x"}), "overlays must be list"),
    (edited("verdicts.0", "FIXED"), "verdicts[0] must be a mapping"),
    (edited("base.pinned", "registry.example/rocm/vllm-dev:nightly"), "base.pinned"),
    (edited("base.pinned", " registry.example/rocm/vllm-dev@sha256:" + "0" * 64), "as a build writes it"),
    (edited("base.pinned", "rocm/vllm-dev@sha256:" + "0" * 64), "as a build writes it"),  # docker.io/ left out
    (edited("kernels.artifact", "registry.example/dsv4/image:kernels"), "kernels.artifact"),
    (edited("verdicts.0.artifact", "registry.example/dsv4/image"), "verdicts[0].artifact"),
    (edited("manifest.digest", "sha512:" + "0" * 128), "manifest.digest is not a sha256 digest"),
    (edited("image.entrypoint", []), "image.entrypoint is empty"),
    (edited("schema", "https://example.com/other"), "schema"),
])
def test_a_record_of_another_shape_is_one_input_error_naming_the_key(doc, says):
    with pytest.raises(InputError) as e:
        record.BuildRecord.from_json(doc)
    assert says in str(e.value)
    assert str(e.value).startswith("build record:")
