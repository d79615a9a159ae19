"""PostgreSQL-only behaviour beyond the store contract: URL, schema, races, faults."""

from __future__ import annotations

import fcntl
import threading
import time
import uuid
from collections.abc import Callable

import psycopg
import pytest

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import Superseded
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.postgres.store import DEFAULT_TABLE
from tasklock_cli.stores.postgres.store import PostgresStore
from tasklock_cli.stores.postgres.store import split_table
from tasklock_cli.stores.provisioning import with_query
from tests.support import pg
from tests.support import services
from tests.support.cli import tasklock
from tests.support.cli import wait_until
from tests.support.contract import granted
from tests.support.contract import in_threads
from tests.support.contract import run_record
from tests.support.contract import token
from tests.support.contract import waiting_thread
from tests.support.pg import open_pg

HOLDER = Holder(host="h", pid=1, user="u", command=["job"], note=None)


def fresh_table() -> str:
    return f"tasklock_test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def stores(postgres_url, opened_stores) -> list[Store]:
    """The stores a test opens (open_pg): closed before its table is dropped."""
    return opened_stores


@pytest.fixture
def private_server():
    pg.require_private_postgres()
    return pg.private_postgres


def connection_of(store: PostgresStore) -> psycopg.Connection:
    """The store's connection, which its first call opened."""
    conn = store._db.current
    assert conn is not None, "the store has opened no connection yet"
    return conn


def table_exists(url: str, name: str) -> bool:
    with pg.admin_connection(url) as conn:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", [name]).fetchone()[0]


# -- URL ------------------------------------------------------------------------------


def test_table_parameter_is_stripped_and_everything_else_passed_on():
    assert split_table("postgresql://h/db") == ("postgresql://h/db", DEFAULT_TABLE)
    assert split_table("postgresql://h/db?table=ops.leases&sslmode=disable") == (
        "postgresql://h/db?sslmode=disable",
        "ops.leases",
    )
    multi = "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write&table=t1"
    assert split_table(multi) == (
        "postgresql://u@h1:5432,h2:5433/db?target_session_attrs=read-write",
        "t1",
    )
    store = PostgresStore.from_url(multi)  # no connection is made here
    assert store.table_name == "t1"
    assert store.display_url == multi


@pytest.mark.parametrize("name", ["", "a;b", "a.b.c", "1abc", "x" * 64, 'a"b', "a b", ".x"])
def test_invalid_table_names_are_configuration_errors(name):
    with pytest.raises(ConfigError, match="table name"):
        PostgresStore.from_url(f"postgresql://h/db?table={name}")


def test_display_url_and_errors_never_show_the_password():
    url = "postgresql://alice:s3cr%40t-pw@127.0.0.1:1/db?table=t"
    store = PostgresStore.from_url(url)
    assert "s3cr" not in store.display_url and "***" in store.display_url
    store.set_io_timeout(1)
    with pytest.raises(StoreUnavailable) as caught:
        store.peek("k")
    assert "s3cr" not in str(caught.value)
    assert "s3cr@t" not in str(caught.value)


def test_unknown_libpq_parameter_is_a_configuration_error():
    with pytest.raises(ConfigError):
        PostgresStore.from_url("postgresql://h/db?no_such_option=1")


# -- schema ---------------------------------------------------------------------------


def test_schema_qualified_table(stores):
    schema = f"tasklock_test_schema_{uuid.uuid4().hex[:8]}"
    base = services.base_url("postgres")
    with pg.admin_connection(base) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        url = with_query(services.base_url("postgres"), table=f"{schema}.leases")
        store = open_pg(url, stores)
        lease = store.acquire("k", 30, HOLDER, token())
        assert lease is not None
        assert table_exists(base, f"{schema}.leases")
        assert not table_exists(base, "leases")
        info = store.peek("k")
        assert info is not None and info.fencing_token == lease.fencing_token
    finally:
        for store in stores:
            store.close()
        with pg.admin_connection(base) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def test_missing_schema_is_a_configuration_error(stores):
    services.require("postgres")
    url = with_query(services.base_url("postgres"), table="tasklock_no_such_schema.leases")
    with pytest.raises(ConfigError, match="cannot be created"):
        open_pg(url, stores).peek("k")


