"""Overlay proofs: run each overlay's behavioural proof on one version of its target's bytes.

A proof (overlays/proofs/*.py, named in overlays.yaml) executes the code in the bytes it is given
and compares with a reference written from the defect's description. Its verdict is FIXED, BROKEN
or CANNOT-PROVE (with the reason); anything that raises, times out or prints no verdict is
CANNOT-PROVE, never a pass. Verdicts are cached by what decides them: the proof's code, the bytes
it ran on, and the interpreter and library versions.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import sandbox, untrusted
from ..errors import EnvironmentProblem
from ..files import canonical_json
from ..inputs.proof_spec import ProofSpec
from ..oci import artifact
from ..oci.layer import write_blob
from ..project import cache_dir

if TYPE_CHECKING:  # a type only: the registry's modules load when a build pushes
    from ..oci.store import RegistryStore

FIXED, BROKEN, CANNOT = "FIXED", "BROKEN", "CANNOT-PROVE"
DEVICES = ("cpu", "cuda")  # cpu: Triton's interpreter; cuda: kernels compiled for the GPU torch sees (CUDA or ROCm)
LIMITS = sandbox.PROOF  # time, memory, processes, file size
REASON_LIMIT = 400  # characters of a reason a record keeps


@dataclass(frozen=True)
class Verdict:
    """What one proof said of one target (FIXED, BROKEN or CANNOT-PROVE) and why, and where it came from."""
    verdict: str
    reason: str
    seconds: float = 0.0
    measured: dict = field(default_factory=dict)
    origin: str = field(default="proven", compare=False)  # proven (here, now), cache, or registry (signed)
    key: str = field(default="", compare=False)  # cache_key of what it judged
    artifact: str | None = field(default=None, compare=False)  # REGISTRY/REPO@DIGEST it was taken from

    def to_json(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k not in ("origin", "key", "artifact")}


@functools.lru_cache(maxsize=1)
def _versions() -> str:
    found = []
    for dist in ("torch", "triton", "numpy"):
        try:
            found.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            found.append(f"{dist} missing")
    return f"python {sys.version.split()[0]}; " + ", ".join(found)


class BaseFiles(dict):
    """{image path: bytes} of one base's files, naming that base (its manifest digest). The proofs of
    one named base run in one sandbox, where the base's code in one proof can reach another's run:
    a verdict proven there is keyed by the base too, so it is never taken for another base's bytes."""

    def __init__(self, base: str, files: dict):
        super().__init__(files)
        self.base = base


def cache_key(spec: ProofSpec, target: bytes, reads: dict[str, bytes], device: str = "cpu") -> str:
    h = hashlib.sha256(f"{spec.code_sha256}\n{_versions()}\n{device}\n".encode())
    h.update(hashlib.sha256(target).hexdigest().encode())
    for path in spec.reads:
        h.update(f"\n{path} {hashlib.sha256(reads[path]).hexdigest()}".encode())
    # the base its other proofs ran beside it from ("none": files no base names, a sandbox each); every
    # key says it, so no key made before the proofs shared a sandbox is taken again
    h.update(f"\nbase {reads.base if isinstance(reads, BaseFiles) else 'none'}".encode())
    return h.hexdigest()


def _cache_dir() -> Path:
    return cache_dir("proofs")


def _cached(key: str) -> Verdict | None:
    """A cached verdict, if its file names the key it is stored under (else it is dropped)."""
    path = _cache_dir() / f"{key}.json"
    try:
        doc = json.loads(path.read_text())
        if doc["key"] != key or doc["verdict"] not in (FIXED, BROKEN) or not isinstance(doc["reason"], str):
            raise ValueError("entry does not match its key")
        return Verdict(doc["verdict"], untrusted.safe(doc["reason"], "json", REASON_LIMIT),
                       float(doc.get("seconds") or 0), _measured(doc.get("measured")), "cache")
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError, AttributeError):
        print(f"warning: dropped a corrupt proof cache entry {path.name}", file=sys.stderr)
        path.unlink(missing_ok=True)
        return None


