"""The store contract, semaphores: ``acquire(..., limit=N)`` on every store.

Part of the contract suite (the same ``store`` fixture, parametrized over every store).
A key held with ``limit`` N has up to N live leases, one per slot ``0..N-1``; a plain
lock is slot 0 of limit 1. Tokens increase across slots; every holder of a key must use
the same limit.
"""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.stores.model import Lease
from tasklock_cli.testing.helpers import HOLDER
from tasklock_cli.testing.helpers import OTHER
from tasklock_cli.testing.helpers import in_threads
from tasklock_cli.testing.helpers import on_the_store
from tasklock_cli.testing.helpers import run_record
from tasklock_cli.testing.helpers import short_ttl
from tasklock_cli.testing.helpers import token


def fill(store, key: str, limit: int, ttl: float = 30) -> list:
    leases = [store.acquire(key, ttl, HOLDER, token(), limit=limit) for _ in range(limit)]
    assert None not in leases
    return leases


def test_each_holder_takes_its_own_slot_and_one_more_conflicts(store, store_factory):
    other = store_factory()
    leases = [
        client.acquire("pool", 30, HOLDER, token(), limit=3) for client in (store, other, store)
    ]
    assert [lease.slot for lease in leases] == [0, 1, 2]
    assert all(lease.limit == 3 and lease.key == "pool" for lease in leases)
    tokens = [lease.fencing_token for lease in leases]
    assert tokens == sorted(set(tokens))
    assert other.acquire("pool", 30, OTHER, token(), limit=3) is None


def test_holders_lists_every_live_slot_and_peek_the_lowest_token(store, store_factory):
    leases = fill(store, "pool", 3)
    store.release(leases[0])
    again = store.acquire("pool", 30, OTHER, token(), limit=3)
    assert again.slot == 0 and again.fencing_token > leases[2].fencing_token

    observer = store_factory()
    live = observer.holders("pool")
    assert [info.slot for info in live] == [0, 1, 2]
    assert [info.fencing_token for info in live] == [
        again.fencing_token,
        leases[1].fencing_token,
        leases[2].fencing_token,
    ]
    assert all(info.limit == 3 and not info.expired for info in live)
    assert live[0].holder == OTHER and live[1].holder == HOLDER
    assert observer.peek("pool").fencing_token == leases[1].fencing_token
    assert observer.holders("free") == []


def test_a_plain_lock_is_slot_zero_of_limit_one(store):
    lease = store.acquire("k", 30, HOLDER, token())
    assert (lease.slot, lease.limit) == (0, 1)
    (info,) = store.holders("k")
    assert (info.slot, info.limit) == (0, 1)
    assert info.to_json()["slot"] == 0 and info.to_json()["limit"] == 1


def test_tokens_increase_across_slots_whatever_frees_them(store, store_factory):
    short, past = short_ttl(store)
    other = store_factory()
    issued = [lease.fencing_token for lease in fill(store, "pool", 2, ttl=short)]
    time.sleep(past)  # both expired
    first = other.acquire("pool", 30, OTHER, token(), limit=2)
    second = store.acquire("pool", 30, HOLDER, token(), limit=2)
    assert (first.slot, second.slot) == (0, 1)
    issued += [first.fencing_token, second.fencing_token]
    assert other.release(first) is True
    (freed,) = other.force_release("pool", second.fencing_token)
    assert freed.slot == 1
    other.sweep()
    third = store.acquire("pool", 30, HOLDER, token(), limit=2)
    issued.append(third.fencing_token)
    assert issued == sorted(set(issued)), issued


def test_the_lowest_free_slot_is_taken_again(store, store_factory):
    leases = fill(store, "pool", 3)
    assert store.release(leases[1]) is True
    again = store_factory().acquire("pool", 30, OTHER, token(), limit=3)
    assert again.slot == 1
    assert again.fencing_token > leases[2].fencing_token


def test_an_expired_slot_is_free_while_the_others_stay_held(store, store_factory):
    short, past = short_ttl(store)
    brief = store.acquire("pool", short, HOLDER, token(), limit=2)
    lasting = store.acquire("pool", 30, HOLDER, token(), limit=2)
    assert (brief.slot, lasting.slot) == (0, 1)
    other = store_factory()
    assert other.acquire("pool", 30, OTHER, token(), limit=2) is None
    time.sleep(past)
    taker = other.acquire("pool", 30, OTHER, token(), limit=2)
    assert taker is not None and taker.slot == 0
    assert [info.slot for info in other.holders("pool")] == [0, 1]
    with pytest.raises(LeaseLost):
        store.renew(brief, 30)
    assert store.renew(lasting, 30).slot == 1


