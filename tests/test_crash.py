"""Crash safety, part 1 of issue 40: a command stopped dead (SIGKILL) at a point it counts itself,
then run again as a user would.

A point (bakery/crashpoint.py) is a write about to take, or having taken, its name in a cache or
out/, and each registry answer. A clean run with BAKERY_CRASH_TRACE lists them; each killed run sets
BAKERY_CRASH_AT. Checked after every kill, against a clean run from the same start (written
independently of the code under test: byte comparison of folders and the registry's own answers):
- the cache holds nothing a clean run would not have written, byte for byte (a half-made entry
  under its real name would show; leftovers under a temporary name are listed, never read);
- no tag points anywhere a clean run would not have pointed it;
- running the command again succeeds with the clean run's digest and build record;
- for attest: `invoke verify` refuses every state a kill leaves short of the whole attestation.

What was killed, and what it found (this 2-core machine; `invoke test --sweep` for all; build,
attest and lock 2026-12-03, the rest 2026-12-04; each sweep run once, its time as it ran):

  command   points in a clean run          killed at                               outcome
  build     171 (27 kinds: cache writes,   CI: 2 (a cache folder about to take     rerun: clean digest and record, cache
            out/ blobs, registry answers)  its name; the image manifest stored,    and tags as a clean run's
                                           its tag not); sweep: 41 (first and
                                           last of each kind)
  attest    36 (26 up to the image's .att)  CI: the 4 manifests it stores;          verify refuses after the signature
            (counted before bundles; now   sweep: each of the 26                   alone; passes from the .att on; rerun
            each bundle adds a referrer    (since bundles: CI kills at 7 of the    passes (since bundles: passes from
            manifest and its fallback-tag  16 manifest writes: the first, the      the last bundle listed on, where one
            index, by digest and by tag)   last two bundle writes, the tags' 4)    format is whole; verify reads either)
  mirror    10 (the base's manifest, a     sweep: all 10, each reached (a run      no tag; rerun: the same digest
            HEAD and a mount per blob,     from the same start counts the same     (10 of 10, 24 s)
            the manifest by digest)        10: none ends first, none skipped)
  lock      per proof and view written     sweep: every point                      overlays.lock old or new, never part
  compile   22 cold (the toolchain's       CI: 1, from the clean build's hip/      each hip/ entry whole or absent, no
  --registry manifest and config kept,     (nothing compiled): its 4 blobs         kernels- tag but the clean one; rerun:
            hip/ filled, 4 blobs, the      pushed, its tag not; sweep: all 22,     the clean outputs, cache and tag
            kernels- tag)                  each compile cold (22 of 22, 17 min)
  promote   13 (verify's 8 reads, the      CI: 2 (the manifest stored by digest,   the tag names the old image or the
            smoke ledger, the manifest     then the tag); sweep: all 13 (13 of     promoted digest, no other tag moves;
            by digest, then the tag)       13, 15 s)                               rerun promotes
  track     78 (tags resolved, two         CI: 1 (the new lock, the old pin);      found, below; now each file as
  and bump  nightlies mirrored, views and  sweep: all 78 (78 of 78, 10 min, after  before, as track leaves it before its
            documents kept, the ledger;                                            bump, or as a clean run leaves it;
            the bump's views, ledger,                                              rerun: the clean ledger, lock,
            stock, lock, the pin, then      the pinning mark's two fixes)          base.yaml, overlays and tags
            the ledger's mark cleared)
  reproduce 23 (verify's reads, the        sweep: 16 (first and last of each       found, below; now the outcome absent
  --outcome broker's base and toolchain    kind), the same command run again       or the clean one; rerun: the clean
            reads, the outcome)            (16 of 16, 23 min)                      outcome
  prune     each delete and the second     CI: 1 (the third delete, on a month     every release whole (its signature,
  --apply   listing, past the plan's       and a real release: test_prune.py);     signed provenance, blobs, kernel
            reads (2026-12-06)             sweep: every one, a month of its own    artifact, base); rerun finishes, a
                                           each (test_prune.py, 160 s)             third run has nothing to delete

Found and fixed: a kill while a folder was being filled (a toolchain's is gigabytes) or a file
written left its staging name for good; the next writer now removes one no live process holds
(tests/test_files.py). A bump killed after it moved the pin, before its ledger, made the next run
say nothing new and record no try; killed after its lock (or the patches it ports), the next run
recorded other statuses (ported (exact) for (offset)): it now records its outcome before the
checkout changes, marked `pinning` until the pin has moved, and the next bump finishes one so
marked (test_a_bump_killed_between_its_lock_and_its_pin_is_finished_when_run_again; the mark,
added after review, keeps a nightly pinned and rolled back by hand from being bumped again,
test_track.py; the sweep then found two more: killed after the pin, before the mark was cleared,
the next run said nothing new, so the marked pin is finished first; killed while writing a port,
its .partial- file made overlays.yaml refuse to load, so readers of ports/ and stock/ pass over a
writer's staging names). `invoke reproduce --workdir` killed (or failed) after its clone left source/ there,
and the same command then failed at once (git would not clone into it; its line said `git -c`): it
now removes the source/ and build/ a rebuild left (its mark in the folder) first
(test_reproduce.py). reproduce without --workdir, killed, left its temporary folder (the clone and a
layout of the base's layers) for good: it is locked while it runs and the next reproduce removes it
(test_reproduce.py's clean_rebuilds). Found in the tests, not the code: a record after a rerun differs
from a clean run's only in what it says of the run (when, what its push moved, whether a kernel or
verdict came from the cache a killed run filled), so those fields are left out of the comparison
(RUN_ONLY, same_image), and a proof's cache entry says how long its run took (PROOF_RUN_ONLY: a
sweep on a machine whose proofs were warm never saw it; CI's cold one did); an image view a kill leaves is whole but may hold fewer paths (grown_view);
a verified document is named by the repository it was read from (read_from: each track run its own
mirror); test_caches wrote two poisoned entries in place, through every hard link of the machine's
cache, a sweep's start included (it now replaces them).
Not covered here: the rebuild inside reproduce (another process, in the sandbox: the kill takes it
with the group, and its own points are not counted); reproduce --attest (the workflow signs the
outcome elsewhere, with attest-rebuild; both attach as attest does, whose points are swept above).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from bakery.errors import BUMPED, NOTHING_NEW
from support import copy_project, dev_policy, last_line, passing_report, tags

TEMPORARY = re.compile(r"^\..*\.?part(ial)?-")  # a name a writer fills before the rename that makes it real


def run(project: Path, *args: str, env: dict, crash_at: int | None = None, trace: Path | None = None):
    """`invoke ARGS` in a session of its own (a kill takes its sandboxes too, as a lost runner does)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("BAKERY_CRASH_")}
    full.update(env)
    if crash_at is not None:
        full["BAKERY_CRASH_AT"] = str(crash_at)
    if trace is not None:
        full["BAKERY_CRASH_TRACE"] = str(trace)
    return subprocess.run([sys.executable, "-m", "invoke", "--search-root", str(project), *args], cwd=project,
                          env=full, capture_output=True, text=True, timeout=900, start_new_session=True)


