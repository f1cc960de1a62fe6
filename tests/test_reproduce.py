"""Independent rebuild (issue 21): `invoke reproduce IMAGE@DIGEST` rebuilds a released digest from its
signed provenance alone (a fresh clone of the revision, an empty cache, kernels compiled again) and
compares bytes; where they differ it names the layer and the files, with both sha256.

The "releases" here are built from a committed copy of this checkout whose origin is itself (the
provenance's source repository), as the release workflow builds from a tag.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from support import copy_project, dev_policy, invoke, last_line
from test_attest import PASSWORD

SITE = "/usr/local/lib/python3.12/dist-packages"
FENCE = f"{SITE}/vllm/v1/kv_offload/cpu/gpu_worker.py"
IDENTITY = {"GIT_AUTHOR_NAME": "release", "GIT_AUTHOR_EMAIL": "release@example.com",
            "GIT_COMMITTER_NAME": "release", "GIT_COMMITTER_EMAIL": "release@example.com"}


def git(project: Path, *args: str) -> str:
    import os

    return subprocess.run(["git", "-C", str(project), *args], capture_output=True, text=True, check=True,
                          env={**os.environ, **IDENTITY}).stdout.strip()


@pytest.fixture(scope="module")
def setup(registry, fixture_base, fixture_lock, toolchain, tmp_path_factory):
    root = tmp_path_factory.mktemp("reproduce")
    project = copy_project(root / "project", fixture_lock)
    subprocess.run(["git", "-C", str(project), "remote", "remove", "origin"], capture_output=True)
    git(project, "remote", "add", "origin", str(project))  # the source repository the provenance names
    git(project, "add", "-A")
    git(project, "commit", "-q", "--allow-empty", "-m", "release")
    assert invoke(project, "keygen", "--out", str(root / "k"), env=PASSWORD).returncode == 0
    for who in ("a", "b"):  # two rebuilders, each with its own key on its own machine
        assert invoke(project, "keygen", "--role", "rebuilder", "--out", str(root / who), env=PASSWORD).returncode == 0
    return {"project": project, "root": root, "key": root / "k" / "release.key", "pub": root / "k" / "release.pub",
            "policy": dev_policy(root / "policy.yaml", fixture_base), "base": fixture_base, "registry": registry,
            "rebuilders": {who: (root / who / "rebuilder.key", root / who / "rebuilder.pub") for who in ("a", "b")}}


def release(s, name: str, epoch: int) -> str:
    """Build the project as it is now (committed or not), push, sign and attest: a release."""
    out = s["root"] / f"out-{name}"
    built = invoke(s["project"], "build", "--base", str(s["base"]), "--push", f"{s['registry']}/repro/{name}:1",
                   "--out", str(out), env={"SOURCE_DATE_EPOCH": str(epoch)})
    assert built.returncode == 0, built.stderr
    ref = last_line(built)
    attested = invoke(s["project"], "attest", ref, "--record", str(out / "build-record.json"), "--key", str(s["key"]),
                      env=PASSWORD)
    assert attested.returncode == 0, attested.stderr
    return ref


def reproduce(s, ref: str, name: str, rebuilder: str | None = None, tmp: Path | None = None):
    """Rebuilt in --workdir rebuild-NAME, or with `tmp`, in a temporary folder of TMPDIR=tmp."""
    attest = ["--attest", "--key", str(s["rebuilders"][rebuilder][0])] if rebuilder else []
    where = ["--workdir", str(s["root"] / f"rebuild-{name}")] if tmp is None else []
    return invoke(s["project"], "reproduce", ref, "--release-key", str(s["pub"]), "--policy", str(s["policy"]),
                  *where, *attest, env={**PASSWORD, **({"TMPDIR": str(tmp)} if tmp else {})})


def verify_rebuilt(s, ref: str, needed: int):
    keys = [a for who in ("a", "b") for a in ("--rebuilder-key", str(s["rebuilders"][who][1]))]
    return invoke(s["project"], "verify", ref, "--key", str(s["pub"]), "--policy", str(s["policy"]), *keys,
                  "--require-rebuilds", str(needed))


@pytest.fixture(scope="module")
def clean_rebuilds(setup):
    """The clean release, rebuilt by two rebuilders at once, as on two machines (a rebuild keeps
    about one core busy; CI has two): a attests as it rebuilds; b, as the release workflow does it,
    holds no key in the rebuild and writes its outcome, signed later by test_verify_counts_...
    (ref, a's run, (b's run, b's outcome file, b's TMPDIR))."""
    from concurrent.futures import ThreadPoolExecutor

    ref = release(setup, "clean", 1700000300)
    outcome, tmp = setup["root"] / "outcome-b.json", setup["root"] / "tmp-b"
    tmp.mkdir()
    # what a reproduce killed before this one left in its temporary folder (its lock died with it)
    killed = tmp / ".bakery-reproduce.partial-killed"
    (killed / "source").mkdir(parents=True)
    os.utime(killed, (1700000000, 1700000000))
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(reproduce, setup, ref, "clean", "a")
        b = pool.submit(invoke, setup["project"], "reproduce", ref, "--release-key", str(setup["pub"]), "--policy",
                        str(setup["policy"]), "--outcome", str(outcome), env={"TMPDIR": str(tmp)})
        return ref, a.result(), (b.result(), outcome, tmp)


@pytest.fixture(scope="module")
def clean(clean_rebuilds):
    ref, by_a, _ = clean_rebuilds
    return ref, by_a


def test_a_release_built_from_a_clean_revision_is_reproduced_and_attested(setup, clean):
    ref, result = clean
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"reproduced {ref}" in result.stdout and "byte-identical" in result.stdout
    assert "attested the rebuild (match) as rebuilder" in result.stderr


def test_verify_counts_distinct_rebuilders_that_got_this_digest(setup, clean_rebuilds):
    ref, _, (rebuilt, outcome, tmp) = clean_rebuilds
    one = verify_rebuilt(setup, ref, 2)
    assert one.returncode != 0 and "FAIL rebuilt to this digest by 1 of 2 required rebuilder key(s)" in one.stdout
    # rebuilder b as the release workflow does it: the rebuild holds no key and writes its outcome;
    # a job that runs no build hashes the rebuilt manifest and signs
    assert rebuilt.returncode == 0, rebuilt.stderr
    # a matching rebuild in a temporary folder leaves nothing behind, and removes what a killed one left
    assert not list(tmp.iterdir())
    sign_b = ["attest-rebuild", ref, "--outcome", str(outcome), "--release-key", str(setup["pub"]), "--policy",
              str(setup["policy"]), "--key", str(setup["rebuilders"]["b"][0])]
    signed = invoke(setup["project"], *sign_b, env=PASSWORD)
    assert signed.returncode == 0 and signed.stdout.strip().endswith("(match)"), signed.stdout + signed.stderr
    two = verify_rebuilt(setup, ref, 2)
    assert two.returncode == 0, two.stdout + two.stderr
    assert "ok   rebuilt to this digest by 2 of 2 required rebuilder key(s)" in two.stdout
    # a rebuilder's second word replaces its first. Signed again from its rebuild's outcome: a second
    # rebuild (as this did before) gives the very same statement and, signing being deterministic,
    # the same envelope, so it added minutes and nothing the registry then holds
    again = invoke(setup["project"], *sign_b, env=PASSWORD)
    assert again.returncode == 0 and verify_rebuilt(setup, ref, 3).stdout.count("by 2 of 3") == 1


def test_cosign_agrees_with_the_rebuilder_key_and_type(setup, clean):
    from bakery.trust import provenance
    from test_attest import cosign

    ref, _ = clean
    ok = cosign("verify-attestation", "--key", str(setup["rebuilders"]["a"][1]), "--type",
                provenance.REBUILD_PREDICATE, ref)
    assert ok.returncode == 0, ok.stderr
    wrong = cosign("verify-attestation", "--key", str(setup["pub"]), "--type", provenance.REBUILD_PREDICATE, ref)
    assert wrong.returncode != 0


def named_difference(result, path: str) -> tuple[str, str]:
    """The (original, rebuilt) sha256 reproduce printed for one file."""
    named = [line for line in result.stdout.splitlines() if line.strip().lstrip("./").startswith(f"{path.lstrip('/')}:")]
    assert len(named) == 1 and "original " in named[0] and "rebuilt " in named[0], result.stdout
    original, rebuilt = (part.split()[-1] for part in named[0].split(":", 1)[1].split(","))
    assert original != rebuilt and len(original) == len(rebuilt) == 64
    return original, rebuilt


SELFCHECK_EDIT = b"\n# an edit nobody committed\n"


@pytest.fixture(scope="module")
def unreproduced(setup):
    """Two releases the revision does not give, built one after the other (each edits the checkout
    and puts it back), then rebuilt at once, as on two machines (a rebuild keeps about one core
    busy; CI has two): {"dirty": (ref, its rebuild, the self-check released), "overlay": (ref, its
    rebuild by rebuilder a)}."""
    from concurrent.futures import ThreadPoolExecutor

    # an uncommitted edit of the self-check goes into the image; the revision does not have it
    selfcheck = setup["project"] / "image" / "selfcheck.py"
    committed = selfcheck.read_bytes()
    selfcheck.write_bytes(committed + SELFCHECK_EDIT)
    try:
        dirty = release(setup, "dirty", 1700000302)
    finally:
        selfcheck.write_bytes(committed)
    # an overlay's patch edited (and re-locked) but not committed; the revision has the old one
    patch = setup["project"] / "overlays" / "patches" / "cpu-kv-transfer-fence.patch"
    clean = patch.read_bytes()
    edited = clean.replace(b"+        # Fence both directions", b"+        # (edited) Fence both directions", 1)
    assert edited != clean
    patch.write_bytes(edited)
    try:
        lock = invoke(setup["project"], "lock", "--base", str(setup["base"]))
        assert lock.returncode == 0, lock.stderr
        overlay = release(setup, "overlay", 1700000301)
    finally:
        patch.write_bytes(clean)
        git(setup["project"], "checkout", "--", "overlays")
    with ThreadPoolExecutor(2) as pool:
        (setup["root"] / "tmp-dirty").mkdir()
        by_anyone = pool.submit(reproduce, setup, dirty, "dirty", tmp=setup["root"] / "tmp-dirty")
        by_a = pool.submit(reproduce, setup, overlay, "overlay", "a")
        return {"dirty": (dirty, by_anyone.result(), committed + SELFCHECK_EDIT), "overlay": (overlay, by_a.result())}


def test_a_release_built_from_a_dirty_tree_is_not_and_the_file_is_named(unreproduced):
    """An uncommitted edit of the self-check went into the image; the revision does not have it."""
    _, result, released = unreproduced["dirty"]
    assert result.returncode == 5 and "not reproduced" in result.stderr, result.stdout + result.stderr
    original, _ = named_difference(result, "/usr/local/bin/bakery-selfcheck")
    assert original == hashlib.sha256(released).hexdigest()
    # rebuilt in a temporary folder: kept to be looked at, where the line says, and nothing else is left
    kept = Path(result.stderr.split("(the rebuild is in ")[1].split(")")[0])
    assert kept.name.startswith("bakery-reproduce-") and (kept / "build" / "output" / "layout").is_dir()
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]


def test_a_release_built_with_a_changed_overlay_is_not_and_its_target_is_named(setup, unreproduced):
    """An overlay's patch edited (and re-locked) but not committed; the revision has the old one."""
    ref, result = unreproduced["overlay"]
    assert result.returncode == 5 and "not reproduced" in result.stderr, result.stdout + result.stderr
    named_difference(result, FENCE)
    # the rebuilder said so, signed: a threshold of one is not met by a rebuild that got other bytes
    refused = verify_rebuilt(setup, ref, 1)
    assert refused.returncode != 0 and "by 0 of 1 required rebuilder key(s); 1 rebuilder(s) got other bytes" \
        in refused.stdout


