"""The CLI contract release automation relies on: every task listed and documented."""

from __future__ import annotations

import re

from conftest import ROOT, invoke

TASKS = ["build", "mirror", "fixture", "stack", "demo", "test", "lock", "rebase", "keygen", "attest", "verify", "smoke", "promote", "toolchain", "compile", "track", "bump", "rehearse"]


def test_every_task_is_listed_with_a_summary():
    listing = invoke(ROOT, "--list").stdout
    for name in TASKS:
        assert re.search(rf"^\s+{name}\s+\S", listing, re.M), f"{name} missing from:\n{listing}"


def test_every_task_has_help():
    for name in TASKS:
        result = invoke(ROOT, "--help", name)
        assert result.returncode == 0 and "Usage: inv[oke] [--core-opts] " + name in result.stdout
    assert "REPO@sha256" in invoke(ROOT, "--help", "build").stdout


def test_help_after_the_task_name_shows_help_and_runs_nothing():
    """`invoke verify --help`: invoke gives a flag after a task with a positional argument to that
    argument; the task shows its help instead of verifying an image named --help."""
    for name in ("verify", "policy", "reproduce", "prove", "build"):
        result = invoke(ROOT, name, "--help")
        assert result.returncode == 0 and "Usage: inv[oke] [--core-opts] " + name in result.stdout, result.stderr