def _remember(key: str, verdict: Verdict) -> None:
    write_blob(_cache_dir() / f"{key}.json", json.dumps({"key": key, **verdict.to_json()}).encode())


def run(spec: ProofSpec, target: bytes, reads: dict[str, bytes], device: str = "cpu") -> Verdict:
    """One proof on one version of the target; cached unless CANNOT-PROVE."""
    return run_batch(spec, [target], reads, device)[0]


def run_batch(spec: ProofSpec, targets: list[bytes], reads: dict[str, bytes], device: str = "cpu",
              signed: SignedVerdicts | None = None, reprove: bool = False) -> list[Verdict]:
    """One proof on several versions of its target (stock and overlaid): run_many's rule."""
    return _prove([(spec, targets)], reads, device, signed, reprove)[0]


def run_many(jobs: dict, device: str = "cpu", signed: SignedVerdicts | None = None, reprove: bool = False) -> dict:
    """{key: (spec, target bytes, reads)} -> {key: Verdict}. The proofs whose reads are one base's
    BaseFiles run in one sandbox (torch loaded once there, each proof in a process forked from it,
    every proof at once, the targets of one proof in forks of its own; their verdicts keyed by the
    base); the proofs of another base, or of files no base names, never share it."""
    _versions()  # once, here: threads that each miss the empty cache would each scan every distribution
    bases: dict[int, tuple[dict, dict]] = {}
    for key, (spec, target, reads) in jobs.items():
        bases.setdefault(id(reads), (reads, {}))[1].setdefault(spec, []).append((key, target))
    with ThreadPoolExecutor(max(1, len(bases))) as pool:
        futures = [(groups, pool.submit(_prove, [(spec, [t for _, t in members]) for spec, members in groups.items()],
                                        reads, device, signed, reprove))
                   for reads, groups in bases.values()]
        return {key: verdict for groups, f in futures
                for members, verdicts in zip(groups.values(), f.result(), strict=True)
                for (key, _), verdict in zip(members, verdicts, strict=True)}


def _prove(proofs: list[tuple[ProofSpec, list[bytes]]], reads: dict[str, bytes], device: str,
           signed: SignedVerdicts | None, reprove: bool) -> list[list[Verdict]]:
    """Each proof's verdicts on its targets, all from one base's `reads`: from this machine's
    cache, else from `signed` (verdicts a release key signed), else run, the ones left together in
    one sandbox. `reprove` runs them whatever is cached."""
    keys: list[list[str]] = []
    verdicts: list[list[Verdict | None]] = []
    for spec, targets in proofs:
        unprovable = _unprovable(spec, reads, len(targets))
        keys.append([] if unprovable else [cache_key(spec, t, reads, device) for t in targets])
        verdicts.append(list(unprovable) if unprovable else
                        [None] * len(targets) if reprove else [_cached(k) for k in keys[-1]])
    wanted = [(p, i) for p, found in enumerate(verdicts) for i, v in enumerate(found) if v is None]
    if signed is not None and not reprove and wanted:
        with ThreadPoolExecutor(min(8, len(wanted))) as pool:  # each a few registry round trips
            for (p, i), fetched in zip(wanted, pool.map(lambda w: signed.fetch(keys[w[0]][w[1]]), wanted), strict=True):
                verdicts[p][i] = fetched
                if fetched is not None:
                    _remember(keys[p][i], fetched)
    todo = [(p, [i for i, v in enumerate(found) if v is None]) for p, found in enumerate(verdicts)]
    todo = [(p, indexes) for p, indexes in todo if indexes]
    if todo:
        batch = [(proofs[p][0], [proofs[p][1][i] for i in indexes]) for p, indexes in todo]
        if isinstance(reads, BaseFiles):
            ran = _execute(batch, reads, device)
        else:  # no base named: nothing to key a shared run by, so each proof has a sandbox of its own
            with ThreadPoolExecutor(len(batch)) as pool:
                ran = [found for one in pool.map(lambda proof: _execute([proof], reads, device), batch) for found in one]
        for (p, indexes), proven in zip(todo, ran, strict=True):
            for i, verdict in zip(indexes, proven, strict=True):
                verdicts[p][i] = verdict
                if verdict.verdict != CANNOT:
                    _remember(keys[p][i], verdict)
    out = []
    for looked_up, proof_keys in zip(verdicts, keys, strict=True):
        done = [v for v in looked_up if v is not None]
        assert len(done) == len(looked_up)  # each was cached, fetched or run just now
        out.append([dataclasses.replace(v, key=k) for v, k in zip(done, proof_keys, strict=True)] if proof_keys else done)
    return out