def test_a_release_that_baked_a_poisoned_kernel_artifact_is_not_reproduced(setup, clean, tmp_path):
    """The kernel artifact in the registry is swapped for one whose .so was altered, and signed with
    the release key (a compromised sign job): a build that fetches it bakes the altered .so. The
    rebuilder compiles hip/ itself, so its .so differs, and it says which file."""
    import json

    from bakery.oci.refs import Descriptor, Digest, Reference
    from bakery.oci.registry import OCI_MANIFEST, Registry
    from bakery.oci.store import RegistryStore
    from bakery.trust import attest as attest_mod, keys, sign
    from support import cold_compile_cache

    ref, _ = clean
    registry = Registry(setup["registry"])
    repo = "repro/clean"
    import requests

    # the artifact this release baked (the registry may hold older kernels-<key> tags from earlier runs)
    baked = Reference.parse(json.loads((setup["root"] / "out-clean" / "build-record.json").read_text())
                            ["kernels"]["artifact"])
    listed = requests.get(f"http://{setup['registry']}/v2/{repo}/tags/list", timeout=30).json()["tags"]
    tag = next(t for t in listed if t.startswith("kernels-")
               and registry.get_manifest(Reference(setup["registry"], repo, t))[2] == baked.digest)
    body, _, _ = registry.get_manifest(Reference(setup["registry"], repo, tag))
    manifest = json.loads(body)
    config = json.loads(registry.fetch_blob(repo, Descriptor.from_json(manifest["config"])))
    for layer in manifest["layers"]:
        if layer["annotations"]["org.opencontainers.image.title"].endswith(".so"):
            data = registry.fetch_blob(repo, Descriptor.from_json(layer)) + b"\0poisoned after signing"
            desc = Descriptor.of("application/octet-stream", data, layer["annotations"])
            registry.upload_blob(repo, desc, functools.partial(iter, [data]))
            layer.update(desc.to_json())
            config["sha256"][layer["annotations"]["org.opencontainers.image.title"]] = hashlib.sha256(data).hexdigest()
            poisoned = layer["annotations"]["org.opencontainers.image.title"]
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_desc = Descriptor.of(manifest["config"]["mediaType"], config_bytes)
    registry.upload_blob(repo, config_desc, lambda: iter([config_bytes]))
    manifest["config"] = config_desc.to_json()
    body = json.dumps(manifest, sort_keys=True).encode()
    registry.put_manifest(repo, tag, body, OCI_MANIFEST)
    artifact = Reference(setup["registry"], repo, None, Digest.of(body))
    import os
    os.environ["BAKERY_KEY_PASSWORD"] = PASSWORD["BAKERY_KEY_PASSWORD"]
    try:
        signer = sign.Signer(keys.load_private(setup["key"]))
    finally:
        del os.environ["BAKERY_KEY_PASSWORD"]
    attest_mod.sign_image(RegistryStore(artifact), artifact, signer)

    out = setup["root"] / "out-poisoned"
    built = invoke(setup["project"], "build", "--base", str(setup["base"]), "--push", f"{setup['registry']}/{repo}:2",
                   "--out", str(out), "--key", str(setup["pub"]), "--policy", str(setup["policy"]),
                   env={"SOURCE_DATE_EPOCH": "1700000300", "BAKERY_CACHE": str(cold_compile_cache(tmp_path))})
    assert built.returncode == 0, built.stderr
    released = last_line(built)
    assert released != ref  # the same source and epoch, but the altered .so
    assert invoke(setup["project"], "attest", released, "--record", str(out / "build-record.json"),
                  "--key", str(setup["key"]), env=PASSWORD).returncode == 0
    result = reproduce(setup, released, "poisoned")
    assert result.returncode == 5, result.stdout + result.stderr
    named = [line.split(":")[0].strip() for line in result.stdout.splitlines()
             if line.startswith("  ") and line.split(":")[0].endswith(poisoned)]
    assert len(named) == 1, result.stdout
    named_difference(result, named[0])


