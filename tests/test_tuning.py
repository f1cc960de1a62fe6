"""AITER tuning tables: the committed production MI300X tables validate and bake; the published
original with its gfx950 rows (tests/data/tuning, source and sha256 in tuning/tuning.yaml) is refused."""

from __future__ import annotations

import json
import shutil

import pytest

from bakery.errors import InputError
from bakery.inputs import tuning
from support import ROOT, docker, invoke, last_line

BPRESHUFFLE = ROOT / "tuning" / "dsv4-mi300x-a8w8-blockscale-bpreshuffle-ck.prefill-m2688.csv"
BLOCKSCALE = ROOT / "tests" / "data" / "tuning" / "dsv4-a8w8-blockscale-tuned-gemm.mi300x.prefill-m2688.csv"


def gfx942_rows(path) -> bytes:
    """The rows of a published table that are for MI300X (it also carries gfx950 rows)."""
    lines = path.read_text().splitlines()
    return ("\n".join([lines[0]] + [layer for layer in lines[1:] if layer.startswith("gfx942,304,")]) + "\n").encode()


def test_real_tables_validate():
    assert tuning.validate(BPRESHUFFLE.read_bytes(), "t") == 33
    assert tuning.validate(gfx942_rows(BLOCKSCALE), "t") == 8


def test_published_table_with_rows_for_another_gpu_is_refused_with_the_count():
    with pytest.raises(InputError, match=r"204 of 212 rows are for gfx950 with cu_num 256; only gfx942"):
        tuning.validate(BLOCKSCALE.read_bytes(), "blockscale.csv")


def test_older_header_without_gfx_and_libtype():
    rows = BPRESHUFFLE.read_text().splitlines()[1:]
    old = [",".join(tuning.OLD_HEADER)] + [",".join(f for i, f in enumerate(r.split(",")) if i not in (0, 5))
                                           for r in rows]
    assert tuning.validate(("\n".join(old) + "\n").encode(), "old") == len(rows)


def mutate(column: str, value: str, line: int = 1) -> bytes:
    lines = BPRESHUFFLE.read_text().splitlines()
    header = lines[0].split(",")
    fields = lines[line].split(",")
    fields[header.index(column)] = value
    lines[line] = ",".join(fields)
    return ("\n".join(lines) + "\n").encode()


@pytest.mark.parametrize("data, message", [
    (mutate("gfx", "gfx950"), "1 of 33 rows are for gfx950 with cu_num 304"),
    (mutate("cu_num", "256"), "gfx942 with cu_num 256"),
    (mutate("us", "nan"), "non-finite us"),
    (mutate("tflops", "inf", 3), "non-finite tflops"),
    (mutate("errRatio", "0.02"), "errRatio 0.02"),
    (mutate("M", "8", 2).replace(b"8,4096,4096", b"8,1536,4096", 1), "already on line"),
    (b"M,N,K\n1,2,3\n", "header"),
    (mutate("M", "eight"), "invalid literal"),
])
def test_bad_tables_name_file_and_line(data, message):
    with pytest.raises(InputError, match=message):
        tuning.validate(data, "table.csv")


def test_aiter_packaged_table_for_other_gpus_is_refused(registry, fixture_base):
    """AITER's own packaged table mixes CU counts: not an MI300X table."""
    from bakery.base import spec as base_mod
    from bakery.base.filesystem import BaseFilesystem
    from bakery.oci.registry import Registry

    reg = Registry(registry)
    path = "usr/local/lib/python3.12/dist-packages/aiter/configs/a8w8_blockscale_bpreshuffle_tuned_gemm.csv"
    found = BaseFilesystem(reg, base_mod.resolve(reg, fixture_base, "linux/amd64")).read([path])[path]
    assert found and found.data, path
    data = found.data
    with pytest.raises(InputError, match="cu_num 256"):
        tuning.validate(data, "aiter")


def test_tables_are_baked_where_aiter_looks(project, registry, fixture_base):
    shutil.copy(BPRESHUFFLE, project / "tuning" / BPRESHUFFLE.name)
    (project / "tuning" / BLOCKSCALE.name).write_bytes(gfx942_rows(BLOCKSCALE))
    (project / "tuning" / "tuning.yaml").write_text(
        f"tables:\n"
        f"  - name: bpreshuffle\n    file: {BPRESHUFFLE.name}\n    env: AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE\n"
        f"  - name: blockscale\n    file: {BLOCKSCALE.name}\n")
    result = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/test/tuned:1")
    assert result.returncode == 0, result.stderr
    ref = last_line(result)
    record = json.loads((project / "out" / "build-record.json").read_text())
    assert {t["name"]: t["rows"] for t in record["tuning"]} == {"bpreshuffle": 33, "blockscale": 8}
    docker("pull", "-q", ref)
    script = ('sha256sum "$AITER_CONFIG_GEMM_A8W8_BLOCKSCALE_BPRESHUFFLE" '
              '/usr/local/lib/python3.12/dist-packages/aiter/configs/model_configs/' + BLOCKSCALE.name)
    out = docker("run", "--rm", "--entrypoint", "sh", ref, "-c", script).stdout
    sums = {line.split()[1]: line.split()[0] for line in out.splitlines()}
    by_path = {t["path"]: t["sha256"] for t in record["tuning"]}
    assert sums == by_path and "/opt/bakery/tuning/" + BPRESHUFFLE.name in sums
    assert "baked files verified" in docker("run", "--rm", "--entrypoint", "bakery-selfcheck", ref).stderr


def test_bad_table_stops_the_build(project, fixture_base):
    (project / "tuning" / "bad.csv").write_bytes(mutate("cu_num", "256"))
    (project / "tuning" / "tuning.yaml").write_text("tables:\n  - name: bad\n    file: bad.csv\n")
    result = invoke(project, "build", "--base", str(fixture_base))
    assert result.returncode == 2 and "bad.csv:2: 1 of 33 rows are for gfx942 with cu_num 256" in result.stderr