def test_schema_sql_is_valid_ddl_and_the_store_uses_the_table(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    ddl = store.schema_sql()
    assert "CREATE TABLE IF NOT EXISTS" in ddl and "fencing_token" in ddl
    assert "slot_limit" in ddl and "PRIMARY KEY (key, slot)" in ddl
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(ddl)
        conn.execute(ddl)  # idempotent
    assert store.doctor()[3].detail.endswith("is a tasklock table")
    lease = store.acquire("k", 30, HOLDER, token())
    assert lease is not None and lease.fencing_token == 1


def test_init_schema_creates_the_table_and_doctor_sees_it(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    table = split_table(postgres_url)[1]
    checks = {c.name: c for c in store.doctor()}
    assert "will be created on first use" in checks["schema"].detail
    assert not table_exists(postgres_url, table)  # doctor changes nothing
    store.init_schema()
    assert table_exists(postgres_url, table)
    store.init_schema()  # idempotent
    checks = {c.name: c for c in store.doctor()}
    assert checks["schema"].ok and "is a tasklock table" in checks["schema"].detail
    assert checks["reachable"].ok and "ms" in checks["reachable"].detail
    assert checks["server"].ok and "PostgreSQL" in checks["server"].detail
    assert checks["clock"].ok and not checks["clock"].warning


def first_uses_at_once(
    clients: list[PostgresStore], use: Callable[[int, PostgresStore], object]
) -> tuple[list, list[BaseException]]:
    """Every client's first use at the same moment (every other one runs init first):
    what each ``use`` returned, and what was raised."""
    barrier = threading.Barrier(len(clients))
    errors: list[BaseException] = []
    results: list = []

    def first_use(index: int, client: PostgresStore) -> None:
        barrier.wait()
        try:
            if index % 2:
                client.init_schema()
            results.append(use(index, client))
        except BaseException as exc:
            errors.append(exc)

    in_threads(first_use, enumerate(clients))
    return results, errors


def test_racing_first_use_creates_the_table_once_without_errors(postgres_url, stores):
    clients = [open_pg(postgres_url, stores) for _ in range(8)]
    results, errors = first_uses_at_once(
        clients, lambda index, client: client.acquire(f"k{index}", 30, HOLDER, token())
    )
    assert errors == []
    assert len(results) == 8 and all(r is not None for r in results)


def test_foreign_table_with_the_same_name_is_refused_and_left_untouched(postgres_url, stores):
    table = split_table(postgres_url)[1]
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, payload text)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 'precious')")
    store = open_pg(postgres_url, stores)
    with pytest.raises(ConfigError, match=table):
        store.acquire("k", 30, HOLDER, token())
    with pytest.raises(ConfigError, match=table):
        store.init_schema()
    checks = {c.name: c for c in store.doctor()}
    assert checks["schema"].ok is False and table in checks["schema"].detail
    with pg.admin_connection(postgres_url) as conn:
        assert conn.execute(f"SELECT * FROM {table}").fetchall() == [(1, "precious")]
        columns = conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0",
            [table],
        ).fetchall()
        assert sorted(c[0] for c in columns) == ["id", "payload"]


def test_a_view_with_the_same_name_is_refused(postgres_url, stores):
    table = split_table(postgres_url)[1]
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(f"CREATE VIEW {table} AS SELECT 1 AS x")
    try:
        with pytest.raises(ConfigError, match="not a table"):
            open_pg(postgres_url, stores).peek("k")
    finally:
        with pg.admin_connection(postgres_url) as conn:
            conn.execute(f"DROP VIEW {table}")


def test_rows_are_kept_after_release_sweep_and_force_release(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    table = split_table(postgres_url)[1]
    lease = granted(store.acquire("k", 30, HOLDER, token()))
    store.release(lease)
    with pg.admin_connection(postgres_url) as conn:
        rows = conn.execute(
            f"SELECT slot, fencing_token, owner_token FROM {table} WHERE key = 'k' ORDER BY slot"
        ).fetchall()
    # The key's fencing counter (slot -1) and its slot 0, freed.
    assert rows == [(-1, lease.fencing_token, None), (0, lease.fencing_token, None)]


# The lease table as tasklock created it before semaphores (one row per key).
_TABLE_BEFORE_SLOTS = """
CREATE TABLE {table} (
    key           text COLLATE "C" PRIMARY KEY,
    fencing_token bigint NOT NULL,
    owner_token   text,
    holder        jsonb,
    acquired_at   timestamptz,
    expires_at    timestamptz
);
CREATE INDEX {table}_expires_idx ON {table} (expires_at) WHERE owner_token IS NOT NULL;
INSERT INTO {table} VALUES
    ('held', 41, 'owner-held', '{{"host": "old", "pid": 7, "user": "u"}}',
     now(), now() + interval '30 s'),
    ('freed', 7, NULL, NULL, NULL, NULL);
"""


def make_table_before_slots(url: str) -> str:
    table = split_table(url)[1]
    with pg.admin_connection(url) as conn:
        conn.execute(_TABLE_BEFORE_SLOTS.format(table=table))
    return table


def end_upgrade_quarantine(url: str, table: str) -> int:
    """End the quarantine the first acquire in a table from before epochs began (it cannot
    tell a lost epoch row from none: see test_postgres_epochs); the epoch's first token."""
    with pg.admin_connection(url) as conn:
        (epoch,) = conn.execute(
            f"UPDATE {table} SET expires_at = clock_timestamp()"
            " WHERE key = '' AND slot = -2 RETURNING fencing_token"
        ).fetchone()
    return epoch << 30


def test_a_table_from_before_semaphores_is_migrated_and_its_leases_kept(postgres_url, stores):
    table = make_table_before_slots(postgres_url)
    store = open_pg(postgres_url, stores)
    (held,) = store.holders("held")
    assert (held.slot, held.limit, held.fencing_token, held.holder.host) == (0, 1, 41, "old")
    assert store.acquire("freed", 30, HOLDER, token()) is None  # the upgrade's quarantine
    first = end_upgrade_quarantine(postgres_url, table)
    assert store.acquire("held", 30, HOLDER, token()) is None  # still live
    with pytest.raises(LimitMismatch):
        store.acquire("held", 30, HOLDER, token(), limit=2)
    old_lease = Lease("held", "owner-held", 41, held.acquired_at, held.expires_at)
    assert store.renew(old_lease, 30).fencing_token == 41  # its owner still renews it
    assert store.release(old_lease) is True
    assert granted(store.acquire("held", 30, HOLDER, token())).fencing_token == first
    assert granted(store.acquire("freed", 30, HOLDER, token(), limit=2)).fencing_token == first
    assert granted(store.acquire("freed", 30, HOLDER, token(), limit=2)).fencing_token == first + 1
    with pg.admin_connection(postgres_url) as conn:
        (primary_key,) = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
            " WHERE conrelid = %s::regclass AND contype = 'p'",
            [table],
        ).fetchone()
    assert primary_key == "PRIMARY KEY (key, slot)"
    assert {c.name: c for c in store.doctor()}["schema"].detail.endswith("is a tasklock table")


