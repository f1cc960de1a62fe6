"""The proofs' sandbox, from the attacker's side: a proof (the base's code runs inside it) that
looks for every secret a build job holds. Run plainly, the same script finds them all (the
control); run the way bakery runs proofs, it finds nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from bakery import sandbox
from bakery.errors import EnvironmentProblem
from bakery.inputs import proof_spec
from bakery.proofs import runner as prove
from support import ROOT

SECRETS = {"GITHUB_TOKEN": "ghs_secret", "BAKERY_REGISTRY_PASSWORD": "hunter2", "BAKERY_KEY_PASSWORD": "pw",
           "BAKERY_SIGNING_KEY": "-----BEGIN ENCRYPTED PRIVATE KEY-----", "SAMPLES": "3"}

HOSTILE = '''
import json, os, socket, sys
found = []
for path in {paths!r}:
    try:
        open(path).read()
        found.append("read " + path)
    except OSError:
        pass
for name in {names!r}:
    if name in os.environ:
        found.append("env " + name)
import glob
for path in glob.glob("/proc/[0-9]*/environ"):  # what another process of the sandbox was started with
    try:
        text = open(path, "rb").read().decode(errors="replace")
    except OSError:
        continue
    if any(value in text for value in {values!r}):
        found.append("secret in " + path)
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=3).close()
    found.append("connected to the registry")
except OSError:
    pass
for path in {writable!r}:
    try:
        open(path, "a").close()
        found.append("wrote " + path)
    except OSError:
        pass
print(json.dumps({{"verdict": "BROKEN" if found else "FIXED", "reason": "; ".join(found) or "found nothing",
                  "target": 0}}))
'''


@pytest.fixture
def hostile(tmp_path, registry, monkeypatch):
    """A project whose proof is hostile, a HOME with a registry login, key files, tokens in the environment."""
    home, project = tmp_path / "home", tmp_path / "project"
    (home / ".docker").mkdir(parents=True)
    (home / ".docker" / "config.json").write_text('{"auths": {"ghcr.io": {"auth": "YWxpY2U6czNjcmV0"}}}')
    (project / "keys").mkdir(parents=True)
    (project / "keys" / "release.key").write_text("-----BEGIN ENCRYPTED PRIVATE KEY-----\n")
    proofs = project / "overlays" / "proofs"
    proofs.mkdir(parents=True)
    shutil.copy(ROOT / "overlays" / "proofs" / "_proof.py", proofs)
    venv_file = Path(sys.prefix) / "pyvenv.cfg"
    (proofs / "hostile.py").write_text(HOSTILE.format(
        paths=[str(home / ".docker" / "config.json"), str(project / "keys" / "release.key"),
               "/root/.docker/config.json", str(ROOT / "README.md")],
        names=sorted(SECRETS), values=sorted(v for k, v in SECRETS.items() if k != 'SAMPLES'), port=registry.rsplit(":", 1)[1],
        writable=[str(venv_file), str(proofs / "planted.py")]))
    # (inside, a folder under /tmp, as this test's project is, lands on the sandbox's own /tmp: a
    # write there reaches nothing of the host, which is what the test checks for planted.py)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return proof_spec.ProofSpec(proofs / "hostile.py")


@pytest.mark.slow  # seconds: `invoke test --fast` skips it
def test_run_plainly_the_hostile_proof_finds_every_secret(hostile):
    """The control: without the sandbox, each thing the proof looks for is there to take."""
    done = subprocess.run([sys.executable, str(hostile.script), "/dev/null"], capture_output=True, text=True,
                          env=os.environ)
    reason = json.loads(done.stdout)["reason"]
    for what in ("read " + str(Path(os.environ["HOME"]) / ".docker" / "config.json"), "keys/release.key",
                 "env GITHUB_TOKEN", "env BAKERY_SIGNING_KEY", "env SAMPLES", "connected to the registry",
                 "wrote " + str(hostile.script.parent / "planted.py")):
        assert what in reason, reason


@pytest.mark.slow
def test_in_the_sandbox_the_hostile_proof_finds_nothing(hostile):
    verdict = prove.run(hostile, b"print('the base code')\n", {})
    found = [f for f in verdict.reason.split("; ") if not f.endswith("/planted.py")]
    assert verdict.reason == "found nothing" or not found, verdict.reason
    assert not (hostile.script.parent / "planted.py").exists()  # nothing written reached the host


@pytest.mark.slow
def test_real_proofs_run_in_the_sandbox(tmp_path, monkeypatch):
    """The sandbox still holds what a proof needs: torch, the proof's folder, hip/, its inputs."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    from bakery.inputs import overlays

    lock = json.loads((ROOT / "overlays" / "overlays.lock").read_text())
    stock = {e["id"]: ROOT / "overlays" / "stock" / e["base_sha256"] for e in lock["overlays"] if e["base_sha256"]}
    swiglu = next(o for o in overlays.load(ROOT / "overlays" / "overlays.yaml") if o.id == "exact-swiglu-clamp-kernel")
    assert swiglu.proof is not None
    verdict = prove.run(swiglu.proof, stock[swiglu.id].read_bytes(), {})
    assert verdict.verdict == prove.BROKEN, verdict.reason  # it imports hip/bakery_kernels and torch inside


