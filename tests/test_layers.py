"""The import contract: a part of bakery imports only parts at its level or below, so the folders
read as the pipeline and no lower layer comes to depend on a higher one. Pure: reads the source
with ast, imports nothing. Imports inside functions count too (a lazy import is still a dependency).

    cli  >  release | dev  >  build  >  proofs | trust  >  inputs  >  base  >  oci  >  the core modules
"""

import ast
from pathlib import Path

import pytest

BAKERY = Path(__file__).resolve().parent.parent / "bakery"
LEVELS = {"": 0, "oci": 1, "base": 2, "inputs": 3, "proofs": 4, "trust": 4, "bake": 5, "release": 6, "dev": 6, "cli": 7}


def module_name(path: Path) -> str:
    parts = path.relative_to(BAKERY.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> str:
    """bakery.oci.registry -> oci; bakery.errors (a core module) -> ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and (BAKERY / parts[1]).is_dir()) else ""


def imported(path: Path, source: str | None = None) -> set[str]:
    """Every bakery module or package this file imports, as an absolute name (`from . import x`
    names x; `from .x import y` names x, whose layer y shares)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "bakery":
                found.update(f"bakery.{a.name}" for a in node.names if a.name != "__version__")
            elif target.startswith("bakery."):
                found.add(target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("bakery."))
    return found


SOURCES = sorted(BAKERY.rglob("*.py"))


def test_every_folder_of_bakery_has_a_level():
    assert {p.name for p in BAKERY.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(LEVELS) - {""}


@pytest.mark.parametrize("path", SOURCES, ids=[str(p.relative_to(BAKERY)) for p in SOURCES])
def test_no_module_imports_a_higher_layer(path):
    own = layer(module_name(path))
    upward = sorted(m for m in imported(path) if LEVELS[layer(m)] > LEVELS[own])
    assert not upward, f"{path.relative_to(BAKERY)} ({own or 'core'}) imports a higher layer: {upward}"


@pytest.mark.parametrize("source", ["from ..trust import verify\n", "def f():\n    from ..release.smoke import run\n",
                                    "import bakery.bake.pipeline\n", "from bakery import dev\n"])
def test_the_contract_sees_an_upward_import(source):
    """The check itself can fail: an oci module importing higher layers, lazily or not, is caught."""
    registry = BAKERY / "oci" / "registry.py"
    assert any(LEVELS[layer(m)] > LEVELS["oci"] for m in imported(registry, source)), imported(registry, source)


def test_a_core_module_may_import_only_the_core():
    files = BAKERY / "files.py"
    assert {layer(m) for m in imported(files)} <= {""}
    assert imported(files, "from .oci import refs\n") == {"bakery.oci"}
