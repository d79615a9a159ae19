"""What each store's driver does raw, beside tasklock: the bench's baselines (section 2's
"raw round trip" and "raw write" rows, the bulk fills of sections 3 and 6). One function
per store and baseline, chosen by the store's registry name; a store without its own
baseline has none (``raw_write``: None), and the bench says so.

These are measurements of drivers, not provisioning: how the bench reaches a store (its
URL, its server, its cleanup) is the store package's (``bench.stores``)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from bench.etcd_member import Gateway
from bench.etcd_member import b64
from bench.etcd_member import etcdctl_prefix
from bench.harness import HOLDER
from bench.harness import RUN_ID
from tasklock_cli.stores.registry import provisioning

if TYPE_CHECKING:
    from bench.stores import StoreKind

RAW_WRITE = "UPDATE {table} SET v = v + 1 WHERE k = 'a'"
#: The SQLite store's per-connection setting (not observable from another connection;
#: journal_mode is, since WAL is kept in the file).
SQLITE_SYNCHRONOUS = "NORMAL"
#: The servers the bench's SQL and Redis baselines talk to: the stores' own (their
#: provisioning's ``url_env``, else the default).
POSTGRES_BASE = provisioning("postgres").base_url()
REDIS_BASE = provisioning("redis").base_url()
MYSQL_BASE = provisioning("mysql").base_url()

Op = Callable[[], object]
Closer = Callable[[], None]


def raw_ping(kind: StoreKind, namespace: str) -> tuple[Op, Closer]:
    """The driver's own cheapest round trip against the same server/file, and a closer."""
    pings: dict[str, Callable[[StoreKind, str], tuple[Op, Closer]]] = {
        "sqlite": _sqlite_ping,
        "redis": _redis_ping,
        "etcd": _etcd_ping,
        "mysql": _mysql_ping,
        "postgres": _postgres_ping,
    }
    if kind.name not in pings:
        raise ValueError(f"no raw baseline for {kind.name}")
    return pings[kind.name](kind, namespace)


def _sqlite_ping(kind: StoreKind, namespace: str) -> tuple[Op, Closer]:
    conn = sqlite3.connect(kind.workdir / f"{namespace}.db", isolation_level=None)
    return (lambda: conn.execute("SELECT 1").fetchone()), conn.close


def _redis_ping(kind: StoreKind, namespace: str) -> tuple[Op, Closer]:
    import redis

    client = redis.Redis.from_url(REDIS_BASE)
    return client.ping, client.close


def _etcd_ping(kind: StoreKind, namespace: str) -> tuple[Op, Closer]:
    gateway = Gateway(kind.member().client_port)
    key = {"key": b64(f"{etcdctl_prefix(namespace)}ping".encode())}
    return (lambda: gateway.post("/v3/kv/range", key)), gateway.close


def _mysql_ping(kind: StoreKind, namespace: str) -> tuple[Op, Closer]:
    conn = mysql_connect()
    return (lambda: mysql_query(conn, "SELECT 1")), conn.close


def _postgres_ping(kind: StoreKind, namespace: str) -> tuple[Op, Closer]:
    import psycopg

    pg = psycopg.connect(POSTGRES_BASE, autocommit=True)
    return (lambda: pg.execute("SELECT 1").fetchone()), pg.close


def raw_write(kind: StoreKind, namespace: str, options: str = "") -> tuple[Op, Closer, str] | None:
    """The cheapest durable write beside the store, on its own connection: (op, closer,
    synchronous_commit seen), or None (Redis, and a store without one). SQL: a one-row
    autocommit UPDATE of a scratch table (SQLite: a separate file with the store file's
    journal_mode and the store's synchronous setting); etcd: a put of one key."""
    if kind.name == "sqlite":
        return _sqlite_write(kind, namespace)
    if kind.name == "etcd":
        gateway = Gateway(kind.member().client_port)
        put = {"key": b64(f"{etcdctl_prefix(namespace)}scratch".encode()), "value": "MQ=="}
        return (lambda: gateway.post("/v3/kv/put", put)), gateway.close, ""
    if kind.name == "mysql":
        return _mysql_write(namespace)
    if kind.name == "postgres":
        return _postgres_write(namespace, options)
    return None


