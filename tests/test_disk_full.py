"""Issue 40, parts 3 and 4: a full disk under the cache and out/, and two commands at once on one
cache and one registry repository. Each run is a real `invoke` against the real registry; the
small disk is a size-limited tmpfs (root only), pre-filled to leave a chosen number of bytes.

A build here starts from the kernels and proof verdicts of this machine's cache (hip/, proofs/)
and fetches the rest; it writes about 5.7 MiB (files/ 3.4, layers/ 1.6, views/, gzip/, verified/,
out/ 0.25). Each failed run is then run again with the filler gone: it must finish with the digest
of a clean build from the same starting cache, and every entry the runs left must be whole (named
by its own hash, or the same bytes as the clean run's), with no temporary left behind.

Results (`invoke test --sweep` runs every case; * marks the ones in CI's sample, about a minute):

  case                            free left           before the fixes                  now
  ------------------------------  ------------------  --------------------------------  -------------------------------
  build *                         16 KiB, 2, 5 MiB    exit 6, one line naming the       the same; the rerun gives the
                                                      cache entry or out/ blob          clean digest, all entries whole
  build (sweep)                   0 to 4.5 MiB        exit 6 naming cache/files/X       the same, recovered
                                  by 256 KiB
  build (sweep)                   4.75, 5 MiB         exit 6 naming cache/layers/X      the same, recovered
  build (sweep)                   5.25 MiB            exit 6 naming out/blobs/sha256    the same, recovered
  build (sweep)                   5.5 MiB             exit 6 naming out/ (the build     says the image is pushed and
                                                      record), after the tag was pushed tagged (fix 4), recovered
  build (sweep)                   5.75, 6, 8 MiB      builds, the clean digest          the same
  compile, toolchain there *      64 MiB disk         exit 6 in three lines: "Compiler  one line naming cache/hip, and
                                                      said: (stopped: the disk under    what to do (fix 2)
                                                      /out ...)", the sandbox's path
  compile, toolchain to take out  64 MiB toolchains/  exit 6 naming .X.partial-Y, gone  names toolchains/, refused
  *                                                   by then, after ~1 GiB streamed    before any layer (fix 3)
  a write's ENOSPC at the edge *  1 MiB disk          "the disk is full ()": write()    names the folder; BAKERY_CACHE
                                                      sets no file name                 or --out advised (fix 1)
  build, the record not fitting   out/: room for its  exit 6, "nothing was kept", after says the image is pushed and
  *                               blobs only          the image was pushed and tagged   tagged; rerun writes it (fix 4)
  attest, then verify (the sign,  16, 256 KiB         both pass: what they keep in      the same (a verified cache is a
  smoke and promote jobs) *                           verified/ is a saving, skipped    saving), cache whole; with room,
                                                      when it cannot be written         verify passes
  reproduce (the rebuild job),    1, 64 MiB work      1 MiB: exit 6 but "git -c: fatal:  1 MiB: one line naming TMPDIR
  its work folder (sweep; the     folder (TMPDIR)     fetch-pack: invalid index-pack    (fix 5); 64 MiB: one line
  clone's line *)                                     output", no disk named; 64 MiB:   naming TMPDIR, from the broker
                                                      internal error, AF_UNIX path too  (fix 6); with room, the same
                                                      long (the broker's socket under   command reproduces the image
                                                      the long TMPDIR)
  two builds, one cache, one tag  -                   both exit 0, the clean digest,    the same: no lock needed
  *                                                   the tag names it, cache whole
  two builds compiling (sweep)    -                   the same                          the same
  a build and `track --no-bump`   -                   both exit 0; the tag and every    the same
  into one repository *                               mirrored digest there

Fixes, each with the test here that fails without it:
  1. files.atomic_file/atomic_dir name the folder on ENOSPC/EDQUOT; errors.disk_full words it
     (test_a_write_that_fills_the_disk_names_its_folder).
  2. hip_compile._compile checks the 1 GiB its watch keeps free before and after the sandbox runs
     (test_a_compile_on_a_full_disk_says_where_in_one_line).
  3. extract.keep_free: the toolchain store refused before streaming, named by its cache folder
     (test_the_toolchain_store_on_a_full_disk_names_the_cache_not_its_work_folder).
  4. build: a record that cannot be written after the push says what was pushed and tagged.
  5. reproduce's git: ENOSPC anywhere in git's output names the disk, not git's last line
     (test_a_rebuilds_clone_on_a_full_disk_names_the_disk).
  6. the broker's socket is bound and reached through its folder's descriptor past AF_UNIX's 107
     bytes (test_rebuild_sandbox's test_the_broker_answers_in_a_work_folder_past_af_unix_path_limit);
     its compile, in TMPDIR, checks the room it keeps free, and a full disk it meets is the
     rebuild's own error, whatever the revision's code makes of the refusal (the sweep here).
A failed build may leave a view (views/) with fewer paths than a whole build's: each path it
holds is resolved alike, and the rerun adds the rest (assert_whole checks exactly that).

At 5.5 MiB the build record is the write that fails, after the image was pushed and tagged: its
line said "nothing was kept", as if nothing was pushed; it now says the image is pushed and tagged
and that the same build again writes the record (fix 4,
test_a_build_whose_record_does_not_fit_says_the_image_is_pushed_and_tagged).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from bakery.errors import foreign
from bakery.files import atomic_dir, atomic_file
from bakery.oci.refs import Reference
from bakery.oci.registry import Registry
from support import copy_project, dev_policy, invoke, last_line, tags
from test_attest import PASSWORD

CACHE = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
TEMPORARY = (".partial-", ".part-")  # what atomic_file/atomic_dir and the toolchain store write before the rename

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small disk needs root")


def one_clear_line(result) -> str:
    """The failure as the user sees it: one `error:` line, nothing after it, no traceback."""
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert result.stderr.rstrip().endswith(errors[0]), result.stderr  # not followed by a log's lines
    return errors[0]


# -- the small disk ---------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path, request):
    """mount(size_mib) -> a fresh tmpfs of that size; each is unmounted when the test ends."""
    mounted = []

    def mount(size_mib: int, name: str = "disk") -> Path:
        where = tmp_path / name
        where.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}M", "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    def unmount():
        for where in reversed(mounted):
            subprocess.run(["umount", "-R", str(where)], check=True)

    request.addfinalizer(unmount)
    return mount


def fill(disk: Path, leave: int) -> Path:
    """A file that takes all of the disk's free space but `leave` bytes."""
    filler = disk / "filler"
    left = shutil.disk_usage(disk).free - leave
    with open(filler, "wb") as f:
        while left > 0:
            n = min(left, 1 << 20)
            f.write(b"\0" * n)
            left -= n
    return filler


