"""The rebuild's boundary from the attacker's side (issue 28): a signed revision whose build code is
hostile. `invoke reproduce` runs that code; before the sandbox it ran as this user with a filtered
environment, and read the rebuilder's password and key from /proc/<parent>/environ, the Docker
login, the Docker socket. Here the same revision runs as a plain child (the control: it finds
them) and as reproduce runs it (it finds nothing, and the broker grants only the base and the one
toolchain)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bakery.errors import EnvironmentProblem
from bakery.oci.refs import Reference
from bakery.release import reproduce

SECRETS = {"BAKERY_KEY_PASSWORD": "rebuilder-password", "BAKERY_REBUILDER_SIGNING_KEY": "-----BEGIN ENCRYPTED"}

# the revision's tasks.py: `invoke build` looks for everything a rebuilder holds, says what it
# found on its last line, and fails (so the finding comes back in reproduce's error)
HOSTILE_TASKS = '''
import glob, json, os, socket
from invoke import task


def _broker(method, path, body=None):
    import http.client
    conn = http.client.HTTPConnection("localhost")
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(os.environ["BAKERY_BROKER_SOCKET"])
    conn.request(method, path, body=body, headers={{"Host": "127.0.0.1:5000"}})
    return conn.getresponse().status


@task(optional=["base", "layout", "out", "toolchain"])
def build(c, base=None, layout=None, out=None, toolchain=None, recompile=False):
    found = []
    for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        try:
            text = open(path, "rb").read().decode(errors="replace")
        except OSError:
            continue
        for secret in {secrets!r}.values():
            if secret in text:
                found.append("secret in " + path)
        if "{keyfile}" in text:
            found.append("key file named in " + path)
    for path in ({docker_config!r}, {keyfile!r}, "/root/.docker/config.json"):
        try:
            open(path).read()
            found.append("read " + path)
        except OSError:
            pass
    for sock in ("/var/run/docker.sock", "/run/docker.sock"):
        try:
            s = socket.socket(socket.AF_UNIX)
            s.connect(sock)
            found.append("connected to " + sock)
        except OSError:
            pass
    try:
        socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
        found.append("reached the registry")
    except OSError:
        pass
    if "BAKERY_BROKER_SOCKET" in os.environ:
        other = "/v2/other/repo/blobs/sha256:" + "0" * 64
        if _broker("GET", other) != 403:
            found.append("the broker served another repository")
        if _broker("GET", "/v2/{repo}/tags/list") != 403:
            found.append("the broker listed tags")
        body = json.dumps({{"toolchain": "debian:12", "shell": "cat /etc/shadow > /out/x"}}).encode()
        if _broker("POST", "/bakery/compile", body) != 403:
            found.append("the broker compiled in another toolchain")
    raise SystemExit("found: " + ("; ".join(found) or "nothing"))
'''


@pytest.fixture
def hostile(tmp_path, registry, fixture_base, monkeypatch):
    home, repo = tmp_path / "home", tmp_path / "revision"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_text('{"auths": {"ghcr.io": {"auth": "YWxpY2U6czNjcmV0"}}}')
    keyfile = tmp_path / "keys" / "rebuilder.key"
    keyfile.parent.mkdir()
    keyfile.write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\n")
    (repo / "hip").mkdir(parents=True)
    (repo / "hip" / "extensions.yaml").write_text("arch: gfx942\nextensions: []\n")
    (repo / "tasks.py").write_text(HOSTILE_TASKS.format(
        secrets=SECRETS, keyfile=str(keyfile), docker_config=str(home / ".docker" / "config.json"),
        port=registry.rsplit(":", 1)[1], repo=Reference.parse(str(fixture_base)).repository))
    ident = {"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@example.com", "GIT_COMMITTER_NAME": "x",
             "GIT_COMMITTER_EMAIL": "x@example.com"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "a signed bad revision"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, env={**os.environ, **ident})
    revision = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    monkeypatch.setenv("HOME", str(home))
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    plan = reproduce.Plan(str(repo), revision, False, str(fixture_base), 1700000000, str(fixture_base.digest))
    return plan, keyfile


def key_holder(keyfile: Path) -> subprocess.Popen:
    """A process as `invoke reproduce --attest --key FILE` is, with the password in its environment
    (a variable set after start never shows in /proc/PID/environ, so it is this process's own)."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--key", str(keyfile)],
                            env={**os.environ, **SECRETS})