def test_print_sql_migrates_a_table_from_before_semaphores_too(postgres_url, stores):
    """For a DBA who runs the schema himself: the printed SQL brings an older table to
    the current shape (and changes nothing when run again)."""
    table = make_table_before_slots(postgres_url)
    store = open_pg(postgres_url, stores)
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(store.schema_sql())
        conn.execute(store.schema_sql())
        rows = conn.execute(
            f"SELECT key, slot, slot_limit, fencing_token FROM {table} ORDER BY key"
        ).fetchall()
    # (no epoch row in a used table: its first acquire starts an epoch)
    assert rows == [("freed", 0, 1, 7), ("held", 0, 1, 41)]
    assert store.acquire("freed", 30, HOLDER, token(), limit=3) is None
    first = end_upgrade_quarantine(postgres_url, table)
    assert granted(store.acquire("freed", 30, HOLDER, token(), limit=3)).fencing_token == first
    assert [info.fencing_token for info in store.holders("held")] == [41]


def test_racing_clients_migrate_a_table_from_before_semaphores_once(postgres_url, stores):
    table = make_table_before_slots(postgres_url)
    clients = [open_pg(postgres_url, stores) for _ in range(6)]
    quarantined, errors = first_uses_at_once(
        clients, lambda _, client: client.acquire("freed", 30, HOLDER, token(), limit=6)
    )
    assert errors == [] and quarantined == [None] * 6
    first = end_upgrade_quarantine(postgres_url, table)
    leases = [granted(client.acquire("freed", 30, HOLDER, token(), limit=6)) for client in clients]
    assert sorted(lease.fencing_token for lease in leases) == [first + n for n in range(6)]
    assert [info.slot for info in clients[0].holders("freed")] == [0, 1, 2, 3, 4, 5]


# The tables as tasklock created them before lock modes (semaphores and queues, no mode
# on leases, no supersede on places).
_TABLES_BEFORE_MODES = """
CREATE TABLE {table} (
    key           text COLLATE "C" NOT NULL,
    slot          integer NOT NULL DEFAULT 0,
    slot_limit    integer NOT NULL DEFAULT 1,
    fencing_token bigint NOT NULL,
    owner_token   text,
    holder        jsonb,
    acquired_at   timestamptz,
    expires_at    timestamptz,
    PRIMARY KEY (key, slot)
);
CREATE TABLE {table}_runs (
    key           text COLLATE "C" NOT NULL,
    fencing_token bigint NOT NULL,
    started_at    timestamptz NOT NULL,
    ended_at      timestamptz NOT NULL,
    data          jsonb NOT NULL,
    PRIMARY KEY (key, fencing_token)
);
CREATE TABLE {table}_waiters (
    seq           bigserial PRIMARY KEY,
    key           text COLLATE "C" NOT NULL,
    owner_token   text NOT NULL,
    holder        jsonb NOT NULL,
    mode          text NOT NULL DEFAULT 'exclusive',
    since         timestamptz NOT NULL,
    expires_at    timestamptz NOT NULL,
    UNIQUE (key, owner_token)
);
INSERT INTO {table} VALUES
    ('held', -1, 0, 41, NULL, NULL, NULL, NULL),
    ('held', 0, 1, 41, 'owner-held', '{{"host": "old", "pid": 7, "user": "u"}}',
     now(), now() + interval '30 s');
INSERT INTO {table}_waiters (key, owner_token, holder, since, expires_at)
VALUES ('held', 'owner-waiting', '{{"host": "old", "pid": 8, "user": "u"}}', now(),
        now() + interval '30 s');
"""


def make_tables_before_modes(url: str) -> str:
    table = split_table(url)[1]
    with pg.admin_connection(url) as conn:
        conn.execute(_TABLES_BEFORE_MODES.format(table=table))
    return table


def schema_check(store: PostgresStore) -> str:
    return {check.name: check for check in store.doctor()}["schema"].detail


def columns_of(url: str, table: str) -> dict[str, str | None]:
    with pg.admin_connection(url) as conn:
        rows = conn.execute(
            "SELECT attname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute AS a"
            " LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum"
            " WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
            [table],
        ).fetchall()
    return dict(rows)


def test_tables_from_before_lock_modes_are_migrated_and_their_leases_stay_exclusive(
    postgres_url, stores
):
    table = make_tables_before_modes(postgres_url)
    assert schema_check(open_pg(postgres_url, stores)).endswith("(migrated on first use)")
    store = open_pg(postgres_url, stores)
    (held,) = store.holders("held")
    assert (held.mode, held.fencing_token, held.holder.host) == (EXCLUSIVE, 41, "old")
    assert [(w.holder.pid, w.mode) for w in store.waiters("held")] == [(8, EXCLUSIVE)]
    assert columns_of(postgres_url, table)["mode"] == "'exclusive'::text"
    waiters = columns_of(postgres_url, table + "_waiters")
    assert (waiters["supersede"], waiters["superseded"]) == ("false", "false")
    # an older tasklock still connected writes leases and places without the new columns
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(
            f"INSERT INTO {table} (key, slot, slot_limit, fencing_token, owner_token, holder,"
            " acquired_at, expires_at) VALUES ('old', 0, 1, 5, 'o', '{}', now(),"
            " now() + interval '30 s')"
        )
    assert [info.mode for info in store.holders("old")] == [EXCLUSIVE]
    assert store.acquire("free", 30, HOLDER, token()) is None  # the upgrade's quarantine
    end_upgrade_quarantine(postgres_url, table)
    assert store.acquire("old", 30, HOLDER, token(), mode=SHARED) is None
    assert store.acquire("held", 30, HOLDER, token(), mode=SHARED) is None
    old_lease = Lease("held", "owner-held", 41, held.acquired_at, held.expires_at)
    assert store.release(old_lease) is True
    assert store.acquire("held", 30, HOLDER, token()) is None  # the old waiter comes first
    assert store.acquire("held", 30, HOLDER, "owner-waiting") is not None
    assert schema_check(store).endswith("is a tasklock table")