# -- the clean build every failed one is compared with ---------------------------------------------

@dataclass(frozen=True)
class Clean:
    project: Path
    seed: Path  # the starting cache: this machine's kernels and proof verdicts
    cache: Path  # the seed after a clean build
    out: Path  # its out/
    digest: str  # sha256:HEX of the image it built


def digest_of(result) -> str:
    return last_line(result).rpartition("@")[2]


@pytest.fixture(scope="module")
def clean(tmp_path_factory, registry, fixture_base, fixture_lock) -> Clean:
    where = tmp_path_factory.mktemp("disk-clean")
    project = copy_project(where / "project", fixture_lock)
    # the machine's cache gets the kernels compiled and the overlays proven, once (warm: seconds)
    warm = invoke(project, "build", "--base", str(fixture_base))
    assert warm.returncode == 0, warm.stderr
    seed = where / "seed"
    for part in ("hip", "proofs"):
        shutil.copytree(CACHE / part, seed / part)
    cache = where / "cache"
    shutil.copytree(seed, cache)
    done = invoke(project, "build", "--base", str(fixture_base), "--push", f"{registry}/disk-full/clean:1",
                  "--out", str(where / "out"), env={"BAKERY_CACHE": str(cache)})
    assert done.returncode == 0, done.stderr
    return Clean(project, seed, cache, where / "out", digest_of(done))


