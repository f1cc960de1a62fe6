"""bakery.files: writes that are whole or absent, and the one canonical JSON encoding. Pure: no
engine, no registry."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bakery.base.spec import Image
from bakery.errors import IntegrityError
from bakery.files import atomic_dir, atomic_file, atomic_write, canonical_json, go_fold
from bakery.inputs.image import ImageSpec, derive_config
from bakery.oci.refs import Descriptor, Reference
from support import ROOT


class Interrupted(BaseException):
    """What Ctrl-C is to a writer: not an Exception, and it must still leave nothing behind."""


def test_an_interrupted_write_leaves_the_old_bytes_and_no_partial_file(tmp_path):
    path = tmp_path / "d" / "record.json"
    atomic_write(path, b"old")
    with pytest.raises(Interrupted):
        with atomic_file(path) as out:
            out.write(b"half of the new")
            raise Interrupted
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]
    atomic_write(path, b"new", durable=True)
    assert path.read_bytes() == b"new"


def test_a_folder_appears_whole_or_not_at_all(tmp_path):
    dest = tmp_path / "layout"
    dest.mkdir()
    (dest / "old").write_bytes(b"1")
    with pytest.raises(Interrupted):
        with atomic_dir(dest) as staging:
            (staging / "new").write_bytes(b"2")
            raise Interrupted
    assert sorted(os.listdir(tmp_path)) == ["layout"] and os.listdir(dest) == ["old"]
    with atomic_dir(dest) as staging:
        (staging / "new").write_bytes(b"2")
    assert sorted(os.listdir(tmp_path)) == ["layout"] and os.listdir(dest) == ["new"]


def test_what_a_killed_writer_left_is_removed_by_the_next_and_a_live_writers_is_kept(tmp_path):
    """A kill leaves its staging name behind (a toolchain's folder is gigabytes). The next writer
    there removes it, but never one a live process is filling (it holds a lock on it) and never
    one made a moment ago (its writer may not have locked it yet)."""
    import subprocess
    import sys
    import time

    old = time.time() - 3600
    left = tmp_path / ".entry.partial-killed"
    (left / "blobs").mkdir(parents=True)
    (left / "blobs" / "big").write_bytes(b"x" * 4096)
    live, fresh = tmp_path / ".entry.partial-live", tmp_path / ".entry.partial-fresh"
    live.mkdir()
    fresh.mkdir()
    stray = tmp_path / ".partial-killed-file"
    stray.write_bytes(b"half")
    for path in (left, live, stray):
        os.utime(path, (old, old))
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDONLY); "
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)", str(live)],
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None  # piped
    try:
        assert holder.stdout.readline().strip() == "held"
        with atomic_dir(tmp_path / "entry") as staging:
            (staging / "f").write_bytes(b"whole")
        atomic_write(tmp_path / "file", b"whole")
    finally:
        holder.kill()
        holder.wait()
    assert not left.exists() and not stray.exists()
    assert live.exists() and fresh.exists()
    assert (tmp_path / "entry" / "f").read_bytes() == b"whole" and (tmp_path / "file").read_bytes() == b"whole"


def test_a_name_made_a_moment_ago_is_kept_under_a_process_clock_a_year_ahead(tmp_path, monkeypatch):
    """Issue 50 item 8, "same digest whatever the clock": a writer whose clock is a year ahead (a build
    tried under faketime +365d) judges another writer's staging name, made a moment ago and not yet
    locked, on the file system's clock, and leaves it; a killed writer's, an hour old, still goes."""
    import time

    fresh, killed = tmp_path / ".entry.partial-fresh", tmp_path / ".entry.partial-killed"
    fresh.mkdir()
    killed.mkdir()
    old = time.time() - 3600
    os.utime(killed, (old, old))
    fresh_file, killed_file = tmp_path / ".partial-fresh", tmp_path / ".partial-killed"
    fresh_file.write_bytes(b"half")
    killed_file.write_bytes(b"half")
    os.utime(killed_file, (old, old))
    ahead = time.time() + 365 * 86400
    monkeypatch.setattr(time, "time", lambda: ahead)
    with atomic_dir(tmp_path / "entry") as staging:
        (staging / "f").write_bytes(b"whole")
    atomic_write(tmp_path / "file", b"whole")
    assert fresh.exists() and fresh_file.exists()
    assert not killed.exists() and not killed_file.exists()


def test_a_leftover_that_is_not_a_plain_file_or_folder_is_left_alone_and_the_write_goes_on(tmp_path):
    """A FIFO or a link planted under a staging name (by anyone who can write in the folder) must not
    hang the next write, nor be followed: it is left where it is, and the write succeeds."""
    import signal
    import time

    old = time.time() - 3600
    fifo, link, target = tmp_path / ".partial-fifo", tmp_path / ".entry.partial-link", tmp_path / "kept"
    os.mkfifo(fifo)
    target.mkdir()
    (target / "precious").write_bytes(b"keep")
    link.symlink_to(target)
    os.utime(fifo, (old, old))
    os.utime(link, (old, old), follow_symlinks=False)
    signal.alarm(20)  # a hang fails the test instead of the suite
    try:
        atomic_write(tmp_path / "file", b"whole")
        with atomic_dir(tmp_path / "entry") as staging:
            (staging / "f").write_bytes(b"whole")
    finally:
        signal.alarm(0)
    assert fifo.exists() and link.is_symlink() and (target / "precious").read_bytes() == b"keep"
    assert (tmp_path / "file").read_bytes() == b"whole" and (tmp_path / "entry" / "f").read_bytes() == b"whole"


def test_canonical_json_is_sorted_compact_utf8():
    # written from the format's description (sorted keys, no whitespace, UTF-8 as Go writes it), not
    # from the encoder's output
    assert canonical_json({"b": [1, None, True], "a": "é", "c": {"z": 1, "y": 2.5}}) == \
        b'{"a":"\xc3\xa9","b":[1,null,true],"c":{"y":2.5,"z":1}}'


def test_a_lone_surrogate_is_refused_as_one_integrity_error():
    with pytest.raises(IntegrityError, match=r"the thing holds \\udc80, surrogate code points"):
        canonical_json({"a": "x\udc80"}, "the thing")


def test_a_base_config_spelling_a_lone_surrogate_is_refused_not_crashed_on():
    """A hostile base's config may spell \\udc80: valid JSON, no UTF-8. Deriving our config from
    it was an uncaught UnicodeEncodeError; it is one integrity error naming the base."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["A=\udc80"]},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()  # ASCII escapes: valid JSON
    assert b'"A=\\udc80"' in config
    ref = Reference.parse("127.0.0.1:5000/hostile/base@sha256:" + "0" * 64)
    base = Image(ref, None, b"{}", "application/vnd.oci.image.manifest.v1+json", config,
                 Descriptor.of("application/vnd.oci.image.config.v1+json", config), ())
    spec = ImageSpec(Reference.parse("127.0.0.1:5000/ours/image"), "base", (), ("/bin/true",), (), (), ())
    with pytest.raises(IntegrityError, match="the config of base 127.0.0.1:5000/hostile/base@sha256:0+ holds"):
        derive_config(base, [], spec, 0, {})


def test_a_kill_while_the_old_folder_is_removed_leaves_the_old_one_or_the_new_one_whole(tmp_path):
    """Replacing a folder (an --layout written again, a compile entry made again): the writer is
    killed (SIGKILL) after removing one file of the old one. dest then holds the old folder whole or
    the new one whole, never a half-deleted one under its name."""
    import subprocess
    import sys

    dest = tmp_path / "layout"
    dest.mkdir()
    old = {f"old-{i}": str(i).encode() for i in range(20)}
    for name, data in old.items():
        (dest / name).write_bytes(data)
    writer = """
import os, shutil, signal, sys
from pathlib import Path
from bakery.files import atomic_dir

real = shutil.rmtree
def killed_midway(path, *a, **k):  # removes one file, then the process dies as a preempted runner does
    names = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if names:
        os.unlink(os.path.join(path, names[0]))
    os.kill(os.getpid(), signal.SIGKILL)
shutil.rmtree = killed_midway
with atomic_dir(Path(sys.argv[1])) as staging:
    (staging / "new").write_bytes(b"whole")
"""
    done = subprocess.run([sys.executable, "-c", writer, str(dest)], capture_output=True, text=True)
    assert done.returncode == -9, done.stderr
    found = {p.name: p.read_bytes() for p in dest.iterdir()} if dest.exists() else None
    assert found in (old, {"new": b"whole"}), sorted(found or ())


def test_two_writers_of_one_entry_the_first_ones_folder_stays_when_it_is_good(tmp_path):
    """Two compiles of one hip/ entry at once: the second to finish keeps the first's folder (the
    same inode: a reader of it never sees it vanish) when keep() says it is good, and replaces it
    when not."""
    dest = tmp_path / "entry"
    with atomic_dir(dest, keep=lambda d: True) as staging:
        (staging / "f").write_bytes(b"first")
    first = dest.stat().st_ino
    with atomic_dir(dest, keep=lambda d: (d / "f").read_bytes() == b"first") as staging:
        (staging / "f").write_bytes(b"second")
    assert dest.stat().st_ino == first and (dest / "f").read_bytes() == b"first"
    with atomic_dir(dest, keep=lambda d: False) as staging:
        (staging / "f").write_bytes(b"third")
    assert (dest / "f").read_bytes() == b"third" and sorted(os.listdir(tmp_path)) == ["entry"]


def test_a_writer_that_finds_the_name_taken_at_its_last_step_keeps_the_other_ones_good_entry(tmp_path, monkeypatch):
    """The other writer's folder may take the name after this one looked and before its rename: the
    rename then fails (ENOTEMPTY), and it threw a good compile away as an error. Now it keeps theirs."""
    from bakery import crashpoint, files

    dest = tmp_path / "entry"
    reached = crashpoint.reached

    def the_other_writer_finishes(point: str) -> None:
        if point == f"fill {dest}" and not dest.exists():
            dest.mkdir()
            (dest / "f").write_bytes(b"theirs")
        reached(point)

    monkeypatch.setattr(files.crashpoint, "reached", the_other_writer_finishes)
    with atomic_dir(dest, keep=lambda d: (d / "f").read_bytes() == b"theirs") as staging:
        (staging / "f").write_bytes(b"ours")
    assert (dest / "f").read_bytes() == b"theirs" and sorted(os.listdir(tmp_path)) == ["entry"]


def test_what_lock_track_and_bump_write_in_the_checkout_keeps_the_users_modes(tmp_path):
    """overlays.lock, the stock bytes, the ledger, base.yaml and the patches were written through a
    temporary file of mode 0600, which then took their place: a checkout's files no longer readable
    by others (as root, the sandbox's uid then cannot read them). Now: a file's mode stays, a new
    one's is 0666 less the umask."""
    import stat

    from bakery.inputs import overlays
    from bakery.release.track import bump, ledger

    old = os.umask(0o022)
    try:
        overlays.write_lock(tmp_path / "overlays.lock", overlays.Lock.of("r@sha256:" + "0" * 64, []))
        sha = overlays.store_stock(tmp_path, b"stock bytes")
        ledger.write_ledger(tmp_path / "nightlies.yaml", ledger.Ledger("u", "m", ()))
        (tmp_path / "base.yaml").write_text("image: x\n")
        (tmp_path / "base.yaml").chmod(0o640)  # the user's choice, kept
        bump.pin(tmp_path / "base.yaml", "r@sha256:" + "1" * 64, "m")
    finally:
        os.umask(old)
    modes = {p: stat.S_IMODE((tmp_path / p).stat().st_mode)
             for p in ("overlays.lock", f"stock/{sha}", "nightlies.yaml", "base.yaml")}
    assert modes == {"overlays.lock": 0o644, f"stock/{sha}": 0o644, "nightlies.yaml": 0o644, "base.yaml": 0o640}, modes


def test_a_checkout_file_rewritten_takes_no_mode_from_a_links_target_and_no_special_bits(tmp_path):
    """Found by review: the mode kept was the link's target's (a committed overlays.lock linking to a
    setuid program made ours 4755), and setuid, setgid and sticky bits were kept from a file too."""
    import stat

    from bakery.files import rewrite

    target = tmp_path / "setuid-program"
    target.write_bytes(b"x")
    target.chmod(0o4755)
    (tmp_path / "overlays.lock").symlink_to(target)
    (tmp_path / "base.yaml").write_text("image: x\n")
    (tmp_path / "base.yaml").chmod(0o2775)
    old = os.umask(0o027)
    try:
        rewrite(tmp_path / "overlays.lock", b"lock")
        rewrite(tmp_path / "base.yaml", b"image: y\n")
    finally:
        os.umask(old)
    lock, base = tmp_path / "overlays.lock", tmp_path / "base.yaml"
    assert not lock.is_symlink() and lock.read_bytes() == b"lock" and target.read_bytes() == b"x"
    assert stat.S_IMODE(lock.stat().st_mode) == 0o640  # a new file's: 0666 less the umask
    assert stat.S_IMODE(base.stat().st_mode) == 0o775  # its permission bits, none special


REMOVE_AS_A_USER = """
import os, shutil, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bakery.files import remove_tree
os.umask(0o022)
base = Path(sys.argv[2])
for name in ("plain", "remove_tree"):
    inner = base / name / "d" / "e"
    inner.mkdir(parents=True)
    (inner / "k.so").write_bytes(b"x")
    os.chmod(inner, 0o500)  # what a compile may leave: its folders not writable, one not even readable
    os.chmod(inner.parent, 0o000)
shutil.rmtree(base / "plain", ignore_errors=True)
remove_tree(base / "remove_tree")
print(" ".join(sorted(os.listdir(base))))
"""


def as_nobody(script: str) -> subprocess.CompletedProcess:
    """script run by uid 65534 with the system's Python (stdlib only), given the project's root and
    a fresh folder of its own in /tmp (pytest's own folders are root's alone)."""
    import tempfile

    base = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        os.chown(base, 65534, 65534)
        return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                               "-c", script, str(ROOT), str(base)], capture_output=True, text=True)
    finally:
        shutil.rmtree(base)  # as root


