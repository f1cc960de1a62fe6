"""The integer arithmetic of a compiled Triton kernel (its TTGIR, as Triton prints it), read with
exact integer semantics: which memory accesses of a buffer can reach it at an offset that wrapped.

Each SSA value gets a range [lo, hi] computed exactly (Python integers), from the kernel's arguments
at given values (ranges), constants, make_range and the loads of a block table (the block ids, in
[0, blocks)); a value derived from a block id is tainted. An integer op whose exact range leaves its
type's range wraps; a wrap on a tainted value is recorded where it happens (the line). Loops and
branches join what flows in (scf.for's iter_args with what its body yields, scf.if's two yields),
widened to the type's whole range where a loop keeps growing it. Pointers carry the argument they
derive from and the wraps of the offsets added to them. An access (a load, a store, a buffer op, an
async copy) of a buffer named in `buffers` is bad if the offsets that reach it wrapped, or if it is a
buffer op (a 32-bit offset from a descriptor that covers at most 2^31 bytes) whose tainted offset can
pass 2^31 bytes.

It fails closed (Unmodelled, which a proof reads as CANNOT-PROVE) where its reading could lose what
matters: an op it does not model that takes a block-derived value or a pointer to a watched buffer
(a shift, a bitcast, a store to shared memory, a split), a call (tt.call: its body is not read;
scf.while's values are taken at their type's whole range), a watched access whose offset does not derive from a block id (the taint was lost
on the way), no load of the block table at all, an element type of unknown width, or ranges that
have not settled after its passes. Memory other than the block table is not modelled. It reads only
the IR; nothing of the kernel runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BITS = {"i1": 1, "i8": 8, "i16": 16, "i32": 32, "i64": 64}
ELEMENT_BYTES = {"f8E4M3FNUZ": 1, "f8E4M3FN": 1, "f8E5M2": 1, "f8E5M2FNUZ": 1, "i8": 1, "f16": 2, "bf16": 2,
                 "f32": 4, "i32": 4, "f64": 8, "i64": 8}
BUFFER_REACH = 2**31  # bytes a buffer op's 32-bit offset reaches (its descriptor's num_records < 2^31)
PASSES = 6


def type_range(bits: int) -> tuple[int, int]:
    return (0, 1) if bits == 1 else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)


class Unmodelled(ValueError):
    """The IR holds what this reading does not model where it matters: no verdict may rest on it."""


# ops whose effect on ranges, taint and pointers is modelled (others taking a block-derived value or a
# watched pointer make the reading Unmodelled)
MODELLED = {"arith.addi", "arith.subi", "arith.muli", "arith.divsi", "arith.remsi", "arith.minsi", "arith.maxsi",
            "arith.select", "arith.extsi", "arith.extui", "arith.trunci", "arith.andi", "arith.constant",
            "arith.cmpi", "tt.splat", "tt.broadcast", "tt.expand_dims", "tt.reshape", "tt.trans",
            "ttg.convert_layout", "tt.addptr", "tt.load", "tt.store", "tt.make_range", "tt.get_program_id",
            "amdg.buffer_load", "amdg.buffer_store", "scf.for", "scf.if", "scf.while", "scf.yield"}
ACCESSES = ("tt.load", "tt.store", "amdg.buffer_load", "amdg.buffer_store")
UNREAD = ("tt.call",)  # control flow this reading does not follow


@dataclass(frozen=True)
class Value:
    lo: int = 0
    hi: int = 0
    bits: int = 0  # 0: not an integer (a float, a pointer)
    tainted: bool = False  # derived from a block id
    wraps: frozenset = frozenset()  # where a tainted value on its way wrapped: "line N: text"
    base: str | None = None  # a pointer: the argument it derives from
    elem: str = ""  # a pointer's element type


@dataclass
class Op:
    line: int
    text: str
    results: list[str]
    name: str
    operands: list[str]
    result_type: str
    owner: int | None = None  # the scf.for / scf.if it yields to (scf.yield)
    iter_args: list[tuple[str, str]] = field(default_factory=list)  # scf.for, scf.while: (arg, init)
    block_args: list[str] = field(default_factory=list)  # scf.while: its after region's arguments
    induction: tuple[str, str, str] | None = None  # scf.for: (iv, lower, upper)


@dataclass
class Access:
    line: int
    text: str
    buffer: str
    wraps: frozenset
    reach: int | None  # a buffer op's largest byte offset (tainted offsets only)


NAME = r"%[\w.$-]+(?:#\d+)?"


def parse(ir: str, function: str) -> tuple[dict[str, str], list[Op]]:
    """({argument: its type}, the ops of `function`, in order)."""
    lines = ir.splitlines()
    start = next((i for i, line in enumerate(lines) if re.search(rf"tt\.func \w+ @{re.escape(function)}\(", line)),
                 None)
    if start is None:
        raise ValueError(f"no function {function} in the IR")
    header = lines[start]
    args = {m.group(1): m.group(2) for m in re.finditer(r"(%[\w.$-]+): (!tt\.ptr<[^>]+>|i\d+|f\d+)", header)}
    ops: list[Op] = []
    stack: list[int | None] = []  # the op owning each open region (None: another kind of region)
    for number in range(start + 1, len(lines)):
        text = re.sub(r"\s*loc\([^()]*(\([^()]*\))?[^()]*\)\s*$", "", lines[number]).strip()
        if text.startswith("}"):
            if not stack:
                break  # the function's own closing brace
            owner = stack.pop()
            if text.endswith("{"):  # } else {
                stack.append(owner)
            continue
        m = re.match(rf"((?:{NAME})(?::\d+)?(?:, {NAME})*) = ([\w.\"]+)(.*)$", text)
        results, name, rest = ([], "", text)
        if m:
            results = [r.split(":")[0] for r in m.group(1).split(", ")]
            count = re.match(r"%[\w.$-]+:(\d+)", m.group(1))
            if count:
                results = [f"{results[0]}#{i}" for i in range(int(count.group(1)))]
            name, rest = m.group(2).strip('"'), m.group(3)
        elif text.startswith("scf.condition("):  # what it forwards are the loop's values: yields to its op
            name, rest = "scf.yield", text.split(")", 1)[1]
        elif text.startswith("^bb") and stack and stack[-1] is not None and ops[stack[-1]].name == "scf.while":
            ops[stack[-1]].block_args = re.findall(rf"({NAME}):", text)
            continue
        elif text.split(" ")[0] in ("scf.yield", "tt.store", "amdg.buffer_store", "tt.return"):
            name, rest = text.split(" ")[0], text[len(text.split(" ")[0]):]
        op = Op(number + 1, lines[number].strip()[:200], results, name,
                re.findall(NAME, rest.split(" : ")[0] if name != "scf.for" else rest.split(" -> ")[0]),
                _result_type(rest))
        if name == "scf.while":
            op.iter_args = re.findall(rf"({NAME}) = ({NAME})", rest.split(")", 1)[0])
        if name == "scf.for":
            loop = re.search(rf"({NAME}) = ({NAME}) to ({NAME}) step", rest)
            op.induction = (loop.group(1), loop.group(2), loop.group(3)) if loop else None
            op.iter_args = re.findall(rf"({NAME}) = ({NAME})", rest.split("iter_args(", 1)[1].split(")", 1)[0]) \
                if "iter_args(" in rest else []
        if name == "scf.yield":
            op.owner = next((o for o in reversed(stack) if o is not None), None)
        ops.append(op)
        if text.endswith("{"):
            stack.append(len(ops) - 1 if name in ("scf.for", "scf.if", "scf.while") else None)
    return args, ops


def _result_type(rest: str) -> str:
    rest = re.sub(r"\{[^{}]*\}", "", rest) if rest.lstrip().startswith(("{", "%")) else rest  # attributes
    body = rest.split(" : ", 1)[1] if " : " in rest else ""
    if " to " in body:
        return body.rsplit(" to ", 1)[1]
    if "->" in body:
        return body.rsplit("->", 1)[1]
    return _last_type(body)  # select's "i1, i32": the last type is the result's


def _last_type(types: str) -> str:
    depth, cut = 0, 0
    for i, ch in enumerate(types):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "," and depth == 0:
            cut = i + 1
    return types[cut:].strip()


def _bits(type_text: str) -> int:
    if "!tt.ptr" in type_text:
        return 0
    m = re.search(r"(?:x|^|<)(i1|i8|i16|i32|i64)\b", type_text.strip())
    return BITS[m.group(1)] if m else 0


def analyse(ir: str, function: str, arguments: dict[str, tuple[int, int]], table: str, blocks: int,
            buffers: tuple[str, ...]) -> list[Access]:
    """Every access of `buffers` in `function`, with the wraps on its way and, for a buffer op, its
    byte reach: arguments at the given ranges (others at their type's whole range), each load from
    the argument `table` a block id in [0, blocks)."""
    args, ops = parse(ir, function)
    unread = sorted({op.name for op in ops if op.name in UNREAD})
    if unread:
        raise Unmodelled(f"{function} uses {', '.join(unread)}, whose values this reading does not follow")
    values: dict[str, Value] = {}
    for name, kind in args.items():
        key = name.lstrip("%")
        if kind.startswith("!tt.ptr"):
            values[name] = Value(base=key, elem=kind[len("!tt.ptr<"):-1])
        else:
            bits = BITS.get(kind, 0)
            lo, hi = arguments.get(key, type_range(bits) if bits else (0, 0))
            values[name] = Value(lo, hi, bits)
    yields: dict[int, list[list[str]]] = {}
    for op in ops:
        if op.name == "scf.yield" and op.owner is not None:
            yields.setdefault(op.owner, []).append(op.operands)
    accesses: dict[int, Access] = {}
    for sweep in range(PASSES):
        before = dict(values)
        for index, op in enumerate(ops):
            _step(op, index, ops, values, yields, table, blocks, widen=sweep >= 2, before=before)
        if values == before:
            break
    else:
        raise Unmodelled(f"{function}: the ranges have not settled after {PASSES} passes")
    if not any(v.tainted for v in values.values()):
        raise Unmodelled(f"{function} loads no block id from {table}")
    for op in ops:
        watched = [values[o] for o in op.operands if o in values and values[o].base in buffers]
        tainted = [o for o in op.operands if o in values and values[o].tainted and values[o].bits]
        if op.name not in MODELLED and (watched or tainted):
            raise Unmodelled(f"line {op.line}: {op.name or op.text[:60]} takes "
                             f"{'a pointer to ' + watched[0].base if watched else 'a block-derived value'}, "
                             f"which this reading does not model")
    for op in ops:
        for operand in op.operands:
            v = values.get(operand)
            if v is None or v.base not in buffers or op.name in POINTER_SHAPES or op.name == "scf.yield":
                continue
            if op.name not in ACCESSES:
                raise Unmodelled(f"line {op.line}: {op.name} takes a pointer to {v.base}: not an access this "
                                 f"reading models")
            if v.elem not in ELEMENT_BYTES:
                raise Unmodelled(f"line {op.line}: {v.base}'s elements ({v.elem}) are of a width not known here")
            reach = None
            if op.name.startswith("amdg.buffer_"):
                offset = _buffer_offset(op, values)
                if offset is None or not offset.tainted:
                    raise Unmodelled(f"line {op.line}: a gather of {v.base} whose offset does not derive from a "
                                     f"block id (lost on the way)")
                reach = max(abs(offset.lo), abs(offset.hi)) * ELEMENT_BYTES[v.elem]
                wraps = v.wraps | offset.wraps
            else:
                if not v.tainted:
                    raise Unmodelled(f"line {op.line}: a gather of {v.base} whose address does not derive from a "
                                     f"block id (lost on the way)")
                wraps = v.wraps
            accesses[op.line] = Access(op.line, op.text, v.base, wraps, reach)
    return sorted(accesses.values(), key=lambda a: a.line)


POINTER_SHAPES = ("tt.splat", "tt.broadcast", "tt.expand_dims", "ttg.convert_layout", "tt.addptr", "tt.reshape",
                  "tt.trans", "arith.select", "scf.for", "scf.if", "scf.while")  # (loops and branches carry pointers)


def _buffer_offset(op: Op, values: dict[str, Value]) -> Value | None:
    m = re.search(rf"{NAME}\[({NAME})\]", op.text)
    return values.get(m.group(1)) if m else None


def _join(a: Value | None, b: Value | None) -> Value | None:
    if a is None or b is None:
        return a or b
    return Value(min(a.lo, b.lo), max(a.hi, b.hi), a.bits or b.bits, a.tainted or b.tainted, a.wraps | b.wraps,
                 a.base or b.base, a.elem or b.elem)


def _step(op: Op, index: int, ops: list[Op], values: dict[str, Value], yields: dict, table: str, blocks: int,
          widen: bool, before: dict) -> None:
    got = [values.get(o) for o in op.operands]
    known = [g for g in got if g is not None]
    tainted = any(g.tainted for g in known)
    wraps = frozenset().union(*(g.wraps for g in known)) if known else frozenset()
    bits = _bits(op.result_type)
    whole = type_range(bits) if bits else (0, 0)

    def put(name: str, value: Value) -> None:
        old = before.get(name)
        if widen and old is not None and value.bits and (value.lo < old.lo or value.hi > old.hi):
            value = Value(*type_range(value.bits), value.bits, value.tainted, value.wraps, value.base, value.elem)
        values[name] = value

    def exact(lo: int, hi: int) -> None:
        wrapped = wraps
        if bits and (lo < whole[0] or hi > whole[1]):
            if tainted:
                wrapped = wraps | {f"line {op.line}: {op.text[:140]} (exact range {lo}..{hi} in i{bits})"}
            lo, hi = whole
        put(op.results[0], Value(lo, hi, bits, tainted, wrapped))

    name, a, b = op.name, got[0] if got else None, got[1] if len(got) > 1 else None
    if not op.results:
        return
    if name == "scf.for":
        for i, (arg, init) in enumerate(op.iter_args):
            flowing = [values.get(init)] + [values.get(y[i]) for y in yields.get(index, []) if i < len(y)]
            joined = None
            for v in flowing:
                joined = _join(joined, v)
            put(arg, joined or Value(*type_range(32), 32))
            if i < len(op.results):
                put(op.results[i], joined or Value(*type_range(32), 32))
        if op.induction:
            lo, hi = values.get(op.induction[1]), values.get(op.induction[2])
            put(op.induction[0], Value(lo.lo if lo else type_range(32)[0], hi.hi if hi else type_range(32)[1], 32,
                                       bool(lo and lo.tainted) or bool(hi and hi.tainted)))
        return
    if name == "scf.while":  # its values at the whole range of their type, tainted if any flowing in is
        for i, (arg, init) in enumerate(op.iter_args):
            flowing = [values.get(init)] + [values.get(y[i]) for y in yields.get(index, []) if i < len(y)]
            known = [v for v in flowing if v is not None]
            kind = next((v for v in known if v.base or v.bits), Value(bits=32))
            joined = Value(*(type_range(kind.bits) if kind.bits else (0, 0)), kind.bits,
                           any(v.tainted for v in known), frozenset().union(*(v.wraps for v in known)),
                           kind.base, kind.elem)
            for name_ in [arg] + ([op.block_args[i]] if i < len(op.block_args) else []) + \
                    ([op.results[i]] if i < len(op.results) else []):
                values[name_] = joined
        return
    if name == "scf.if":
        branches = yields.get(index, [])
        for i, result in enumerate(op.results):
            joined = None
            for y in branches:
                if i < len(y):
                    joined = _join(joined, values.get(y[i]))
            put(result, joined or Value(*whole, bits))
        return
    if name == "arith.constant":
        m = re.search(r"(?:dense<)?(-?\d+)>? :", op.text)
        if bits and m and "." not in op.text.split(":")[0].split("=")[1]:
            put(op.results[0], Value(int(m.group(1)), int(m.group(1)), bits))
        else:
            put(op.results[0], Value(0, 0, 0))
        return
    if name == "arith.cmpi":  # a comparison is no address: what it decides is joined where it selects
        put(op.results[0], Value(0, 1, 1))
        return
    if name == "tt.make_range":
        m = re.search(r"end = (\d+) : i32, start = (\d+)", op.text)
        put(op.results[0], Value(int(m.group(2)), int(m.group(1)) - 1, 32) if m else Value(*whole, bits))
        return
    if name == "tt.get_program_id":
        put(op.results[0], Value(0, whole[1], bits))
        return
    if name in ("tt.splat", "tt.broadcast", "tt.expand_dims", "ttg.convert_layout", "tt.reshape", "tt.trans") and a:
        put(op.results[0], a)
        return
    if name == "tt.addptr" and a:
        put(op.results[0], Value(base=a.base, elem=a.elem, tainted=tainted, wraps=wraps))
        return
    if name in ("tt.load", "amdg.buffer_load") and a:
        pointer = a if name == "tt.load" else values.get(op.operands[0])
        if name == "tt.load":  # its type is the pointer's: what it loads is the pointee
            pointee = re.search(r"!tt\.ptr<(i\d+)>", op.result_type)
            bits = BITS.get(pointee.group(1), 0) if pointee else 0
            whole = type_range(bits) if bits else (0, 0)
        if pointer is not None and pointer.base == table:
            put(op.results[0], Value(0, blocks - 1, bits, True, wraps))
        else:
            put(op.results[0], Value(*whole, bits))
        return
    if name == "arith.select" and len(got) >= 3 and got[1] and got[2]:
        joined = _join(got[1], got[2])
        put(op.results[0], joined if joined else Value(*whole, bits))
        return
    if name in ("arith.extsi", "arith.extui") and a:
        lo, hi = (a.lo, a.hi) if name == "arith.extsi" or a.lo >= 0 else (0, 2 ** a.bits - 1)
        put(op.results[0], Value(lo, hi, bits, a.tainted, a.wraps))
        return
    if name == "arith.trunci" and a:
        exact(a.lo, a.hi)
        return
    if a is None or b is None or not (a.bits and b.bits):
        put(op.results[0], Value(*whole, bits, tainted, wraps))
        return
    if name == "arith.addi":
        exact(a.lo + b.lo, a.hi + b.hi)
    elif name == "arith.subi":
        exact(a.lo - b.hi, a.hi - b.lo)
    elif name == "arith.muli":
        corners = [a.lo * b.lo, a.lo * b.hi, a.hi * b.lo, a.hi * b.hi]
        exact(min(corners), max(corners))
    elif name in ("arith.minsi", "arith.maxsi"):
        pick = min if name == "arith.minsi" else max
        put(op.results[0], Value(pick(a.lo, b.lo), pick(a.hi, b.hi), bits, tainted, wraps))
    elif name == "arith.remsi" and b.lo > 0:
        top = b.hi - 1
        put(op.results[0], Value(0 if a.lo >= 0 else -top, top if a.hi > 0 else 0, bits, tainted, wraps))
    elif name == "arith.divsi" and b.lo > 0:
        corners = [int(a.lo / b.lo), int(a.lo / b.hi), int(a.hi / b.lo), int(a.hi / b.hi)]
        put(op.results[0], Value(min(corners), max(corners), bits, tainted, wraps))
    elif name == "arith.andi" and b.lo == b.hi and b.lo >= 0:
        put(op.results[0], Value(0, b.lo, bits, tainted, wraps))
    else:
        put(op.results[0], Value(*whole, bits, tainted, wraps))