@pytest.mark.slow  # seconds: `invoke test --fast` skips it
def test_run_as_a_child_the_hostile_revision_takes_the_rebuilders_secrets(hostile, tmp_path):
    """The control, as reproduce ran it before: a child with a filtered environment, the key file
    named on the parent's command line (here: this process's environment and a child of ours
    whose command line names it)."""
    plan, keyfile = hostile
    source = tmp_path / "control"
    subprocess.run(["git", "clone", "-q", plan.repository, str(source)], check=True)
    holder = key_holder(keyfile)
    try:
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
        done = subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(source), "build"], cwd=source,
                              env=env, capture_output=True, text=True)
    finally:
        holder.kill()
    said = done.stderr.strip().splitlines()[-1]
    for what in ("secret in /proc/", "key file named in /proc/", "read " + str(keyfile), ".docker/config.json",
                 "connected to /var/run/docker.sock", "reached the registry"):
        assert what in said, said


@pytest.mark.slow
def test_in_the_rebuild_sandbox_the_hostile_revision_finds_nothing(hostile, tmp_path):
    plan, keyfile = hostile
    holder = key_holder(keyfile)
    try:
        with pytest.raises(EnvironmentProblem) as failed:
            reproduce.rebuild(plan, tmp_path / "work", None, log=lambda m: None)
    finally:
        holder.kill()
    assert str(failed.value).endswith("found: nothing"), failed.value


@pytest.mark.slow
def test_a_revision_whose_hip_is_a_link_is_not_compiled(hostile, tmp_path):
    """A bind mount goes where a link points: hip -> /root would hand that host folder to the compile."""
    plan, _ = hostile
    repo = Path(plan.repository)
    subprocess.run(["git", "-C", str(repo), "rm", "-rq", "hip"], check=True)
    (repo / "hip").symlink_to("/root")
    env = {**os.environ, "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@example.com", "GIT_COMMITTER_NAME": "x",
           "GIT_COMMITTER_EMAIL": "x@example.com"}
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "commit", "-qm", "hip is a link"], check=True, env=env)
    revision = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    from dataclasses import replace

    from bakery.errors import IntegrityError

    with pytest.raises(IntegrityError, match="hip/ is not a folder of the checkout"):
        reproduce.rebuild(replace(plan, revision=revision), tmp_path / "work", None, log=lambda m: None)


@pytest.mark.slow
def test_what_the_sandboxed_code_made_setuid_is_disarmed(tmp_path):
    """Run by root, the code inside is root to the kernel: a file it marks setuid in its work
    folder would be a setuid-root binary left on the host."""
    import stat

    made = tmp_path / "build" / "out" / "shell"
    made.parent.mkdir(parents=True)
    made.write_bytes(b"#!/bin/sh\n")
    made.chmod(0o6755)
    assert made.stat().st_mode & stat.S_ISUID  # the control
    reproduce.disarm(tmp_path / "build")
    assert stat.S_IMODE(made.stat().st_mode) == 0o755