def build(clean: Clean, base, cache: Path, out: Path, target: str) -> subprocess.CompletedProcess:
    return invoke(clean.project, "build", "--base", str(base), "--push", target, "--out", str(out),
                  env={"BAKERY_CACHE": str(cache)})


# -- what "no corrupt entry" means -------------------------------------------------------------------

def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def checked_document(path: Path) -> bool:
    """layers/ and views/: a header line with the body's sha256, then the body."""
    header, _, body = path.read_bytes().partition(b"\n")
    return json.loads(header).get("sha256") == sha256(body)


def resolved_alike(view: bytes, clean_view: bytes) -> bool:
    """A view grows as commands resolve paths in an image (a failed build saved it with fewer, a
    track with others): each path and glob both hold must be resolved alike."""
    mine, theirs = (json.loads(d.partition(b"\n")[2]) for d in (view, clean_view))
    return all(theirs[part].get(k, v) == v for part in ("paths", "globs") for k, v in mine[part].items()) and \
        all(mine.get(k) == theirs.get(k) for k in ("diff_ids", "merge_checked") if k in mine and k in theirs)


def assert_whole(cache: Path, out: Path | None, clean: Clean, only_builds: bool = True) -> None:
    """Every entry a later run would read is whole: no temporary left, each content-addressed file
    hashes to its name, each checked document matches its checksum, each compile entry its record,
    each view agrees with the clean build's, and (where only builds wrote the cache) each other file
    the clean build's cache also has holds the same bytes. Another command (track) indexes the same
    layers with more in them, which only their checksum can judge."""
    broken = []
    for root in [cache] + ([out] if out and out.exists() else []):
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if any(t in part for part in rel.parts for t in TEMPORARY):
                broken.append(f"{path}: a temporary left behind")
                continue
            if not path.is_file() or rel.parts[0] == "toolchains":
                continue
            data = path.read_bytes()
            kind = rel.parts[0]
            if kind == "files" or (root == out and kind == "blobs"):
                ok = sha256(data) == path.name
            elif kind in ("layers", "views"):
                ok = checked_document(path)
            elif kind == "gzip":
                ok = sha256(gzip.decompress(data)) == path.name.removesuffix(".gz")
            elif kind == "verified" and rel.parts[1] in ("documents", "manifests"):
                ok = sha256(data) == path.name.rpartition(".")[2]
            elif kind == "hip" and path.name == "done.json":
                ok = all(sha256((path.parent / n).read_bytes()) == s for n, s in json.loads(data)["sha256"].items())
            elif root == out and path.name == "build-record.json":
                ok = isinstance(json.loads(data), dict)
            else:
                ok = True
            twin = clean.cache / rel
            if root == cache and twin.is_file():
                if kind == "views":
                    ok = ok and resolved_alike(data, twin.read_bytes())
                elif (kind != "layers" or only_builds) and twin.read_bytes() != data:
                    ok = False
            if not ok:
                broken.append(f"{path}: not whole")
    for entry in (cache / "hip").iterdir() if (cache / "hip").exists() else ():
        if not (entry / "done.json").exists():
            broken.append(f"{entry}: a compile entry without its record")
    assert not broken, broken


def assert_tagged(registry: str, target: str, digest: str) -> None:
    """The tag names the digest the build printed, by the registry's own answer."""
    ref = Reference.parse(target)
    assert ref.tag and tags(registry, ref.repository).get(ref.tag) == digest


# -- A: a full disk ----------------------------------------------------------------------------------

def run_on_full_disk(small_disk, clean, registry, fixture_base, leave: int) -> tuple:
    """A build with its cache and out/ on a disk with `leave` bytes free: what it did, and then the
    same build again with the space freed (which must finish as a clean build did)."""
    disk = small_disk(32)
    cache, out = disk / "cache", disk / "out"
    shutil.copytree(clean.seed, cache)
    filler = fill(disk, leave)
    target = f"{registry}/disk-full/left-{leave}:1"
    first = build(clean, fixture_base, cache, out, target)
    assert_whole(cache, out, clean)
    filler.unlink()
    again = build(clean, fixture_base, cache, out, target)
    assert again.returncode == 0, again.stderr
    assert digest_of(again) == clean.digest
    assert_tagged(registry, target, clean.digest)
    assert_whole(cache, out, clean)
    return disk, first


