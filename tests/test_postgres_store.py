"""PostgreSQL-only behaviour beyond the shared contract."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from tasklock_cli.errors import ConfigError, LeaseLost, StoreUnavailable
from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Holder
from tests.support import pg, services

HOLDER = Holder(host="h", pid=1, user="u", command=["job"])


@pytest.fixture(autouse=True)
def _postgres():
    services.require("postgres")


@pytest.fixture
def table():
    name = f"tasklock_pgtest_{uuid.uuid4().hex[:10]}"
    yield name
    pg.drop_namespace(services.postgres_url(name))


def raw():
    import psycopg

    return psycopg.connect(services.base_postgres_url(), autocommit=True)


def token() -> str:
    return uuid.uuid4().hex


def test_table_from_url_and_print_sql_is_valid_ddl(table):
    with open_store(services.postgres_url(table)) as store:
        ddl = store.schema_sql()
        assert f"CREATE TABLE IF NOT EXISTS {table}" in ddl
        assert store.acquire("k", 30, HOLDER, token()) is not None
    other = table + "_ddl"
    try:
        with raw() as conn:
            conn.execute(ddl.replace(table, other))
            conn.execute(ddl.replace(table, other))  # idempotent
    finally:
        pg.drop_namespace(services.postgres_url(other))


def test_schema_qualified_table(table):
    schema = f"s_{table}"
    with raw() as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        with open_store(services.postgres_url(f"{schema}.{table}")) as store:
            lease = store.acquire("k", 30, HOLDER, token())
            assert lease is not None and store.peek("k").fencing_token == lease.fencing_token
        with raw() as conn:
            rows = conn.execute(f"SELECT key FROM {schema}.{table}").fetchall()
        assert rows == [("k",)]
    finally:
        with raw() as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.mark.parametrize("name", ["bad-name", "a.b.c", "x; DROP TABLE y", ""])
def test_invalid_table_names_are_config_errors(name):
    with pytest.raises(ConfigError):
        open_store(services.postgres_url(name))


def test_racing_first_use_creates_the_schema_once(table):
    errors, barrier = [], threading.Barrier(8)

    def first_use():
        barrier.wait()
        try:
            with open_store(services.postgres_url(table)) as store:
                store.peek("k")
        except Exception as exc:  # the test reports whatever escaped
            errors.append(exc)

    threads = [threading.Thread(target=first_use) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_foreign_table_of_the_same_name_is_refused_untouched(table):
    with raw() as conn:
        conn.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, payload text)")
        conn.execute(f"INSERT INTO {table} VALUES (1, 'keep me')")
    with (
        pytest.raises(ConfigError, match="not a tasklock table"),
        open_store(services.postgres_url(table)) as store,
    ):
        store.acquire("k", 30, HOLDER, token())
    with raw() as conn:
        assert conn.execute(f"SELECT payload FROM {table}").fetchall() == [("keep me",)]


def test_contention_raises_nothing_and_never_two_holders(table):
    url = services.postgres_url(table)
    open_store(url).close()
    holders, tokens, failures = [], [], []
    lock = threading.Lock()

    def worker():
        with open_store(url) as store:
            for _ in range(40):
                try:
                    lease = store.acquire("hot", 30, HOLDER, token())
                    if lease is None:
                        continue
                    with lock:
                        holders.append(1)
                        assert len(holders) == 1, "two holders at once"
                        tokens.append(lease.fencing_token)
                        holders.pop()
                    assert store.release(lease)
                except Exception as exc:
                    failures.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    assert tokens and tokens == sorted(tokens) and len(set(tokens)) == len(tokens)


def test_waiter_wakes_on_release_not_on_its_timeout(table):
    url = services.postgres_url(table)
    with open_store(url) as holder, open_store(url) as waiter:
        lease = holder.acquire("k", 30, HOLDER, token())
        assert waiter.acquire("k", 30, HOLDER, token()) is None
        threading.Timer(0.2, holder.release, args=(lease,)).start()
        started = time.monotonic()
        waiter.wait_for_release("k", 5.0)
        woke_after = time.monotonic() - started
        assert 0.15 < woke_after < 2.0
        assert waiter.acquire("k", 30, HOLDER, token()) is not None


def test_terminated_backend_reconnects(table):
    with open_store(services.postgres_url(table)) as store:
        lease = store.acquire("k", 30, HOLDER, token())
        with raw() as conn:
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE application_name = 'tasklock' AND pid <> pg_backend_pid()"
            )
        try:
            store.renew(lease, 30)
        except StoreUnavailable:
            store.renew(lease, 30)  # the next call reconnects
        assert store.peek("k").fencing_token == lease.fencing_token


@pytest.mark.slow
def test_private_server_restart_while_held():
    with pg.private_postgres() as server, open_store(server.url) as store:
        store.set_io_timeout(1)
        lease = store.acquire("k", 30, HOLDER, token())
        server.restart()
        for _ in range(3):
            try:
                store.renew(lease, 30)
                break
            except StoreUnavailable:
                time.sleep(0.2)
        else:
            pytest.fail("renewal never succeeded after the restart")
        assert store.peek("k").fencing_token == lease.fencing_token
        server.stop("immediate")
        with pytest.raises(StoreUnavailable):
            store.renew(lease, 30)


@pytest.mark.slow
def test_wrong_password_is_a_config_error_without_the_password():
    with pg.private_postgres(password="right-pw") as server:
        good = open_store(server.url)
        good.peek("k")
        good.close()
        bad_url = server.url.replace("right-pw", "wrong-pw-123")
        with pytest.raises(ConfigError) as error:
            open_store(bad_url).peek("k")
        assert "wrong-pw-123" not in str(error.value)
        assert "***" in str(error.value)


def test_unreachable_port_fails_fast():
    store = open_store("postgresql://127.0.0.1:1/test")
    store.set_io_timeout(1)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.peek("k")
    assert time.monotonic() - started < 3


def test_renew_after_expiry_on_the_server_clock_is_rejected(table):
    with open_store(services.postgres_url(table)) as store:
        lease = store.acquire("k", 0.3, HOLDER, token())
        time.sleep(0.5)
        with pytest.raises(LeaseLost):
            store.renew(lease, 30)
