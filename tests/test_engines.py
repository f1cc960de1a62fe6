"""The merged view against three real engines: what bakery reads of a base is what Docker 20.10
(overlay2), containerd 1.6 (its applier and overlayfs snapshotter, via `ctr`) and podman 5
(containers/storage, vfs driver) unpack, or bakery refuses the base.

A corpus of crafted layers, written from the engines' rules (tar names cleaned as Go cleans them,
whiteouts and opaque folders, an entry replacing what was there, hard links to the inode of their
moment), is pushed to the local registry as real images. Each engine pulls each image; its root
filesystem (Docker's `docker export`, containerd's read-only mount of the image, podman's image
mount) is the reference. Bakery's side is both of its readers: the folder base/extract.py makes
(the compile's root) and BaseFilesystem.read(), which the overlays, the proofs and the SBOM read.
The cases the engines would unpack apart are in test_layer_rules.py (pure) and, through the
registry, at the end of this file."""

from __future__ import annotations

import hashlib
import io
import subprocess
import tarfile

import pytest

from bakery.base import spec as base_mod
from bakery.base.filesystem import BaseFilesystem
from bakery.base.layercache import LayerCache
from bakery.errors import IntegrityError
from bakery.oci.registry import Registry
from support import containerd_view, docker_export, podman_views, push_image, tree_of
from test_layer_rules import REFUSED, layer
from test_toolchain_root import busybox_layer, comparable, root_of, tar

ENGINES = ("docker", "containerd", "podman")


