"""The store contract, the queue of waiters: first come, first served on every store.

Part of the contract suite (the same ``store`` fixture, parametrized over every store).
Each waiter is a client of its own (as each waiting run is a process of its own): it
joins the key's queue with ``acquire(queue=True)``, keeps its place by trying again, and
leaves it by getting a slot, by ``stop_waiting`` or by crashing (its place runs out).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasklock_cli.stores.model import Holder
from tasklock_cli.testing.helpers import OTHER
from tasklock_cli.testing.helpers import granted
from tasklock_cli.testing.helpers import on_the_store
from tasklock_cli.testing.helpers import token

#: A short waiter lease for the cases where a place must run out (etcd: whole seconds).
SHORT_WAITER_TTL = 1.0


def _holder(n: int) -> Holder:
    return Holder(host=f"host-{n}", pid=1000 + n, user=f"user{n}", command=["job"], note=f"n{n}")


class Waiting:
    """One waiting run: a client of its own, an owner token, a holder record."""

    def __init__(self, client, n: int, key: str = "k", limit: int = 1, **ask) -> None:
        self.client, self.n, self.key, self.limit = client, n, key, limit
        self.owner = token()
        self.lease = None
        self.ask = ask  # priority, front, max_waiting, mode

    def attempt(self):
        self.lease = self.client.acquire(
            self.key, 30, _holder(self.n), self.owner, limit=self.limit, queue=True, **self.ask
        )
        return self.lease

    def release(self) -> None:
        assert self.client.release(self.lease) is True
        self.lease = None


def _queue(store, key: str = "k") -> list[int]:
    return [waiter.holder.pid - 1000 for waiter in store.waiters(key)]


def _join(store_factory, count: int, key: str = "k", limit: int = 1) -> list[Waiting]:
    runs = [Waiting(store_factory(), n, key, limit) for n in range(count)]
    for run in runs:
        assert run.attempt() is None
    return runs


def _served_next(runs: list[Waiting]) -> list[int]:
    """Every run tries once, the last arrival first: which of them got a slot."""
    return [run.n for run in reversed(runs) if run.attempt() is not None]


def test_waiters_are_listed_and_served_in_arrival_order(store, store_factory):
    lease = store.acquire("k", 30, OTHER, token())
    runs = _join(store_factory, 4)
    assert _queue(store) == [0, 1, 2, 3]
    first = store.waiters("k")[0]
    assert first.to_json() == {
        "host": "host-0",
        "pid": 1000,
        "user": "user0",
        "since": first.to_json()["since"],
        "note": "n0",
        "mode": "exclusive",
        "priority": 0,
    }
    assert abs(first.since.timestamp() - time.time()) < 60
    assert store.release(lease) is True
    for expected in range(4):
        waiting = [run for run in runs if run.lease is None and run.n >= expected]
        assert _served_next(waiting) == [expected]
        assert _queue(store) == list(range(expected + 1, 4))
        runs[expected].release()
    assert store.waiters("k") == []


def test_an_acquire_without_a_place_does_not_jump_the_queue(store, store_factory):
    lease = store.acquire("k", 30, OTHER, token())
    (run,) = _join(store_factory, 1)
    assert store.release(lease) is True
    newcomer = store_factory()
    assert newcomer.acquire("k", 30, OTHER, token()) is None  # --wait 0, or a new arrival
    assert newcomer.acquire("k", 30, OTHER, token(), queue=True) is None
    assert _queue(store)[0] == 0
    assert run.attempt() is not None


def test_a_freed_slot_goes_to_the_longest_waiter(store, store_factory):
    holders = [store_factory() for _ in range(2)]
    leases = [client.acquire("k", 30, OTHER, token(), limit=2) for client in holders]
    assert all(leases)
    runs = _join(store_factory, 3, limit=2)
    assert holders[1].release(leases[1]) is True
    assert _served_next(runs) == [0]
    assert holders[0].release(leases[0]) is True
    assert _served_next(runs[1:]) == [1]
    assert _queue(store) == [2]


def test_a_waiter_that_gives_up_leaves_the_queue(store, store_factory):
    lease = store.acquire("k", 30, OTHER, token())
    runs = _join(store_factory, 3)
    runs[0].client.stop_waiting("k")
    runs[0].client.close()  # (etcd's client would keep the place through its lease)
    assert _queue(store) == [1, 2]
    assert store.release(lease) is True
    assert _served_next(runs[1:]) == [1]


def test_a_waiter_whose_store_closes_leaves_every_queue(store, store_factory):
    """``close`` alone, without ``stop_waiting`` first, leaves each queue the client has a
    place in, so the waiters behind move up at once."""
    leases = [granted(store.acquire(key, 30, OTHER, token())) for key in ("k", "j")]
    closing = store_factory()
    for key in ("k", "j"):
        assert Waiting(closing, 0, key).attempt() is None
    stays = Waiting(store_factory(), 1)
    assert stays.attempt() is None
    assert (_queue(store, "k"), _queue(store, "j")) == ([0, 1], [0])
    closing.close()
    assert (_queue(store, "k"), _queue(store, "j")) == ([1], [])
    assert store.release(leases[0]) is True
    assert stays.attempt() is not None


def test_a_crashed_waiters_place_runs_out_by_itself(store, store_factory):
    lease = store.acquire("k", 30, OTHER, token())
    crashed = Waiting(store_factory(), 0)
    crashed.client.waiter_ttl = SHORT_WAITER_TTL
    assert crashed.attempt() is None
    behind = Waiting(store_factory(), 1)
    assert behind.attempt() is None
    assert _queue(store) == [0, 1]
    assert store.release(lease) is True
    assert behind.attempt() is None  # the crashed waiter comes first while its place lives
    crashed_at = time.monotonic()
    # never renewed again: it runs out within the waiter lease the store keeps (etcd may
    # round it up to its own minimum lease TTL)
    limit = crashed.client.waiter_ttl + 3.0
    while behind.attempt() is None:
        assert time.monotonic() - crashed_at < limit, _queue(store)
        time.sleep(0.05)
    assert _queue(store) == []


def test_waiting_counts_per_key_and_prefix(store, store_factory):
    for key in ("deploy:a", "deploy:b", "other"):
        assert store.acquire(key, 30, OTHER, token()) is not None
    _join(store_factory, 2, key="deploy:a")
    _join(store_factory, 1, key="other")
    assert store.waiting_counts() == {"deploy:a": 2, "other": 1}
    assert store.waiting_counts("deploy:") == {"deploy:a": 2}
    assert store.waiters("deploy:b") == []


# -- random arrivals, give-ups and crashes -------------------------------------------------

EVENTS = st.lists(st.sampled_from(["arrive", "give-up", "crash"]), min_size=1, max_size=6)


@on_the_store(max_examples=5)
@given(events=EVENTS, picks=st.lists(st.integers(0, 5), min_size=6, max_size=6))
def test_the_queue_keeps_arrival_order_through_give_ups_and_crashes(
    store, store_factory, events, picks
):
    """Order among those still waiting is arrival order; a crashed waiter delays those
    behind it by no more than its waiter lease."""
    key = f"q-{token()}"
    lease = store.acquire(key, 30, OTHER, token())
    waiting: list[Waiting] = []
    crashed = False
    for n, event in enumerate(events):
        if event == "arrive" or not waiting:
            run = Waiting(store_factory(), n, key)
            run.client.waiter_ttl = SHORT_WAITER_TTL
            assert run.attempt() is None
            waiting.append(run)
            continue
        gone = waiting.pop(picks[n] % len(waiting))
        if event == "give-up":
            gone.client.stop_waiting(key)
            gone.client.close()
        else:
            crashed = True  # never tries again: its place must run out by itself
    expected = [run.n for run in waiting]
    if not crashed:
        assert _queue(store, key) == expected
    assert store.release(lease) is True
    started = time.monotonic()
    patience = SHORT_WAITER_TTL + 3.0 if crashed else 1.0
    served: list[int] = []
    while waiting:
        assert time.monotonic() - started < patience * (len(served) + 1), (served, expected)
        got = _served_next(waiting)
        assert len(got) <= 1, got
        if got:
            served.append(got[0])
            run = next(run for run in waiting if run.n == got[0])
            waiting.remove(run)
            run.release()
        else:
            time.sleep(0.05)
    assert served == expected


def test_waiters_are_served_by_priority_then_arrival_with_a_front_place_first(store, store_factory):
    """The order is the store's admission rule: each run, tried last arrival first, is
    admitted only in its turn (priority, then arrival; ``front`` before all)."""
    lease = store.acquire("k", 30, OTHER, token())
    asks: list[dict] = [{}, {"priority": 5}, {}, {"priority": -3}, {"priority": 100}]
    asks.append({"front": True})
    asks.append({"priority": -100})
    runs = [Waiting(store_factory(), n, **ask) for n, ask in enumerate(asks)]
    for run in runs:
        assert run.attempt() is None
    expected = [5, 4, 1, 0, 2, 3, 6]
    assert _queue(store) == expected
    assert [w.priority for w in store.waiters("k")] == [0, 100, 5, 0, 0, -3, -100]
    assert store.release(lease) is True
    for at, n in enumerate(expected):
        waiting = [run for run in runs if run.n in expected[at:]]
        assert _served_next(waiting) == [n]
        runs[n].release()


def test_a_shared_waiter_of_higher_priority_goes_before_an_exclusive_one(store, store_factory):
    """The writer rule in priority order: the exclusive waiter is behind the shared one."""
    lease = store.acquire("k", 30, OTHER, token())
    writer = Waiting(store_factory(), 0)
    reader = Waiting(store_factory(), 1, mode="shared", priority=1)
    late = Waiting(store_factory(), 2, mode="shared")
    for run in (writer, reader, late):
        assert run.attempt() is None
    assert _queue(store) == [1, 0, 2]
    assert store.release(lease) is True
    assert _served_next([writer, reader, late]) == [1]  # the late reader waits for the writer
    reader.release()
    assert _served_next([writer, late]) == [0]


def test_max_waiting_keeps_a_newcomer_out_of_a_queue_that_long(store, store_factory):
    from tasklock_cli.errors import QueueFull

    lease = store.acquire("k", 30, OTHER, token())
    runs = _join(store_factory, 2)
    capped = Waiting(store_factory(), 7, max_waiting=2)
    with pytest.raises(QueueFull):
        capped.attempt()
    assert _queue(store) == [0, 1]
    with pytest.raises(QueueFull):
        Waiting(store_factory(), 8, max_waiting=0).attempt()
    assert Waiting(store_factory(), 9, max_waiting=3).attempt() is None
    assert _queue(store) == [0, 1, 9]
    runs[0].ask = {"max_waiting": 1}  # a run with a place keeps it
    assert runs[0].attempt() is None and _queue(store) == [0, 1, 9]
    assert store.release(lease) is True


def test_a_supersede_waiter_supersedes_one_of_another_priority(store, store_factory):
    from tasklock_cli.errors import Superseded

    lease = store.acquire("k", 30, OTHER, token())
    older = Waiting(store_factory(), 0, supersede=True, priority=3)
    assert older.attempt() is None
    newer = Waiting(store_factory(), 1, supersede=True)
    assert newer.attempt() is None
    assert _queue(store) == [1]
    with pytest.raises(Superseded):
        older.attempt()
    assert store.release(lease) is True
