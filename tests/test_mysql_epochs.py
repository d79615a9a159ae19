"""The MySQL/MariaDB store's failover epochs on one server: a change of primary is played
by rewriting the identity recorded in the table's epoch row (the real promotion is in
test_faults_failover_mysql.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.mysql.connection import parse_url
from tasklock_cli.stores.mysql.store import MySQLStore
from tests.support import mysql_support
from tests.support import services
from tests.support.proxy import TcpProxy

HOLDER = Holder(host="h", pid=1, user="u", command=["job"], note=None)
OLD_PRIMARY = "99:old-primary:3306"  # an identity no server here has


def owner() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def my_url() -> Iterator[str]:
    services.require("mysql")
    url = services.mysql_url(table=f"tasklock_test_{uuid.uuid4().hex[:12]}")
    yield url
    mysql_support.drop_namespace(url)


@pytest.fixture
def stores(my_url) -> Iterator[list[MySQLStore]]:
    opened: list[MySQLStore] = []
    yield opened
    for store in opened:
        store.close()


def open_my(url: str, opened: list[MySQLStore]) -> MySQLStore:
    store = open_store(url)
    assert isinstance(store, MySQLStore)
    opened.append(store)
    return store


def admin(url: str, statement: str, args: tuple = ()) -> list[tuple]:
    table = parse_url(url, url)[1]
    with mysql_support.admin_connection(url) as conn, conn.cursor() as cursor:
        cursor.execute(statement.replace("{table}", f"`{table}`"), args)
        return list(cursor.fetchall())


def epoch_row(url: str) -> tuple | None:
    """(epoch, identity, previous, max_ttl, quarantine length s, quarantine left s)."""
    rows = admin(
        url,
        "SELECT fencing_token, JSON_VALUE(holder, '$.identity'), JSON_VALUE(holder, '$.previous'),"
        " JSON_VALUE(holder, '$.max_ttl') + 0,"
        " TIMESTAMPDIFF(MICROSECOND, acquired_at, expires_at) / 1e6,"
        " TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), expires_at) / 1e6"
        " FROM {table} WHERE `key` = '' AND slot = -2",
    )
    if not rows:
        return None
    epoch, identity, previous, max_ttl, length, left = rows[0]
    as_float = [None if value is None else float(value) for value in (max_ttl, length, left)]
    return (epoch, identity, previous, *as_float)


def server_identity(url: str) -> str:
    with mysql_support.admin_connection(url) as conn, conn.cursor() as cursor:
        cursor.execute("SELECT CONCAT_WS(':', @@server_id, @@hostname, @@port)")
        return cursor.fetchone()[0]


def play_failover(url: str, identity: str = OLD_PRIMARY) -> None:
    """The epoch row as a promoted replica would hold it: written on another server."""
    admin(
        url,
        "UPDATE {table} SET holder = JSON_SET(holder, '$.identity', %s)"
        " WHERE `key` = '' AND slot = -2",
        (identity,),
    )


def end_quarantine(url: str, after: float = 0.0) -> None:
    admin(
        url,
        "UPDATE {table} SET expires_at = SYSDATE(6) + INTERVAL ROUND(%s * 1000000) MICROSECOND"
        " WHERE `key` = '' AND slot = -2",
        (after,),
    )


def test_the_first_acquire_records_its_server_at_epoch_0(my_url, stores):
    store = open_my(my_url, stores)
    lease = store.acquire("k", 5, HOLDER, owner())
    assert lease.fencing_token == 1  # epoch 0: tokens as before epochs
    assert epoch_row(my_url)[:4] == (0, server_identity(my_url), None, 5)
    assert store.holdup("k") is None


def test_a_changed_primary_starts_an_epoch_and_quarantines_every_key(my_url, stores):
    store, other = open_my(my_url, stores), open_my(my_url, stores)
    survived = store.acquire("k", 10, HOLDER, owner())
    store.release(store.acquire("j", 20, HOLDER, owner()))
    play_failover(my_url)
    before = time.time()

    assert other.acquire("free", 5, HOLDER, owner()) is None
    assert "the MySQL primary changed" in other.holdup("free")
    assert other.acquire("j", 5, HOLDER, owner(), queue=True) is None  # a waiter too
    epoch, identity, previous, max_ttl, length, left = epoch_row(my_url)
    assert (identity, previous, max_ttl) == (server_identity(my_url), OLD_PRIMARY, 20)
    assert int(before) - 2 <= epoch <= time.time() + 2  # the server's clock, in seconds
    assert length == 32  # max(longest TTL 20 s, 30 s) + 2 s
    assert 30 < left <= 32
    assert store.renew(survived, 10).fencing_token == survived.fencing_token  # it survived

    end_quarantine(my_url)
    lease = other.acquire("free", 5, HOLDER, owner())
    assert lease.fencing_token == epoch << EPOCH_SHIFT
    other.release(lease)
    assert other.acquire("free", 5, HOLDER, owner()).fencing_token == lease.fencing_token + 1
    assert other.holdup("free") is None
    other.stop_waiting("j")
    later = store.acquire("j", 5, HOLDER, owner())
    assert later.fencing_token == epoch << EPOCH_SHIFT  # every key starts above the epoch's


def test_the_quarantine_covers_the_longest_ttl_granted(my_url, stores):
    store = open_my(my_url, stores)
    store.release(store.acquire("k", 45, HOLDER, owner()))
    store.release(store.acquire("k", 10, HOLDER, owner()))
    play_failover(my_url)
    assert store.acquire("k", 5, HOLDER, owner()) is None
    assert epoch_row(my_url)[3:5] == (45, 47)


def test_an_epoch_is_one_more_than_the_last_when_the_clock_is_behind_it(my_url, stores):
    store = open_my(my_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    ahead = int(time.time()) + 100_000
    admin(my_url, "UPDATE {table} SET fencing_token = %s WHERE `key` = '' AND slot = -2", (ahead,))
    play_failover(my_url)
    assert store.acquire("k", 5, HOLDER, owner()) is None
    assert epoch_row(my_url)[0] == ahead + 1


def test_racing_acquires_start_one_epoch(my_url, stores):
    clients = [open_my(my_url, stores) for _ in range(6)]
    clients[0].release(clients[0].acquire("k", 5, HOLDER, owner()))
    for client in clients:
        client.init_schema()
    play_failover(my_url)
    results: list[object] = []
    go = threading.Barrier(len(clients))

    def acquire(client: MySQLStore, key: str) -> None:
        go.wait()
        results.append(client.acquire(key, 5, HOLDER, owner()))

    threads = [
        threading.Thread(target=acquire, args=(client, f"k{n}")) for n, client in enumerate(clients)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [None] * len(clients)  # all quarantined
    assert epoch_row(my_url)[2] == OLD_PRIMARY  # one epoch: a second would name this server


def test_a_table_without_its_epoch_row_gets_it_at_epoch_0(my_url, stores):
    store = open_my(my_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    admin(my_url, "DELETE FROM {table} WHERE `key` = '' AND slot = -2")
    assert store.acquire("k", 5, HOLDER, owner()).fencing_token == 2
    assert epoch_row(my_url)[:3] == (0, server_identity(my_url), None)


def test_an_epoch_row_someone_else_wrote_starts_an_epoch_not_an_error(my_url, stores):
    store = open_my(my_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    admin(my_url, "UPDATE {table} SET holder = '{not json' WHERE `key` = '' AND slot = -2")
    assert store.acquire("k", 5, HOLDER, owner()) is None
    _, identity, previous, max_ttl, length, _ = epoch_row(my_url)
    assert (identity, previous, max_ttl, length) == (server_identity(my_url), None, 5, 32)
    admin(
        my_url,
        "UPDATE {table} SET holder = JSON_SET(holder, '$.max_ttl', 1e300)"
        " WHERE `key` = '' AND slot = -2",
    )
    play_failover(my_url)
    assert store.acquire("k", 5, HOLDER, owner()) is None  # (a long quarantine, no error)


def test_a_waiter_sleeps_out_the_quarantine(my_url, stores):
    store = open_my(my_url, stores)
    store.release(store.acquire("other", 5, HOLDER, owner()))
    play_failover(my_url)
    me = owner()
    assert store.acquire("k", 5, HOLDER, me, queue=True) is None
    end_quarantine(my_url, after=1.0)
    assert store.acquire("k", 5, HOLDER, me, queue=True) is None
    assert 0.5 < store._time_until_free("k") <= 1.0
    started = time.monotonic()
    store.wait_for_release("k", 5)
    assert 0.5 < time.monotonic() - started < 2.0
    assert store.acquire("k", 5, HOLDER, me, queue=True) is not None


def test_nothing_shows_the_epoch_row(my_url, stores):
    store = open_my(my_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    play_failover(my_url)
    store.acquire("k", 5, HOLDER, owner())
    assert list(store.list(include_expired=True)) == []
    assert store.sweep(dry_run=True) == 0 and store.sweep() == 0
    assert store.waiting_counts() == {} and store.ledger_keys() == []
    assert store.force_release("") == [] and store.break_lease("") == []
    assert epoch_row(my_url)[2] == OLD_PRIMARY  # and sweep left it alone


def test_the_acquire_that_starts_an_epoch_is_still_one_round_trip(my_url, stores):
    """The identity, the epoch row and its new epoch are read and written by the acquire
    procedure itself."""
    parts = urlsplit(my_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 3306) as proxy:
        store = open_my(proxy.url_for(my_url), stores)
        store.release(store.acquire("k", 5, HOLDER, owner()))  # connected, table made
        play_failover(my_url)
        before = proxy.round_trips
        assert store.acquire("k", 5, HOLDER, owner()) is None  # starts the epoch
        end_quarantine(my_url)
        assert store.acquire("k", 5, HOLDER, owner()) is not None  # its first token
        assert proxy.round_trips - before == 2


def test_a_retry_of_a_lease_that_ran_out_meets_the_quarantine(my_url, stores):
    """An acquire whose reply was lost, retried on the promoted replica after its lease ran
    out there: the replica may lack who took the key since, so the retry is a new acquire
    (quarantined), never the old lease brought back."""
    store = open_my(my_url, stores)
    me = owner()
    assert store.acquire("k", 0.3, HOLDER, me) is not None  # (its reply "lost")
    time.sleep(0.5)
    play_failover(my_url)
    assert store.acquire("k", 5, HOLDER, me) is None
    assert store.holders("k") == []
    end_quarantine(my_url)
    assert store.acquire("k", 5, HOLDER, me).fencing_token >= epoch_row(my_url)[0] << EPOCH_SHIFT


def test_a_retry_of_a_live_lease_is_recognised_in_the_quarantine(my_url, stores):
    """A lease the promoted replica has, live: the retry gets it back (no one else can hold
    the key meanwhile)."""
    store = open_my(my_url, stores)
    me = owner()
    first = store.acquire("k", 30, HOLDER, me)
    play_failover(my_url)
    again = store.acquire("k", 30, HOLDER, me)
    assert again is not None and again.fencing_token == first.fencing_token
