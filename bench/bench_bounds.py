"""The worst a hostile input can make bakery do, at each bound: what a base, a registry's signature
tags or sandboxed code can cost at the limit we allow, measured, beside what the same input would
have cost without the bound (the measured cost of one unit times what the input could hold: an
extrapolation, and said to be one).

    .venv/bin/python bench/bench_bounds.py            # every case (a few minutes, about 3 GB of memory)
    .venv/bin/python bench/bench_bounds.py signatures whiteouts

Each case runs in a fresh interpreter, so its peak memory is its own. Only the compile cases need
the stack (the stand-in toolchain image, as the tests build it).
"""

from __future__ import annotations

import base64
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _header(name: str, kind: bytes = b"0", link: str = "") -> bytes:
    """One ustar header of an empty member (what a hostile layer repeats by the million)."""
    fields = [name.encode().ljust(100, b"\0"), b"0000644\0", b"0000000\0", b"0000000\0", b"00000000000\0",
              b"00000000000\0", b" " * 8, kind, link.encode().ljust(100, b"\0"), b"ustar\x0000",
              b"\0" * 32, b"\0" * 32, b"0000000\0", b"0000000\0", b"\0" * 155, b"\0" * 12]
    block = b"".join(fields)
    checksum = sum(block)
    return block[:148] + b"%06o\0 " % checksum + block[156:]


def gzip_layer(names) -> bytes:
    """A gzip'd tar of empty files with these names, written header by header."""
    out = zlib.compressobj(1, zlib.DEFLATED, 31)
    parts, batch = [], []
    for name in names:
        batch.append(_header(name))
        if len(batch) == 4096:
            parts.append(out.compress(b"".join(batch)))
            batch = []
    parts.append(out.compress(b"".join(batch) + b"\0" * 1024))
    parts.append(out.flush())
    return b"".join(parts)


class Served:
    """A registry of one blob, served as the real one streams it (checked by digest at the end)."""

    def __init__(self, blob: bytes):
        self.blob = blob

    def stream_blob(self, repo, desc, label=None):
        from bakery.oci.registry import check_digest

        for at in range(0, len(self.blob), 1 << 20):
            yield self.blob[at:at + (1 << 20)]
        check_digest(desc, desc.digest.hex, len(self.blob), "bench")


def _scan(blob: bytes) -> str:
    from bakery.base.layercache import LayerCache
    from bakery.base.scan import scan_layer
    from bakery.errors import IntegrityError
    from bakery.oci.refs import Descriptor

    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
    with tempfile.TemporaryDirectory() as cache:
        try:
            index, _, _ = scan_layer(Served(blob), "bench/r", desc, set(), LayerCache(Path(cache)))
            return f"read: {len(index['entries']):,} entries"
        except IntegrityError as e:
            return "refused: " + str(e).split(": ", 2)[-1][:70]


def layer_entries(over: int) -> str:
    """A layer of ENTRIES_LIMIT + over empty files (its headers compress to almost nothing)."""
    from bakery.base.scan import ENTRIES_LIMIT

    n = ENTRIES_LIMIT + over
    blob = gzip_layer(f"d{i // 10000:04d}/f{i:07d}" for i in range(n))
    return f"{n:,} entries, {len(blob) / 2**20:.0f} MiB compressed; " + _scan(blob)


def layer_names(over: int) -> str:
    """A layer of names of 4,000 characters each (pax records), up to NAMES_LIMIT (+ over entries)."""
    import io
    import tarfile

    from bakery.base.scan import NAMES_LIMIT

    n = NAMES_LIMIT // 4000 + over
    stem = "/".join(["n" * 200] * 19)  # 3,819 characters in 19 folders of 200
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(n):
            tar.addfile(tarfile.TarInfo(f"{stem}/f{i:09d}".ljust(4000, "x")))
    blob = zlib.compress(raw.getvalue(), 1, wbits=31)
    return f"{n:,} names of 4,000 characters, {len(blob) / 2**20:.0f} MiB compressed; " + _scan(blob)


