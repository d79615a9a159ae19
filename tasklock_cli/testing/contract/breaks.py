"""The store contract for forced release (the same cases on every store): a broken lease
stays unavailable until it runs out on the store's clock, counted from its last renewal; the
break does not extend it; who broke it is kept for the run's ledger record; a notification
is a hint, told once, that the store must confirm."""

from __future__ import annotations

import time
from datetime import datetime
from datetime import timedelta
from datetime import timezone

import pytest

from tasklock_cli.errors import LeaseLost
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import breaker
from tasklock_cli.testing.helpers import HOLDER
from tasklock_cli.testing.helpers import OTHER
from tasklock_cli.testing.helpers import run_record
from tasklock_cli.testing.helpers import short_ttl
from tasklock_cli.testing.helpers import token
from tasklock_cli.testing.helpers import wait_until

BREAKER = Holder(host="ops-host", pid=777, user="carol")


def _rounding(store) -> timedelta:
    """How far a store's expiry may be off: whole seconds where it keeps whole seconds."""
    return timedelta(seconds=1 if store.min_ttl else 0) + timedelta(seconds=store.expiry_lag)


def test_a_broken_lease_stays_unavailable_until_it_runs_out(store, store_factory):
    other = store_factory()
    ttl, past = short_ttl(store)
    lease = store.acquire("k", ttl, HOLDER, token())
    (broken,) = other.break_lease("k", None, BREAKER)
    assert broken.expires_at <= lease.expires_at + _rounding(store)  # not extended
    assert other.acquire("k", ttl, OTHER, token()) is None  # nobody meanwhile
    (held,) = other.holders("k")
    assert held.fencing_token == lease.fencing_token
    assert held.expires_at <= lease.expires_at + _rounding(store)
    wait_until(lambda: not other.holders("k"), timeout=past + 3)
    freed_at = datetime.now(timezone.utc)
    assert freed_at >= lease.expires_at - timedelta(seconds=0.05)  # not before it ran out
    nxt = other.acquire("k", 30, OTHER, token())
    assert nxt is not None and nxt.fencing_token > lease.fencing_token


def test_a_break_does_not_extend_a_renewed_lease(store, store_factory):
    other = store_factory()
    ttl = max(3.0, store.min_ttl)
    lease = store.acquire("k", ttl, HOLDER, token())
    renewed = store.renew(lease, ttl)
    (broken,) = other.break_lease("k", lease.fencing_token, BREAKER)
    assert broken.expires_at <= renewed.expires_at + _rounding(store)
    (again,) = other.break_lease("k", lease.fencing_token, OTHER)  # idempotent
    assert again.expires_at <= renewed.expires_at + _rounding(store)
    with pytest.raises(LeaseLost):
        store.renew(lease, ttl)
    (held,) = other.holders("k")
    assert held.expires_at <= renewed.expires_at + _rounding(store)


def test_the_lease_keeps_who_broke_it(store, store_factory):
    other = store_factory()
    lease = store.acquire("k", 30, HOLDER, token())
    assert store.broken_by(lease) is None  # not broken
    other.break_lease("k", None, BREAKER)
    other.break_lease("k", None, OTHER)  # a second break keeps the first breaker
    assert (
        store.broken_by(lease)
        == breaker(BREAKER)
        == {
            "host": "ops-host",
            "pid": 777,
            "user": "carol",
        }
    )
    record = run_record(
        lease,
        exit_code=None,
        outcome="lost",
        detected_by="rejected",
        broken_by=store.broken_by(lease),
    )
    assert store.release(lease, record=record) is True
    (run,) = other.history("k")
    assert run.broken_by == breaker(BREAKER)
    assert run.to_json()["broken_by"] == {"host": "ops-host", "pid": 777, "user": "carol"}
    assert store.broken_by(lease) is None  # released: no longer on the store


def test_a_break_without_a_breaker_and_a_run_not_broken_record_none(store, store_factory):
    lease = store.acquire("k", 30, HOLDER, token())
    store_factory().break_lease("k")
    assert store.broken_by(lease) is None
    store.release(lease, record=run_record(lease))
    (run,) = store.history("k")
    assert run.broken_by is None and run.to_json()["broken_by"] is None


def test_a_holder_of_unknown_processes_is_never_taken_for_gone(store, store_factory):
    lease = store.acquire("k", 30, HOLDER, token())  # its processes never recorded
    other = store_factory()
    other.break_lease("k", None, BREAKER)
    assert other.free_if_holder_gone("k", lease.fencing_token) is False
    assert [info.fencing_token for info in other.holders("k")] == [lease.fencing_token]


def test_a_heard_break_is_told_once_and_confirmed_by_the_store(store, store_factory):
    lease = store.acquire("k", 30, HOLDER, token())
    store.wait_for_break(lease, 0.01)  # listening from now on
    store_factory().break_lease("k", None, BREAKER)
    assert store.wait_for_break(lease, 5) is True
    started = time.monotonic()
    with pytest.raises(LeaseLost):
        store.renew(lease, 30)
    assert time.monotonic() - started < 1


def test_a_lease_kept_after_its_command_ended_is_freed_at_once(store, store_factory):
    """--hold-at-least keeps a lease after the command ended and its holder exited:
    nothing runs under it and nobody is there to let go, so it is freed at once."""
    ops = store_factory()
    lease = store.acquire("k", 30, HOLDER, token())
    assert store.release(lease, keep_for=60) is True
    assert [info.fencing_token for info in ops.break_lease("k", None, BREAKER)] == [
        lease.fencing_token
    ]
    assert ops.free_if_holder_gone("k", lease.fencing_token) is True
    assert ops.holders("k") == []
    after = ops.acquire("k", 30, OTHER, token())
    assert after is not None and after.fencing_token > lease.fencing_token


def test_a_live_holder_is_never_taken_for_gone_by_a_store(store, store_factory):
    """A lease whose command still runs (not released) is not freed as gone: on SQLite its
    processes are this test's, alive; elsewhere the store cannot tell."""
    ops = store_factory()
    lease = store.acquire("k", 30, HOLDER, token())
    ops.break_lease("k", None, BREAKER)
    assert ops.free_if_holder_gone("k", lease.fencing_token) is False
    assert [info.fencing_token for info in ops.holders("k")] == [lease.fencing_token]