def _postgres_write(namespace: str, options: str) -> tuple[Op, Closer, str]:
    import psycopg

    from tasklock_cli.stores.postgres.connection import one_row

    table = f"tlbench_{RUN_ID}_{namespace}_scratch"
    pg = psycopg.connect(POSTGRES_BASE + (f"?{options}" if options else ""), autocommit=True)
    pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v bigint NOT NULL)")
    pg.execute(f"INSERT INTO {table} VALUES ('a', 0)")
    setting = str(one_row(pg.execute("SHOW synchronous_commit"))[0])
    update = RAW_WRITE.format(table=table)

    def close() -> None:
        with contextlib.suppress(Exception):
            pg.execute(f"DROP TABLE IF EXISTS {table}")
        pg.close()

    return (lambda: pg.execute(update)), close, setting


def _mysql_write(namespace: str) -> tuple[Op, Closer, str]:
    """A one-row autocommit UPDATE of an InnoDB scratch table (the store's engine)."""
    table = f"tlbench_{RUN_ID}_{namespace}_scratch"
    conn = mysql_connect()
    mysql_query(conn, f"CREATE TABLE {table} (k VARCHAR(8) PRIMARY KEY, v BIGINT NOT NULL)")
    mysql_query(conn, f"INSERT INTO {table} VALUES ('a', 0)")
    update = RAW_WRITE.format(table=table)

    def close() -> None:
        with contextlib.suppress(Exception):
            mysql_query(conn, f"DROP TABLE IF EXISTS {table}")
        conn.close()

    return (lambda: mysql_query(conn, update)), close, ""


def _sqlite_write(kind: StoreKind, namespace: str) -> tuple[Op, Closer, str]:
    pragmas = sqlite_pragmas(kind.workdir / "roundtrip.db")
    conn = sqlite3.connect(kind.workdir / f"{namespace}-scratch.db", isolation_level=None)
    for name, value in pragmas.items():
        conn.execute(f"PRAGMA {name}={value}")
    conn.execute("CREATE TABLE scratch (k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID")
    conn.execute("INSERT INTO scratch VALUES ('a', 0)")
    update = RAW_WRITE.format(table="scratch")
    return (lambda: conn.execute(update)), conn.close, ""


def sqlite_pragmas(path: Path) -> dict[str, str]:
    """journal_mode as the store left it in its file, and the store's synchronous setting."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()
    return {"journal_mode": mode, "synchronous": SQLITE_SYNCHRONOUS}


def mysql_connect() -> Any:
    """A raw PyMySQL autocommit connection to the bench's MySQL database."""
    import pymysql

    from tasklock_cli.stores.mysql.connection import parse_url

    kwargs, _ = parse_url(MYSQL_BASE, MYSQL_BASE)
    return pymysql.connect(**kwargs, autocommit=True)


def mysql_query(conn: Any, statement: str, args: object = None) -> list[tuple]:
    with conn.cursor() as cursor:
        cursor.execute(statement, args)
        return list(cursor.fetchall())


def redis_prefix(kind: StoreKind, namespace: str) -> str:
    return kind.url(namespace).split("prefix=", 1)[1]


def postgres_batch_insert(
    table: str,
    names: list[str],
    ttl: float,
    age: float = 0.0,
    per_statement: int = 10_000,
    one_transaction: bool = False,
) -> None:
    """Rows shaped exactly as PostgresStore.acquire writes them (one clock reading per row,
    taken ``age`` seconds back: slot 0 of limit 1, and the key's counter row, slot -1),
    ``per_statement`` keys per statement; autocommit, or all in one transaction."""
    import psycopg
    from psycopg.types.json import Jsonb

    statement = f"""
        INSERT INTO {table}
               (key, slot, slot_limit, fencing_token, owner_token, holder, acquired_at,
                expires_at)
        SELECT k, s.slot, 1 + s.slot, 1, CASE WHEN s.slot = 0 THEN md5(k) END,
               CASE WHEN s.slot = 0 THEN %(holder)s END,
               CASE WHEN s.slot = 0 THEN t END,
               CASE WHEN s.slot = 0 THEN t + %(ttl)s * interval '1 second' END
        FROM (SELECT k, clock_timestamp() - %(age)s * interval '1 second' AS t
                FROM unnest(%(keys)s::text[]) AS k) AS n
        CROSS JOIN (VALUES (-1), (0)) AS s(slot)"""
    params = {"holder": Jsonb(HOLDER.to_dict()), "ttl": ttl, "age": age}
    with (
        psycopg.connect(POSTGRES_BASE, autocommit=True) as conn,
        conn.transaction() if one_transaction else contextlib.nullcontext(),
    ):
        for start in range(0, len(names), per_statement):
            conn.execute(statement, {**params, "keys": names[start : start + per_statement]})
