"""The store contract, lock modes and the queue's deploy rules: shared holders beside each
other and never beside an exclusive one, a waiting writer never starved, ``supersede``
(the newest waiting ``--supersede`` run is the only one left) and ``front`` (``--replace``
waits ahead of everyone).

Part of the contract suite (the same ``store`` fixture, parametrized over every store).
Each run is a client of its own, as each run is a process of its own.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import Superseded
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.testing.helpers import OTHER
from tasklock_cli.testing.helpers import granted
from tasklock_cli.testing.helpers import on_the_store
from tasklock_cli.testing.helpers import short_ttl
from tasklock_cli.testing.helpers import token


def _holder(n: int) -> Holder:
    return Holder(host=f"host-{n}", pid=1000 + n, user=f"user{n}", command=["job"], note=f"n{n}")


class Run:
    """One run: a client of its own, an owner token, a mode, how it queues."""

    def __init__(self, client, n: int, mode: str = EXCLUSIVE, key: str = "k", **queueing):
        self.client, self.n, self.mode, self.key = client, n, mode, key
        self.queueing = queueing
        self.owner = token()
        self.lease: Lease | None = None

    def attempt(self, queue: bool = True):
        got = self.client.acquire(
            self.key, 30, _holder(self.n), self.owner, queue=queue, mode=self.mode, **self.queueing
        )
        if got is not None:
            self.lease = got
        return got

    def release(self) -> None:
        assert self.client.release(self.lease) is True
        self.lease = None


def _queue(store, key: str = "k") -> list[tuple[int, str]]:
    return [(waiter.holder.pid - 1000, waiter.mode) for waiter in store.waiters(key)]


def _holding(store, key: str = "k") -> list[tuple[int, str]]:
    return sorted((info.holder.pid - 1000, info.mode) for info in store.holders(key))


# -- shared and exclusive ---------------------------------------------------------------------


def test_shared_holders_hold_together_each_with_a_slot_and_token(store, store_factory):
    runs = [Run(store_factory(), n, SHARED) for n in range(3)]
    leases = [run.attempt(queue=False) for run in runs]
    assert all(leases)
    assert {lease.mode for lease in leases} == {SHARED}
    assert len({lease.slot for lease in leases}) == 3
    assert all(lease.limit == 1 for lease in leases)
    tokens = [lease.fencing_token for lease in leases]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3
    assert _holding(store) == [(0, SHARED), (1, SHARED), (2, SHARED)]
    info = store.peek("k")
    assert info.fencing_token == tokens[0]
    assert info.to_json()["mode"] == SHARED
    assert info.to_json()["holder"]["mode"] == SHARED
    writer = Run(store_factory(), 9)
    assert writer.attempt(queue=False) is None
    for run in runs:
        assert run.client.renew(run.lease, 30).mode == SHARED
        run.release()
    lease = writer.attempt(queue=False)
    assert lease is not None and lease.mode == EXCLUSIVE and lease.slot == 0
    assert lease.fencing_token > max(tokens)
    assert store.peek("k").to_json()["mode"] == EXCLUSIVE


def test_an_exclusive_holder_keeps_shared_runs_out(store, store_factory):
    writer = Run(store_factory(), 0)
    assert writer.attempt(queue=False) is not None
    reader = Run(store_factory(), 1, SHARED)
    assert reader.attempt(queue=False) is None
    writer.release()
    assert reader.attempt(queue=False) is not None
    assert Run(store_factory(), 2).attempt(queue=False) is None


def test_a_waiting_writer_is_not_starved_by_readers(store, store_factory):
    first = Run(store_factory(), 0, SHARED)
    assert first.attempt() is not None
    writer = Run(store_factory(), 1)
    assert writer.attempt() is None
    late_reader = Run(store_factory(), 2, SHARED)
    assert late_reader.attempt() is None  # behind the writer, though only readers hold it
    assert Run(store_factory(), 3, SHARED).attempt(queue=False) is None
    assert _queue(store) == [(1, EXCLUSIVE), (2, SHARED)]
    first.release()
    assert late_reader.attempt() is None
    assert writer.attempt() is not None
    assert late_reader.attempt() is None
    writer.release()
    assert late_reader.attempt() is not None


def test_the_shared_runs_at_the_head_are_admitted_together(store, store_factory):
    writer = Run(store_factory(), 0)
    assert writer.attempt() is not None
    modes = ((1, SHARED), (2, SHARED), (3, EXCLUSIVE), (4, SHARED))
    runs = [Run(store_factory(), n, mode) for n, mode in modes]
    for run in runs:
        assert run.attempt() is None
    assert _queue(store) == [(1, SHARED), (2, SHARED), (3, EXCLUSIVE), (4, SHARED)]
    writer.release()
    # the second reader first: it needs only readers ahead of it, not their turn taken
    assert runs[1].attempt() is not None
    assert runs[3].attempt() is None
    assert runs[2].attempt() is None
    assert runs[0].attempt() is not None
    assert _holding(store) == [(1, SHARED), (2, SHARED)]
    assert _queue(store) == [(3, EXCLUSIVE), (4, SHARED)]
    runs[0].release()
    assert runs[2].attempt() is None
    runs[1].release()
    assert runs[3].attempt() is None
    assert runs[2].attempt() is not None
    runs[2].release()
    assert runs[3].attempt() is not None


def test_shared_and_a_semaphore_do_not_mix(store, store_factory):
    reader = Run(store_factory(), 0, SHARED)
    assert reader.attempt(queue=False) is not None
    with pytest.raises(LimitMismatch):
        store_factory().acquire("k", 30, OTHER, token(), limit=3)
    reader.release()
    assert store.acquire("k", 30, OTHER, token(), limit=3) is not None
    with pytest.raises(LimitMismatch):
        Run(store_factory(), 1, SHARED).attempt(queue=False)


def test_breaking_and_forcing_reach_every_shared_holder(store, store_factory):
    runs = [Run(store_factory(), n, SHARED) for n in range(2)]
    for run in runs:
        assert run.attempt(queue=False) is not None
    second = granted(runs[1].lease)
    broken = store.break_lease("k", second.fencing_token, OTHER)
    assert [info.fencing_token for info in broken] == [second.fencing_token]
    assert runs[0].client.renew(runs[0].lease, 30) is not None
    assert len(store.force_release("k")) == 2
    assert store.holders("k") == []
    assert Run(store_factory(), 5).attempt(queue=False) is not None


def test_a_retried_shared_acquire_gets_the_same_lease(store, store_factory):
    reader = Run(store_factory(), 0, SHARED)
    first = reader.attempt(queue=False)
    again = reader.attempt(queue=False)
    assert (again.slot, again.fencing_token) == (first.slot, first.fencing_token)
    assert len(store.holders("k")) == 1


def test_a_retried_shared_acquire_never_revives_a_lease_that_ran_out(store, store_factory):
    """A reader whose acquire reply was lost retries after its lease ran out and a writer
    took the key: the retry must not bring the reader's lease back beside the writer."""
    short, past = short_ttl(store)
    first = Run(store_factory(), 0, SHARED)
    assert first.attempt(queue=False) is not None
    reader = Run(store_factory(), 1, SHARED)
    got = reader.client.acquire("k", short, _holder(1), reader.owner, mode=SHARED)
    assert got is not None and got.slot == 1  # (its reply "lost": the reader never knew)
    first.release()
    time.sleep(past)
    writer = Run(store_factory(), 2)
    assert writer.attempt(queue=False) is not None
    assert reader.attempt(queue=False) is None
    assert _holding(store) == [(2, EXCLUSIVE)]