def _unprovable(spec: ProofSpec, reads: dict[str, bytes], count: int) -> list[Verdict] | None:
    """CANNOT-PROVE for each target where the proof cannot run here at all."""
    if spec.script is None:
        return [Verdict(CANNOT, f"no proof can run here: {spec.hardware}")] * count
    missing = [p for p in spec.reads if reads.get(p) is None]
    if missing:
        return [Verdict(CANNOT, f"the base has no {', '.join(missing)}, which the proof reads")] * count
    return None


def readable(spec: ProofSpec) -> list[Path]:
    """What of the project a proof may read: exactly the files it executes (its code)."""
    return list(spec.code)


def gpu_devices() -> tuple[list[str], list[Path]]:
    """(device nodes, read-only /sys paths) of one GPU for a proof on the GPU: NVIDIA's control
    nodes and its first GPU, or AMD's /dev/kfd, the first render node and the KFD topology ROCm
    reads. Nothing more of /dev or /sys: not the other GPUs of a shared host, not a display node.
    (AMD's list follows ROCm's documented needs; no AMD GPU has run it here.)"""
    dev = Path("/dev")
    nvidia = sorted(dev.glob("nvidia[0-9]*"), key=lambda p: int(p.name[6:]))
    if nvidia:
        nodes = [dev / "nvidiactl", dev / "nvidia-uvm", nvidia[0]]
        return [str(n) for n in nodes if n.is_char_device()], []
    render = sorted((dev / "dri").glob("renderD*"))
    if (dev / "kfd").is_char_device() and render:
        sys_paths = [p for p in (Path("/sys/class/kfd"), Path("/sys/devices/virtual/kfd")) if p.exists()]
        return [str(dev / "kfd"), str(render[0])], sys_paths
    raise EnvironmentProblem("--device cuda: no GPU device nodes here (/dev/nvidia*, /dev/kfd); "
                             "run the proofs with --device cpu (Triton's interpreter)")


ZYGOTE = Path(__file__).with_name("zygote.py")  # runs in the sandbox: imports torch once, forks each proof


