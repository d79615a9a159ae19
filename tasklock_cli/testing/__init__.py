"""Testing a store of your own against tasklock's store contract.

    # tests/test_my_store.py
    from tasklock_cli.testing import store_contract
    TestMyStore = store_contract(lambda namespace: MyStore.from_url(f"my://db/{namespace}"))

``store_contract`` returns a pytest test class holding the contract's cases: the very
cases tasklock's own stores pass (``tasklock_cli.testing.contract``, which its test suite
collects on every store). ``factory(namespace)`` opens a new client of the store in
``namespace``, fresh and empty for each case (a case opens several clients, as several
processes would, all in its one namespace); each is closed after the case. A factory
without a parameter is called as ``factory()`` (its store must then start empty for each
case). The cases need pytest and hypothesis.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from collections.abc import Iterator
from typing import Any

from tasklock_cli.stores.base import Store

#: The contract's case modules, in the order their cases run.
CONTRACT_MODULES = ("basics", "breaks", "modes", "queue", "slots", "waiting")
#: The fixtures a case may take: the store's (given by the class) and pytest's own.
CASE_FIXTURES = frozenset({"store", "store_factory", "wake_pipe", "monkeypatch", "tmp_path"})


def contract_cases() -> dict[str, Callable[..., Any]]:
    """Every contract case by name: the ``test_*`` functions of the contract modules that
    need nothing but a store (and pytest's own fixtures)."""
    import sys
    from importlib import import_module

    import pytest

    if "tasklock_cli.testing.contract" not in sys.modules:  # pytest's detailed asserts
        pytest.register_assert_rewrite("tasklock_cli.testing.contract")
    cases: dict[str, Callable[..., Any]] = {}
    for name in CONTRACT_MODULES:
        module = import_module(f"tasklock_cli.testing.contract.{name}")
        for attribute, case in vars(module).items():
            if attribute.startswith("test_") and callable(case) and _needs_a_store(case):
                cases[attribute] = case
    return cases


def _needs_a_store(case: Callable[..., Any]) -> bool:
    fixtures = set(_fixture_names(case))
    return bool(fixtures & {"store", "store_factory"}) and fixtures <= CASE_FIXTURES


def _fixture_names(case: Callable[..., Any]) -> list[str]:
    """The fixtures pytest passes ``case`` (a hypothesis test's strategies given)."""
    return [
        name
        for name, parameter in inspect.signature(case).parameters.items()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind is not inspect.Parameter.VAR_KEYWORD
    ]


def store_contract(factory: Callable[..., Store], name: str = "TestStoreContract") -> type:
    """A pytest test class running every contract case on the stores ``factory`` opens
    (assign it to a ``Test*`` name in a test module)."""
    import uuid

    import pytest

    from tasklock_cli.testing.helpers import wake_pipe_pair

    class Contract:
        @pytest.fixture
        def store_factory(self) -> Iterator[Callable[[], Store]]:
            opened: list[Store] = []
            namespace = f"tasklock-contract-{uuid.uuid4().hex[:12]}"
            takes_namespace = bool(inspect.signature(factory).parameters)

            def open_client() -> Store:
                opened.append(factory(namespace) if takes_namespace else factory())
                return opened[-1]

            yield open_client
            for store in opened:
                store.close()

        @pytest.fixture
        def store(self, store_factory: Callable[[], Store]) -> Store:
            return store_factory()

        @pytest.fixture
        def wake_pipe(self) -> Iterator[tuple[int, int]]:
            yield from wake_pipe_pair()

    for case_name, case in contract_cases().items():
        setattr(Contract, case_name, staticmethod(case))
    Contract.__name__ = Contract.__qualname__ = name
    return Contract
