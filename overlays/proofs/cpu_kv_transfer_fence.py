"""(b) CPU-KV offload: does every transfer wait for the compute work queued before it?

Usage: python cpu_kv_transfer_fence.py TARGET   (.../v1/kv_offload/cpu/gpu_worker.py, stock or overlaid)
The target's module runs as shipped: its SingleDirectionOffloadingHandler.transfer_async does the
stream and event calls it makes on a GPU, but against a recording model of streams and events
(no GPU here): each stream is an ordered queue; wait_stream / wait_event / Event.record add the
happens-before edges CUDA and HIP define for them. The copy itself is recorded on the stream
that is current when it is issued.
Reference, from the defect: compute queued a kernel that uses KV block 3 before the transfer was
submitted; a store (GPU->CPU) reads that block and a load (CPU->GPU) overwrites it, so in both
directions the copy must happen after that kernel. FIXED: both do. BROKEN: a direction does not.
Independent of the patch: the order is read from the happens-before graph the target's own calls
build (CUDA's and HIP's stream semantics), not from which calls the patch adds. The module loads
through _proof.load_vllm, with the platform, the custom copy op and the offload specs modeled.
"""

from contextlib import contextmanager

import numpy as np
import torch

import _proof  # beside this script


OPS = []  # every op queued, in order: what the run hands back is their dependency edges


class Op:
    def __init__(self, name, deps):
        self.name, self.deps, self.index = name, deps, len(OPS)
        OPS.append(self)


class Stream:
    """A queue: each op runs after the one before it and after whatever was waited on since."""

    def __init__(self, name):
        self.name, self.last, self.pending = name, None, []

    def enqueue(self, name):
        op = Op(f"{self.name}: {name}", [d for d in [self.last, *self.pending] if d is not None])
        self.last, self.pending = op, []
        return op

    def wait_stream(self, other):
        self.pending.append(other.last)

    def wait_event(self, event):
        self.pending.append(event.op)


class Event:
    def __init__(self, *args, **kwargs):
        self.op = None

    def record(self, stream=None):
        self.op = (stream or PLATFORM.current).enqueue("event recorded")

    def query(self):
        return True

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return 0.0


def happens_before(a: int, b: int, edges) -> bool:
    """Is op a ordered before op b by the dependency edges (op, dep) of the run?"""
    deps = {}
    for op, dep in edges:
        deps.setdefault(int(op), []).append(int(dep))
    seen, todo = set(), [b]
    while todo:
        op = todo.pop()
        if op == a:
            return True
        if op not in seen:
            seen.add(op)
            todo += deps.get(op, [])
    return False


class Platform:
    def __init__(self):
        self.compute = Stream("compute")
        self.current, self.count = self.compute, 0

    def current_stream(self):
        return self.current

    def Stream(self):  # noqa: N802 (the platform's own name)
        self.count += 1
        return Stream(f"transfer {self.count}")

    @contextmanager
    def stream(self, s):
        before, self.current = self.current, s
        try:
            yield
        finally:
            self.current = before

    def __getattr__(self, name):  # is_xpu, is_rocm, is_cuda_alike, ...: a ROCm GPU
        return lambda *a, **k: name in ("is_rocm", "is_cuda_alike")


PLATFORM = Platform()
COPIES = []


def swap_blocks_batch(src, dst, sizes, *args, **kwargs):
    COPIES.append(PLATFORM.current.enqueue(f"copy of {len(sizes)} blocks"))


class BlockIDsLoadStoreSpec:
    def __init__(self, block_ids):
        self.block_ids = np.array(block_ids, dtype=np.int64)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    def __init__(self, block_ids, group_sizes, block_indices):
        super().__init__(block_ids)
        self.group_sizes, self.block_indices = group_sizes, block_indices


class KVRef:
    def __init__(self, tensor_idx, page_size_bytes):
        self.tensor_idx, self.page_size_bytes = tensor_idx, page_size_bytes


