"""hip/: this project's GPU sources, compiled for gfx942 inside a toolchain image, reproducibly,
and checked without a GPU: every device code object must be an AMDGPU ELF for the recipe's arch
carrying the recipe's kernels."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shlex
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .. import broker_client, schema
from ..base.extract import Selection
from ..errors import EnvironmentProblem, InputError, IntegrityError
from ..files import atomic_dir, staging_dir
from ..oci.layer import FileEntry
from ..oci.refs import Reference
from ..project import cache_dir

# EF_AMDGPU_MACH values (LLVM's ELF.h) of the archs a recipe may name.
ARCHS = {"gfx90a": 0x3F, "gfx940": 0x40, "gfx941": 0x4B, "gfx942": 0x4C, "gfx950": 0x4F}
EM_AMDGPU = 224
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
RECIPE_KEYS = {"arch": str, "extensions": list, "python": list, "toolchain": dict}
TOOLCHAIN_KEYS = {"exclude": list}
EXT_KEYS = {"name": str, "hip_sources": list, "cxx_sources": list, "headers": list, "hip_flags": list,
            "cxx_flags": list, "libs": list, "kernels": list, "dest": str, "serves": list}
SERVES_KEYS = {"function": str, "operator": str, "overlay": str}
PY_KEYS = {"src": str, "dest": str}
NO_TOOLCHAIN = 42


@dataclass(frozen=True)
class Serves:
    """A claim that an operator of ours serves an upstream function, through one of our overlays."""
    operator: str
    function: str
    overlay: str

    def to_json(self) -> dict:
        return {"function": self.function, "operator": self.operator, "overlay": self.overlay}


@dataclass(frozen=True)
class Extension:
    """One shared library: its sources (names under hip/), flags, the kernels it must hold, where the
    image gets it, and what it serves."""
    name: str
    dest: str
    hip_sources: tuple[str, ...]
    kernels: tuple[str, ...]
    cxx_sources: tuple[str, ...] = ()
    headers: tuple[str, ...] = ()
    hip_flags: tuple[str, ...] = ()
    cxx_flags: tuple[str, ...] = ()
    libs: tuple[str, ...] = ()
    serves: tuple[Serves, ...] = ()

    @property
    def sources(self) -> tuple[str, ...]:
        return self.hip_sources + self.cxx_sources + self.headers


@dataclass(frozen=True)
class PythonFile:
    """A Python file of ours the image gets as it is (the extension's glue)."""
    src: str
    dest: str


@dataclass(frozen=True)
class Recipe:
    root: Path
    arch: str
    extensions: tuple[Extension, ...]
    python: tuple[PythonFile, ...]
    toolchain: Selection = Selection()  # what the compile reads of the toolchain image

    def sources(self) -> list[Path]:
        names = sorted({s for e in self.extensions for s in e.sources} | {p.src for p in self.python})
        return [self.root / n for n in names]

    def key(self, toolchain_id: str) -> str:
        """Same recipe, sources, compile script, toolchain and the files taken of it: same outputs
        (so they can be cached, here and in a registry)."""
        h = hashlib.sha256((self.root / "extensions.yaml").read_bytes() + toolchain_id.encode())
        h.update(script(self).encode() + self.toolchain.key().encode())
        for src in self.sources():
            h.update(str(src.relative_to(self.root)).encode() + b"\0" + src.read_bytes())
        return h.hexdigest()


def _strings(value: list, where: str) -> tuple[str, ...]:
    if not all(isinstance(v, str) for v in value):
        raise InputError(f"{where} must be a list of strings")
    return tuple(value)


def load(root: Path) -> Recipe:
    path = root / "extensions.yaml"
    spec = schema.load_yaml(path, RECIPE_KEYS, required={"arch", "extensions"})
    if spec["arch"] not in ARCHS:
        raise InputError(f"{path}: unknown arch {spec['arch']!r}; known: {', '.join(ARCHS)}")
    extensions = []
    for i, ext in enumerate(spec["extensions"]):
        where = f"{path}: extensions[{i}]"
        if not isinstance(ext, dict):
            raise InputError(f"{where} must be a mapping")
        schema.check_keys(ext, EXT_KEYS, where, required={"name", "hip_sources", "kernels", "dest"})
        serves = []
        for j, use in enumerate(ext.get("serves") or []):
            if not isinstance(use, dict):
                raise InputError(f"{where}.serves[{j}] must be a mapping")
            schema.check_keys(use, SERVES_KEYS, f"{where}.serves[{j}]")
            serves.append(Serves(use["operator"], use["function"], use["overlay"]))
        lists = {key: _strings(ext.get(key) or [], f"{where}.{key}") for key in
                 ("hip_sources", "kernels", "cxx_sources", "headers", "hip_flags", "cxx_flags", "libs")}
        extensions.append(Extension(ext["name"], ext["dest"], serves=tuple(serves), **lists))
    python = []
    for i, py in enumerate(spec.get("python") or []):
        if not isinstance(py, dict):
            raise InputError(f"{path}: python[{i}] must be a mapping")
        schema.check_keys(py, PY_KEYS, f"{path}: python[{i}]")
        python.append(PythonFile(py["src"], py["dest"]))
    for name in sorted({s for e in extensions for s in e.sources} | {p.src for p in python}):
        schema.file_inside(root, name, f"{path}: source")  # an absolute or ../ name would bake a host file
    toolchain = spec.get("toolchain") or {}
    schema.check_keys(toolchain, TOOLCHAIN_KEYS, f"{path}: toolchain", required=set())
    exclude = _strings(toolchain.get("exclude") or [], f"{path}: toolchain.exclude")
    if len(exclude) > 256 or any(len(p) > 256 for p in exclude):  # each is tried on every path of an image
        raise InputError(f"{path}: toolchain.exclude is at most 256 patterns of at most 256 characters")
    for pattern in exclude:
        if not pattern or pattern.startswith("/") or ".." in pattern.split("/") or pattern.endswith("/"):
            raise InputError(f"{path}: toolchain.exclude {pattern!r} must name paths in the image as its layers do "
                             f"(relative: usr/share/doc, opt/rocm*/lib/rocblas/library)")
    return Recipe(root, spec["arch"], tuple(extensions), tuple(python), Selection(exclude))


def script(recipe: Recipe) -> str:
    """The shell run inside the toolchain container: sources at /src (read-only), outputs to /out.

    Reproducibility: -cuid fixes HIP's compilation-unit id (otherwise derived from random temporary
    paths), -ffile-prefix-map drops /src and the build directory, --build-id=none drops the linker's
    build id; sources are compiled in a fixed directory."""
    q = shlex.quote
    lines = [
        "set -eu",
        'CXX="${BAKERY_CXX:-/opt/rocm/llvm/bin/clang++}"',
        'ROCM="${ROCM_PATH:-/opt/rocm}"',
        'command -v "$CXX" >/dev/null 2>&1 || { echo "no HIP compiler: $CXX not found in this image" >&2; '
        f'exit {NO_TOOLCHAIN}; }}',
        'TORCH="${TORCH_DIR:-$(python3 -c "import os, torch; print(os.path.dirname(torch.__file__))")}"',
        'DEVLIB="${HIP_DEVICE_LIB_PATH:+--rocm-device-lib-path=$HIP_DEVICE_LIB_PATH}"',
        'LIBDIR="${HIP_LIB_PATH:-$ROCM/lib}"',
        '"$CXX" --version | head -n 1 > /out/toolchain.txt',
        "mkdir -p /tmp/build && cd /tmp/build",  # /tmp: the container runs as the invoking user, not root
        'MAP="-ffile-prefix-map=/src=hip -ffile-prefix-map=/tmp/build=."',
    ]
    for ext in recipe.extensions:
        name, objs = ext.name, []
        for i, src in enumerate(ext.hip_sources):
            obj = f"{name}.hip{i}.o"
            lines.append(f'"$CXX" -x hip --offload-arch={recipe.arch} --rocm-path="$ROCM" $DEVLIB '
                         f'-cuid={q(name)}-{i} $MAP -fPIC {" ".join(map(q, ext.hip_flags))} '
                         f'-c {q("/src/" + src)} -o {obj}')
            objs.append(obj)
        for i, src in enumerate(ext.cxx_sources):
            obj = f"{name}.cxx{i}.o"
            lines.append(f'"$CXX" -x c++ $MAP -fPIC -I"$TORCH/include" {" ".join(map(q, ext.cxx_flags))} '
                         f'-c {q("/src/" + src)} -o {obj}')
            objs.append(obj)
        libs = " ".join(f"-l{q(lib)}" for lib in ext.libs)
        lines.append(f'"$CXX" -shared -fuse-ld=lld -Wl,--build-id=none {" ".join(objs)} -L"$LIBDIR" '
                     f'-L"$TORCH/lib" {libs} -o /out/{q(name)}.so')
        # it must load in the image's torch and register its operators (on CPU, too)
        lines.append(f'python3 -W ignore -c "import torch; torch.ops.load_library(\'/out/{name}.so\'); '
                     f'print(torch.ops.bakery.swiglu_clamp.default._schema); '
                     f'print(torch.ops.bakery.top_k_top_p_.default._schema)" > /out/{q(name)}.schema')
    return "\n".join(lines) + "\n"


# -- checking device code without a GPU --------------------------------------------------------------

def _sections(elf: bytes) -> dict[str, tuple[int, int, int, int]]:
    """{name: (type, offset, size, link)} of an ELF64 little-endian file."""
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise IntegrityError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = elf[strtab[4]:strtab[4] + strtab[5]]
    out = {}
    for h in headers:
        name = names[h[0]:names.index(b"\0", h[0])].decode()
        out[name] = (h[1], h[4], h[5], h[6])
    return out


def _symbols(elf: bytes) -> set[str]:
    secs = _sections(elf)
    found = set()
    for table, strings in ((".symtab", ".strtab"), (".dynsym", ".dynstr")):
        if table not in secs or strings not in secs:
            continue
        _, off, size, _ = secs[table]
        _, soff, ssize, _ = secs[strings]
        strs = elf[soff:soff + ssize]
        for i in range(0, size, 24):
            name_off, = struct.unpack_from("<I", elf, off + i)
            if name_off:
                found.add(strs[name_off:strs.index(b"\0", name_off)].decode())
    return found


def code_objects(shared_object: bytes) -> dict[str, bytes]:
    """{bundle entry id: code object} from a host object's .hip_fatbin offload bundle."""
    secs = _sections(shared_object)
    if ".hip_fatbin" not in secs:
        raise IntegrityError("no .hip_fatbin section: the library carries no HIP device code")
    _, off, size, _ = secs[".hip_fatbin"]
    bundle = shared_object[off:off + size]
    if not bundle.startswith(BUNDLE_MAGIC):
        raise IntegrityError(".hip_fatbin is not a clang offload bundle")
    count, = struct.unpack_from("<Q", bundle, 24)
    entries, pos = {}, 32
    for _ in range(count):
        e_off, e_size, id_len = struct.unpack_from("<QQQ", bundle, pos)
        ident = bundle[pos + 24:pos + 24 + id_len].decode()
        pos += 24 + id_len
        entries[ident] = bundle[e_off:e_off + e_size]
    return entries


def check_device_code(shared_object: bytes, arch: str, kernels: list[str]) -> list[dict]:
    """Every AMDGPU code object must be for `arch` and define every kernel; returns what was found."""
    found = []
    for ident, blob in code_objects(shared_object).items():
        if not ident.startswith("hip"):
            continue  # the host entry of the bundle
        machine, = struct.unpack_from("<H", blob, 0x12)
        flags, = struct.unpack_from("<I", blob, 0x30)
        if machine != EM_AMDGPU:
            raise IntegrityError(f"device code object {ident} is not an AMDGPU ELF (e_machine {machine})")
        if flags & 0xFF != ARCHS[arch]:
            named = {v: k for k, v in ARCHS.items()}.get(flags & 0xFF, hex(flags & 0xFF))
            raise IntegrityError(f"device code object {ident} is for {named}, the recipe asks for {arch}")
        symbols = _symbols(blob)
        missing = [k for k in kernels if k not in symbols or f"{k}.kd" not in symbols]
        if missing:
            raise IntegrityError(f"device code object {ident} lacks kernel(s) {', '.join(missing)}")
        found.append({"bundle_entry": ident, "mach": hex(flags & 0xFF), "kernels": sorted(kernels)})
    if not found:
        raise IntegrityError(f"no AMDGPU code object for {arch} in the library")
    return found


# -- running the toolchain ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Toolchain:
    """What compiled an artifact: the compiler's own version line and the toolchain image by content.
    Recorded (and signed, in the provenance's byproducts) as "COMPILER; image IMAGE"; a rebuild reads
    the image back from that text with parse()."""
    compiler: str
    image: str  # sha256:ID or REF@sha256:DIGEST

    SEPARATOR = "; image "

    def __str__(self) -> str:
        return f"{self.compiler}{self.SEPARATOR}{self.image}"

    @classmethod
    def parse(cls, text: str) -> Toolchain:
        compiler, _, image = text.rpartition(cls.SEPARATOR)
        return cls(compiler, image)


@dataclass(frozen=True)
class Artifact:
    name: str
    dest: str
    data: bytes
    arch: str
    toolchain: Toolchain
    sources: tuple[dict, ...]
    schema: str
    code_objects: tuple[dict, ...]
    serves: tuple[Serves, ...] = ()  # the vLLM functions its operators serve, through which overlay

    def record(self) -> dict:
        return {"name": self.name, "path": self.dest, "sha256": hashlib.sha256(self.data).hexdigest(),
                "arch": self.arch, "toolchain": str(self.toolchain), "sources": list(self.sources),
                "schema": self.schema.splitlines(), "code_objects": list(self.code_objects),
                "serves": [s.to_json() for s in self.serves]}


def served(recipe: Recipe, baked: set[str], log=print) -> Recipe:
    """The recipe with only the `serves` claims this build makes true: one through an overlay it does
    not bake (retired as fixed upstream, or a build with other overlays) is left out of the record
    and the SBOM, and said."""
    extensions = []
    for ext in recipe.extensions:
        for use in ext.serves:
            if use.overlay not in baked:
                log(f"warning: {use.operator} serves {use.function} only through overlay {use.overlay}, "
                    f"which this build does not bake: not recorded as served")
        extensions.append(replace(ext, serves=tuple(use for use in ext.serves if use.overlay in baked)))
    return replace(recipe, extensions=tuple(extensions))


def toolchain_identity(image: str) -> str:
    """The toolchain image by content: the digest it is pinned by (a tag could move under a rebuild)."""
    return str(Reference.parse_pinned(image, "toolchain image").digest)


LOG_LIMIT = 1 << 20  # what of the compiler's output is read back


def toolchain_files(toolchain: str, selection, cache: Path, log=print):
    """The toolchain image's files the recipe's selection takes, as a folder in this machine's cache
    (base/extract.py): streamed once from its registry, never pulled into an engine."""
    from ..base import extract, spec as base_mod
    from ..base.filesystem import BaseFilesystem
    from ..base.layercache import LayerCache
    from ..oci.registry import Registry

    ref = Reference.parse_pinned(toolchain, "toolchain image")
    registry = Registry(ref.registry)
    image = base_mod.resolve(registry, ref, "linux/amd64")
    return extract.toolchain_root(BaseFilesystem(registry, image, LayerCache()), selection, cache, log)


OUT_LIMIT = 2 << 30  # what a compile may write under /out (its outputs are tens of MiB; each file is capped at 1 GiB)
OUT_ENTRIES = 10_000  # names under /out, counted as the watch walks them


def run_compile(files, src: Path, shell: str, out: Path, stop=None) -> tuple[int, str]:
    """Run `shell` over the toolchain's own files (`files`, an extract.Root) in the sandbox: the
    sources at /src read-only, `out` at /out, no network, uid 65534, the compile's limits;
    (exit status, the tail of what it printed). Past the time limit: -1; stopped by `stop`: -9;
    stopped for what it writes to the host's disk (`_overdrawn`): -9 too, and it says why."""
    import threading

    from .. import sandbox

    stopping, finished, why = threading.Event(), threading.Event(), []

    def watch() -> None:  # /out is the one host folder it writes: the host's disk, polled
        while not finished.wait(0.25):
            if stop is not None and stop.is_set():
                stopping.set()
                continue
            try:
                said = _overdrawn(out)
            except BaseException as e:  # noqa: BLE001 (a watch that fails must stop the run, not let it go on unwatched)
                said = f"its /out could not be measured ({type(e).__name__})"
            if said:
                why.append(said)
                stopping.set()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        done = sandbox.run(["/bin/sh", "-c", shell], [], None, sandbox.COMPILE, env={**files.env, "HOME": "/tmp"},
                           root=files.path, mounts=(sandbox.Mount("/src", src), sandbox.Mount("/out", out, True)),
                           stop=stopping)
    except subprocess.TimeoutExpired:
        return -1, f"(stopped after {sandbox.COMPILE.seconds:.0f} s)"
    finally:
        finished.set()
        watcher.join()
    if why:
        return -9, f"(stopped: {why[0]})"
    return done.returncode, (done.stdout + done.stderr)[-LOG_LIMIT:].strip()


def _overdrawn(folder: Path) -> str | None:
    """Why a compile writing under `folder` must stop, or None: its filesystem is down to what must
    stay free (which counts files unlinked while open, too), or the files under it take more than
    OUT_LIMIT or are more than OUT_ENTRIES names; a tree the walk cannot read whole counts as over."""
    from ..base.extract import RESERVE

    if shutil.disk_usage(folder).free < RESERVE:
        return f"the disk under /out is down to {RESERVE >> 30} GiB free"
    unreadable: list[OSError]
    total, seen, unreadable = 0, 0, []
    for here, dirs, names in os.walk(folder, onerror=unreadable.append):
        for name in dirs + names:
            seen += 1
            if seen > OUT_ENTRIES:
                return f"it made more than {OUT_ENTRIES:,} names under /out"
            try:
                total += os.lstat(os.path.join(here, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # gone since it was listed
            except OSError as e:  # a name past what a path may be, say
                unreadable.append(e)
                break
        if unreadable or total > OUT_LIMIT:
            break
    if unreadable:
        return f"under /out it made what cannot be read ({type(unreadable[0]).__name__})"
    if total > OUT_LIMIT:
        return f"it wrote more than {OUT_LIMIT >> 20:,} MiB under /out, the host's disk"
    return None


def run_toolchain(recipe: Recipe, toolchain: str, shell: str, out: Path, log=print) -> None:
    """Compile: run_compile here, or through the broker in a rebuild's sandbox; its failure in one line."""
    if os.environ.get(broker_client.SOCKET_ENV):
        status, logs = broker_client.compile_outside(toolchain, shell, out)
    else:
        files = toolchain_files(toolchain, recipe.toolchain, cache_dir(create=True) / "toolchains", log)
        status, logs = run_compile(files, recipe.root, shell, out)
    if status == NO_TOOLCHAIN:
        raise EnvironmentProblem(f"toolchain image {toolchain} has no HIP compiler ({logs.splitlines()[-1]}): "
                                 f"compile in the ROCm base, or build the stand-in with `invoke toolchain`")
    if status != 0:
        raise EnvironmentProblem(f"compiling hip/ failed (exit {status}); nothing was baked. Compiler said:\n"
                                 + "\n".join(logs.splitlines()[-25:]))


def _outputs_whole(out: Path) -> str | None:
    """Pure check of a cached compile: None when it is done and every output is still the bytes
    recorded when it was made; else why not ("absent" when there is none)."""
    try:
        recorded = json.loads((out / "done.json").read_text())["sha256"]
        if all(hashlib.sha256((out / name).read_bytes()).hexdigest() == sha for name, sha in recorded.items()):
            return None
        return "an output does not match its recorded sha256"
    except FileNotFoundError:
        return "absent" if not out.exists() else "it is incomplete"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return f"its record is unreadable ({e})"


def _outputs_ok(out: Path) -> bool:
    """A cached compile, whole (_outputs_whole). A poisoned one is deleted with one warning, so it is
    compiled again."""
    why = _outputs_whole(out)
    if why in (None, "absent"):
        return why is None
    print(f"warning: dropped a corrupt compile cache entry {out.name} ({why}); compiling again", file=sys.stderr)
    shutil.rmtree(out, ignore_errors=True)
    return False


def _same_outputs(sha256: dict):
    """atomic_dir's keep: another writer's entry stays when it is whole and holds the very bytes this
    one does (what this writer records as its origin, compiled or fetched, stays true); any other is
    replaced (never deleted here: a reader of it may be a moment behind its writer)."""
    def keep(out: Path) -> bool:
        try:
            return _outputs_whole(out) is None and json.loads((out / "done.json").read_text())["sha256"] == sha256
        except (OSError, ValueError, KeyError):
            return False
    return keep


@dataclass(frozen=True)
class Compiled:
    artifacts: list
    key: str  # recipe, sources and toolchain
    origin: str  # "cache" (this machine's), "registry" (the artifact) or "compiled"
    artifact: Reference | None  # the OCI artifact holding these outputs, when a registry was given
    push: Callable[[], object] | None = None  # with defer_push: pushes the artifact (nothing to push: None)

    def record(self) -> dict:
        return {"key": self.key, "origin": self.origin, "artifact": str(self.artifact) if self.artifact else None}


def compile_recipe(recipe: Recipe, toolchain: str, cache: Path, log=print, remote=None, trust=None,
                   recompile: bool = False, defer_push: bool = False) -> Compiled:
    """The recipe's outputs for this toolchain: from this machine's cache, else from the artifact in
    `remote` ((Registry, repository), the build's target) when `trust(ref)` accepts its signature
    (release keys; None: no key to check with, so compile), else compiled over `toolchain`'s own
    files in the sandbox (sources read-only, no network). The compiled outputs are pushed to the
    remote, unsigned: `invoke attest` signs the artifact the build record names."""
    image_id = toolchain_identity(toolchain)
    key = recipe.key(image_id)
    out = cache / key[:24]
    cache.mkdir(parents=True, exist_ok=True)
    origin, artifact = "cache", None
    if not _outputs_ok(out) and remote is not None and not recompile:
        if trust is None:
            log("no release key in the policy to check a kernel artifact's signature with: compiling here")
        else:
            artifact = fetch_artifact(remote[0], remote[1], key, out, trust, expected_outputs(recipe))
        if artifact is not None:
            origin = "registry"
            log(f"kernels for this recipe and toolchain from {artifact} (signed by a release key): not compiled "
                f"here, the base not pulled")
    if not _outputs_ok(out):
        origin = "compiled"
        _compile(recipe, toolchain, image_id, out, log)
    push = None
    if remote is not None and artifact is None:
        if defer_push:  # the build pushes it once everything that can fail has run
            from ..oci.refs import Digest

            artifact = Reference(remote[0].name, remote[1], None, Digest.of(artifact_manifest(key, out)))
            push = functools.partial(push_artifact, remote[0], remote[1], key, out)
        else:
            artifact = push_artifact(remote[0], remote[1], key, out)
    return Compiled(_artifacts(recipe, out, str(Reference.parse_pinned(toolchain))), key, origin, artifact, push)


OUTPUT_LIMIT = 1 << 30  # a compiled extension is tens of MiB


def expected_outputs(recipe: Recipe) -> set[str]:
    return {"toolchain.txt"} | {f"{e.name}{suffix}" for e in recipe.extensions for suffix in (".so", ".schema")}


def take_outputs(folder: Path, expected: set[str], into: Path) -> dict[str, str]:
    """{name: sha256} of what the compile left in /out, copied into `into` (ours: as root, /out was
    the sandbox uid's, which another process of that uid could change later). The compile runs the
    base's code, so what it leaves is read as hostile: exactly the expected names, each a regular
    file (a symbolic link would make us read, hash and push a file of the host's), opened without
    following links."""
    import os
    import stat

    os.chmod(folder, 0o700)  # whatever the container made of its /out's mode
    found = {e.name: e for e in os.scandir(folder)}
    unexpected, missing = sorted(set(found) - expected), sorted(expected - set(found))
    if unexpected or missing:
        left = ", ".join(repr(n)[:80] for n in unexpected[:5]) or "nothing unexpected"
        raise IntegrityError(f"the compile left {left} and lacks {', '.join(missing) or 'nothing'} in /out: "
                             f"refused (the toolchain image is broken or hostile)")
    outputs = {}
    for name in sorted(found):
        info = found[name].stat(follow_symlinks=False)
        if not stat.S_ISREG(info.st_mode) or info.st_size > OUTPUT_LIMIT:
            raise IntegrityError(f"compile output {name} is not a regular file of at most {OUTPUT_LIMIT} bytes (a "
                                 f"symbolic link, FIFO, device, folder or a giant): refused, nothing of it read "
                                 f"(the toolchain image is hostile)")
        fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f, open(into / name, "wb") as copy:
            h = hashlib.sha256()
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
                copy.write(chunk)
            outputs[name] = h.hexdigest()
    return outputs


def _compile(recipe: Recipe, toolchain: str, image_id: str, out: Path, log) -> None:
    # through the broker, the compile writes on the broker's disk, which it watches itself
    here = not os.environ.get(broker_client.SOCKET_ENV)
    if here:
        room_to_compile(out.parent)
    try:
        made: dict = {}
        with atomic_dir(out, keep=_same_outputs(made)) as tmp:  # two compiles at once: the first one's stays
            log(f"compiling hip/ for {recipe.arch} in {toolchain}")
            scratch = tmp / ".out"
            scratch.mkdir()
            run_toolchain(recipe, toolchain, script(recipe), scratch, log)
            outputs = take_outputs(scratch, expected_outputs(recipe), tmp)
            made.update(outputs)
            shutil.rmtree(scratch)
            (tmp / "done.json").write_text(json.dumps({"toolchain_image": image_id, "sha256": outputs}))
    except EnvironmentProblem:
        if here:  # stopped by the watch, or the compiler's own write failed, as the disk filled: say so
            room_to_compile(out.parent)
        raise


def room_to_compile(folder: Path, elsewhere: str = "set BAKERY_CACHE to a larger disk") -> None:
    """The compile's /out lies under `folder` and is stopped once its disk is down to RESERVE
    (_overdrawn): with less free, one line naming the folder, not the compiler's log about /out."""
    from ..base.extract import RESERVE

    free = shutil.disk_usage(folder).free
    if free < RESERVE:
        raise EnvironmentProblem(f"the disk is full at {folder}: {free / 2**20:.0f} MiB free, and a compile of hip/ "
                                 f"writes there only while {RESERVE >> 30} GiB stay free; free space, or "
                                 f"{elsewhere}") from None


def _artifacts(recipe: Recipe, out: Path, toolchain: str) -> list[Artifact]:
    """The outputs in `out` as artifacts, each checked for its device code; `toolchain` is the
    pinned reference they were compiled in (or compiled for, where the registry gave them)."""
    compiler = (out / "toolchain.txt").read_text().strip()
    artifacts = []
    for ext in recipe.extensions:
        data = (out / f"{ext.name}.so").read_bytes()
        objects = check_device_code(data, recipe.arch, list(ext.kernels))
        sources = tuple({"path": f"hip/{s}", "sha256": hashlib.sha256((recipe.root / s).read_bytes()).hexdigest()}
                        for s in ext.sources)
        artifacts.append(Artifact(ext.name, ext.dest, data, recipe.arch, Toolchain(compiler, toolchain),
                                  sources, (out / f"{ext.name}.schema").read_text(), tuple(objects), ext.serves))
    return artifacts


def verify_outputs(recipe: Recipe, toolchain: str, cache: Path, log=print, remote=None,
                   trust=None) -> list[tuple[str, str]]:
    """`invoke compile --verify`: compile again here, ignoring every cache, and prove the cached (or
    registry) outputs byte-identical; returns (file, sha256) pairs, raises IntegrityError if not."""
    compiled = compile_recipe(recipe, toolchain, cache, log, remote, trust)
    cached = cache / compiled.key[:24]
    with staging_dir(cache / f"verify-{compiled.key[:24]}") as scratch:  # its own: two verifies at once
        try:
            fresh = scratch / "out"
            _compile(recipe, toolchain, toolchain_identity(toolchain), fresh, log)
            want = json.loads((cached / "done.json").read_text())["sha256"]
            got = json.loads((fresh / "done.json").read_text())["sha256"]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    differ = sorted(n for n in set(want) | set(got) if want.get(n) != got.get(n))
    if differ:
        raise IntegrityError(f"recompiling gives other bytes for {', '.join(differ)} than the "
                             f"{compiled.origin} outputs{' ' + str(compiled.artifact) if compiled.artifact else ''}: "
                             f"do not use them; rebuild without that cache")
    return sorted(want.items())


def files(recipe: Recipe, artifacts: list[Artifact]) -> tuple[FileEntry, ...]:
    return tuple(FileEntry(a.dest, a.data) for a in artifacts) + \
        tuple(FileEntry(p.dest, (recipe.root / p.src).read_bytes()) for p in recipe.python)


# -- the compile cache that travels: kernels as an OCI artifact in the target registry -------------

ARTIFACT_TYPE = "application/vnd.bakery.hip-kernels.v1"
ARTIFACT_CONFIG = "application/vnd.bakery.hip-kernels.config.v1+json"
TITLE = "org.opencontainers.image.title"


def artifact_tag(key: str) -> str:
    return f"kernels-{key}"


def artifact_parts(key: str, out: Path) -> tuple[list, bytes]:
    """A compile's outputs as an OCI artifact: ([(descriptor, bytes)] of its blobs, config last,
    and its manifest); deterministic bytes, so the same compile gives the same artifact digest."""
    from ..oci.refs import Descriptor
    from ..oci.registry import OCI_MANIFEST

    recorded = json.loads((out / "done.json").read_text())
    blobs = []
    for name in sorted(recorded["sha256"]):
        data = (out / name).read_bytes()
        blobs.append((Descriptor.of("application/octet-stream", data, {TITLE: name}), data))
    config = json.dumps({"key": key, "toolchain": recorded["toolchain_image"], "sha256": recorded["sha256"]},
                        sort_keys=True).encode()
    config_desc = Descriptor.of(ARTIFACT_CONFIG, config)
    manifest = json.dumps({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": ARTIFACT_TYPE,
                           "config": config_desc.to_json(), "layers": [d.to_json() for d, _ in blobs]},
                          sort_keys=True).encode()
    return blobs + [(config_desc, config)], manifest


def artifact_manifest(key: str, out: Path) -> bytes:
    return artifact_parts(key, out)[1]


def push_artifact(registry, repo: str, key: str, out: Path) -> Reference:
    """Push a compile's outputs (one blob per file, a config naming key and sha256s) under
    REPO:kernels-<key>."""
    from ..oci.refs import Digest
    from ..oci.registry import OCI_MANIFEST

    blobs, manifest = artifact_parts(key, out)
    if registry.manifest_is(repo, artifact_tag(key), Digest.of(manifest)):  # pushed before: one HEAD
        return Reference(registry.name, repo, None, Digest.of(manifest))
    for desc, data in blobs:
        registry.upload_blob(repo, desc, lambda d=data: iter([d]))
    registry.put_manifest(repo, artifact_tag(key), manifest, OCI_MANIFEST)
    return Reference(registry.name, repo, None, Digest.of(manifest))


def fetch_artifact(registry, repo: str, key: str, dest: Path, trust, expected: set[str]) -> Reference | None:
    """The outputs of this exact compile from REPO:kernels-<key>: its manifest digest must carry a
    release-key signature (`trust(ref)` raises otherwise) before any of its bytes is used; then every
    blob is checked by digest and the config's key and sha256s against what arrives. None if the
    registry has no artifact for this key."""
    from ..errors import NotFound, malformed
    from ..oci.manifest import Manifest

    ref = Reference(registry.name, repo, artifact_tag(key))
    try:
        body, _, digest = registry.get_manifest(ref)
    except NotFound:
        return None
    try:
        trust(ref.with_digest(digest))
    except IntegrityError as e:
        raise IntegrityError(f"{e}; refused: a kernel artifact is used only when a release key signed it. "
                             f"Compile here instead with `invoke build --recompile` (the release workflow's sign "
                             f"job signs the artifact the build record names)") from None
    manifest = Manifest.parse(body, f"kernel artifact {ref}")
    with malformed(f"kernel artifact {ref}"):
        config = json.loads(registry.fetch_document(repo, manifest.config, f"config of kernel artifact {ref}"))
        layers = manifest.layers
        if config["key"] != key:
            raise IntegrityError(f"kernel artifact {ref} is for recipe {config['key']}, not {key}")
        names = {layer.annotations[TITLE] for layer in layers}
        if names != set(config["sha256"]) or names != expected:
            raise IntegrityError(f"kernel artifact {ref}: its files {sorted(map(repr, names))[:8]} are not the ones "
                                 f"this recipe makes ({', '.join(sorted(expected))}) or its config names")
    with atomic_dir(dest, keep=_same_outputs(config["sha256"])) as tmp:
        for layer in layers:
            data = registry.fetch_blob(repo, layer)  # checked against the layer's digest
            name = layer.annotations[TITLE]
            if hashlib.sha256(data).hexdigest() != config["sha256"][name]:
                raise IntegrityError(f"kernel artifact {ref}: {name} does not match the sha256 its config records")
            (tmp / name).write_bytes(data)
        (tmp / "done.json").write_text(json.dumps({"toolchain_image": config["toolchain"], "sha256": config["sha256"],
                                                   "artifact": str(ref.with_digest(digest))}))
    return ref.with_digest(digest)