def test_a_provenance_not_signed_by_the_release_key_is_never_rebuilt_from(setup, clean):
    """The provenance says what to clone and run: read it only once the release key's signature
    on the image and on the statement holds (here the key given is another's), and clone nothing."""
    ref, _ = clean
    result = invoke(setup["project"], "reproduce", ref, "--release-key", str(setup["rebuilders"]["a"][1]),
                    "--policy", str(setup["policy"]), "--workdir", str(setup["root"] / "rebuild-untrusted"))
    assert result.returncode == 5 and "its provenance cannot be trusted to rebuild from" in result.stderr
    assert not (setup["root"] / "rebuild-untrusted").exists()


def test_a_toolchain_pinned_to_the_base_is_pulled_by_the_bases_reference():
    """The release compiles in the ROCm base, recorded by its digest alone: a fresh rebuilder cannot
    pull `sha256:...` by itself, so the rebuild names the base's reference; a local image ID or a
    REF@sha256 toolchain stays as recorded."""
    from bakery.release.reproduce import Plan, toolchain_ref

    digest = "sha256:" + "e" * 64
    base = f"docker.io/vllm/vllm-openai-rocm@{digest}"
    assert toolchain_ref(Plan("https://x/y", "0" * 40, False, base, 1, digest)) == base
    other = "sha256:" + "f" * 64
    assert toolchain_ref(Plan("https://x/y", "0" * 40, False, base, 1, other)) == other
    pinned = f"ghcr.io/o/toolchain@{other}"
    assert toolchain_ref(Plan("https://x/y", "0" * 40, False, base, 1, pinned)) == pinned
    assert toolchain_ref(Plan("https://x/y", "0" * 40, False, base, 1, None)) is None


