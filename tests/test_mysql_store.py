"""MySQL/MariaDB-only behaviour beyond the store contract: URL, schema, races, sessions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.mysql.connection import DEFAULT_TABLE
from tasklock_cli.stores.mysql.connection import parse_url
from tasklock_cli.stores.mysql.schema import PROCEDURES
from tasklock_cli.stores.mysql.store import MySQLStore
from tests.support import forge
from tests.support import mysql_support
from tests.support import services
from tests.support.contract import granted
from tests.support.contract import in_threads
from tests.support.contract import token
from tests.support.mysql_support import open_my

HOLDER = Holder(host="h", pid=1, user="u", command=["job"], note=None)


@pytest.fixture
def stores(mysql_url, opened_stores) -> list[Store]:
    """The stores a test opens (open_my): closed before its table is dropped."""
    return opened_stores


def admin(url: str, statement: str, args: tuple = ()) -> list[tuple]:
    with mysql_support.admin_connection(url) as conn, conn.cursor() as cursor:
        cursor.execute(statement, args)
        return list(cursor.fetchall())


# -- URL ------------------------------------------------------------------------------


def test_the_url_gives_user_password_host_port_database_and_table():
    kwargs, table = parse_url("mariadb://bob:p%40ss@db.example:3307/ops?table=leases", "shown")
    assert table == "leases"
    assert kwargs == {
        "host": "db.example",
        "port": 3307,
        "user": "bob",
        "password": "p@ss",
        "database": "ops",
    }
    kwargs, table = parse_url("mysql://[::1]/ops?ssl_ca=/ca.pem&unix_socket=/s", "shown")
    assert (kwargs["host"], kwargs["port"], table) == ("::1", 3306, DEFAULT_TABLE)
    assert (kwargs["ssl"], kwargs["unix_socket"]) == ({"ca": "/ca.pem"}, "/s")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("mysql://u@h/db?bogus=1", "unknown parameter 'bogus'"),
        ("mysql://u@h/db?table=a.b", "invalid table name"),
        ("mysql://u@h/db?table=" + "x" * 49, "invalid table name"),
        ("mysql://u@h/db?table=", "invalid table name"),
        ("mysql://u@h", "names no database"),
        ("mysql://u@h/", "names no database"),
        ("mysql://u@h:99999/db", "invalid port"),
        ("mysql://u@h:abc/db", "invalid port"),
    ],
)
def test_a_url_that_cannot_work_is_a_configuration_error(url, words):
    with pytest.raises(ConfigError, match=words):
        open_store(url)


def test_the_password_is_never_shown():
    store = open_store("mysql://bob:s3cret@127.0.0.1:1/db?table=t")
    assert "s3cret" not in store.display_url
    with pytest.raises(StoreUnavailable) as caught:
        store.peek("k")
    assert "s3cret" not in str(caught.value)


def test_a_wrong_password_is_a_configuration_error_without_the_password():
    services.require("mysql")
    kwargs, _ = parse_url(services.base_url("mysql"), "")
    url = f"mysql://{kwargs['user']}:wr0ng-pw@{kwargs['host']}:{kwargs['port']}/test"
    with pytest.raises(ConfigError) as caught:
        open_store(url).peek("k")
    assert "wr0ng-pw" not in str(caught.value)
    assert "Access denied" in str(caught.value)


def test_a_missing_database_is_a_configuration_error():
    services.require("mysql")
    base = services.base_url("mysql").rsplit("/", 1)[0]
    with pytest.raises(ConfigError, match="Unknown database"):
        open_store(f"{base}/tasklock_no_such_db").peek("k")


def test_an_unreachable_port_fails_fast_with_store_unavailable():
    store = open_store("mysql://root@127.0.0.1:1/test")
    with pytest.raises(StoreUnavailable):
        store.peek("k")


# -- schema ----------------------------------------------------------------------------


def test_racing_first_use_creates_the_schema_once_without_errors(mysql_url, stores):
    clients = [open_my(mysql_url, stores) for _ in range(6)]
    errors: list[BaseException] = []
    tokens: list[int] = []

    def first_use(client: MySQLStore) -> None:
        try:
            lease = granted(client.acquire(f"k{id(client)}", 30, HOLDER, token()))
            tokens.append(lease.fencing_token)
        except BaseException as exc:
            errors.append(exc)

    in_threads(first_use, [(client,) for client in clients])
    assert errors == []
    assert tokens == [1] * 6


def test_print_sql_creates_what_the_store_uses(mysql_url, stores):
    client = shutil.which("mariadb") or shutil.which("mysql")
    if client is None:
        pytest.skip("no mariadb/mysql client to run the DDL with")
    kwargs, table = parse_url(mysql_url, mysql_url)
    ddl = open_store(mysql_url).schema_sql()
    subprocess.run(
        [client, "-h", kwargs["host"], "-P", str(kwargs["port"]), "-u", kwargs["user"],
         kwargs["database"]],
        input=ddl, text=True, check=True, capture_output=True,
    )  # fmt: skip
    procedures = admin(
        mysql_url,
        "SELECT COUNT(*) FROM information_schema.routines"
        " WHERE routine_schema = DATABASE() AND routine_name LIKE %s",
        (table + "\\_%",),
    )
    assert procedures == [(len(PROCEDURES),)]  # (7: admit, and acquire for older tasklocks)
    store = open_my(mysql_url, stores)
    assert granted(store.acquire("k", 30, HOLDER, token())).fencing_token == 1


def test_an_older_tasklock_sharing_the_store_queues_at_priority_0_and_no_one_flaps(
    mysql_url, stores
):
    """An older tasklock calls ``acquire`` with version 5's parameters, and replaces the
    procedures it knows with its own (version 5, as their COMMENT says): a newer one then
    leaves them be, and the older one's place is a priority-0 place behind a priority-5 one."""
    _, table = parse_url(mysql_url, mysql_url)
    first = open_my(mysql_url, stores)
    held = granted(first.acquire("k", 30, HOLDER, token()))
    assert first.acquire("k", 30, HOLDER, token(), queue=True, priority=5) is None
    for proc in ("acquire", "release", "wake_queue"):  # what an older tasklock put back
        admin(mysql_url, f"ALTER PROCEDURE `{table}_{proc}` COMMENT 'tasklock 5'")
    older = json.dumps({"host": "old", "pid": 7, "user": "u", "command": ["job"], "note": None})
    args = ("k", token(), older, 30.0, 1, True, 3.0, "exclusive", False, False)
    (outcome,) = admin(mysql_url, f"CALL `{table}_acquire`({', '.join(['%s'] * 10)})", args)
    assert outcome[0] == "queued"
    newer = open_my(mysql_url, stores)  # a new connection: its look finds the schema current
    assert newer.acquire("k", 30, HOLDER, token(), queue=True) is None
    comments = admin(
        mysql_url,
        "SELECT routine_name, routine_comment FROM information_schema.routines"
        " WHERE routine_schema = DATABASE() AND routine_name LIKE %s",
        (f"{table}\\_%",),
    )
    assert dict(comments)[f"{table}_acquire"] == "tasklock 5"  # not replaced again
    assert [(w.holder.host, w.priority) for w in newer.waiters("k")] == [
        ("h", 5),
        ("old", 0),
        ("h", 0),
    ]
    assert first.release(held) is True


