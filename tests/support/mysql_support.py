"""Test helpers for the MySQL/MariaDB store: an admin connection, and dropping what a
test's table name left behind (its three tables and its procedures), opening a store."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pymysql

from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.mysql.connection import parse_url
from tasklock_cli.stores.mysql.provision import drop_namespace  # noqa: F401 - tests name it here
from tasklock_cli.stores.mysql.store import MySQLStore


@contextlib.contextmanager
def admin_connection(url: str) -> Iterator[pymysql.connections.Connection]:
    kwargs, _ = parse_url(url, url)
    conn = pymysql.connect(**kwargs, autocommit=True, charset="utf8mb4")
    try:
        yield conn
    finally:
        conn.close()


def open_my(url: str, opened: list[Store]) -> MySQLStore:
    """A MySQL store on ``url``, added to ``opened`` (which the test closes)."""
    store = open_store(url)
    assert isinstance(store, MySQLStore)
    opened.append(store)
    return store