def points(project: Path, *args: str, env: dict, trace: Path, code: int = 0) -> tuple[subprocess.CompletedProcess, list[str]]:
    done = run(project, *args, env=env, trace=trace)
    assert done.returncode == code, done.stderr
    return done, [line.split("\t", 1)[1] for line in trace.read_text().splitlines()]


def snapshot(folder: Path, start: Path | None = None) -> dict[str, str]:
    """Every file under folder by relative name: the sha256 of its bytes (a link: where it points);
    "as at the start" for a file still the very one (the same inode) it was hard-linked from."""
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*")) if folder.exists() else ():
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink():
            found[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            origin = start / rel if start else None
            if origin and origin.exists() and origin.stat().st_ino == path.stat().st_ino:
                found[rel] = "as at the start"
            elif re.fullmatch(r"proofs/[0-9a-f]{64}\.json", rel):
                found[rel] = proof_entry(path.read_bytes())
            else:
                found[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


PROOF_RUN_ONLY = {"seconds"}  # how long this run's proof took: a rerun's entry is as good with another


def proof_entry(data: bytes) -> str:
    """A proof's cache entry, less what only says how its run went; bytes that are no whole entry
    stay themselves (and so differ from any clean run's)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return hashlib.sha256(data).hexdigest()
    if not isinstance(doc, dict):
        return hashlib.sha256(data).hexdigest()
    kept = {k: v for k, v in doc.items() if k not in PROOF_RUN_ONLY}
    return "proof " + hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()


def real_entries(found: dict) -> dict:
    return {k: v for k, v in found.items() if not any(TEMPORARY.match(part) for part in k.split("/"))}


def temporaries(folder: Path) -> list[Path]:
    """Staging names under folder (not below one: a staging folder goes as a whole)."""
    found = []
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            if TEMPORARY.match(name):
                found.append(Path(root) / name)
        dirs[:] = [d for d in dirs if not TEMPORARY.match(d)]
    return found


def not_in(clean: dict, found: dict) -> list[str]:
    """Names in found that a clean run did not write with these bytes."""
    return sorted(k for k, v in real_entries(found).items() if clean.get(k) != v)


MACHINE_CACHE = Path(os.environ.get("BAKERY_CACHE", Path.home() / ".cache" / "bakery"))
WARM = ("toolchains", "layers", "files", "proofs", "blobs")  # kept: what the sample does not cover costs minutes


def linked_copy(src: Path, dest: Path, parts=None) -> Path:
    """Hard links: every writer replaces a name, never writes in place, so the source stays as it was."""
    dest.mkdir(parents=True)
    for part in parts or [p.name for p in src.iterdir()]:
        if (src / part).exists():
            subprocess.run(["cp", "-al", str(src / part), str(dest / part)], check=True)
    return dest


def grown_view(found: bytes, clean: bytes) -> bool:
    """An image view is rewritten as a build resolves more in it: one a kill leaves may hold less
    than a clean run's, but must be whole (its header's sha256 is its body's) and hold nothing else."""
    def read(data):
        header, _, body = data.partition(b"\n")
        return json.loads(header), hashlib.sha256(body).hexdigest(), json.loads(body)

    (said, digest, view), (_, _, final) = read(found), read(clean)
    return said.get("sha256") == digest and all(
        view[part].items() <= final[part].items() for part in ("paths", "globs"))


ACCEPT = ", ".join(("application/vnd.oci.image.manifest.v1+json", "application/vnd.oci.image.index.v1+json",
                    "application/vnd.docker.distribution.manifest.v2+json"))


def kinds(seen: list[str]) -> dict[str, list[int]]:
    """The points by kind (digests, upload ids and temporary names made alike): their 1-based numbers."""
    found: dict[str, list[int]] = {}
    for number, what in enumerate(seen, 1):
        kind = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}", "UPLOAD", re.sub(r"[0-9a-f]{24,64}", "HEX", what))
        found.setdefault(re.sub(r"/tmp/\S*?/(cache|project)/", r"\1/", kind), []).append(number)
    return found


def spread(seen: list[str]) -> list[int]:
    """The first and the last point of each kind: every kind of step, at its start and its end."""
    return sorted({n for numbers in kinds(seen).values() for n in (numbers[0], numbers[-1])})


# -- build ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ground(fixture_base, fixture_lock, registry, tmp_path_factory):
    """What every scene starts from: a checkout, warm base caches (no compile outputs, views or
    verified documents), the fixture base, a repository prefix of its own."""
    root = tmp_path_factory.mktemp("crash")
    return {"root": root, "start": linked_copy(MACHINE_CACHE, root / "start", WARM),  # private: other runs may replace the machine's
            "project": copy_project(root / "project", fixture_lock), "registry": registry, "base": str(fixture_base),
            "prefix": f"crash/{uuid.uuid4().hex[:8]}"}


@pytest.fixture(scope="module")
def build_scene(ground):
    """A clean build from the ground's start, pushed to an empty repository, with its trace: the
    reference every kill is held to."""
    scene = {**ground}
    root, start, project = scene["root"], scene["start"], scene["project"]
    cache = linked_copy(start, root / "clean-cache")
    done, seen = points(project, *build_args(scene, "clean"), env={"BAKERY_CACHE": str(cache)},
                        trace=root / "trace")
    scene.update(views={p.name: p.read_bytes() for p in (cache / "views").iterdir()}, seen=seen, digest=last_line(done).split("@", 1)[1], cache=snapshot(cache, start),
                 clean_cache=cache,
                 out=snapshot(project / "out"), record=(project / "out" / "build-record.json").read_text(),
                 tags=tags(scene["registry"], f"{scene['prefix']}/clean"))
    return scene


def build_args(scene, name: str) -> tuple[str, ...]:
    return ("build", "--base", scene["base"], "--push", f"{scene['registry']}/{scene['prefix']}/{name}:1")


# what a record says of the run itself, not of the image: when it ran, what its push moved
RUN_ONLY = {"started", "finished", "push", "layer_downloads"}


def same_image(record: dict) -> dict:
    """A record less what says where this run got a kernel or a verdict (compiled or proven here, or
    taken from the cache a killed run filled): the image's bytes are the same either way."""
    for entry in [record.get("kernels", {}), *record.get("verdicts", [])]:
        entry.pop("origin", None)
    return record


def killed_build_then_again(scene, k: int) -> list[str]:
    """Kill the build at point k, check what it left, build again and check that; what was wrong."""
    name, wrong = f"k{k}", []
    cache = linked_copy(scene["start"], scene["root"] / f"cache-{k}")
    project = scene["project"]
    (project / "out").exists() and subprocess.run(["rm", "-rf", str(project / "out")], check=True)
    env = {"BAKERY_CACHE": str(cache)}
    killed = run(project, *build_args(scene, name), env=env, crash_at=k)
    if killed.returncode != -9:
        return [f"point {k}: exit {killed.returncode}, not killed: {killed.stderr[-300:]}"]
    for where, clean, found in (("cache", scene["cache"], snapshot(cache, scene["start"])),
                                ("out", scene["out"], snapshot(project / "out"))):
        found.pop("build-record.json", None) if where == "out" and "build-record.json" not in clean else None
        wrong += [f"point {k} ({scene['seen'][k - 1]}): {where}/{n} is not what a clean run writes there"
                  for n in not_in(clean, found) if n != "build-record.json" and not (
                      where == "cache" and n.startswith("views/") and n[6:] in scene["views"] and
                      grown_view((cache / n).read_bytes(), scene["views"][n[6:]]))]
    repo = f"{scene['prefix']}/{name}"
    wrong += [f"point {k}: tag {t} -> {d}, a clean run: {scene['tags'].get(t)}"
              for t, d in tags(scene["registry"], repo).items() if scene["tags"].get(t) != d]
    for path in temporaries(cache) + temporaries(project / "out"):  # as if the next run came later
        os.utime(path, (0, 0), follow_symlinks=False)
    again = run(project, *build_args(scene, name), env=env)
    wrong += [f"point {k}: {path} left by the kill is still there after the next run"
              for path in temporaries(cache) + temporaries(project / "out")]
    if again.returncode != 0:
        return wrong + [f"point {k}: the build run again failed: {again.stderr[-300:]}"]
    if last_line(again) != f"{scene['registry']}/{repo}@{scene['digest']}":
        wrong.append(f"point {k}: run again it gave {last_line(again)}, a clean run {scene['digest']}")
    record = (project / "out" / "build-record.json").read_text()
    expected = same_image(json.loads(scene["record"].replace(f"{scene['prefix']}/clean", repo)))
    got = same_image(json.loads(record))
    differ = sorted(key for key in set(expected) | set(got) if key not in RUN_ONLY and expected.get(key) != got.get(key))
    if differ:
        wrong.append(f"point {k}: the build record differs from a clean run's in {differ}: "
                     + "; ".join(f"{key}: {got.get(key)} (clean: {expected.get(key)})"
                                 for key in differ))
    if real_entries(snapshot(cache, scene["start"])) != real_entries(scene["cache"]):
        wrong.append(f"point {k}: the cache after the second run is not a clean run's")
    if tags(scene["registry"], repo) != scene["tags"]:
        wrong.append(f"point {k}: the tags after the second run are not a clean run's")
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    return wrong


SAMPLE = {  # CI's sample: one point of each kind that decides what a later run may trust
    "a cache folder about to take its name": lambda seen: next(i for i, s in enumerate(seen, 1) if s.startswith("fill ")),
    "the image manifest pushed, its tag not yet": lambda seen: next(
        i for i, s in enumerate(seen, 1) if re.match(r"PUT /v2/\S+/manifests/sha256:", s) and "kernels" not in s),
}


@pytest.mark.parametrize("moment", SAMPLE)
def test_a_build_killed_then_run_again_gives_the_clean_digest_and_trusts_nothing_half_made(build_scene, moment):
    wrong = killed_build_then_again(build_scene, SAMPLE[moment](build_scene["seen"]))
    assert wrong == [], "\n".join(wrong)


@pytest.mark.sweep
def test_a_build_killed_at_the_start_and_end_of_each_kind_of_step(build_scene):
    chosen = spread(build_scene["seen"])
    print(f"\n{len(build_scene['seen'])} points, {len(kinds(build_scene['seen']))} kinds, {len(chosen)} killed")
    wrong = [w for k in chosen for w in killed_build_then_again(build_scene, k)]
    assert wrong == []


# -- attest --------------------------------------------------------------------------------------------

PASSWORD = {"BAKERY_KEY_PASSWORD": "crash test password"}


def copy_image(registry: str, src: str, dest: str, digest: str) -> None:
    """The image (manifest and blobs, by mount) into another repository, untagged: a fresh subject."""
    manifest = requests.get(f"http://{registry}/v2/{src}/manifests/{digest}", headers={"Accept": ACCEPT}, timeout=30)
    manifest.raise_for_status()
    body = json.loads(manifest.content)
    for blob in [body["config"], *body["layers"]]:
        mounted = requests.post(f"http://{registry}/v2/{dest}/blobs/uploads/?mount={blob['digest']}&from={src}",
                                timeout=60)
        assert mounted.status_code == 201, mounted.text
    put = requests.put(f"http://{registry}/v2/{dest}/manifests/{digest}", data=manifest.content, timeout=30,
                       headers={"Content-Type": manifest.headers["Content-Type"]})
    assert put.status_code == 201, put.text


@pytest.fixture(scope="module")
def attest_scene(build_scene, tmp_path_factory):
    """The clean build's image, attested once with its trace; keys and a policy to verify with."""
    root = tmp_path_factory.mktemp("crash-attest")
    keys = root / "keys"
    made = run(build_scene["project"], "keygen", "--out", str(keys), env=PASSWORD)
    assert made.returncode == 0, made.stderr
    (root / "record.json").write_text(build_scene["record"])
    scene = {**build_scene, "attest_root": root, "key": keys / "release.key", "pub": keys / "release.pub", "record_file": root / "record.json",
             "policy": dev_policy(root / "policy.yaml", build_scene["base"])}
    repo = f"{build_scene['prefix']}/attest-clean"
    copy_image(build_scene["registry"], f"{build_scene['prefix']}/clean", repo, build_scene["digest"])
    _, seen = points(build_scene["project"], *attest_args(scene, repo), env=attest_env(scene, "clean"),
                     trace=root / "trace")
    scene.update(attest_seen=seen, attest_tags=tags(build_scene["registry"], repo))
    return scene


def attest_env(scene, name: str) -> dict:
    """Each attest its own empty cache: what one run verified and kept, the next would not ask again."""
    return {**PASSWORD, "BAKERY_CACHE": str(scene["attest_root"] / f"cache-{name}")}


def attest_args(scene, repo: str) -> tuple[str, ...]:
    return ("attest", f"{scene['registry']}/{repo}@{scene['digest']}", "--record", str(scene["record_file"]),
            "--key", str(scene["key"]))


def verified(scene, repo: str) -> subprocess.CompletedProcess:
    return run(scene["project"], "verify", f"{scene['registry']}/{repo}@{scene['digest']}", "--key",
               str(scene["pub"]), "--policy", str(scene["policy"]), env={})


def killed_attest_then_again(scene, k: int, whole: int) -> list[str]:
    """Kill attest at point k: verify must pass only if the kill came after the clean run had stored
    one format whole (the bundles, written first; verify reads either); run again, verify passes."""
    repo, wrong = f"{scene['prefix']}/attest-k{k}", []
    copy_image(scene["registry"], f"{scene['prefix']}/clean", repo, scene["digest"])
    killed = run(scene["project"], *attest_args(scene, repo), env=attest_env(scene, f"k{k}"), crash_at=k)
    if killed.returncode != -9:
        return [f"point {k}: exit {killed.returncode}, not killed"]
    check = verified(scene, repo)
    if (check.returncode == 0) != (k >= whole):
        wrong.append(f"point {k} ({scene['attest_seen'][k - 1]}): verify exit {check.returncode} with the tags "
                     f"{sorted(tags(scene['registry'], repo))}: {check.stdout[-300:]}")
    again = run(scene["project"], *attest_args(scene, repo), env=attest_env(scene, f"k{k}"))
    if again.returncode != 0 or verified(scene, repo).returncode != 0:
        wrong.append(f"point {k}: attest run again, then verify, failed: {again.stderr[-300:]}")
    return wrong


def attest_writes(scene) -> tuple[list[int], int]:
    """The points where the image's repository stored a manifest, up to its last signed document
    (after it, attest signs the kernel artifact, in the repository the build pushed it to), and the
    point at which one format was whole: the last bundle listed in the fallback tag's index (this
    registry has no referrers API), before the tags (.sig, .att)."""
    own = f"/v2/{scene['prefix']}/attest-clean/manifests/"
    seen = scene["attest_seen"]
    writes = [i for i, s in enumerate(seen, 1) if s.startswith(f"PUT {own}")]
    tagged = [i for i in writes if re.search(r"\.(sig|att) answered", seen[i - 1])]
    listed = [i for i in writes if f"{own}sha256-{scene['digest'].split(':')[1]} answered" in seen[i - 1]]
    assert listed and max(listed) < min(tagged), "attest listed no bundle before the tags (both formats are written)"
    return [i for i in writes if i <= max(tagged)], max(listed)


def test_attest_killed_after_each_document_it_stores_is_refused_by_verify_until_run_again(attest_scene):
    """The half-attested states: after the first bundle write and the one before the last, once
    every bundle is stored (whole), after each tag; run again, each passes (the sweep: every write)."""
    writes, whole = attest_writes(attest_scene)
    before = [i for i in writes if i < whole]
    chosen = sorted({before[0], before[-1], whole} | {i for i in writes if i > whole})
    wrong = [w for k in chosen for w in killed_attest_then_again(attest_scene, k, whole)]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.sweep
def test_attest_killed_at_every_point(attest_scene):
    writes, whole = attest_writes(attest_scene)
    wrong = [w for k in range(1, writes[-1] + 1) for w in killed_attest_then_again(attest_scene, k, whole)]
    assert wrong == [], "\n".join(wrong)


# -- compile -------------------------------------------------------------------------------------------

def compile_args(scene, name: str) -> tuple[str, ...]:
    return ("compile", "--registry", f"{scene['registry']}/{scene['prefix']}/{name}")


def compile_scene(scene, name: str, start: Path) -> dict:
    """A clean `invoke compile --registry` from start (its outputs then pushed as the kernel
    artifact, tagged kernels-<key>), and its trace."""
    cache = linked_copy(start, scene["root"] / f"{name}-cache-clean")
    done, seen = points(scene["project"], *compile_args(scene, f"{name}-clean"), env={"BAKERY_CACHE": str(cache)},
                        trace=scene["root"] / f"{name}-trace")
    return {**scene, "compile_name": name, "compile_start": start, "compile_seen": seen, "compiled": done.stdout,
            "compile_log": done.stderr, "compile_cache": snapshot(cache, start),
            "compile_tags": tags(scene["registry"], f"{scene['prefix']}/{name}-clean")}


@pytest.fixture(scope="module")
def cold_compile_scene(ground):
    """From the ground's start: the toolchain store warm, the compile itself cold (minutes)."""
    return compile_scene(ground, "compile-cold", ground["start"])


@pytest.fixture(scope="module")
def warm_compile_scene(build_scene):
    """From the ground's start with the outputs the clean build compiled (the same recipe and
    toolchain): nothing compiled, the artifact pushed. CI's sample, in seconds."""
    start = linked_copy(build_scene["start"], build_scene["root"] / "compile-warm-start")
    subprocess.run(["cp", "-al", str(build_scene["clean_cache"] / "hip"), str(start / "hip")], check=True)
    scene = compile_scene(build_scene, "compile-warm", start)
    assert "kernels cache" in scene["compile_log"], scene["compile_log"][-500:]
    return scene


def killed_compile_then_again(scene, k: int) -> list[str]:
    """Kill the compile at point k: the cache holds nothing a clean compile would not (an entry of
    hip/ is whole or absent), no kernels- tag a clean compile would not make; compile again: the
    same outputs, cache and tags as a clean compile's."""
    name, start = f"{scene['compile_name']}-k{k}", scene["compile_start"]
    cache = linked_copy(start, scene["root"] / f"{name}-cache")
    repo, env = f"{scene['prefix']}/{name}", {"BAKERY_CACHE": str(cache)}
    killed = run(scene["project"], *compile_args(scene, name), env=env, crash_at=k)
    if killed.returncode != -9:
        return [f"point {k}: exit {killed.returncode}, not killed: {killed.stderr[-300:]}"]
    what = scene["compile_seen"][k - 1]
    wrong = [f"point {k} ({what}): cache/{n} is not what a clean compile writes there"
             for n in not_in(scene["compile_cache"], snapshot(cache, start))]
    wrong += [f"point {k} ({what}): tag {t} -> {d}, a clean compile: {scene['compile_tags'].get(t)}"
              for t, d in tags(scene["registry"], repo).items() if scene["compile_tags"].get(t) != d]
    for path in temporaries(cache):  # as if the next run came later
        os.utime(path, (0, 0), follow_symlinks=False)
    again = run(scene["project"], *compile_args(scene, name), env=env)
    wrong += [f"point {k}: {path} left by the kill is still there after the next compile" for path in temporaries(cache)]
    if again.returncode != 0:
        return wrong + [f"point {k}: the compile run again failed: {again.stderr[-300:]}"]
    if again.stdout != scene["compiled"]:
        wrong.append(f"point {k}: compiled again, its outputs {again.stdout!r}, a clean compile's {scene['compiled']!r}")
    if real_entries(snapshot(cache, start)) != real_entries(scene["compile_cache"]):
        wrong.append(f"point {k}: the cache after the second compile is not a clean compile's")
    if tags(scene["registry"], repo) != scene["compile_tags"]:
        wrong.append(f"point {k}: the tags after the second compile are not a clean compile's")
    subprocess.run(["rm", "-rf", str(cache)], check=True)
    return wrong


def test_a_compile_killed_before_its_kernel_tag_leaves_no_tag_and_pushes_it_when_run_again(warm_compile_scene):
    """The outputs cached, their blobs pushed, the artifact's manifest and tag not yet."""
    seen = warm_compile_scene["compile_seen"]
    (tag,) = [i for i, s in enumerate(seen, 1) if re.match(r"PUT /v2/\S+/manifests/kernels-", s)]
    wrong = killed_compile_then_again(warm_compile_scene, tag - 1)
    assert wrong == [], "\n".join(wrong)


@pytest.mark.sweep
def test_a_cold_compile_killed_at_every_point(cold_compile_scene):
    seen = cold_compile_scene["compile_seen"]
    print(f"\n{len(seen)} points: " + "; ".join(seen))
    wrong = [w for k in range(1, len(seen) + 1) for w in killed_compile_then_again(cold_compile_scene, k)]
    assert wrong == [], "\n".join(wrong)


# -- reproduce -----------------------------------------------------------------------------------------

IDENTITY = {"GIT_AUTHOR_NAME": "release", "GIT_AUTHOR_EMAIL": "release@example.com",
            "GIT_COMMITTER_NAME": "release", "GIT_COMMITTER_EMAIL": "release@example.com"}


@pytest.fixture(scope="module")
def reproduce_scene(attest_scene):
    """A release as the workflow makes one (built from a commit of a repository of its own, whose
    origin is itself, pushed and attested), then a clean `invoke reproduce --outcome` of it with its
    trace. The rebuild inside compiles and builds from nothing (minutes); this process, which the
    kills stop, serves it the base and the compiler and reads the result."""
    s = {**attest_scene}
    root = s["root"] / "reproduce"
    project = root / "project"
    root.mkdir()
    subprocess.run(["cp", "-a", str(s["project"]), str(project)], check=True)
    subprocess.run(["rm", "-rf", str(project / ".git"), str(project / "out")], check=True)  # a repository of its own
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "release"], ["remote", "add", "origin", str(project)]):
        subprocess.run(["git", "-C", str(project), *args], check=True, capture_output=True, env={**os.environ, **IDENTITY})
    cache = {"BAKERY_CACHE": str(linked_copy(s["clean_cache"], root / "release-cache"))}  # compiled: the release is quick
    built = run(project, "build", "--base", s["base"], "--push", f"{s['registry']}/{s['prefix']}/reproduce:1",
                "--out", str(root / "out"), env={**cache, "SOURCE_DATE_EPOCH": "1700000300"})
    assert built.returncode == 0, built.stderr
    attested = run(project, "attest", last_line(built), "--record", str(root / "out" / "build-record.json"),
                   "--key", str(s["key"]), env={**PASSWORD, **cache})
    assert attested.returncode == 0, attested.stderr
    s.update(reproduce_root=root, release=last_line(built))
    env = reproduce_env(s, "clean")
    _, seen = points(project, *reproduce_args(s, "clean"), env=env, trace=root / "trace")
    s.update(reproduce_seen=seen, outcome=(root / "outcome-clean.json").read_bytes(),
             reproduce_cache=snapshot(Path(env["BAKERY_CACHE"]), s["start"]))
    return s