def zeros_layer(size: int) -> bytes:
    """A gzip'd tar of one file of `size` zero bytes: it compresses about 1,000 times."""
    import io
    import tarfile
    import zlib

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo("zeros")
        info.size = size
        tar.addfile(info, io.BytesIO(bytes(size)))
    return zlib.compress(raw.getvalue(), 1, wbits=31)


def test_a_rebuilt_layer_that_unpacks_past_its_cap_is_refused_in_one_line(monkeypatch):
    """Layers are compared outside the rebuild's sandbox and its time limit: a gzip of zeros would
    unpack 1,000 times its size there, so what a layer may unpack to is capped (32 times its size,
    at least UNPACKED_FLOOR: here 1 MiB, so that 64 MiB of zeros, 0.3 MiB gzip'd, is past it) and one line refuses it."""
    from bakery.errors import IntegrityError
    from bakery.oci.refs import Descriptor
    from bakery.release import reproduce

    blob = zeros_layer(64 << 20)
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
    store = type("Store", (), {"stream": lambda self, d: iter([blob])})()
    assert len(reproduce._files(store, desc)) == 1  # under the floor of 1 GiB: read and hashed
    monkeypatch.setattr(reproduce, "UNPACKED_FLOOR", 1 << 20)
    with pytest.raises(IntegrityError, match=r"unpacks to more than 9,37.,... bytes from 29.,... compressed .*, at least 1 MiB.*not compared, refused"):
        reproduce._files(store, desc)