CLAIM_AS_A_USER = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bakery.release.reproduce import WORKDIR_MARK, claimed
work = Path(sys.argv[2]) / "work"
inner = work / "build" / "output" / "d"
inner.mkdir(parents=True)
(work / WORKDIR_MARK).touch()
(inner / "k.so").write_bytes(b"x")
os.chmod(inner, 0o500)  # what a hostile revision's build may leave in build/
with claimed(work):
    print(" ".join(sorted(os.listdir(work))))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs as another user: needs root and setpriv")
def test_a_rebuild_workdir_left_unwritable_is_started_afresh_by_a_user_who_is_not_root():
    """Third attacker review of issue 50: reproduce cleared an earlier run's build/ with a plain rmtree,
    so for any user but root a 0500 folder the rebuilt revision left there made every later run with
    that --workdir fail ("cannot be removed")."""
    from bakery.release.reproduce import WORKDIR_MARK

    done = as_nobody(CLAIM_AS_A_USER)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [WORKDIR_MARK], done.stdout


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs as another user: needs root and setpriv")
def test_a_tree_a_compile_left_unwritable_is_removed_by_a_user_who_is_not_root():
    """Found by review: the rebuild broker's compile folder went from a TemporaryDirectory (which makes
    each folder writable again) to a staging folder removed by rmtree, which, for any user but root,
    stops at a folder the compile made 0500: a hostile revision could leave its 2 GiB in TMPDIR at each
    compile. Run as uid 65534 with the system's Python (stdlib only is imported)."""
    done = as_nobody(REMOVE_AS_A_USER)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain"], done.stdout  # the plain rmtree left its tree; remove_tree took it all