def test_print_sql_migrates_tables_from_before_lock_modes_too(postgres_url, stores):
    table = make_tables_before_modes(postgres_url)
    store = PostgresStore.from_url(postgres_url)  # no connection: nothing migrated yet
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(store.schema_sql())
        conn.execute(store.schema_sql())
    assert "mode" in columns_of(postgres_url, table)
    assert "superseded" in columns_of(postgres_url, table + "_waiters")
    store = open_pg(postgres_url, stores)
    assert [info.mode for info in store.holders("held")] == [EXCLUSIVE]


def test_racing_clients_migrate_tables_from_before_lock_modes_once(postgres_url, stores):
    table = make_tables_before_modes(postgres_url)
    clients = [open_pg(postgres_url, stores) for _ in range(6)]
    quarantined, errors = first_uses_at_once(
        clients, lambda _, client: client.acquire("free", 30, HOLDER, token(), mode=SHARED)
    )
    assert errors == [] and quarantined == [None] * 6
    end_upgrade_quarantine(postgres_url, table)
    leases = [
        granted(client.acquire("free", 30, HOLDER, token(), mode=SHARED)) for client in clients
    ]
    assert sorted(lease.slot for lease in leases) == [0, 1, 2, 3, 4, 5]


def test_sweep_works_in_batches_and_keeps_counters(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    store.init_schema()
    table = split_table(postgres_url)[1]
    with pg.admin_connection(postgres_url) as conn:
        conn.execute(
            f"INSERT INTO {table} (key, fencing_token, owner_token, holder, acquired_at,"
            " expires_at) SELECT 'k' || g, 7, 'owner' || g, '{}'::jsonb,"
            " now() - interval '1 hour', now() - interval '1 minute'"
            " FROM generate_series(1, 2500) AS g"
        )
    live = granted(store.acquire("live", 30, HOLDER, token()))
    assert store.sweep(dry_run=True) == 2500
    assert open_pg(postgres_url, stores).sweep() == 2500  # a first call on a new connection
    assert store.sweep() == 0
    assert [i.key for i in store.list(include_expired=True)] == ["live"]
    info = store.peek("live")
    assert info is not None and info.fencing_token == live.fencing_token
    again = granted(store.acquire("k1", 30, HOLDER, token()))
    assert again.fencing_token == 8


def test_list_shows_expired_rows_only_when_asked(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    store.acquire("dead", 0.2, HOLDER, token())
    time.sleep(0.4)
    assert list(store.list()) == []
    [info] = store.list(include_expired=True)
    assert info.key == "dead" and info.expired is True


# -- concurrency ----------------------------------------------------------------------


def test_heavy_contention_never_two_holders_and_tokens_strictly_increase(postgres_url, stores):
    clients = [open_pg(postgres_url, stores) for _ in range(16)]
    clients[0].init_schema()
    guard = threading.Lock()
    state: dict[str, int | None] = {"holder": None}
    tokens: list[int] = []
    problems: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(clients))

    def worker(index: int, client: PostgresStore) -> None:
        barrier.wait()
        try:
            for _ in range(40):
                lease = client.acquire("hot", 30, HOLDER, token())
                if lease is None:
                    continue
                with guard:
                    if state["holder"] is not None:
                        problems.append(f"{index} acquired while {state['holder']} held it")
                    state["holder"] = index
                    tokens.append(lease.fencing_token)
                info = client.peek("hot")
                if info is None or info.fencing_token != lease.fencing_token:
                    problems.append(f"peek disagrees with {lease.fencing_token}: {info}")
                with guard:
                    state["holder"] = None
                if not client.release(lease):
                    problems.append(f"release of {lease.fencing_token} returned False")
        except BaseException as exc:
            errors.append(exc)

    in_threads(worker, enumerate(clients))
    assert errors == [] and problems == []
    assert len(tokens) >= 16
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_heavy_contention_on_slots_never_shares_a_slot_and_never_repeats_a_token(
    postgres_url, stores
):
    """Acquirers of different slots queue on the key's counter row: no two compute the
    same token, and a token is above every token of a lease released before it."""
    clients = [open_pg(postgres_url, stores) for _ in range(12)]
    clients[0].init_schema()
    guard = threading.Lock()
    held: dict[int, int] = {}  # slot -> token
    highest_released = [0]
    tokens: list[int] = []
    problems: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(clients))

    def worker(client: PostgresStore) -> None:
        barrier.wait()
        try:
            for _ in range(30):
                with guard:
                    floor = highest_released[0]
                lease = client.acquire("pool", 30, HOLDER, token(), limit=3)
                if lease is None:
                    continue
                with guard:
                    if lease.slot in held or not 0 <= lease.slot < 3:
                        problems.append(f"slot {lease.slot} given twice: {held}")
                    if lease.fencing_token <= floor:
                        problems.append(f"token {lease.fencing_token} not above {floor}")
                    held[lease.slot] = lease.fencing_token
                    tokens.append(lease.fencing_token)
                with guard:
                    del held[lease.slot]
                    highest_released[0] = max(highest_released[0], lease.fencing_token)
                if not client.release(lease):
                    problems.append(f"release of {lease.fencing_token} returned False")
        except BaseException as exc:
            errors.append(exc)

    in_threads(worker, [(client,) for client in clients])
    assert errors == [] and problems == []
    assert len(tokens) >= 12
    assert len(set(tokens)) == len(tokens)


