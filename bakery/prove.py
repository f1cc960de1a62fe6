"""Overlay proofs: run each overlay's behavioural proof on one version of its target's bytes.

A proof (overlays/proofs/*.py, named in overlays.yaml) executes the code in the bytes it is given
and compares with a reference written from the defect's description. Its verdict is FIXED, BROKEN
or CANNOT-PROVE (with the reason); anything that raises, times out or prints no verdict is
CANNOT-PROVE, never a pass. Verdicts are cached by what decides them: the proof's code, the bytes
it ran on, and the interpreter and library versions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path, PurePosixPath

from . import sandbox
from .errors import InputError
from .layer import write_blob

FIXED, BROKEN, CANNOT = "FIXED", "BROKEN", "CANNOT-PROVE"
HELPER = "_proof.py"  # shared by every proof script: part of each proof's code
TIMEOUT_S = 900


@dataclass(frozen=True)
class ProofSpec:
    """How an overlay is proven: a script run on its target (plus other files of the same base it
    reads), or, where only hardware can tell, the reason no proof runs here."""
    script: Path | None
    reads: tuple[str, ...] = ()
    hardware: str | None = None

    @property
    def code_sha256(self) -> str | None:
        if self.script is None:
            return None
        h = hashlib.sha256()
        for path in (self.script, self.script.parent / HELPER):
            h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()


def load_spec(entry: dict, folder: Path, where: str) -> ProofSpec | None:
    """overlays.yaml's `proof:` value: {script, reads} or {hardware: reason}."""
    if entry is None:
        return None
    unknown = set(entry) - {"script", "reads", "hardware"}
    if unknown or ("script" in entry) == ("hardware" in entry):
        raise InputError(f"{where}: proof must be {{script: proofs/NAME.py, reads: [IMAGE PATHS]}} or "
                         f"{{hardware: WHY NO PROOF CAN RUN HERE}}")
    if "hardware" in entry:
        return ProofSpec(None, (), str(entry["hardware"]))
    script = (folder / entry["script"]).resolve()
    if ".." in PurePosixPath(entry["script"]).parts or not script.is_file():
        raise InputError(f"{where}: proof script {entry['script']!r} is not a file inside {folder}")
    reads = tuple(entry.get("reads") or ())
    if any(not r.startswith("/") for r in reads):
        raise InputError(f"{where}: proof reads must be absolute image paths")
    return ProofSpec(script, reads)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    reason: str
    seconds: float = 0.0
    measured: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=1)
def _versions() -> str:
    found = []
    for dist in ("torch", "triton", "numpy"):
        try:
            found.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} missing")
    return f"python {sys.version.split()[0]}; " + ", ".join(found)


def cache_key(spec: ProofSpec, target: bytes, reads: dict[str, bytes]) -> str:
    h = hashlib.sha256(f"{spec.code_sha256}\n{_versions()}\n".encode())
    h.update(hashlib.sha256(target).hexdigest().encode())
    for path in spec.reads:
        h.update(f"\n{path} {hashlib.sha256(reads[path]).hexdigest()}".encode())
    return h.hexdigest()


def _cache_dir() -> Path:
    return Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery")) / "proofs"


def _cached(key: str) -> Verdict | None:
    """A cached verdict, if its file names the key it is stored under (else it is dropped)."""
    path = _cache_dir() / f"{key}.json"
    try:
        doc = json.loads(path.read_text())
        if doc.pop("key") != key or doc["verdict"] not in (FIXED, BROKEN):
            raise ValueError("entry does not match its key")
        return Verdict(**doc)
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError):
        print(f"warning: dropped a corrupt proof cache entry {path.name}", file=sys.stderr)
        path.unlink(missing_ok=True)
        return None


def run(spec: ProofSpec, target: bytes, reads: dict[str, bytes]) -> Verdict:
    """One proof on one version of the target; cached unless CANNOT-PROVE."""
    if spec.script is None:
        return Verdict(CANNOT, f"no proof can run here: {spec.hardware}")
    missing = [p for p in spec.reads if reads.get(p) is None]
    if missing:
        return Verdict(CANNOT, f"the base has no {', '.join(missing)}, which the proof reads")
    key = cache_key(spec, target, reads)
    hit = _cached(key)
    if hit is not None:
        return hit
    verdict = _execute(spec, target, reads)
    if verdict.verdict != CANNOT:
        write_blob(_cache_dir() / f"{key}.json", json.dumps({"key": key, **verdict.to_json()}).encode())
    return verdict


def readable(spec: ProofSpec) -> list[Path]:
    """What of the project a proof may read: its own folder (script and helper) and hip/ (the
    kernels' Python fallback some proofs import). Never the rest: key files may live there."""
    project = spec.script.parent.parent.parent
    return [spec.script.parent] + ([project / "hip"] if (project / "hip").is_dir() else [])


def _execute(spec: ProofSpec, target: bytes, reads: dict[str, bytes]) -> Verdict:
    """Run the proof on the target's bytes in the sandbox: they are the base's code, untrusted."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bakery-proof-") as tmp:
        names = []
        for i, data in enumerate([target] + [reads[p] for p in spec.reads]):
            names.append(f"input{i}.py")
            (Path(tmp) / names[-1]).write_bytes(data)
        os.chmod(tmp, 0o755)  # the sandbox's uid reads them
        argv = [sys.executable, str(spec.script), *(f"{sandbox.INPUTS}/{n}" for n in names)]
        try:
            done = sandbox.run(argv, readable(spec), Path(tmp), TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return Verdict(CANNOT, f"timed out after {TIMEOUT_S} s", time.monotonic() - started)
    seconds = round(time.monotonic() - started, 1)
    lines = done.stdout.strip().splitlines()
    try:  # a verdict counts only from a proof that finished: exit 0, a well-formed last line
        doc = json.loads(lines[-1])
        if done.returncode != 0 or doc["verdict"] not in (FIXED, BROKEN, CANNOT) or \
                not isinstance(doc.get("reason"), str):
            raise ValueError
    except (IndexError, ValueError, KeyError, TypeError, AttributeError):
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return Verdict(CANNOT, f"the proof failed (exit {done.returncode}): {why[:300]}", seconds)
    return Verdict(doc["verdict"], doc["reason"], seconds, doc.get("measured") or {})


def run_many(jobs: dict, workers: int | None = None) -> dict:
    """{key: (spec, target bytes, reads)} -> {key: Verdict}, on every core."""
    workers = workers or max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(workers) as pool:
        futures = {k: pool.submit(run, *job) for k, job in jobs.items()}
        return {k: f.result() for k, f in futures.items()}
