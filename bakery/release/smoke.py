"""`invoke smoke`: the MI300X acceptance gate. It serves the candidate and a reference one after the
other, each path in turn (launched here the production way, or servers started elsewhere), runs the
stages of gate.py against each, and judges them. This module is the run's I/O: the hardware, the
containers, their start and VRAM, the order of the servers. What a run is judged against is plain
code, tested on recorded log streams and a local stand-in server: the spec (smoke_spec.py), the
start's log (smoke_log.py), the A/B (ab.py), the verdict and the signed report (smoke_report.py)."""

from __future__ import annotations

import contextlib
import glob
import json
import re
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError, SmokeFailure
from ..trust import smoke_ledger
from . import ab as ab_mod, bfcl, gate
from .smoke_log import LogWatcher
from .smoke_report import Reference, ServerRun, SmokeReport, verdict, workflow_run
from .smoke_spec import SPECULATIVE_FLAG, SmokeSpec

# -- VRAM ------------------------------------------------------------------------------------------------

def vram_used_bytes(command: tuple[str, ...] = ("rocm-smi", "--showmeminfo", "vram", "--json")) -> int:
    """Used VRAM summed over the cards rocm-smi reports."""
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30, check=True).stdout
        cards = json.loads(out)
        return sum(int(v["VRAM Total Used Memory (B)"]) for k, v in cards.items() if k.startswith("card"))
    except (OSError, subprocess.SubprocessError, ValueError, KeyError) as e:
        raise SmokeFailure(f"cannot read VRAM use from rocm-smi: {e}") from None


class VramSampler(threading.Thread):
    """Samples VRAM every few seconds; keeps the high-water mark."""

    def __init__(self, read=vram_used_bytes, every: float = 2.0):
        super().__init__(daemon=True)
        self.error: str | None = None
        self.read, self.every, self.high = read, every, 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                self.high = max(self.high, self.read())
            except SmokeFailure as e:
                self.error = str(e)
            self.stop.wait(self.every)


# -- the hardware ----------------------------------------------------------------------------------------

def mi300x_present(kfd: str = "/dev/kfd", topology: str = "/sys/class/kfd/kfd/topology/nodes") -> str | None:
    """None if a gfx942 GPU is visible through /dev/kfd, else why not (one line)."""
    if not Path(kfd).exists():
        return f"no MI300X here: {kfd} does not exist (no AMD GPU driver on this host); run invoke smoke on an MI300X host"
    for props in glob.glob(f"{topology}/*/properties"):
        if re.search(r"^gfx_target_version 90402$", Path(props).read_text(), re.M):
            return None
    return f"no MI300X here: {kfd} exists but no node in {topology} is gfx942 (gfx_target_version 90402)"


