"""Running code we do not trust (the base's, a revision being rebuilt) where it can reach nothing of ours.

One sandbox for every such run: the proofs (the base's Python), `invoke reproduce`'s build of a
released revision, and a porting kit's prove.sh. It runs under bubblewrap: no network (its own
empty network namespace), its own PID, IPC and UTS namespaces (so no /proc of ours: not the
parent's environ, not its command line), every capability dropped, no further user namespaces,
uid/gid 65534 inside, an empty environment but for PATH, HOME, TMPDIR and LANG, a private empty
HOME and /tmp (1 GiB each, in memory), and a read-only view of exactly: the system's /usr (and its
/bin, /lib links), the few /etc files the loader and Python read, the Python installation and
venv, the folders the caller names, and the inputs; writable only where the caller says. Nothing
else of the host exists inside: not ~/.docker, not the Docker socket, not the project's other
files, not /work or /root.

On top: a seccomp filter that allows only the calls proofs, the compile and a rebuild make (ALLOWED,
measured from their runs) and refuses the rest: EPERM for those that reach past the caller (ptrace,
mount, keyctl, bpf, ... : REFUSED), ENOSYS otherwise; and limits: address space per process, file
size, open files, processes (as root a pids cgroup below the caller's own where this machine lets us
make one, else RLIMIT_NPROC on the code's uid) and wall time. A limit hit is an error of the code
inside, never a verdict.

The compile of hip/ runs the toolchain's own userland instead of ours: `root` is a folder made from
the toolchain image's layers (base/extract.py), shown read-only as `/`, with the sources and the
output folder bound where the compile script looks (`mounts`); everything else is as above.
"""

from __future__ import annotations

import functools
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .errors import EnvironmentProblem

BWRAP = "bwrap"
INPUTS = "/inputs"  # where the caller's input files appear, read-only
HOME = "/home/sandbox"
ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "nsswitch.conf", "localtime", "alternatives")
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": HOME, "TMPDIR": "/tmp", "LANG": "C.UTF-8"}
INSIDE = "BAKERY_SANDBOXED"  # set inside: a proof the rebuilt revision runs is already in here
UID = 65534  # who the code is inside: as root, the host's nobody; as a user, that user mapped to it
TMP_BYTES = 1 << 30  # each in-memory place it may write: /tmp, HOME, /dev/shm


@dataclass(frozen=True)
class Limits:
    """What one sandboxed run may use. memory is per process (RLIMIT_AS: torch and Triton reserve
    about 0.8 GiB of address space), files is any one file it writes, stdout and stderr included."""
    seconds: float
    memory: int = 8 << 30
    files: int = 64 << 20
    processes: int = 256
    open_files: int = 4096


PROOF = Limits(seconds=900, processes=2048)  # threads count as processes: torch starts one per core
REBUILD = Limits(seconds=3 * 3600, memory=16 << 30, files=64 << 30, processes=8192)
# hip/'s compile: clang and lld on a few kernels; an output is tens of MiB
COMPILE = Limits(seconds=3600, memory=16 << 30, files=1 << 30, processes=4096)


@dataclass(frozen=True)
class Mount:
    """A folder of ours shown at `inside` (read-only unless writable): in a run over a root of its own."""
    inside: str
    outside: Path
    writable: bool = False