@pytest.mark.parametrize("leave", [16 << 10, 2 << 20, 5 << 20], ids=["16KiB", "2MiB", "5MiB"])
def test_a_build_on_a_full_disk_says_where_in_one_line_and_the_rerun_finishes(small_disk, clean, registry,
                                                                              fixture_base, leave):
    disk, first = run_on_full_disk(small_disk, clean, registry, fixture_base, leave)
    line = one_clear_line(first)
    assert first.returncode == 6 and str(disk) in line, line


SWEEP = [n << 18 for n in range(24)] + [6 << 20, 8 << 20]  # every 256 KiB to 5.75 MiB, then past the need


@pytest.mark.sweep
@pytest.mark.parametrize("leave", SWEEP, ids=[f"{n >> 10}KiB" for n in SWEEP])
def test_sweep_a_build_at_every_fill_level(small_disk, clean, registry, fixture_base, leave):
    """Each level either builds (the digest of the clean build) or fails in one line naming the disk;
    either way the rerun finishes and the cache is whole."""
    disk, first = run_on_full_disk(small_disk, clean, registry, fixture_base, leave)
    if first.returncode != 0:
        line = one_clear_line(first)
        assert first.returncode == 6 and str(disk) in line, line
    else:
        assert digest_of(first) == clean.digest
    print(f"{leave >> 10} KiB free: exit {first.returncode}", *first.stderr.splitlines()[-1:])  # for the table (-rA)