def whiteouts(_: int) -> str:
    """The merge check's pass over an image of 1,000,000 paths below 100,000 whiteouts and 10 opaque
    folders: each path against each whiteout would be 10^11 comparisons."""
    from bakery.base import filesystem as fs_mod

    lower = {"entries": {f"d{i // 1000:04d}/f{i:06d}": ["file", 0, 0o644, ""] for i in range(1_000_000)},
             "whiteouts": [], "opaque": []}
    upper = {"entries": {}, "whiteouts": sorted(f"d{i // 100:04d}/f{i * 10:06d}" for i in range(100_000)),
             "opaque": sorted(f"d{i:04d}" for i in range(0, 1000, 100))}
    start = time.monotonic()
    merged = fs_mod._Merged()
    merged.apply(lower)
    merged.apply(upper)
    took = time.monotonic() - start
    left = sum(1 for p in lower["entries"] if merged.kind(p) is not None)
    # the naive way on a sample, to say what all of it would cost
    sample, whites = list(lower["entries"])[:20], upper["whiteouts"]
    t0 = time.monotonic()
    for p in sample:
        any(p == w or p.startswith(w + "/") for w in whites)
    naive = (time.monotonic() - t0) / len(sample) * len(lower["entries"])
    return (f"{1_000_000 - left:,} of 1,000,000 paths hidden by 100,000 whiteouts and 10 opaque folders in "
            f"{took:.2f} s; path by whiteout: {naive / 3600:.1f} h (extrapolated from {len(sample)} paths)")


def repeated_layers(_: int) -> str:
    """A manifest that lists one layer of 4,001 entries 1,000 times (the most layers a base may
    have): counted at each place it is listed, it is past IMAGE_ENTRIES_LIMIT and refused before
    the merge check runs (counted once, it would pass as 4,001)."""
    from unittest import mock

    from bakery.base.filesystem import BaseFilesystem
    from bakery.errors import IntegrityError
    from bakery.oci.refs import Descriptor

    index = {"entries": {f"d{i:04d}/f": ["file", 0, 0o644, ""] for i in range(4001)}, "whiteouts": [],
             "opaque": [], "late": [], "files": {}, "diff_id": "sha256:" + "0" * 64}
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar", b"x")
    image = mock.Mock(layers=[desc] * 1000, config={"rootfs": {"diff_ids": [index["diff_id"]] * 1000}}, ref="bench")
    fs = BaseFilesystem(mock.Mock(), image, mock.Mock(index=lambda d: index))
    start = time.monotonic()
    try:
        fs.check_layers()
        said = "read"
    except IntegrityError as e:
        said = "refused: " + str(e).split(": ", 1)[-1][:60]
    return f"{said} in {time.monotonic() - start:.2f} s"


def signatures(_: int) -> str:
    """verify's worst at the bounds: a .att of SIGNATURE_LAYERS envelopes, each holding SIGNATURES_LIMIT
    signatures none of which verifies, tried against a role of two keys."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from bakery.errors import IntegrityError
    from bakery.trust import sign
    from bakery.trust.verify import SIGNATURE_LAYERS

    keys = [ec.generate_private_key(ec.SECP256R1()).public_key() for _ in range(2)]
    other = ec.generate_private_key(ec.SECP256R1())
    payload = b'{"_type": "https://in-toto.io/Statement/v1"}'
    sig = base64.b64encode(other.sign(sign.pae(sign.IN_TOTO, payload), ec.ECDSA(sign.hashes.SHA256()))).decode()
    env = json.dumps({"payload": base64.b64encode(payload).decode(), "payloadType": sign.IN_TOTO,
                      "signatures": [{"keyid": "", "sig": sig}] * sign.SIGNATURES_LIMIT}).encode()
    start = time.monotonic()
    for _ in range(SIGNATURE_LAYERS):
        for key in keys:
            try:
                sign.open_envelope(env, key, "bench")
            except IntegrityError:
                pass
    took = time.monotonic() - start
    per = took / (SIGNATURE_LAYERS * len(keys) * sign.SIGNATURES_LIMIT)
    per_sig = len(json.dumps({"keyid": "", "sig": sig})) + 2
    unbounded = (4 << 20) // per_sig
    return (f"{SIGNATURE_LAYERS} envelopes x {sign.SIGNATURES_LIMIT} signatures x 2 keys: {took:.1f} s "
            f"({per * 1000:.2f} ms a signature); unbounded, a 4 MiB envelope holds {unbounded:,}: "
            f"{per * unbounded * SIGNATURE_LAYERS * len(keys) / 3600:.1f} h (extrapolated)")


def tasks(_: int) -> str:
    """A fork bomb in the proof's sandbox (its limit: 2,048 tasks)."""
    from bakery import sandbox
    from bakery.proofs import runner

    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    limits = sandbox.Limits(seconds=20, processes=runner.LIMITS.processes)
    start = time.monotonic()
    try:
        sandbox.run([sys.executable, "-c", bomb], [], None, limits)
        how = "ended"
    except Exception as e:
        how = type(e).__name__
    return f"limit {limits.processes:,} tasks, stopped after {time.monotonic() - start:.1f} s ({how}, at its wall time)"


