"""The PostgreSQL store's own failover-epoch cases on one server (the cases it shares with
MySQL are in test_store_epochs.py): a change of primary or a restart is played by
rewriting what the table's epoch row records (the real promotions are in
test_faults_failover_postgres.py)."""

from __future__ import annotations

import time

import pytest

from tasklock_cli.stores.base import Store
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.postgres.store import split_table
from tests.support import pg
from tests.support.contract import granted
from tests.support.contract import token
from tests.support.epochs import end_quarantine
from tests.support.epochs import epoch_row
from tests.support.epochs import find_epoch_row
from tests.support.epochs import server_identity
from tests.support.pg import open_pg

HOLDER = Holder(host="h", pid=1, user="u", command=["job"], note=None)
#: The server's start as the epoch row records it: microseconds since 1970, as text.
STARTED = "floor(extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text"


@pytest.fixture
def stores(postgres_url, opened_stores) -> list[Store]:
    """The stores a test opens (open_pg): closed before its table is dropped."""
    return opened_stores


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


def test_a_new_table_records_its_server_at_epoch_0(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    store.init_schema()
    assert epoch_row(postgres_url)[:3] == (0, server_identity(postgres_url), None)
    lease = granted(store.acquire("k", 5, HOLDER, token()))
    assert lease.fencing_token == 1  # epoch 0: tokens as before epochs
    assert epoch_row(postgres_url)[3] == 5  # the longest TTL asked so far


def test_a_used_table_without_its_epoch_row_starts_an_epoch(postgres_url, stores):
    """A table from before epochs, or a standby that missed the write of its row (and was
    promoted), or one restored to before it: the row cannot be told lost from never written,
    so its first acquire quarantines the table and tokens jump past every one in it."""
    store = open_pg(postgres_url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    delete_epoch_row(postgres_url)
    before = time.time()
    assert store.acquire("k", 5, HOLDER, token()) is None
    assert "primary changed" in (store.holdup("k") or "")
    epoch, identity, previous, _, length, left = epoch_row(postgres_url)
    assert (identity, previous, length) == (server_identity(postgres_url), "missing", 32)
    assert 30 < left <= 32
    assert int(before) - 2 <= epoch <= time.time() + 2
    end_quarantine(postgres_url)
    assert granted(store.acquire("k", 5, HOLDER, token())).fencing_token == epoch << EPOCH_SHIFT


def test_a_used_table_without_its_row_starts_above_the_epoch_of_its_tokens(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    ahead = int(time.time()) + 100_000
    table = split_table(postgres_url)[1]
    with pg.admin_connection(postgres_url) as conn:  # a token of a later epoch than the clock
        conn.execute(f"UPDATE {table} SET fencing_token = %s WHERE key = 'k'", [ahead << 30])
    delete_epoch_row(postgres_url)
    assert store.acquire("k", 5, HOLDER, token()) is None
    assert epoch_row(postgres_url)[0] == ahead + 1


def test_a_table_emptied_in_use_starts_above_the_tokens_of_its_ledger(postgres_url, stores):
    """Every row deleted while a lease is held (an operator clearing "stale locks"), the run
    ledger kept: the next acquire finds no epoch row and no token in the table, but the
    ledger's, and starts an epoch above them, with a quarantine. Before, it wrote epoch 0 and
    was granted at once with token 1, beside the holder still running."""
    store, other = open_pg(postgres_url, stores), open_pg(postgres_url, stores)
    lease = granted(store.acquire("k", 5, HOLDER, token()))
    ran = RunRecord("k", lease.fencing_token, HOLDER, lease.acquired_at, 0, "succeeded")
    store.release(lease, record=ran)
    held = granted(store.acquire("k", 5, HOLDER, token()))
    table = split_table(postgres_url)[1]
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(f"DELETE FROM {table}")

    assert other.acquire("k", 5, HOLDER, token()) is None
    epoch, _, previous, _, length, _ = epoch_row(postgres_url)
    assert (previous, length) == ("missing", 32)
    end_quarantine(postgres_url)
    assert granted(other.acquire("k", 5, HOLDER, token())).fencing_token == epoch << EPOCH_SHIFT
    assert epoch << EPOCH_SHIFT > held.fencing_token


def test_an_unused_table_without_its_epoch_row_gets_it_at_epoch_0(postgres_url, stores):
    """Created by a tasklock before epochs and never used: nothing to lose, no quarantine."""
    store = open_pg(postgres_url, stores)
    store.init_schema()
    delete_epoch_row(postgres_url)
    assert granted(store.acquire("k", 5, HOLDER, token())).fencing_token == 1
    assert epoch_row(postgres_url)[:3] == (0, server_identity(postgres_url), None)


def test_init_on_a_used_table_without_its_row_leaves_the_epoch_to_the_acquire(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    delete_epoch_row(postgres_url)
    with pg.admin_connection(postgres_url) as conn:  # what a DBA runs from init --print-sql
        conn.execute(store.schema_sql())
    assert find_epoch_row(postgres_url) is None
    assert store.acquire("k", 5, HOLDER, token()) is None


def test_a_row_without_a_start_takes_this_one_without_an_epoch(postgres_url, stores):
    """A row written by a tasklock before start times: no quarantine for the upgrade."""
    store = open_pg(postgres_url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    table = split_table(postgres_url)[1]
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(f"UPDATE {table} SET holder = holder - 'started' WHERE key = '' AND slot = -2")
    assert granted(store.acquire("k", 5, HOLDER, token())).fencing_token == 2
    assert epoch_row(postgres_url)[0] == 0
    assert epoch_field(postgres_url, "started") == server_started(postgres_url)


def test_an_operator_forces_a_new_epoch(postgres_url, stores):
    """The statement README gives for a table restored by hand (the server kept running)."""
    store = open_pg(postgres_url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    table = split_table(postgres_url)[1]
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(
            f'UPDATE {table} SET holder = holder || \'{{"identity": "new-epoch"}}\''
            " WHERE key = '' AND slot = -2"
        )
    assert store.acquire("k", 5, HOLDER, token()) is None
    assert epoch_row(postgres_url)[2] == "new-epoch"
    checks = {check.name: check for check in store.doctor()}
    assert "an operator asked for a new epoch" in checks["epoch"].detail