# -- supersede and front ----------------------------------------------------------------------


def test_a_newer_supersede_waiter_supersedes_the_older_ones(store, store_factory):
    holder = Run(store_factory(), 0)
    assert holder.attempt() is not None
    older = Run(store_factory(), 1, supersede=True)
    plain = Run(store_factory(), 2)
    newer = Run(store_factory(), 3, supersede=True)
    for run in (older, plain, newer):
        assert run.attempt() is None
    assert _queue(store) == [(2, EXCLUSIVE), (3, EXCLUSIVE)]
    assert store.waiting_counts() == {"k": 2}
    holder.release()
    with pytest.raises(Superseded):
        older.attempt()
    assert _queue(store) == [(2, EXCLUSIVE), (3, EXCLUSIVE)]
    assert newer.attempt() is None  # the plain run keeps its place ahead
    assert plain.attempt() is not None
    plain.release()
    assert newer.attempt() is not None


def test_a_superseded_place_holds_nobody_up(store, store_factory):
    holder = Run(store_factory(), 0)
    assert holder.attempt() is not None
    older = Run(store_factory(), 1, supersede=True)
    assert older.attempt() is None
    newer = Run(store_factory(), 2, supersede=True)
    assert newer.attempt() is None
    holder.release()
    assert newer.attempt() is not None  # the older one never tried again
    with pytest.raises(Superseded):
        older.attempt()
    assert store.waiters("k") == []