def test_retrying_acquire_with_the_same_owner_token_returns_the_same_slot(store):
    owner = token()
    store.acquire("pool", 30, OTHER, token(), limit=3)
    first = store.acquire("pool", 30, HOLDER, owner, limit=3)
    again = store.acquire("pool", 30, HOLDER, owner, limit=3)
    assert first.slot == 1
    assert (again.slot, again.fencing_token) == (first.slot, first.fencing_token)
    assert len(store.holders("pool")) == 2


def test_renew_and_release_touch_only_their_own_slot(store, store_factory):
    short, past = short_ttl(store)
    a = store.acquire("pool", short, HOLDER, token(), limit=2)
    b = store.acquire("pool", short, HOLDER, token(), limit=2)
    renewed = store.renew(b, 30)
    assert renewed.slot == 1 and renewed.fencing_token == b.fencing_token
    time.sleep(past)
    assert [info.slot for info in store.holders("pool")] == [1]
    taker = store_factory().acquire("pool", 30, OTHER, token(), limit=2)
    assert taker.slot == 0
    assert store.release(a) is False  # expired and taken: nothing of anyone else's is freed
    assert [info.slot for info in store.holders("pool")] == [0, 1]
    assert store.release(renewed) is True
    assert [info.slot for info in store_factory().holders("pool")] == [0]


@pytest.mark.parametrize(("held", "asked"), [(3, 1), (1, 2), (3, 5), (4, 2)])
def test_another_limit_than_the_live_holders_is_refused_naming_both(
    store, store_factory, held, asked
):
    store.acquire("pool", 30, HOLDER, token(), limit=held)
    other = store_factory()
    with pytest.raises(LimitMismatch) as caught:
        other.acquire("pool", 30, OTHER, token(), limit=asked)
    assert (caught.value.held, caught.value.asked) == (held, asked)
    assert str(held) in str(caught.value) and str(asked) in str(caught.value)
    assert caught.value.exit_code == 78
    assert len(other.holders("pool")) == 1


def test_a_mismatch_is_refused_even_when_slot_zero_is_free(store, store_factory):
    leases = fill(store, "pool", 3)
    assert store.release(leases[0]) is True  # slots 1 and 2 still held with limit 3
    with pytest.raises(LimitMismatch):
        store_factory().acquire("pool", 30, OTHER, token())  # a plain lock wants slot 0


def test_once_every_holder_is_gone_another_limit_may_be_used(store, store_factory):
    short, past = short_ttl(store)
    released = store.acquire("pool", 30, HOLDER, token(), limit=3)
    store.acquire("pool", short, HOLDER, token(), limit=3)
    assert store.release(released) is True
    time.sleep(past)
    plain = store_factory().acquire("pool", 30, OTHER, token())
    assert plain is not None and (plain.slot, plain.limit) == (0, 1)


def test_list_shows_one_entry_per_held_slot(store, store_factory):
    fill(store, "pool", 3)
    store.acquire("plain", 30, OTHER, token())
    store.acquire("zzz-other", 30, OTHER, token(), limit=2)
    listed = [(info.key, info.slot, info.limit) for info in store_factory().list()]
    assert listed == [
        ("plain", 0, 1),
        ("pool", 0, 3),
        ("pool", 1, 3),
        ("pool", 2, 3),
        ("zzz-other", 0, 2),
    ]
    assert [info.slot for info in store.list(prefix="po")] == [0, 1, 2]


def test_breaking_a_semaphore_breaks_every_slot_or_the_one_with_the_token(store, store_factory):
    leases = fill(store, "pool", 3)
    admin = store_factory()
    (one,) = admin.break_lease("pool", leases[1].fencing_token)
    assert one.slot == 1
    with pytest.raises(LeaseLost):
        store.renew(leases[1], 30)
    assert store.renew(leases[0], 30).slot == 0

    broken = admin.break_lease("pool")
    assert [info.slot for info in broken] == [0, 1, 2]
    for lease in leases:
        with pytest.raises(LeaseLost):
            store.renew(lease, 30)
    assert admin.acquire("pool", 30, OTHER, token(), limit=3) is None  # broken, still held
    assert store.release(leases[2]) is True
    taker = admin.acquire("pool", 30, OTHER, token(), limit=3)
    assert taker.slot == 2 and taker.fencing_token > leases[2].fencing_token


def test_force_release_frees_every_slot_or_the_one_with_the_token(store, store_factory):
    leases = fill(store, "pool", 3)
    admin = store_factory()
    (one,) = admin.force_release("pool", leases[2].fencing_token)
    assert one.slot == 2 and one.holder == HOLDER
    assert [info.slot for info in admin.holders("pool")] == [0, 1]
    freed = admin.force_release("pool")
    assert [info.slot for info in freed] == [0, 1]
    assert admin.holders("pool") == []
    assert admin.force_release("pool") == []
    for lease in leases:
        assert store.release(lease) is False


