"""What every proof script shares: lift code out of the target's bytes, and report one verdict.

A proof runs the code in one version of its overlay's target (stock from a base, or overlaid) and
compares what it does with a reference written from the defect's description: the target's code
runs in a child that hands back only data, judged here (main). It prints one JSON line per target:
{"verdict": FIXED | BROKEN | CANNOT-PROVE, "reason": ..., "measured": {...}, "target": i}.
Where the proofs' Triton kernels run is DEVICE, from BAKERY_PROOF_DEVICE (`invoke prove --device`):
cpu, Triton's interpreter (set here, before any script imports triton: import this module first),
or cuda, the kernels compiled for the GPU torch sees. Verdicts are cached per device.
"""

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import json
import os
import sys
import tempfile
import textwrap
import time
import traceback
import types
from pathlib import Path

DEVICE = os.environ.get("BAKERY_PROOF_DEVICE", "cpu")
USES_DEVICE = False  # a proof whose kernels run on DEVICE sets it; the others say they ran on the CPU
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: jit then builds interpreted kernels


class CannotProve(Exception):
    """The code under test is not there in a form the proof can run (renamed, moved, removed)."""


def function_source(path: str, name: str, within: str | None = None) -> str:
    """The source of a function (inside class `within` if given), decorators included, dedented."""
    text = Path(path).read_text()
    tree = ast.parse(text)
    scope = tree
    if within is not None:
        scope = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == within), None)
        if scope is None:
            raise CannotProve(f"class {within} is not in the target (renamed or removed upstream?)")
    for node in ast.walk(scope):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            return textwrap.dedent("\n".join(text.splitlines()[start:node.end_lineno]))
    raise CannotProve(f"{within + '.' if within else ''}{name} is not in the target (renamed or removed upstream?)")


