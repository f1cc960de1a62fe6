"""The module Python imports is the overlay. A base can put beside an overlaid NAME.py what Python's
import system takes first: an extension module of any ABI tag (NAME.*.so, NAME.so: extensions come
before source in each folder), bytecode of any tag in __pycache__ (used while its recorded size and
mtime match), a package folder NAME/. The build whites out the first two in its own layer and
refuses the third. The judge is the image's own Python under Docker: its FileFinder (what `import`
uses for a folder) must name the overlay and run the overlay's code."""

from __future__ import annotations

import gzip
import io
import json
import tarfile

import pytest

from bakery.base import spec as base_mod
from bakery.inputs import overlays as overlays_mod
from bakery.oci.refs import Descriptor, Reference
from bakery.oci.registry import OCI_MANIFEST, Registry

from support import docker, invoke, last_line

WORKER = "usr/local/lib/python3.12/dist-packages/vllm/v1/kv_offload/cpu/gpu_worker.py"
FOLDER, NAME = WORKER.rsplit("/", 1)[0], "gpu_worker"

# run in the image: which file a FileFinder over the folder takes for the module, and whether the code
# it runs is the source's (an extension module or a cached bytecode would be something else)
JUDGE = f"""
import importlib._bootstrap_external as b, importlib.machinery as m
finder = m.FileFinder("/{FOLDER}", *b._get_supported_file_loaders())
spec = finder.find_spec("{NAME}")
source = open("/{WORKER}", "rb").read()
ran = spec.loader.get_code("{NAME}") if hasattr(spec.loader, "get_code") else None
# code objects compare by their bytecode, constants and names, nested code included (marshal's bytes
# would not do: they depend on reference counts)
same = ran is not None and ran == compile(source, spec.origin, "exec", dont_inherit=True)
print(spec.origin, type(spec.loader).__name__, same)
"""


def shadows() -> bytes:
    """A layer of what would run instead of gpu_worker.py: extension modules of two ABI tags and
    bytecode of other tags, each a different module than the source."""
    bogus = compile("RAN = 'the base, not the overlay'\n", "x", "exec")
    import importlib.util
    import marshal

    pyc = importlib.util.MAGIC_NUMBER + b"\0" * 12 + marshal.dumps(bogus)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for name, data in ((f"{FOLDER}/{NAME}.cpython-311-x86_64-linux-gnu.so", b"\x7fELF not really"),
                           (f"{FOLDER}/{NAME}.abi3.so", b"\x7fELF not really"),
                           (f"{FOLDER}/__pycache__/{NAME}.cpython-311.opt-1.pyc", pyc),
                           (f"{FOLDER}/__pycache__/{NAME}.cpython-310.pyc", pyc)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    return out.getvalue()


def with_layer(registry: str, base: Reference, raw: bytes, repo: str) -> Reference:
    """The base plus one layer, pushed as an image of its own."""
    reg = Registry(registry)
    image = base_mod.resolve(reg, base, "linux/amd64")
    blob = gzip.compress(raw, mtime=0)
    desc = Descriptor.of("application/vnd.oci.image.layer.v1.tar+gzip", blob)
    reg.upload_blob(repo, desc, lambda: iter([blob]))
    for d in image.layers:
        reg.mount_blob(repo, d.digest, image.ref.repository)
    config = json.loads(json.dumps(image.config))
    config["rootfs"]["diff_ids"].append(str(Descriptor.of("", raw).digest))
    cfg = json.dumps(config).encode()
    cfg_desc = Descriptor.of("application/vnd.oci.image.config.v1+json", cfg)
    reg.upload_blob(repo, cfg_desc, lambda: iter([cfg]))
    layers = [Descriptor(d.media_type, d.digest, d.size).to_json() for d in image.layers] + [desc.to_json()]
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": cfg_desc.to_json(),
                           "layers": layers}).encode()
    return Reference(registry, repo, None, reg.put_manifest(repo, "latest", manifest, OCI_MANIFEST))


def judge(ref: str) -> tuple[str, str, bool]:
    docker("pull", "-q", ref)
    said = docker("run", "--rm", "--entrypoint", "python3", ref, "-c", JUDGE).stdout.split()
    return said[0], said[1], said[2] == "True"


def test_the_overlay_is_what_python_imports_whatever_the_base_put_beside_it(registry, fixture_base, project, tmp_path):
    shadowed = with_layer(registry, fixture_base, shadows(), "test/shadowed-base")
    # the control: in the base as it is, Python would load the extension module, not the source
    origin, loader, _ = judge(str(shadowed))
    assert origin.endswith(".so") and loader == "ExtensionFileLoader"
    lock = tmp_path / "overlays.lock"
    assert invoke(project, "lock", "--base", str(shadowed), "--lock", str(lock)).returncode == 0
    built = invoke(project, "build", "--base", str(shadowed), "--lock", str(lock),
                   "--push", f"{registry}/test/shadowed:1")
    assert built.returncode == 0, built.stderr
    origin, loader, same = judge(last_line(built))
    assert (origin, loader, same) == (f"/{WORKER}", "SourceFileLoader", True)
    record = json.loads((project / "out" / "build-record.json").read_text())
    whited = {d["path"] for d in record["deleted"]}
    assert {f"/{FOLDER}/{NAME}.cpython-311-x86_64-linux-gnu.so", f"/{FOLDER}/{NAME}.abi3.so",
            f"/{FOLDER}/__pycache__/{NAME}.cpython-311.opt-1.pyc", f"/{FOLDER}/__pycache__/{NAME}.cpython-310.pyc"} \
        <= whited


def test_a_package_of_the_overlaid_modules_name_refuses_the_base(registry, fixture_base, project, tmp_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        info = tarfile.TarInfo(f"{FOLDER}/{NAME}/__init__.py")
        info.size = 6
        t.addfile(info, io.BytesIO(b"X = 1\n"))
    packaged = with_layer(registry, fixture_base, out.getvalue(), "test/packaged-base")
    origin, _, _ = judge(str(packaged))
    assert origin.endswith(f"{NAME}/__init__.py")  # the control: Python takes the package
    for task in ("lock", "build"):  # neither locks nor builds over it
        done = invoke(project, task, "--base", str(packaged), "--lock", str(tmp_path / "overlays.lock"))
        errors = [l for l in done.stderr.splitlines() if l.startswith("error:")]
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
