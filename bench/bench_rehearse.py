"""What a rehearsal costs: `invoke rehearse` (release without an MI300X, release with the smoke
stand-in, nightly), each job's seconds, and how much of it is the bakery commands the workflow runs
(the steps whose `run:` calls `invoke`) against the runner's own work (checkout, Python, the
hash-locked venv installs, artifacts). The comparison a user would make: running those same
commands by hand, one after another, on this machine.

    .venv/bin/python bench/bench_rehearse.py [--only release|stand-in|nightly]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bakery.dev import act_jobs, rehearse, rehearse_nightly  # noqa: E402 (after sys.path names the project)


def command_seconds(outcome: act_jobs.Outcome, workflow: Path) -> dict[str, float]:
    """{job: seconds spent in its steps that run `invoke`}, from act's per-step execution times."""
    jobs = yaml.safe_load(workflow.read_text())["jobs"]
    commands = {(job, step["name"]) for job, spec in jobs.items() for step in spec["steps"]
                if "invoke " in step.get("run", "") and "name" in step}
    spent: dict[str, float] = {}
    for line in outcome.log.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        step = entry.get("step")
        if entry.get("stage") == "Main" and entry.get("stepResult") and (entry.get("jobID"), step) in commands:
            spent[entry["jobID"]] = spent.get(entry["jobID"], 0.0) + entry.get("executionTime", 0) / 1e9
    return spent


def report(name: str, outcome: act_jobs.Outcome, wall: float, workflow: Path) -> None:
    spent = command_seconds(outcome, workflow)
    print(f"\n## {name}: {wall:.0f} s wall")
    print(f"{'job':<16} {'result':<9} {'job s':>7} {'invoke s':>9}")
    for job in outcome.jobs.values():
        print(f"{job.name:<16} {job.result:<9} {job.seconds:>7.0f} {spent.get(job.name, 0):>9.1f}")
    by_hand = sum(spent.values())
    print(f"the bakery commands alone: {by_hand:.0f} s; rehearsal / by hand: {wall / max(by_hand, 1e-9):.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", choices=["release", "stand-in", "nightly"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-rehearse-"))
    runs = {"release": lambda: rehearse.release(ROOT, work / "no-mi300x", log=lambda m: None),
            "stand-in": lambda: rehearse.release(ROOT, work / "stand-in", log=lambda m: None, smoke="stand-in"),
            "nightly": lambda: rehearse_nightly.nightly(ROOT, work / "nightly", log=lambda m: None)}
    for name, go in runs.items():
        if args.only and name != args.only:
            continue
        start = time.monotonic()
        outcome = go()
        wall = time.monotonic() - start
        workflow = ROOT / ".github" / "workflows" / ("nightly.yml" if name == "nightly" else "release.yml")
        report(name, outcome, wall, workflow)


if __name__ == "__main__":
    main()