def module(name: str, parts: list[str]):
    """Import the source parts, joined, as module `name` from a file of its own (Triton re-reads a
    kernel's source from its file, so the code under test must live in one)."""
    _interpreter_shims()
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text("\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


UNMODELED: list[str] = []  # stand-ins the target's code branched on: no verdict can rest on a guess


def _stand_in(path: str):
    made = Anything()
    object.__setattr__(made, "path", path)
    return made


def _decided_by(path: str):
    """A stand-in's value was asked for (truth, length, iteration): what it would be in the image
    is not known here, so the run records it and its verdict becomes CANNOT-PROVE (report)."""
    if path not in UNMODELED:
        UNMODELED.append(path)


class _AnyClass(type):
    def __getattr__(cls, name):  # a stand-in class's attributes (CUDAGraphMode.NONE) are stand-ins too
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{cls.path}.{name}")

    def __bool__(cls):
        _decided_by(cls.path)
        return False


class Anything(metaclass=_AnyClass):
    """Stands for any vLLM name the proof does not exercise: constructible, callable, any attribute.
    Used as a decorator (called on one class or function) it returns what it decorates unchanged,
    so the target's own classes and functions stay the target's. Its value is never guessed: the
    target's code branching on it (if, len, iteration) makes the run CANNOT-PROVE, naming it."""

    path = "a stand-in"

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and (inspect.isclass(args[0]) or inspect.isfunction(args[0])):
            return args[0]
        return _stand_in(f"{self.path}()")

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{self.path}.{name}")

    def __getitem__(self, key):
        return _stand_in(f"{self.path}[...]")

    def __bool__(self):
        _decided_by(self.path)
        return False

    def __len__(self):
        _decided_by(self.path)
        raise TypeError(f"{self.path} is a stand-in: its length is not known")

    def __iter__(self):
        _decided_by(self.path)
        raise TypeError(f"{self.path} is a stand-in: its items are not known")

    def __class_getitem__(cls, key):  # Generic[...] annotations evaluated at import
        return cls


class _Stub(types.ModuleType):
    """A vLLM module the proof does not exercise: every name in it is a fresh subclassable stand-in,
    except its submodules that the proof loads or models (`from vllm import _custom_ops`)."""

    known: frozenset = frozenset()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if f"{self.__name__}.{name}" in self.known:
            return importlib.import_module(f"{self.__name__}.{name}")
        return type(name, (Anything,), {"stand_in": True, "path": f"{self.__name__}.{name}"})


def _triton_utils() -> dict:
    """vllm.triton_utils as it is where Triton is installed: the real Triton."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    _interpreter_shims()
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
    return {"HAS_TRITON": True, "triton": triton, "tl": tl,
            "tldevice": _interpreter_libdevice(libdevice) if interpreted else libdevice}


def _interpreter_philox() -> None:
    """Triton's Philox4x32-10 (tl.rand, tl.randint), computed by numpy in one pass instead of op by
    op through the interpreter: the same rounds and constants, about ten times fewer interpreter
    steps per random draw. tests/test_proof_releases.py checks it gives bit for bit what the interpreted
    Triton function gives. 64-bit Philox stays Triton's own."""
    import numpy as np
    import triton.language as tl
    from triton.language import random
    from triton.runtime import interpreter

    original = random.philox_impl
    if getattr(original, "numpy_philox", False):
        return

    def umulhi(a, b):
        return ((a.astype(np.uint64) * b.astype(np.uint64)) >> np.uint64(32)).astype(np.uint32)

    def philox_impl(c0, c1, c2, c3, k0, k1, n_rounds=random.N_ROUNDS_DEFAULT):
        if c0.dtype != tl.uint32:
            return original(c0, c1, c2, c3, k0, k1, n_rounds)
        given = (c0, c1, c2, c3, k0, k1)
        kind = max((x.type for x in given), key=lambda t: len(getattr(t, "shape", ())))  # broadcast's type
        c0, c1, c2, c3, k0, k1 = np.broadcast_arrays(*(np.asarray(x.handle.data, dtype=np.uint32) for x in given))
        a, b = np.uint32(0xD2511F53), np.uint32(0xCD9E8D57)
        with np.errstate(over="ignore"):
            for _ in range(int(getattr(n_rounds, "value", n_rounds))):
                _c0, _c2 = c0, c2
                c0 = umulhi(np.full_like(_c2, b), _c2) ^ c1 ^ k0
                c2 = umulhi(np.full_like(_c0, a), _c0) ^ c3 ^ k1
                c1, c3 = b * _c2, a * _c0
                k0, k1 = k0 + np.uint32(0x9E3779B9), k1 + np.uint32(0xBB67AE85)
        return tuple(tl.tensor(interpreter.TensorHandle(np.ascontiguousarray(x), tl.uint32), kind)
                     for x in (c0, c1, c2, c3))

    philox_impl.numpy_philox = True
    random.philox_impl = philox_impl


def _interpreter_libdevice(libdevice):
    """libdevice for Triton's interpreter, whose own libdevice functions are empty: the ones vLLM's
    kernels call, computed by numpy in the kernel's own dtype (a GPU runs the real library)."""
    import numpy as np
    from triton.runtime import interpreter

    shim = types.ModuleType("libdevice (interpreted)")
    shim.__dict__.update(vars(libdevice))

    def elementwise(op):
        def apply(x):
            return interpreter.tl.core.tensor(interpreter.TensorHandle(op(x.handle.data), x.handle.dtype.scalar),
                                              x.type)
        return apply

    for name, op in (("log1p", np.log1p), ("expm1", np.expm1), ("exp", np.exp), ("log", np.log)):
        setattr(shim, name, elementwise(op))
    return shim


class _Loader(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, real: dict[str, str], modeled: dict[str, dict], absent: tuple[str, ...]):
        self.real, self.modeled, self.absent = real, modeled, absent

    def find_spec(self, name, path, target=None):
        if name in self.absent:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if name in self.real:
            return importlib.util.spec_from_file_location(name, self.real[name])
        if name == "vllm" or name.startswith("vllm."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _Stub(spec.name)
        module.known = frozenset(self.real) | frozenset(self.modeled)
        module.__path__ = []
        if spec.name == "vllm.triton_utils":
            module.__dict__.update(_triton_utils())
        module.__dict__.update(self.modeled.get(spec.name, {}))
        return module

    def exec_module(self, module):
        pass


def _interpreter_shims() -> None:
    """What Triton's interpreter needs to run vLLM's kernels, and to run them fast enough; nothing
    where the kernels are compiled (DEVICE cuda)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        _interpreter_bool_masks()
        _interpreter_philox()
        _interpreter_patch_once()


def _interpreter_patch_once() -> None:
    """Triton's interpreter re-patches its language modules (an inspect.getmembers walk of
    triton.language) on every call of a @triton.jit helper inside a kernel, which is most of an
    interpreted kernel's time; the patch it makes is the same each time. Patch each set of modules
    once per kernel launch instead: the launch still patches first and restores at its end. And
    remember its dtype mapping (a pure function it recomputes for every value)."""
    import inspect as inspect_
    from triton.runtime import interpreter

    if getattr(interpreter._patch_lang, "once", False):
        return
    original, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    done: set = set()
    langs_of = (interpreter.tl, interpreter.tl.core)
    langs_by_fn: dict = {}  # which language modules a function's globals hold: looked up once per function

    def patch_lang(fn):
        langs = langs_by_fn.get(fn)
        if langs is None:
            langs = langs_by_fn[fn] = frozenset(id(v) for v in fn.__globals__.values()
                                                if inspect_.ismodule(v) and v in langs_of)
        if langs and langs <= done:
            return interpreter._LangPatchScope()
        scope = original(fn)
        done.update(langs)
        return scope

    def launch_once(self, *args, **kwargs):
        done.clear()
        try:
            return launch(self, *args, **kwargs)
        finally:
            done.clear()

    patch_lang.once = True
    interpreter._patch_lang, interpreter.GridExecutor.__call__ = patch_lang, launch_once
    # the interpreter maps a Triton dtype to numpy's by building a dict on every call: keep the answers
    np_dtype, known = interpreter._get_np_dtype, {}

    def get_np_dtype(tt_dtype):
        key = tt_dtype.element_ty if isinstance(tt_dtype, interpreter.tl.block_type) else tt_dtype  # same answer
        try:
            if key not in known:
                known[key] = np_dtype(key)
            return known[key]
        except TypeError:  # a type that does not hash: ask the interpreter
            return np_dtype(tt_dtype)

    interpreter._get_np_dtype = get_np_dtype


def tensor_ranges() -> None:
    """Compiled Triton makes a `tl.range` loop variable a tensor (vLLM's top-k/top-p kernel calls
    `row_id.to(tl.int64)` on it); the interpreter hands out Python ints. Make it a 0-d int32 tensor,
    as compiled. Opt-in, for the proof whose kernel needs it: the others' kernels keep the ints."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import numpy as np
    from triton.runtime import interpreter

    core = interpreter._patch_lang_core
    if getattr(core, "tensor_ranges", False):
        return
    tl = interpreter.tl

    def value(x) -> int:
        return int(x.handle.data.item()) if hasattr(x, "handle") else int(getattr(x, "value", x))

    def tensor_range(arg1, arg2=None, step=None, **kwargs):
        start, end = (0, arg1) if arg2 is None else (arg1, arg2)
        for i in range(value(start), value(end), value(step or 1)):
            yield tl.tensor(interpreter.TensorHandle(np.array(i, dtype=np.int32), tl.int32), tl.int32)

    def patch_core(lang, scope):
        core(lang, scope)
        scope.set_attr(lang, "range", tensor_range)

    patch_core.tensor_ranges = True
    interpreter._patch_lang_core = patch_core


def _interpreter_bool_masks() -> None:
    """Triton's interpreter hands some masks broadcast from a scalar (a kernel's `is_valid_req`,
    `valid_block`) to its store as int32, which it then refuses; on a GPU they are i1. Give it the
    booleans it wants. Only the interpreter is touched, never what a kernel computes."""
    import numpy as np
    from triton.runtime import interpreter

    masked_store = interpreter.InterpreterBuilder.create_masked_store
    if getattr(masked_store, "bool_masks", False):
        return

    def create_masked_store(self, ptrs, value, mask, cache_policy):
        if mask.data.dtype != np.bool_:
            mask = interpreter.TensorHandle(mask.data.astype(np.bool_), interpreter.tl.int1)
        return masked_store(self, ptrs, value, mask, cache_policy)

    create_masked_store.bool_masks = True
    interpreter.InterpreterBuilder.create_masked_store = create_masked_store


def load_vllm(real: dict[str, str], modeled: dict[str, dict] | None = None,
              absent: tuple[str, ...] = ()) -> dict[str, types.ModuleType]:
    """The one loader every proof uses: import vLLM modules from the given files (module name ->
    the file of the target's base, stock or overlaid), as vLLM itself would import them. Their
    `vllm.*` imports resolve to those files where given, to `modeled` names where the proof models
    a module (a platform, a custom op), to the real Triton for vllm.triton_utils, and to stand-ins
    for everything else, which the proof does not exercise; `absent` modules do not import, as in
    an image without them. Real modules may be named outside vllm (a package the image bakes).
    A module that does not load is CANNOT-PROVE with the error; a name the proof then needs and
    does not find is `need`'s. Called again, it loads afresh with the new mapping."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _Loader)]
    for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.") or n in real or n in absent]:
        del sys.modules[name]
    sys.meta_path.insert(0, _Loader(real, modeled or {}, absent))
    loaded = {}
    for name in real:
        try:
            loaded[name] = importlib.import_module(name)
        except CannotProve:
            raise
        except Exception as e:
            raise CannotProve(f"{name} does not load: {type(e).__name__}: {str(e)[:200]}") from e
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, loaded[name])
    return loaded


def bind_launch(kernel, given: dict, spec: dict) -> dict:
    """The launch arguments vLLM's declarative launchers (0.33 on) give a Triton kernel: what the
    launch spec names, then the calling function's own arguments bound to the kernel's parameters of
    the same name (as is, with _ptr, in capitals, or both), then a bound tensor's strides to
    NAME_STRIDE_D. Modeled for the proofs: it moves arguments, it computes nothing."""
    import torch

    names = inspect.signature(kernel.fn).parameters
    spec = dict(spec)
    for name, value in given.items():
        target = next((n for n in (name, f"{name}_ptr", name.upper(), f"{name.upper()}_PTR") if n in names), None)
        if target and target not in spec:
            spec[target] = value
    for name in names:
        base, sep, dim = name.rpartition("_STRIDE" if "_STRIDE" in name else "_stride")
        source = spec.get(base, spec.get(base + ("_PTR" if sep == "_STRIDE" else "_ptr")))
        if sep and name not in spec and torch.is_tensor(source) and dim.lstrip("_").isdigit():
            spec[name] = source.stride(int(dim.lstrip("_")))
    return spec


def need(owner, name: str):
    """owner.name, or CANNOT-PROVE naming the symbol the proof needs and the target lacks."""
    found = getattr(owner, name, None)
    if found is None or isinstance(found, Anything) or (inspect.isclass(found) and "stand_in" in vars(found)):
        where = getattr(owner, "__name__", type(owner).__name__)
        raise CannotProve(f"{where}.{name} is not in the target (renamed or removed upstream?)")
    return found


def call(fn, known: dict, what: str):
    """fn(**known): a parameter the target added that the proof has no value for and no default,
    or one the proof gives that the target no longer takes, is CANNOT-PROVE naming it (the proof
    must learn what the change means first)."""
    params = inspect.signature(fn).parameters
    missing = [n for n, p in params.items() if n not in known and p.default is inspect.Parameter.empty
               and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and n != "self"]
    if missing:
        raise CannotProve(f"{what} now takes {', '.join(missing)}, which this proof does not know how to give")
    gone = [n for n in known if n not in params]
    if gone and not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        raise CannotProve(f"{what} no longer takes {', '.join(gone)}, which this proof gives it")
    return fn(**known)


def report(fixed: bool, reason: str, **measured) -> dict:
    """A verdict, as a proof's judge returns it (in the proof's own process, never the target's)."""
    measured["ran_on"] = DEVICE if USES_DEVICE else "cpu"
    return {"verdict": "FIXED" if fixed else "BROKEN", "reason": reason, "measured": measured}


def main(observe, judge) -> None:
    """`proof.py TARGET... -- READS...` (or, by hand, `proof.py TARGET READS...`): one JSON verdict
    line per target, in order, each carrying its index.

    observe([target] + reads) runs the target's code and returns what it did, {name: array, number
    or string}; judge(observed, [target] + reads) compares that with the reference and returns
    report(...). Each observe runs in a process forked after this script's imports (torch and
    Triton load once, nothing one run leaves behind reaches the other, the runs share the cores),
    and hands its data back through a pipe of its own, as numpy arrays (no pickle); everything it
    prints goes to stderr. judge runs here, in the process that never ran the target's code: a
    verdict comes only from its comparison, never from a line the target's code writes. A
    CannotProve in observe is that target's CANNOT-PROVE; any other exception, a crash, or data the
    judge cannot read is its failure, which the runner reads as CANNOT-PROVE."""
    args = sys.argv[1:]
    targets, reads = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args[:1], args[1:])
    sys.stdout.flush()
    _not_dumpable()
    started = time.monotonic()
    children = []
    for target in targets:  # a child holds no read end of another's pipe
        children.append(_fork(observe, [target] + reads, [pipe for _, pipe in children]))
    for index, (pid, pipe) in enumerate(children):
        with pipe:
            data = pipe.read(DATA_LIMIT + 2)
        if len(data) > DATA_LIMIT:
            os.kill(pid, 9)  # it would write on: judged from what was read (too much)
        _, status = os.waitpid(pid, 0)
        judged = _judged(judge, [targets[index]] + reads, data, os.waitstatus_to_exitcode(status))
        print(json.dumps({**judged, "target": index, "seconds": round(time.monotonic() - started, 1)}), flush=True)