@pytest.mark.slow
def test_without_bubblewrap_proofs_do_not_run(hostile, monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP", "bwrap-not-installed")
    with pytest.raises(EnvironmentProblem, match="apt-get install bubblewrap"):
        prove.run(hostile, b"", {})


@pytest.mark.slow
def test_a_sandbox_that_cannot_start_is_the_machines_problem_not_a_verdict(hostile, tmp_path, monkeypatch):
    """Where user namespaces are refused (Ubuntu 24.04's AppArmor default, not this machine), bwrap
    fails before running anything: a stand-in bwrap that fails the same way gives one clear line."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\n[ \"$1\" = --version ] && { echo 'bubblewrap 0.8.0'; exit 0; }\n"
                    "echo 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "BWRAP", str(fake))
    with pytest.raises(EnvironmentProblem, match=r"sandbox cannot start here \(bwrap: setting up uid map"):
        prove.run(hostile, b"", {})


@pytest.mark.slow
def test_a_bubblewrap_too_old_for_the_sandbox_says_so(hostile, tmp_path, monkeypatch):
    """Ubuntu 22.04's bubblewrap 0.6 has no --disable-userns (a stand-in answers as it would)."""
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bubblewrap 0.6.1'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sandbox, "BWRAP", str(fake))
    with pytest.raises(EnvironmentProblem, match="bubblewrap 0.6.1 is too old"):
        prove.run(hostile, b"", {})


@pytest.mark.parametrize("body, reason", [
    # a flood: the write past 64 MiB fails (Python ignores SIGXFSZ: EFBIG); none of it is held in memory
    ("import sys\nchunk = b'x' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(chunk)\n",
     "the proof failed (exit 1): OSError: [Errno 27] File too large"),
    # bytes that are not UTF-8, then a crash
    ("import sys\nsys.stdout.buffer.write(b'\\xff\\xfe')\nsys.stderr.buffer.write(b'\\xff oops\\n')\nsys.exit(3)\n",
     "the proof failed (exit 3): \ufffd oops"),
    # the code inside pretends to be bwrap failing: still a verdict on the code, never a machine problem
    ("import sys\nprint('bwrap: setting up uid map: Permission denied', file=sys.stderr)\nsys.exit(1)\n",
     "the proof failed (exit 1): bwrap: setting up uid map"),
])
@pytest.mark.slow
def test_whatever_the_code_inside_prints_is_a_verdict(body, reason, tmp_path, monkeypatch):
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    proofs = tmp_path / "project" / "overlays" / "proofs"
    proofs.mkdir(parents=True)
    shutil.copy(ROOT / "overlays" / "proofs" / "_proof.py", proofs)
    (proofs / "loud.py").write_text(body)
    verdict = prove.run(proof_spec.ProofSpec(proofs / "loud.py"), b"", {})
    assert verdict.verdict == prove.CANNOT and verdict.reason.startswith(reason), verdict.reason


FORGER = '''
import os, time
import _proof


def sibling(proof: int, me: int) -> int:
    for _ in range(200):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == proof and int(pid) != me:
                return int(pid)
        time.sleep(0.01)
    raise SystemExit("no sibling")


def forge(proof: int, me: int) -> None:
    """In a grandchild: hold the other target's data pipe, and write its data once it has exited."""
    os.close(1)
    try:
        other = sibling(proof, me)
        fds = [os.open(f"/proc/{other}/fd/{n}", os.O_WRONLY) for n in os.listdir(f"/proc/{other}/fd") if int(n) > 2]
    except OSError:
        os._exit(0)  # refused: what the sandbox must do
    while os.path.exists(f"/proc/{other}") and open(f"/proc/{other}/stat").read().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)
    for fd in fds:
        os.write(fd, b"D" + _proof._pack({"said": "forged by the stock target", "fixed": True}))
    os._exit(0)


def observe(args):
    if open(args[0]).read().startswith("# stock"):
        proof, me = os.getppid(), os.getpid()
        if os.fork() == 0:
            forge(proof, me)
        return {"said": "genuine: stock", "fixed": False}
    time.sleep(1.0)
    return {"said": "genuine: overlaid", "fixed": False}


def judge(observed, args):
    return _proof.report(bool(observed["fixed"]), str(observed["said"]))


if __name__ == "__main__":
    _proof.main(observe, judge)
'''


@pytest.mark.slow
def test_one_targets_code_cannot_write_the_others_verdict(tmp_path, monkeypatch):
    """Stock and overlaid run as two children of one proof process. The stock target's code opens
    its sibling's data pipe through /proc and writes a FIXED run's data there after the sibling exits: the children
    are not dumpable, so the pipe cannot be opened and the overlaid verdict stays its own."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    proofs = tmp_path / "project" / "overlays" / "proofs"
    proofs.mkdir(parents=True)
    shutil.copy(ROOT / "overlays" / "proofs" / "_proof.py", proofs)
    (proofs / "forger.py").write_text(FORGER)
    stock, overlaid = prove.run_batch(proof_spec.ProofSpec(proofs / "forger.py"), [b"# stock\n", b"# overlaid\n"], {})
    assert (stock.verdict, stock.reason) == (prove.BROKEN, "genuine: stock")
    assert (overlaid.verdict, overlaid.reason) == (prove.BROKEN, "genuine: overlaid")


def test_a_sandbox_whose_setup_fails_is_the_machines_problem(tmp_path):
    """bwrap fails after it made the child (here a bind whose source is gone): no exit code on the
    status pipe, so it is not the code's failure (the stand-in above fails before the child)."""
    tmp_path.chmod(0o755)  # the inputs, readable by the sandbox's uid (as prove makes them)
    with pytest.raises(EnvironmentProblem, match="Can't find source path"):
        sandbox.run([sys.executable, "-c", "pass"], [tmp_path / "not-there.py"], tmp_path, 60)


# -- the seccomp filter and the limits, each hit by hostile code ---------------------------------

PROBE_CALLS = '''
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
said = {}
for name, nr, args in %s:
    ctypes.set_errno(0)
    got = libc.syscall(nr, *args)
    said[name] = "EPERM" if got == -1 and ctypes.get_errno() == errno.EPERM else f"{got} errno {ctypes.get_errno()}"
print(json.dumps(said))
'''
# (name, number, arguments): each harmless where it is allowed (getpid, an unshare of nothing)
CALLS = [("ptrace", 101, (0, 0, 0, 0)), ("mount", 165, (0, 0, 0, 0, 0)), ("keyctl", 250, (0, 0, 0, 0, 0)),
         ("bpf", 321, (0, 0, 0)), ("unshare", 272, (0,)), ("process_vm_readv", 310, (1, 0, 0, 0, 0, 0)),
         ("perf_event_open", 298, (0, 0, -1, -1, 0)), ("io_uring_setup", 425, (0, 0)), ("getpid", 39, ())]


def test_the_filter_numbers_are_the_kernels():
    """REFUSED and ALLOWED name each call by the number the kernel's own header gives it
    (linux-libc-dev)."""
    import re

    header = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    if not header.exists():
        pytest.skip("no linux-libc-dev header to check the numbers against")
    kernel = {name: int(nr) for name, nr in re.findall(r"#define __NR_(\w+) (\d+)", header.read_text())}
    known = {name: nr for name, nr in sandbox.REFUSED.items() if name in kernel}  # an older header lacks the newest
    assert {name: kernel[name] for name in known} == known and len(known) >= len(sandbox.REFUSED) - 3
    assert {name: kernel[name] for name in sandbox.ALLOWED} == sandbox.ALLOWED
    assert all(kernel[name] == nr for name, nr, _ in UNLISTED)
    assert all(kernel[name] == nr for name, nr, _ in CALLS)
    assert (kernel["socket"], kernel["socketpair"]) == (sandbox.SOCKET, sandbox.SOCKETPAIR)


def test_the_filter_refuses_what_no_proof_or_build_needs():
    """Outside, the calls reach the kernel (whatever it answers); inside, each refused one is EPERM
    before the kernel looks at it, and getpid still works."""
    code = PROBE_CALLS % (CALLS,)
    plain = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    assert plain["unshare"] == "0 errno 0" and plain["ptrace"] != "EPERM", plain  # the control
    inside = json.loads(sandbox.run([sys.executable, "-c", code], [], None, 60).stdout)
    assert {n for n, said in inside.items() if said == "EPERM"} == {n for n, _, _ in CALLS} - {"getpid"}, inside
    assert inside["getpid"].startswith("2 ") or inside["getpid"].split()[0].isdigit(), inside


# calls the filter passed while it was a deny list, none of which a proof, compile or rebuild makes;
# each harmless where it is allowed (a query, a call of nothing, or a refusal of its arguments)
UNLISTED = [("modify_ldt", 154, (0, 0, 0)), ("uselib", 134, (0,)), ("personality", 135, (0xFFFFFFFF,)),
            ("move_pages", 279, (0, 0, 0, 0, 0, 0)), ("migrate_pages", 256, (0, 0, 0, 0)),
            ("process_madvise", 440, (-1, 0, 0, 0, 0)), ("io_setup", 206, (0, 0)), ("io_destroy", 207, (0,)),
            ("io_getevents", 208, (0, 0, 0, 0, 0)), ("io_submit", 209, (0, 0, 0)), ("io_cancel", 210, (0, 0, 0)),
            ("io_pgetevents", 333, (0, 0, 0, 0, 0, 0)), ("getpid", 39, ())]
ANSWERS = PROBE_CALLS.replace('"EPERM" if got == -1 and ctypes.get_errno() == errno.EPERM', '"ENOSYS" if got == -1 and ctypes.get_errno() == errno.ENOSYS')


def test_what_the_allow_list_leaves_out_is_as_if_the_kernel_had_no_such_call():
    """Outside, each call reaches the kernel (which may refuse its arguments, or lack it: those are
    not counted); inside, each but getpid is ENOSYS, whatever the kernel has."""
    code = ANSWERS % (UNLISTED,)
    plain = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)
    inside = json.loads(sandbox.run([sys.executable, "-c", code], [], None, 60).stdout)
    assert {n for n, said in inside.items() if said == "ENOSYS"} == {n for n, _, _ in UNLISTED} - {"getpid"}, inside
    reached = {n for n, said in plain.items() if said != "ENOSYS"}
    assert reached >= {"personality", "modify_ldt", "io_setup", "getpid"}, plain  # the control
    assert inside["getpid"].split()[0].isdigit(), inside