def reproduce_env(scene, name: str) -> dict:
    """Its own cache from the ground's start: the toolchain's files the compile is served from are there."""
    root = scene["reproduce_root"]
    if not (root / f"cache-{name}").exists():
        linked_copy(scene["start"], root / f"cache-{name}")
    return {"BAKERY_CACHE": str(root / f"cache-{name}")}


def reproduce_args(scene, name: str) -> tuple[str, ...]:
    """As the release workflow's rebuild job runs it."""
    root = scene["reproduce_root"]
    return ("reproduce", scene["release"], "--release-key", str(scene["pub"]), "--policy", str(scene["policy"]),
            "--outcome", str(root / f"outcome-{name}.json"), "--workdir", str(root / f"work-{name}"))


def killed_reproduce_then_again(scene, k: int) -> list[str]:
    """Kill reproduce at point k: its outcome is absent or a clean run's, its cache holds nothing a
    clean run would not; run again (the same command): the clean run's outcome."""
    name, root = f"k{k}", scene["reproduce_root"]
    env, outcome, what = reproduce_env(scene, name), root / f"outcome-k{k}.json", scene["reproduce_seen"][k - 1]
    killed = run(root / "project", *reproduce_args(scene, name), env=env, crash_at=k)
    if killed.returncode != -9:
        return [f"point {k}: exit {killed.returncode}, not killed: {killed.stderr[-300:]}"]
    wrong = [f"point {k} ({what}): the outcome is neither absent nor a clean run's"] \
        if outcome.exists() and outcome.read_bytes() != scene["outcome"] else []
    wrong += [f"point {k} ({what}): cache/{n} is not what a clean run writes there"
              for n in not_in(scene["reproduce_cache"], snapshot(Path(env["BAKERY_CACHE"]), scene["start"]))]
    again = run(root / "project", *reproduce_args(scene, name), env=env)
    if again.returncode != 0:
        return wrong + [f"point {k} ({what}): reproduce run again failed (exit {again.returncode}): {again.stderr[-300:]}"]
    if outcome.read_bytes() != scene["outcome"]:
        wrong.append(f"point {k}: run again, its outcome is not a clean run's")
    subprocess.run(["rm", "-rf", env["BAKERY_CACHE"], str(root / f"work-{name}")], check=True)
    return wrong


