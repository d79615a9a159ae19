"""``doctor`` for the memory store: there is nothing to reach; it says what it is."""

from __future__ import annotations

from tasklock_cli.stores.model import StoreCheck

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.memory.store import MemoryStore


def store_checks(store: MemoryStore) -> list[StoreCheck]:
    detail = f"{store.display_url}: in this process only (for tests)"
    return [StoreCheck("store", True, detail), StoreCheck("reachable", True, "in memory")]
