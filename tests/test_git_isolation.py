"""A rebuilt revision's git reads none of this machine's git configuration (issue 50, item 1).

`invoke reproduce` clones and checks out the revision with git, ours, outside the sandbox. With the
host's system and global configuration, what the revision commits drives it: on GitHub's runners
the git-lfs package has run `git lfs install --system` (Debian's package runs it too), so a
committed `.gitattributes` naming `filter=lfs` and a `.lfsconfig` naming a URL make git-lfs POST to
that URL, then GET whatever address and headers the answer names (cloud metadata, the LAN).

Here the host is such a runner in miniature: a private "system" file (GIT_CONFIG_SYSTEM) as `git lfs
install --system` writes it, a global file (HOME) whose core.hooksPath holds a post-checkout hook,
and a trap on loopback that records every request. An unisolated clone and checkout, as reproduce
ran them before, reaches the trap and runs the hook (the control); the rebuild's reaches nothing,
runs nothing, and still checks the revision out.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from bakery.errors import IntegrityError
from bakery.release import reproduce
from bakery.release.reproduce import Plan, claimed

BASE = "127.0.0.1:1/b@sha256:" + "0" * 64  # never reached: a revision without hip/ stops before the build
CLEAN = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}  # how the revision itself is made
DATA = b"the large file's bytes\n"
POINTER = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{hashlib.sha256(DATA).hexdigest()}\n"
           f"size {len(DATA)}\n")
LFS_SYSTEM = """[filter "lfs"]
\tclean = git-lfs clean -- %f
\tsmudge = git-lfs smudge -- %f
\tprocess = git-lfs filter-process
\trequired = true
"""  # what `git lfs install --system` writes into /etc/gitconfig


class Trap(http.server.ThreadingHTTPServer):
    def __init__(self):
        super().__init__(("127.0.0.1", 0), TrapHandler)
        self.seen: list[tuple[str, str]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"


class TrapHandler(http.server.BaseHTTPRequestHandler):
    """Records every request. The LFS batch call is answered as a hostile server would: download the
    object from another address (the metadata service, here the trap again), with headers of its own;
    that address answers with the object's bytes, so the checkout ends well (and its hook runs)."""
    server: Trap

    def _any(self):
        size = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(size)
        self.server.seen.append((self.command, self.path))
        if self.command == "POST" and self.path.endswith("/objects/batch"):
            body = json.dumps({"transfer": "basic", "objects": [
                {"oid": hashlib.sha256(DATA).hexdigest(), "size": len(DATA), "authenticated": True,
                 "actions": {"download": {"href": f"{self.server.url}/computeMetadata/v1/",
                                          "header": {"Metadata-Flavor": "Google"}}}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/vnd.git-lfs+json")
        elif self.command == "GET" and self.path == "/computeMetadata/v1/":
            body = DATA  # what git-lfs checks out: the answer of the address the batch named
            self.send_response(200)
        else:
            body = b""
            self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_HEAD = _any

    def log_message(self, *args):
        pass


@pytest.fixture
def trap():
    server = Trap()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


def _git(cwd: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120)


@pytest.fixture
def revision(tmp_path, trap) -> tuple[Path, str]:
    """A repository whose one commit holds an LFS pointer, the attributes that filter it through
    lfs (and its README through another filter), and a .lfsconfig that sends git-lfs to the trap
    (committed without any filter at hand)."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / ".gitattributes").write_text("big.bin filter=lfs diff=lfs merge=lfs -text\nREADME filter=fmt\n")
    (repo / ".lfsconfig").write_text(f"[lfs]\n\turl = {trap.url}/trap\n")
    (repo / "big.bin").write_text(POINTER)
    (repo / "README").write_text("a revision without hip/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "lfs"]):
        assert _git(repo, *args, env=CLEAN).returncode == 0
    return repo, _git(repo, "rev-parse", "HEAD", env=CLEAN).stdout.strip()


@pytest.fixture
def runner(tmp_path, monkeypatch) -> Path:
    """This process's git configuration made a GitHub runner's: git-lfs's filter system-wide (and a
    filter of another tool's), and a global core.hooksPath holding a post-checkout hook. Each program
    of theirs that runs leaves its name in the folder returned. Skipped without git-lfs."""
    try:
        lfs = subprocess.run(["git", "lfs", "version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        lfs = None
    if lfs is None or lfs.returncode != 0:
        pytest.skip("git-lfs is not installed (apt-get install git-lfs): without its filter there is nothing to trap")
    ran, programs, home = tmp_path / "ran", tmp_path / "programs", tmp_path / "home"
    for folder in (ran, programs, home):
        folder.mkdir()
    for name, then in (("post-checkout", ""), ("smudge", "cat\n")):
        (programs / name).write_text(f"#!/bin/sh\ntouch {ran / name}\n{then}")
        (programs / name).chmod(0o755)
    system = tmp_path / "gitconfig"
    system.write_text(LFS_SYSTEM + f'[filter "fmt"]\n\tsmudge = {programs / "smudge"}\n')
    (home / ".gitconfig").write_text(f"[core]\n\thooksPath = {programs}\n")
    for name in [n for n in os.environ if n.startswith("GIT_")] + ["XDG_CONFIG_HOME"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", str(system))
    monkeypatch.setenv("HOME", str(home))
    return ran


def test_on_such_a_runner_an_unisolated_checkout_reaches_the_trap_and_runs_the_hook(runner, revision, trap,
                                                                                    tmp_path):
    """The control: the clone and checkout as reproduce ran them before, with this (runner's)
    configuration: git-lfs posts to the .lfsconfig's URL, then fetches where the answer sends it."""
    repo, commit = revision
    source = tmp_path / "source"
    clone = _git(tmp_path, "-c", "protocol.allow=never", "-c", "protocol.https.allow=always", "-c",
                 "protocol.file.allow=always", "clone", "-q", "--no-checkout", "--", str(repo), str(source))
    assert clone.returncode == 0, clone.stderr
    checkout = _git(source, "-c", "core.symlinks=true", "checkout", "-q", "--detach", commit)
    assert checkout.returncode == 0, checkout.stderr
    assert (source / "big.bin").read_bytes() == DATA  # the metadata service's answer, checked out
    assert ("POST", "/trap/objects/batch") in trap.seen, trap.seen
    assert ("GET", "/computeMetadata/v1/") in trap.seen, trap.seen
    assert sorted(os.listdir(runner)) == ["post-checkout", "smudge"]


def _rebuild(repo: Path, commit: str, work: Path) -> Path:
    """The rebuild's clone and checkout (it stops at the missing hip/, before any build): the checkout."""
    with pytest.raises(IntegrityError, match="hip/ is not a folder of the checkout"), claimed(work):
        reproduce.rebuild(Plan(str(repo), commit, False, BASE, 1, None), work, None, log=lambda m: None)
    return work / "source"


def test_the_rebuilds_git_reaches_no_trap_runs_no_hook_and_checks_the_revision_out(runner, revision, trap,
                                                                                    tmp_path):
    repo, commit = revision
    source = _rebuild(repo, commit, tmp_path / "work")
    assert trap.seen == []
    assert os.listdir(runner) == []
    assert (source / "big.bin").read_text() == POINTER  # checked out as committed: no smudge ran
    assert (source / ".lfsconfig").is_file() and (source / "README").is_file()
    head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True,
                          env={**os.environ, **CLEAN})
    assert head.stdout.strip() == commit


def test_git_configuration_in_our_environment_does_not_reach_the_revisions_git(runner, revision, trap, tmp_path,
                                                                            monkeypatch):
    """GIT_CONFIG_PARAMETERS (as `git -c` or a CI step passes it on) and GIT_CONFIG_COUNT set where
    reproduce runs are configuration too: the lfs filter and a hook named there work in a plain
    clone, not in the rebuild's."""
    repo, commit = revision
    hooks, marker = tmp_path / "env-hooks", tmp_path / "env-hook-ran"
    hooks.mkdir()
    (hooks / "post-checkout").write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\n")
    (hooks / "post-checkout").chmod(0o755)
    monkeypatch.setenv("GIT_CONFIG_SYSTEM", os.devnull)  # here the configuration is the environment's alone
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'filter.lfs.process'='git-lfs filter-process' "
                                                "'filter.lfs.required'='true'")
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "core.hooksPath")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", str(hooks))
    control = subprocess.run(["git", "clone", "-q", "--", str(repo), str(tmp_path / "control")],
                             capture_output=True, text=True, timeout=120)
    assert control.returncode == 0, control.stderr
    assert ("POST", "/trap/objects/batch") in trap.seen and marker.exists(), trap.seen
    trap.seen.clear()
    marker.unlink()
    source = _rebuild(repo, commit, tmp_path / "work")
    assert trap.seen == [] and not marker.exists()
    assert (source / "big.bin").read_text() == POINTER


def test_the_revisions_git_environment(monkeypatch):
    """What git_env() gives every git of a revision, whatever this process's environment."""
    monkeypatch.setenv("GIT_CONFIG_PARAMETERS", "'core.hookspath'='/tmp'")
    monkeypatch.setenv("GIT_SSH_COMMAND", "touch /tmp/x")
    monkeypatch.setenv("SSH_ASKPASS", "/usr/bin/ssh-askpass")
    monkeypatch.setenv("HOME", "/root")
    env = reproduce.git_env()
    assert {k: v for k, v in env.items() if k.startswith("GIT_")} == {
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0",
        "GIT_LFS_SKIP_SMUDGE": "1", "GIT_ALLOW_PROTOCOL": "file:https"}
    assert env["HOME"] == env["XDG_CONFIG_HOME"] == os.devnull and "SSH_ASKPASS" not in env
    assert env["PATH"] == os.environ["PATH"]
    options = " ".join(reproduce.GIT_OPTIONS)
    for option in ("protocol.allow=never", "core.hooksPath=/dev/null", "filter.lfs.process=", "core.fsmonitor=false"):
        assert option in options


def test_the_hosts_own_mirror_setting_still_names_where_to_clone_from(tmp_path, monkeypatch):
    """The operator's url.<base>.insteadOf (a mirror; the rehearsal's local origin) is read by us and
    handed to the revision's git in its environment, the longest match first, as git would pick it:
    the revision's git itself reads no configuration, and the clone keeps the original address (a
    token in the mirror's would otherwise be written into .git/config, which the sandbox reads)."""
    import subprocess

    from bakery.release import reproduce

    home = tmp_path / "home"
    home.mkdir()
    mirror = tmp_path / "my mirror"  # a space in the base: -z keeps it whole
    subprocess.run(["git", "init", "-q", "--bare", str(mirror)], check=True)
    (home / ".gitconfig").write_text(f'[url "file://{mirror}"]\n\tinsteadOf = https://github.com/o/bakery\n'
                                     '[url "file:///srv/mirror/all/"]\n\tinsteadOf = https://github.com/\n')
    monkeypatch.setenv("HOME", str(home))
    assert reproduce.host_rewrite("https://github.com/o/bakery") == (f"file://{mirror}", "https://github.com/o/bakery")
    assert reproduce.host_rewrite("https://github.com/o/other") == ("file:///srv/mirror/all/", "https://github.com/")
    assert reproduce.host_rewrite("https://example.com/x") is None
    assert reproduce.git_env()["HOME"] != str(home)  # not for the revision's git
    clone = tmp_path / "clone"
    rewrite = reproduce.host_rewrite("https://github.com/o/bakery")
    assert rewrite is not None
    reproduce._revision_git("clone", "-q", "--no-checkout", "--", "https://github.com/o/bakery", str(clone),
                            writes=tmp_path, config={f"url.{rewrite[0]}.insteadOf": rewrite[1]})
    kept = subprocess.run(["git", "config", "--file", str(clone / ".git" / "config"), "remote.origin.url"],
                          capture_output=True, text=True).stdout.strip()
    assert kept == "https://github.com/o/bakery"


def test_the_mirror_rule_reaches_the_revisions_git_by_its_environment_never_its_command_line(tmp_path, monkeypatch):
    """Third attacker review of issue 50 item 1: the mirror's address (https://x-access-token:TOKEN@...)
    was handed to the revision's git as `-c url.<base>.insteadOf=...`, which any local user reads in
    /proc/PID/cmdline while the clone runs; the environment is this user's alone. The rebuild still
    clones from the mirror. (The commands git itself runs: the next test.)"""
    from bakery.release.reproduce import rebuild

    mirror = tmp_path / "mirror-TOKEN-1234"
    mirror.mkdir()
    (mirror / "README").write_text("a revision without hip/\n")
    git = ["git", "-C", str(mirror), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "r"]):
        subprocess.run([*git, *args], check=True)
    revision = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f'[url "file://{mirror}"]\n\tinsteadOf = https://github.com/o/bakery\n')
    monkeypatch.setenv("HOME", str(home))
    argv: list[list[str]] = []
    run = subprocess.run

    def seen(args, *rest, **kw):
        argv.append([str(a) for a in args])
        return run(args, *rest, **kw)

    monkeypatch.setattr(reproduce.subprocess, "run", seen)
    work = tmp_path / "work"
    plan = Plan("https://github.com/o/bakery", revision, False, "127.0.0.1:1/b@sha256:" + "0" * 64, 1, None)
    with pytest.raises(IntegrityError, match="hip/ is not a folder"), claimed(work):  # read as far as hip/
        rebuild(plan, work, None, log=lambda m: None)
    assert (work / "source" / "README").exists()  # cloned from the mirror
    assert any("clone" in args for args in argv)
    assert not [args for args in argv if any("TOKEN" in a for a in args)], argv