@pytest.mark.sweep
def test_reproduce_killed_at_the_start_and_end_of_each_kind_of_step(reproduce_scene):
    seen = reproduce_scene["reproduce_seen"]
    print(f"\n{len(seen)} points, {len(kinds(seen))} kinds: " + "; ".join(kinds(seen)))
    wrong = [w for k in spread(seen) for w in killed_reproduce_then_again(reproduce_scene, k)]
    assert wrong == [], "\n".join(wrong)


# -- promote -------------------------------------------------------------------------------------------

TAG = "v1"


@pytest.fixture(scope="module")
def promote_scene(attest_scene):
    """The clean build's image attested in a repository of its own, with a passing smoke result a
    smoke key signed, and the release tag on another image: what promote finds; its clean run's trace."""
    from bakery.oci.refs import Reference
    from bakery.oci.store import RegistryStore
    from bakery.release import smoke_report
    from bakery.trust import keys, sign

    s, keydir = attest_scene, attest_scene["attest_root"] / "keys"
    made = run(s["project"], "keygen", "--role", "smoke", "--out", str(keydir), env=PASSWORD)
    assert made.returncode == 0, made.stderr
    repo = f"{s['prefix']}/promote"
    copy_image(s["registry"], f"{s['prefix']}/clean", repo, s["digest"])
    attested = run(s["project"], *attest_args(s, repo), env=attest_env(s, "promote"))
    assert attested.returncode == 0, attested.stderr
    ref = Reference.parse(f"{s['registry']}/{repo}@{s['digest']}")
    os.environ.update(PASSWORD)  # the key file is encrypted; the password is read from here
    try:
        signer = sign.Signer(keys.load_private(keydir / "smoke.key"))
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    passing = passing_report(str(ref))
    smoke_report.attach_report(RegistryStore(ref), ref, passing, (s["project"] / "provenance" / "smoke.yaml").read_bytes(),
                        signer)
    old = tiny_image(s["registry"], repo)
    scene = {**s, "promote_repo": repo, "smoke_pub": keydir / "smoke.pub", "old": old, "before": tags(s["registry"], repo)}
    _, seen = points(s["project"], *promote_args(scene), env=promote_env(scene, "clean"),
                     trace=s["attest_root"] / "promote-trace")
    scene.update(promote_seen=seen, promoted=tags(s["registry"], repo),
                 smoke_ledger=Path(promote_env(scene, "clean")["BAKERY_SMOKE_LEDGER"]).read_bytes())
    assert scene["promoted"] == {**scene["before"], TAG: s["digest"]}
    return scene


