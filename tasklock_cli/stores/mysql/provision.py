"""How the tests and the bench get a MySQL/MariaDB store: a table of their own (its
companions and procedures beside it) on the server of ``TASKLOCK_TEST_MYSQL_URL``, dropped
after (see ``stores.provisioning``)."""

from __future__ import annotations

from tasklock_cli.stores.provisioning import Provisioning
from tasklock_cli.stores.provisioning import RoundTrips
from tasklock_cli.stores.provisioning import Server
from tasklock_cli.stores.provisioning import parameter

#: The tests' server without the URL's environment variable.
DEFAULT_URL = "mysql://root@127.0.0.1:3306/test"


def drop_namespace(url: str) -> None:
    """The URL's table, the ledger's and the waiters' beside it, and its procedures."""
    import pymysql

    from tasklock_cli.stores.mysql.connection import parse_url
    from tasklock_cli.stores.mysql.schema import PROCEDURES

    kwargs, table = parse_url(url, url)
    conn = pymysql.connect(**kwargs, autocommit=True, charset="utf8mb4")
    try:
        with conn.cursor() as cursor:
            for proc in PROCEDURES:
                cursor.execute(f"DROP PROCEDURE IF EXISTS `{table}_{proc}`")
            for suffix in ("", "_runs", "_waiters"):
                cursor.execute(f"DROP TABLE IF EXISTS `{table}{suffix}`")
    finally:
        conn.close()


def _handshake(url: str) -> None:
    """PyMySQL's connect alone (greeting and authentication), as the store makes it."""
    from tasklock_cli.stores.mysql.connection import MySQLConnection
    from tasklock_cli.stores.mysql.connection import parse_url
    from tasklock_cli.stores.mysql.schema import MySQLSchema

    kwargs, table = parse_url(url, url)
    MySQLConnection(url, url, MySQLSchema(table, url), kwargs)._connect().close()


PROVISIONING = Provisioning(
    server=Server("MySQL/MariaDB server", "TASKLOCK_TEST_MYSQL_URL", DEFAULT_URL, 3306),
    namespace_url=parameter("table"),
    cleanup=drop_namespace,
    handshake=_handshake,
    round_trips=RoundTrips(stop_waiting=0, set_up=0),  # (a new connection's first CALL sets it up)
)
