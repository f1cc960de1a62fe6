"""AITER GEMM tuning tables: validated as inputs, baked where the image's env points AITER."""

from __future__ import annotations

import csv
import hashlib
import io
import math
from dataclasses import dataclass
from pathlib import Path

from .. import schema
from ..errors import InputError, IntegrityError
from ..oci.layer import FileEntry

HEADER = ["gfx", "cu_num", "M", "N", "K", "libtype", "kernelId", "splitK", "us", "kernelName", "tflops", "bw", "errRatio"]
OLD_HEADER = [h for h in HEADER if h not in ("gfx", "libtype")]
GFX, CU_NUM = "gfx942", 304
ENV_DIR = "/opt/bakery/tuning"
MODEL_CONFIGS = "/usr/local/lib/python3.12/dist-packages/aiter/configs/model_configs"
TABLE_KEYS = {"name": str, "file": str, "env": str, "sha256": str, "source": str, "original_sha256": str}


@dataclass(frozen=True)
class Table:
    """One AITER tuning table from tuning/, checked, with the env var that names it."""
    name: str
    source: Path
    data: bytes
    env: str | None  # the AITER env var that names it, or None for model_configs/
    rows: int

    @property
    def path(self) -> str:
        return f"{ENV_DIR}/{self.source.name}" if self.env else f"{MODEL_CONFIGS}/{self.source.name}"

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def validate(data: bytes, where: str) -> int:
    """Check one table; return its row count. Every problem names the file and line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{where}: not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header not in (HEADER, OLD_HEADER):
        raise InputError(f"{where}: header {','.join(header or [])!r} is neither AITER's "
                         f"{','.join(HEADER)!r} nor the older form without gfx/libtype")
    seen: dict[tuple, int] = {}
    count, foreign = 0, []
    for line, row in enumerate(reader, start=2):
        if not row:
            continue
        if len(row) != len(header):
            raise InputError(f"{where}:{line}: {len(row)} fields, the header has {len(header)}")
        r = dict(zip(header, row, strict=True))
        if r.get("gfx", GFX) != GFX or r["cu_num"] != str(CU_NUM):
            foreign.append((line, r.get("gfx", "?"), r["cu_num"]))
            continue
        try:
            m, n, k = (int(r[c]) for c in ("M", "N", "K"))
            int(r["kernelId"]), int(r["splitK"])
            numbers = {c: float(r[c]) for c in ("us", "tflops", "bw", "errRatio")}
        except ValueError as e:
            raise InputError(f"{where}:{line}: {e}") from None
        bad = [c for c, v in numbers.items() if not math.isfinite(v)]
        if bad or min(m, n, k) <= 0:
            raise InputError(f"{where}:{line}: {'non-finite ' + ', '.join(bad) if bad else 'M, N, K must be > 0'}")
        if numbers["errRatio"] != 0:
            raise InputError(f"{where}:{line}: errRatio {r['errRatio']}: a kernel with numerical error is not tuned")
        key = (m, n, k)
        if key in seen:
            raise InputError(f"{where}:{line}: (M,N,K)={key} already on line {seen[key]}")
        seen[key] = line
        count += 1
    if foreign:
        kinds = sorted({f"{g} with cu_num {c}" for _, g, c in foreign})
        raise InputError(f"{where}:{foreign[0][0]}: {len(foreign)} of {len(foreign) + count} rows are for "
                         f"{', '.join(kinds)}; only {GFX} with {CU_NUM} CUs (MI300X) belongs here: "
                         f"drop those rows (keep the header and the {GFX},{CU_NUM} rows)")
    return count


def load(directory: Path) -> list[Table]:
    """Read tuning/tuning.yaml and validate every table it lists."""
    spec = schema.load_yaml(directory / "tuning.yaml", {"tables": list})
    tables: list[Table]
    tables, names = [], set()
    for i, entry in enumerate(spec["tables"] or []):
        where = f"{directory / 'tuning.yaml'}: tables[{i}]"
        schema.check_keys(entry, TABLE_KEYS, where, required={"name", "file"})
        source = (directory / entry["file"]).resolve()
        try:
            data = source.read_bytes()
        except OSError as e:
            raise InputError(f"{where}: cannot read {source}: {e.strerror}") from None
        if entry.get("sha256") and hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise IntegrityError(f"{where}: {source.name} has sha256 {hashlib.sha256(data).hexdigest()}, "
                                 f"tuning.yaml says {entry['sha256']}: restore the file or update sha256 "
                                 f"(and source) on purpose")
        if entry["name"] in names or source.name in {t.source.name for t in tables}:
            raise InputError(f"{where}: duplicate table {entry['name']!r} / {source.name}")
        names.add(entry["name"])
        tables.append(Table(entry["name"], source, data, entry.get("env"), validate(data, str(source))))
    envs = [t.env for t in tables if t.env]
    if len(envs) != len(set(envs)):
        raise InputError(f"{directory / 'tuning.yaml'}: one env var names two tables")
    return tables


def files(tables: list[Table]) -> tuple[FileEntry, ...]:
    return tuple(FileEntry(t.path, t.data) for t in tables)


def env(tables: list[Table]) -> dict[str, str]:
    return {t.env: t.path for t in tables if t.env}
