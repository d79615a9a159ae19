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


def _broken_under_a_held_schema_lock(kind: str, url: str, admin) -> None:
    """The tables changed under a running process (a table or procedure dropped) while
    another client holds the schema lock, as a client making them again would."""
    if kind == "postgres":
        from tasklock_cli.stores.postgres.schema import PgSchema
        from tasklock_cli.stores.postgres.store import split_table

        table = split_table(url)[1]
        admin.execute(f'DROP TABLE "{table}" CASCADE')
        admin.execute("SELECT pg_advisory_lock(%s)", [PgSchema(table, url, str)._lock_id()])
    else:
        from tasklock_cli.stores.mysql.connection import parse_url

        table = parse_url(url, url)[1]
        with admin.cursor() as cursor:
            cursor.execute(f"DROP PROCEDURE `{table}_release`")
            cursor.execute("SELECT GET_LOCK(%s, 1)", (f"tasklock:schema:{table}",))


@pytest.mark.parametrize("kind", ["postgres", "mysql"])
def test_once_seen_the_tables_are_made_again_within_the_io_timeout(kind, request):
    """The patience is for a process's first look: a renewal or release that finds the
    tables changed after a reconnection holds a lease, and gives up within its own I/O
    timeout (0.25 s here), not the 5 s of a first use."""
    from tasklock_cli.errors import StoreUnavailable
    from tasklock_cli.stores import open_store

    url = request.getfixturevalue(f"{kind}_url")
    if kind == "postgres":
        from tests.support.pg import admin_connection

        admin = contextlib.closing(admin_connection(url))
    else:
        from tests.support.mysql_support import admin_connection

        admin = admin_connection(url)
    with admin as conn, contextlib.closing(open_store(url)) as store:
        store.set_io_timeout(0.25)
        store.init_schema()  # seen
        _broken_under_a_held_schema_lock(kind, url, conn)
        store._db.drop()  # type: ignore[attr-defined]  # (a reconnection)
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.peek("k")
        took = time.monotonic() - started
    # Normal: ~0.2 s; with the first use's patience: 3.5-4 s.
    assert took < 1.8, f"{took:.2f} s"


@pytest.mark.slow
def test_mysql_a_connection_lost_while_making_the_tables_says_so(mysql_url):
    """The connection killed while the first use waits for the schema lock: the error is
    the lost connection's, not that of setting the session's limits back on it."""
    from tasklock_cli.errors import StoreUnavailable
    from tasklock_cli.stores import open_store
    from tasklock_cli.stores.mysql.connection import parse_url
    from tests.support.mysql_support import admin_connection

    table = parse_url(mysql_url, mysql_url)[1]
    with admin_connection(mysql_url) as admin, contextlib.closing(open_store(mysql_url)) as store:
        with admin.cursor() as cursor:
            cursor.execute("SELECT GET_LOCK(%s, 1)", (f"tasklock:schema:{table}",))
        store.set_io_timeout(0.25)

        def kill_the_stores_connection() -> None:
            with admin.cursor() as cursor:
                cursor.execute(
                    "SELECT ID FROM information_schema.PROCESSLIST"
                    " WHERE ID <> CONNECTION_ID() AND INFO LIKE %s",
                    (f"SELECT GET_LOCK('tasklock:schema:{table}'%",),
                )
                for (connection_id,) in cursor.fetchall():
                    cursor.execute(f"KILL {int(connection_id)}")

        with (
            held_for(0.5, lambda: None, kill_the_stores_connection),
            pytest.raises(StoreUnavailable) as raised,
        ):
            store.peek("k")
    assert "InterfaceError" not in str(raised.value)
    assert "Lost connection" in str(raised.value) or "2013" in str(raised.value), raised.value


def test_mysql_a_renewal_needs_none_of_the_procedures(mysql_url):
    """After a reconnection, a renewal (a plain UPDATE) neither looks at the procedures
    nor waits for another client remaking them: the holder keeps its lease."""
    from tasklock_cli.stores import open_store
    from tasklock_cli.stores.model import Holder
    from tests.support.mysql_support import admin_connection

    with admin_connection(mysql_url) as admin, contextlib.closing(open_store(mysql_url)) as store:
        store.set_io_timeout(0.25)
        lease = store.acquire("k", 30, Holder("host", 1, "user"), "owner")
        assert lease is not None
        _broken_under_a_held_schema_lock("mysql", mysql_url, admin)
        store._db.drop()  # type: ignore[attr-defined]  # (a reconnection)
        renewed = store.renew(lease, 30)
    assert renewed.fencing_token == lease.fencing_token
    assert renewed.expires_at > lease.expires_at
