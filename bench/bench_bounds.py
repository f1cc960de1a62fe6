"""The worst a hostile input can make bakery do, at each bound: what a base, a registry's signature
tags or sandboxed code can cost at the limit we allow, measured, beside what the same input would
have cost without the bound (the measured cost of one unit times what the input could hold: an
extrapolation, and said to be one).

    .venv/bin/python bench/bench_bounds.py            # every case (a few minutes, about 3 GB of memory)
    .venv/bin/python bench/bench_bounds.py signatures whiteouts

Each case runs in a fresh interpreter, so its peak memory is its own. Nothing here needs the stack.
"""

from __future__ import annotations

import base64
import json
import multiprocessing
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
    """The merge check, a read and a glob over an image of 1,000,000 paths below 100,000 whiteouts
    and 1,000 opaque folders: each path against each whiteout would be 10^11 comparisons."""
    from bakery.base import filesystem as fs_mod

    lower = {f"d{i // 1000:04d}/f{i:06d}": ["file", 0, 0o644, ""] for i in range(1_000_000)}
    upper = {"entries": {}, "whiteouts": sorted(f"d{i // 100:04d}/f{i * 10:06d}" for i in range(100_000)),
             "opaque": sorted(f"d{i:04d}" for i in range(0, 1000, 100))}
    paths = set(lower)
    start = time.monotonic()
    hidden = fs_mod._hidden(paths, upper)
    took = time.monotonic() - start
    # the naive way on a sample, to say what all of it would cost
    sample, whites = list(paths)[:20], upper["whiteouts"]
    t0 = time.monotonic()
    for p in sample:
        any(p == w or p.startswith(w + "/") for w in whites)
    naive = (time.monotonic() - t0) / len(sample) * len(paths)
    return (f"{len(hidden):,} of 1,000,000 paths hidden by 100,000 whiteouts and 10 opaque folders in "
            f"{took:.2f} s; path by whiteout: {naive / 3600:.1f} h (extrapolated from {len(sample)} paths)")


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


CASES = {  # name: (function, argument, bound)
    "layer entries": (layer_entries, 0, "ENTRIES_LIMIT"),
    "layer entries + 1": (layer_entries, 1, "ENTRIES_LIMIT"),
    "layer names": (layer_names, 0, "NAMES_LIMIT"),
    "layer names + 1": (layer_names, 1, "NAMES_LIMIT"),
    "whiteouts": (whiteouts, 0, "bisect by prefix"),
    "signatures": (signatures, 0, "SIGNATURES_LIMIT x SIGNATURE_LAYERS"),
    "tasks": (tasks, 0, "pids cgroup / RLIMIT_NPROC"),
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
    main([a for a in sys.argv[1:]])
