"""``tasklock_cli.testing.store_contract``: the contract's cases, collected on a store a
user brings (here the memory store, opened as a user's own store would be)."""

from __future__ import annotations

from tasklock_cli.stores.memory.store import MemoryStore
from tasklock_cli.testing import contract_cases
from tasklock_cli.testing import store_contract
from tasklock_cli.testing.contract import basics

TestUsersStore = store_contract(
    lambda namespace: MemoryStore.from_url(f"memory://{namespace}"), name="TestUsersStore"
)


def test_the_cases_are_the_contract_suites_own():
    cases = contract_cases()
    case = "test_release_is_scoped_by_owner_token"
    assert cases[case] is getattr(basics, case)
    assert cases[case] is not None
    assert len(cases) > 100
    assert all(name.startswith("test_") for name in cases)