def gnu_tar(*members) -> bytes:
    """A layer in GNU tar's format (long names as ././@LongLink entries), as older builders wrote."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


LONG = "l" * 60 + "/" + "o" * 70 + "/" + "n" * 90  # over ustar's 100 and 155 bytes

# what honest image builders write, each case something the merged view must get right
CASES = {
    "whiteout and replace": [
        tar(("a", "dir", b"", 0o755), ("a/keep", "file", b"keep\n", 0o644), ("a/gone", "file", b"old\n", 0o644),
            ("a/swap", "file", b"v1\n", 0o644)),
        tar(("a/.wh.gone", "file", b"", 0o644), ("a/swap", "file", b"v2\n", 0o755))],
    "opaque folder keeps what its own layer adds": [
        tar(("d", "dir", b"", 0o755), ("d/old", "file", b"old\n", 0o644), ("d/sub", "dir", b"", 0o755),
            ("d/sub/deep", "file", b"deep\n", 0o644)),
        tar(("d", "dir", b"", 0o755), ("d/.wh..wh..opq", "file", b"", 0o644), ("d/new", "file", b"new\n", 0o644))],
    "a folder replaced by a file, a file by a folder, a link by a folder": [
        tar(("x", "dir", b"", 0o755), ("x/in", "file", b"in\n", 0o644), ("y", "file", b"y\n", 0o644),
            ("z", "symlink", "x", 0o777)),
        tar(("x", "file", b"now a file\n", 0o644), ("y", "dir", b"", 0o755), ("y/in", "file", b"in y\n", 0o644),
            ("z", "dir", b"", 0o755), ("z/own", "file", b"own\n", 0o644))],
    "a folder and a file replaced by links": [
        tar(("x", "dir", b"", 0o755), ("x/in", "file", b"in\n", 0o644), ("y", "file", b"y\n", 0o644),
            ("t", "dir", b"", 0o755)),
        tar(("x", "symlink", "t", 0o777), ("y", "symlink", "/nowhere", 0o777))],
    "hard links to the inode of the moment, links kept as links": [
        tar(("h", "dir", b"", 0o755), ("h/f", "file", b"first\n", 0o755), ("h/g", "hardlink", "h/f", 0o755),
            ("h/abs", "symlink", "/h/f", 0o777), ("h/rel", "symlink", "f", 0o777),
            ("h/dangling", "symlink", "/nowhere", 0o777)),
        tar(("h/f", "file", b"second\n", 0o644))],
    "a hard link outlives the name it was made from": [
        tar(("m", "dir", b"", 0o755), ("m/METADATA", "file", b"Version: 0.26.0\n", 0o644),
            ("m/again", "hardlink", "m/METADATA", 0o644), ("m/third", "hardlink", "m/again", 0o644)),
        tar(("m/.wh.METADATA", "file", b"", 0o644)),
        tar(("m/METADATA", "file", b"Version: 9.9.9\n", 0o644))],
    "a folder whited out whole, then given again": [
        tar(("w", "dir", b"", 0o755), ("w/a", "file", b"a\n", 0o644), ("w/b", "dir", b"", 0o755),
            ("w/b/c", "file", b"c\n", 0o644), ("v", "dir", b"", 0o755), ("v/x", "file", b"x\n", 0o644)),
        tar((".wh.w", "file", b"", 0o644), ("v/.wh.x", "file", b"", 0o644)),
        tar(("w", "dir", b"", 0o755), ("w/new", "file", b"new\n", 0o644))],
    "opaque folders and whiteouts over three layers": [
        tar(("o", "dir", b"", 0o755), ("o/p", "dir", b"", 0o755), ("o/p/q", "file", b"q\n", 0o644),
            ("o/keep", "file", b"k\n", 0o644), ("o/link", "symlink", "keep", 0o777)),
        tar(("o/p", "dir", b"", 0o755), ("o/p/.wh..wh..opq", "file", b"", 0o644), ("o/p/r", "file", b"r\n", 0o644),
            ("o/.wh.link", "file", b"", 0o644)),
        tar(("o/.wh.keep", "file", b"", 0o644), ("o/p/s", "file", b"s\n", 0o644), ("o/link", "file", b"f\n", 0o644))],
    "whiteouts and opaque markers under folders no layer gives": [
        tar(("a", "file", b"a\n", 0o644)),
        tar(("gone/.wh.x", "file", b"", 0o644), ("empty/.wh..wh..opq", "file", b"", 0o644),
            ("deeper/still/.wh.y", "file", b"", 0o644))],
    "names as the engines clean them": [
        tar(("./p", "dir", b"", 0o755), ("./p/one", "file", b"1\n", 0o644), ("/p/two", "file", b"2\n", 0o644),
            ("p//three", "file", b"3\n", 0o644), ("p/./four", "file", b"4\n", 0o644),
            ("p/q/../five", "file", b"5\n", 0o644))],
    "long and non-ASCII names, PAX and GNU": [
        tar((LONG, "file", b"pax\n", 0o644), ("ünï/cödé.py", "file", b"u\n", 0o644)),
        gnu_tar((LONG + "2", b"gnu\n"), ("g/" + "x" * 120, b"gx\n"))],
    "implicit folders and odd modes made plain": [
        tar(("deep/er/still/file", "file", b"f\n", 0o600), ("ro", "dir", b"", 0o500), ("ro/x", "file", b"x\n", 0o400))],
}


@pytest.fixture(scope="module")
def pushed(registry) -> dict:
    """Each case as an image in the local registry (with a /bin/true, which `docker create` needs)."""
    return {case: push_image(registry, f"test/engines-{hashlib.sha256(case.encode()).hexdigest()[:12]}",
                             [busybox_layer(), *layers]) for case, layers in CASES.items()}


@pytest.fixture(scope="module")
def views(registry, pushed, tmp_path_factory) -> dict:
    """{(case, engine): the engine's root filesystem}; podman's node pulls every case in one run."""
    found = {}
    for case, ref in pushed.items():
        found[case, "docker"] = docker_export(ref)
        found[case, "containerd"] = containerd_view(ref)
    for case, view in podman_views(registry, pushed, tmp_path_factory.mktemp("podman")).items():
        assert view is not None, f"podman refused {case!r}"
        found[case, "podman"] = view
    return found


def filesystem(ref, tmp_path) -> BaseFilesystem:
    registry = Registry(ref.registry)
    return BaseFilesystem(registry, base_mod.resolve(registry, ref, "linux/amd64"), LayerCache(tmp_path / "cache"))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_extracted_folder_is_what_the_engine_unpacks(case, engine, pushed, views, tmp_path):
    ours = tree_of(root_of(pushed[case], tmp_path).path)
    # an engine keeps a file's mode; we keep only whether it may be run (the compile only reads and runs)
    assert comparable(ours) == comparable(views[case, engine])


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_each_path_read_is_what_the_engine_holds(case, engine, pushed, views, tmp_path):
    """Every path the engine holds, and every name any layer gives, read as the build reads it: a
    file with the engine's bytes (a hard link's are its inode's), a link with its target, a folder
    as a folder, and what the engine does not hold as absent; a glob finds each file and link."""
    theirs = comparable(views[case, engine])
    fs = filesystem(pushed[case], tmp_path)
    fs.check_merge()
    named = {p for d in fs.image.layers for p in fs._index(d, set())["entries"]}
    read = fs.read(set(theirs) | named)
    ours = {}
    for path, f in comparable(read).items():
        if f is None:
            continue
        if f.kind in ("file", "hardlink"):
            ours[path] = ("file", f.sha256)
        else:
            ours[path] = (f.kind, f.linkname if f.kind == "symlink" else None)
    assert ours == {p: (kind, what) for p, (kind, what, _) in theirs.items()}
    # a glob (the SBOM's dist-info, an __init__ beside an overlay, stale bytecode) finds what the engine holds
    globbed = set(comparable(dict.fromkeys(fs.glob("*"))))
    assert {p for p, (kind, _, _) in theirs.items() if kind != "dir"} <= globbed <= set(theirs)


def outcome(read, ref):
    """An engine's view of `ref` (the shell layer below it included: an opaque marker on the root
    hides it in one engine and not another), or that it refused it."""
    try:
        view = read(ref)
    except subprocess.CalledProcessError:
        return "refused"
    return "refused" if view is None else comparable(view)


# what bakery refuses across layers (base/filesystem.py's check_merge), as the engines unpack it:
# Docker and containerd put a folder over a lower link or file, podman's vfs writes through the link
# and fails on the file; a hard link to a lower layer's file fails in Docker and containerd, not podman
ACROSS = {
    "a write through a link a lower layer gives": (
        [tar(("t", "dir", b"", 0o755), ("l", "symlink", "t", 0o777)), tar(("l/x", "file", b"x\n", 0o644))],
        "writes under /l, which the layers below give as symlink"),
    "a write through an absolute link a lower layer gives": (
        [tar(("t", "dir", b"", 0o755), ("l", "symlink", "/t", 0o777)), tar(("l/x", "file", b"x\n", 0o644))],
        "writes under /l, which the layers below give as symlink"),
    "a write into a file a lower layer gives": (
        [tar(("f", "file", b"f\n", 0o644)), tar(("f/y", "file", b"y\n", 0o644))],
        "writes under /f, which the layers below give as file"),
    "a whiteout through a link a lower layer gives": (
        [tar(("t", "dir", b"", 0o755), ("t/x", "file", b"x\n", 0o644), ("l", "symlink", "t", 0o777)),
         tar(("l/.wh.x", "file", b"", 0o644))],
        "writes under /l, which the layers below give as symlink"),
    "a file before its folder, over a link a lower layer gives": (
        [tar(("t", "dir", b"", 0o755), ("l", "symlink", "t", 0o777)),
         tar(("l/x", "file", b"x\n", 0o644), ("l", "dir", b"", 0o755))],
        "writes under /l, which the layers below give as symlink"),
    "a hard link to a file a lower layer gives": (
        [tar(("f", "file", b"f\n", 0o644)), tar(("h", "hardlink", "f", 0o644))],
        "is a hard link to 'f', which is not a file this layer gave before"),
}
# why each is refused, as the three engines were seen to unpack it: they disagree (one refuses what
# another unpacks, or they unpack it differently), every one of them fails on it, or they read it
# alike but no image builder writes it (bakery refuses rather than guess which of them a node runs)
APART, ALL_FAIL, NO_BUILDER = "the engines disagree", "every engine fails", "no image builder writes it"
GROUND = {
    "a name twice": APART, "a folder the layer then makes a file": APART,
    "a write through a link the layer made": APART, "a whiteout of a folder it fills": APART,
    "an opaque marker in what it gives as a file": APART, "a hard link whose target is then replaced": APART,
    "under an AUFS folder": APART, "an opaque marker on the root": APART,
    "a write under a file the layer made": ALL_FAIL, "a hard link to what the layer does not hold": ALL_FAIL,
    "a hard link to a name given after it": ALL_FAIL, "a hard link to a folder": ALL_FAIL,
    "a hard link out of the root": ALL_FAIL,
    "a name twice, spelled two ways": NO_BUILDER, "a file before the link over its folder": NO_BUILDER,
    "a whiteout of what the layer gives": NO_BUILDER, "an AUFS name": NO_BUILDER,
    "a name out of the root": NO_BUILDER,
} | dict.fromkeys(ACROSS, APART)


@pytest.fixture(scope="module")
def refused(registry, tmp_path_factory) -> dict:
    """{case: (its image, {engine: what the engine made of it})} for every refused case."""
    cases = {name: ([layer(*members)], said) for name, (members, said) in REFUSED.items()} | ACROSS
    refs = {case: push_image(registry, f"test/refused-{hashlib.sha256(case.encode()).hexdigest()[:12]}",
                             [busybox_layer(), *layers]) for case, (layers, _) in cases.items()}
    podman = podman_views(registry, refs, tmp_path_factory.mktemp("podman"))
    return {case: (ref, cases[case][1], {"docker": outcome(docker_export, ref),
                                         "containerd": outcome(containerd_view, ref),
                                         "podman": outcome(podman.get, case)}) for case, ref in refs.items()}


@pytest.mark.parametrize("case", sorted(GROUND))
def test_a_base_the_engines_would_unpack_apart_is_refused(case, refused, tmp_path):
    """Pulled from the registry as a build reads a base: refused, naming the layer and the entry;
    and the engines do with it what its ground says."""
    ref, said, engines = refused[case]
    fs = filesystem(ref, tmp_path)
    with pytest.raises(IntegrityError) as error:
        fs.check_layers()
        fs.check_merge()
    message = str(error.value)
    assert said in message and message.endswith("refused"), message
    assert fs.image.layers[-1].digest.hex in message and "\n" not in message, message
    seen = list(engines.values())
    if GROUND[case] == APART:
        assert any(view != seen[0] for view in seen), engines
    elif GROUND[case] == ALL_FAIL:
        assert seen == ["refused"] * 3, engines
    else:
        assert "refused" not in seen and all(view == seen[0] for view in seen), engines


def test_every_refused_case_has_its_ground():
    assert set(GROUND) == set(REFUSED) | set(ACROSS)


def test_an_image_whose_layers_name_too_much_together_is_refused(registry, tmp_path, monkeypatch):
    """Each layer within its own limit, a thousand of them are not: the image's entries together
    are capped too (a small limit here; bench/bench_bounds.py measures the real one)."""
    import bakery.base.filesystem as filesystem_mod

    layers = [tar(*[(f"d{n}/f{i}", "file", b"", 0o644) for i in range(4)]) for n in range(3)]
    ref = push_image(registry, "test/engines-many", [busybox_layer(), *layers])
    monkeypatch.setattr(filesystem_mod, "IMAGE_ENTRIES_LIMIT", 10)
    with pytest.raises(IntegrityError, match="more than 10 entries together"):
        filesystem(ref, tmp_path).check_layers()
    monkeypatch.setattr(filesystem_mod, "IMAGE_ENTRIES_LIMIT", 40)
    filesystem(ref, tmp_path).check_layers()  # the control


def test_an_image_whose_layers_keep_too_much_together_is_refused(registry, tmp_path, monkeypatch):
    """Each layer within its own kept-bytes limit, a thousand of them filled the cache's disk (third
    attacker review of issue 50 item 5): what a base's layers keep is capped together (small here),
    charged as each file is read by whichever worker reads it (counted after the fact, the workers
    had run ahead and kept everything: fifth review), what the cached layers keep counted first (a
    second try adds nothing)."""
    import bakery.base.filesystem as filesystem_mod

    layers = [tar(*[(f"usr/share/doc/p{n}-{i}/copyright", "file", bytes([n, i]) * 50, 0o644) for i in range(2)])
              for n in range(12)]
    ref = push_image(registry, "test/engines-keeps-much", [busybox_layer(), *layers])
    registry_client = Registry(ref.registry)
    image = base_mod.resolve(registry_client, ref, "linux/amd64")
    keep = ("usr/share/doc/*/copyright",)
    monkeypatch.setattr(filesystem_mod, "IMAGE_KEPT_LIMIT", 500, raising=False)  # without the limit: read whole
    cache = LayerCache(tmp_path / "cache")

    def kept() -> int:
        return sum(f.stat().st_size for f in (tmp_path / "cache" / "files").iterdir() if f.is_file())

    with pytest.raises(IntegrityError, match="add up to more than 0 MiB together"):
        BaseFilesystem(registry_client, image, cache, keep).prefetch()
    assert kept() <= 500, kept()  # 12 layers of 200 bytes: at most two layers' kept files reached the cache
    with pytest.raises(IntegrityError, match="add up to more than 0 MiB together"):
        BaseFilesystem(registry_client, image, LayerCache(tmp_path / "cache"), keep).prefetch()
    assert kept() <= 500, kept()  # the layers cached already count first: nothing kept past the budget
    # a file a hard link names, which no keep pattern matched, is kept when the link is read: its
    # layer streamed again, charged too (sixth review: 512 MiB a layer, uncounted)
    linked = [tar((f"opt/z{n}", "file", bytes([n]) * 200, 0o644), (f"x/l{n}", "hardlink", f"opt/z{n}", 0o644))
              for n in range(12)]
    ref = push_image(registry, "test/engines-keeps-by-link", [busybox_layer(), *linked])
    image = base_mod.resolve(registry_client, ref, "linux/amd64")
    monkeypatch.setattr(filesystem_mod, "IMAGE_KEPT_LIMIT", 500)
    (tmp_path / "cache" / "files").mkdir(exist_ok=True)
    before = kept()
    with pytest.raises(IntegrityError, match="add up to more than 0 MiB together"):
        BaseFilesystem(registry_client, image, LayerCache(tmp_path / "cache"), ()).read([f"x/l{n}" for n in range(12)])
    assert kept() - before <= 500, kept() - before
    # the budget starts from what every cached layer keeps, not the layers this process touched: a
    # second image of the first one's cached layers and one new layer (seventh review: 511 MiB more)
    shared = [tar(*[(f"usr/share/doc/s{n}-{i}/copyright", "file", bytes([n, i, 7]) * 33 + b"!", 0o644)
                    for i in range(2)]) for n in range(2)]
    first_image = base_mod.resolve(registry_client, push_image(registry, "test/engines-keeps-first",
                                                               [busybox_layer(), *shared]), "linux/amd64")
    fresh = tar(*[(f"usr/share/doc/f-{i}/copyright", "file", bytes([9, i]) * 50, 0o644) for i in range(2)])
    second_image = base_mod.resolve(registry_client, push_image(registry, "test/engines-keeps-second",
                                                                [busybox_layer(), fresh, *shared]), "linux/amd64")
    monkeypatch.setattr(filesystem_mod, "IMAGE_KEPT_LIMIT", 2400)
    cache3 = tmp_path / "cache3"
    BaseFilesystem(registry_client, first_image, LayerCache(cache3), keep).prefetch()  # 400 bytes kept
    held = sum(f.stat().st_size for f in (cache3 / "files").iterdir() if f.is_file())
    monkeypatch.setattr(filesystem_mod, "IMAGE_KEPT_LIMIT", 500)
    with pytest.raises(IntegrityError, match="add up to more than 0 MiB together"):
        BaseFilesystem(registry_client, second_image, LayerCache(cache3), keep).check_layers()
    assert sum(f.stat().st_size for f in (cache3 / "files").iterdir() if f.is_file()) == held  # the new layer kept nothing
    monkeypatch.setattr(filesystem_mod, "IMAGE_KEPT_LIMIT", 2400)  # the control: 12 layers of 200 bytes
    BaseFilesystem(registry_client, image, LayerCache(tmp_path / "cache2"), keep).prefetch()


def test_a_build_refuses_a_base_whose_layers_would_merge_apart(registry, tmp_path):
    """Every command that opens a base checks how its layers merge, not only the toolchain's
    extraction: `invoke lock` on a base with a write through a lower layer's link stops there."""
    from support import ROOT, invoke

    layers, said = ACROSS["a write through a link a lower layer gives"]
    ref = push_image(registry, "test/engines-merge-apart", [busybox_layer(), *layers])
    lock = tmp_path / "overlays.lock"
    done = invoke(ROOT, "lock", "--base", str(ref), "--lock", str(lock), env={"BAKERY_CACHE": str(tmp_path / "c")})
    assert done.returncode == 5 and said in done.stderr, done.stderr
    assert not lock.exists()


