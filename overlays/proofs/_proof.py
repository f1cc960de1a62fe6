"""What every proof script shares: lift code out of the target's bytes, and report one verdict.

A proof runs the code in one version of its overlay's target (stock from a base, or overlaid) and
compares what it does with a reference written from the defect's description. It ends by printing
one JSON line: {"verdict": FIXED | BROKEN | CANNOT-PROVE, "reason": ..., "measured": {...}}.
Imports no triton: scripts that interpret kernels set TRITON_INTERPRET before they import it.
"""

import ast
import importlib.util
import json
import os
import sys
import tempfile
import textwrap
import time
import traceback
from pathlib import Path


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
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text("\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def report(fixed: bool, reason: str, **measured) -> None:
    print(json.dumps({"verdict": "FIXED" if fixed else "BROKEN", "reason": reason, "measured": measured}))


def main(prove) -> None:
    """Run prove([target] + reads) for each target: `proof.py TARGET... -- READS...` (or, by hand,
    `proof.py TARGET READS...`). One JSON verdict line per target, in order, each carrying its
    index. Each target runs in a process forked after this script's imports (torch and Triton load
    once, nothing one run leaves behind reaches the other, and the runs share the cores); a
    CannotProve is that target's CANNOT-PROVE, any other exception or a crash its failure, which
    the runner reads as CANNOT-PROVE."""
    args = sys.argv[1:]
    targets, reads = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args[:1], args[1:])
    sys.stdout.flush()
    _not_dumpable()
    started = time.monotonic()
    children = []
    for target in targets:  # a child holds no read end of another's pipe
        children.append(_fork(prove, [target] + reads, [pipe for _, pipe in children]))
    for index, (pid, pipe) in enumerate(children):
        with pipe:
            lines = _tail(pipe).strip().splitlines()
        _, status = os.waitpid(pid, 0)
        print(json.dumps({**_verdict(lines, os.waitstatus_to_exitcode(status)), "target": index,
                          "seconds": round(time.monotonic() - started, 1)}), flush=True)


def _not_dumpable() -> None:
    """This process and the children forked from it become non-dumpable: their /proc entries are
    root's, so the target code in one child cannot open a sibling's or this process's pipes through
    /proc/PID/fd, nor trace them, to write another target's verdict."""
    import ctypes

    PR_SET_DUMPABLE = 4
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def _tail(pipe, limit: int = 1 << 20) -> str:
    """What a child wrote, its last `limit` bytes at most, decoded whatever they are."""
    kept = b""
    while chunk := pipe.read(1 << 16):
        kept = (kept + chunk)[-limit:]
    return kept.decode("utf-8", errors="replace")


def _fork(prove, args: list[str], others: list):
    """(pid, the read end of its stdout) of a child that runs prove(args) and exits."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return pid, os.fdopen(read_end, "rb")
    os.close(read_end)
    for other in others:
        other.close()
    os.dup2(write_end, 1)  # everything the child writes to stdout, the target's code included, goes to the pipe
    os.close(write_end)
    sys.stdout = os.fdopen(1, "w", closefd=False)
    code = 0
    try:
        prove(args)
    except CannotProve as e:
        print(json.dumps({"verdict": "CANNOT-PROVE", "reason": str(e), "measured": {}}))
    except BaseException as e:
        traceback.print_exc()
        print(json.dumps({"verdict": "FAILED", "reason": f"{type(e).__name__}: {str(e)[:300]}"}))
        code = 1
    sys.stdout.flush()
    os._exit(code)


def _verdict(lines: list[str], code: int) -> dict:
    """A verdict counts only from a run that finished: exit 0 and a well-formed last line."""
    try:
        doc = json.loads(lines[-1])
        said = doc.get("reason") if isinstance(doc.get("reason"), str) else ""
        if code != 0 or doc.get("verdict") not in ("FIXED", "BROKEN", "CANNOT-PROVE") or not said:
            raise ValueError(said)
        return doc
    except (IndexError, ValueError, AttributeError) as e:
        return {"verdict": "FAILED", "reason": f"exit {code}" + (f": {e}" if str(e) else ""), "measured": {}}
