"""The CLI contract release automation relies on: every task listed and documented."""

from __future__ import annotations

import importlib.util
import re

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