MODELED = {
    "vllm.platforms": {"current_platform": PLATFORM},
    "vllm._custom_ops": {"swap_blocks_batch": swap_blocks_batch},
    "vllm.triton_utils": {"HAS_TRITON": False, "triton": _proof.Anything(), "tl": _proof.Anything()},
    "vllm.utils.math_utils": {"cdiv": lambda a, b: -(-a // b)},
    "vllm.utils.torch_utils": {"PIN_MEMORY": False},
    "vllm.v1.kv_offload.base": {"BlockIDsLoadStoreSpec": BlockIDsLoadStoreSpec, "GPULoadStoreSpec": GPULoadStoreSpec,
                                "LoadStoreSpec": BlockIDsLoadStoreSpec, "OffloadingWorker": object},
}


class GpuTensor(torch.Tensor):
    """A CPU tensor that says it is on the GPU: the handler's own checks pass, its pointers are real."""

    @property
    def is_cuda(self):
        return True


def load(target):
    torch.Event = Event
    name = "vllm.v1.kv_offload.cpu.gpu_worker"
    module = _proof.load_vllm({name: target}, MODELED)[name]
    _proof.need(module, "SingleDirectionOffloadingHandler")
    return module


def transfer(module, gpu_to_cpu):
    """Queue a compute kernel that uses KV block 3, then submit one transfer of it; is it ordered?"""
    page = 64
    gpu = [torch.zeros(8, page, dtype=torch.int8).as_subclass(GpuTensor)]
    cpu = [torch.zeros(8, page, dtype=torch.int8)]
    try:
        handler = module.SingleDirectionOffloadingHandler(gpu, cpu, 1, [[KVRef(0, page)]], gpu_to_cpu)
    except TypeError as e:
        raise _proof.CannotProve(f"SingleDirectionOffloadingHandler takes other arguments now: {e}")
    kernel = PLATFORM.compute.enqueue("attention kernel using KV block 3")
    gpu_spec, cpu_spec = GPULoadStoreSpec([3], [1], [0]), BlockIDsLoadStoreSpec([5])
    before = len(COPIES)
    handler.transfer_async(1, *((gpu_spec, cpu_spec) if gpu_to_cpu else (cpu_spec, gpu_spec)))
    if len(COPIES) != before + 1:
        raise _proof.CannotProve(f"transfer_async issued {len(COPIES) - before} copies, expected 1")
    return kernel.index, COPIES[-1].index


def observe(args):
    """The ops the target's calls queued (this runs the target's code): which are the kernel and the
    copy of each direction, and every happens-before edge between ops."""
    module = load(args[0])
    store, load_ = transfer(module, gpu_to_cpu=True), transfer(module, gpu_to_cpu=False)
    edges = [(op.index, dep.index) for op in OPS for dep in op.deps]
    return {"store": store, "load": load_, "ops": len(OPS), "edges": edges or np.zeros((0, 2), dtype=np.int64)}


def judge(observed, args):
    ops, edges = int(observed["ops"]), observed["edges"].reshape(-1, 2)
    pairs = [tuple(int(i) for i in observed[k]) for k in ("store", "load")]
    # the graph a recording model builds: ops in the order queued, each depending on earlier ones;
    # each transfer's copy queued after its kernel
    if any(not 0 <= kernel < copy < ops for kernel, copy in pairs) or \
            (len(edges) and not ((0 <= edges[:, 1]) & (edges[:, 1] < edges[:, 0]) & (edges[:, 0] < ops)).all()):
        raise ValueError("the ops handed back are not a graph the recording model builds")
    store, load_ = (happens_before(kernel, copy, edges) for kernel, copy in pairs)
    unordered = [what for what, ok in (("a store (GPU->CPU)", store), ("a load (CPU->GPU)", load_)) if not ok]
    return _proof.report(not unordered, (" and ".join(unordered) + " can run before the compute kernel queued ahead "
                                         "of it") if unordered else "stores and loads both wait for the compute "
                                                                     "queued before them",
                         store_waits_for_compute=store, load_waits_for_compute=load_)


if __name__ == "__main__":
    _proof.main(observe, judge)
