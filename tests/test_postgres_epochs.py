"""The PostgreSQL store's failover epochs on one server: a change of primary is played by
rewriting the identity recorded in the table's epoch row (the real promotions are in
test_faults_failover_postgres.py)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.postgres.epochs import IDENTITY
from tasklock_cli.stores.postgres.store import PostgresStore
from tasklock_cli.stores.postgres.store import split_table
from tests.support import pg
from tests.support import services

HOLDER = Holder(host="h", pid=1, user="u", command=["job"], note=None)
OLD_PRIMARY = "1:1"  # an identity no server here has
#: The server's start as the epoch row records it: microseconds since 1970, as text.
STARTED = "floor(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text"


def owner() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def pg_url() -> Iterator[str]:
    services.require("postgres")
    url = services.postgres_url(table=f"tasklock_test_{uuid.uuid4().hex[:12]}")
    yield url
    pg.drop_namespace(url)


@pytest.fixture
def stores(pg_url) -> Iterator[list[PostgresStore]]:
    opened: list[PostgresStore] = []
    yield opened
    for store in opened:
        store.close()


def open_pg(url: str, opened: list[PostgresStore]) -> PostgresStore:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    opened.append(store)
    return store


def epoch_row(url: str) -> tuple | None:
    """(epoch, identity, previous, max_ttl, quarantine length s, quarantine left s)."""
    table = split_table(url)[1]
    with pg.admin_connection(url) as conn:
        return conn.execute(
            "SELECT fencing_token, holder ->> 'identity', holder ->> 'previous',"
            " (holder ->> 'max_ttl')::float8,"
            " extract(epoch FROM expires_at - acquired_at)::float8,"
            " extract(epoch FROM expires_at - clock_timestamp())::float8"
            f" FROM {table} WHERE key = '' AND slot = -2"
        ).fetchone()


def server_identity(url: str) -> str:
    with pg.admin_connection(url) as conn:
        return conn.execute(f"SELECT {IDENTITY}").fetchone()[0]


def play_failover(url: str, identity: str = OLD_PRIMARY) -> None:
    """The epoch row as a promoted standby would hold it: written on another server."""
    table = split_table(url)[1]
    with pg.admin_connection(url) as conn:
        conn.execute(
            f"UPDATE {table} SET holder = jsonb_set(holder, '{{identity}}', to_jsonb(%s::text))"
            " WHERE key = '' AND slot = -2",
            [identity],
        )


def server_started(url: str) -> str:
    with pg.admin_connection(url) as conn:
        return conn.execute(f"SELECT {STARTED}").fetchone()[0]


def epoch_field(url: str, name: str) -> object:
    table = split_table(url)[1]
    with pg.admin_connection(url) as conn:
        row = conn.execute(
            f"SELECT holder ->> %s FROM {table} WHERE key = '' AND slot = -2", [name]
        ).fetchone()
    return row[0]


def set_epoch_field(url: str, name: str, value: str) -> None:
    table = split_table(url)[1]
    with pg.admin_connection(url) as conn:
        conn.execute(
            f"UPDATE {table} SET holder = holder || jsonb_build_object(%s::text, %s::text)"
            " WHERE key = '' AND slot = -2",
            [name, value],
        )


def delete_epoch_row(url: str) -> None:
    table = split_table(url)[1]
    with pg.admin_connection(url) as conn:
        conn.execute(f"DELETE FROM {table} WHERE key = '' AND slot = -2")


def end_quarantine(url: str, after: float = 0.0) -> None:
    table = split_table(url)[1]
    with pg.admin_connection(url) as conn:
        conn.execute(
            f"UPDATE {table} SET expires_at = clock_timestamp() + make_interval(secs => %s)"
            " WHERE key = '' AND slot = -2",
            [after],
        )


def test_a_new_table_records_its_server_at_epoch_0(pg_url, stores):
    store = open_pg(pg_url, stores)
    store.init_schema()
    assert epoch_row(pg_url)[:3] == (0, server_identity(pg_url), None)
    lease = store.acquire("k", 5, HOLDER, owner())
    assert lease.fencing_token == 1  # epoch 0: tokens as before epochs
    assert epoch_row(pg_url)[3] == 5  # the longest TTL asked so far


def test_a_changed_primary_starts_an_epoch_and_quarantines_every_key(pg_url, stores):
    store, other = open_pg(pg_url, stores), open_pg(pg_url, stores)
    survived = store.acquire("k", 10, HOLDER, owner())
    store.release(store.acquire("j", 20, HOLDER, owner()))
    play_failover(pg_url)
    before = time.time()

    assert other.acquire("free", 5, HOLDER, owner()) is None
    assert "the PostgreSQL primary changed" in other.holdup("free")
    assert other.acquire("j", 5, HOLDER, owner(), queue=True) is None  # a waiter too
    epoch, identity, previous, max_ttl, length, left = epoch_row(pg_url)
    assert (identity, previous, max_ttl) == (server_identity(pg_url), OLD_PRIMARY, 20)
    assert int(before) - 2 <= epoch <= time.time() + 2  # the server's clock, in seconds
    assert length == 32  # max(longest TTL 20 s, 30 s) + 2 s
    assert 30 < left <= 32
    assert store.renew(survived, 10).fencing_token == survived.fencing_token  # it survived

    end_quarantine(pg_url)
    lease = other.acquire("free", 5, HOLDER, owner())
    assert lease.fencing_token == epoch << EPOCH_SHIFT
    assert lease.fencing_token < 2**63 - 1
    other.release(lease)
    assert other.acquire("free", 5, HOLDER, owner()).fencing_token == lease.fencing_token + 1
    assert other.holdup("free") is None
    other.stop_waiting("j")
    later = store.acquire("j", 5, HOLDER, owner())
    assert later.fencing_token == epoch << EPOCH_SHIFT  # every key starts above the epoch's


def test_the_quarantine_covers_the_longest_ttl_granted(pg_url, stores):
    store = open_pg(pg_url, stores)
    store.release(store.acquire("k", 45, HOLDER, owner()))
    store.release(store.acquire("k", 10, HOLDER, owner()))
    play_failover(pg_url)
    assert store.acquire("k", 5, HOLDER, owner()) is None
    assert epoch_row(pg_url)[3:5] == (45, 47)


def test_an_epoch_is_one_more_than_the_last_when_the_clock_is_behind_it(pg_url, stores):
    store = open_pg(pg_url, stores)
    store.init_schema()
    table = split_table(pg_url)[1]
    ahead = int(time.time()) + 100_000
    with pg.admin_connection(pg_url) as conn:
        conn.execute(f"UPDATE {table} SET fencing_token = %s WHERE key = '' AND slot = -2", [ahead])
    play_failover(pg_url)
    assert store.acquire("k", 5, HOLDER, owner()) is None
    assert epoch_row(pg_url)[0] == ahead + 1


def test_racing_acquires_start_one_epoch(pg_url, stores):
    clients = [open_pg(pg_url, stores) for _ in range(6)]
    for client in clients:
        client.init_schema()
    play_failover(pg_url)
    results: list[object] = []
    go = threading.Barrier(len(clients))

    def acquire(client: PostgresStore, key: str) -> None:
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
    assert epoch_row(pg_url)[2] == OLD_PRIMARY  # one epoch: a second would name this server


def test_a_used_table_without_its_epoch_row_starts_an_epoch(pg_url, stores):
    """A table from before epochs, or a standby that missed the write of its row (and was
    promoted), or one restored to before it: the row cannot be told lost from never written,
    so its first acquire quarantines the table and tokens jump past every one in it."""
    store = open_pg(pg_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    delete_epoch_row(pg_url)
    before = time.time()
    assert store.acquire("k", 5, HOLDER, owner()) is None
    assert "primary changed" in store.holdup("k")
    epoch, identity, previous, _, length, left = epoch_row(pg_url)
    assert (identity, previous, length) == (server_identity(pg_url), "missing", 32)
    assert 30 < left <= 32
    assert int(before) - 2 <= epoch <= time.time() + 2
    end_quarantine(pg_url)
    assert store.acquire("k", 5, HOLDER, owner()).fencing_token == epoch << EPOCH_SHIFT


def test_a_used_table_without_its_row_starts_above_the_epoch_of_its_tokens(pg_url, stores):
    store = open_pg(pg_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    ahead = int(time.time()) + 100_000
    table = split_table(pg_url)[1]
    with pg.admin_connection(pg_url) as conn:  # a token of a later epoch than the clock
        conn.execute(f"UPDATE {table} SET fencing_token = %s WHERE key = 'k'", [ahead << 30])
    delete_epoch_row(pg_url)
    assert store.acquire("k", 5, HOLDER, owner()) is None
    assert epoch_row(pg_url)[0] == ahead + 1


def test_an_unused_table_without_its_epoch_row_gets_it_at_epoch_0(pg_url, stores):
    """Created by a tasklock before epochs and never used: nothing to lose, no quarantine."""
    store = open_pg(pg_url, stores)
    store.init_schema()
    delete_epoch_row(pg_url)
    assert store.acquire("k", 5, HOLDER, owner()).fencing_token == 1
    assert epoch_row(pg_url)[:3] == (0, server_identity(pg_url), None)


def test_init_on_a_used_table_without_its_row_leaves_the_epoch_to_the_acquire(pg_url, stores):
    store = open_pg(pg_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    delete_epoch_row(pg_url)
    with pg.admin_connection(pg_url) as conn:  # what a DBA runs from init --print-sql
        conn.execute(store.schema_sql())
    assert epoch_row(pg_url) is None
    assert store.acquire("k", 5, HOLDER, owner()) is None


def test_a_restart_starts_an_epoch(pg_url, stores):
    """A restart, or a backup or disk snapshot started by crash recovery, keeps the system
    identifier and the timeline; its start time differs (played here by an older one)."""
    store = open_pg(pg_url, stores)
    survived = store.acquire("k", 10, HOLDER, owner())
    earlier = str(int(server_started(pg_url)) - 60_000_000)
    set_epoch_field(pg_url, "started", earlier)
    assert store.acquire("j", 5, HOLDER, owner()) is None
    assert "restarted" in store.holdup("j")
    epoch, identity, previous, _, length, _ = epoch_row(pg_url)
    assert (identity, previous, length) == (server_identity(pg_url), identity, 32)
    assert epoch_field(pg_url, "started") == server_started(pg_url)
    assert epoch_field(pg_url, "previous_started") == earlier
    checks = {check.name: check for check in store.doctor()}
    assert "the server restarted, or a backup or snapshot" in checks["epoch"].detail
    assert store.renew(survived, 10).fencing_token == survived.fencing_token
    end_quarantine(pg_url)
    assert store.acquire("j", 5, HOLDER, owner()).fencing_token == epoch << EPOCH_SHIFT


def test_a_row_without_a_start_takes_this_one_without_an_epoch(pg_url, stores):
    """A row written by a tasklock before start times: no quarantine for the upgrade."""
    store = open_pg(pg_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    table = split_table(pg_url)[1]
    with pg.admin_connection(pg_url) as conn:
        conn.execute(f"UPDATE {table} SET holder = holder - 'started' WHERE key = '' AND slot = -2")
    assert store.acquire("k", 5, HOLDER, owner()).fencing_token == 2
    assert epoch_row(pg_url)[0] == 0
    assert epoch_field(pg_url, "started") == server_started(pg_url)


def test_an_operator_forces_a_new_epoch(pg_url, stores):
    """The statement README gives for a table restored by hand (the server kept running)."""
    store = open_pg(pg_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    table = split_table(pg_url)[1]
    with pg.admin_connection(pg_url) as conn:
        conn.execute(
            f'UPDATE {table} SET holder = holder || \'{{"identity": "new-epoch"}}\''
            " WHERE key = '' AND slot = -2"
        )
    assert store.acquire("k", 5, HOLDER, owner()) is None
    assert epoch_row(pg_url)[2] == "new-epoch"
    checks = {check.name: check for check in store.doctor()}
    assert "an operator asked for a new epoch" in checks["epoch"].detail


def test_a_waiter_sleeps_out_the_quarantine(pg_url, stores):
    store = open_pg(pg_url, stores)
    store.init_schema()
    play_failover(pg_url)
    me = owner()
    assert store.acquire("k", 5, HOLDER, me, queue=True) is None
    end_quarantine(pg_url, after=1.0)
    assert store.acquire("k", 5, HOLDER, me, queue=True) is None
    assert 0.5 < store._time_until_free("k") <= 1.0
    started = time.monotonic()
    store.wait_for_release("k", 5)
    assert 0.5 < time.monotonic() - started < 2.0
    assert store.acquire("k", 5, HOLDER, me, queue=True) is not None


def test_nothing_shows_the_epoch_row(pg_url, stores):
    store = open_pg(pg_url, stores)
    store.release(store.acquire("k", 5, HOLDER, owner()))
    play_failover(pg_url)
    store.acquire("k", 5, HOLDER, owner())
    assert list(store.list(include_expired=True)) == []
    assert store.sweep(dry_run=True) == 0 and store.sweep() == 0
    assert store.waiting_counts() == {} and store.ledger_keys() == []
    assert epoch_row(pg_url)[2] == OLD_PRIMARY  # and sweep left it alone


def test_the_acquire_that_starts_an_epoch_is_still_one_round_trip(pg_url, stores):
    """The identity, the epoch row and its new epoch are read and written by the acquire
    statement itself."""
    from urllib.parse import urlsplit

    from tests.support.proxy import TcpProxy

    parts = urlsplit(pg_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5432) as proxy:
        store = open_pg(proxy.url_for(pg_url), stores)
        store.release(store.acquire("k", 5, HOLDER, owner()))  # connected, table made
        play_failover(pg_url)
        before = proxy.round_trips
        assert store.acquire("k", 5, HOLDER, owner()) is None  # starts the epoch
        end_quarantine(pg_url)
        assert store.acquire("k", 5, HOLDER, owner()) is not None  # its first token
        assert proxy.round_trips - before == 2


def test_a_retry_of_a_lease_that_ran_out_meets_the_quarantine(pg_url, stores):
    """An acquire whose reply was lost, retried on the promoted standby after its lease ran
    out there: the standby may lack who took the key since, so the retry is a new acquire
    (quarantined), never the old lease brought back."""
    store = open_pg(pg_url, stores)
    me = owner()
    assert store.acquire("k", 0.3, HOLDER, me) is not None  # (its reply "lost")
    time.sleep(0.5)
    play_failover(pg_url)
    assert store.acquire("k", 5, HOLDER, me) is None
    assert store.holders("k") == []
    end_quarantine(pg_url)
    assert store.acquire("k", 5, HOLDER, me).fencing_token >= epoch_row(pg_url)[0] << EPOCH_SHIFT


def test_a_retry_of_a_live_lease_is_recognised_in_the_quarantine(pg_url, stores):
    """A lease the promoted standby has, live: the retry gets it back (no one else can hold
    the key meanwhile)."""
    store = open_pg(pg_url, stores)
    me = owner()
    first = store.acquire("k", 30, HOLDER, me)
    play_failover(pg_url)
    again = store.acquire("k", 30, HOLDER, me)
    assert again is not None and again.fencing_token == first.fencing_token