def _execute(proofs: list[tuple[ProofSpec, list[bytes]]], reads: dict[str, bytes], device: str) -> list[list[Verdict]]:
    """Run the proofs on their targets' bytes in one sandbox (they are one base's code, untrusted):
    zygote.py forks each proof there once torch is imported."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bakery-proof-") as tmp:
        plan = []
        for p, (spec, targets) in enumerate(proofs):
            names = [f"p{p}-target{i}.py" for i in range(len(targets))] + [f"p{p}-read{i}.py" for i in range(len(spec.reads))]
            for name, data in zip(names, targets + [reads[r] for r in spec.reads], strict=True):
                (Path(tmp) / name).write_bytes(data)
            plan.append([str(spec.script), names[:len(targets)], names[len(targets):]])  # beside plan.json
        (Path(tmp) / "plan.json").write_text(json.dumps(plan))
        os.chmod(tmp, 0o755)  # the sandbox's uid reads them
        readable_paths = sorted({p for spec, _ in proofs for p in readable(spec)} | {ZYGOTE})
        # the proofs' task caps summed, shared: any one proof may use it up (then the others fail to fork)
        limits = dataclasses.replace(LIMITS, processes=LIMITS.processes * len(proofs))
        try:
            nodes, sys_paths = gpu_devices() if device != "cpu" else ([], [])
            done = sandbox.run([sys.executable, str(ZYGOTE), f"{sandbox.INPUTS}/plan.json"], readable_paths + sys_paths,
                               Path(tmp), limits, env={"BAKERY_PROOF_DEVICE": device}, devices=nodes, init=True)
        except subprocess.TimeoutExpired:
            timed_out = Verdict(CANNOT, f"timed out after {LIMITS.seconds:.0f} s", time.monotonic() - started)
            return [[timed_out] * len(targets) for _, targets in proofs]
    seconds = round(time.monotonic() - started, 1)
    return [_verdicts(run, len(targets), seconds) for run, (_, targets) in zip(_each_proof(done, len(proofs)), proofs,
                                                                               strict=True)]


def _each_proof(done: subprocess.CompletedProcess, count: int) -> list[subprocess.CompletedProcess]:
    """What each proof of a zygote's run printed and how it exited, from the zygote's own lines (the
    base's code never writes there); a proof it has no line for, or more than one, failed."""
    found: dict[int, subprocess.CompletedProcess] = {}
    seen: set[int] = set()
    for line in done.stdout.split("\n"):  # the zygote's lines (str.splitlines would split at U+2028 too)
        try:
            doc = json.loads(line)
            index, code, out, err = doc["proof"], doc["exit"], doc["stdout"], doc["stderr"]
            if not (isinstance(index, int) and isinstance(code, int) and isinstance(out, str) and isinstance(err, str)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            continue
        if index in seen:  # nothing but the zygote writes there: were it written twice, neither is taken
            found.pop(index, None)
            continue
        seen.add(index)
        found[index] = subprocess.CompletedProcess(done.args, code if done.returncode == 0 else done.returncode, out, err)
    failed = subprocess.CompletedProcess(done.args, done.returncode or 1, "", done.stderr)
    return [found.get(i, failed) for i in range(count)]


def _verdicts(done: subprocess.CompletedProcess, count: int, seconds: float) -> list[Verdict]:
    """One verdict per target from the proof's output lines; a verdict counts only from a run that
    finished (its own exit 0 and the proof process's) with a well-formed line."""
    found: dict[int, Verdict] = {}
    for line in done.stdout.strip().split("\n"):
        try:
            doc = json.loads(line)
            index, verdict, reason = doc["target"], doc["verdict"], doc["reason"]
            if not isinstance(index, int) or not isinstance(reason, str):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            continue  # what the proof printed on its way
        # the reason is the base's code's to shape: capped and inert before any record, table or PR holds it
        reason = untrusted.safe(reason, "json", REASON_LIMIT)
        if index in found:  # the proof prints one line a target: a second came from elsewhere, so neither counts
            found[index] = Verdict(CANNOT, f"the proof failed (two verdicts for target {index})")
        elif verdict in (FIXED, BROKEN, CANNOT) and done.returncode == 0:
            found[index] = Verdict(verdict, reason, float(doc.get("seconds") or 0), _measured(doc.get("measured")))
        else:
            found[index] = Verdict(CANNOT, f"the proof failed ({reason})", float(doc.get("seconds") or 0))
    why = untrusted.safe((done.stderr.strip().splitlines() or ["no output"])[-1], "json", REASON_LIMIT)
    return [found.get(i) or Verdict(CANNOT, f"the proof failed (exit {done.returncode}): {why}", seconds)
            for i in range(count)]


def _measured(found, depth: int = 2) -> dict:
    """What a proof measured: a small mapping of short names to numbers, short text or (two levels
    deep) such mappings; the rest is dropped."""
    if not isinstance(found, dict):
        return {}
    kept: dict[str, Any] = {}
    for name, value in list(found.items())[:32]:
        key = untrusted.safe(name, "json", 64)
        if isinstance(value, (bool, int, float)) or value is None:
            kept[key] = value
        elif isinstance(value, dict) and depth > 1:
            kept[key] = _measured(value, depth - 1)
        else:
            kept[key] = untrusted.safe(value, "json", 200)
    return kept


# -- verdicts that travel: each one an OCI artifact beside the kernel artifact ------------------------

VERDICT_TYPE = "application/vnd.bakery.proof-verdict.v1"
VERDICT_CONFIG = "application/vnd.bakery.proof-verdict.config.v1+json"
EMPTY = "application/vnd.oci.empty.v1+json"  # OCI 1.1's empty descriptor: an artifact's one layer


def verdict_tag(key: str) -> str:
    return f"proof-{key}"


def verdict_artifact_of(verdict: Verdict) -> artifact.Artifact:
    """The verdict as an OCI artifact: its config, named by its key; one empty layer."""
    from ..oci.refs import Descriptor

    # without the seconds it took: the same verdict proven twice is the same artifact, so a tag cannot be
    # moved between signed runs of one key
    config = canonical_json({"key": verdict.key, "verdict": verdict.verdict, "reason": verdict.reason,
                             "measured": verdict.measured})
    return artifact.Artifact.of(verdict_tag(verdict.key), VERDICT_TYPE, (Descriptor.of(VERDICT_CONFIG, config), config),
                                [(Descriptor.of(EMPTY, b"{}"), b"{}")])


def read_verdict(config: bytes, key: str, what: str) -> Verdict:
    """The verdict a signed artifact holds: it must name this key and say FIXED or BROKEN."""
    from ..errors import IntegrityError, malformed

    with malformed(what):
        doc = json.loads(config)
        if not isinstance(doc, dict) or doc.get("key") != key:
            raise IntegrityError(f"{what} judges {untrusted.safe(str(doc.get('key')), limit=80)}, not {key}")
        if doc.get("verdict") not in (FIXED, BROKEN) or not isinstance(doc.get("reason"), str):
            raise IntegrityError(f"{what} holds no FIXED or BROKEN verdict")
        return Verdict(doc["verdict"], untrusted.safe(doc["reason"], "json", REASON_LIMIT),
                       float(doc.get("seconds") or 0), _measured(doc.get("measured")), "registry", key)


@dataclass(frozen=True)
class SignedVerdicts:
    """Verdicts in the build's push target (a RegistryStore) under proof-<key>, taken only where the
    release keys signed the artifact's digest (`trust(ref)` raises otherwise): the kernel artifact's
    rule, except that one refused is not an error: the proof runs here instead."""
    store: RegistryStore
    trust: Callable[[Any, str], object]  # (REF@DIGEST, what) -> raises unless signed
    log: Callable[[str], object] = print

    def fetch(self, key: str) -> Verdict | None:
        from ..errors import AuthError, IntegrityError, NotFound, RegistryError, TransientError
        from ..oci.manifest import Manifest

        what = f"proof verdict {self.store.ref.with_tag(verdict_tag(key))}"

        def signed(pinned) -> None:
            nonlocal what
            what = f"proof verdict {pinned}"
            self.trust(pinned, "proof verdict")

        try:  # a registry writer can put anything under the tag: what is not signed and right is not taken
            taken = artifact.take(self.store, verdict_tag(key), signed)
            if taken is None:
                return None
            pinned, body = taken
            manifest = Manifest.parse(body, what)
            config_desc = manifest.config
            if manifest.artifact_type != VERDICT_TYPE or config_desc.media_type != VERDICT_CONFIG:
                raise IntegrityError(f"{what} is not a proof verdict")
            config = self.store.document(config_desc, f"config of {what}")
            verdict = read_verdict(config, key, what)
        except NotFound:  # a part of it deleted
            return None
        except (TransientError, AuthError):  # the registry is down or refuses us: the push would fail too
            raise
        except (IntegrityError, RegistryError) as e:
            self.log(f"not taking {what}: {e}; proving here")
            return None
        return dataclasses.replace(verdict, artifact=str(pinned))


def verdict_artifact(store: RegistryStore, verdict: Verdict):
    """Where a verdict proven here goes in `store` (the push target), and the push that puts it
    there (its digest is fixed by its bytes, so the record can name it before the push):
    (REGISTRY/REPO@DIGEST, push)."""
    made = verdict_artifact_of(verdict)
    return made.at(store), lambda: artifact.push(store, made)