def tiny_image(registry: str, repo: str) -> tuple[str, bytes, str]:
    """Another image under TAG (what the tag named before the release): (digest, manifest, its type)."""
    import io
    import tarfile

    from support import push_image

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tarfile.TarInfo("old-release")
        tar.addfile(info, io.BytesIO(b""))
    ref = push_image(registry, repo, [layer.getvalue()], tag=TAG)
    got = requests.get(f"http://{registry}/v2/{repo}/manifests/{ref.digest}", headers={"Accept": ACCEPT}, timeout=30)
    got.raise_for_status()
    return str(ref.digest), got.content, got.headers["Content-Type"]


def promote_env(scene, name: str) -> dict:
    """Each promote its own ledger of smoke results (verify adds the one it read): written whole or not at all."""
    return {"BAKERY_SMOKE_LEDGER": str(scene["attest_root"] / f"smoke-ledger-{name}.json")}


def promote_args(scene) -> tuple[str, ...]:
    return ("promote", f"{scene['registry']}/{scene['promote_repo']}@{scene['digest']}", "--tag", TAG,
            "--key", str(scene["pub"]), "--smoke-key", str(scene["smoke_pub"]), "--policy", str(scene["policy"]))


def killed_promote_then_again(scene, k: int) -> list[str]:
    """TAG back on the old image; promote killed at point k: TAG names the old image or the
    promoted one, no other tag moved; promote run again finishes with TAG on the promoted digest."""
    registry, repo = scene["registry"], scene["promote_repo"]
    digest, manifest, kind = scene["old"]
    put = requests.put(f"http://{registry}/v2/{repo}/manifests/{TAG}", data=manifest, timeout=30,
                       headers={"Content-Type": kind})
    assert put.status_code == 201, put.text
    env = promote_env(scene, f"k{k}")
    killed = run(scene["project"], *promote_args(scene), env=env, crash_at=k)
    if killed.returncode != -9:
        return [f"point {k}: exit {killed.returncode}, not killed: {killed.stderr[-300:]}"]
    found, wrong, ledger = tags(registry, repo), [], Path(env["BAKERY_SMOKE_LEDGER"])
    if ledger.exists() and ledger.read_bytes() != scene["smoke_ledger"]:
        wrong.append(f"point {k}: the smoke ledger is neither absent nor a clean promote's")
    if found.get(TAG) not in (digest, scene["digest"]):
        wrong.append(f"point {k} ({scene['promote_seen'][k - 1]}): {TAG} -> {found.get(TAG)}, neither the old "
                     f"image {digest} nor the promoted {scene['digest']}")
    wrong += [f"point {k}: tag {t} -> {d}, before the promote: {scene['before'].get(t)}"
              for t, d in found.items() if t != TAG and scene["before"].get(t) != d]
    again = run(scene["project"], *promote_args(scene), env=env)
    if again.returncode != 0:
        return wrong + [f"point {k}: promote run again failed: {again.stderr[-300:]}"]
    if tags(registry, repo) != scene["promoted"]:
        wrong.append(f"point {k}: the tags after the second promote are not a clean promote's")
    return wrong