def host_facts(topology: str = "/sys/class/kfd/kfd/topology/nodes", driver: str = "/sys/module/amdgpu/version",
               rocm: str = "/opt/rocm/.info/version") -> dict:
    """What this host says it is, for the signed result: its GPUs' gfx arch and compute units (of the
    first GPU node in KFD's topology), how many GPUs, and the amdgpu driver and ROCm versions."""
    import platform

    def text(path: str) -> str | None:
        try:
            return Path(path).read_text().strip() or None
        except OSError:
            return None

    gpus = []
    for props in sorted(glob.glob(f"{topology}/*/properties"), key=lambda p: int(Path(p).parent.name)
                        if Path(p).parent.name.isdigit() else 0):
        values = dict(line.split(None, 1) for line in (text(props) or "").splitlines() if " " in line)
        version = int(values.get("gfx_target_version", "0") or 0)
        if version:  # CPU nodes report 0
            major, minor, stepping = version // 10000, version // 100 % 100, version % 100
            simds, per_cu = int(values.get("simd_count", 0)), int(values.get("simd_per_cu", 0))
            gpus.append({"gfx_arch": f"gfx{major}{minor:x}{stepping:x}",
                         "compute_units": simds // per_cu if per_cu else None})
    return {"name": platform.node(), "gpus": len(gpus), **(gpus[0] if gpus else {"gfx_arch": None, "compute_units": None}),
            "driver_version": text(driver) or f"in-tree amdgpu (kernel {platform.release()})",
            "rocm_version": text(rocm) or "no ROCm install on the host"}


def launch_options(image: str, spec: SmokeSpec, model_dir: Path, port: int, devices: list[str] | None = None) -> dict:
    """docker run settings of the production service (the Docker SDK's containers.run kwargs), on the
    image's own command (the dspark path)."""
    from docker.types import Ulimit

    if model_dir.name != spec.revision:
        raise InputError(f"model snapshot {model_dir} is not revision {spec.revision}: pass "
                         f".../snapshots/{spec.revision}")
    return {
        "image": image, "detach": True,
        "devices": devices if devices is not None else ["/dev/kfd:/dev/kfd:rwm", "/dev/dri:/dev/dri:rwm"],
        "group_add": ["video"], "cap_add": ["IPC_LOCK", "SYS_PTRACE"], "security_opt": ["seccomp=unconfined"],
        "ipc_mode": "host", "shm_size": spec.shm_size,
        "ulimits": [Ulimit(name="memlock", soft=-1, hard=-1)],
        "volumes": {str(model_dir): {"bind": spec.model_mount, "mode": "ro"}},
        "ports": {"8000/tcp": ("127.0.0.1", port)},
        "labels": {"bakery.smoke": "1"},
    }


def watch(container, watcher: LogWatcher, poll: float = 1.0) -> None:
    """Follow the container's logs until healthy; fail fast on a bad line, an exit or the deadline."""
    lines: list[str] = []

    def follow():
        for raw in container.logs(stream=True, follow=True):
            for line in raw.decode(errors="replace").splitlines():
                lines.append(line)

    threading.Thread(target=follow, daemon=True).start()
    fed = 0
    while True:
        while fed < len(lines):
            watcher.feed(lines[fed])
            fed += 1
        if watcher.healthy:
            return
        container.reload()
        if container.status in ("exited", "dead"):
            time.sleep(poll)  # let the log thread drain
            for line in lines[fed:]:
                watcher.feed(line)
            code = container.attrs["State"]["ExitCode"]
            raise SmokeFailure(f"container exited (code {code}) before '{watcher.waiting_for}': "
                               f"{' | '.join(line.strip() for line in lines[-3:])[:400]}")
        watcher.check_deadline()
        time.sleep(poll)




def path_command(command: list[str], path: str) -> list[str]:
    """The image's `vllm serve` arguments for one path: native leaves out the speculative config."""
    if path == "dspark":
        return list(command)
    out, skip = [], False
    for arg in command:
        if skip:
            skip = False
        elif arg == SPECULATIVE_FLAG:
            skip = True  # its value is the next argument
        elif not arg.startswith(SPECULATIVE_FLAG + "="):
            out.append(arg)
    return out


# -- the servers -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Endpoint:
    """A server started elsewhere, serving one path: the gate launches nothing."""
    url: str


@dataclass(frozen=True)
class Launch:
    """A server the gate starts: docker run settings (launch_options, the path's command in them)."""
    options: dict


def parse_endpoints(given: list[str] | tuple[str, ...], paths: tuple[str, ...], flag: str) -> dict[str, Endpoint]:
    """--endpoint PATH=URL, once per path (a server runs one path at a time)."""
    out: dict[str, Endpoint] = {}
    for item in given:
        path, _, url = item.partition("=")
        if path not in paths or not re.match(r"^https?://[^\s/]+", url):
            raise InputError(f"{flag} {item}: give PATH=URL with PATH one of {', '.join(paths)} "
                             f"(e.g. {flag} dspark=http://127.0.0.1:8000)")
        if path in out:
            raise InputError(f"{flag}: {path} named twice")
        out[path] = Endpoint(url.rstrip("/"))
    if out and set(out) != set(paths):
        raise InputError(f"{flag}: name a server for each path ({', '.join(paths)}); missing "
                         f"{', '.join(p for p in paths if p not in out)}")
    return out


@contextlib.contextmanager
def serving(run: ServerRun, how: Endpoint | Launch, spec: SmokeSpec, vram, log):
    """The server's URL while it serves: an endpoint as it is, or a container started, watched until
    healthy (or failed), its VRAM sampled, and removed after, whatever happens."""
    if isinstance(how, Endpoint):
        run.healthy = True
        yield how.url
        return
    import docker

    client = docker.from_env()
    sampler = VramSampler(vram)
    try:
        container = client.containers.run(**how.options)
    except docker.errors.APIError as e:
        raise SmokeFailure(f"Docker could not start {how.options['image']}: {e.explanation or e}") from None
    sampler.start()
    watcher = LogWatcher(run.path == "dspark", spec.health_deadline_s)
    try:
        log(f"waiting up to {spec.health_deadline_s}s for a healthy start of the {run.side} on the {run.path} path")
        start = time.monotonic()
        try:
            watch(container, watcher)
        finally:
            run.health = tuple({"signal": n, "seconds": s, "line": line} for n, s, line in watcher.seen)
            run.seconds["start"] = round(time.monotonic() - start, 1)
        run.healthy = True
        port = how.options["ports"]["8000/tcp"][1]
        yield f"http://127.0.0.1:{port}"
    finally:
        sampler.stop.set()
        sampler.join(timeout=10)
        container.remove(force=True)
        run.vram_high_water_bytes = sampler.high or None
        run.vram_error = sampler.error if sampler.error and not sampler.high else None


def _stage(run: ServerRun, name: str, seconds: float, fn):
    """One stage under its deadline, timed into the run."""
    start = time.monotonic()
    try:
        return fn(gate.Deadline(f"{name} ({run.side}, {run.path} path)", seconds))
    finally:
        run.seconds[name] = round(time.monotonic() - start, 1)


def serve_and_check(run: ServerRun, how: Endpoint | Launch, spec: SmokeSpec, bench: gate.BenchClient | None,
                    harness: bfcl.Harness, vram, log) -> None:
    """Every stage this server owes the gate; a failure stops this server (recorded in the run)."""
    try:
        with serving(run, how, spec, vram, log) as url:
            service = gate.Service(url, spec.model)
            service.models()
            if run.side == "candidate":
                run.arithmetic = gate.arithmetic(service)
            log(f"A/B sweep on the {run.side}'s {run.path} path: {len(spec.ab.requests())} completions of "
                f"{spec.ab.max_tokens} tokens")
            run.completions = _stage(run, "ab", spec.budget_s["ab"], lambda d: gate.sweep(
                service, spec.ab, run.path, d, _progress(log, f"{run.side} {run.path}")))
            if run.side == "candidate":
                def quality(d):
                    run.needles = gate.needles(service, spec.needles, run.path, d)
                    log(f"tool calls on the candidate's {run.path} path: {len(spec.tool_calls.cases)} BFCL cases")
                    run.tool_calls = gate.tool_calls(service, harness, spec.tool_calls, run.path, d)
                _stage(run, "quality", spec.budget_s["quality"], quality)
            if run.path == "dspark" and bench is not None:
                def measure(d):
                    return [gate.speed(bench, g, service, d) for g in spec.speed.gates]
                run.speed = _stage(run, "speed", spec.budget_s["speed"], measure)
                run.acceptance = next((s["acceptance"] for s in run.speed if s.get("acceptance")), None)
    except SmokeFailure as e:
        run.failure = str(e)


def _progress(log, what: str):
    def say(done: int, total: int) -> None:
        if done == total or done % max(1, total // 8) == 0:
            log(f"{what}: {done} of {total}")
    return say


def run(image: str, spec: SmokeSpec, servers: Mapping[tuple[str, str], Endpoint | Launch], reference: Reference,
        same_base: bool, approvals: ab_mod.Approvals | None, bench: gate.BenchClient | None,
        harness: bfcl.Harness, vram=vram_used_bytes, log=print) -> SmokeReport:
    """The gate: the reference's servers, then the candidate's, one at a time, path by path; then the
    A/B and the verdict. Always returns a report (PASSED or FAILED); every container it started is
    removed."""
    facts, started = host_facts(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    number, workflow = smoke_ledger.next_run(), workflow_run()
    runs = []
    for side in ("reference", "candidate"):
        for path in spec.paths:
            how = servers[(side, path)]
            serves = how.url if isinstance(how, Endpoint) else how.options["image"]
            runs.append(ServerRun(side, path, serves, isinstance(how, Launch)))
            serve_and_check(runs[-1], how, spec, bench, harness, vram, log)
    results, ab_error = None, None
    if all(r.failure is None for r in runs):
        try:
            results = ab_mod.compare([c for r in runs if r.side == "candidate" for c in r.completions],
                                     [c for r in runs if r.side == "reference" for c in r.completions],
                                     spec.paths, approvals)
        except InputError as e:
            ab_error = str(e)
    checks = verdict(spec, runs, reference, same_base, results, ab_error)
    return SmokeReport(image, spec.model, spec.revision, facts, started, number, workflow, reference, same_base,
                       any(r.launched for r in runs), tuple(runs), results, approvals, checks, spec.budget_total_s,
                       time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