def test_a_layer_that_claims_a_larger_size_gets_no_larger_cap(monkeypatch):
    """A manifest's size is checked against the blob only at its end: a rebuilt layer claiming 2 GiB
    for 0.3 MiB of gzip'd zeros would lift the cap to 64 GiB. The cap follows the compressed bytes
    actually read (32 times them), so it stops where the honest claim's would."""
    import dataclasses

    from bakery.errors import IntegrityError
    from bakery.oci.refs import Descriptor
    from bakery.release import reproduce

    blob = zeros_layer(64 << 20)
    honest = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
    lying = dataclasses.replace(honest, size=2 << 30)
    store = type("Store", (), {"stream": lambda self, d: iter([blob[i:i + 4096] for i in range(0, len(blob), 4096)])})()
    monkeypatch.setattr(reproduce, "UNPACKED_FLOOR", 1 << 20)
    with pytest.raises(IntegrityError, match="not compared, refused"):
        reproduce._files(store, lying)


def test_a_rebuilt_manifest_cannot_multiply_what_the_comparison_unpacks(monkeypatch):
    """Third attacker review of issue 50 item 6: a hostile revision's manifest listed one small gzip
    (1 GiB unpacked) 25,000 times, and each was unpacked outside the sandbox's time limit. Each
    distinct rebuilt layer is unpacked once, those past the original's count by more than
    EXTRA_LAYERS are named only, and together they unpack to no more than the original's may."""
    import json

    from bakery.errors import IntegrityError
    from bakery.oci.refs import Descriptor
    from bakery.release import reproduce

    monkeypatch.setattr(reproduce, "UNPACKED_FLOOR", 1 << 20)
    gzip = "application/vnd.oci.image.layer.v1.tar+gzip"
    small = {d.digest: blob for blob in (zeros_layer(1000), zeros_layer(2000), zeros_layer(900 << 10))
             for d in [Descriptor.of(gzip, blob)]}
    blobs = list(small.items())
    unpacked: list[str] = []

    def store(name):
        def stream(self, d):
            unpacked.append(f"{name}:{d.digest}")
            return iter([small[d.digest]])
        return type("Store", (), {"stream": stream})()

    def manifest(*digests) -> bytes:
        return json.dumps({"config": {"digest": "sha256:" + "0" * 64},
                           "layers": [Descriptor(gzip, d, len(small[d])).to_json() for d in digests]}).encode()

    original = manifest(blobs[0][0])
    rebuilt = manifest(*[blobs[1][0]] * 1000)  # one layer, listed 1,000 times
    diffs = reproduce.differences(store("original"), original, store("rebuilt"), rebuilt)
    assert unpacked.count(f"rebuilt:{blobs[1][0]}") == 1
    assert [d.get("same_as_layer") for d in diffs[1:1 + reproduce.EXTRA_LAYERS]] == [0] * reproduce.EXTRA_LAYERS
    assert diffs[-1]["rebuilt"] == f"{1000 - 1 - reproduce.EXTRA_LAYERS} more layers, not unpacked"
    # the original's one small layer may unpack to 1 MiB (the floor here): a rebuilt one of 900 KiB
    # fits, the same twice more (distinct layers, each under its own cap) do not
    third = zeros_layer((900 << 10) + 1)
    small[Descriptor.of(gzip, third).digest] = third
    with pytest.raises(IntegrityError, match="the rebuilt layers unpack to more than the original's layers may"):
        reproduce.differences(store("original"), original, store("rebuilt"),
                              manifest(blobs[2][0], Descriptor.of(gzip, third).digest))