def test_same_owner_retry_after_lost_reply_is_idempotent(postgres_url, stores):
    a, b = open_pg(postgres_url, stores), open_pg(postgres_url, stores)
    owner = token()
    first = granted(a.acquire("k", 30, HOLDER, owner))
    again = granted(b.acquire("k", 30, HOLDER, owner))  # another connection, same owner token
    assert again.fencing_token == first.fencing_token
    assert again.acquired_at == first.acquired_at


# -- waiting --------------------------------------------------------------------------


def test_the_next_waiter_takes_its_turn_when_the_first_waiter_goes_away(postgres_url, stores):
    holder, first, second = (open_pg(postgres_url, stores) for _ in range(3))
    lease = granted(holder.acquire("k", 30, HOLDER, token()))
    first.wait_for_release("k", 0.2)  # times out, still first in line for "k"
    woke: list[float] = []
    thread = waiting_thread(second, "k", 5, woke)
    time.sleep(0.3)
    assert not woke, "the second waiter woke while the first one still had its turn"
    first.close()  # e.g. a waiter killed: its session, and its turn, end with it
    time.sleep(0.3)
    released = time.monotonic()
    holder.release(lease)
    thread.join()
    assert woke and time.monotonic() - released < 1.0


def test_a_waiter_that_gets_the_lease_gives_its_turn_to_the_next(postgres_url, stores):
    holder, first, second = (open_pg(postgres_url, stores) for _ in range(3))
    lease = granted(holder.acquire("k", 30, HOLDER, token()))
    first.wait_for_release("k", 0.2)
    holder.release(lease)
    mine = first.acquire("k", 30, HOLDER, token())
    assert mine is not None
    with pg.admin_connection(postgres_url) as conn:
        (turns_held,) = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = %s",
            [connection_of(first).info.backend_pid],
        ).fetchone()
    assert turns_held == 0
    started = time.monotonic()
    timer = threading.Timer(0.3, lambda: first.release(mine))
    timer.start()
    second.wait_for_release("k", 5)
    timer.join()
    assert 0.25 < time.monotonic() - started < 2.5  # the release, not the wait's 5 s end


def test_a_waiter_does_not_take_a_lease_still_being_acquired_for_free(postgres_url, stores):
    """A woken waiter hands on its turn inside the statement that takes the lease, before
    that commits: the next waiter's look at the lease must wait for the commit instead of
    reading the lease as free from the snapshot before it."""
    holder, waiter = (open_pg(postgres_url, stores) for _ in range(2))
    assert holder.release(granted(holder.acquire("k", 30, HOLDER, token()))) is True  # free now
    _, table = split_table(postgres_url)
    with pg.admin_connection(postgres_url) as in_flight:
        in_flight.autocommit = False
        in_flight.execute(  # an acquire that has not committed yet: counter row and slot 0
            f"UPDATE {table} SET fencing_token = fencing_token + 1 WHERE key = 'k' AND slot = -1"
        )
        in_flight.execute(
            f"UPDATE {table} SET owner_token = 'x', fencing_token = fencing_token + 1,"
            " acquired_at = now(), expires_at = now() + interval '30 s'"
            " WHERE key = 'k' AND slot = 0"
        )
        looking = threading.Thread(target=waiter.wait_for_release, args=("k", 10))
        looking.start()
        time.sleep(0.3)
        assert looking.is_alive()  # not "free": it waits for the commit
        in_flight.commit()
        time.sleep(0.3)
        assert looking.is_alive()  # held, as committed: it waits for the release
    assert [info.slot for info in holder.force_release("k")] == [0]
    looking.join(timeout=5)
    assert not looking.is_alive()


# -- time -----------------------------------------------------------------------------


def test_expiry_is_decided_by_the_server_clock_not_ours(postgres_url, stores, monkeypatch):
    store = open_pg(postgres_url, stores)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)  # our clock is 1 h off
    lease = store.acquire("k", 0.4, HOLDER, token())
    assert lease is not None
    assert store.peek("k") is not None
    time.sleep(0.6)
    assert store.peek("k") is None
    with pytest.raises(LeaseLost):
        store.renew(lease, 30)
    assert store.peek("k") is None
    clock = {c.name: c for c in store.doctor()}["clock"]
    assert clock.warning and clock.ok


@pytest.mark.parametrize("first", ["init", "acquire"])
def test_connection_forces_read_committed_even_if_the_role_says_serializable(stores, first):
    """Set up in a round trip of its own, or by a run's acquire in its own query
    (``PgConnection.run``'s ``in_band``), whose transaction is made READ COMMITTED too."""
    services.require("postgres")
    url = with_query(services.base_url("postgres"), table=fresh_table())
    url += "&options=-c%20default_transaction_isolation%3Dserializable"
    try:
        open_pg(url, stores).init_schema()
        store = open_pg(url, stores)
        if first == "init":
            store.init_schema()
        lease = store.acquire("k", 30, HOLDER, token())
        assert lease is not None
        conn = connection_of(store)
        [(level,)] = conn.execute("SHOW default_transaction_isolation").fetchall()
        assert level == "read committed"
        assert conn.execute("SHOW TimeZone").fetchall() == [("UTC",)]
        assert conn.execute("SHOW statement_timeout").fetchall() == [("4s",)]
        assert store.release(lease) is True
    finally:
        pg.drop_namespace(url)