def test_a_foreign_table_with_the_same_name_is_refused_and_left_untouched(mysql_url, stores):
    _, table = parse_url(mysql_url, mysql_url)
    admin(mysql_url, f"CREATE TABLE `{table}` (id INT PRIMARY KEY, name TEXT)")
    admin(mysql_url, f"INSERT INTO `{table}` VALUES (1, 'theirs')")
    with pytest.raises(ConfigError, match="not a tasklock table"):
        open_my(mysql_url, stores).acquire("k", 30, HOLDER, token())
    assert admin(mysql_url, f"SELECT * FROM `{table}`") == [(1, "theirs")]


@pytest.mark.parametrize(
    "change",
    [
        "DROP PROCEDURE `{table}_admit`",
        "DROP PROCEDURE `{table}_admit`; CREATE PROCEDURE `{table}_admit`(IN p_key INT)"
        " COMMENT 'tasklock 7' SELECT 'taken', 0, 1, 99, NOW(6), NOW(6), 'exclusive', 0, NULL",
        "DROP TABLE `{table}_waiters`",
    ],
    ids=["admit missing", "admit of another version", "a table missing"],
)
def test_an_acquire_that_sets_up_its_own_session_mends_the_schema_first(mysql_url, stores, change):
    """A run's acquire on a new connection does not look at the schema first: its call
    failing, it is made again on a connection set up as usual, which mends the schema."""
    _, table = parse_url(mysql_url, mysql_url)
    first = open_my(mysql_url, stores)
    first.release(granted(first.acquire("k", 30, HOLDER, token())))
    for statement in change.format(table=table).split("; "):
        admin(mysql_url, statement)
    store = open_my(mysql_url, stores)
    lease = granted(store.acquire("k", 30, HOLDER, token()))
    assert lease.fencing_token == 2
    assert store.release(lease) is True
    assert store._db._schema_ok


