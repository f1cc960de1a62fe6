"""The module Python imports is the overlay, and the base's distributions are named as the engine
holds them. A base can put beside an overlaid NAME.py what Python's import system takes first: an
extension module of any ABI tag (NAME.*.so, NAME.so: extensions come before source in each folder),
bytecode of any tag in __pycache__ (used while its recorded size and mtime match), a package folder
NAME/. The build whites out the first two in its own layer and refuses the third. The judge is the
image's own Python under Docker: a real `importlib.import_module` of each overlaid module must
execute the overlay's code.

One build serves both halves (the suite's time): its base adds shadows beside every overlaid module
and makes vllm's METADATA a hard link whose target a later layer replaces."""

from __future__ import annotations

import functools
import gzip
import hashlib
import io
import json
import tarfile
from types import SimpleNamespace

import pytest

from bakery.base import spec as base_mod
from bakery.inputs import overlays as overlays_mod
from bakery.oci.refs import Descriptor, Reference
from bakery.oci.registry import OCI_MANIFEST, Registry
from bakery.trust import record as record_mod, sbom
from support import copy_project, docker, invoke, last_line
from test_toolchain_root import tar

SITE = "usr/local/lib/python3.12/dist-packages"
WORKER = f"{SITE}/vllm/v1/kv_offload/cpu/gpu_worker.py"
FOLDER, NAME = WORKER.rsplit("/", 1)[0], "gpu_worker"
METADATA = f"{SITE}/vllm-0.26.0.dist-info/METADATA"
TARGET = "opt/vllm-metadata"  # what the METADATA is a hard link to
HELD, SEEN_LAST = "0.26.0+held", "0.26.0+seen.last"  # what the hard link holds; what its target name holds last

# run in the image, one fresh interpreter per module: import it for real (sys.meta_path, the path
# hooks, the finder cache, the loader's choice of extension, cached bytecode or source) and catch the
# code the loader executes. The fixture has no torch, so the module's own imports would fail: its
# parent packages are made from their real specs without running them, and the "exec" audit event
# (the source and bytecode loaders run the module with builtin exec) hands over the module's code
# object, and stops it. An extension module never raises that event: nothing is caught, and the
# import's error says what Python took instead.
ONE = r"""
import importlib, importlib.machinery, importlib.util, json, sys
site, path = sys.argv[1:]
name = path[len(site) + 1:-3].replace("/", ".").removesuffix(".__init__")
sys.path.insert(0, site)  # the image's Python is 3.11; the base installs vLLM for 3.12's folder
parts = name.split(".")
for i in range(1, len(parts)):
    above = sys.modules[".".join(parts[:i - 1])] if i > 1 else None
    spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:i]), above.__path__ if above else None)
    sys.modules[spec.name] = package = importlib.util.module_from_spec(spec)  # not executed
    if above:
        setattr(above, parts[i - 1], package)
ran = []
class Caught(BaseException):
    pass
def hook(event, args):
    if event == "exec" and not ran and hasattr(args[0], "co_filename"):  # the first code run is the module's
        ran.append(args[0])
        raise Caught
sys.addaudithook(hook)
error = None
try:
    importlib.import_module(name)
except Caught:
    pass
except BaseException as e:
    error = f"{type(e).__name__}: {e}"
# code objects compare by their bytecode, constants and names, nested code included (marshal's bytes
# would not do: they depend on reference counts)
file = ran[0].co_filename if ran else None  # a cached bytecode's is set to its source's path
same = file == path and ran[0] == compile(open(path, "rb").read(), path, "exec", dont_inherit=True)
print(json.dumps({"file": file, "same": same, "error": error}))
"""
JUDGE = f"""
import json, subprocess, sys
ONE = {ONE!r}
said = {{}}
for path in sys.argv[2:]:
    done = subprocess.run([sys.executable, "-c", ONE, sys.argv[1], path], capture_output=True, text=True)
    crashed = {{"file": None, "same": False, "error": done.stderr[-400:]}}
    said[path] = json.loads(done.stdout) if done.returncode == 0 else crashed
print(json.dumps(said))
"""


def judge(ref: str, targets: list[str]) -> dict[str, dict]:
    """{target: {file, same, error}}: the file whose code a real import of the module executed (None:
    no code ran), whether that code is the target's source, and the import's error, if any."""
    docker("pull", "-q", ref)
    said = docker("run", "--rm", "--entrypoint", "python3", ref, "-c", JUDGE, "/" + SITE, *targets).stdout
    return json.loads(said)


# run in the image: bytecode its own Python takes for any source, without looking at the source
# (hash-based and unchecked: PEP 552), of another module than the overlay
BYTECODE = """
import importlib.util, marshal
code = compile("RAN = 'the base, not the overlay'\\n", "x", "exec")
print((importlib.util.MAGIC_NUMBER + (0b01).to_bytes(4, "little") + bytes(8) + marshal.dumps(code)).hex())
"""