def _toolchain_files():
    """The stand-in toolchain's files (the stack up, the image built or found, its folder cached)."""
    from bakery.dev import fixture, stack
    from bakery.inputs import hip, hip_compile
    from bakery.oci.refs import Reference
    from bakery.project import cache_dir

    image = fixture.toolchain(ROOT / "hip" / "toolchain", ROOT / "tests" / "fixture" / "fixture.yaml", stack.up(),
                              log=lambda m: None)
    return hip_compile.toolchain_files(Reference.parse_pinned(image), hip.load(ROOT / "hip").toolchain, cache_dir(create=True) / "toolchains",
                               log=lambda m: None)


def compile_out(_: int) -> str:
    """A compile (the toolchain's own code) that writes to /out, the host's disk, as fast as it can."""
    from bakery.inputs import hip_compile

    files = _toolchain_files()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir(mode=0o777)
        out.chmod(0o777)
        fill = "i=0; while :; do head -c 268435456 /dev/zero > /out/f$i || exit 1; i=$((i+1)); done"
        status, said = hip_compile.run_compile(files, ROOT / "hip", fill, out)
        written = sum(os.lstat(os.path.join(d, n)).st_blocks * 512 for d, _, names in os.walk(out) for n in names)
    return f"exit {status}, {written / 2**30:.2f} GiB on disk when stopped (cap {hip_compile.OUT_LIMIT >> 30} GiB): {said[:60]}"


def compile_log(_: int) -> str:
    """A compile that prints without end: the log is a file capped like any other, read as its tail."""
    from bakery.inputs import hip_compile

    files = _toolchain_files()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir(mode=0o777)
        out.chmod(0o777)
        status, said = hip_compile.run_compile(files, ROOT / "hip", "yes 'a line of a compiler gone mad'", out)
    return f"exit {status} (its stdout reached the 1 GiB a file may be), {len(said):,} characters of log kept"


def compile_memory(_: int) -> str:
    """A compile that asks for more address space than a process may have (16 GiB)."""
    from bakery.inputs import hip_compile

    files = _toolchain_files()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        out.mkdir(mode=0o777)
        out.chmod(0o777)
        status, said = hip_compile.run_compile(files, ROOT / "hip", "python3 -c 'x = bytearray(20 << 30)'", out)
    return f"exit {status}: {said.splitlines()[-1][:60] if said else ''}"


