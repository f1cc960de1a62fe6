"""`invoke smoke`: run the image on an MI300X the production way and gate it on what a healthy
service shows. This module is the run's I/O: the hardware, the container, its HTTP API and VRAM.
Only the launch needs the GPU; what the run is judged against is plain code, tested on recorded log
streams and a local stand-in server: the spec (smoke_spec.py), the start's log (smoke_log.py), the
verdict and the signed report (smoke_report.py)."""

from __future__ import annotations

import glob
import json
import re
import subprocess
import threading
import time
import uuid
from pathlib import Path

import requests

from .. import untrusted
from ..errors import EnvironmentProblem, InputError, SmokeFailure
from ..trust import smoke_ledger
from .smoke_log import LogWatcher
from .smoke_report import HttpChecks, SmokeReport, verdict, workflow_run
from .smoke_spec import Case, SmokeSpec

# -- HTTP checks --------------------------------------------------------------------------------------

class Service:
    """The OpenAI-compatible API of the running container; any 5xx fails the smoke."""

    def __init__(self, base_url: str, model: str):
        self.base, self.model = base_url.rstrip("/"), model

    def _post(self, path: str, body: dict) -> dict:
        resp = requests.post(self.base + path, json=body, timeout=600)
        said = untrusted.safe(resp.text, limit=200)  # the served image's text: one inert line in our error
        if resp.status_code >= 500:
            raise SmokeFailure(f"HTTP {resp.status_code} from {path}: {said}")
        if resp.status_code != 200:
            raise SmokeFailure(f"{path} answered HTTP {resp.status_code}: {said}")
        return resp.json()

    def models(self) -> str:
        resp = requests.get(self.base + "/v1/models", timeout=60)
        if resp.status_code != 200:
            raise SmokeFailure(f"/v1/models answered HTTP {resp.status_code}")
        ids = [m.get("id") for m in resp.json().get("data", [])]
        if self.model not in ids:
            raise SmokeFailure(f"/v1/models lists {untrusted.safe(ids, limit=200)}, not {self.model}")
        return self.model

    def complete(self, prompt: str, max_tokens: int, temperature: float = 0.0, seed: int | None = None) -> dict:
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
        if seed is not None:
            body["seed"] = seed
        return self._post("/v1/completions", body)

    def arithmetic(self) -> str:
        text = self.complete("Calculate 17 * 23. Answer with the number only.", 32)["choices"][0]["text"]
        if "391" not in text:
            raise SmokeFailure(f"'Calculate 17 * 23' at temperature 0 answered {text.strip()[:80]!r}, not 391")
        return text

    def prefill(self, min_tokens: int) -> dict:
        """One uncached prefill over min_tokens: a fresh nonce defeats the prefix cache."""
        words = " ".join(f"item{i}" for i in range(min_tokens))
        prompt = f"[{uuid.uuid4()}] Repeat the last item of this list: {words}"
        start = time.monotonic()
        out = self.complete(prompt, 1)
        seconds = time.monotonic() - start
        tokens = out.get("usage", {}).get("prompt_tokens", 0)
        if tokens <= min_tokens:
            raise SmokeFailure(f"the long prefill had only {tokens} prompt tokens (need > {min_tokens})")
        return {"prompt_tokens": tokens, "seconds": round(seconds, 3), "tokens_per_s": round(tokens / seconds, 1)}

    def regression(self, cases: tuple[Case, ...], record: bool) -> list[dict]:
        results = []
        for case in cases:
            text = self.complete(case.prompt, case.max_tokens, case.temperature, case.seed)["choices"][0]["text"]
            results.append({"prompt": case.prompt, "seed": case.seed, "text": text,
                            "status": "recorded" if record else ("unrecorded" if case.expected is None
                                                                  else "same" if text == case.expected else "differs")})
        return results


def http_checks(service: Service, spec: SmokeSpec, record: bool) -> HttpChecks:
    """The checks after a healthy start."""
    return HttpChecks(service.models(), service.arithmetic().strip(), service.prefill(spec.prefill_min_tokens),
                      tuple(service.regression(spec.regression, record)))


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
    """docker run settings of the production service (the Docker SDK's containers.run kwargs)."""
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


def run(image: str, spec: SmokeSpec, model_dir: Path, port: int = 8000, record: bool = False,
        devices: list[str] | None = None, require_hardware: bool = True, vram=vram_used_bytes, log=print,
        stand_ins: dict | None = None) -> SmokeReport:
    """Launch, watch, check; always returns a report (result PASSED or FAILED) and removes the container."""
    import docker

    if require_hardware:
        reason = mi300x_present()
        if reason:
            raise EnvironmentProblem(reason)
    options = {**launch_options(image, spec, model_dir, port, devices), **(stand_ins or {})}
    client = docker.from_env()
    facts, started = host_facts(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    number, workflow = smoke_ledger.next_run(), workflow_run()
    sampler = VramSampler(vram)
    try:
        container = client.containers.run(**options)
    except docker.errors.APIError as e:
        raise SmokeFailure(f"Docker could not start {image}: {e.explanation or e}") from None
    sampler.start()
    watcher = LogWatcher(spec.speculative, spec.health_deadline_s)
    healthy, http, failure = False, None, None
    try:
        log(f"waiting up to {spec.health_deadline_s}s for a healthy start of {image}")
        watch(container, watcher)
        healthy = True
        http = http_checks(Service(f"http://127.0.0.1:{port}", spec.model), spec, record)
    except SmokeFailure as e:
        failure = str(e)
    finally:
        sampler.stop.set()
        sampler.join(timeout=10)
        container.remove(force=True)
    high = sampler.high or None
    return SmokeReport(image, spec.model, spec.revision, facts, started, number, workflow,
                       tuple({"signal": n, "seconds": s, "line": line} for n, s, line in watcher.seen), healthy, http,
                       failure, high, spec.vram_limit_bytes, sampler.error if sampler.error and not high else None,
                       time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), verdict(healthy, http, high, spec))
