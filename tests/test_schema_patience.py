"""A first run on a fresh PostgreSQL or MySQL database makes the tables, and may meet a
busy server doing so: the making gets the default I/O timeout (5 s) at least, not the
run's own, which a short TTL makes a fraction of a second (``--ttl 1500ms``: 0.25 s).

The server is slowed for real: the tables' creation waits on a lock another session
holds for a second (PostgreSQL: the schema's advisory lock, as a racing first user holds
it; MariaDB, a private server: a global read lock, which every DDL waits for). Without
the patience the run fails at its I/O timeout (a clean-clone CI run under load did:
MySQL's ``Lost connection ... (timed out)``, exit 69)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator

import pytest

from tests.support.cli import tasklock
from tests.support.mysql_replication import PrivateMariaDB
from tests.support.mysql_replication import private_mariadb
from tests.support.mysql_replication import require_private_mariadb

#: How long the other session keeps the creation waiting: four times the run's I/O
#: timeout, a fifth of the patience it now gets.
HELD_S = 1.0


@contextlib.contextmanager
def held_for(seconds: float, take: Callable[[], None], give_back: Callable[[], None]):
    """``take`` now, ``give_back`` ``seconds`` later from a thread (joined on exit)."""
    take()
    thread = threading.Timer(seconds, give_back)
    thread.start()
    try:
        yield
    finally:
        thread.join()


def first_run(env: dict[str, str], store: str) -> tuple[int, str, float]:
    started = time.monotonic()
    result = tasklock(
        "--store", store, "run", "first", "--ttl", "1500ms", "--", "true", env=env, timeout=30
    )
    return result.returncode, result.stderr, time.monotonic() - started


def test_postgres_first_run_waits_for_a_slow_table_creation(cli_env, postgres_url):
    from tasklock_cli.stores.postgres.schema import PgSchema
    from tests.support.pg import _connect

    admin, table = _connect(postgres_url)
    lock_id = PgSchema(table, postgres_url, str)._lock_id()
    with (
        contextlib.closing(admin),
        held_for(
            HELD_S,
            lambda: admin.execute("SELECT pg_advisory_lock(%s)", [lock_id]),
            lambda: admin.execute("SELECT pg_advisory_unlock(%s)", [lock_id]),
        ),
    ):
        code, stderr, took = first_run(cli_env, postgres_url)
    assert code == 0, stderr
    assert took >= HELD_S * 0.8, f"the creation did not wait ({took:.2f} s): the test is void"


@pytest.fixture
def mariadb() -> Iterator[PrivateMariaDB]:
    """A private MariaDB (a global read lock on the shared one would stall other tests)."""
    require_private_mariadb()
    with private_mariadb() as server:
        yield server


@pytest.mark.slow
def test_mysql_first_run_waits_for_a_slow_table_creation(cli_env, mariadb):
    admin = mariadb.connect()
    with (
        contextlib.closing(admin),
        admin.cursor() as cursor,
        held_for(
            HELD_S,
            lambda: cursor.execute("FLUSH TABLES WITH READ LOCK"),
            lambda: cursor.execute("UNLOCK TABLES"),
        ),
    ):
        code, stderr, took = first_run(cli_env, mariadb.url())
    assert code == 0, stderr
    assert took >= HELD_S * 0.8, f"the creation did not wait ({took:.2f} s): the test is void"


@pytest.mark.slow
def test_mysql_never_makes_the_tables_without_the_schema_lock(cli_env, mysql_url):
    """Another first user holding the schema's named lock past the patience: the run
    gives up (69, saying why) rather than make the tables beside it."""
    from tasklock_cli.stores.mysql.connection import parse_url
    from tests.support.mysql_support import admin_connection

    _, table = parse_url(mysql_url, mysql_url)
    with admin_connection(mysql_url) as admin, admin.cursor() as cursor:
        cursor.execute("SELECT GET_LOCK(%s, 1)", (f"tasklock:schema:{table}",))
        code, stderr, _took = first_run(cli_env, mysql_url)
        cursor.execute(f"SHOW TABLES LIKE '{table}'")
        made = cursor.fetchall()
    assert code == 69, stderr
    assert f"another client has been making table {table}" in stderr
    assert not made