@pytest.mark.parametrize("dropped", ["{runs}", "{waiters}", "{table} CASCADE"])
def test_an_acquire_that_sets_up_its_own_session_mends_the_schema_first(
    postgres_url, stores, dropped
):
    """A run's acquire on a new connection does not look at the table first: its call
    failing, it is made again on a connection set up as usual, which creates the table;
    the release notifies the channel of the table as it is now."""
    first = open_pg(postgres_url, stores)
    first.release(granted(first.acquire("k", 30, HOLDER, token())))
    schema = first._schema
    with pg.admin_connection(postgres_url) as admin:
        admin.execute(
            psycopg.sql.SQL("DROP TABLE " + dropped).format(
                table=schema.table, runs=schema.runs, waiters=schema.waiters
            )
        )
    store = open_pg(postgres_url, stores)
    lease = granted(store.acquire("k", 30, HOLDER, token()))
    row = (
        connection_of(store).execute("SELECT to_regclass(%s)::oid", [schema.quoted_name]).fetchone()
    )
    assert row is not None
    oid = row[0]
    assert store._schema.channel == f"tasklock_released_{oid}"
    assert store.release(lease, record=run_record(lease, HOLDER)) is True
    assert [run.fencing_token for run in store.history("k")] == [lease.fencing_token]


# -- faults ---------------------------------------------------------------------------


def test_terminated_backend_reconnects(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    lease = granted(store.acquire("k", 30, HOLDER, token()))
    pid = connection_of(store).info.backend_pid
    with pg.admin_connection(postgres_url) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
    time.sleep(0.1)
    try:
        renewed = store.renew(lease, 30)
    except StoreUnavailable:
        renewed = store.renew(lease, 30)
    assert renewed.fencing_token == lease.fencing_token
    assert connection_of(store).info.backend_pid != pid
    assert store.release(lease) is True


def test_connections_are_close_on_exec(postgres_url, stores):
    store = open_pg(postgres_url, stores)
    store.peek("k")
    flags = fcntl.fcntl(connection_of(store).fileno(), fcntl.F_GETFD)
    assert flags & fcntl.FD_CLOEXEC


def test_unreachable_port_fails_fast_with_store_unavailable():
    store = PostgresStore.from_url("postgresql://tasklock:pw-secret@127.0.0.1:1/db?table=t")
    store.set_io_timeout(1)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable) as caught:
        store.acquire("k", 30, HOLDER, token())
    assert time.monotonic() - started < 3
    assert "pw-secret" not in str(caught.value)
    checks = {c.name: c for c in store.doctor()}
    assert checks["reachable"].ok is False and "pw-secret" not in checks["reachable"].detail
    assert store.signals_release
    started = time.monotonic()
    store.wait_for_release("k", 0.2)  # never raises; sleeps out its timeout
    assert time.monotonic() - started < 2
    store.close()


def test_missing_database_is_a_configuration_error(stores):
    services.require("postgres")
    base = services.base_url("postgres").rsplit("/", 1)[0]
    store = open_pg(f"{base}/tasklock_no_such_db?table=t", stores)
    with pytest.raises(ConfigError, match="does not exist"):
        store.peek("k")


def test_tls_required_of_a_server_without_it_is_a_configuration_error(private_server, cli_env):
    """sslmode=require (or verify-ca, verify-full) where the server offers no TLS: no retry
    makes it, so 78 with libpq's words, not an outage (69); through the executable, one
    line."""
    with private_server() as server:
        url = server.url_for(table="leases")
        for mode in ("require", "verify-full"):
            tls_url = f"{url}&sslmode={mode}&sslrootcert=/nonexistent"
            store = PostgresStore.from_url(tls_url)
            with pytest.raises(ConfigError, match="does not support SSL"):
                store.peek("k")
            ran = tasklock("run", "k", "--", "true", env={**cli_env, "TASKLOCK_STORE": tls_url})
            assert ran.returncode == 78, ran.stderr
            lines = ran.stderr.splitlines()
            assert len(lines) == 1 and "does not support SSL" in lines[0], ran.stderr


def test_wrong_password_is_a_configuration_error_without_the_password(private_server):
    with private_server(password="right-horse-battery") as server:
        good = PostgresStore.from_url(server.url_for(table="leases"))
        try:
            assert good.acquire("k", 30, HOLDER, token()) is not None
        finally:
            good.close()
        bad = PostgresStore.from_url(server.url_for(table="leases", password="wrong-staple-pw"))
        with pytest.raises(ConfigError) as caught:
            bad.peek("k")
        message = str(caught.value)
        assert "wrong-staple-pw" not in message and "right-horse" not in message
        assert "password authentication failed" in message
        nodb = PostgresStore.from_url(server.url_for(table="leases", dbname="nope"))
        with pytest.raises(ConfigError) as caught:
            nodb.peek("k")
        assert "right-horse" not in str(caught.value)
        for store in (bad, nodb):
            checks = {c.name: c for c in store.doctor()}
            assert checks["reachable"].ok is False
            assert "wrong-staple-pw" not in checks["reachable"].detail
            store.close()