def test_what_a_layer_hides_is_what_a_path_by_whiteout_walk_finds():
    """The merge check's view of the layers below (one pass, each whiteout removing its subtree)
    against the plain definition: a lower path is gone when it is whited out or lies under a
    whiteout or an opaque folder, and a folder a whiteout lies in is a folder."""
    import random

    from bakery.base.filesystem import _Merged

    rng = random.Random(7)
    paths = {"/".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(400)} | {"a", "ab", "a-b"}
    paths = {p for p in paths if not any(q.startswith(p + "/") for q in paths)} | {"a"}  # files, and "a" as one
    index = {"whiteouts": sorted(rng.sample(sorted(paths - {"ab", "a-b"}), 25)) + ["a"], "opaque": ["b/c", "zz"],
             "entries": {}}
    expected = {p for p in paths if not (any(p == w or p.startswith(w + "/") for w in index["whiteouts"]) or
                                         any(p.startswith(d + "/") for d in index["opaque"]))}
    merged = _Merged()
    merged.apply({"whiteouts": [], "opaque": [], "entries": {p: ["file", 0, 0o644, ""] for p in sorted(paths)}})
    merged.apply(index)
    assert {p for p in paths if merged.kind(p) is not None} == expected and {"ab", "a-b"} <= expected
    assert merged.kind("zz") == "dir" and merged.kind("b/c") == "dir"