def tag_put(scene) -> int:
    """The point of the registry's answer to the tag's PUT, the promote's one write."""
    (k,) = [i for i, s in enumerate(scene["promote_seen"], 1) if s.startswith(f"PUT /v2/{scene['promote_repo']}/manifests/{TAG} ")]
    return k


def test_promote_killed_just_before_and_after_its_tag_is_put_tags_all_or_nothing(promote_scene):
    wrong = [w for k in (tag_put(promote_scene) - 1, tag_put(promote_scene))
             for w in killed_promote_then_again(promote_scene, k)]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.sweep
def test_promote_killed_at_every_point(promote_scene):
    print(f"\n{len(promote_scene['promote_seen'])} points, the tag's PUT answered at {tag_put(promote_scene)}")
    wrong = [w for k in range(1, len(promote_scene["promote_seen"]) + 1)
             for w in killed_promote_then_again(promote_scene, k)]
    assert wrong == [], "\n".join(wrong)


# -- track and bump ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def track_scene(ground):
    """Upstream's two nightlies (the pin's 0.26.0 fixture, and 0.27.0 a day later); a checkout pinned
    to the first; a clean `invoke track` (mirror both, record them, bump onto the second: exit 10)
    from the ground's start, and its trace."""
    from bakery.dev.rehearse_nightly import upstream_nightlies

    root, registry = ground["root"], ground["registry"]
    upstream, nightly = upstream_nightlies(ground["project"], registry, log=lambda m: None)
    pinned = root / "track-pinned"
    subprocess.run(["cp", "-a", str(ground["project"]), str(pinned)], check=True)
    subprocess.run(["rm", "-rf", str(pinned / ".git"), str(pinned / "out")], check=True)  # track needs no repository
    (pinned / "image" / "base.yaml").write_text(f"image: {upstream}@{nightly['nightly-a']}\nplatform: linux/amd64\n"
                                                f"mirror: null\n")
    scene = {**ground, "upstream": upstream, "pinned": pinned, "before": project_state(pinned)}
    project, env = track_run(scene, "unbumped")  # what track writes before its bump: a state a kill may leave
    unbumped = run(project, *track_args(scene, "unbumped"), "--no-bump", env=env)
    assert unbumped.returncode == 0, unbumped.stderr
    scene["unbumped"] = project_state(project, mirror(scene, "unbumped"))
    project, env = track_run(scene, "clean")
    done, seen = points(project, *track_args(scene, "clean"), env=env, trace=root / "track-trace", code=BUMPED)
    cache = Path(env["BAKERY_CACHE"])
    scene.update(track_seen=seen, track_code=done.returncode, tracked=project_state(project, mirror(scene, "clean")),
                 track_cache=snapshot(cache, ground["start"]),
                 track_views={p.name: p.read_bytes() for p in (cache / "views").iterdir()},
                 track_tags=tags(registry, f"{ground['prefix']}/track-clean"))
    return scene