def test_server_restart_while_a_lease_is_held(private_server):
    with private_server() as server:
        store = PostgresStore.from_url(server.url_for(table="leases"))
        store.set_io_timeout(1)
        try:
            lease = granted(store.acquire("k", 30, HOLDER, token()))
            server.stop("fast")
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                store.renew(lease, 30)
            assert time.monotonic() - started < 3
            server.start()
            renewed = store.renew(lease, 30)
            assert renewed.fencing_token == lease.fencing_token
            server.restart("immediate")
            try:
                renewed = store.renew(lease, 30)
            except StoreUnavailable:
                renewed = store.renew(lease, 30)
            assert renewed.fencing_token == lease.fencing_token
            assert store.release(lease) is True
            # A restart is a new epoch (a backup or snapshot started looks the same): no new
            # lease until the old ones could have run out, then tokens above them all.
            assert store.acquire("k", 30, HOLDER, token()) is None
            assert "restarted" in (store.holdup("k") or "")
            with server.connection() as conn:
                (epoch,) = conn.execute(
                    "UPDATE leases SET expires_at = clock_timestamp()"
                    " WHERE key = '' AND slot = -2 RETURNING fencing_token"
                ).fetchone()
            nxt = granted(store.acquire("k", 30, HOLDER, token()))
            assert nxt.fencing_token == epoch << 30 > lease.fencing_token
        finally:
            store.close()


def test_a_server_refusing_an_identity_function_is_one_line_78(private_server, cli_env):
    """A role without EXECUTE on pg_walfile_name (as on managed services that refuse it):
    every command that reaches the table says so in one line, exit 78; doctor fails its
    epoch check alone."""
    with private_server() as server:
        with server.connection() as conn:
            conn.execute("CREATE ROLE limited LOGIN")
            conn.execute("GRANT CREATE ON SCHEMA public TO limited")
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM PUBLIC")
        url = f"postgresql://limited@127.0.0.1:{server.port}/postgres?table=leases"
        env = {**cli_env, "TASKLOCK_STORE": url}
        results = [tasklock(*args, env=env) for args in (["run", "k", "--", "true"], ["init"])]
        with server.connection() as conn:
            conn.execute("GRANT EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) TO limited")
        assert tasklock("run", "k", "--", "true", env=env).returncode == 0
        with server.connection() as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_walfile_name(pg_lsn) FROM limited")
        results.append(tasklock("run", "k", "--", "true", env=env))
        doctor = tasklock("doctor", env=env)
    for result in results:
        assert result.returncode == 78, result.stderr
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("tasklock: error: "), result.stderr
        assert "the server refuses pg_walfile_name() (permission denied" in lines[0]
        assert "PostgreSQL 10 or later" in lines[0] and "may not use table" not in lines[0]
    failing = [line for line in doctor.stdout.splitlines() if line.startswith("fail")]
    assert [line.split()[1] for line in failing] == ["epoch"], doctor.stdout
    assert "refuses pg_walfile_name()" in failing[0]


def test_a_lease_table_whose_ledger_cannot_be_made_still_grants(private_server):
    """A lease table beside which the run ledger is missing and cannot be made (a role
    without CREATE): leases work without it, and the acquire that finds no epoch row reads
    no ledger's tokens (it would fail on the missing table)."""
    with private_server() as server:
        with server.connection() as conn:
            conn.execute("CREATE ROLE limited LOGIN")
            conn.execute("GRANT CREATE ON SCHEMA public TO limited")
        url = f"postgresql://limited@127.0.0.1:{server.port}/postgres?table=leases"
        _used_once(url)
        with server.connection() as conn:
            conn.execute("DROP TABLE leases_runs")
            conn.execute("REVOKE CREATE ON SCHEMA public FROM limited")
        store = PostgresStore.from_url(url)
        try:
            lease = granted(store.acquire("k", 30, HOLDER, token()))
            assert lease.fencing_token == 2
            assert store.release(lease)
            with server.connection() as conn:
                conn.execute("DELETE FROM leases WHERE key = '' AND slot = -2")
            assert store.acquire("k", 30, HOLDER, token()) is None  # a new epoch's quarantine
            assert "primary changed" in (store.holdup("k") or "")
        finally:
            store.close()


def test_a_role_granted_the_leases_alone_still_acquires(private_server):
    """A role that may use the lease and waiters tables but not read the run ledger: its
    acquire reads no ledger's tokens (PostgreSQL checks the privileges of every table a
    statement names, also in a branch that never runs), and its leases work as before."""
    with private_server() as server:
        _used_once(server.url_for(table="leases"))
        with server.connection() as conn:
            conn.execute("CREATE ROLE leases_only LOGIN")
            conn.execute("GRANT SELECT, INSERT, UPDATE ON leases, leases_waiters TO leases_only")
            conn.execute("GRANT DELETE ON leases_waiters TO leases_only")
            conn.execute("GRANT USAGE ON SEQUENCE leases_waiters_seq_seq TO leases_only")
        url = f"postgresql://leases_only@127.0.0.1:{server.port}/postgres?table=leases"
        store = PostgresStore.from_url(url)
        try:
            lease = granted(store.acquire("k", 30, HOLDER, token()))
            assert lease.fencing_token == 2
            assert store.release(lease)
        finally:
            store.close()


def _used_once(url: str) -> None:
    """The tables made on ``url``, and one lease taken and released there (token 1)."""
    store = PostgresStore.from_url(url)
    try:
        store.release(granted(store.acquire("k", 30, HOLDER, token())))
    finally:
        store.close()