def offload_bundle(_: int) -> str:
    """A compile output whose .hip_fatbin is a 1 MiB offload bundle of entries that each span all of
    it: copied entry by entry (as before the bound) 32 GiB; the 1,024 entries here copied unbounded
    are measured, the rest extrapolated."""
    import struct

    from bakery.errors import IntegrityError
    from bakery.inputs import device_code

    size, count = 1 << 20, 1024
    bundle = device_code.BUNDLE_MAGIC + struct.pack("<Q", count)
    bundle += b"".join(struct.pack("<QQQ", 0, size, 12) + b"hipv4-%06d" % i for i in range(count))
    bundle += b"\0" * (size - len(bundle))
    names = b"\0.shstrtab\0.hip_fatbin\0"
    shoff = 64 + len(names) + size
    elf = (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 1)
           + names + bundle + b"\0" * 64 + struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0)
           + struct.pack("<IIQQQQIIQQ", 11, 1, 0, 0, 64 + len(names), size, 0, 0, 1, 0))
    start = time.monotonic()
    try:
        device_code.code_objects(elf)
        said = "read"
    except IntegrityError as e:
        said = "refused: " + str(e).split(" (at ")[0][len(".hip_fatbin's offload bundle "):]
    took = time.monotonic() - start
    t0 = time.monotonic()
    copies = [bundle[i % 2:size] for i in range(count)]  # what the unbounded parser did, for 1,024 of 32,768
    unbounded = (time.monotonic() - t0) * 32
    del copies
    return (f"1 MiB bundle, entries each spanning it: {said}, {took * 1000:.1f} ms; unbounded, 32,768 such "
            f"entries: 32 GiB copied, {unbounded:.0f} s (extrapolated from 1,024)")


def records(_: int) -> str:
    """inventory.owners over RECORD_BATCH RECORDs at RECORD_LIMIT, each all empty lines (a row a
    byte, the costliest to parse), then one a byte past it; the old parse (all lines, then all rows,
    in lists) measured on one 8 MiB RECORD for comparison."""
    import csv
    import tracemalloc
    from types import SimpleNamespace

    from bakery.base import inventory
    from bakery.errors import IntegrityError

    site = "usr/local/lib/python3.12/dist-packages"
    data = b"\n" * inventory.RECORD_LIMIT

    class Files:
        def __init__(self, files):
            self.files = files

        def read(self, paths, limit=None):
            return {p: SimpleNamespace(kind="file", data=None if len(self.files[p]) > limit else self.files[p],
                                       size=len(self.files[p])) for p in paths}

    metas = [f"/{site}/d{i:02d}-1.dist-info/METADATA" for i in range(inventory.RECORD_BATCH)]
    fs = Files({f"{site}/d{i:02d}-1.dist-info/RECORD": data for i in range(inventory.RECORD_BATCH)})
    tracemalloc.start()
    start = time.monotonic()
    inventory.owners(fs, metas, [f"/{site}/x.py"])
    took = time.monotonic() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    fs = Files({f"{site}/d00-1.dist-info/RECORD": data + b"\n"})
    try:
        inventory.owners(fs, metas[:1], [f"/{site}/x.py"])
        past = "read"
    except IntegrityError:
        past = "refused"
    tracemalloc.start()
    t0 = time.monotonic()
    rows = list(csv.reader(data.decode("utf-8", "replace").splitlines()))
    old = time.monotonic() - t0
    old_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    del rows
    return (f"{inventory.RECORD_BATCH} RECORDs of {inventory.RECORD_LIMIT >> 20} MiB empty lines: {took:.1f} s, "
            f"{peak / 2**20:.0f} MiB traced; a byte past: {past}; old parse of one: {old:.1f} s, "
            f"{old_peak / 2**20:.0f} MiB ({old_peak / len(data):.0f} bytes a byte; 64 at once of 64 MiB, parsed one "
            f"by one: {(old_peak / len(data) * 64 + 64 * 64) / 1024:.1f} GiB, extrapolated)")