@pytest.mark.parametrize("name, code, limits, expect", [
    ("processes", "import os, time\nfor _ in range(200):\n    if os.fork() == 0:\n        time.sleep(5)\n"
                  "        os._exit(0)\n", sandbox.Limits(seconds=60, processes=32), "Resource temporarily unavailable"),
    ("memory", "x = bytearray(3 << 30)\n", sandbox.Limits(seconds=60, memory=2 << 30), "MemoryError"),
    ("file size", "open('/tmp/big', 'wb').write(b'x' * (3 << 20))\n", sandbox.Limits(seconds=60, files=1 << 20),
     "File too large"),
])
@pytest.mark.slow
def test_each_limit_stops_hostile_code_with_an_error(name, code, limits, expect):
    """The control runs the same code with room to spare and it ends well; under the limit it fails
    with the kernel's error, which the caller sees as the code's failure."""
    roomy = sandbox.Limits(seconds=60, processes=4096, memory=8 << 30, files=64 << 20)
    assert sandbox.run([sys.executable, "-c", code], [], None, roomy).returncode == 0, name
    done = sandbox.run([sys.executable, "-c", code], [], None, limits)
    assert done.returncode != 0 and expect in done.stderr, (name, done.stderr[-500:])


FORKS = ("import os, time\nfor _ in range(120):\n    if os.fork() == 0:\n        time.sleep(2)\n"
         "        os._exit(0)\n")