FAIL_AS_A_USER = """
import os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from bakery.files import atomic_dir
os.umask(0o022)
base = Path(sys.argv[2])
try:
    with atomic_dir(base / "entry") as tmp:  # as a local compile fills its cache entry, /out inside
        inner = tmp / ".out" / "d" / "e"
        inner.mkdir(parents=True)
        os.chmod(inner, 0o500)
        os.chmod(inner.parent, 0o000)
        raise RuntimeError("compiling hip/ failed")
except RuntimeError:
    pass
print(" ".join(sorted(os.listdir(base))) or "nothing")
"""


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="runs as another user: needs root and setpriv")
def test_a_failed_local_compiles_staging_folder_is_removed_by_a_user_who_is_not_root():
    """Found by review: the broker's compile folder went to remove_tree, but a local compile's, the
    staging folder of its cache entry, was still removed by a plain rmtree when the compile failed:
    a folder the compile made 0500 kept it, and all above it, for any user but root."""
    done = as_nobody(FAIL_AS_A_USER)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["nothing"], done.stdout


def test_one_at_a_time_keeps_another_process_out_and_lets_its_holder_in_again(tmp_path):
    """Two test runs side by side start a server or build a fixture once (stack.py, fixture.py): a
    second process waits while the lock is held; the holder may enter again (build() holds it and
    calls rootfs_tar(), which takes it too), where a second flock of its own would wait forever."""
    import sys

    from bakery.files import one_at_a_time

    lock = tmp_path / "x" / ".lock"
    probe = ("import fcntl, sys\nf = open(sys.argv[1])\ntry:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
             "except BlockingIOError:\n    sys.exit(3)\n")
    with one_at_a_time(lock):
        with one_at_a_time(lock):
            assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 3
        assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 3  # the outer block holds it
    assert subprocess.run([sys.executable, "-c", probe, str(lock)]).returncode == 0
    # another thread of the holder's process waits too: the way in again is the holding thread's alone
    import threading

    order = []

    def other():
        with one_at_a_time(lock):
            order.append("other")

    with one_at_a_time(lock):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=1)
        order.append("holder")
    thread.join(timeout=10)
    assert order == ["holder", "other"]


