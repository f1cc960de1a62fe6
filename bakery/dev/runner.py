"""A GitHub-hosted ubuntu-24.04 runner, as far as this machine can be one: what a rehearsal's jobs run on.

GitHub gives each job a fresh VM: user `runner` (uid 1001) with passwordless sudo and the docker
group, no bubblewrap, apt lists that need an update, 14 GB promised free on `/` and a second disk at
`/mnt` (about 66 GB, not promised). act runs every job on this host instead, so the rehearsal makes
the host look like that, in a mount namespace of its own that ends with act:

- two disks of those sizes (sparse ext4 images, loop-mounted): the runner's own (its home, /tmp, and
  whatever a job writes under /usr, /etc, /var or /opt, which are overlays whose upper layer lives
  there) and /mnt;
- in those overlays: bubblewrap removed (dpkg --purge), apt's lists emptied, the user `runner` with
  its sudo rule and the docker group;
- act itself run as that user; the rehearsal's own folders bound back where they were.

While act runs, each job's peak use of the two disks and the users its processes ran as are read
from outside (through /proc/PID/root), and measured against the hosted runner's budget. What it
cannot be: a fresh machine per job (jobs follow one another on one runner, so what a job installed
stays for the next), GitHub's Node 24 (this machine's node runs the actions), its network and CPU.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import EnvironmentProblem

USER, UID = "runner", 1001
GB = 10**9
ROOT_DISK = 14 * GB  # what GitHub promises free on / of ubuntu-24.04 (about 19 GB in practice)
MNT_DISK = 66 * GB  # what /mnt has free on today's images (not promised)
DISKS = {"/": "/home/runner", "/mnt": "/mnt"}  # each disk, and a path inside it the sampler asks

# as root, in the namespace: the disks, the overlays, the runner image's differences, the user; then
# act as the runner. $1: the runner's folder; $2: the rehearsal's folder (bound back in place); then argv.
SETUP = r'''
set -eu
r=$1 keep=$2 gid=$3; shift 3
mkdir -p "$r/disk"
mount -o loop "$r/root.img" "$r/disk"
mount -o loop "$r/mnt.img" /mnt
for d in usr etc var opt; do
  mkdir -p "$r/disk/overlay/$d/upper" "$r/disk/overlay/$d/work"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$r/disk/overlay/$d/upper,workdir=$r/disk/overlay/$d/work" "/$d"
done
if dpkg-query -W -f='${Status}' bubblewrap 2>/dev/null | grep -q "install ok installed"; then
  dpkg --purge --force-depends bubblewrap >/dev/null 2>&1
fi
rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
getent group docker >/dev/null || groupadd -g "$gid" docker
useradd -u 1001 -U -M -d /home/runner -s /bin/bash -G docker runner
printf 'runner ALL=(ALL) NOPASSWD:ALL\n' > /etc/sudoers.d/runner
chmod 0440 /etc/sudoers.d/runner
mkdir -p "$r/disk/home/runner" "$r/disk/tmp" /var/lib/bakery-rehearsal
chown 1001:1001 "$r/disk/home/runner"
chmod 1777 "$r/disk/tmp"
chown 1001:1001 /mnt
mount --bind "$keep" /var/lib/bakery-rehearsal
mount --bind "$r/disk/home" /home
mount --bind "$r/disk/tmp" /tmp
mkdir -p "$keep"
mount --move /var/lib/bakery-rehearsal "$keep"
cp "$keep/.runner-gitconfig" /home/runner/.gitconfig
chown 1001:1001 /home/runner/.gitconfig
cd "$1"; shift
exec setpriv --reuid=1001 --regid=1001 --init-groups -- "$@"
'''


@dataclass
class Usage:
    """What a job used: its disks' peak above where they stood when it started, its processes' users."""
    peak: dict[str, int] = field(default_factory=dict)
    users: set[int] = field(default_factory=set)


@dataclass
class Sampler:
    """Reads, every half second while act runs, how full the runner's disks are and who its
    processes run as; afterwards, each job's share, by the spans act's log gives it."""
    pid: int
    samples: list[tuple[float, dict[str, int], set[int]]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            used = {}
            for disk, path in DISKS.items():
                try:
                    st = os.statvfs(f"/proc/{self.pid}/root{path}")
                    used[disk] = (st.f_blocks - st.f_bfree) * st.f_frsize
                except OSError:
                    pass
            if used:
                self.samples.append((time.time(), used, _users_below(self.pid)))
            self.stop.wait(0.5)

    def usage(self, start: float, end: float) -> Usage:
        within = [s for s in self.samples if start - 0.5 <= s[0] <= end + 0.5]
        if not within:
            return Usage()
        peak = {}
        for disk in DISKS:  # the most it grew above its lowest point before: a job first emptying what the
            low, grew = None, 0  # one before it left (its cache) starts from there, as a fresh runner would
            for _, used, _ in within:
                if disk in used:
                    low = used[disk] if low is None else min(low, used[disk])
                    grew = max(grew, used[disk] - low)
            peak[disk] = grew
        return Usage(peak, set().union(*(s[2] for s in within)))


def _users_below(pid: int) -> set[int]:
    """The real uids of pid's descendants (act, and every step it runs)."""
    children: dict[int, list[int]] = {}
    uids: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = dict(line.split(":", 1) for line in Path(f"/proc/{entry}/status").read_text().splitlines()
                          if line.startswith(("PPid:", "Uid:")))
            children.setdefault(int(fields["PPid"]), []).append(int(entry))
            uids[int(entry)] = int(fields["Uid"].split()[0])
        except (OSError, KeyError, ValueError):
            continue
    found, todo = set(), list(children.get(pid, []))
    while todo:
        p = todo.pop()
        if p in uids:
            found.add(uids[p])
        todo += children.get(p, [])
    return found