def test_a_hung_server_fails_within_the_io_timeout_then_recovers(private_server):
    with private_server() as server:
        store = PostgresStore.from_url(server.url_for(table="leases"))
        store.set_io_timeout(1)
        try:
            lease = granted(store.acquire("k", 30, HOLDER, token()))
            pid = connection_of(store).info.backend_pid
            server.pause_backend(pid)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="no answer"):
                store.renew(lease, 30)
            assert time.monotonic() - started < 2.5
            server.resume_backend(pid)
            assert store.renew(lease, 30).fencing_token == lease.fencing_token
        finally:
            store.close()


def test_sweep_removes_the_places_of_crashed_waiters(postgres_url, stores):
    """A place that ran out is cleared by the next acquire of its key, or else by sweep."""
    store = open_pg(postgres_url, stores)
    assert store.acquire("k", 30, HOLDER, token()) is not None
    crashed = open_pg(postgres_url, stores)
    crashed.waiter_ttl = 0.5  # still there when the next waiter queues, on a busy machine
    assert crashed.acquire("k", 30, HOLDER, token(), queue=True) is None
    live = open_pg(postgres_url, stores)
    assert live.acquire("k", 30, HOLDER, token(), queue=True) is None

    def places() -> int:
        with pg.admin_connection(postgres_url) as conn:
            return conn.execute(f"SELECT count(*) FROM {fresh_waiters(postgres_url)}").fetchone()[0]

    assert places() == 2
    time.sleep(0.6)  # the crashed waiter's place runs out (the store's clock)
    assert store.sweep() == 0  # (it counts leases)
    assert places() == 1 and len(store.waiters("k")) == 1


def fresh_waiters(url: str) -> str:
    return url.split("table=", 1)[1].split("&")[0] + "_waiters"


# -- wake-ups with lock modes -----------------------------------------------------------


def waiting_in_threads(clients: list[PostgresStore], key: str = "k") -> list[float]:
    """Each client waits for ``key`` in a thread of its own; the list gets the monotonic
    time each one woke (in the order they woke)."""
    woke: list[float] = []
    for client in clients:
        waiting_thread(client, key, 5, woke)
    time.sleep(0.4)
    return woke


def woken_after(woke: list[float], since: float, count: int) -> list[float]:
    """Seconds from ``since`` to each wake-up, once ``count`` of them came (however late a
    loaded machine lets them come) and at least 0.5 s passed: a wake-up beyond them, of the
    same release, would be in by then. Not woken, a waiter looks again only in 3 s (its
    place's TTL, behind a writer) or at its wait's 5 s end."""
    wait_until(lambda: len(woke) >= count)
    time.sleep(max(0.0, since + 0.5 - time.monotonic()))
    return [moment - since for moment in woke]


def test_a_release_wakes_the_run_of_shared_waiters_at_the_head_and_no_one_else(
    postgres_url, stores
):
    holder, s1, s2, e3, s4 = (open_pg(postgres_url, stores) for _ in range(5))
    lease = granted(holder.acquire("k", 30, HOLDER, token()))
    for client, mode in ((s1, SHARED), (s2, SHARED), (e3, EXCLUSIVE), (s4, SHARED)):
        assert client.acquire("k", 30, HOLDER, token(), queue=True, mode=mode) is None
    woke = waiting_in_threads([s1, s2, e3, s4])
    assert woke == []
    released = time.monotonic()
    assert holder.release(lease) is True
    after = woken_after(woke, released, 2)
    assert len(after) == 2 and all(seconds < 1.2 for seconds in after), after


def test_a_waiter_leaving_wakes_the_shared_run_behind_it(postgres_url, stores):
    reader, writer, s1, s2 = (open_pg(postgres_url, stores) for _ in range(4))
    assert reader.acquire("k", 30, HOLDER, token(), mode=SHARED) is not None
    assert writer.acquire("k", 30, HOLDER, token(), queue=True) is None
    for client in (s1, s2):
        assert client.acquire("k", 30, HOLDER, token(), queue=True, mode=SHARED) is None
    woke = waiting_in_threads([s1, s2])  # behind the writer: they look again in 3 s
    assert woke == []
    left = time.monotonic()
    writer.stop_waiting("k")
    after = woken_after(woke, left, 2)
    assert len(after) == 2 and all(seconds < 1.2 for seconds in after), after


def test_a_superseded_waiter_is_woken_and_leaves(postgres_url, stores):
    holder, older, newer = (open_pg(postgres_url, stores) for _ in range(3))
    assert holder.acquire("k", 30, HOLDER, token()) is not None
    owner = token()
    assert older.acquire("k", 30, HOLDER, owner, queue=True, supersede=True) is None
    woke = waiting_in_threads([older])
    superseded = time.monotonic()
    assert newer.acquire("k", 30, HOLDER, token(), queue=True, supersede=True) is None
    after = woken_after(woke, superseded, 1)
    assert len(after) == 1 and after[0] < 1.2, after
    with pytest.raises(Superseded):
        older.acquire("k", 30, HOLDER, owner, queue=True, supersede=True)
    with pg.admin_connection(postgres_url) as conn:
        rows = conn.execute(f"SELECT owner_token FROM {fresh_waiters(postgres_url)}").fetchall()
    assert owner not in [row[0] for row in rows]  # its place is gone, marker and all


def test_a_call_does_not_load_hashlib(postgres_url):
    """hashlib (OpenSSL's libcrypto, ~11 M instructions) only for a schema's creation and a
    key too long for a notification, never a plain call."""
    from tasklock_cli.stores import open_store
    from tests.support.imports import loaded_after_a_call

    with open_store(postgres_url) as first:  # the table created (its advisory lock's id)
        first.peek("k")
    assert loaded_after_a_call(postgres_url, ["hashlib"]) == []