# The seccomp filter is an allow list. x86-64 system calls named and numbered as in the kernel's
# arch/x86/entry/syscalls/syscall_64.tbl.
# What the sandboxed code of honest proofs, hip/'s compile and a rebuild called, measured from
# their runs (bench/syscalls.py over tests/test_overlay_proofs.py, test_hip.py, test_verdicts.py
# and test_reproduce.py's rebuild, 2026-12-03; the GPU proofs on an H200 made none outside
# ALLOWED), but those whose arguments are checked apart (clone, clone3, socket, socketpair).
MEASURED = {
    "read": 0, "write": 1, "open": 2, "close": 3, "fstat": 5, "poll": 7, "lseek": 8, "mmap": 9, "mprotect": 10,
    "munmap": 11, "brk": 12, "rt_sigaction": 13, "rt_sigprocmask": 14, "rt_sigreturn": 15, "ioctl": 16,
    "pread64": 17, "access": 21, "mremap": 25, "dup2": 33, "getpid": 39, "sendfile": 40, "connect": 42,
    "sendto": 44, "recvfrom": 45, "vfork": 58, "execve": 59, "wait4": 61, "uname": 63, "fcntl": 72,
    "fsync": 74, "getcwd": 79, "chdir": 80, "rename": 82, "mkdir": 83, "rmdir": 84, "link": 86, "unlink": 87,
    "readlink": 89, "chmod": 90, "sysinfo": 99, "getuid": 102, "getgid": 104, "geteuid": 107, "getegid": 108,
    "getppid": 110, "setgroups": 116, "setresuid": 117, "getresuid": 118, "setresgid": 119, "getresgid": 120,
    "capget": 125, "capset": 126, "fstatfs": 138, "prctl": 157, "arch_prctl": 158, "gettid": 186, "futex": 202,
    "sched_setaffinity": 203, "sched_getaffinity": 204, "getdents64": 217, "set_tid_address": 218,
    "clock_nanosleep": 230, "exit_group": 231, "mbind": 237, "openat": 257, "newfstatat": 262, "unlinkat": 263,
    "set_robust_list": 273, "epoll_create1": 291, "pipe2": 293, "prlimit64": 302, "getrandom": 318,
    "rseq": 334,
}
# The same operations as another libc, Python or toolchain makes them (statx for stat, the *at
# forms, ppoll for poll, ...), and calls that act on the caller alone (signals, timers, its own
# memory policy, its sockets): allowed though not seen in these runs.
KIN = {
    "stat": 4, "lstat": 6, "pwrite64": 18, "readv": 19, "writev": 20, "pipe": 22, "select": 23,
    "sched_yield": 24, "msync": 26, "mincore": 27, "madvise": 28, "dup": 32, "pause": 34, "nanosleep": 35,
    "getitimer": 36, "alarm": 37, "setitimer": 38, "accept": 43, "sendmsg": 46, "recvmsg": 47, "shutdown": 48,
    "bind": 49, "listen": 50, "getsockname": 51, "getpeername": 52, "setsockopt": 54, "getsockopt": 55,
    "fork": 57, "exit": 60, "kill": 62, "flock": 73, "fdatasync": 75, "truncate": 76, "ftruncate": 77,
    "getdents": 78, "fchdir": 81, "creat": 85, "symlink": 88, "fchmod": 91, "chown": 92, "fchown": 93,
    "lchown": 94, "umask": 95, "gettimeofday": 96, "getrlimit": 97, "getrusage": 98, "times": 100,
    "setuid": 105, "setgid": 106, "setpgid": 109, "getpgrp": 111, "setsid": 112, "setreuid": 113,
    "setregid": 114, "getgroups": 115, "getpgid": 121, "getsid": 124, "rt_sigpending": 127,
    "rt_sigtimedwait": 128, "rt_sigqueueinfo": 129, "rt_sigsuspend": 130, "sigaltstack": 131, "utime": 132,
    "mknod": 133, "statfs": 137, "getpriority": 140, "setpriority": 141, "sched_setparam": 142,
    "sched_getparam": 143, "sched_setscheduler": 144, "sched_getscheduler": 145, "sched_get_priority_max": 146,
    "sched_get_priority_min": 147, "mlock": 149, "munlock": 150, "setrlimit": 160, "readahead": 187,
    "setxattr": 188, "lsetxattr": 189, "fsetxattr": 190, "getxattr": 191, "lgetxattr": 192, "fgetxattr": 193,
    "listxattr": 194, "llistxattr": 195, "flistxattr": 196, "removexattr": 197, "lremovexattr": 198,
    "fremovexattr": 199, "tkill": 200, "time": 201, "epoll_create": 213, "restart_syscall": 219,
    "fadvise64": 221, "timer_create": 222, "timer_settime": 223, "timer_gettime": 224, "timer_getoverrun": 225,
    "timer_delete": 226, "clock_gettime": 228, "clock_getres": 229, "epoll_wait": 232, "epoll_ctl": 233,
    "tgkill": 234, "utimes": 235, "set_mempolicy": 238, "get_mempolicy": 239, "waitid": 247, "mkdirat": 258,
    "mknodat": 259, "fchownat": 260, "futimesat": 261, "renameat": 264, "linkat": 265, "symlinkat": 266,
    "readlinkat": 267, "fchmodat": 268, "faccessat": 269, "pselect6": 270, "ppoll": 271,
    "get_robust_list": 274, "splice": 275, "tee": 276, "sync_file_range": 277, "utimensat": 280,
    "epoll_pwait": 281, "signalfd": 282, "timerfd_create": 283, "eventfd": 284, "fallocate": 285,
    "timerfd_settime": 286, "timerfd_gettime": 287, "accept4": 288, "signalfd4": 289, "eventfd2": 290,
    "dup3": 292, "preadv": 295, "pwritev": 296, "rt_tgsigqueueinfo": 297, "recvmmsg": 299, "sendmmsg": 307,
    "getcpu": 309, "renameat2": 316, "memfd_create": 319, "execveat": 322, "membarrier": 324, "mlock2": 325,
    "copy_file_range": 326, "preadv2": 327, "pwritev2": 328, "statx": 332, "pidfd_send_signal": 424,
    "pidfd_open": 434, "close_range": 436, "openat2": 437, "faccessat2": 439, "epoll_pwait2": 441,
    "futex_waitv": 449,
}
ALLOWED = {**MEASURED, **KIN}
# Calls no proof, compile or rebuild needs and that reach past the caller (its namespaces, the
# kernel's state, other processes' memory): EPERM, which the code can report. Anything else that
# is not ALLOWED gets ENOSYS, as from a kernel without the call (programs fall back from it):
# modify_ldt, uselib, personality, move_pages, migrate_pages, process_madvise, legacy AIO, ...