DATA_LIMIT = 64 << 20  # bytes a target's run hands back (the largest proof's are under 1 MiB)


def _not_dumpable() -> None:
    """This process and the children forked from it become non-dumpable: their /proc entries are
    root's, so the target code in one child cannot open a sibling's or this process's pipes through
    /proc/PID/fd, nor trace them, to hand back another target's data."""
    import ctypes

    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _fork(observe, args: list[str], others: list):
    """(pid, the read end of its data pipe) of a child that runs observe(args) and exits."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return pid, os.fdopen(read_end, "rb")
    os.close(read_end)
    for other in others:
        other.close()
    os.dup2(2, 1)  # what the child prints, the target's code included, goes to stderr: no verdict is read there
    sys.stdout = os.fdopen(1, "w", closefd=False)
    code, payload = 0, b""
    try:
        observed = observe(args)
        if UNMODELED:
            raise CannotProve(f"the target's code branched on {', '.join(UNMODELED[:4])}, which this proof does not "
                              f"model: its value in the image is not known here (model it, or load its module)")
        payload = b"D" + _pack(observed)
    except CannotProve as e:
        payload = b"C" + str(e).encode("utf-8", "replace")
    except BaseException as e:
        traceback.print_exc()
        code, payload = 1, b"E" + f"{type(e).__name__}: {str(e)[:300]}".encode("utf-8", "replace")
    try:
        _write_all(write_end, payload)
    finally:
        sys.stdout.flush()
        os._exit(code)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _pack(observed: dict) -> bytes:
    """What a run observed as an uncompressed .npz: arrays of numbers, booleans or text, no objects."""
    import io

    import numpy as np

    arrays = {}
    for name, value in observed.items():
        array = np.asarray(value.cpu() if hasattr(value, "cpu") else value)
        if array.dtype.hasobject:
            raise TypeError(f"observed {name!r} is not numbers or text")
        arrays[name] = array
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def _unpack(data: bytes) -> dict:
    """Arrays from a run's data, read as data only: stored (not compressed) .npy members within
    DATA_LIMIT in all, no pickled object."""
    import io
    import zipfile

    import numpy as np

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        infos = z.infolist()
        if any(i.compress_type != zipfile.ZIP_STORED or not i.filename.endswith(".npy") for i in infos) or \
                sum(i.file_size for i in infos) > DATA_LIMIT:
            raise ValueError("not the uncompressed arrays a run hands back")
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        return {name: arrays[name] for name in arrays.files}


def _judged(judge, args: list[str], data: bytes, code: int) -> dict:
    """A target's verdict: the judge's, from the data its run handed back, only where the run
    finished (exit 0) and handed back data; else CANNOT-PROVE with its reason, or a failure."""
    def failed(reason: str) -> dict:
        return {"verdict": "FAILED", "reason": reason, "measured": {}}

    if len(data) > DATA_LIMIT:
        return failed(f"its run handed back more than {DATA_LIMIT >> 20} MiB")
    if code != 0:  # the run's own words on why, where it said (an exception's name and text)
        return failed(data[1:].decode("utf-8", "replace")[:400] if data[:1] == b"E" else f"exit {code}")
    if data[:1] == b"C":
        return {"verdict": "CANNOT-PROVE", "reason": data[1:].decode("utf-8", "replace")[:400] or "no reason given",
                "measured": {}}
    if data[:1] != b"D":
        return failed("its run handed back no data")
    try:
        observed = _unpack(data[1:])
    except Exception as e:
        return failed(f"its run handed back what is not data ({type(e).__name__})")
    try:
        judged = judge(observed, args)
    except CannotProve as e:
        return {"verdict": "CANNOT-PROVE", "reason": str(e)[:400], "measured": {}}
    except Exception as e:  # data of another shape than the proof's own run gives: no verdict rests on it
        return failed(f"the proof cannot judge what its run handed back: {type(e).__name__}: {str(e)[:200]}")
    if judged.get("verdict") not in ("FIXED", "BROKEN") or not judged.get("reason"):
        return failed("the judge gave no verdict")
    return judged