@pytest.mark.parametrize("key, folded", [
    ("Entrypoint", "entrypoint"), ("container_config", "container_config"),
    ("Label\u017f", "labels"),  # LONG S folds to s
    ("\u212aey", "key"),  # KELVIN SIGN folds to k
    ("Stra\u00dfe", "stra\u00dfe"),  # sharp s stays: Go does not fold it to ss
    ("\ufb06ep", "\ufb06ep"),  # the st ligature stays
    ("\u0130d", "\u0130d"),  # dotted capital I: its lower case is two code points, Go keeps it
], ids=["ASCII", "ASCII with _", "long s", "Kelvin sign", "sharp s", "st ligature", "dotted I"])
def test_a_key_folds_as_go_matches_it_to_a_field(key, folded):
    """ASCII keys take a short way (their lower case); every ASCII character folds as the
    character-by-character rule folds it."""
    assert go_fold(key) == folded
    assert all(go_fold(chr(c)) == chr(c).casefold() for c in range(128))


def _base_of_config(config: bytes) -> Image:
    return Image(Reference.parse("127.0.0.1:5000/hostile/base@sha256:" + "0" * 64), None, b"{}",
                 "application/vnd.oci.image.manifest.v1+json", config,
                 Descriptor.of("application/vnd.oci.image.config.v1+json", config), ())