ROOMY = sandbox.Limits(seconds=60, processes=4096)


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/sys/fs/cgroup/pids/tasks").exists() or
                    sandbox._own_pids_group() is None, reason="as root, on cgroup v1's pids hierarchy (on v2 a "
                    "group holding processes hands down no controller, so the held caller would take the "
                    "RLIMIT_NPROC path, which is the next test's)")
def test_as_root_the_sandbox_counts_against_its_callers_own_task_limit(tmp_path):
    """A caller held to 40 tasks (a CI job's cgroup, say) cannot run code that starts 120 through
    the sandbox: its pids group is made below the caller's, not at the hierarchy's root."""
    own = sandbox._own_pids_group()
    assert own is not None  # else skipped above
    held = own / f"bakery-test-{os.urandom(4).hex()}"
    held.mkdir()
    try:
        (held / "pids.max").write_text("40")
        script = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bakery import sandbox; "
                  f"done = sandbox.run([sys.executable, '-c', {FORKS!r}], [], None, "
                  f"sandbox.Limits(seconds=60, processes=4096)); print(done.returncode); print(done.stderr[-400:])")
        inside = subprocess.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(held), sys.executable,
                                 "-c", script], capture_output=True, text=True, timeout=120)
        assert inside.stdout.split()[0] != "0" and "Resource temporarily unavailable" in inside.stdout, inside
    finally:
        for _ in range(50):
            try:
                held.rmdir()
                break
            except OSError:
                import time
                time.sleep(0.1)
    assert sandbox.run([sys.executable, "-c", FORKS], [], None, ROOMY).returncode == 0  # the control, unheld


@pytest.mark.skipif(os.geteuid() != 0, reason="as root")
def test_as_root_without_a_pids_cgroup_the_code_uids_tasks_are_capped(monkeypatch):
    """A root whose cgroup tree is read-only (a container's) still caps the code's processes: the
    code is uid 65534, whose tasks RLIMIT_NPROC counts."""
    monkeypatch.setattr(sandbox, "_own_pids_group", lambda: None)
    assert sandbox.run([sys.executable, "-c", FORKS], [], None, ROOMY).returncode == 0  # the control
    done = sandbox.run([sys.executable, "-c", FORKS], [], None, sandbox.Limits(seconds=60, processes=32))
    assert done.returncode != 0 and "Resource temporarily unavailable" in done.stderr, done.stderr[-500:]


