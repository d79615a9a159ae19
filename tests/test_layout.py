"""The layout rules of the code base: a package per store, and no class or function so long
that a newcomer cannot find a behaviour in it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tasklock_cli"
STORES = ("sqlite", "postgres", "redis", "etcd")
MAX_CLASS_LINES = 350
MAX_FUNCTION_LINES = 60


def _definitions() -> list[tuple[str, ast.AST]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node))
    return found


def _lines(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1


def test_no_class_over_350_lines():
    long = {
        where: _lines(node)
        for where, node in _definitions()
        if isinstance(node, ast.ClassDef) and _lines(node) > MAX_CLASS_LINES
    }
    assert long == {}


def test_no_function_over_60_lines():
    long = {
        where: _lines(node)
        for where, node in _definitions()
        if not isinstance(node, ast.ClassDef) and _lines(node) > MAX_FUNCTION_LINES
    }
    assert long == {}


def test_every_store_is_a_package_and_no_store_module_lies_flat():
    stores = PACKAGE / "stores"
    flat = [p.name for p in stores.glob("*.py") if p.name.startswith(STORES)]
    assert flat == []
    for store in STORES:
        package = stores / store
        assert (package / "__init__.py").is_file()
        assert {"store.py", "connection.py", "waiting.py", "breaks.py", "doctor.py"} <= {
            p.name for p in package.glob("*.py")
        }, store


@pytest.mark.parametrize("store", STORES)
def test_a_store_package_names_its_class_without_importing_the_driver(store):
    import subprocess
    import sys

    probe = (
        "import sys\n"
        f"import tasklock_cli.stores.{store} as package\n"
        "assert not {'psycopg', 'redis'} & set(sys.modules), sorted(sys.modules)\n"
        "assert package.__doc__ and len(package.__doc__.splitlines()) > 3\n"
        "assert package.__all__ == [name for name in package.__all__ if name.endswith('Store')]\n"
        "assert getattr(package, package.__all__[0]).__name__ == package.__all__[0]\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=PACKAGE.parent)