REFUSED = {
    "ptrace": 101, "syslog": 103, "vhangup": 153, "pivot_root": 155, "adjtimex": 159, "chroot": 161,
    "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
    "reboot": 169, "iopl": 172, "ioperm": 173, "init_module": 175, "delete_module": 176, "quotactl": 179,
    "lookup_dcookie": 212, "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249,
    "keyctl": 250, "unshare": 272, "perf_event_open": 298, "fanotify_init": 300, "name_to_handle_at": 303,
    "open_by_handle_at": 304, "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310,
    "process_vm_writev": 311, "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321,
    "userfaultfd": 323, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
    "pidfd_getfd": 438, "mount_setattr": 442, "statmount": 457, "listmount": 458, "open_tree_attr": 467,
}
SOCKET, SOCKETPAIR = 41, 53
CLONE, CLONE3 = 56, 435
# clone()'s namespace flags (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET): refused, as
# unshare is; clone3 hides its flags in memory the filter cannot read, so it answers ENOSYS
CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
ENOSYS = 38
# the address families a proof or build may open a socket in: its own (empty) network namespace's
# loopback and Unix sockets, netlink for the loader's and Python's interface queries; not AF_VSOCK
# (which crosses to a VM's host past any network namespace), AF_PACKET, AF_BLUETOOTH, ...
FAMILIES = {"AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16}
EAFNOSUPPORT = 97
SOCK_PACKET = 10
AUDIT_ARCH_X86_64 = 0xC000003E
X32_BIT = 0x40000000
EPERM = 1


def seccomp_filter() -> bytes:
    """The classic-BPF program bwrap installs (--seccomp): a call of another architecture kills
    the process, an x32 call or a REFUSED one gets EPERM, clone with a namespace flag EPERM and
    clone3 ENOSYS, a socket outside FAMILIES EAFNOSUPPORT, an ALLOWED call passes, and anything
    else gets ENOSYS."""
    if os.uname().machine not in ("x86_64", "AMD64"):
        raise EnvironmentProblem(f"the sandbox's seccomp filter is written for x86-64 (the MI300X hosts); this "
                                 f"machine is {os.uname().machine}")
    ld_w_abs, jeq_k, jge_k, jgt_k, jset_k, and_k, ret_k = 0x20, 0x15, 0x35, 0x25, 0x45, 0x54, 0x06
    allow, errno, kill, no_family = 0x7FFF0000, 0x00050000 | EPERM, 0x80000000, 0x00050000 | EAFNOSUPPORT
    # (code, k, label taken, label not taken), or a label: labels resolve to relative jumps below
    prog: list[tuple | str] = [(ld_w_abs, 4), (jeq_k, AUDIT_ARCH_X86_64, None, "kill"),  # seccomp_data.arch
                               (ld_w_abs, 0), (jge_k, X32_BIT, "eperm", None)]  # seccomp_data.nr
    prog += [(jeq_k, nr, "eperm", None) for nr in sorted(REFUSED.values())]
    prog += [(jeq_k, CLONE3, "enosys", None), (jeq_k, CLONE, "clone", None), (jeq_k, SOCKET, "family", None),
             (jeq_k, SOCKETPAIR, "family", None)]
    # the allowed numbers as runs of consecutive ones: below a run's first, refused; up to its last, allowed
    for first, last in _runs(sorted(ALLOWED.values())):
        prog += [(jge_k, first, None, "enosys"), (jgt_k, last, None, "allow")]
    prog += ["enosys", (ret_k, 0x00050000 | ENOSYS)]
    prog += ["clone", (ld_w_abs, 16), (jset_k, CLONE_NAMESPACES, "eperm", "allow")]
    # socket() and socketpair(): the family (args[0], at offset 16) must be allowed; AF_INET's
    # SOCK_PACKET type (args[1] at 24, its low bits) is a packet socket under another name
    prog += ["family", (ld_w_abs, 16), (jeq_k, FAMILIES["AF_INET"], "inet", None)]
    prog += [(jeq_k, f, "allow", None) for name, f in sorted(FAMILIES.items()) if name != "AF_INET"]
    prog += [(ret_k, no_family), "inet", (ld_w_abs, 24), (and_k, 0xF), (jeq_k, SOCK_PACKET, "no-family", "allow"),
             "allow", (ret_k, allow), "eperm", (ret_k, errno), "kill", (ret_k, kill), "no-family", (ret_k, no_family)]
    return _assemble(prog)


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    """Sorted numbers as (first, last) of each run of consecutive ones."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [(a, b) for a, b in runs]


def _assemble(prog: list) -> bytes:
    """Classic BPF from (code, k[, jump if true, jump if false]) tuples and label strings; a jump
    names a label (or None: the next instruction)."""
    at, n = {}, 0
    for item in prog:
        if isinstance(item, str):
            at[item] = n
        else:
            n += 1
    out, n = [], 0
    for item in prog:
        if isinstance(item, str):
            continue
        code, k, *jumps = item
        jt, jf = [(at[j] - n - 1) if j else 0 for j in (jumps + [None, None])[:2]]
        if not (0 <= jt < 256 and 0 <= jf < 256):
            raise ValueError("a jump past 255 instructions")
        out.append(struct.pack("=HBBI", code, jt, jf, k))
        n += 1
    return b"".join(out)


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


def _bwrap() -> str:
    """bubblewrap by its full path, found on the caller's PATH: it is started with a PATH of ours. As
    root, only one that root owns and no one else may change."""
    found = shutil.which(BWRAP)
    if found and os.geteuid() == 0:
        info = os.stat(found)
        if info.st_uid != 0 or info.st_mode & 0o022:
            raise EnvironmentProblem(f"{found} (bubblewrap, found on PATH) is not root's alone, and root would run "
                                     f"it: refused")
    return found or BWRAP


@functools.lru_cache(maxsize=4)
def _check_bwrap(bwrap: str) -> None:
    """bubblewrap is here, and new enough for --disable-userns and --size (0.8)."""
    if shutil.which(bwrap) is None:
        raise EnvironmentProblem("bubblewrap (bwrap) is not installed: proofs and rebuilds run code we do not trust "
                                 "and only run sandboxed; install it with `apt-get install bubblewrap` "
                                 "(scripts/bootstrap.sh does)")
    said = subprocess.run([bwrap, "--version"], capture_output=True, text=True).stdout.split()
    version = tuple(int(p) for p in said[-1].split(".")[:2] if p.isdigit()) if said else ()
    if version < (0, 8):
        raise EnvironmentProblem(f"bubblewrap {said[-1] if said else '(unknown version)'} is too old for the "
                                 f"sandbox (--disable-userns needs 0.8; Debian 12 and Ubuntu 24.04 have it)")


def command(argv: list[str], readable: list[Path], inputs: Path | None, status_fd: int | None = None,
            env: dict | None = None, devices: Sequence[str] = (), writable: Sequence[Path] = (),
            seccomp_fd: int | None = None, root: Path | None = None, mounts: tuple[Mount, ...] = (),
            init: bool = False) -> list[str]:
    """The bwrap command line that runs argv in the sandbox; `inputs` appears at /inputs; `env` adds
    to the sandbox's few variables; `devices` are device nodes (a GPU's) it may open; `writable`
    folders appear at their own paths, writable. With `root`, that folder is the whole userland
    instead (read-only), `env` is the whole environment, and `mounts` are all that is bound into it.
    `init`: argv is the PID namespace's pid 1 itself (see _namespaces)."""
    _check_bwrap(BWRAP)
    args = _namespaces(argv, root is not None, init)
    argv = args.pop()
    if status_fd is not None:  # bwrap writes the code's exit code there once the sandbox stood and ran it
        args += ["--json-status-fd", str(status_fd)]
    if seccomp_fd is not None:  # installed last, just before argv runs: bwrap's own mounts are done
        args += ["--seccomp", str(seccomp_fd)]
    if root is not None:
        return args + _own_root(root, mounts, env or {}) + ["--"] + argv
    for name, value in {**ENV, INSIDE: "1", **(env or {})}.items():
        args += ["--setenv", name, value]
    # the empty, writable places first (a bind under /tmp, a project in a temporary folder, stays
    # visible), each capped (they live in memory) and open to the code's uid
    args += ["--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp",
             "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", HOME,
             "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/dev/shm"]
    shown = _python_roots() + sorted({p.resolve() for p in readable})
    kept = sorted({p.resolve() for p in writable})
    # the folders above each bind, made 0755 first: bwrap would make them 0700 or copy the host's
    # (/root is 0700), and as root the code is not their owner
    ends = shown + kept + [Path("/etc") / name for name in ETC] + [Path(n) for n in devices] + [Path(INPUTS)]
    above = {a for p in ends for a in p.parents if a not in (Path("/"), Path("/tmp"), Path(HOME), Path("/dev"))}
    for folder in sorted(above, key=lambda a: len(a.parts)):
        if not any(folder == r or r in folder.parents for r in (Path("/usr"), Path("/dev"))):
            args += ["--perms", "0755", "--dir", str(folder)]
    args += _system_binds()
    for node in devices:  # a GPU's nodes, bound after --dev: the rest of /dev stays the minimal one
        args += ["--dev-bind", node, node]
    for path in shown:
        args += ["--ro-bind", str(path), str(path)]
    for path in kept:
        args += ["--bind", str(path), str(path)]
    if inputs is not None:
        args += ["--ro-bind", str(inputs), INPUTS]
    # the root bwrap builds (the folders above each bind), /dev and /proc are read-only too: only /tmp,
    # HOME, /dev/shm and the writable binds take writes. /proc read-only is depth (the code is uid 65534
    # either way, which cannot write /proc/sys); for a proof on a GPU it stays as bwrap mounts it: CUDA's
    # start fails under a read-only /proc (error 304, seen on the lent H200). Only with `init`: pid 1 is
    # then the proof itself, not dumpable, so no code of the same uid can open /proc/1/mem to write it
    read_only = ["/dev", "/"] if devices and init else ["/proc", "/dev", "/"]
    return args + [a for path in read_only for a in ("--remount-ro", path)] + ["--chdir", HOME, "--"] + argv


