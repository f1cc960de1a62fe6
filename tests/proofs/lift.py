"""Lift functions out of a shipped source file into a real module file and import it.

Triton re-reads a kernel's source from its file, so the functions under test must live in one.
Imports no triton: the proofs set TRITON_INTERPRET before they import it.
"""

import ast
import importlib.util
import tempfile
import textwrap
from pathlib import Path


def function_source(path: str, name: str) -> str:
    """The source of a (possibly nested) function definition, decorators included, dedented."""
    text = Path(path).read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            return textwrap.dedent("\n".join(text.splitlines()[start:node.end_lineno]))
    raise SystemExit(f"{name} not found in {path}")


def module(name: str, parts: list[str]):
    """Import the source parts, joined, as module `name` from a file of its own."""
    path = Path(tempfile.mkdtemp()) / f"{name}.py"
    path.write_text("\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location(name, path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