def test_rows_are_kept_after_release_sweep_and_force_release(mysql_url, stores):
    store = open_my(mysql_url, stores)
    tokens = []
    lease = granted(store.acquire("k", 30, HOLDER, token()))
    tokens.append(lease.fencing_token)
    store.release(lease)
    lease = granted(store.acquire("k", 0.05, HOLDER, token()))
    tokens.append(lease.fencing_token)
    time.sleep(0.1)
    assert store.sweep() == 1
    lease = granted(store.acquire("k", 30, HOLDER, token()))
    tokens.append(lease.fencing_token)
    store.force_release("k")
    tokens.append(granted(store.acquire("k", 30, HOLDER, token())).fencing_token)
    assert tokens == [1, 2, 3, 4]


def test_forged_places_beyond_the_waiter_horizon_are_removed_by_sweep_and_the_next_acquire(
    mysql_url, stores
):
    """A place that runs out later than any renewal could have put it is dead: uncounted,
    and gone after ``sweep`` or the next acquire of its key (places within the horizon
    stay)."""
    store = open_my(mysql_url, stores)
    assert store.acquire("k", 30, HOLDER, token()) is not None
    _, table = parse_url(mysql_url, mysql_url)

    def places() -> list[tuple]:
        return admin(mysql_url, f"SELECT `key` FROM `{table}_waiters` ORDER BY `key`")

    forge.forge_waiter(mysql_url, "k", expires_in=10**6)
    forge.forge_waiter(mysql_url, "other", expires_in=10**6)
    assert store.waiting_counts() == {} and store.waiters("k") == []
    assert store.acquire("k", 30, HOLDER, token()) is None
    assert places() == [(b"other",)]
    store.sweep()
    assert places() == []
    forge.forge_waiter(mysql_url, "k", expires_in=30)
    store.sweep()
    assert places() == [(b"k",)] and store.waiting_counts() == {"k": 1}


@pytest.mark.parametrize("first", ["peek", "acquire"])
def test_sessions_run_read_committed_in_utc_whatever_the_server_default(mysql_url, stores, first):
    """Set up in a round trip of its own (peek), or in the acquire's query (a run's first
    call: ``MySQLConnection.run``'s ``set_up_in_band``)."""
    store = open_my(mysql_url, stores)
    open_my(mysql_url, stores).peek("k")  # the schema exists: no second connection's look
    if first == "peek":
        store.peek("k")
    else:
        assert store.acquire("k", 30, HOLDER, token()) is not None

    def settings(conn) -> tuple:
        with conn.cursor() as cursor:
            cursor.execute("SELECT @@session.time_zone, @@session.sql_mode")
            zone, mode = cursor.fetchone()
            cursor.execute(
                "SHOW SESSION VARIABLES"
                " WHERE Variable_name IN ('tx_isolation', 'transaction_isolation')"
            )
            return zone, mode, cursor.fetchone()[1]

    zone, mode, isolation = store._db.run(settings)
    assert (zone, isolation) == ("+00:00", "READ-COMMITTED")
    assert "NO_BACKSLASH_ESCAPES" not in mode and "ANSI_QUOTES" not in mode


def test_hostile_keys_are_stored_exactly(mysql_url, stores):
    store = open_my(mysql_url, stores)
    keys = ["a", "a ", "A", "é", "k'; DROP TABLE x; --", "\\", "x" * 512]
    leases = {key: store.acquire(key, 30, HOLDER, token()) for key in keys}
    assert all(lease is not None for lease in leases.values())
    assert sorted(info.key for info in store.list()) == sorted(keys)
    assert [info.key for info in store.list(prefix="a")] == ["a", "a "]