def _namespaces(argv: list[str], own_root: bool, init: bool = False) -> list:
    """bwrap's namespaces and identity, with argv (as it must then be run) as the last item. `init`
    (an ordinary user's proof): no bwrap reaper as pid 1. That reaper holds the code's stdout and runs
    as the code's own uid, so any code inside could write the proof's verdict lines through
    /proc/1/fd/1; the proof's main process, pid 1 instead, is not dumpable, and its fds are closed to
    the code it forks. As root the reaper is root's: the code (uid 65534) cannot open it."""
    if os.geteuid() == 0 and not own_root:
        # root: no user namespace (uid 65534 in one would be uid 0 to the host kernel); bwrap sets up
        # as root, keeps only what setpriv needs to become the host's uid 65534, which drops it too
        args = [_bwrap(), "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
                "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add",
                "CAP_SETGID", "--clearenv"]
        argv = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all", "--"] + argv
        return args + [argv]
    # an ordinary user: uid 65534 in a user namespace of its own, mapped to this user's uid (root, over a
    # root of its own, is that user by then: run() drops it first)
    return [_bwrap(), "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--uid", str(UID), "--gid", str(UID), "--clearenv", *(["--as-pid-1"] if init else []),
            argv]


SETPRIV, UNSHARE = "/usr/bin/setpriv", "/usr/bin/unshare"
# root's way into a root of its own: the folders bound (in a mount namespace of their own) where the
# host's uid 65534 can reach them, then setpriv becomes it, and bwrap takes the ordinary user's path.
# The toolchain's setpriv and libc are never run as root, and root's own folders (/root) stay closed.
_BIND_THEN = 'set -e; while [ "$1" != -- ]; do mount --bind "$1" "$2"; shift 2; done; shift; exec "$@"'