@pytest.mark.parametrize("run", [
    {"entrypoint": ["/bin/sh", "-c", "evil"]},  # one lowercase key: no twin needed
    {"Env": ["A=ours"], "env": ["A=evil"]},
    {"ENTRYPOINT": ["evil"]},
    {"Label\u017f": {"org.opencontainers.image.source": "evil"}},  # LONG S: Go folds it to s
], ids=["entrypoint", "env beside Env", "ENTRYPOINT", "Labels with a long s"])
def test_a_base_config_field_go_reads_as_ours_but_spelled_otherwise_is_refused(run):
    """The build writes Entrypoint, Env, Cmd and Labels into the base's config object and signs the
    result. Go's decoder (Docker, containerd) takes a key for a field without case, the last one
    winning, and the canonical order puts "entrypoint" after "Entrypoint": before, a base's
    lowercase entrypoint was what a container of our signed image ran, not bakery-selfcheck."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "config": run,
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    spec = ImageSpec(Reference.parse("127.0.0.1:5000/ours/image"), "base", (), ("/bin/true",), (), (), ())
    with pytest.raises(IntegrityError, match="Go reads them as one|twice"):
        derive_config(_base_of_config(config), [], spec, 0, {})


def test_a_base_config_keys_go_keeps_apart_or_ignores_are_taken():
    """What Go neither folds onto a field nor reads twice is the base's own business: a "\u00df" key
    beside "ss" (Go does not fold ß to ss), a key of no field, an exact field."""
    config = json.dumps({"architecture": "amd64", "os": "linux", "container_config": {"entrypoint": "x"},
                         "config": {"Env": ["A=1"], "ss": 1, "\u00df": 2, "WorkingDir": "/"},
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    spec = ImageSpec(Reference.parse("127.0.0.1:5000/ours/image"), "base", (), ("/bin/true",), (), (), ())
    derived = json.loads(derive_config(_base_of_config(config), [], spec, 0, {}))
    assert derived["config"]["Entrypoint"] == ["/bin/true"] and derived["config"]["\u00df"] == 2


def _derived(config: dict | bytes) -> dict:
    spec = ImageSpec(Reference.parse("127.0.0.1:5000/ours/image"), "base", (), ("/bin/true",), (), (), ())
    data = config if isinstance(config, bytes) else json.dumps(config).encode()
    return json.loads(derive_config(_base_of_config(data), [], spec, 0, {}))


@pytest.mark.parametrize("config, why", [
    (b'{"config": {"Healthcheck": {"test": ["CMD", "/evil"], "Test": ["CMD", "true"]}}}', "twice"),
    (b'{"config": {"Env": [1]}}', "Env is not a list of strings"),
    (b'{"config": {"Labels": ["a", "b"]}}', "Labels is not an object of strings"),
    (b'{"rootfs": {"diff_ids": "ab"}}', "diff_ids is not a list of strings"),
    (b'{"config": [], "rootfs": {}}', "config is not an object"),
    (b'{"history": [1]}', "history is not a list of objects"),
    (b'{"config": {"Memory": NaN}}', "NaN is no JSON number"),
    (b'{"x": ' + b"[" * 100 + b"]" * 100 + b"}", "nests past"),
], ids=["a Healthcheck's Test twice", "Env of numbers", "Labels a list", "diff_ids a string", "config a list",
        "history of numbers", "NaN", "nested 100 deep"])
def test_a_base_config_the_build_would_misread_or_crash_on_is_refused(config, why):
    """The Healthcheck's two Test keys: Go read the last ("true") from the base; written back in
    canonical order "test" comes last, and Go read "/evil" from our signed image. The rest ended in a
    traceback while the config was derived, or in a config Go's decoder refuses (NaN)."""
    with pytest.raises(IntegrityError, match=why):
        _derived(config)