@pytest.mark.parametrize("plant", ["link to a host file", "FIFO", "linked blobs folder", "the layout itself a link"])
def test_a_rebuilt_layout_with_anything_but_files_and_folders_is_refused(plant, tmp_path):
    """The revision's code writes the layout; the parent then reads it. A link would have the
    parent read (and list, and sign the paths of) a host file or store; a FIFO would block it."""
    from bakery.errors import IntegrityError

    layout = tmp_path / "layout"
    (layout / "blobs" / "sha256").mkdir(parents=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    reproduce.plain_tree(layout)  # the control: files and folders pass
    if plant == "link to a host file":
        (layout / "index.json").symlink_to("/etc/passwd")
    elif plant == "FIFO":
        os.mkfifo(layout / "index.json")
    elif plant == "linked blobs folder":
        shutil.rmtree(layout / "blobs")
        (layout / "blobs").symlink_to(tmp_path)
    else:
        elsewhere = tmp_path / "a-host-layout"
        layout.rename(elsewhere)
        layout.symlink_to(elsewhere)
    with pytest.raises(IntegrityError, match="not a folder or a regular file"):
        reproduce.plain_tree(layout)


BROKER_CLIENT = '''
import json, os, socket, sys, threading, time
from invoke import task


def compile_outside(shell):
    import http.client
    conn = http.client.HTTPConnection("localhost", timeout=900)
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(os.environ["BAKERY_BROKER_SOCKET"])
    body = json.dumps({{"toolchain": {toolchain!r}, "shell": shell}}).encode()
    conn.request("POST", "/bakery/compile", body=body, headers={{"Content-Length": str(len(body))}})
    return conn.getresponse().status


@task(optional=["base", "layout", "out", "toolchain"])
def build(c, base=None, layout=None, out=None, toolchain=None, recompile=False):
{body}
'''
MANY_COMPILES = '''    raise SystemExit("statuses: " + " ".join(str(compile_outside("true")) for _ in range(5)))'''
LEFT_RUNNING = '''    for _ in range(2):  # one running, one queued behind it
        threading.Thread(target=compile_outside, args=("sleep 600",), daemon=True).start()
    time.sleep(30)  # the first compile is up (its toolchain's files taken out first)
    os._exit(3)'''


def revision_with(tmp_path, plan, body: str):
    """The hostile revision, its build replaced by `body`, committed."""
    from dataclasses import replace

    repo = Path(plan.repository)
    (repo / "tasks.py").write_text(BROKER_CLIENT.format(toolchain=reproduce.toolchain_ref(plan), body=body))
    env = {**os.environ, "GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@example.com", "GIT_COMMITTER_NAME": "x",
           "GIT_COMMITTER_EMAIL": "x@example.com"}
    subprocess.run(["git", "-C", str(repo), "commit", "-qam", "a broker client"], check=True, env=env)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    return replace(plan, revision=head)


@pytest.mark.slow
def test_the_broker_grants_a_few_compiles_and_no_more(hostile, tmp_path):
    plan = revision_with(tmp_path, hostile[0], MANY_COMPILES)
    with pytest.raises(EnvironmentProblem) as failed:
        reproduce.rebuild(plan, tmp_path / "work", None, log=lambda m: None)
    assert str(failed.value).endswith("statuses: 200 200 200 200 429"), failed.value


def sleepers() -> set[int]:
    """Processes running `sleep 600` (what the revision's compiles run), wherever they are."""
    found = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sleep", b"600"]:
                found.add(int(pid))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_a_compile_the_revision_leaves_running_ends_with_the_rebuild(hostile, tmp_path, monkeypatch):
    """The revision starts a compile that never ends and exits; once reproduce is done, no
    process of that compile is left (the broker stops what it started) and the queued one never starts."""
    import signal
    import time

    from bakery.inputs import hip_compile

    plan = revision_with(tmp_path, hostile[0], LEFT_RUNNING)

    original = hip_compile.run_compile
    before = sleepers()
    with monkeypatch.context() as m:  # the control: a compile the broker does not stop outlives the rebuild
        m.setattr(hip_compile, "run_compile", lambda files, src, shell, out, stop=None: original(files, src, shell, out))
        with pytest.raises(EnvironmentProblem, match="exit 3"):
            reproduce.rebuild(plan, tmp_path / "control", None, log=lambda m: None)
        time.sleep(2)
        leaked = sleepers() - before
    assert leaked, "the control left no compile running: the revision did not start one"
    for pid in leaked:
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(EnvironmentProblem, match="exit 3"):
        reproduce.rebuild(plan, tmp_path / "work", None, log=lambda m: None)
    time.sleep(5)  # the queued compile gets the lock once the first is stopped: it must start nothing
    assert sleepers() <= before


def test_the_broker_answers_in_a_work_folder_past_af_unix_path_limit(tmp_path, monkeypatch):
    """A long TMPDIR or --workdir puts the broker's socket past AF_UNIX's 107 bytes: before, the
    rebuild stopped on "AF_UNIX path too long" (found by test_disk_full's rebuild on a small disk)."""
    from bakery import broker_client
    from bakery.release import broker

    folder = tmp_path / ("w" * 60) / ("x" * 60)
    folder.mkdir(parents=True)
    grant = broker.Grant("127.0.0.1:5000", "base", None, tmp_path)
    with broker.serve(folder, grant) as path:
        assert len(os.fsencode(path)) > 107 and path.exists()
        monkeypatch.setenv(broker_client.SOCKET_ENV, str(path))
        with pytest.raises(EnvironmentProblem, match="refused GET /nothing"):  # an answer: it was reached
            broker_client.ask("GET", "/nothing")