def _as_nobody(binds: list[tuple[Path, Path]]) -> list[str]:
    pairs = [str(p) for pair in binds for p in pair]
    return [UNSHARE, "--mount", "--propagation", "private", "--", "sh", "-c", _BIND_THEN, "sh", *pairs, "--",
            SETPRIV, f"--reuid={UID}", f"--regid={UID}", "--clear-groups", "--inh-caps=-all", "--"]


def _own_root(root: Path, mounts: tuple[Mount, ...], env: dict) -> list[str]:
    """Binds for a run over a root of its own: the root itself, in-memory /tmp and /dev/shm, /proc,
    a minimal /dev, the mounts; all read-only once set up but /tmp, /dev/shm and writable mounts.
    The root is bound writable while bwrap sets up (it makes the mount points), then remounted
    read-only; the folders it needs are made when the root is (base/extract.py), so nothing of it
    changes."""
    args = ["--bind", str(root), "/"]
    for name, value in {INSIDE: "1", **env}.items():
        args += ["--setenv", name, value]
    args += ["--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(TMP_BYTES), "--tmpfs", "/dev/shm"]
    for m in mounts:
        args += ["--bind" if m.writable else "--ro-bind", str(m.outside), m.inside]
    return args + ["--remount-ro", "/proc", "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]


def _tail(f, limit: int = 1 << 20) -> str:
    """The last `limit` bytes of what the sandboxed code wrote, decoded whatever they are."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - limit))
    return f.read().decode("utf-8", errors="replace")


def _prlimit(limits: Limits, count_processes: bool, gpu: bool = False) -> list[str]:
    """prlimit, not a preexec_fn: this runs in threads, where those may deadlock. With a GPU's device
    nodes, memory is RLIMIT_DATA (what it writes of its own), not RLIMIT_AS: CUDA reserves address
    space past any such bound as it starts (unwritable, so not data), and fails under RLIMIT_AS."""
    memory = f"--data={limits.memory}" if gpu else f"--as={limits.memory}"
    args = ["prlimit", f"--fsize={limits.files}", memory, f"--nofile={limits.open_files}"]
    return args + ([f"--nproc={_tasks_of(_code_uid()) + limits.processes}"] if count_processes else []) + ["--"]


def _code_uid() -> int:
    """The host uid the sandboxed code runs as: root hands it to uid 65534, an ordinary user's
    namespace maps it to that user."""
    return UID if os.geteuid() == 0 else os.getuid()


def _tasks_of(uid: int) -> int:
    """RLIMIT_NPROC counts every task (thread) of the code's uid on the host, not just the sandbox's:
    what that uid already runs is added to the sandbox's allowance."""
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                          if line.startswith(("Uid:", "Threads:")))
            if int(fields["Uid"].split()[0]) == uid:
                count += int(fields["Threads"])
        except (OSError, KeyError, ValueError):
            continue
    return count


def pids_group_path(groups: str, mounts: str) -> tuple[Path, bool] | None:
    """Pure: the folder of the pids cgroup that /proc/self/cgroup (`groups`) names, as the mount table
    (/proc/self/mountinfo, `mounts`) shows it, and whether it is cgroup v2's unified tree (used only
    where no v1 pids hierarchy exists); None where no mount shows that group."""
    lines = groups.splitlines()
    v1 = [g.split(":", 2)[2] for g in lines if g.count(":") >= 2 and "pids" in g.split(":", 2)[1].split(",")]
    v2 = [g.split(":", 2)[2] for g in lines if g.startswith("0::")]
    for fields in (m.split() for m in mounts.splitlines()):
        if "-" not in fields or len(fields) < fields.index("-") + 4:
            continue
        root, point, rest = fields[3], fields[4], fields[fields.index("-") + 1:]
        if v1 and rest[0] == "cgroup" and "pids" in rest[2].split(","):
            path, unified = v1[0], False
        elif not v1 and v2 and rest[0] == "cgroup2":
            path, unified = v2[0], True
        else:
            continue
        if ".." in path.split("/") or (path != root and not path.startswith(root.rstrip("/") + "/")):
            return None  # our group lies outside what this mount shows
        return Path(point) / path[len(root):].lstrip("/"), unified
    return None


def _writable_group(folder: Path, unified: bool) -> Path | None:
    """`folder` where a group made below it is ours to write and gets the pids controller (on v2 only
    where this group hands it down, which v2 allows only to a group holding no processes)."""
    try:
        if unified and "pids" not in (folder / "cgroup.subtree_control").read_text().split():
            return None
    except OSError:
        return None
    return folder if folder.is_dir() and os.access(folder, os.W_OK) else None


def _own_pids_group() -> Path | None:
    """The folder of the pids cgroup this process is in, where a group made below it counts against
    every limit above; None where there is none we may write."""
    try:
        found = pids_group_path(Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text())
    except OSError:
        return None
    return _writable_group(*found) if found else None


GROUP_PREFIX = "bakery-sandbox-"
# A group holds no process only for the moment between its mkdir and its shell joining it, and from its
# last process leaving until its owner removes it: one empty this long was left by a killed owner.
ABANDONED_AFTER_S = 600


def is_abandoned(mtime: float, now: float) -> bool:
    """Pure: whether an empty group last changed at `mtime` has been empty too long at `now`, both on
    the kernel's clock: a group's mtime is the kernel's, and a process's own clock may be skewed (a
    build tried under `faketime +365d` would else take a group made a moment ago for one years old)."""
    return now - mtime > ABANDONED_AFTER_S


def _remove_abandoned_groups(root: Path, ours: Path) -> None:
    """Removes the empty sandbox groups below `root` that a killed run left (its `finally` never ran):
    else they pile up for good. The kernel removes only an empty group, so a live one is never touched.
    Their age is judged against `ours`, the group this run has just made: its mtime is the kernel's now."""
    try:
        now = ours.stat().st_mtime
    except OSError:
        return
    for group in root.glob(f"{GROUP_PREFIX}*"):
        if group == ours:
            continue
        try:
            if is_abandoned(group.stat().st_mtime, now) and not (group / "cgroup.procs").read_text().strip():
                group.rmdir()
        except OSError:
            continue  # joined, removed by another run, or not ours to remove: left as it is


@contextmanager
def _process_cap(limits: Limits):
    """A command prefix that caps the processes of what it runs: as root, a fresh pids cgroup below
    the caller's own (made at the hierarchy's root it would escape the caller's limits), else
    RLIMIT_NPROC over the tasks the code's host uid already runs (root's code is uid 65534, which
    RLIMIT_NPROC counts; an ordinary user's is that user). Yields (prefix, count by rlimit)."""
    root = _own_pids_group() if os.geteuid() == 0 else None
    if root is None:
        yield [], True
        return
    group = root / f"{GROUP_PREFIX}{os.urandom(6).hex()}"
    group.mkdir()
    try:
        if not (group / "cgroup.procs").exists():  # the kernel makes it in a group: this is no cgroup folder
            raise EnvironmentProblem(f"{root} is not a cgroup folder (no cgroup.procs in a group made there)")
        _remove_abandoned_groups(root, group)
        (group / "pids.max").write_text(str(limits.processes))
        # the shell joins the group, then becomes prlimit, which becomes bwrap: all they start stays in it
        yield ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group)], False
    finally:
        for _ in range(50):  # the last processes may still be leaving
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break  # another run took it for abandoned the moment it emptied
            except OSError:
                time.sleep(0.1)