def test_a_mirror_token_reaches_no_command_line_git_runs(tmp_path):
    """Fourth attacker review: handed in the environment, the rewritten address still reached the
    command line of git's remote helper (`git remote-https origin https://user:TOKEN@mirror/...`) for
    the whole fetch. The user and password go into an Authorization header instead; git's own trace
    of every command it runs shows no token (the mirror is unreachable here: the trace is the point)."""
    from bakery.release import reproduce

    config = reproduce.mirror_config("https://x-access-token:S3CRET@127.0.0.1:1/mirror/", "https://github.com/")
    assert config == {"url.https://127.0.0.1:1/mirror/.insteadOf": "https://github.com/",
                      "http.https://127.0.0.1:1/mirror/.extraHeader":
                          "Authorization: Basic eC1hY2Nlc3MtdG9rZW46UzNDUkVU",  # base64 of x-access-token:S3CRET
                      # git would copy the header to the host a redirect names (fifth attacker review)
                      "http.https://127.0.0.1:1/mirror/.followRedirects": "false"}
    assert reproduce.mirror_config("file:///srv/mirror/", "https://github.com/") == {
        "url.file:///srv/mirror/.insteadOf": "https://github.com/"}

    def traced(given: dict[str, str], where: str) -> str:
        env = {**reproduce.git_env(given), "GIT_TRACE": "1"}
        return subprocess.run(["git", *reproduce.GIT_OPTIONS, "clone", "-q", "--", "https://github.com/o/bakery",
                               str(tmp_path / where)], capture_output=True, text=True, env=env, timeout=60).stderr

    said = traced(config, "clone")
    ran = [line for line in said.splitlines() if "run_command:" in line]
    assert any("remote-https" in line and "https://127.0.0.1:1/mirror/o/bakery" in line for line in ran), said
    assert "S3CRET" not in said and "eC1hY2Nlc3MtdG9rZW46UzNDUkVU" not in said
    # the control: the rule as it was (the token in the address) is on the helper's command line
    as_it_was = {"url.https://x-access-token:S3CRET@127.0.0.1:1/mirror/.insteadOf": "https://github.com/"}
    assert "remote-https origin https://x-access-token:S3CRET@" in traced(as_it_was, "clone2")