def test_keeping_a_place_supersedes_nobody(store, store_factory):
    holder = Run(store_factory(), 0)
    assert holder.attempt() is not None
    first = Run(store_factory(), 1, supersede=True)
    assert first.attempt() is None
    assert first.attempt() is None
    assert first.attempt() is None
    assert _queue(store) == [(1, EXCLUSIVE)]


def test_front_takes_a_place_ahead_of_every_waiter(store, store_factory):
    holder = Run(store_factory(), 0)
    assert holder.attempt() is not None
    runs = [Run(store_factory(), n) for n in (1, 2)]
    for run in runs:
        assert run.attempt() is None
    replacer = Run(store_factory(), 3, front=True)
    assert replacer.attempt() is None
    assert replacer.attempt() is None  # keeping the place keeps it in front
    assert _queue(store) == [(3, EXCLUSIVE), (1, EXCLUSIVE), (2, EXCLUSIVE)]
    holder.release()
    assert runs[0].attempt() is None
    assert replacer.attempt() is not None
    replacer.release()
    assert runs[0].attempt() is not None


# -- random shared and exclusive arrivals -----------------------------------------------------

STEPS = st.lists(
    st.tuples(st.sampled_from(["shared", "exclusive", "release"]), st.integers(0, 7)),
    min_size=1,
    max_size=10,
)


@on_the_store(max_examples=8)
@given(steps=STEPS)
def test_admission_invariants_over_random_arrivals_and_releases(store, store_factory, steps):
    """Never an exclusive holder beside anyone; admission in arrival order up to the
    shared-batch rule; every token greater than every earlier one of the key."""
    key = f"m-{token()}"
    waiting: list[Run] = []
    holding: list[Run] = []
    last_token = 0
    for n, (step, pick) in enumerate(steps):
        if step == "release":
            if holding:
                holding.pop(pick % len(holding)).release()
        else:
            waiting.append(Run(store_factory(), n, SHARED if step == "shared" else EXCLUSIVE, key))
        for run in list(waiting):  # everyone tries, in arrival order
            lease = run.attempt()
            if lease is None:
                continue
            assert lease.fencing_token > last_token
            last_token = lease.fencing_token
            ahead = waiting[: waiting.index(run)]
            assert not ahead or (run.mode == SHARED and all(o.mode == SHARED for o in ahead))
            waiting.remove(run)
            holding.append(run)
        modes = {run.mode for run in holding}
        assert modes != {EXCLUSIVE} or len(holding) == 1
        assert len(modes) <= 1
        if waiting and not holding:
            pytest.fail(f"{[run.n for run in waiting]} wait on a free key")
        assert _queue(store, key) == [(run.n, run.mode) for run in waiting]
    for run in holding:
        run.release()