@pytest.mark.parametrize("spelled", ["entrypoint", "ENTRYPOINT", "EntryPoint"])
def test_a_config_key_spelled_otherwise_is_what_docker_runs_and_the_base_is_refused(registry, spelled):
    """The build writes Entrypoint into the base's config object. Docker reads the config with Go's
    decoder, which takes a key for a field without case, the last one winning: a base's
    "entrypoint" after the Entrypoint (where canonical order puts it) is what Docker runs. The
    reference is Docker's own reading of such a config; bakery refuses the base that gives one."""
    import json

    from support import docker

    config = {"architecture": "amd64", "os": "linux", "config": {"Entrypoint": ["/ours"], spelled: ["/theirs"]}}
    ref = push_image(registry, "test/engines-config-case", [tar(("a", "file", b"a\n", 0o644))], config,
                     tag=hashlib.sha256(spelled.encode()).hexdigest()[:12])
    docker("pull", str(ref))
    try:
        said = docker("image", "inspect", "--format", "{{json .Config.Entrypoint}}", str(ref)).stdout
    finally:
        docker("rmi", str(ref), check=False)
    assert json.loads(said) == ["/theirs"]
    with pytest.raises(IntegrityError, match="Go reads them as one|twice"):
        base_mod.resolve(Registry(registry), ref, "linux/amd64")