def shadows(targets: list[str], pyc: bytes) -> list[tuple]:
    """What would run instead of each overlaid module: extension modules of two ABI tags, and `pyc`
    under the image's own tag (what Python takes once no extension is there) and other tags."""
    out = []
    for target in targets:
        folder, name = target.lstrip("/").rsplit("/", 1)
        stem = name.removesuffix(".py")
        out += [(f"{folder}/{stem}.cpython-311-x86_64-linux-gnu.so", "file", b"\x7fELF not really", 0o644),
                (f"{folder}/{stem}.abi3.so", "file", b"\x7fELF not really", 0o644),
                (f"{folder}/__pycache__/{stem}.cpython-311.pyc", "file", pyc, 0o644),
                (f"{folder}/__pycache__/{stem}.cpython-311.opt-1.pyc", "file", pyc, 0o644),
                (f"{folder}/__pycache__/{stem}.cpython-310.pyc", "file", pyc, 0o644)]
    return out


def with_layers(registry: str, base: Reference, raws: list[bytes], repo: str) -> Reference:
    """The base plus these layers, pushed as an image of its own."""
    reg = Registry(registry)
    image = base_mod.resolve(reg, base, "linux/amd64")
    for d in image.layers:
        reg.mount_blob(repo, d.digest, image.ref.repository)
    config = json.loads(json.dumps(image.config))
    layers = [Descriptor(d.media_type, d.digest, d.size).to_json() for d in image.layers]
    for raw in raws:
        blob = gzip.compress(raw, mtime=0)
        desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
        reg.upload_blob(repo, desc, functools.partial(iter, [blob]))
        config["rootfs"]["diff_ids"].append(str(Descriptor.of("", raw).digest))
        layers.append(desc.to_json())
    cfg = json.dumps(config).encode()
    cfg_desc = Descriptor.of("application/vnd.oci.image.config.v1+json", cfg)
    reg.upload_blob(repo, cfg_desc, lambda: iter([cfg]))
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg_desc.to_json(),
                           "layers": layers}).encode()
    return Reference(registry, repo, None, reg.put_manifest(repo, "latest", manifest, OCI_MANIFEST))


def metadata_saying(version: str) -> bytes:
    return f"Metadata-Version: 2.4\nName: vllm\nVersion: {version}\nAuthor: vLLM Team\n".encode()


def version_of(metadata: str) -> str:
    return metadata.split("\nVersion: ", 1)[1].split("\n", 1)[0]


@pytest.fixture(scope="module")
def built(registry, fixture_base, fixture_lock, tmp_path_factory):
    """One build over a base of two added layers. The first puts the shadows beside every overlaid
    module and makes vllm's METADATA a hard link to a file it gave just before; the second replaces
    that file's name with other bytes. A hard link is the inode of its moment (the engines agree:
    tests/test_engines.py), so the METADATA holds the first bytes, not the last under its target's
    name. (One layer that hard-links and then replaces the target is refused: the engines disagree.)"""
    targets = sorted(o["target"] for o in json.loads(fixture_lock)["overlays"] if o["target"].endswith(".py"))
    held = TARGET
    pyc = bytes.fromhex(docker("run", "--rm", "--entrypoint", "python3", str(fixture_base), "-c", BYTECODE).stdout)
    added = tar(*shadows(targets, pyc), (held, "file", metadata_saying(HELD), 0o644),
                (METADATA, "hardlink", held, 0o644))
    base = with_layers(registry, fixture_base, [added, tar((held, "file", metadata_saying(SEEN_LAST), 0o644))],
                       "test/shadowed-base")
    where = tmp_path_factory.mktemp("imports")
    project = copy_project(where / "project", fixture_lock)
    lock = where / "overlays.lock"
    env = {"BAKERY_SMOKE_LEDGER": str(where / "smoke-ledger.json")}
    assert invoke(project, "lock", "--base", str(base), "--lock", str(lock), env=env).returncode == 0
    done = invoke(project, "build", "--base", str(base), "--lock", str(lock), "--push", f"{registry}/test/shadowed:1",
                  env=env)
    assert done.returncode == 0, done.stderr
    rec = record_mod.read(project / "out" / "build-record.json")
    ref = Reference.parse(last_line(done))
    return SimpleNamespace(base=base, image=str(ref), targets=targets, record=rec,
                           sbom=sbom.predicate(rec, ref.name))


