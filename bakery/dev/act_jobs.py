"""The jobs of a workflow run under act, read from act's JSON log: each job's result and seconds,
what GitHub's API would list while the run goes on, each job's time budget, and the run's outcome
judged against the chain of results it must show. Plain code: the log is its only input."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from . import runner


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


def flat_jobs(workflow: Path) -> dict[str, tuple[str, dict]]:
    """{job id: (its name as GitHub's API lists it, the job)}, a local reusable workflow's jobs in
    place of the job that calls it (listed as "CALLER / NAME"; act logs them by their own ids)."""
    import yaml

    jobs: dict[str, tuple[str, dict]] = {}
    for job_id, job in yaml.safe_load(workflow.read_text())["jobs"].items():
        uses = job.get("uses", "")
        if isinstance(uses, str) and uses.startswith("./"):
            called = yaml.safe_load((workflow.parents[2] / uses[2:]).read_text())["jobs"]
            for inner_id, inner in called.items():
                jobs[inner_id] = (f"{job.get('name', job_id)} / {inner.get('name', inner_id)}", inner)
        else:
            jobs[job_id] = (job.get("name", job_id), job)
    return jobs


def run_jobs(logfile: Path, workflow: Path) -> list[dict]:
    """The run's jobs as GitHub's API would list them, from what act's log shows so far: a job that
    logged nothing yet is queued, one with a result completed, the rest in progress."""
    names = {job_id: name for job_id, (name, _) in flat_jobs(workflow).items()}
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
    return {job_id: float(job.get("timeout-minutes", 360)) * 60 for job_id, (_, job) in flat_jobs(workflow).items()}