def rebuilt_layer(_: int) -> str:
    """reproduce's comparison of a rebuilt layer that is a gzip of zeros: 64 MiB compressed would be
    64 GiB (a tar of one file of zeros), here a 4 GiB one read to its cap (32 times its size, at
    least 1 GiB)."""
    import zlib as z

    from bakery.errors import IntegrityError
    from bakery.oci.refs import Descriptor
    from bakery.release import reproduce

    header = _header("zeros")
    header = header[:124] + b"%011o\0" % (4 << 30) + header[136:148] + b" " * 8 + header[156:]
    header = header[:148] + b"%06o\0 " % sum(header) + header[156:]
    out = z.compressobj(9, z.DEFLATED, 31)
    chunk = bytes(64 << 20)
    blob = out.compress(header) + b"".join(out.compress(chunk) for _ in range(64)) + out.flush()
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
    store = type("Store", (), {"stream": lambda self, d: iter([blob])})()
    start = time.monotonic()
    try:
        reproduce._files(store, desc)
        said = "read"
    except IntegrityError:
        said = f"refused past {reproduce.unpacked_limit(desc) >> 20:,} MiB"
    took = time.monotonic() - start
    return (f"{len(blob) / 2**20:.1f} MiB gzip of 4 GiB of zeros: {said} in {took:.1f} s; unbounded, all 4 GiB "
            f"would be read (and a 64 MiB gzip, 64 GiB: {took * 64:.0f} s at this rate, extrapolated)")


def rebuilt_manifest(_: int) -> str:
    """reproduce's comparison of a rebuilt manifest that lists one layer 1,000 times (a hostile
    revision's; 25,000 fit the 4 MiB document cap), that layer a gzip of 1 GiB of zeros: each
    distinct layer unpacked once, within the original's budget, the rest named."""
    import json
    import zlib as z

    from bakery.oci.refs import Descriptor
    from bakery.release import reproduce

    header = _header("zeros")
    header = header[:124] + b"%011o\0" % ((1 << 30) - 4096) + header[136:148] + b" " * 8 + header[156:]
    header = header[:148] + b"%06o\0 " % sum(header) + header[156:]
    out = z.compressobj(9, z.DEFLATED, 31)
    blob = out.compress(header) + b"".join(out.compress(bytes(64 << 20)) for _ in range(16)) + out.flush()
    small = gzip_layer(["a"])
    layer, original = (Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", b) for b in (blob, small))
    blobs = {layer.digest: blob, original.digest: small}
    store = type("Store", (), {"stream": lambda self, d: iter([blobs[d.digest]])})()

    def manifest(*descs) -> bytes:
        return json.dumps({"config": {"digest": "sha256:" + "0" * 64}, "layers": [d.to_json() for d in descs]}).encode()

    start = time.monotonic()
    diffs = reproduce.differences(store, manifest(original), store, manifest(*[layer] * 1000))
    took = time.monotonic() - start
    return (f"1,000 listings of a {len(blob) / 2**20:.1f} MiB gzip of 1 GiB: unpacked once in {took:.1f} s "
            f"({len(diffs)} rows: it, {sum('same_as_layer' in d for d in diffs)} named the same, one naming the "
            f"{1000 - 1 - reproduce.EXTRA_LAYERS} not unpacked); "
            f"unbounded, each unpacked: {took * 1000 / 3600:.1f} h (25,000: {took * 25000 / 3600:.0f} h; extrapolated)")


def symbol_table(_: int) -> str:
    """A compile output's code object whose .symtab holds SYMBOLS_MAX symbols, each naming the start
    of a 4 KiB string table without a NUL, then one more: compared in place; the old parse copied
    each name out whole (extrapolated from 1,000)."""
    import struct

    from bakery.errors import IntegrityError
    from bakery.inputs import device_code

    def bundle_with(symbols: int) -> bytes:
        strtab = b"\0" + b"k" * 4096
        symtab = struct.pack("<IBBHQQ", 1, 0, 0, 0, 0, 0) * symbols
        names = b"\0.shstrtab\0.symtab\0.strtab\0"
        body = names + symtab + strtab
        head = (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 3, device_code.EM_AMDGPU, 1, 0, 0,
                                                                    64 + len(body), device_code.ARCHS["gfx942"],
                                                                    64, 0, 0, 64, 4, 1))
        code = head + body + b"\0" * 64 + struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0) \
            + struct.pack("<IIQQQQIIQQ", 11, 2, 0, 0, 64 + len(names), len(symtab), 3, 0, 8, 24) \
            + struct.pack("<IIQQQQIIQQ", 19, 3, 0, 0, 64 + len(names) + len(symtab), len(strtab), 0, 0, 1, 0)
        bundle = device_code.BUNDLE_MAGIC + struct.pack("<Q", 1) + struct.pack("<QQQ", 62, len(code), 6) + b"hipv4-" + code
        names2 = b"\0.shstrtab\0.hip_fatbin\0"
        return (b"\x7fELF\x02\x01\x01" + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, 64 + len(names2)
                                                                    + len(bundle), 0, 64, 0, 0, 64, 3, 1)
                + names2 + bundle + b"\0" * 64 + struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names2), 0, 0, 1, 0)
                + struct.pack("<IIQQQQIIQQ", 11, 1, 0, 0, 64 + len(names2), len(bundle), 0, 0, 1, 0))

    said = []
    for symbols in (device_code.SYMBOLS_MAX, device_code.SYMBOLS_MAX + 1):
        elf = bundle_with(symbols)
        start = time.monotonic()
        try:
            device_code.check_device_code(elf, "gfx942", ["k0", "k1"])
            result = "read"
        except IntegrityError as e:
            result = "refused" if "symbols, past the" in str(e) else "lacks the kernels"
        said.append(f"{symbols:,} symbols ({len(elf) / 2**20:.0f} MiB): {result}, {time.monotonic() - start:.1f} s")
    strtab = b"k" * 4096 + b"\0"
    t0 = time.monotonic()
    copied = {strtab[1 + i % 7:strtab.index(b"\0", 1)] for i in range(1000)}
    one = (time.monotonic() - t0) / 1000
    del copied
    return "; ".join(said) + (f"; the old parse, each name copied whole: {one * 1e6:.1f} us and up to a string table's "
                              f"size each (2 MiB: 80 GB for 40,000 symbols, the review's figure)")