def test_a_build_whose_record_does_not_fit_says_the_image_is_pushed_and_tagged(small_disk, clean, registry,
                                                                                fixture_base, tmp_path):
    """out/ on a disk with room for its blobs but not the build record: the record is the one write
    after the push, so the line says the image is out there and tagged, and the rerun writes it."""
    page = 4096
    blobs = sum(-(-p.stat().st_size // page) * page for p in (clean.out / "blobs").rglob("*") if p.is_file())
    record = (clean.out / "build-record.json").stat().st_size
    assert record > 2 * page, "the record must need more pages than the room left after the blobs"
    disk = small_disk(4)
    out = disk / "out"
    filler = fill(disk, blobs + page)
    cache = tmp_path / "cache"
    shutil.copytree(clean.seed, cache)
    target = f"{registry}/disk-full/record:1"
    first = build(clean, fixture_base, cache, out, target)
    line = one_clear_line(first)
    assert first.returncode == 6 and str(out) in line, line
    assert f"@{clean.digest} is pushed and tagged 1" in line and "run the same build again" in line.lower(), line
    assert_tagged(registry, target, clean.digest)
    assert not (out / "build-record.json").exists()
    filler.unlink()
    again = build(clean, fixture_base, cache, out, target)
    assert again.returncode == 0 and digest_of(again) == clean.digest, again.stderr
    assert json.loads((out / "build-record.json").read_text())["outputs"][0]["reference"].endswith(clean.digest)


# -- the release workflow's other jobs, as their steps run them ----------------------------------------

def passed_or_said_where(result, disk: Path) -> bool:
    """A job on a full disk either did its work (what it keeps in the cache is only a saving) or
    failed in one line naming the disk, exit 6: True when it passed."""
    if result.returncode == 0:
        return True
    line = one_clear_line(result)
    assert result.returncode == 6 and str(disk) in line, line
    return False


@pytest.fixture(scope="module")
def release_keys(clean, tmp_path_factory) -> Path:
    where = tmp_path_factory.mktemp("disk-keys")
    made = invoke(clean.project, "keygen", "--out", str(where), env=PASSWORD)
    assert made.returncode == 0, made.stderr
    return where


@pytest.mark.parametrize("leave", [16 << 10, 256 << 10], ids=["16KiB", "256KiB"])
def test_the_sign_job_and_verify_on_a_full_disk_pass_or_say_where_and_then_pass(small_disk, clean, release_keys,
                                                                                 registry, fixture_base, tmp_path,
                                                                                 leave):
    """The sign job (`invoke attest`) and each verify (the smoke and promote jobs run one) with their
    cache on a full disk: each passes or says where in one line; with room again, attest (when it
    failed) and verify pass, and the cache holds nothing that is not whole."""
    disk = small_disk(2)
    cache = disk / "cache"
    filler = fill(disk, leave)
    image = f"{registry}/disk-full/clean@{clean.digest}"
    env = {**PASSWORD, "BAKERY_CACHE": str(cache)}
    attest = ("attest", image, "--record", str(clean.out / "build-record.json"), "--key",
              str(release_keys / "release.key"))
    verify = ("verify", image, "--key", str(release_keys / "release.pub"), "--policy",
              str(dev_policy(tmp_path / "policy.yaml", fixture_base)))
    first = invoke(clean.project, *attest, env=env)
    attested = passed_or_said_where(first, disk)
    if attested:
        first = invoke(clean.project, *verify, env=env)
        passed_or_said_where(first, disk)
    print(f"{leave >> 10} KiB free: attest exit {0 if attested else first.returncode}, then verify exit "
          f"{first.returncode if attested else '-'}", *first.stderr.splitlines()[-1:])  # for the table (-rA)
    filler.unlink()
    if not attested:
        again = invoke(clean.project, *attest, env=env)
        assert again.returncode == 0, again.stderr
    checked = invoke(clean.project, *verify, env=env)
    assert checked.returncode == 0 and f"verified {image}" in checked.stdout, checked.stdout + checked.stderr
    assert_whole(cache, None, clean, only_builds=False)


@pytest.mark.sweep
@pytest.mark.parametrize("size_mib", [1, 64])
def test_sweep_the_rebuild_job_on_a_small_disk(small_disk, clean, release_keys, registry, fixture_base,
                                               fixture_lock, tmp_path, size_mib):
    """The rebuild job (`invoke reproduce --outcome`) with its work folder on a small disk (the
    clone, then the build's cache and layout fill it): one line naming the disk, exit 6; with room,
    the same command reproduces the image byte for byte."""
    import test_reproduce

    setup = {"project": copy_project(tmp_path / "project", fixture_lock),
             "root": tmp_path, "registry": registry, "base": fixture_base,
             "key": release_keys / "release.key", "pub": release_keys / "release.pub",
             "policy": dev_policy(tmp_path / "policy.yaml", fixture_base)}
    project = setup["project"]
    subprocess.run(["git", "-C", str(project), "remote", "remove", "origin"], capture_output=True)
    test_reproduce.git(project, "remote", "add", "origin", str(project))
    test_reproduce.git(project, "add", "-A")
    test_reproduce.git(project, "commit", "-q", "--allow-empty", "-m", "release")
    ref = test_reproduce.release(setup, f"disk-{size_mib}", 1700000300)
    disk = small_disk(size_mib)
    args = ("reproduce", ref, "--release-key", str(setup["pub"]), "--policy", str(setup["policy"]),
            "--outcome", str(tmp_path / "outcome.json"))
    first = invoke(project, *args, env={"TMPDIR": str(disk)})
    assert first.returncode != 0 and not passed_or_said_where(first, disk)
    assert f"at {disk}:" in first.stderr or f"at {disk} (" in first.stderr  # TMPDIR, not a folder gone by now
    assert not any(disk.iterdir()), sorted(disk.iterdir())  # the work folder goes with the failure
    again = invoke(project, *args, env={"TMPDIR": str(tmp_path)})
    assert again.returncode == 0 and "byte-identical" in again.stdout, again.stdout + again.stderr
    print(f"{size_mib} MiB: {last_line(first) if first.stdout else first.stderr.splitlines()[-1]}")


def test_a_rebuilds_clone_on_a_full_disk_names_the_disk(small_disk, tmp_path):
    """git's last line on a full disk is fetch-pack's "invalid index-pack output" (its index-pack
    died on ENOSPC): the rebuild said only that, naming no disk (found by the sweep below)."""
    from bakery.errors import EnvironmentProblem
    from bakery.release import reproduce

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "big").write_bytes(os.urandom(2 << 20))  # more than the disk holds, and not compressible
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "r"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    disk = small_disk(1)
    with pytest.raises(EnvironmentProblem) as failed:  # file:// as a remote would be: a pack, not a copy
        reproduce._git("-c", "protocol.file.allow=always", "clone", "-q", "--no-checkout", "--", f"file://{repo}",
                       str(disk / "work" / "source"), writes=disk)
    assert str(failed.value).startswith(f"the disk is full at {disk} (git clone: No space left on device)"), failed.value


@pytest.fixture
def toolchain_files(toolchain):
    """The toolchain's files in this machine's cache (taken out once; a compile reads them)."""
    from bakery.inputs import hip, hip_compile
    from support import ROOT

    root = hip_compile.toolchain_files(Reference.parse_pinned(toolchain), hip.load(ROOT / "hip").toolchain, CACHE / "toolchains", log=lambda m: None)
    return root.path.parent.parent


def test_a_compile_on_a_full_disk_says_where_in_one_line(small_disk, clean, toolchain_files):
    """The compile's /out lies in the cache (hip/), watched to keep 1 GiB free: on a disk with less,
    one line naming the cache's folder, not the compiler's log about the sandbox's /out."""
    disk = small_disk(64)
    cache = disk / "cache"
    (cache / "toolchains").mkdir(parents=True)
    # the toolchain's files stay on the big disk, read-only: only the compile's outputs land here
    subprocess.run(["mount", "--bind", "-o", "ro", str(toolchain_files), str(cache / "toolchains")], check=True)
    result = invoke(clean.project, "compile", env={"BAKERY_CACHE": str(cache)})
    line = one_clear_line(result)
    assert result.returncode == 6 and f"{cache / 'hip'}" in line and "/out" not in line, line
    assert not (cache / "hip").exists() or not any((cache / "hip").iterdir())


def test_the_toolchain_store_on_a_full_disk_names_the_cache_not_its_work_folder(small_disk, clean, toolchain,
                                                                                tmp_path):
    """The toolchain's files need 1 GiB free besides themselves: refused before its layers are
    streamed, naming the store (toolchains/ on a small disk of its own here, the compile's outputs
    on the big one), not the work folder made and removed inside it."""
    cache = tmp_path / "cache"
    store = small_disk(64, "cache/toolchains")
    result = invoke(clean.project, "compile", env={"BAKERY_CACHE": str(cache)})
    line = one_clear_line(result)
    assert result.returncode == 6 and f"{cache / 'toolchains'}:" in line and ".partial" not in line, line
    assert "layer " not in result.stderr  # nothing streamed
    assert not list(store.iterdir())


@pytest.mark.parametrize("writer", ["atomic_file", "atomic_dir"])
def test_a_write_that_fills_the_disk_names_its_folder(small_disk, writer):
    """write() sets no file name on ENOSPC: the error the edge shows must still say which folder's
    disk is full (and, being no cache's, to write elsewhere)."""
    disk = small_disk(1)
    folder = disk / "out" / "blobs"
    with pytest.raises(OSError) as caught:
        if writer == "atomic_file":
            with atomic_file(folder / "big") as f:
                f.write(b"\0" * (2 << 20))
        else:
            with atomic_dir(folder / "tree") as staging:
                (staging / "big").write_bytes(b"\0" * (2 << 20))
    said = str(foreign(caught.value))
    assert f"the disk is full at {folder} " in said and "--out" in said, said
    assert [p.name for p in folder.iterdir()] == []  # nothing half-written stays


# -- B: two at once -----------------------------------------------------------------------------------

def start_build(clean, base, cache: Path, out: Path, target: str, extra_env=None) -> subprocess.Popen:
    import sys

    return subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(clean.project), "build", "--base",
                             str(base), "--push", target, "--out", str(out)], cwd=clean.project,
                            env={**os.environ, "BAKERY_CACHE": str(cache), **(extra_env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = proc.communicate(timeout=900)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def two_builds_at_once(clean, registry, fixture_base, cache: Path, where: Path, repo: str) -> None:
    target = f"{registry}/{repo}:same"
    both = [finish(p) for p in [start_build(clean, fixture_base, cache, where / f"out{i}", target) for i in (1, 2)]]
    for done in both:
        assert done.returncode == 0, done.stderr
        assert digest_of(done) == clean.digest
        assert "warning" not in done.stderr, done.stderr
    assert_tagged(registry, target, clean.digest)
    for i in (1, 2):
        assert_whole(cache, where / f"out{i}", clean)


def test_two_builds_on_one_cache_and_one_tag_both_finish_alike(clean, registry, fixture_base, tmp_path):
    """Both start from the same cold cache (kernels and verdicts only), so both fetch and write the
    same entries at the same time."""
    cache = tmp_path / "cache"
    shutil.copytree(clean.seed, cache)
    two_builds_at_once(clean, registry, fixture_base, cache, tmp_path, "concurrent/builds")


@pytest.mark.sweep
def test_sweep_two_builds_compiling_at_once(clean, registry, fixture_base, tmp_path, toolchain_files):
    """Both compile hip/ into the same entry (a minute each, on the machine's two cores at once)."""
    cache = tmp_path / "cache"
    shutil.copytree(clean.seed / "proofs", cache / "proofs")
    (cache / "toolchains").mkdir()
    subprocess.run(["mount", "--bind", "-o", "ro", str(toolchain_files), str(cache / "toolchains")], check=True)
    try:
        two_builds_at_once(clean, registry, fixture_base, cache, tmp_path, "concurrent/compiling")
    finally:
        subprocess.run(["umount", str(cache / "toolchains")], check=True)


def test_a_build_and_track_into_one_repository_at_once(clean, registry, fixture_base, fixture_base_027,
                                                       tmp_path):
    """`invoke track --no-bump` mirrors the nightlies into the repository the build pushes to, on
    the same cache: both finish, and the repository holds the build's tag and every mirrored digest."""
    import uuid

    from bakery.dev.rehearse_nightly import tag_image

    reg = Registry(registry)
    name = f"{registry}/both-{uuid.uuid4().hex[:8]}"
    upstream, shared = Reference.parse(f"{name}/vllm-openai-rocm"), Reference.parse(f"{name}/shared")
    nightlies = [tag_image(reg, fixture_base, upstream.with_tag("nightly-a")),
                 tag_image(reg, fixture_base_027, upstream.with_tag("nightly-b"))]
    tracker = copy_project(tmp_path / "tracker")
    (tracker / "image" / "base.yaml").write_text(f"image: {fixture_base}\nplatform: linux/amd64\nmirror: null\n")
    cache = tmp_path / "cache"
    shutil.copytree(clean.seed, cache)
    import sys

    track = subprocess.Popen([sys.executable, "-m", "invoke", "--search-root", str(tracker), "track", "--from",
                              upstream.name, "--mirror", shared.name, "--tags", "*", "--no-bump"], cwd=tracker,
                             env={**os.environ, "BAKERY_CACHE": str(cache)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    target = f"{shared.name}:built"
    built = finish(start_build(clean, fixture_base, cache, tmp_path / "out", target))
    tracked = finish(track)
    assert tracked.returncode == 0, tracked.stdout + tracked.stderr
    assert built.returncode == 0, built.stderr
    assert digest_of(built) == clean.digest
    assert_tagged(registry, target, clean.digest)
    for digest in nightlies:
        assert reg.manifest_exists(shared.repository, digest)
    assert_whole(cache, tmp_path / "out", clean, only_builds=False)