def test_a_base_with_onbuild_triggers_is_refused_as_docker_would_run_them_in_our_build(registry, tmp_path):
    """Docker runs a base's ONBUILD triggers in a build FROM it and keeps none in the image it makes
    (the reference: Docker's own build). bakery runs no build steps: passing the triggers on would
    have them run in whoever builds FROM our image, and our image would lack what they do. Refused
    where a base is opened to derive from, before anything runs; a nightly the tracker keeps (one
    resolved, not opened) is not refused for it, so one such tag does not stop the tracking."""
    import json

    from bakery.bake.opened import open_base
    from support import ROOT, docker

    config = {"architecture": "amd64", "os": "linux", "config": {"OnBuild": ["LABEL onbuild=ran"]}}
    ref = push_image(registry, "test/engines-onbuild", [tar(("a", "file", b"a\n", 0o644))], config)
    (tmp_path / "Dockerfile").write_text(f"FROM {ref}\n")
    child = f"bakery-test-onbuild-child:{ref.digest.hex[:12]}"
    docker("build", "-q", "-t", child, str(tmp_path))
    try:
        made = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", child).stdout)
    finally:
        docker("rmi", child, str(ref), check=False)
    assert made.get("Labels") == {"onbuild": "ran"} and not made.get("OnBuild")
    with pytest.raises(IntegrityError, match="ONBUILD triggers"):
        open_base(ROOT, str(ref), log=lambda m: None)  # as build, lock, prove and rebase open their base
    assert base_mod.resolve(Registry(registry), ref, "linux/amd64").ref == ref  # the tracker may keep it