# /proc/self/mountinfo lines: this machine's hybrid layout (v1's pids hierarchy beside an empty v2
# tree), a GitHub hosted runner's (Ubuntu 24.04: v2 alone), and a container's (its group is the mount's root)
V1_MOUNTS = ("32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
             "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")
V2_MOUNTS = "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
CONTAINER_MOUNTS = "700 690 0:30 /docker/c0ffee /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n"


@pytest.mark.parametrize("groups, mounts, found", [
    ("8:pids:/\n4:memory:/job\n0::/\n", V1_MOUNTS, (Path("/sys/fs/cgroup/pids"), False)),
    ("8:pids:/ci/job-7\n0::/\n", V1_MOUNTS, (Path("/sys/fs/cgroup/pids/ci/job-7"), False)),
    ("0::/system.slice/hosted-compute-agent.service\n", V2_MOUNTS,
     (Path("/sys/fs/cgroup/system.slice/hosted-compute-agent.service"), True)),
    ("0::/docker/c0ffee/build\n", CONTAINER_MOUNTS, (Path("/sys/fs/cgroup/build"), True)),
    ("0::/docker/other\n", CONTAINER_MOUNTS, None),  # outside what the mount shows
    ("0::/docker/c0ffee/../other\n", CONTAINER_MOUNTS, None),
    ("8:pids:/\n", V2_MOUNTS, None),  # a v1 pids group no mount shows: not v2's tree instead
    ("0::/\n", "", None),
])
def test_the_pids_group_is_found_where_the_mount_table_shows_it(groups, mounts, found):
    """Pure: v1's pids hierarchy where there is one (this machine), else v2's unified tree (a hosted
    runner's), read from /proc/self/cgroup and mountinfo as the kernel writes them."""
    assert sandbox.pids_group_path(groups, mounts) == found


def test_on_cgroup_v2_a_group_that_does_not_hand_down_pids_is_none_of_ours(tmp_path):
    """v2 lets a group hand the pids controller down only where it holds no process (a runner's
    service group holds the runner): then the sandbox takes the RLIMIT_NPROC path. This machine has
    v1's pids hierarchy, so the folders here stand in for v2's (the files are what the kernel shows)."""
    held, free = tmp_path / "runner.service", tmp_path / "job.slice"
    held.mkdir()
    free.mkdir()
    (held / "cgroup.subtree_control").write_text("cpu memory\n")
    (free / "cgroup.subtree_control").write_text("cpu memory pids\n")
    assert sandbox._writable_group(held, unified=True) is None
    assert sandbox._writable_group(free, unified=True) == free
    assert sandbox._writable_group(held, unified=False) == held  # v1 has no such file: its groups all count
    assert sandbox._writable_group(tmp_path / "gone", unified=True) is None


@pytest.mark.slow
def test_with_a_gpus_nodes_bound_the_codes_memory_is_still_capped():
    """CUDA starts only under RLIMIT_DATA, not RLIMIT_AS (seen on the lent H200): what the code
    allocates of its own stays capped. /dev/null stands in for a GPU's node (none here)."""
    grab = "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096]); print('took it')"
    roomy = sandbox.run([sys.executable, "-c", grab], [], None, sandbox.Limits(seconds=60, memory=4 << 30),
                        devices=["/dev/null"])
    assert roomy.returncode == 0 and "took it" in roomy.stdout, roomy.stderr[-300:]  # the control
    held = sandbox.run([sys.executable, "-c", grab], [], None, sandbox.Limits(seconds=60, memory=512 << 20),
                       devices=["/dev/null"])
    assert held.returncode != 0 and "MemoryError" in held.stderr, held.stderr[-300:]
    assert "--data=" in " ".join(sandbox._prlimit(sandbox.PROOF, False, gpu=True))


def test_proc_is_read_only_but_for_a_proof_on_a_gpu():
    """CUDA's start fails under a read-only /proc (seen on the lent H200, tests/gpu/LATEST.txt): for a
    proof on a GPU only / and /dev are remounted read-only; otherwise /proc is too."""
    def remounted(devices, init=True):
        args = sandbox.command(["true"], [], None, devices=devices, init=init)
        return {args[i + 1] for i, a in enumerate(args[:args.index("--chdir")]) if a == "--remount-ro"}

    assert remounted([]) == {"/proc", "/dev", "/"}
    assert remounted(["/dev/null"]) == {"/dev", "/"}
    # without init, bwrap's reaper is pid 1, of the code's uid for an ordinary user: /proc stays read-only
    assert remounted(["/dev/null"], init=False) == {"/proc", "/dev", "/"}