CASES = {  # name: (function, argument, bound)
    "layer entries": (layer_entries, 0, "ENTRIES_LIMIT"),
    "layer entries + 1": (layer_entries, 1, "ENTRIES_LIMIT"),
    "layer names": (layer_names, 0, "NAMES_LIMIT"),
    "layer names + 1": (layer_names, 1, "NAMES_LIMIT"),
    "whiteouts": (whiteouts, 0, "one pass, subtrees removed"),
    "repeated layers": (repeated_layers, 0, "IMAGE_ENTRIES_LIMIT, each place"),
    "signatures": (signatures, 0, "SIGNATURES_LIMIT x SIGNATURE_LAYERS"),
    "tasks": (tasks, 0, "pids cgroup / RLIMIT_NPROC"),
    "compile /out": (compile_out, 0, "OUT_LIMIT, watched"),
    "compile log": (compile_log, 0, "1 GiB a file, tail kept"),
    "compile memory": (compile_memory, 0, "16 GiB address space a process"),
    "offload bundle": (offload_bundle, 0, "entries within the bundle, their sizes summed"),
    "records": (records, 0, "RECORD_LIMIT, RECORD_BATCH, a row at a time"),
    "rebuilt layer": (rebuilt_layer, 0, "UNPACKED_RATIO x size, UNPACKED_FLOOR"),
    "rebuilt manifest": (rebuilt_manifest, 0, "distinct layers once, the original's budget, EXTRA_LAYERS"),
    "symbol table": (symbol_table, 0, "SYMBOLS_MAX, names compared in place"),
}


def _measured(name: str) -> tuple[str, float, float]:
    fn, arg, _ = CASES[name]
    start = time.monotonic()
    said = fn(arg)
    return said, time.monotonic() - start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def main(names: list[str]) -> None:
    spawn = multiprocessing.get_context("spawn")
    print("| case | bound | what happened | seconds | peak memory (GiB) |")
    print("| --- | --- | --- | --- | --- |")
    for name in names or list(CASES):
        with spawn.Pool(1) as pool:
            said, seconds, peak = pool.apply(_measured, (name,))
        print(f"| {name} | {CASES[name][2]} | {said} | {seconds:.1f} | {peak:.2f} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
