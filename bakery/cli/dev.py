"""invoke rehearse (the workflows under act) and invoke test: this machine's stand-ins."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import BakeryError, InputError
from ..project import Project

if TYPE_CHECKING:  # imported by the commands when they run
    from ..dev.act_jobs import Outcome


@dataclass(frozen=True)
class Rehearsed:
    outcome: Outcome
    surprises: tuple[str, ...]

    def check(self) -> None:
        if self.surprises:
            raise BakeryError(f"the rehearsal did not end as it must ({'; '.join(self.surprises)}); act's log: "
                              f"{self.outcome.log}")


def rehearse(project: Path, workflow="release", drill=None, smoke_stand_in=False, work=None, keyless=False,
             log=lambda m: None) -> Rehearsed:
    from ..dev import rehearse as rehearse_mod, rehearse_nightly

    where = Path(work) if work else Project(project).out / "rehearsal"
    if keyless and workflow != "release":
        raise InputError("--keyless rehearses the release workflow's signing; the nightly signs nothing")
    if workflow == "release":
        name = (drill or ("stand-in" if smoke_stand_in else "no-mi300x")) + ("-keyless" if keyless else "")
        outcome = rehearse_mod.release(project, where / name, log, smoke="stand-in" if smoke_stand_in else "none",
                                       drill=drill, signing="keyless" if keyless else "keys")
        # no MI300X runner here: without the stand-in the release must stop where that is found out
        surprises = outcome.surprises(rehearse_mod.DRILLS[drill][0] if drill else None if smoke_stand_in
                                      else "mi300x-runner")
    elif workflow == "nightly":
        if drill not in (None, "needs-porting"):
            raise InputError(f"--drill {drill}: the nightly workflow's is needs-porting")
        outcome = rehearse_nightly.nightly(project, where / (drill or "nightly"), log, porting=drill == "needs-porting")
        surprises = outcome.surprises(None, () if drill else ("porting",))
    else:
        raise InputError(f"--workflow {workflow}: release or nightly")
    return Rehearsed(outcome, tuple(surprises))


# what `invoke test` runs before the suite (issue 41): each checker over the files and with the rules
# pyproject.toml gives it
CHECKS = (("ruff", ["-m", "ruff", "check"]), ("mypy", ["-m", "mypy"]))


def checks_argv() -> list[tuple[str, list[str]]]:
    """Each check's name and command line, as a list (run with this interpreter, in the project)."""
    return [(name, [sys.executable, *args]) for name, args in CHECKS]


def check(project: Path, run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> str | None:
    """Run ruff and mypy over the project, both whatever the first finds, their findings printed as
    they give them; None when both are clean, else one line saying which found something."""
    failed = [name for name, argv in checks_argv() if run(argv, cwd=project).returncode]
    if not failed:
        return None
    return (f"error: {' and '.join(failed)} found problems (listed above); the tests run once the code "
            f"is clean (`ruff check --fix` sorts imports and fixes what it can)")


def pytest_argv(k: str | None, x: bool, rehearsal: bool, fast: bool = False, sweep: bool = False,
                only: str | None = None) -> list[str]:
    """`invoke test`'s pytest command line, as a list (no shell: a -k with a quote stays one argument).
    only: the tests of that mark alone (still without the sweep unless asked)."""
    # the slowest tests, each with its time: where a CI run's minutes go is in its log
    args = [sys.executable, "-m", "pytest", "-ra", "--durations=40", "--durations-min=10", "tests"]
    left_out = ["stack", "slow", "rehearsal", "gpu"] if fast else [] if rehearsal else ["rehearsal"]
    if not sweep:
        left_out.append("sweep")
    marks = ([only] if only else []) + [f"not {mark}" for mark in left_out if mark != only]
    if marks:
        args += ["-m", " and ".join(marks)]
    if k:
        args += ["-k", k]
    if x:
        args.append("-x")
    return args


def _stop(groups: list[subprocess.Popen]) -> None:
    """Stop each process group: an interrupt first (pytest tears down; a rehearsal under way ends
    act's session, dev/act.py), then TERM, then KILL to whatever is left of the groups. A second
    signal to this process meanwhile cannot cut that short."""
    import os
    import signal
    import time

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for stop, grace in ((signal.SIGINT, 60), (signal.SIGTERM, 10), (signal.SIGKILL, 0)):
        for process in groups:
            try:
                os.killpg(process.pid, stop)
            except ProcessLookupError:  # the whole group is gone
                pass
        deadline = time.monotonic() + grace
        for process in groups:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def run_suite(project: Path, k: str | None, x: bool, rehearsal: bool, fast: bool = False, sweep: bool = False,
              log=print) -> int:
    """Run the suite; its exit status. With the rehearsals and no -k, they run in a second pytest
    beside the rest: each mostly waits (on act's jobs, the engine, the registry), so side by side
    the two take about the longer one's time, not their sum. Their output follows the suite's."""
    if not rehearsal or k or fast:
        return subprocess.run(pytest_argv(k, x, rehearsal, fast, sweep), cwd=project).returncode
    import signal
    import time

    output = Project(project).out / "test-rehearsals.log"
    output.parent.mkdir(parents=True, exist_ok=True)
    log(f"the rehearsals run beside the suite, in a second pytest; their output: {output} (shown at the end)")

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    def started(argv: list[str], **kwargs) -> subprocess.Popen:
        # a group of its own, stopped below; its interrupt as Python's default (a background job's
        # shell, .ci/run's `&`, hands SIGINT down ignored)
        return subprocess.Popen(argv, cwd=project, stdin=subprocess.DEVNULL, start_new_session=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)

    # a TERM (CI's timeout, by .ci/run's trap) ends this process as an interrupt would: both pytests
    # are stopped below, not left running without a parent
    previous = signal.signal(signal.SIGTERM, interrupted), signal.getsignal(signal.SIGINT)
    with output.open("w") as out:
        beside = started(pytest_argv(None, x, True, sweep=sweep, only="rehearsal"), stdout=out,
                         stderr=subprocess.STDOUT)
        running = [beside]
        try:
            running.append(started(pytest_argv(None, x, False, sweep=sweep)))
            while x and all(p.poll() is None for p in running):
                time.sleep(0.5)
            if x and any(p.returncode for p in running):  # -x: the first failure, in either, ends both
                log("-x: a test failed; the other pytest is stopped")
                _stop([p for p in running if p.returncode is None])
            suite, rehearsed = running[1].wait(), beside.wait()
        except BaseException:
            _stop(running)
            log(f"the tests were stopped; the rehearsals' output so far: {output}")
            raise
        finally:
            signal.signal(signal.SIGTERM, previous[0])
            signal.signal(signal.SIGINT, previous[1])
    log("-- the rehearsals, run beside the suite " + "-" * 40)
    sys.stdout.write(output.read_text(errors="replace"))
    sys.stdout.flush()
    return suite or rehearsed