def mirror(scene, name: str) -> str:
    return f"{scene['registry']}/{scene['prefix']}/track-{name}"


def track_args(scene, name: str) -> tuple[str, ...]:
    return ("track", "--from", scene["upstream"], "--mirror", mirror(scene, name))


def track_run(scene, name: str) -> tuple[Path, dict]:
    """A checkout as pinned and a cache from the ground's start, each this run's own."""
    project = scene["root"] / f"track-{name}"
    subprocess.run(["cp", "-a", str(scene["pinned"]), str(project)], check=True)
    return project, {"BAKERY_CACHE": str(linked_copy(scene["start"], scene["root"] / f"track-cache-{name}"))}


TRACKED = ("image", "overlays")  # what track and bump write in the checkout (the report in out/ is rewritten whole)


def project_state(project: Path, mirror_name: str | None = None, unmarked: bool = False) -> dict[str, str]:
    """The files track and bump write, by name: their bytes, this run's mirror named alike, and
    the ledger less when each nightly was first seen (the time of the run); `unmarked`: less the
    mark a bump stopped between its record and its pin leaves (`pinning: true`) too."""
    found = {}
    for part in TRACKED:
        for path in sorted((project / part).rglob("*")):
            if path.is_file() and not TEMPORARY.match(path.name):
                text = path.read_bytes()
                if mirror_name:
                    text = text.replace(mirror_name.encode(), b"MIRROR")
                if path.name == "nightlies.yaml":
                    text = re.sub(rb"(?m)^(\s*seen:) .*$", rb"\1 WHEN", text)
                    if unmarked:
                        text = re.sub(rb"(?m)^\s*pinning: true\n", b"", text)
                found[path.relative_to(project).as_posix()] = hashlib.sha256(text).hexdigest()
    return found


def read_from(found: dict[str, str], registry: str, repo: str, clean: str) -> dict[str, str]:
    """A cache's snapshot with each document read from repo named as if read from clean: a verified
    document's name is the digest of where it was read (registry.py, _kept_path)."""
    def sha(text):
        return hashlib.sha256(text.encode()).hexdigest()

    renamed = {}
    for name, value in found.items():
        kept = re.fullmatch(r"(verified/\w+/)([0-9a-f]{64})\.([0-9a-f]{64})", name)
        if kept and kept[2] == sha(f"{registry}/{repo}@sha256:{kept[3]}"):
            name = f"{kept[1]}{sha(f'{registry}/{clean}@sha256:{kept[3]}')}.{kept[3]}"
        renamed[name] = value
    return renamed


def killed_track_then_again(scene, k: int) -> list[str]:
    """Kill track (and its bump) at point k: each file it writes is as before or as a clean run
    leaves it, the cache holds nothing a clean run would not, no tag a clean run would not make;
    run again: the clean run's exit code, files and tags."""
    name = f"k{k}"
    project, env = track_run(scene, name)
    cache, what = Path(env["BAKERY_CACHE"]), scene["track_seen"][k - 1]
    killed = run(project, *track_args(scene, name), env=env, crash_at=k)
    if killed.returncode != -9:
        return [f"point {k}: exit {killed.returncode}, not killed: {killed.stderr[-300:]}"]
    found, wrong = project_state(project, mirror(scene, name)), []
    unmarked = project_state(project, mirror(scene, name), unmarked=True)  # stopped between record and pin
    wrong += [f"point {k} ({what}): {path} is neither as before, as track leaves it before its bump, nor as a "
              f"clean run leaves it" for path, sha in found.items()
              if sha not in (scene["before"].get(path), scene["unbumped"].get(path), scene["tracked"].get(path))
              and not (path.endswith("nightlies.yaml") and unmarked[path] == scene["tracked"].get(path))]
    prefix = scene["prefix"]
    in_cache = read_from(snapshot(cache, scene["start"]), scene["registry"], f"{prefix}/track-{name}",
                         f"{prefix}/track-clean")
    wrong += [f"point {k} ({what}): cache/{n} is not what a clean run writes there"
              for n in not_in(scene["track_cache"], in_cache) if not (
                  n.startswith("views/") and n[6:] in scene["track_views"] and
                  grown_view((cache / n).read_bytes(), scene["track_views"][n[6:]]))]
    done = found == scene["tracked"]  # killed after its last write: nothing is left to do
    wrong += [f"point {k} ({what}): tag {t} -> {d}, a clean run: {scene['track_tags'].get(t)}"
              for t, d in tags(scene["registry"], f"{scene['prefix']}/track-{name}").items()
              if scene["track_tags"].get(t) != d]
    again = run(project, *track_args(scene, name), env=env)
    if again.returncode != (NOTHING_NEW if done else scene["track_code"]):
        wrong.append(f"point {k} ({what}): run again, track exits {again.returncode}, a clean run "
                     f"{scene['track_code']}: {again.stdout[-300:]} {again.stderr[-300:]}")
    found = project_state(project, mirror(scene, name))
    differ = sorted(p for p in set(found) | set(scene["tracked"]) if found.get(p) != scene["tracked"].get(p))
    if differ:
        wrong.append(f"point {k} ({what}): run again, {differ} differ from a clean run's")
    if tags(scene["registry"], f"{scene['prefix']}/track-{name}") != scene["track_tags"]:
        wrong.append(f"point {k}: the tags after the second run are not a clean run's")
    subprocess.run(["rm", "-rf", str(project), str(cache)], check=True)
    return wrong