@pytest.mark.parametrize("value", ["RUN x", False, 0, "", {}, [1]],
                         ids=["a string", "false", "zero", "an empty string", "an object", "a list of numbers"])
def test_a_base_config_whose_onbuild_go_cannot_read_is_refused(value):
    """Go's decoder refuses an OnBuild that is no list of strings: passed on, no engine would load
    our image."""
    with pytest.raises(IntegrityError, match="OnBuild is not a list of strings"):
        _derived({"config": {"OnBuild": value}})


def test_a_base_with_onbuild_triggers_is_no_base_to_derive_from():
    """Triggers run in a build FROM the base (tests/test_engines.py has Docker show it, and the
    build refuse such a base where it opens it); none, null or empty, is a base like any other."""
    from bakery.base.spec import without_triggers

    def config(run) -> bytes:
        return json.dumps({"config": run, "rootfs": {"type": "layers", "diff_ids": []}}).encode()

    with pytest.raises(IntegrityError, match="ONBUILD triggers"):
        without_triggers(_base_of_config(config({"OnBuild": ["LABEL onbuild=ran"]})))
    nothing: tuple[dict | None, ...] = ({}, {"OnBuild": None}, {"OnBuild": []}, None)
    for run in nothing:
        assert without_triggers(_base_of_config(config(run))).config_bytes == config(run)


def test_a_base_config_go_reads_as_empty_or_as_docker_writes_it_is_taken():
    """A null config, a rootfs without diff_ids (moby leaves an empty one out), a Cmd given as one
    string (Docker's strslice takes it), labels differing only in case (a map): all read, derived."""
    assert _derived({"config": None})["config"]["Entrypoint"] == ["/bin/true"]
    assert _derived({"rootfs": {"type": "layers"}})["rootfs"] == {"type": "layers", "diff_ids": []}
    assert _derived({"config": {"Cmd": "bash", "Labels": {"a": "1", "A": "2"}}})["config"]["Labels"] == \
        {"a": "1", "A": "2"}


@pytest.mark.parametrize("body", [b'{"a": NaN}', b'{"a": -Infinity}', b'{"a": 1e400}', b'{"a": [-1.5e999]}'],
                         ids=["NaN", "-Infinity", "1e400", "-1.5e999 in a list"])
def test_a_go_document_with_a_number_go_cannot_read_is_refused(body):
    """Go's decoder refuses NaN and Infinity, and a number past a float64; Python reads each as a
    float (1e400 as infinity). A manifest, index or config holding one is refused."""
    from bakery.files import go_document

    with pytest.raises(ValueError, match="no JSON number|past a float64"):
        go_document(body, "the manifest", frozenset({"a"}))
    assert go_document(b'{"a": 1.5e300}', "the manifest", frozenset({"a"})) == {"a": 1.5e300}


def test_a_base_config_in_utf16_or_with_a_null_rootfs():
    """UTF-16 (or a BOM) Python's json.loads would guess and Go refuses: refused. A null rootfs Go
    reads as none: derived."""
    with pytest.raises(IntegrityError, match="malformed"):
        _derived(json.dumps({"config": {}}).encode("utf-16"))
    assert _derived({"rootfs": None})["rootfs"] == {"type": "layers", "diff_ids": []}