def test_every_overlaid_module_is_what_a_real_import_runs_whatever_the_base_put_beside_it(built):
    overlaid = sorted(o.target for o in built.record.overlays if o.baked and o.target.endswith(".py"))
    assert overlaid == built.targets and "/" + WORKER in overlaid
    # the control: in the base as it is, each import takes the extension module, never the source
    control = judge(str(built.base), overlaid)
    for target in overlaid:
        folder, stem = target.rsplit("/", 1)[0], target.rsplit("/", 1)[1][:-3]
        assert control[target]["file"] is None, (target, control[target])
        assert f"{folder}/{stem}.cpython-311-x86_64-linux-gnu.so" in (control[target]["error"] or ""), \
            (target, control[target])
    # the derived image: each import executes exactly the overlay's code
    result = judge(built.image, overlaid)
    assert {t: (r["file"], r["same"], r["error"]) for t, r in result.items()} == \
        {t: (t, True, None) for t in overlaid}
    whited = {d.path for d in built.record.deleted}
    for target in overlaid:
        folder, stem = target.rsplit("/", 1)[0], target.rsplit("/", 1)[1][:-3]
        assert {f"{folder}/{stem}.cpython-311-x86_64-linux-gnu.so", f"{folder}/{stem}.abi3.so",
                f"{folder}/__pycache__/{stem}.cpython-311.pyc", f"{folder}/__pycache__/{stem}.cpython-311.opt-1.pyc",
                f"{folder}/__pycache__/{stem}.cpython-310.pyc"} <= whited


def test_the_record_and_sbom_name_the_distribution_version_the_engine_holds(built):
    """vllm's METADATA is a hard link made before its target's name got other bytes: Docker's
    container reads the first bytes, and so must the signed record and the SBOM."""
    held, last = (docker("run", "--rm", "--entrypoint", "cat", built.image, "/" + p).stdout for p in (METADATA, TARGET))
    # the engine holds the inode of the link's moment; its target's name, the later bytes
    assert (version_of(held), version_of(last)) == (HELD, SEEN_LAST)
    recorded = [d for d in built.record.base.python_distributions if d.name == "vllm"]
    assert [(d.version, d.metadata, d.sha256) for d in recorded] == \
        [(HELD, "/" + METADATA, hashlib.sha256(held.encode()).hexdigest())]
    described = [p for p in built.sbom["packages"] if p["name"] == "vllm"]
    assert [(p["versionInfo"], p["externalRefs"][0]["referenceLocator"]) for p in described] == \
        [(HELD, f"pkg:pypi/vllm@{HELD.replace('+', '%2B')}")]


def test_a_package_of_the_overlaid_modules_name_refuses_the_base(registry, fixture_base, project, tmp_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        info = tarfile.TarInfo(f"{FOLDER}/{NAME}/__init__.py")
        info.size = 6
        t.addfile(info, io.BytesIO(b"X = 1\n"))
    packaged = with_layers(registry, fixture_base, [out.getvalue()], "test/packaged-base")
    said = judge(str(packaged), ["/" + WORKER])["/" + WORKER]
    assert said["file"] == f"/{FOLDER}/{NAME}/__init__.py", said  # the control: Python takes the package
    for task in ("lock", "build"):  # neither locks nor builds over it
        done = invoke(project, task, "--base", str(packaged), "--lock", str(tmp_path / "overlays.lock"))
        errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
        assert done.returncode == 5 and len(errors) == 1 and "Python would import that package" in errors[0], \
            done.stderr


@pytest.mark.parametrize("target, present, whited", [
    ("/a/b/m.py", ["a/b/__pycache__/m.cpython-312.pyc", "a/b/__pycache__/m.cpython-312.opt-2.pyc",
                   "a/b/__pycache__/mx.cpython-312.pyc", "a/b/m.cpython-312-x86_64-linux-gnu.so", "a/b/m.so",
                   "a/b/m.abi3.so", "a/b/mm.so", "a/b/c/m.so"],
     ["/a/b/__pycache__/m.cpython-312.opt-2.pyc", "/a/b/__pycache__/m.cpython-312.pyc", "/a/b/m.abi3.so",
      "/a/b/m.cpython-312-x86_64-linux-gnu.so", "/a/b/m.so"]),
    ("/a/b/__init__.py", ["a/b/__init__.abi3.so", "a/b/__pycache__/__init__.cpython-311.pyc"],
     ["/a/b/__init__.abi3.so", "/a/b/__pycache__/__init__.cpython-311.pyc"]),
])
def test_what_would_shadow_a_module_is_found_and_nothing_else(target, present, whited):
    """Pure: the patterns find every tag of both kinds, and nothing of another name or folder."""
    import fnmatch

    matched = [p for p in present if any(fnmatch.fnmatchcase(p, g) for g in overlays_mod.shadow_patterns([target]))]
    assert overlays_mod.stale_bytecode([target], matched) == whited
    assert overlays_mod.package_shadows([target]) == ([] if target.endswith("__init__.py") else [target[1:-3]])