def _hand_over(readable: list[Path], writable: Sequence[Path], inputs: Path | None, ours: bool = True) -> None:
    """Run by root, the code is the host's uid 65534: what it reads must be readable by others (a
    clear error now, not a proof failing on a Permission denied), what it writes its own. `ours`:
    it is shown our Python (not in a root of its own)."""
    import stat

    for path in (_python_roots() if ours else []) + [p.resolve() for p in readable] + ([inputs] if inputs else []):
        if not path.exists():
            continue  # bwrap says so, as the machine's problem
        mode = path.stat().st_mode
        if not mode & stat.S_IROTH or (stat.S_ISDIR(mode) and not mode & stat.S_IXOTH):
            raise EnvironmentProblem(f"{path} is not readable by others, and as root the sandbox runs code as uid "
                                     f"{UID}: make it readable (chmod o+rX, or a umask of 022 when creating it), or "
                                     f"run as an ordinary user")
    for path in writable:
        os.chown(path, UID, UID)


def _inside() -> bool:
    """Already in a sandbox of ours: the variable it sets, and what no variable can fake (uid 65534,
    no capability, a seccomp filter). A leaked BAKERY_SANDBOXED=1 alone turns nothing off."""
    if os.environ.get(INSIDE) != "1" or os.getuid() != 65534:
        return False
    try:
        status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
        uid_map = Path("/proc/self/uid_map").read_text().split()
    except OSError:
        return False
    # an ordinary user's sandbox maps exactly one uid, 65534, in a user namespace of its own; root's
    # runs as the host's 65534 under bwrap as the PID namespace's init. A container run as 65534 with
    # no_new_privs and a filter of its own has neither.
    try:
        init = Path("/proc/1/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        init = b""
    own_map = len(uid_map) == 3 and uid_map[0] == str(UID) and uid_map[2] == "1"
    under_bwrap = uid_map == ["0", "0", "4294967295"] and Path(init.decode(errors="replace")).name == "bwrap"
    return status.get("Seccomp", "").strip() == "2" and int(status.get("CapEff", "1").strip(), 16) == 0 and \
        status.get("NoNewPrivs", "").strip() == "1" and (own_map or under_bwrap)


def _nested(argv: list[str], inputs: Path | None, env: dict | None) -> tuple[list[str], dict]:
    """Already inside a sandbox (a proof the rebuilt revision runs): no second bubblewrap (the
    filter refuses it, and nothing here is ours to protect); the same argv, its /inputs paths
    rewritten to where the inputs are."""
    where = str(inputs) if inputs is not None else INPUTS
    argv = [where + a[len(INPUTS):] if a == INPUTS or a.startswith(INPUTS + "/") else a for a in argv]
    return argv, {**os.environ, **(env or {})}


def run(argv: list[str], readable: list[Path], inputs: Path | None, limits: Limits | float,
        env: dict | None = None, devices: Sequence[str] = (), writable: Sequence[Path] = (), root: Path | None = None,
        mounts: tuple[Mount, ...] = (), stop=None, init: bool = False) -> subprocess.CompletedProcess:
    """argv in the sandbox (its paths as the sandbox sees them): its exit status and the tail of its
    stdout and stderr as text. A sandbox that does not stand up is this machine's problem, not a
    verdict on the code; bwrap says it stood up and ran the code (its exit code) on a status pipe the
    code inside cannot write to. Past limits.seconds: subprocess.TimeoutExpired; once `stop` (a
    threading.Event) is set, it is killed (exit -9). With `root` (and `mounts`), over a userland of
    its own (command()). `init`: argv is the PID namespace's pid 1 (a proof, which reaps its own)."""
    if not isinstance(limits, Limits):
        limits = Limits(seconds=float(limits))
    if root is not None:
        if _inside():  # a rebuild's compile runs outside, through its broker
            raise EnvironmentProblem("a run over a root of its own cannot be nested in the sandbox")
        readable = [root] + [m.outside for m in mounts if not m.writable]
        writable = [m.outside for m in mounts if m.writable]
        if os.geteuid() == 0:
            with _reachable(root, mounts) as (root, mounts, prefix):
                _hand_over(readable, writable, None, ours=False)
                return _run(argv, [], None, limits, env, (), [], root, mounts, prefix, stop)
    elif _inside():
        argv, nested_env = _nested(argv, inputs, env)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            code = subprocess.run(_prlimit(limits, False) + argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                  timeout=limits.seconds, env=nested_env).returncode
            return subprocess.CompletedProcess(argv, code, _tail(out), _tail(err))
    if os.geteuid() == 0:
        _hand_over(readable, writable, inputs)
    return _run(argv, readable, inputs, limits, env, devices, writable, root, mounts, [], stop, init)


@contextmanager
def _reachable(root: Path, mounts: tuple[Mount, ...]):
    """As root: a fresh folder in /tmp that uid 65534 can walk, holding an empty mount point for the
    root and each mount; yields them as bwrap will name them, and the command prefix that binds the
    real folders there and becomes uid 65534."""
    stage = Path(tempfile.mkdtemp(prefix="bakery-sandbox-", dir="/tmp"))
    try:
        os.chmod(stage, 0o755)
        binds, shown = [(root, stage / "root")], []
        for i, m in enumerate(mounts):
            binds.append((m.outside, stage / f"mount-{i}"))
            shown.append(Mount(m.inside, stage / f"mount-{i}", m.writable))
        for _, point in binds:
            point.mkdir(mode=0o755)
            os.chmod(point, 0o755)
        yield stage / "root", tuple(shown), _as_nobody(binds)
    finally:
        shutil.rmtree(stage, ignore_errors=True)  # empty mount points: the binds lived in their own namespace


def _wait(proc: subprocess.Popen, seconds: float, stop) -> int:
    """Its exit status; past `seconds`, or once `stop` (an Event) is set, it is killed (the chain up
    to bwrap is one process, each part exec'ing the next, and bwrap takes the sandbox with it):
    subprocess.TimeoutExpired, or -9."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            if (stop is not None and stop.is_set()) or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                if stop is not None and stop.is_set():
                    return -9
                raise subprocess.TimeoutExpired(proc.args, seconds) from None


def _run(argv, readable, inputs, limits: Limits, env, devices, writable, root, mounts, prefix,
         stop=None, init: bool = False) -> subprocess.CompletedProcess:
    program = seccomp_filter()
    status_read, status_write = os.pipe()
    filter_read, filter_write = os.pipe()
    os.write(filter_write, program)  # a few hundred bytes: fits the pipe's buffer
    os.close(filter_write)
    try:
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, _process_cap(limits) as (cap, nproc):
            sandboxed = command(argv, readable, inputs, status_write, env, devices, writable, filter_read, root, mounts,
                                init)
            try:
                # bwrap itself stays inside as the namespace's pid 1 (but for a proof), whose
                # /proc/1/environ the code can read: it gets no variable of ours either
                proc = subprocess.Popen(cap + _prlimit(limits, nproc, gpu=bool(devices)) + prefix + sandboxed,
                                        stdout=out, stderr=err,
                                        stdin=subprocess.DEVNULL, env={"PATH": ENV["PATH"]},
                                        pass_fds=(status_write, filter_read))
                code = _wait(proc, limits.seconds, stop)
            finally:
                os.close(status_write)
                status_write = -1
            status = b""
            while chunk := os.read(status_read, 65536):
                status += chunk
            stdout, stderr = _tail(out), _tail(err)
    finally:
        for fd in (status_read, filter_read, status_write):
            if fd >= 0:
                os.close(fd)
    if code == -9 and stop is not None and stop.is_set():  # stopped by us: bwrap had no time to say how it went
        return subprocess.CompletedProcess(argv, code, stdout, stderr)
    if b'"exit-code"' not in status:  # bwrap writes it only once the sandbox stood and the code ran
        said = (stderr.strip().splitlines() or ["?"])[0]
        raise EnvironmentProblem(f"the sandbox cannot start here ({said}): "
                                 f"bubblewrap needs unprivileged user namespaces (on Ubuntu 24.04: sysctl "
                                 f"kernel.apparmor_restrict_unprivileged_userns=0) or root")
    return subprocess.CompletedProcess(argv, code, stdout, stderr)