def test_a_workdir_a_stopped_rebuild_left_is_started_afresh(tmp_path):
    """A rebuild stopped after its clone (killed, or failed) leaves source/ and build/ in --workdir:
    the same command run again starts from nothing (git would not clone into source/: the rerun
    failed at once, test_crash's reproduce sweep)."""
    from bakery.errors import IntegrityError
    from bakery.release.reproduce import WORKDIR_MARK, Plan, claimed, rebuild

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "README").write_text("a revision without hip/\n")
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "r"]):
        git(repo, *args)
    work = tmp_path / "work"
    for left in ("source/.git", "build/output/layout"):
        (work / left).mkdir(parents=True)
    (work / WORKDIR_MARK).touch()  # made by a rebuild
    plan = Plan(str(repo), git(repo, "rev-parse", "HEAD"), False, "127.0.0.1:1/b@sha256:" + "0" * 64, 1, None)
    with pytest.raises(IntegrityError, match="hip/ is not a folder"), claimed(work):  # read as far as hip/
        rebuild(plan, work, None, log=lambda m: None)
    assert (work / "source" / "README").exists() and not (work / "build").exists()


def test_a_workdir_a_rebuild_did_not_make_or_one_in_use_is_refused_and_kept(tmp_path):
    """`--workdir .` in a project, or ~: its own build/ and source/ are not a stopped rebuild's to
    remove (they were, whatever the folder); a second reproduce in the same workdir at once waits
    for no one and removes nothing (it removed the first one's clone under it)."""
    from bakery.errors import EnvironmentProblem, InputError
    from bakery.release.reproduce import claimed

    home = tmp_path / "home"
    (home / "build").mkdir(parents=True)
    (home / "build" / "mine").write_text("a user's\n")
    with pytest.raises(InputError, match="was not made by a rebuild"), claimed(home):
        pass
    assert (home / "build" / "mine").read_text() == "a user's\n"
    work = tmp_path / "work"
    with claimed(work):
        (work / "source").mkdir()
        with pytest.raises(EnvironmentProblem, match="another reproduce is rebuilding in"), claimed(work):
            pass
        assert (work / "source").is_dir()
    with claimed(work):  # the first one over: the next is ours, and starts from nothing
        assert not (work / "source").exists()