def prepare(folder: Path, keep: Path, gitconfig: str) -> list[tuple[Path, int]]:
    """The runner's two disks (sparse images, made here) and what the namespace binds back: the
    rehearsal's folder `keep` walkable by the runner, its git config beside it. Returns the folders
    whose modes were opened for that, with their modes before, for restore()."""
    if os.geteuid() != 0:
        raise EnvironmentProblem("a rehearsal runs its jobs as the hosted runner's user, in a namespace it sets up as "
                                 "root (loop disks, overlays, a user): run it as root, as CI does")
    for tool in ("mkfs.ext4", "useradd", "setpriv", "unshare", "sudo"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            raise EnvironmentProblem(f"{tool} is not installed: the hosted runner's model needs it "
                                     f"(scripts/bootstrap.sh installs sudo)")
    folder.mkdir(parents=True, exist_ok=True)
    for name, size in (("root.img", ROOT_DISK), ("mnt.img", MNT_DISK)):
        image = folder / name
        image.unlink(missing_ok=True)
        with open(image, "wb") as f:
            f.truncate(size)
        done = subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1",
                               str(image)], capture_output=True, text=True)
        if done.returncode:
            raise EnvironmentProblem(f"mkfs.ext4 {image}: {done.stderr.strip()[-200:]}")
    (keep / ".runner-gitconfig").write_text(gitconfig)
    opened = []
    for path in [keep, *keep.parents]:  # the runner walks to it, as it does on GitHub to its workspace
        if path == Path("/"):
            break
        mode = os.stat(path).st_mode & 0o7777
        if mode & 0o055 != 0o055:
            opened.append((path, mode))
            os.chmod(path, mode | 0o055)
    return opened


def restore(opened: list[tuple[Path, int]]) -> None:
    """The folders prepare() opened, closed again as they were (a /root stays 0700)."""
    for path, mode in opened:
        try:
            os.chmod(path, mode)
        except OSError:
            pass


def command(folder: Path, keep: Path, cwd: Path, argv: list[str]) -> list[str]:
    """argv (act), run as the runner in the namespace described above."""
    import grp

    try:
        gid = grp.getgrnam("docker").gr_gid
    except KeyError:
        gid = 999
    return ["unshare", "--mount", "--propagation", "private", "--", "bash", "-c", SETUP, "setup", str(folder),
            str(keep), str(gid), str(cwd), *argv]


def hand_over(paths: list[Path]) -> None:
    """What the runner's processes write into (act's artifact store, a bare origin it pushes to, a
    secrets file it reads): theirs."""
    for path in paths:
        os.lchown(path, UID, UID)
        for folder, dirs, files in os.walk(path):
            for name in [*dirs, *files, "."]:
                os.lchown(os.path.join(folder, name), UID, UID)


def who(uids: set[int]) -> str:
    """The users a job's processes ran as, in words: the runner, root where it used sudo, and the
    system users root's tools drop to (apt's _apt, man-db's man)."""
    import pwd

    def name(uid: int) -> str:
        if uid == UID:
            return f"{USER} ({UID})"
        if uid == 0:
            return "root (sudo)"
        try:
            return pwd.getpwuid(uid).pw_name
        except KeyError:
            return str(uid)
    return ", ".join(name(u) for u in sorted(uids, key=lambda u: (u != UID, u != 0, u))) or "-"
