"""Shared fixtures: every store under the same contract, and the real `tasklock` executable."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from collections.abc import Generator
from collections.abc import Iterator

import pluggy
import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.registry import STORE_PACKAGES
from tasklock_cli.stores.registry import all_packages
from tests.support import services
from tests.support.cli import executable

#: Every store of the registry; the network ones are those on a server of their own,
#: reached over TCP (a proxy can cut them off): their provisioning names a server.
STORE_KINDS = list(STORE_PACKAGES)
NETWORK_STORE_KINDS = [kind for kind in STORE_KINDS if services.needs_server(kind)]


def store_url_for(kind: str, tmp_path) -> str:
    """A URL naming a fresh, empty namespace of the given store kind (its package's
    provisioning; an unknown kind is a LookupError naming the registry's)."""
    return services.fresh_url(kind, tmp_path)


@pytest.fixture(params=STORE_KINDS)
def store_kind(request) -> str:
    services.require(request.param)
    return request.param


@pytest.fixture
def store_url(store_kind, tmp_path) -> Iterator[str]:
    url = store_url_for(store_kind, tmp_path)
    yield url
    services.cleanup(store_kind, url)


@pytest.fixture(params=NETWORK_STORE_KINDS)
def network_store_url(request, tmp_path) -> Iterator[str]:
    """A fresh namespace on a store reached over TCP (what a proxy can cut off)."""
    yield from _fresh_namespace(request.param, tmp_path)


def _fresh_namespace(kind: str, tmp_path, name: str | None = None) -> Iterator[str]:
    services.require(kind)
    url = services.fresh_url(kind, tmp_path, name)
    yield url
    services.cleanup(kind, url)


def _namespace_fixture(kind: str):
    """The fixture ``<kind>_url``: a fresh namespace on that store for a test of its own
    (a store without a server: ``locks.db``-like in the test's directory; one with: a
    namespace of its own on the shared server, skipped or failed as ``require`` says)."""
    name = None if services.needs_server(kind) else "locks"

    def fixture(tmp_path) -> Iterator[str]:
        yield from _fresh_namespace(kind, tmp_path, name)

    fixture.__name__ = fixture.__qualname__ = f"{kind}_url"
    return pytest.fixture(fixture)


for _kind in STORE_KINDS:
    globals()[f"{_kind}_url"] = _namespace_fixture(_kind)


@pytest.fixture
def opened_stores() -> Iterator[list[Store]]:
    """The stores a test opens itself: each closed when the test ends, before the fixtures
    named ahead of this one (its namespace) are torn down."""
    opened: list[Store] = []
    yield opened
    for store in opened:
        store.close()


@pytest.fixture
def store_factory(store_url, opened_stores) -> Callable[[], Store]:
    """Opens further clients (own connections) on the same namespace."""

    def open_client() -> Store:
        client = open_store(store_url, allow_in_process=True)  # memory:// in the contract
        opened_stores.append(client)
        return client

    return open_client


@pytest.fixture
def store(store_factory) -> Store:
    return store_factory()


@pytest.fixture
def cli_env(tmp_path) -> dict[str, str]:
    """Environment for running the real executable with no stray user configuration."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKLOCK_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    env["NO_COLOR"] = "1"
    # Commands run under tasklock call `tasklock` by name: the one under test, venv or not.
    bin_dir = os.path.dirname(executable())
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    return env


@pytest.fixture
def env(cli_env, store_url) -> dict[str, str]:
    """``cli_env`` with ``TASKLOCK_STORE`` naming the test's store: every store kind, or the
    one a module's own ``store_url`` names."""
    return {**cli_env, "TASKLOCK_STORE": store_url}


def pytest_configure(config: pytest.Config) -> None:
    """Compile tasklock_cli and the tests to bytecode once, as installing a package does:
    every CLI test starts a new interpreter, and where PYTHONDONTWRITEBYTECODE is set an
    editable install's modules were compiled from source at every start (0.1 s instead of
    0.05 s of CPU for a `tasklock run` on SQLite: most of the suite's CPU), and each pytest
    process rewrote every test module's asserts again (~5 s each). The caches stay in the
    checkout's __pycache__ directories, which git ignores."""
    sys.dont_write_bytecode = False  # pytest's rewritten test modules are cached too
    if hasattr(config, "workerinput"):  # an xdist worker: the controller has compiled
        return
    import compileall

    root = config.rootpath
    for package in ("tasklock_cli", "tests"):
        compileall.compile_dir(root / package, quiet=2, workers=1)


#: Test modules that need a store server, a private cluster or a proxy whatever their
#: parameters: the fault tests, and each store's own ``test_<name>_store`` where its
#: provisioning names a server.
_SERVER_MODULES = (
    "test_faults_",
    *(f"test_{kind}_store" for kind in STORE_KINDS if services.needs_server(kind)),
)


#: Every store kind a test may be parametrized with (the in-process ones too).
_ALL_KINDS = frozenset(all_packages())
#: Fixtures that name a namespace on a store server: a test that takes one is not quick.
_SERVER_FIXTURES = frozenset(
    {"network_store_url", *(f"{kind}_url" for kind in STORE_KINDS if services.needs_server(kind))}
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``quick`` (``pytest -m quick``: the edit-test loop) every test that runs on
    stores without a server (a file, this process: their provisioning names none) or on
    none, needs no server, and is not marked slow -- of a test of the executable (``cli_env``:
    processes, most of the suite's CPU) parametrized with data variants, only the first
    variant on each store (the rest run in the whole suite, and ``pytest tests/test_x.py``
    runs them all); then spread the stress and waiting tests over the run."""
    variants_seen: set[tuple[str, tuple[str, ...]]] = set()
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker("slow"):
            continue
        if item.module.__name__.rpartition(".")[2].startswith(_SERVER_MODULES):
            continue
        params = getattr(item, "callspec", None)
        on_servers = {
            value
            for value in (params.params.values() if params else ())
            if isinstance(value, str) and value in _ALL_KINDS and services.needs_server(value)
        }
        servers = _SERVER_FIXTURES.intersection(item.fixturenames)
        if on_servers or servers or item.get_closest_marker("server"):
            continue
        stores = tuple(
            sorted(
                value
                for value in (params.params.values() if params else ())
                if isinstance(value, str) and value in _ALL_KINDS
            )
        )
        variant = (f"{item.module.__name__}::{item.originalname}", stores)
        if "cli_env" not in item.fixturenames or variant not in variants_seen:
            variants_seen.add(variant)
            item.add_marker(pytest.mark.quick)
    _spread_the_stress(items)


def _spread_the_stress(items: list[pytest.Item]) -> None:
    """Give each CPU-bound stress test (``stress`` marker) and each test that waits out a
    store's clock (``waits``) a share of the run of its own. pytest-xdist's worksteal hands
    each worker a contiguous share: unspread, the stress tests would run one after another
    each beside the other workers' tests, and the waiting ones (neighbours in a few
    modules) would queue up on one worker. A stress test goes further into each share, so
    none is left to run alone at the end; a waiting one goes first, so the other workers'
    tests run while it waits."""
    _spread(items, "stress", staggered=True)
    _spread(items, "waits", staggered=False)


def _spread(items: list[pytest.Item], marker: str, staggered: bool) -> None:
    chosen = [item for item in items if item.get_closest_marker(marker)]
    rest = [item for item in items if not item.get_closest_marker(marker)]
    if not chosen:
        return
    share = -(-len(rest) // len(chosen))
    items[:] = []
    for index, item in enumerate(chosen):
        mine = rest[index * share : (index + 1) * share]
        at = index * len(mine) // len(chosen) if staggered else 0
        items.extend([*mine[:at], item, *mine[at:]])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    """A test's recorded figures travel in its report (see tests/support/report.py)."""
    outcome = yield
    if call.when == "call":
        from tests.support import report

        test_report = outcome.get_result()
        for figures in report.take_pending():
            test_report.user_properties.append((report.PROPERTY, figures))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call" or not report.passed:
        return
    from tests.support import report as figures_report

    for name, value in report.user_properties:
        if name == figures_report.PROPERTY:
            assert isinstance(value, tuple)  # (scenario, store, figures): see makereport
            figures_report.keep(*value)


def pytest_terminal_summary(terminalreporter):
    from tests.support import report

    lines = report.table()
    if lines:
        terminalreporter.section("fault and stress figures (passed tests only)")
        for line in lines:
            terminalreporter.write_line(line)
        report.write_if_asked(lines)
