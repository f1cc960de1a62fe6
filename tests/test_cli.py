"""The CLI contract release automation relies on: every task listed and documented."""

from __future__ import annotations

import importlib.util
import re
import shutil

import pytest
from invoke import Collection

from support import ROOT, invoke


def _tasks() -> list[str]:
    """Every task tasks.py defines, as invoke names them: a new task is checked without an edit here."""
    spec = importlib.util.spec_from_file_location("tasks_under_test", ROOT / "tasks.py")
    assert spec is not None and spec.loader is not None  # a .py file's, which it is
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return sorted(Collection.from_module(module).task_names)


TASKS = _tasks()


def test_the_task_list_is_the_collection_and_the_architecture_page_names_each():
    assert len(TASKS) >= 25 and {"build", "attest", "verify", "attest-rebuild", "disk"} <= set(TASKS)
    tasks_table = (ROOT / "docs" / "architecture.md").read_text()
    assert [t for t in TASKS if f"invoke {t}" not in tasks_table] == []


def test_every_task_is_listed_with_a_summary():
    listing = invoke(ROOT, "--list").stdout
    for name in TASKS:
        assert re.search(rf"^\s+{name}\s+\S", listing, re.M), f"{name} missing from:\n{listing}"


@pytest.mark.slow
def test_every_task_has_help():
    for name in TASKS:
        result = invoke(ROOT, "--help", name)
        assert result.returncode == 0 and "Usage: inv[oke] [--core-opts] " + name in result.stdout
    assert "REPO@sha256" in invoke(ROOT, "--help", "build").stdout


@pytest.mark.slow
def test_help_after_the_task_name_shows_help_and_runs_nothing():
    """`invoke verify --help`: invoke gives a flag after a task with a positional argument to that
    argument; the task shows its help instead of verifying an image named --help."""
    for name in ("verify", "policy", "reproduce", "prove", "build"):
        result = invoke(ROOT, name, "--help")
        assert result.returncode == 0 and "Usage: inv[oke] [--core-opts] " + name in result.stdout, result.stderr


def test_invoke_test_checks_with_ruff_and_mypy_both_and_names_which_found_something():
    """issue 41: the suite runs only on clean code; both checkers run whatever the first finds, so one
    run lists every finding, and the one line names the checkers that found something."""
    from subprocess import CompletedProcess

    from bakery.cli import dev

    assert [name for name, _ in dev.checks_argv()] == ["ruff", "mypy"]
    assert all(argv[1:3] in (["-m", "ruff"], ["-m", "mypy"]) for _, argv in dev.checks_argv())

    def runs(*codes):
        ran = []

        def run(argv, cwd):
            ran.append((argv[2], cwd))
            return CompletedProcess(argv, codes[len(ran) - 1])

        return ran, run

    ran, run = runs(0, 0)
    assert dev.check(ROOT, run) is None and ran == [("ruff", ROOT), ("mypy", ROOT)]
    ran, run = runs(1, 0)
    said = dev.check(ROOT, run)
    assert said and said.startswith("error: ruff found problems") and len(ran) == 2
    ran, run = runs(1, 1)
    assert (dev.check(ROOT, run) or "").startswith("error: ruff and mypy found problems")


@pytest.mark.slow
def test_invoke_test_stops_on_a_finding_before_any_test_runs(tmp_path):
    """A copy of the project with one lint finding (an unused import) and one type error: `invoke
    test --fast` lists both and ends in one line, exit 1, no test collected."""
    from support import copy_project

    project = copy_project(tmp_path / "project")
    if (ROOT / ".mypy_cache").is_dir():  # warm, as here: copy_project leaves it out (tens of MB)
        shutil.copytree(ROOT / ".mypy_cache", project / ".mypy_cache")
    errors = project / "bakery" / "errors.py"
    errors.write_text(errors.read_text() + '\n\nimport os  # unused\n\nPLANTED: int = "not an int"\n')
    result = invoke(project, "test", "--fast")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "F401" in result.stdout and "bakery/errors.py" in result.stdout and "[assignment]" in result.stdout
    assert result.stderr.strip().splitlines()[-1].startswith("error: ruff and mypy found problems")
    assert "collected" not in result.stdout and "passed" not in result.stdout


def test_invoke_test_x_stops_the_rehearsals_at_the_suites_first_failure(tmp_path):
    """With --rehearsal the rehearsals run in a second pytest beside the suite; -x asks that the
    first failure end the run, so a failure in either stops the other (before, the rehearsals ran
    on to their end). A stand-in project: one failing test, one rehearsal that would take 30 s."""
    from bakery.cli import dev

    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmarkers = ["rehearsal: r", "sweep: s"]\n')
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_standin.py").write_text(
        "import pathlib, time\nimport pytest\n\n\ndef test_fails():\n    time.sleep(2)\n    assert False\n\n\n"
        "@pytest.mark.rehearsal\ndef test_rehearsal():\n    pathlib.Path('started').touch()\n    time.sleep(30)\n"
        "    pathlib.Path('finished').touch()\n")
    said: list[str] = []
    code = dev.run_suite(tmp_path, None, True, True, log=said.append)
    assert code != 0 and (tmp_path / "started").exists() and not (tmp_path / "finished").exists()
    assert any("-x: a test failed" in line for line in said)
