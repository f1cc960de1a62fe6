"""What every proof script shares: lift code out of the target's bytes, and report one verdict.

A proof runs the code in one version of its overlay's target (stock from a base, or overlaid) and
compares what it does with a reference written from the defect's description. It ends by printing
one JSON line: {"verdict": FIXED | BROKEN | CANNOT-PROVE, "reason": ..., "measured": {...}}.
Imports no triton: scripts that interpret kernels set TRITON_INTERPRET before they import it.
"""

import ast
import importlib.util
import json
import sys
import tempfile
import textwrap
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
    """Run prove(argv) -> None; a CannotProve becomes the CANNOT-PROVE verdict with its reason.
    Anything else that raises exits non-zero, which the runner also reads as CANNOT-PROVE."""
    try:
        prove(sys.argv[1:])
    except CannotProve as e:
        print(json.dumps({"verdict": "CANNOT-PROVE", "reason": str(e), "measured": {}}))
