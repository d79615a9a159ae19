"""Failover epochs played on one server (PostgreSQL, MySQL/MariaDB): the table's epoch row
read and rewritten as an administrator would, so that the next acquire finds another
primary recorded. Each function takes the store URL; its scheme picks the SQL."""

from __future__ import annotations

import uuid

from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.postgres.epochs import IDENTITY
from tasklock_cli.stores.postgres.store import split_table
from tests.support import pg
from tests.support.contract import granted

#: The epoch row: no lock key is empty; slot -2.
_ROW = "key = '' AND slot = -2"
_HOLDER = Holder(host="h", pid=1, user="u", command=["job"], note=None)


def is_mysql(url: str) -> bool:
    return url.startswith(("mysql:", "mariadb:"))


def old_primary(url: str) -> str:
    """An identity no server here has, in the store's form."""
    return "99:old-primary:3306" if is_mysql(url) else "1:1"


def primary_changed(url: str) -> str:
    """The start of a quarantine's ``holdup`` text."""
    return f"the {'MySQL' if is_mysql(url) else 'PostgreSQL'} primary changed"


def default_port(url: str) -> int:
    return 3306 if is_mysql(url) else 5432


def admin(url: str, statement: str, args: tuple = ()) -> list[tuple]:
    """``statement`` with ``{table}`` the URL's table, run as an administrator: its rows."""
    return (_mysql if is_mysql(url) else _pg)(url, statement, args)


def _mysql(url: str, statement: str, args: tuple = ()) -> list[tuple]:
    from tasklock_cli.stores.mysql.connection import parse_url
    from tests.support import mysql_support

    table = parse_url(url, url)[1]
    with mysql_support.admin_connection(url) as conn, conn.cursor() as cursor:
        cursor.execute(statement.replace("{table}", f"`{table}`"), args)
        return list(cursor.fetchall())


def _pg(url: str, statement: str, args: tuple = ()) -> list[tuple]:
    with pg.admin_connection(url) as conn:
        cursor = conn.execute(statement.replace("{table}", split_table(url)[1]), list(args))
        return cursor.fetchall() if cursor.description else []


def epoch_row(url: str) -> tuple:
    """(epoch, identity, previous, max_ttl, quarantine length s, quarantine left s): fails
    the test when the table has no epoch row."""
    row = find_epoch_row(url)
    assert row is not None, "the table has no epoch row"
    return row


def find_epoch_row(url: str) -> tuple | None:
    """``epoch_row``, or None when the table has none."""
    if not is_mysql(url):
        rows = _pg(
            url,
            "SELECT fencing_token, holder ->> 'identity', holder ->> 'previous',"
            " (holder ->> 'max_ttl')::float8,"
            " extract(epoch FROM expires_at - acquired_at)::float8,"
            " extract(epoch FROM expires_at - clock_timestamp())::float8"
            f" FROM {{table}} WHERE {_ROW}",
        )
        return rows[0] if rows else None
    rows = _mysql(
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
    """The identity the acquire records for the server behind ``url``."""
    if is_mysql(url):
        return _mysql(url, "SELECT CONCAT_WS(':', @@server_id, @@hostname, @@port)")[0][0]
    return _pg(url, f"SELECT {IDENTITY}")[0][0]


def play_failover(url: str, identity: str | None = None) -> None:
    """The epoch row as a promoted replica or standby would hold it: written on another
    server (``identity``, else ``old_primary``)."""
    identity = identity or old_primary(url)
    if is_mysql(url):
        _mysql(
            url,
            "UPDATE {table} SET holder = JSON_SET(holder, '$.identity', %s)"
            " WHERE `key` = '' AND slot = -2",
            (identity,),
        )
    else:
        _pg(
            url,
            "UPDATE {table} SET holder = jsonb_set(holder, '{identity}', to_jsonb(%s::text))"
            f" WHERE {_ROW}",
            (identity,),
        )


def end_quarantine(url: str, after: float = 0.0) -> None:
    """The quarantine ends ``after`` seconds from now."""
    if is_mysql(url):
        _mysql(
            url,
            "UPDATE {table} SET expires_at = SYSDATE(6) + INTERVAL ROUND(%s * 1000000) MICROSECOND"
            " WHERE `key` = '' AND slot = -2",
            (after,),
        )
    else:
        _pg(
            url,
            "UPDATE {table} SET expires_at = clock_timestamp() + make_interval(secs => %s)"
            f" WHERE {_ROW}",
            (after,),
        )


def set_epoch(url: str, epoch: int) -> None:
    if is_mysql(url):
        statement = "UPDATE {table} SET fencing_token = %s WHERE `key` = '' AND slot = -2"
        _mysql(url, statement, (epoch,))
    else:
        _pg(url, f"UPDATE {{table}} SET fencing_token = %s WHERE {_ROW}", (epoch,))


def with_epoch_row(store: Store, url: str) -> None:
    """The table with its epoch row at epoch 0: PostgreSQL writes it with the table, MySQL
    with the first lease."""
    if is_mysql(url):
        store.release(granted(store.acquire("other", 5, _HOLDER, uuid.uuid4().hex)))
    else:
        store.init_schema()
