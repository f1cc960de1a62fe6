"""Running code that came with the base (upstream's), where it can reach nothing of ours.

A proof executes the base's own Python: that code is untrusted, and the job that runs it may hold
registry credentials, a writable venv or, elsewhere, a signing key. It runs under bubblewrap:
no network (its own empty network namespace), its own PID, IPC and UTS namespaces, every
capability dropped, no further user namespaces, uid/gid 65534, an empty environment but for
PATH, HOME, TMPDIR and LANG, a private empty HOME and /tmp (1 GiB each, in memory), no file or
output past 64 MiB, and a read-only view of exactly: the system's /usr (and its
/bin, /lib links), the few /etc files the loader and Python read, the Python installation and
venv, the folders the caller names, and the inputs. Nothing else of the host exists inside:
not ~/.docker, not the project's other files, not /work or /root.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .errors import EnvironmentProblem

BWRAP = "bwrap"
INPUTS = "/inputs"  # where the caller's input files appear, read-only
HOME = "/home/sandbox"
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "alternatives")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
TMP_BYTES = 1 << 30  # each in-memory place it may write: /tmp, HOME, /dev/shm
OUTPUT_BYTES = 64 << 20  # any file it writes, its stdout and stderr included


def _python_roots() -> list[Path]:
    """The interpreter, its standard library and the venv's packages: read-only inside."""
    roots = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.executable).resolve().parent.parent}
    return sorted(r for r in roots if r.is_dir())


def _system_binds() -> list[str]:
    args = []
    for name in ("usr", "bin", "sbin", "lib", "lib64", "lib32", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    for name in ETC:
        if (Path("/etc") / name).exists():
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    return args


@functools.lru_cache(maxsize=4)
def _check_bwrap(bwrap: str) -> None:
    """bubblewrap is here, and new enough for --disable-userns and --size (0.8)."""
    if shutil.which(bwrap) is None:
        raise EnvironmentProblem("bubblewrap (bwrap) is not installed: proofs run the base's code and only run "
                                 "sandboxed; install it with `apt-get install bubblewrap` (scripts/bootstrap.sh does)")
    said = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.split()
    version = tuple(int(p) for p in said[-1].split(".")[:2] if p.isdigit()) if said else ()
    if version < (0, 8):
        raise EnvironmentProblem(f"bubblewrap {said[-1] if said else '(unknown version)'} is too old for the proofs' "
                                 f"sandbox (--disable-userns needs 0.8; Debian 12 and Ubuntu 24.04 have it)")


def command(argv: list[str], readable: list[Path], inputs: Path, status_fd: int | None = None,
            env: dict | None = None, devices: list[str] = ()) -> list[str]:
    """The bwrap command line that runs argv in the sandbox; `inputs` appears at /inputs; `env` adds
    to the sandbox's few variables; `devices` are device nodes (a GPU's) it may open."""
    _check_bwrap(BWRAP)
    args = [BWRAP, "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--uid", "65534", "--gid", "65534", "--clearenv"]
    if status_fd is not None:  # bwrap writes the code's exit code there once the sandbox stood and ran it
        args += ["--json-status-fd", str(status_fd)]
    for name, value in {**ENV, **(env or {})}.items():
        args += ["--setenv", name, value]
    # the empty, writable places first (a bind under /tmp, a project in a temporary folder, stays
    # visible), each capped: they live in memory
    args += ["--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--size", str(TMP_BYTES), "--tmpfs", HOME,
             "--proc", "/proc", "--dev", "/dev", "--size", str(TMP_BYTES), "--tmpfs", "/dev/shm"]
    args += _system_binds()
    for node in devices:  # a GPU's nodes, bound after --dev: the rest of /dev stays the minimal one
        args += ["--dev-bind", node, node]
    for path in _python_roots() + sorted({p.resolve() for p in readable}):
        args += ["--ro-bind", str(path), str(path)]
    # the root bwrap builds (the folders above each bind) and /dev are read-only too: only /tmp, HOME
    # and /dev/shm take writes, each capped
    return args + ["--ro-bind", str(inputs), INPUTS, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", HOME,
                   "--"] + argv


def _tail(f, limit: int = 1 << 20) -> str:
    """The last `limit` bytes of what the sandboxed code wrote, decoded whatever they are."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - limit))
    return f.read().decode("utf-8", errors="replace")


def run(argv: list[str], readable: list[Path], inputs: Path, timeout: float, env: dict | None = None,
        devices: list[str] = ()) -> subprocess.CompletedProcess:
    """argv in the sandbox (its paths as the sandbox sees them): its exit status and the tail of its
    stdout and stderr as text. A sandbox that does not stand up is this machine's problem, not a
    verdict on the code; bwrap says it stood up and ran the code (its exit code) on a status pipe the
    code inside cannot write to."""
    status_read, status_write = os.pipe()
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            # no file the sandboxed code writes, its stdout and stderr included, grows past OUTPUT_BYTES
            # (set by prlimit, not in a preexec_fn: this runs in threads, where those may deadlock)
            sandboxed = command(argv, readable, inputs, status_write, env, devices)
            limited = ["prlimit", f"--fsize={OUTPUT_BYTES}", "--"] + sandboxed
            try:
                code = subprocess.run(limited, stdout=out, stderr=err, stdin=subprocess.DEVNULL, timeout=timeout,
                                      pass_fds=(status_write,)).returncode
            finally:
                os.close(status_write)
            status = b""
            while chunk := os.read(status_read, 65536):
                status += chunk
            stdout, stderr = _tail(out), _tail(err)
    finally:
        os.close(status_read)
    if b'"exit-code"' not in status:  # bwrap writes it only once the sandbox stood and the code ran
        said = (stderr.strip().splitlines() or ["?"])[0]
        raise EnvironmentProblem(f"the proofs' sandbox cannot start here ({said}): "
                                 f"bubblewrap needs unprivileged user namespaces (on Ubuntu 24.04: sysctl "
                                 f"kernel.apparmor_restrict_unprivileged_userns=0) or root")
    return subprocess.CompletedProcess(argv, code, stdout, stderr)
