"""The MySQL/MariaDB store's own failover-epoch cases on one server (the cases it shares
with PostgreSQL are in test_store_epochs.py, the real promotion in
test_faults_failover_mysql.py)."""

from __future__ import annotations

import pytest

from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Holder
from tests.support.contract import granted
from tests.support.contract import token
from tests.support.epochs import admin
from tests.support.epochs import epoch_row
from tests.support.epochs import play_failover
from tests.support.epochs import server_identity
from tests.support.mysql_support import open_my

HOLDER = Holder(host="h", pid=1, user="u", command=["job"], note=None)


@pytest.fixture
def stores(mysql_url, opened_stores) -> list[Store]:
    """The stores a test opens (open_my): closed before its table is dropped."""
    return opened_stores


def test_the_first_acquire_records_its_server_at_epoch_0(mysql_url, stores):
    store = open_my(mysql_url, stores)
    lease = granted(store.acquire("k", 5, HOLDER, token()))
    assert lease.fencing_token == 1  # epoch 0: tokens as before epochs
    assert epoch_row(mysql_url)[:4] == (0, server_identity(mysql_url), None, 5)
    assert store.holdup("k") is None


def test_a_table_without_its_epoch_row_gets_it_at_epoch_0(mysql_url, stores):
    store = open_my(mysql_url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    admin(mysql_url, "DELETE FROM {table} WHERE `key` = '' AND slot = -2")
    assert granted(store.acquire("k", 5, HOLDER, token())).fencing_token == 2
    assert epoch_row(mysql_url)[:3] == (0, server_identity(mysql_url), None)


def test_an_epoch_row_someone_else_wrote_starts_an_epoch_not_an_error(mysql_url, stores):
    store = open_my(mysql_url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    admin(mysql_url, "UPDATE {table} SET holder = '{not json' WHERE `key` = '' AND slot = -2")
    assert store.acquire("k", 5, HOLDER, token()) is None
    _, identity, previous, max_ttl, length, _ = epoch_row(mysql_url)
    assert (identity, previous, max_ttl, length) == (server_identity(mysql_url), None, 5, 32)
    admin(
        mysql_url,
        "UPDATE {table} SET holder = JSON_SET(holder, '$.max_ttl', 1e300)"
        " WHERE `key` = '' AND slot = -2",
    )
    play_failover(mysql_url)
    assert store.acquire("k", 5, HOLDER, token()) is None  # (a long quarantine, no error)