@pytest.mark.slow
def test_heavy_contention_never_two_holders_and_tokens_strictly_increase(mysql_url, stores):
    clients = [open_my(mysql_url, stores) for _ in range(6)]
    clients[0].init_schema()
    holding: list[str] = []
    seen: list[int] = []
    problems: list[str] = []
    lock = threading.Lock()

    def worker(client: MySQLStore) -> None:
        for _ in range(40):
            lease = client.acquire("hot", 30, HOLDER, token())
            if lease is None:
                continue
            with lock:
                if holding:
                    problems.append("two holders")
                holding.append(lease.owner_token)
                seen.append(lease.fencing_token)
            with lock:
                holding.remove(lease.owner_token)
            assert client.release(lease) is True

    in_threads(worker, [(client,) for client in clients])
    assert problems == []
    assert seen == sorted(seen) and len(set(seen)) == len(seen) and seen


# -- wake-ups where KILL is refused (another database user) ----------------------------


@pytest.fixture
def other_user_url(mysql_url) -> Iterator[str]:
    """``mysql_url`` as a second database user without CONNECTION ADMIN: its KILLs of our
    connections are refused."""
    kwargs, _ = parse_url(mysql_url, mysql_url)
    user, host = f"tasklock_test_other_{os.getpid()}", kwargs["host"]  # one per worker
    admin(mysql_url, f"CREATE USER IF NOT EXISTS '{user}'@'{host}' IDENTIFIED BY 'other-pw'")
    admin(mysql_url, f"GRANT ALL ON `{kwargs['database']}`.* TO '{user}'@'{host}'")
    netloc = mysql_url.split("://", 1)[1].split("@", 1)[1]
    yield f"mysql://{user}:other-pw@{netloc}"
    admin(mysql_url, f"DROP USER IF EXISTS '{user}'@'{host}'")  # leave the server as we found it


def test_a_break_by_another_user_is_heard_at_the_holders_next_look(
    mysql_url, other_user_url, stores
):
    from tasklock_cli.stores.mysql.breaks import BREAK_LOOK_S

    holder = open_my(mysql_url, stores)
    lease = granted(holder.acquire("k", 30, HOLDER, token()))
    assert holder.wait_for_break(lease, 0.01) is False  # the watch sleeps from now on
    other = open_my(other_user_url, stores)
    (broken,) = other.break_lease("k")  # its KILL is refused: no error
    started = time.monotonic()
    assert holder.wait_for_break(lease, 5) is True
    assert time.monotonic() - started < BREAK_LOOK_S + 0.5
    assert broken.fencing_token == lease.fencing_token


def test_a_release_by_another_user_is_seen_at_the_waiters_next_look(
    mysql_url, other_user_url, stores
):
    from tasklock_cli.stores.mysql.waiting import WAITER_SLEEP_S

    other = open_my(other_user_url, stores)
    lease = granted(other.acquire("k", 30, HOLDER, token()))
    waiter, owner = open_my(mysql_url, stores), token()
    assert waiter.acquire("k", 30, HOLDER, owner, queue=True) is None
    threading.Timer(0.3, lambda: other.release(lease)).start()
    started = time.monotonic()
    waiter.wait_for_release("k", 5)
    # a look (every WAITER_SLEEP_S) saw the release at 0.3 s, not the wait's end at 5 s
    assert 0.25 < time.monotonic() - started < 0.3 + WAITER_SLEEP_S + 2.0
    assert waiter.acquire("k", 30, HOLDER, owner, queue=True) is not None


def test_a_break_watch_released_while_it_waits_ends_as_the_stores_trouble(mysql_url, stores):
    """The release closes the lease's watch while the heartbeat's wait sleeps on it (on
    another thread): the wait ends with an OSError, which the watches take as trouble (the
    watch goes, the next wait opens another), not PyMySQL's AttributeError of a socket
    gone, which escaped as "'NoneType' object has no attribute 'read'"."""
    holder = open_my(mysql_url, stores)
    lease = holder.acquire("k", 30, Holder("h", 1, "u"), "o")
    assert lease is not None
    assert holder.wait_for_break(lease, 0.01) is False  # the watch is open, a look in flight
    outcome: list[object] = []

    def wait() -> None:
        try:
            outcome.append(holder.wait_for_break(lease, 3))
        except Exception as exc:  # what the heartbeat would log and retry on
            outcome.append(exc)

    waiting = threading.Thread(target=wait)
    waiting.start()
    time.sleep(0.2)
    holder._break_watches.drop(lease)  # (as release does)
    waiting.join(5)
    assert outcome == [False]
