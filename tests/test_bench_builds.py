"""The bench's proof that a row imports the build it names (issue 36).

The baseline rows once ran ``python -m tasklock_cli`` with an old package first on PYTHONPATH
and the checkout as the working directory: ``-m`` puts the working directory first, so they
timed today's code. ``bench.builds.prove`` runs a row's own argv, env and cwd with
PYTHONVERBOSE=1 and refuses it unless the imported ``tasklock_cli`` is its build's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench.builds import ROOT
from bench.builds import Build
from bench.builds import WrongBuild
from bench.builds import neutral_cwd
from bench.builds import prove

CHECKOUT_PACKAGE = (ROOT / "tasklock_cli").resolve()


@pytest.fixture
def old_build(tmp_path: Path) -> Build:
    """A stand-in for an older build: a ``tasklock_cli`` package of its own, run with ``-m``."""
    package = tmp_path / "old" / "tasklock_cli"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("")
    return Build("b40fa3f", Path(sys.executable).parent, package.parent.resolve())


def bare_env(**extra: str) -> dict[str, str]:
    """The environment without any PYTHON* variable, as the bench's rows start from."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TASKLOCK_"))}
    return {**env, **extra}


def test_a_baseline_run_from_the_checkout_is_refused(old_build: Build) -> None:
    """The old bench's row: the baseline first on PYTHONPATH, but `-m` from the checkout."""
    argv = [sys.executable, "-m", "tasklock_cli"]
    env = bare_env(PYTHONPATH=str(old_build.home))
    with pytest.raises(WrongBuild) as refused:
        prove("sqlite, b40fa3f", argv, env, old_build, cwd=str(ROOT))
    assert str(CHECKOUT_PACKAGE) in str(refused.value)
    assert "b40fa3f" in str(refused.value)


def test_the_same_row_from_outside_the_checkout_is_proven(old_build: Build) -> None:
    argv = [sys.executable, "-m", "tasklock_cli"]
    env = bare_env(PYTHONPATH=str(old_build.home))
    line = prove("sqlite, b40fa3f", argv, env, old_build, cwd=neutral_cwd())
    assert line == f"`sqlite, b40fa3f` imports {old_build.home / 'tasklock_cli'}"


def test_a_baseline_whose_env_puts_the_checkout_first_is_refused(old_build: Build) -> None:
    """From the neutral directory too: PYTHONPATH naming the checkout wins over the build."""
    argv = [sys.executable, "-c", "import tasklock_cli"]
    env = bare_env(PYTHONPATH=os.pathsep.join([str(ROOT), str(old_build.home)]))
    with pytest.raises(WrongBuild, match="refused to time"):
        prove("sqlite, b40fa3f", argv, env, old_build)


def test_a_row_that_imports_no_tasklock_is_refused(old_build: Build) -> None:
    with pytest.raises(WrongBuild, match="no tasklock_cli"):
        prove("python floor", [sys.executable, "-c", "import os"], bare_env(), old_build)


@pytest.mark.parametrize("cached", [False, True], ids=["compiled from source", "from .pyc"])
def test_both_ways_the_interpreter_names_a_package_are_read(
    old_build: Build, tmp_path: Path, cached: bool
) -> None:
    """Verbose output names the source as "code object from '…'" or "… matches …"."""
    argv = [sys.executable, "-c", "import tasklock_cli"]
    env = bare_env(PYTHONPATH=str(old_build.home), PYTHONPYCACHEPREFIX=str(tmp_path / "pyc"))
    if cached:
        prove("warm-up", argv, env, old_build)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    assert prove("row", argv, env, old_build).endswith(str(old_build.home / "tasklock_cli"))


def test_every_registry_store_is_benched_and_its_floor_imports_its_store_module() -> None:
    """The import floor is built from the registry: each store's floor imports its own store
    module (and so its driver), and no store of the registry is missing from the bench."""
    from bench.stores import ALL_STORES
    from bench.stores import StoreKind
    from bench.stores import floor_imports
    from tasklock_cli.stores.registry import STORE_PACKAGES

    assert set(ALL_STORES) == set(STORE_PACKAGES)
    for name in STORE_PACKAGES:
        statement = floor_imports(StoreKind(name, Path("/nonexistent")))
        assert statement.endswith(f"tasklock_cli.stores.{name}.store")
    with pytest.raises(ValueError, match="not a store package"):
        floor_imports(StoreKind("mongodb", Path("/nonexistent")))


def test_a_bench_url_comes_from_the_stores_provisioning_and_an_unknown_store_has_none(
    tmp_path,
) -> None:
    """Each store's namespace is its package's (``namespace_url``): a file in the run's own
    directory where the store has no server, the run's id in its name where it has one;
    an unknown name is an error, never some other store's URL."""
    from bench.harness import RUN_ID
    from bench.stores import StoreKind
    from tasklock_cli.stores.registry import STORE_PACKAGES
    from tasklock_cli.stores.registry import package_for_scheme
    from tasklock_cli.stores.registry import provisioning

    for name in STORE_PACKAGES:
        provision = provisioning(name)
        if provision.private_server:
            continue  # its URL names the bench's own member, started by a run
        url = StoreKind(name, tmp_path).url("ns")
        package = package_for_scheme(url.partition(":")[0])
        assert package is not None and package.__name__.endswith(f".{name}"), url
        mine = "ns" if provision.server is None else f"tlbench_{RUN_ID}_ns"
        place = str(tmp_path) if provision.server is None else provision.base_url()
        assert url == provision.namespace_url(place, mine)
    with pytest.raises(ValueError, match="mongodb is not a store package"):
        StoreKind("mongodb", tmp_path).url("ns")


@pytest.mark.slow  # two interpreters under valgrind: seconds each
def test_the_instructions_section_counts_the_started_process_not_its_forked_child() -> None:
    """Section 7 reads the wrapper's count, not its guard's: a forked child reports its
    own total under valgrind, the parent's work before the fork included (issue 45)."""
    import shutil

    from bench.instructions import instructions

    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed")
    busy = "sum(range(2_000_000))"
    forks = f"import os\nif os.fork() == 0:\n    {busy}\n    os._exit(0)\nos.wait()\nos._exit(0)\n"
    alone = f"import os\n{busy}\nos._exit(0)\n"
    parent = instructions([sys.executable, "-c", forks], bare_env())
    busy_alone = instructions([sys.executable, "-c", alone], bare_env())
    # The busy loop is tens of millions of instructions: the parent never ran it.
    assert parent < busy_alone - 20_000_000
