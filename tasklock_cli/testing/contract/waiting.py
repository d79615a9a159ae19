"""The store contract, waiting: ``wait_for_release`` and ``stop_waiting`` on every store.

Part of the contract suite (the same ``store`` fixture, parametrized over every store):
what a waiter may rely on whatever the store's wake-up path (FIFOs, LISTEN/NOTIFY, a wake
list, an etcd watch).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from tasklock_cli.testing.helpers import HOLDER
from tasklock_cli.testing.helpers import OTHER
from tasklock_cli.testing.helpers import short_ttl
from tasklock_cli.testing.helpers import token
from tasklock_cli.testing.helpers import waiting_thread

#: A woken waiter returns within this of the release that woke it (a loaded machine's
#: scheduler included); not woken, it would look again only after the waiter TTL (3 s) or
#: at its wait's 10 s end.
WOKEN_WITHIN_S = 1.0


def _wait_timed(
    waiter, key: str, timeout: float, meanwhile: tuple[float, Callable[[], object]] | None = None
) -> float:
    """How long ``waiter.wait_for_release(key, timeout)`` took; ``meanwhile`` (seconds,
    action): the action is run in a timer that many seconds into the wait."""
    timer = threading.Timer(*meanwhile) if meanwhile else None
    if timer:
        timer.start()
    started = time.monotonic()
    waiter.wait_for_release(key, timeout)
    waited = time.monotonic() - started
    if timer:
        timer.join()
    return waited


def test_a_release_by_another_client_wakes_the_waiter(store, store_factory):
    holder = store_factory()
    lease = holder.acquire("k", 30, OTHER, token())
    assert store.acquire("k", 30, HOLDER, token()) is None
    released_at: list[float] = []

    def release_soon() -> None:
        time.sleep(0.3)
        released_at.append(time.monotonic())
        assert holder.release(lease) is True

    thread = threading.Thread(target=release_soon)
    thread.start()
    store.wait_for_release("k", 10)
    woke = time.monotonic()
    thread.join()
    assert released_at, "woke before the release"
    assert woke - released_at[0] < WOKEN_WITHIN_S, woke - released_at[0]
    assert store.acquire("k", 30, HOLDER, token()) is not None


def test_a_forced_release_wakes_the_waiter(store, store_factory):
    store_factory().acquire("k", 30, OTHER, token())
    admin = store_factory()
    waited = _wait_timed(store, "k", 10, meanwhile=(0.3, lambda: admin.force_release("k")))
    assert waited < 0.3 + WOKEN_WITHIN_S, waited


def test_a_release_between_the_failed_acquire_and_the_wait_is_not_missed(store, store_factory):
    holder = store_factory()
    lease = holder.acquire("k", 30, OTHER, token())
    assert store.acquire("k", 30, HOLDER, token()) is None
    assert holder.release(lease) is True  # before the waiter starts listening
    assert _wait_timed(store, "k", 10) < WOKEN_WITHIN_S
    assert store.acquire("k", 30, HOLDER, token()) is not None


def test_a_free_key_is_not_waited_for(store):
    assert _wait_timed(store, "never-held", 10) < WOKEN_WITHIN_S


def test_the_waiter_wakes_when_the_lease_runs_out(store, store_factory):
    ttl, past = short_ttl(store)
    store_factory().acquire("k", ttl, OTHER, token())
    waited = _wait_timed(store, "k", 10)
    assert waited < past + WOKEN_WITHIN_S, waited
    assert store.acquire("k", 30, HOLDER, token()) is not None


def test_a_wait_honours_its_timeout_and_can_be_repeated(store, store_factory):
    holder = store_factory()
    lease = holder.acquire("k", 30, OTHER, token())
    for _ in range(3):  # each wait leaves the store ready for the next
        assert 0.15 < _wait_timed(store, "k", 0.2) < 1.5
    waited = _wait_timed(store, "k", 10, meanwhile=(0.2, lambda: holder.release(lease)))
    assert waited < 0.2 + WOKEN_WITHIN_S, waited


def test_a_release_of_another_key_does_not_end_the_wait(store, store_factory):
    holder = store_factory()
    holder.acquire("k", 30, OTHER, token())
    bystander = holder.acquire("other", 30, OTHER, token())
    waited = _wait_timed(store, "k", 0.8, meanwhile=(0.1, lambda: holder.release(bystander)))
    assert waited >= 0.75, waited


def test_the_next_waiter_is_woken_once_the_first_goes_away(store, store_factory):
    """A waiter that closes its store (a killed waiter's connection ends with it) leaves
    the queue: the release then wakes the next one."""
    holder, first, second = store_factory(), store_factory(), store_factory()
    lease = holder.acquire("k", 30, OTHER, token())
    first.wait_for_release("k", 0.2)  # times out, still queued for "k"
    woke: list[float] = []
    thread = waiting_thread(second, "k", 10, woke)
    time.sleep(0.3)
    first.close()
    time.sleep(0.3)
    released = time.monotonic()
    assert holder.release(lease) is True
    thread.join()
    assert woke and time.monotonic() - released < WOKEN_WITHIN_S + 0.5


def test_a_waiter_that_got_the_lease_leaves_the_queue_to_the_next(store, store_factory):
    holder, first, second = store_factory(), store_factory(), store_factory()
    lease = holder.acquire("k", 30, OTHER, token())
    first.wait_for_release("k", 0.2)
    assert holder.release(lease) is True
    mine = first.acquire("k", 30, HOLDER, token())
    assert mine is not None
    timer = threading.Timer(0.3, lambda: first.release(mine))
    timer.start()
    waited = _wait_timed(second, "k", 10)
    timer.join()
    assert 0.25 < waited < 0.3 + WOKEN_WITHIN_S, waited


def test_stop_waiting_then_waiting_again_works(store, store_factory):
    holder = store_factory()
    lease = holder.acquire("k", 30, OTHER, token())
    store.wait_for_release("k", 0.1)
    store.stop_waiting("k")
    waited = _wait_timed(store, "k", 10, meanwhile=(0.2, lambda: holder.release(lease)))
    assert waited < 0.2 + WOKEN_WITHIN_S, waited
