"""util.imports: the command's finder of tasklock's own modules runs cached bytecode only
when it is current, and leaves everything else to importlib.

Each case runs in a fresh interpreter on a package of its own in ``tmp_path``, with the
finder installed for that package as ``cli.entry`` installs it for tasklock's."""

from __future__ import annotations

import compileall
import importlib.machinery
import importlib.util
import json
import os
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.cli import python

PACKAGE = "finderprobe"


def make_package(root: Path) -> Path:
    package = root / PACKAGE
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "value.py").write_text("VALUE = 'first'\n")
    (package / "sub" / "__init__.py").write_text("SUB = True\n")
    (package / "sub" / "leaf.py").write_text("LEAF = 'leaf'\n")
    assert compileall.compile_dir(str(package), quiet=1)
    return package


def import_with_finder(root: Path, *names: str, env: dict[str, str] | None = None) -> dict:
    """Import ``names`` in a new interpreter with the finder installed for the package;
    what each module is (its loader's class, file, cache and value), or its error."""
    code = textwrap.dedent(
        f"""
        import importlib, json, sys
        sys.path.insert(0, {str(root)!r})
        import {PACKAGE}
        from tasklock_cli.util import imports
        imports.install({PACKAGE!r})
        found = {{}}
        for name in {list(names)!r}:
            try:
                module = importlib.import_module(name)
            except ImportError as exc:
                found[name] = {{"error": type(exc).__name__}}
                continue
            found[name] = {{
                "loader": type(module.__loader__).__name__,
                "file": module.__file__,
                "cached": module.__cached__,
                "values": {{k: v for k, v in vars(module).items() if k.isupper()}},
                "path": getattr(module, "__path__", None),
            }}
        print(json.dumps(found))
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_modules_and_subpackages_load_through_it_as_importlib_would(tmp_path):
    package = make_package(tmp_path)
    found = import_with_finder(
        tmp_path, f"{PACKAGE}.value", f"{PACKAGE}.sub", f"{PACKAGE}.sub.leaf"
    )
    value, sub, leaf = found.values()
    assert value["loader"] == sub["loader"] == leaf["loader"] == "SourceLoader"
    assert value["values"] == {"VALUE": "first"}
    assert value["file"] == str(package / "value.py")
    assert value["cached"] == importlib.util.cache_from_source(value["file"])  # (-O too)
    assert sub["path"] == [str(package / "sub")] and sub["values"] == {"SUB": True}
    assert leaf["values"] == {"LEAF": "leaf"}


def test_a_source_changed_since_its_bytecode_runs_as_changed(tmp_path):
    package = make_package(tmp_path)
    source = package / "value.py"
    stat = source.stat()
    source.write_text("VALUE = 'second'\n")  # another size
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same mtime
    assert import_with_finder(tmp_path, f"{PACKAGE}.value")[f"{PACKAGE}.value"]["values"] == {
        "VALUE": "second"
    }
    py_compile.compile(str(source), doraise=True)  # the cache of 'second'
    source.write_text("VALUE = 'third!'\n")  # the same size, another mtime
    os.utime(source, (stat.st_atime + 5, stat.st_mtime + 5))
    assert import_with_finder(tmp_path, f"{PACKAGE}.value")[f"{PACKAGE}.value"]["values"] == {
        "VALUE": "third!"
    }


@pytest.mark.parametrize("cache", ["missing", "hash-based", "truncated", "foreign"])
def test_bytecode_it_cannot_trust_goes_importlibs_way(tmp_path, cache):
    package = make_package(tmp_path)
    source = package / "value.py"
    compiled = py_compile.compile(str(source), doraise=True)
    assert compiled is not None
    cached = Path(compiled)
    if cache == "missing":
        cached.unlink()
    elif cache == "hash-based":
        source.write_text("VALUE = 'hashed'\n")
        py_compile.compile(
            str(source), invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH
        )
    elif cache == "truncated":  # (within its header: importlib compiles the source again)
        cached.write_bytes(cached.read_bytes()[:10])
    else:  # another Python's magic number
        data = bytearray(cached.read_bytes())
        data[0] ^= 0xFF
        cached.write_bytes(bytes(data))
    found = import_with_finder(tmp_path, f"{PACKAGE}.value")[f"{PACKAGE}.value"]
    assert found["values"] == {"VALUE": "hashed" if cache == "hash-based" else "first"}


def test_a_cache_prefix_is_where_it_reads_bytecode(tmp_path):
    make_package(tmp_path)
    prefix = tmp_path / "prefix"
    env = {"PYTHONPYCACHEPREFIX": str(prefix)}
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(tmp_path / PACKAGE)],
        env={**os.environ, **env},
        check=True,
    )
    found = import_with_finder(tmp_path, f"{PACKAGE}.value", env=env)[f"{PACKAGE}.value"]
    assert found["cached"].startswith(str(prefix))
    assert found["values"] == {"VALUE": "first"}


def test_names_it_does_not_list_are_left_to_importlib(tmp_path):
    make_package(tmp_path)
    found = import_with_finder(tmp_path, f"{PACKAGE}.missing", f"{PACKAGE}.value.nothing", "json")
    assert found[f"{PACKAGE}.missing"] == {"error": "ModuleNotFoundError"}
    assert found[f"{PACKAGE}.value.nothing"] == {"error": "ModuleNotFoundError"}
    assert found["json"]["loader"] == "SourceFileLoader"


def test_the_command_imports_its_modules_through_it(cli_env, sqlite_url):
    """``cli.entry`` installs it: a run's own modules (but the three before it) are loaded
    by it, and the run succeeds."""
    code = (
        "import os, sys\n"
        "me, exit_now = os.getpid(), os._exit\n"
        "def report(code):\n"  # the guard (forked) exits through os._exit too: not it
        "    if os.getpid() == me:\n"
        "        loaders = {name: type(module.__loader__).__name__\n"
        "                   for name, module in list(sys.modules.items())\n"
        "                   if name.startswith('tasklock_cli')}\n"
        "        print(code, json.dumps(loaders), flush=True)\n"
        "    exit_now(code)\n"
        "import json\n"
        "os._exit = report\n"
        "from tasklock_cli.cli.entry import main\n"
        "main(['run', 'k', '--', 'true'])\n"
    )
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    result = python(code, env)
    exit_code, loaders = result.stdout.splitlines()[-1].split(" ", 1)
    assert exit_code == "0", result.stderr
    by_loader = json.loads(loaders)
    first = {"tasklock_cli", "tasklock_cli.cli", "tasklock_cli.cli.entry", "tasklock_cli.util"}
    first.add("tasklock_cli.util.imports")
    assert {name for name, kind in by_loader.items() if kind != "SourceLoader"} == first
    assert len(by_loader) > 40


def test_a_package_wins_over_a_module_and_an_extension_is_left_to_importlib(tmp_path):
    """importlib's order: ``dup/__init__.py`` before ``dup.py``; beside an extension module
    (a compiled build) the name is importlib's to find, whatever it then picks."""
    package = make_package(tmp_path)
    (package / "dup").mkdir()
    (package / "dup" / "__init__.py").write_text("WHICH = 'package'\n")
    (package / "dup.py").write_text("WHICH = 'module'\n")
    (package / "ext.py").write_text("WHICH = 'source'\n")
    (package / f"ext{importlib.machinery.EXTENSION_SUFFIXES[0]}").write_bytes(b"not a library")
    found = import_with_finder(tmp_path, f"{PACKAGE}.dup", f"{PACKAGE}.ext")
    assert found[f"{PACKAGE}.dup"]["values"] == {"WHICH": "package"}
    assert found[f"{PACKAGE}.dup"]["loader"] == "SourceLoader"
    assert found[f"{PACKAGE}.ext"] == {"error": "ImportError"}  # importlib's: a bad library


def test_a_module_removed_after_the_listing_is_not_found(tmp_path):
    """A package upgraded under a long run: the name was listed, its file is gone."""
    package = make_package(tmp_path)
    (package / "sub" / "other.py").write_text("")
    code = textwrap.dedent(
        f"""
        import os, sys
        import {PACKAGE}.sub.other  # lists sub's directory, leaf.py in it
        os.remove({str(package / "sub" / "leaf.py")!r})
        try:
            import {PACKAGE}.sub.leaf
        except ModuleNotFoundError as exc:
            print(exc.name)
        """
    )
    preamble = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import {PACKAGE}\n"
    preamble += f"from tasklock_cli.util import imports; imports.install({PACKAGE!r})\n"
    result = subprocess.run(
        [sys.executable, "-c", preamble + code], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == f"{PACKAGE}.sub.leaf", result.stderr
