"""One round trip per lease operation on the network stores, counted at a TCP proxy.

A fact about the protocol, not a timing: the client sends, then waits for one answer. The
first use of a connection (connect, session settings, schema check, script load) is
excluded by doing every operation once before counting.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from typing import TypeVar
from urllib.parse import urlsplit

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.provisioning import RoundTrips
from tests.support.contract import granted
from tests.support.contract import run_record
from tests.support.proxy import TcpProxy
from tests.support.services import provisioning_for

HOLDER = Holder(host="h", pid=1, user="u", command=["true"])
T = TypeVar("T")


@pytest.fixture
def proxied(network_store_url) -> Iterator[tuple[Store, TcpProxy]]:
    parts = urlsplit(network_store_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0) as proxy:
        store = open_store(proxy.url_for(network_store_url))
        try:
            yield store, proxy
        finally:
            store.close()


def round_trips(proxy: TcpProxy, operation: Callable[[], T]) -> tuple[int, T]:
    before = proxy.round_trips
    result = operation()
    return proxy.round_trips - before, result


def count_each_operation(store: Store, proxy: TcpProxy, owner: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    counts["acquire"], lease = round_trips(proxy, lambda: store.acquire("k", 30, HOLDER, owner))
    assert lease is not None
    counts["renew"], _ = round_trips(proxy, lambda: store.renew(lease, 30))
    counts["conflicting acquire"], refused = round_trips(
        proxy, lambda: store.acquire("k", 30, HOLDER, "someone-else")
    )
    assert refused is None
    counts["peek"], _ = round_trips(proxy, lambda: store.peek("k"))
    counts["release"], released = round_trips(proxy, lambda: store.release(lease))
    assert released is True
    return counts


def expected_round_trips(url: str) -> RoundTrips:
    """What the store of ``url`` declares in its provisioning (``provision.py``)."""
    return provisioning_for(url).round_trips


def test_acquire_renew_release_and_peek_each_take_one_round_trip(proxied, network_store_url):
    """Where a store's provisioning says otherwise, its own count (etcd's peek takes two:
    a key does not carry its lease's remaining time, so the expiry is asked of the lease
    once the key names it)."""
    store, proxy = proxied
    count_each_operation(store, proxy, "owner-warm-up")
    counts = count_each_operation(store, proxy, "owner-counted")
    declared = expected_round_trips(network_store_url)
    expected = dict.fromkeys(counts, declared.each)
    expected["peek"] = declared.peek
    assert counts == expected, counts


def test_once_per_reads_the_last_success_in_one_round_trip_and_the_release_keeps_one(
    proxied,
):
    """--once-per's one extra call; the release that also keeps the key's newest success
    apart from the trim is still one round trip."""
    store, proxy = proxied
    count_each_operation(store, proxy, "owner-warm-up")
    store.last_success("k")
    lease = store.acquire("k", 30, HOLDER, "owner-once")
    record = run_record(lease, HOLDER)
    trips, released = round_trips(proxy, lambda: store.release(lease, record=record))
    assert (trips, released) == (1, True)
    trips, (success, _) = round_trips(proxy, lambda: store.last_success("k"))
    assert (trips, success.fencing_token) == (1, lease.fencing_token)


@pytest.fixture
def waiting(proxied, network_store_url) -> Iterator[tuple[Store, TcpProxy, Store, Lease]]:
    """(waiter, its proxy, holder, held lease): the waiter has waited once for ``w``, so on
    PostgreSQL it has its turn in line and listens."""
    waiter, proxy = proxied
    holder = open_store(network_store_url)
    try:
        count_each_operation(waiter, proxy, "owner-warm-up")
        held = holder.acquire("w", 30, HOLDER, "holder")
        assert held is not None
        assert waiter.acquire("w", 30, HOLDER, "waiter") is None
        waiter.wait_for_release("w", 0.1)  # takes its turn, listens, times out
        yield waiter, proxy, holder, held
    finally:
        holder.close()


def test_a_woken_waiters_acquire_takes_one_round_trip(waiting, network_store_url):
    """On PostgreSQL the waiter's acquire also stops listening and ends its turn in line:
    still one round trip."""
    waiter, proxy, holder, held = waiting
    assert holder.release(held) is True
    trips, lease = round_trips(proxy, lambda: waiter.acquire("w", 30, HOLDER, "waiter"))
    assert lease is not None
    if expected_round_trips(network_store_url).consecutive_tokens:
        assert lease.fencing_token == held.fencing_token + 1
    else:  # etcd's tokens are its global revisions
        assert lease.fencing_token > held.fencing_token
    assert trips == expected_round_trips(network_store_url).each
    assert waiter.release(lease) is True


def test_a_waiter_giving_up_takes_at_most_one_round_trip(waiting, network_store_url):
    """PostgreSQL: UNLISTEN and the end of the turn together; etcd: its place in the
    queue deleted; Redis keeps no place."""
    waiter, proxy, holder, held = waiting
    trips, _ = round_trips(proxy, lambda: waiter.stop_waiting("w"))
    assert trips == expected_round_trips(network_store_url).stop_waiting
    trips, _ = round_trips(proxy, lambda: waiter.stop_waiting("w"))
    assert trips == 0  # nothing left to give up
    assert holder.release(held) is True


def test_a_new_connection_costs_its_handshake_and_one_round_trip_of_set_up(network_store_url):
    """Every `tasklock run` opens a new connection, so its first acquire is what a run pays:
    the driver's connect, one round trip of set-up (PostgreSQL: none, the session settings
    and the statement timeout go in the acquire's query; Redis: CLIENT SETNAME, without
    CLIENT SETINFO or a health-check PING; MySQL: none, the session settings go in the
    acquire's query; etcd without auth: none) and the acquire."""
    with open_store(network_store_url) as warm_up:  # the table exists, the script is loaded
        warm_up.release(granted(warm_up.acquire("first", 30, HOLDER, "warm-up")))
    parts = urlsplit(network_store_url)
    declared = provisioning_for(network_store_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0) as proxy:
        connect = declared.handshake
        if connect is not None:
            handshake, _ = round_trips(proxy, lambda: connect(proxy.url_for(network_store_url)))
        else:
            handshake = 0  # a TCP connect is no round trip at the proxy; RESP has no greeting
        set_up = declared.round_trips.set_up
        store = open_store(proxy.url_for(network_store_url))
        try:
            trips, lease = round_trips(proxy, lambda: store.acquire("first", 30, HOLDER, "run"))
            assert lease is not None
            assert trips == handshake + set_up + 1, (trips, handshake)
        finally:
            store.close()