def test_a_holder_hears_the_break_of_its_own_slot_only(store, store_factory):
    leases = fill(store, "pool", 2)
    admin = store_factory()
    admin.break_lease("pool", leases[0].fencing_token)
    assert store.wait_for_break(leases[0], 5) is True
    assert store.wait_for_break(leases[1], 0.1) is False


def test_time_left_finds_the_slot_by_its_token(store, store_factory):
    leases = fill(store, "pool", 2)
    other = store_factory()
    for lease in leases:
        left = other.time_left("pool", lease.fencing_token)
        assert left is not None and 25 <= left <= 31
    assert store.release(leases[0]) is True
    assert other.time_left("pool", leases[0].fencing_token) is None
    assert other.time_left("pool", leases[1].fencing_token) is not None


def test_a_slots_run_goes_into_the_ledger_with_its_slot(store):
    leases = fill(store, "pool", 2)
    lease = leases[1]
    assert store.release(lease, record=run_record(lease)) is True
    (run,) = store.history("pool")
    assert (run.slot, run.fencing_token) == (1, lease.fencing_token)


def test_a_release_of_any_slot_wakes_a_waiter(store, store_factory):
    holder = store_factory()
    leases = fill(holder, "pool", 3)
    assert store.acquire("pool", 30, OTHER, token(), limit=3) is None
    released_at: list[float] = []

    def release_middle_slot() -> None:
        time.sleep(0.3)
        released_at.append(time.monotonic())
        assert holder.release(leases[1]) is True

    thread = threading.Thread(target=release_middle_slot)
    thread.start()
    store.wait_for_release("pool", 10)
    woke = time.monotonic()
    thread.join()
    assert released_at and woke - released_at[0] < 0.5, "not woken by the slot's release"
    taker = store.acquire("pool", 30, OTHER, token(), limit=3)
    assert taker is not None and taker.slot == 1


def test_a_waiter_on_a_semaphore_with_a_free_slot_does_not_wait(store, store_factory):
    holder = store_factory()
    for _ in range(2):  # two of three slots held
        assert holder.acquire("pool", 30, HOLDER, token(), limit=3) is not None
    started = time.monotonic()
    store.wait_for_release("pool", 10)
    assert time.monotonic() - started < 0.5


def test_racing_clients_never_hold_more_slots_than_the_limit(store, store_factory):
    clients = [store_factory() for _ in range(6)]
    got: list = []
    lock = threading.Lock()

    def race(client) -> None:
        lease = client.acquire("pool", 30, HOLDER, token(), limit=4)
        with lock:
            got.append(lease)

    in_threads(race, [(client,) for client in clients])
    winners = [lease for lease in got if lease is not None]
    assert len(winners) == 4
    assert sorted(lease.slot for lease in winners) == [0, 1, 2, 3]
    assert len({lease.fencing_token for lease in winners}) == 4


# -- invariants under arbitrary sequences (hypothesis) ------------------------------------

_steps = st.lists(
    st.one_of(
        st.tuples(st.just("acquire"), st.integers(0, 5)),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("force"), st.integers(0, 5)),
    ),
    min_size=1,
    max_size=14,
)


@on_the_store(max_examples=12)
@given(limit=st.integers(1, 4), steps=_steps)
def test_slot_and_token_invariants_hold_for_any_sequence(store, limit, steps):
    """Whatever mix of acquires, releases and forced releases: at most ``limit`` live
    holders in distinct slots below the limit, each new token above all before it, and a
    conflict only when every slot is held."""
    key = f"pool-{token()}"
    held: dict[int, Lease] = {}  # slot -> lease
    issued: list[int] = []
    for action, pick in steps:
        if action == "acquire":
            lease = store.acquire(key, 30, HOLDER, token(), limit=limit)
            if lease is None:
                assert len(held) == limit
                continue
            assert lease.slot not in held and 0 <= lease.slot < limit
            assert lease.slot == min(set(range(limit)) - set(held))
            assert not issued or lease.fencing_token > max(issued)
            issued.append(lease.fencing_token)
            held[lease.slot] = lease
        elif held:
            slot = sorted(held)[pick % len(held)]
            lease = held.pop(slot)
            if action == "release":
                assert store.release(lease) is True
            else:
                (freed,) = store.force_release(key, lease.fencing_token)
                assert freed.slot == slot
        live = store.holders(key)
        assert [info.slot for info in live] == sorted(held)
        assert [info.fencing_token for info in live] == [
            held[slot].fencing_token for slot in sorted(held)
        ]
    store.force_release(key)
