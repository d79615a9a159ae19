"""The layout rules of the code base: a package per store, and no class or function so long
that a newcomer cannot find a behaviour in it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tasklock_cli.stores.registry import IN_PROCESS_PACKAGES
from tasklock_cli.stores.registry import STORE_PACKAGES

PACKAGE = Path(__file__).resolve().parent.parent / "tasklock_cli"
STORES = (*STORE_PACKAGES, *IN_PROCESS_PACKAGES)
#: Every store package has these (``provision.py``: how the tests and the bench get the
#: store); ``waiting.py`` and ``breaks.py`` only where the store hears of releases and breaks
#: on a line of its own (the base class polls for the others).
REQUIRED_MODULES = {"store.py", "connection.py", "doctor.py", "provision.py"}
MAX_CLASS_LINES = 350
MAX_FUNCTION_LINES = 60


def _definitions() -> list[tuple[str, ast.stmt]]:
    found: list[tuple[str, ast.stmt]] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node))
    return found


def _lines(node: ast.stmt) -> int:
    assert node.end_lineno is not None  # ast.parse sets it
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
        assert {p.name for p in package.glob("*.py")} >= REQUIRED_MODULES, store


@pytest.mark.parametrize("store", STORES)
def test_a_store_package_names_its_class_without_importing_the_driver(store):
    import subprocess
    import sys

    probe = (
        "import sys\n"
        f"import tasklock_cli.stores.{store} as package\n"
        "from tasklock_cli.stores.registry import STORE_PACKAGES, store_package\n"
        "drivers = {store_package(name).DRIVER for name in STORE_PACKAGES} - {None}\n"
        "assert drivers and not {d.package for d in drivers} & set(sys.modules)\n"
        "assert package.__doc__ and len(package.__doc__.splitlines()) > 3\n"
        "assert package.__all__ == [name for name in package.__all__ if name.endswith('Store')]\n"
        "assert getattr(package, package.__all__[0]).__name__ == package.__all__[0]\n"
        "assert package.TITLE and package.SCHEMES and package.URL_FORM\n"
        "assert package.DRIVER is None or package.DRIVER.package\n"
        f"from tasklock_cli.stores.{store} import doctor\n"
        "assert callable(doctor.store_checks)\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=PACKAGE.parent)


def _imported_modules(path: Path, modules: set[str], type_only: bool = False) -> set[str]:
    """The package's modules ``path`` imports, at any depth (a function's own imports too),
    leaving out what only the type checker reads (``if TYPE_CHECKING:``) unless
    ``type_only``."""
    found: set[str] = set()
    pending: list[ast.AST] = list(ast.parse(path.read_text()).body)
    while pending:
        node = pending.pop()
        checker_only = getattr(getattr(node, "test", None), "id", None) == "TYPE_CHECKING"
        if isinstance(node, ast.If) and checker_only and not type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.startswith("tasklock_cli"):
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"
                    found.add(submodule if submodule in modules else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        pending.extend(ast.iter_child_nodes(node))
    return found & modules


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_imports_one_that_imports_it_back():
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    imports = {name: _imported_modules(path, set(paths)) - {name} for name, path in paths.items()}
    cycles = []

    def walk(name: str, trail: list[str]) -> None:
        for imported in sorted(imports[name]):
            if imported in trail:
                cycles.append([*trail[trail.index(imported) :], imported])
            elif imported not in done:
                walk(imported, [*trail, imported])
        done.add(name)

    done: set[str] = set()
    for name in sorted(imports):
        if name not in done:
            walk(name, [name])
    assert cycles == []


#: The layers, lowest first (README "Layout"). A module imports its own package and the
#: packages of lower layers only: at any depth (a function's lazy imports count) and for
#: the type checker too (a type named from above is a dependency on it). Packages sharing
#: a layer do not import each other, but for the bottom's three (util raises errors;
#: events uses util). The names are the parts after ``tasklock_cli.``; "" is the package
#: itself, whose public names load lazily from the API (any module may import it for
#: ``__version__``: Python imports it before any module of it anyway).
LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"util", "errors", "events"}),  # what every layer uses, knowing nothing of locks
    frozenset({"config", "proc"}),  # the run settings and config file; the process tree
    frozenset({"stores"}),
    frozenset({"run", "commands"}),
    frozenset({"cli", "api", "testing"}),  # the command line; the Python API and its tests
    frozenset({"", "__main__"}),
)
#: Allowed by the layers, and still not to be imported: the Python API runs in its caller's
#: process, which has no command line and no command's process tree to guard.
FORBIDDEN = {"api": frozenset({"cli", "proc"})}
#: Imports against the layers that are let stand, each for the type checker only, and why.
TYPE_ONLY_EXCEPTIONS = {
    # LockNotAcquired.holder is a LeaseInfo; every layer raises errors, so errors stays down.
    ("tasklock_cli.errors", "tasklock_cli.stores.model"),
}


def _layer_package(module: str) -> str:
    """``tasklock_cli.run.keeper`` -> ``run``; ``tasklock_cli.errors`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def import_map(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Every module of ``package`` and the package's modules it imports, the type checker's
    imports and a function's own included."""
    paths = {_module_name(path, package): path for path in package.rglob("*.py")}
    return {
        name: _imported_modules(path, set(paths), type_only=True) - {name}
        for name, path in paths.items()
    }


def direction_problems(imports: dict[str, set[str]]) -> list[str]:
    """Each import in ``imports`` (module -> modules it imports) that goes against
    ``LAYERS`` or ``FORBIDDEN``, and each module of a package no layer names."""
    rank = {name: index for index, layer in enumerate(LAYERS) for name in layer}
    problems = []
    for module, imported in sorted(imports.items()):
        source = _layer_package(module)
        if source not in rank:
            problems.append(f"{module}: its package {source!r} is in no layer (LAYERS)")
            continue
        for target_module in sorted(imported):
            target = _layer_package(target_module)
            if target == source or (module, target_module) in TYPE_ONLY_EXCEPTIONS:
                continue
            if target_module == "tasklock_cli":  # (``__version__``) every import loads it first
                continue
            down = target in rank and (
                rank[target] < rank[source] or (rank[source] == 0 and rank[target] == 0)
            )
            if not down or target in FORBIDDEN.get(source, ()):
                problems.append(f"{module} imports {target_module}")
    return problems


def test_imports_go_down_the_layers():
    assert direction_problems(import_map()) == []


def test_the_direction_rule_fails_on_a_planted_violation(tmp_path):
    """A copy of the package with a store that lazily imports the command line, a util
    module that names the stores for the type checker, and an API module that imports the
    process tree: each is found, and the untouched copy has no problem."""
    import shutil

    copy = tmp_path / "tasklock_cli"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert direction_problems(import_map(copy)) == []
    (copy / "stores" / "planted.py").write_text(
        "def later():\n    from tasklock_cli.cli import session\n\n    return session\n"
    )
    (copy / "util" / "planted.py").write_text(
        "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    from tasklock_cli.stores.base import Store\n"
    )
    (copy / "api" / "planted.py").write_text("import tasklock_cli.proc.guard\n")
    (copy / "newlayer").mkdir()
    (copy / "newlayer" / "__init__.py").write_text("")
    assert direction_problems(import_map(copy)) == [
        "tasklock_cli.api.planted imports tasklock_cli.proc.guard",
        "tasklock_cli.newlayer: its package 'newlayer' is in no layer (LAYERS)",
        "tasklock_cli.stores.planted imports tasklock_cli.cli.session",
        "tasklock_cli.util.planted imports tasklock_cli.stores.base",
    ]


def test_modules_of_one_layer_do_not_import_each_other():
    """Beside is not below: the command line and the API, run and the operators' commands,
    config and the process tree stay apart (a fake map: none does today)."""
    planted = {
        "tasklock_cli.api.locks": {"tasklock_cli.cli.session"},
        "tasklock_cli.commands.check": {"tasklock_cli.run.keeper"},
        "tasklock_cli.config.file": {"tasklock_cli.proc.proctree"},
        "tasklock_cli.util.paths": {"tasklock_cli.errors", "tasklock_cli.events"},
    }
    assert direction_problems(planted) == [
        "tasklock_cli.api.locks imports tasklock_cli.cli.session",
        "tasklock_cli.commands.check imports tasklock_cli.run.keeper",
        "tasklock_cli.config.file imports tasklock_cli.proc.proctree",
    ]


@pytest.mark.parametrize("store", STORES)
def test_a_store_package_declares_its_capabilities_and_provisioning(store):
    """``CAPABILITIES`` in its ``__init__`` (which its store class takes as its traits) and
    ``PROVISIONING`` in its ``provision`` module: what doctor, the tests and the bench read."""
    from tasklock_cli.stores.registry import package_problems
    from tasklock_cli.stores.registry import store_package
    from tasklock_cli.stores.traits import Capabilities

    assert package_problems(store) == []
    package = store_package(store)
    store_class = getattr(package, package.__all__[0])
    assert Capabilities.of(store_class) == package.CAPABILITIES


def test_a_store_package_without_them_is_named_with_what_it_lacks(monkeypatch):
    """A package planted in the registry with its declarations but no ``CAPABILITIES`` and
    no ``provision`` module: each missing one named, a sentence each."""
    import sys
    import types

    from tasklock_cli.stores import registry

    planted = types.ModuleType("tasklock_cli.stores.planted")
    declared = {"TITLE": "p", "SCHEMES": ("p",), "URL_FORM": "p://", "DRIVER": None}
    for name, value in declared.items():
        setattr(planted, name, value)
    monkeypatch.setitem(sys.modules, "tasklock_cli.stores.planted", planted)
    monkeypatch.setattr(registry, "STORE_PACKAGES", (*registry.STORE_PACKAGES, "planted"))
    problems = registry.package_problems("planted")
    assert problems[0] == "tasklock_cli.stores.planted declares no CAPABILITIES"
    assert problems[1].startswith("store package 'planted' has no provision module")
    assert len(problems) == 2
    with pytest.raises(LookupError, match="no store package 'nonesuch'"):
        registry.provisioning("nonesuch")
