"""hip/: this project's GPU sources, as a recipe (hip/extensions.yaml): what each extension is made
of, the compile script, and what a compile made (artifacts, the files the image gets).

The rest of hip/'s life has a module each: hip_compile.py compiles it for gfx942 inside a toolchain
image, reproducibly, in the sandbox; hip_outputs.py takes what a compile left and keeps it in the
cache; kernel_artifact.py carries the outputs as an OCI artifact in the target registry;
device_code.py checks them without a GPU (every device code object an AMDGPU ELF for the recipe's
arch, carrying its kernels)."""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from .. import schema
from ..base.extract import Selection
from ..errors import InputError
from ..oci.layer import FileEntry
from .device_code import ARCHS

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
    """hip/extensions.yaml, loaded: what to compile for which GPU, and the Python files that load it."""
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


# -- what a compile made ----------------------------------------------------------------------------

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
    """One compiled output (a kernel library or extension) and how it was made."""
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


def files(recipe: Recipe, artifacts: list[Artifact]) -> tuple[FileEntry, ...]:
    return tuple(FileEntry(a.dest, a.data) for a in artifacts) + \
        tuple(FileEntry(p.dest, (recipe.root / p.src).read_bytes()) for p in recipe.python)