@pytest.mark.slow
def test_a_proof_past_its_limits_is_never_a_verdict(tmp_path, monkeypatch):
    """A proof that forks without end gets CANNOT-PROVE (the error), not the FIXED it prints first."""
    monkeypatch.setenv("BAKERY_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(prove, "LIMITS", sandbox.Limits(seconds=60, processes=16))
    proofs = tmp_path / "project" / "overlays" / "proofs"
    proofs.mkdir(parents=True)
    shutil.copy(ROOT / "overlays" / "proofs" / "_proof.py", proofs)
    (proofs / "bomb.py").write_text("import json, os, time\nprint(json.dumps({'target': 0, 'verdict': 'FIXED', "
                                    "'reason': 'forged'}))\nwhile True:\n    os.fork()\n")
    verdict = prove.run(proof_spec.ProofSpec(proofs / "bomb.py"), b"", {})
    assert verdict.verdict == prove.CANNOT, verdict


def sandbox_groups() -> set[Path]:
    return set(Path("/sys/fs/cgroup/pids").glob("bakery-sandbox-*"))


@pytest.mark.slow
def test_code_past_its_time_is_stopped(tmp_path):
    before = sandbox_groups()  # another run's on this machine (or its kernel) are not this test's
    with pytest.raises(subprocess.TimeoutExpired):
        sandbox.run(["sleep", "30"], [], None, sandbox.Limits(seconds=2))
    assert not sandbox_groups() - before  # its cgroup is gone too


A_YEAR_S = 365 * 86400


@pytest.mark.skipif(os.geteuid() != 0 or sandbox._own_pids_group() is None,
                    reason="a run's pids cgroup is made only as root, where this process's group may be written")
@pytest.mark.parametrize("skew", [0, A_YEAR_S, -A_YEAR_S], ids=["true clock", "a year ahead", "a year behind"])
def test_a_killed_runs_cgroup_is_removed_by_the_next_run(skew, monkeypatch):
    """A run SIGKILLed leaves its empty group (its `finally` never runs); the next run removes the ones
    empty for longer than a group is ever empty while in use, and no other: whatever this process's
    clock says (`faketime +365d` moves it, not the kernel's, which stamps a group's mtime)."""
    root = sandbox._own_pids_group()
    assert root is not None  # else skipped above
    abandoned, just_made = (root / f"bakery-sandbox-test{os.urandom(4).hex()}" for _ in range(2))
    abandoned.mkdir()
    just_made.mkdir()  # as a parallel run's own is between its mkdir and its shell joining it
    try:
        past = time.time() - sandbox.ABANDONED_AFTER_S - 60
        os.utime(abandoned, (past, past))
        real_time = time.time
        monkeypatch.setattr(time, "time", lambda: real_time() + skew)  # what faketime does to a process
        assert sandbox.run(["true"], [], None, sandbox.Limits(seconds=30)).returncode == 0
        monkeypatch.undo()
        assert not abandoned.exists()
        assert just_made.is_dir()
    finally:
        for group in (abandoned, just_made):
            if group.exists():
                group.rmdir()


@pytest.mark.parametrize("age, abandoned", [(0, False), (sandbox.ABANDONED_AFTER_S - 1, False),
                                            (sandbox.ABANDONED_AFTER_S + 1, True), (A_YEAR_S, True)])
def test_a_groups_age_is_its_mtime_against_the_kernels_now(age, abandoned):
    now = 1_800_000_000.0  # a group's mtime and the kernel's now, never this process's clock
    assert sandbox.is_abandoned(now - age, now) is abandoned


@pytest.mark.skipif(os.geteuid() != 0 or sandbox._own_pids_group() is None,
                    reason="a run's pids cgroup is made only as root, where this process's group may be written")
@pytest.mark.skipif(shutil.which("faketime") is None, reason="libfaketime's faketime is not installed")
def test_under_a_clock_a_year_ahead_a_sandbox_runs_and_leaves_a_fresh_group_alone(tmp_path):
    """A held-out reproducibility check runs the build under `faketime +365d`: a run then still starts,
    and takes no parallel run's fresh group for abandoned."""
    root = sandbox._own_pids_group()
    assert root is not None  # else skipped above
    just_made = root / f"bakery-sandbox-test{os.urandom(4).hex()}"
    just_made.mkdir()
    try:
        code = ("import os, sys, time; from bakery import sandbox\n"
                "open(sys.argv[1], 'w').close()  # stamped by the kernel's clock\n"
                "assert time.time() > os.stat(sys.argv[1]).st_mtime + 300 * 86400, 'faketime moved no clock'\n"
                "sys.exit(sandbox.run(['true'], [], None, sandbox.Limits(seconds=30)).returncode)\n")
        done = subprocess.run(["faketime", "-f", "+365d", sys.executable, "-c", code, str(tmp_path / "stamp")], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert just_made.is_dir()
    finally:
        if just_made.exists():
            just_made.rmdir()


KERNEL_SETTINGS = ("/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/modprobe")
OPEN_FOR_WRITING = '''
import os, sys
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_WRONLY))  # opened, never written
        print("writable " + path)
    except OSError as e:
        print("refused " + path + " " + (e.strerror or ""))
'''


def test_the_kernels_settings_are_not_writable_from_inside():
    """Run by root, the code inside is uid 0 to the host kernel, which lets uid 0 write /proc/sys
    without a capability (core_pattern names a program the kernel runs as root on the host). The
    control: outside, as root, they open for writing (nothing is written)."""
    if os.geteuid() != 0:
        pytest.skip("only root's uid may write /proc/sys: the control needs root")
    plain = subprocess.run([sys.executable, "-c", OPEN_FOR_WRITING, *KERNEL_SETTINGS], capture_output=True, text=True)
    assert "writable /proc/sys/kernel/core_pattern" in plain.stdout, plain.stdout
    inside = sandbox.run([sys.executable, "-c", OPEN_FOR_WRITING, *KERNEL_SETTINGS], [], None, 60).stdout
    assert "writable" not in inside and inside.count("refused") == len(KERNEL_SETTINGS), inside


SOCKETS = """
import json, socket
said = {}
for name, family, kind in (("unix", 1, socket.SOCK_STREAM), ("inet", 2, socket.SOCK_STREAM),
                           ("vsock", 40, socket.SOCK_STREAM), ("packet", 17, socket.SOCK_RAW),
                           ("inet-sock-packet", 2, 10)):
    try:
        socket.socket(family, kind).close()
        said[name] = "opened"
    except OSError as e:
        said[name] = e.errno
print(json.dumps(said))
"""


def test_only_the_allowed_socket_families_open_inside():
    """AF_VSOCK reaches a VM's host past any network namespace; AF_PACKET sees raw frames, and so
    does AF_INET's SOCK_PACKET (the kernel makes it a packet socket). Outside (the control) vsock
    opens where the kernel has it; inside, all three get EAFNOSUPPORT from the filter."""
    plain = json.loads(subprocess.run([sys.executable, "-c", SOCKETS], capture_output=True, text=True).stdout)
    inside = json.loads(sandbox.run([sys.executable, "-c", SOCKETS], [], None, 60).stdout)
    assert plain["vsock"] == "opened" or plain["vsock"] != sandbox.EAFNOSUPPORT, plain
    assert inside == {"unix": "opened", "inet": "opened", "vsock": sandbox.EAFNOSUPPORT,
                      "packet": sandbox.EAFNOSUPPORT, "inet-sock-packet": sandbox.EAFNOSUPPORT}, inside


def test_a_leaked_inside_variable_does_not_turn_the_sandbox_off(monkeypatch):
    """BAKERY_SANDBOXED=1 in a job's environment (written to $GITHUB_ENV, say) is not being inside:
    the code still runs in the sandbox, without our variables."""
    monkeypatch.setenv(sandbox.INSIDE, "1")
    monkeypatch.setenv("BAKERY_KEY_PASSWORD", "pw")
    done = sandbox.run([sys.executable, "-c", "import os; print(os.getuid(), 'BAKERY_KEY_PASSWORD' in os.environ)"],
                       [], None, 60)
    assert done.stdout.split() == ["65534", "False"], done.stdout + done.stderr


def test_run_by_root_the_code_is_another_uid_on_the_host(tmp_path):
    """As root, no user namespace maps the code to uid 0: it is the host's uid 65534, without a
    capability, and cannot make a namespace of its own (clone's flags refused, clone3 unknown). The
    control: what this process writes is root's."""
    if os.geteuid() != 0:
        pytest.skip("as an ordinary user the code is that user's uid, mapped to 65534 in its own namespace")
    (tmp_path / "ours").write_text("x")
    assert (tmp_path / "ours").stat().st_uid == 0
    code = ("import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\nopen(sys.argv[1] + '/theirs', 'w')\n"
            "print(os.getuid(), open('/proc/self/status').read().split('CapEff:')[1].split()[0])\n"
            "print(libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0), ctypes.get_errno())\n"
            "print(libc.syscall(435, 0, 0), ctypes.get_errno())\n")
    done = sandbox.run([sys.executable, "-c", code, str(tmp_path)], [], None, 60, writable=[tmp_path])
    assert done.stdout.split() == ["65534", "0000000000000000", "-1", "1", "-1", "38"], done.stdout + done.stderr
    assert (tmp_path / "theirs").stat().st_uid == 65534


def test_as_root_a_folder_others_cannot_read_is_one_clear_error(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root's sandbox changes uid")
    private = tmp_path / "private.py"
    private.write_text("print('x')\n")
    private.chmod(0o600)
    with pytest.raises(EnvironmentProblem, match="is not readable by others, and as root the sandbox runs code as uid"):
        sandbox.run([sys.executable, str(private)], [private], None, 60)


PID1_FORGER = '''
import os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _proof

FORGED = b'\\n{"target": 1, "verdict": "FIXED", "reason": "forged through pid 1", "seconds": 0}\\n'


def observe(args):
    if open(args[0]).read().startswith("# stock"):
        try:  # the sandbox's pid 1 holds the proof's stdout: a line written past where the proof's own
            fd = os.open("/proc/1/fd/1", os.O_WRONLY)  # lines will end is read after them
            os.pwrite(fd, FORGED, 4095)
        except OSError:
            pass
        return {"said": "genuine: stock"}
    return {"said": "genuine: overlaid"}


def judge(observed, args):
    return _proof.report(False, str(observed["said"]))


if __name__ == "__main__":
    _proof.main(observe, judge)
'''

AS_USER = '''
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bakery.inputs import proof_spec
from bakery.proofs import runner
proofs = Path(sys.argv[2])
done = runner.run_batch(proof_spec.ProofSpec(proofs / "forger.py"), [b"# stock\\n", b"# overlaid\\n"], {})
print(json.dumps([[v.verdict, v.reason] for v in done]))
'''


@contextmanager
def ordinary_user(prepare=lambda place: None):
    """The hosted runner's path, as CI (root) can take it: a folder in /tmp holding a copy of bakery
    (and what `prepare` adds), owned by uid 1001, and a function that runs a script there as that
    user with the system's python3, the folder's path as its first argument."""
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to become the ordinary user 1001 (as CI runs)")
    if not Path("/usr/bin/python3").exists():
        pytest.skip("needs the system's python3 (the project's venv may sit where uid 1001 cannot reach)")
    place = Path(tempfile.mkdtemp(prefix="bakery-user-", dir="/tmp"))
    try:
        place.chmod(0o755)
        shutil.copytree(ROOT / "bakery", place / "bakery")
        (place / "cache").mkdir()
        prepare(place)
        subprocess.run(["chown", "-R", "1001:1001", str(place)], check=True)

        def run(script: str, *args: str) -> subprocess.CompletedProcess:
            return subprocess.run(["setpriv", "--reuid=1001", "--regid=1001", "--clear-groups", "/usr/bin/python3",
                                   "-c", script, str(place), *args], capture_output=True, text=True, timeout=300,
                                  cwd=place, env={"PATH": "/usr/bin:/bin", "HOME": str(place),
                                                  "BAKERY_CACHE": str(place / "cache")})
        yield place, run
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.mark.slow
def test_as_an_ordinary_user_the_code_cannot_write_the_verdict_through_pid_1():
    """The hosted runner's path: the sandbox run by uid 1001, in a user namespace of its own. The
    stock target's code opens the proof's stdout through the namespace's pid 1 and writes, past where
    the proof's own lines will end, a FIXED line for the overlaid target: it must not be read."""
    def forger(place: Path) -> None:
        proofs = place / "project" / "overlays" / "proofs"
        proofs.mkdir(parents=True)
        shutil.copy(ROOT / "overlays" / "proofs" / "_proof.py", proofs)
        (proofs / "forger.py").write_text(PID1_FORGER)

    with ordinary_user(forger) as (place, run):
        done = run(AS_USER, str(place / "project" / "overlays" / "proofs"))
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout.splitlines()[-1]) == [["BROKEN", "genuine: stock"],
                                                            ["BROKEN", "genuine: overlaid"]]


CAPPED = f'''
import sys
sys.path.insert(0, sys.argv[1])
from bakery import sandbox
done = sandbox.run([sys.executable, "-c", {FORKS!r}], [], None, sandbox.Limits(seconds=60, processes=int(sys.argv[2])))
print(done.returncode)
print(done.stderr[-400:])
'''


@pytest.mark.slow
def test_as_an_ordinary_user_the_codes_tasks_are_capped():
    """A hosted runner's user has no cgroup of its own to write: the code's processes are capped by
    RLIMIT_NPROC, which counts every task of that uid (the user's own included), in its user namespace."""
    with ordinary_user() as (_, run):
        roomy = run(CAPPED, "4096")
        assert roomy.stdout.split()[:1] == ["0"], roomy  # the control: the same code, with room
        held = run(CAPPED, "32")
        assert held.stdout.split()[0] != "0" and "Resource temporarily unavailable" in held.stdout, held


def test_a_bubblewrap_found_only_on_the_callers_path_runs(tmp_path, monkeypatch):
    """bwrap carried beside the code (the GPU machine's, tests/gpu) is on the caller's PATH only: it
    is started by its full path, not looked up again on the sandbox's own PATH."""
    carried = tmp_path / "bin"
    carried.mkdir()
    bwrap = shutil.which("bwrap")
    assert bwrap, "no bwrap: run scripts/bootstrap.sh"
    shutil.copy(bwrap, carried / "bwrap-carried")
    monkeypatch.setenv("PATH", f"{carried}:{os.environ['PATH']}")
    monkeypatch.setattr(sandbox, "BWRAP", "bwrap-carried")
    assert sandbox.run([sys.executable, "-c", "print('ran')"], [], None, 60).stdout.strip() == "ran"
