"""How the tests and the bench get a PostgreSQL store: a table of their own (and the
ledger's and the waiters' beside it) on the server of ``TASKLOCK_TEST_POSTGRES_URL``,
dropped after (see ``stores.provisioning``)."""

from __future__ import annotations

from typing import Any

from tasklock_cli.stores.provisioning import Provisioning
from tasklock_cli.stores.provisioning import RoundTrips
from tasklock_cli.stores.provisioning import Server
from tasklock_cli.stores.provisioning import parameter

#: The tests' server without the URL's environment variable.
DEFAULT_URL = "postgresql://127.0.0.1:5432/test"


def _connect(url: str) -> tuple[Any, str]:
    import psycopg

    from tasklock_cli.stores.postgres.store import split_table

    clean, table = split_table(url)
    return psycopg.connect(clean, autocommit=True, connect_timeout=5), table


def drop_namespace(url: str) -> None:
    """Drop the table named by the URL's ``table=`` (never the default table), and the run
    ledger's and the waiters' tables beside it."""
    from psycopg import sql

    from tasklock_cli.stores.postgres.schema import parse_table
    from tasklock_cli.stores.postgres.store import DEFAULT_TABLE

    conn, table = _connect(url)
    try:
        if table == DEFAULT_TABLE:
            raise ValueError("refusing to drop the default table; tests name their own")
        parts = parse_table(table)
        for suffix in ("", "_runs", "_waiters"):
            name = (*parts[:-1], parts[-1][: 63 - len(suffix)] + suffix) if suffix else parts
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(*name)))
    finally:
        conn.close()


def _handshake(url: str) -> None:
    """psycopg's connect alone (startup, authentication, the server's parameters)."""
    import psycopg

    from tasklock_cli.stores.postgres.store import split_table

    psycopg.connect(split_table(url)[0]).close()


PROVISIONING = Provisioning(
    server=Server("PostgreSQL server", "TASKLOCK_TEST_POSTGRES_URL", DEFAULT_URL, 5432),
    namespace_url=parameter("table"),
    cleanup=drop_namespace,
    handshake=_handshake,
    round_trips=RoundTrips(set_up=0),  # (a new connection's acquire sets its session up)
)