def served_repository(tmp_path: Path) -> tuple[Path, Path]:
    """(a repository of one commit that a file:// clone reads, an empty HOME for the server's config)."""
    repo, home = tmp_path / "repo", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    (repo / "f").write_text("a\n")
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "r"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True)
    return repo, home


def test_a_remote_that_says_the_disk_is_full_is_not_taken_for_our_disk(tmp_path, monkeypatch):
    """Found by review: the rebuild read "No space left on device" in any line git printed, the
    server's `remote:` lines included, so the revision's repository could turn its own failure into
    "the disk is full at TMPDIR". Here a real upload-pack's pack-objects hook (the server) says it."""
    from bakery.errors import EnvironmentProblem
    from bakery.release import reproduce

    repo, home = served_repository(tmp_path)
    hook = tmp_path / "hook"
    hook.write_text("#!/bin/sh\necho 'No space left on device' >&2\nexit 1\n")
    hook.chmod(0o755)
    (home / ".gitconfig").write_text(f"[uploadpack]\n\tpackObjectsHook = {hook}\n")  # read only from a protected config
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(EnvironmentProblem) as failed:
        reproduce._git("-c", "protocol.file.allow=always", "clone", "-q", "--no-checkout", "--", f"file://{repo}",
                       str(tmp_path / "source"), writes=tmp_path)
    assert "disk is full" not in str(failed.value) and str(failed.value).startswith("git clone: "), failed.value


@pytest.mark.parametrize("server", ["sideband", "ERR"])
def test_the_remotes_words_past_a_line_break_of_ours_are_not_taken_for_our_disk(tmp_path, monkeypatch, server):
    """Found by review: the server could still say "No space left on device" on a line that did not
    start `remote:`. Its sideband text was split at \\x1c (str.splitlines(); git splits at CR and LF
    only), and git's `fatal: remote error:` (an ERR packet) keeps the line breaks of the server's text.
    Here a real upload-pack's pack-objects hook says the one, a stand-in upload-pack the other."""
    from bakery.errors import EnvironmentProblem
    from bakery.release import reproduce

    repo, home = served_repository(tmp_path)
    server_side = tmp_path / "server"
    options = []
    if server == "sideband":  # its request read first: upload-pack relays what it says, not a broken pipe
        server_side.write_text("#!/bin/sh\ncat >/dev/null\nprintf 'oops\\034No space left on device\\n' >&2\nexit 1\n")
        (home / ".gitconfig").write_text(f"[uploadpack]\n\tpackObjectsHook = {server_side}\n")
    else:
        text = b"ERR from the server\nNo space left on device"
        server_side.write_bytes(b"#!/bin/sh\nprintf '%04x%s'\n" % (len(text) + 4, text.replace(b"\n", b"\\n")))
        options = [f"--upload-pack={server_side}"]
    server_side.chmod(0o755)
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(EnvironmentProblem) as failed:
        reproduce._git("-c", "protocol.file.allow=always", "clone", "-q", "--no-checkout", *options, "--",
                       f"file://{repo}", str(tmp_path / "source"), writes=tmp_path)
    assert "disk is full" not in str(failed.value) and str(failed.value).startswith("git clone: "), failed.value
    if server == "ERR":  # git's last line, the server's: shown as its
        assert str(failed.value) == "git clone: remote: No space left on device", failed.value