def test_a_bump_killed_between_its_lock_and_its_pin_is_finished_when_run_again(track_scene):
    """The checkout half bumped (the new lock, the old pin): run again, it ends as a clean run, the
    ledger included (the bump records its outcome before it writes the checkout: before, a rerun
    recorded other statuses, or, stopped before the ledger, said nothing new and recorded none)."""
    seen = track_scene["track_seen"]
    lock = max(i for i, s in enumerate(seen, 1) if re.match(r"wrote \S+/overlays/overlays\.lock$", s))
    wrong = killed_track_then_again(track_scene, lock)
    assert wrong == [], "\n".join(wrong)


@pytest.mark.sweep
def test_track_and_bump_killed_at_every_point(track_scene):
    seen = track_scene["track_seen"]
    print(f"\n{len(seen)} points, {len(kinds(seen))} kinds")
    wrong = [w for k in range(1, len(seen) + 1) for w in killed_track_then_again(track_scene, k)]
    assert wrong == [], "\n".join(wrong)


# -- mirror and lock -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mirror_scene(ground):
    """A clean `invoke mirror` of the base (a copy by digest within the registry) and its trace."""
    scene = {**ground}
    done, seen = points(scene["project"], *mirror_args(scene, "mirror-clean"), env=mirror_env(scene, "clean"),
                        trace=scene["root"] / "mirror-trace")
    scene.update(mirror_seen=seen, mirrored=last_line(done).split("@", 1)[1],
                 mirror_tags=tags(scene["registry"], f"{scene['prefix']}/mirror-clean"))
    return scene


def mirror_env(scene, name: str) -> dict:
    """Each mirror its own empty cache: what one run verified and kept, the next would not ask again."""
    return {"BAKERY_CACHE": str(scene["root"] / f"mirror-cache-{name}")}


def mirror_args(scene, name: str) -> tuple[str, ...]:
    return ("mirror", "--base", scene["base"], "--to", f"{scene['registry']}/{scene['prefix']}/{name}")


def killed_mirror_then_again(scene, k: int) -> list[str]:
    name = f"mirror-k{k}"
    repo = f"{scene['prefix']}/{name}"
    killed = run(scene["project"], *mirror_args(scene, name), env=mirror_env(scene, name), crash_at=k)
    if killed.returncode != -9:  # every run from this start counts the same points: each is reached
        return [f"point {k}: exit {killed.returncode}, not killed: {killed.stderr[-300:]}"]
    wrong = [f"point {k} ({scene['mirror_seen'][k - 1]}): tag {t} -> {d}, a clean mirror: {scene['mirror_tags'].get(t)}"
             for t, d in tags(scene["registry"], repo).items() if scene["mirror_tags"].get(t) != d]
    again = run(scene["project"], *mirror_args(scene, name), env=mirror_env(scene, name))
    if again.returncode != 0 or last_line(again).split("@", 1)[1] != scene["mirrored"]:
        wrong.append(f"point {k}: mirrored again: exit {again.returncode}, {again.stdout[-200:]} {again.stderr[-200:]}")
    elif tags(scene["registry"], repo) != scene["mirror_tags"]:
        wrong.append(f"point {k}: the tags after the second mirror are not a clean mirror's")
    return wrong


@pytest.mark.sweep
def test_a_mirror_killed_at_each_kind_of_step_tags_nothing_wrong_and_finishes_when_run_again(mirror_scene):
    wrong = [w for k in spread(mirror_scene["mirror_seen"]) for w in killed_mirror_then_again(mirror_scene, k)]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.sweep
def test_a_mirror_killed_at_every_point(mirror_scene):
    wrong = [w for k in range(1, len(mirror_scene["mirror_seen"]) + 1)
             for w in killed_mirror_then_again(mirror_scene, k)]
    assert wrong == [], "\n".join(wrong)


@pytest.mark.sweep
def test_a_lock_killed_at_every_point_leaves_the_old_lock_or_the_new_one(build_scene, tmp_path):
    """`invoke lock` rewrites overlays.lock: after a kill it holds the old bytes or a clean run's."""
    project = build_scene["project"]

    def env(name):  # each run the same start: what one run wrote, the next would not write again
        return {"BAKERY_CACHE": str(linked_copy(build_scene["start"], tmp_path / f"cache-{name}"))}

    lock = project / "overlays" / "overlays.lock"
    old = lock.read_bytes()
    lock.write_bytes(old + b"\n")  # a lock to be replaced (other bytes, the same entries)
    stale = lock.read_bytes()
    try:
        _, seen = points(project, "lock", "--base", build_scene["base"], env=env("clean"), trace=tmp_path / "trace")
        clean, wrong = lock.read_bytes(), []
        for k in range(1, len(seen) + 1):
            lock.write_bytes(stale)
            if run(project, "lock", "--base", build_scene["base"], env=env(k), crash_at=k).returncode != -9:
                wrong.append(f"point {k}: not killed")
            if lock.read_bytes() not in (stale, clean):
                wrong.append(f"point {k} ({seen[k - 1]}): overlays.lock is neither the old one nor a clean run's")
    finally:
        lock.write_bytes(old)
    assert wrong == [], "\n".join(wrong)
