"""The stores under test: URLs of private namespaces, raw baselines beside them, the
bench's own etcd member, and cleaning up."""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.etcd_member import EtcdMember
from bench.etcd_member import Gateway
from bench.etcd_member import b64
from bench.harness import HOLDER
from bench.harness import RUN_ID
from tasklock_cli.stores import open_store
from tasklock_cli.stores.registry import STORE_PACKAGES

REDIS_BASE = "redis://127.0.0.1:6379/0"
POSTGRES_BASE = "postgresql://127.0.0.1:5432/test"
MYSQL_BASE = "mysql://root@127.0.0.1:3306/test"
#: PyMySQL's connect arguments for MYSQL_BASE (the bench's own raw connections).
MYSQL_CONNECT = {"host": "127.0.0.1", "port": 3306, "user": "root", "database": "test"}
ALL_STORES = ("sqlite", "redis", "postgres", "etcd", "mysql")
RAW_WRITE = "UPDATE {table} SET v = v + 1 WHERE k = 'a'"
#: The SQLite store's per-connection setting (not observable from another connection;
#: journal_mode is, since WAL is kept in the file).
SQLITE_SYNCHRONOUS = "NORMAL"


@dataclass
class StoreKind:
    """One backend: how to name a private namespace on it, ping it raw, and clean it up."""

    name: str
    workdir: Path
    reason: str | None = None
    etcd: EtcdMember | None = None

    def url(self, namespace: str) -> str:
        if self.name == "sqlite":
            return f"sqlite:///{self.workdir / f'{namespace}.db'}"
        if self.name == "redis":
            return f"{REDIS_BASE}?prefix=tlbench:{RUN_ID}:{namespace}:"
        if self.name == "etcd":
            return self.member().url(f"{self.etcd_prefix(namespace)}")
        if self.name == "mysql":
            return f"{MYSQL_BASE}?table=tlbench_{RUN_ID}_{namespace}"
        return f"{POSTGRES_BASE}?table=tlbench_{RUN_ID}_{namespace}"

    def member(self) -> EtcdMember:
        if self.etcd is None:
            raise RuntimeError("no etcd member")
        return self.etcd

    @staticmethod
    def etcd_prefix(namespace: str = "") -> str:
        return f"tlbench/{RUN_ID}/" + (f"{namespace}/" if namespace else "")

    def raw_ping(self, namespace: str) -> tuple[Callable[[], object], Callable[[], None]]:
        """The driver's own cheapest round trip against the same server/file, and a closer."""
        if self.name == "sqlite":
            conn = sqlite3.connect(self.workdir / f"{namespace}.db", isolation_level=None)
            return (lambda: conn.execute("SELECT 1").fetchone()), conn.close
        if self.name == "redis":
            import redis

            client = redis.Redis.from_url(REDIS_BASE)
            return client.ping, client.close
        if self.name == "etcd":
            gateway = Gateway(self.member().client_port)
            key = {"key": b64(f"{self.etcd_prefix(namespace)}ping".encode())}
            return (lambda: gateway.post("/v3/kv/range", key)), gateway.close
        if self.name == "mysql":
            conn = mysql_connect()
            return (lambda: mysql_query(conn, "SELECT 1")), conn.close
        import psycopg

        pg = psycopg.connect(POSTGRES_BASE, autocommit=True)
        return (lambda: pg.execute("SELECT 1").fetchone()), pg.close

    def raw_write(
        self, namespace: str, options: str = ""
    ) -> tuple[Callable[[], object], Callable[[], None], str] | None:
        """The cheapest durable write beside the store, on its own connection: (op, closer,
        synchronous_commit seen), or None (Redis). SQL: a one-row autocommit UPDATE of a
        scratch table (SQLite: a separate file with the store file's journal_mode and the
        store's synchronous setting); etcd: a put of one key."""
        if self.name == "redis":
            return None
        if self.name == "sqlite":
            return self.sqlite_write(namespace)
        if self.name == "etcd":
            gateway = Gateway(self.member().client_port)
            put = {"key": b64(f"{self.etcd_prefix(namespace)}scratch".encode()), "value": "MQ=="}
            return (lambda: gateway.post("/v3/kv/put", put)), gateway.close, ""
        if self.name == "mysql":
            return self.mysql_write(namespace)
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

    def mysql_write(self, namespace: str) -> tuple[Callable[[], object], Callable[[], None], str]:
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

    def sqlite_write(self, namespace: str) -> tuple[Callable[[], object], Callable[[], None], str]:
        pragmas = sqlite_pragmas(self.workdir / "roundtrip.db")
        conn = sqlite3.connect(self.workdir / f"{namespace}-scratch.db", isolation_level=None)
        for name, value in pragmas.items():
            conn.execute(f"PRAGMA {name}={value}")
        conn.execute("CREATE TABLE scratch (k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID")
        conn.execute("INSERT INTO scratch VALUES ('a', 0)")
        update = RAW_WRITE.format(table="scratch")
        return (lambda: conn.execute(update)), conn.close, ""

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            if self.name == "redis":
                _drop_redis_namespace()
            elif self.name == "postgres":
                _drop_postgres_tables()
            elif self.name == "mysql":
                _drop_mysql_tables()
            elif self.name == "etcd" and self.etcd is not None:
                self.etcd.stop()


def sqlite_pragmas(path: Path) -> dict[str, str]:
    """journal_mode as the store left it in its file, and the store's synchronous setting."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()
    return {"journal_mode": mode, "synchronous": SQLITE_SYNCHRONOUS}


def _drop_redis_namespace(namespace: str = "") -> None:
    import redis

    client = redis.Redis.from_url(REDIS_BASE)
    batch: list[bytes] = []
    pattern = f"tlbench:{RUN_ID}:{f'{namespace}:' if namespace else ''}*"
    for name in client.scan_iter(match=pattern, count=10_000):
        batch.append(name)
        if len(batch) >= 5000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)
    client.close()


def _drop_postgres_tables() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_BASE, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE tablename LIKE %s",
            (f"tlbench\\_{RUN_ID}\\_%",),
        ).fetchall()
        for schema, table in rows:
            conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(schema, table))
            )


def mysql_connect() -> Any:
    """A raw PyMySQL autocommit connection to the bench's MySQL database."""
    import pymysql

    return pymysql.connect(**MYSQL_CONNECT, autocommit=True)


def mysql_query(conn: Any, statement: str, args: object = None) -> list[tuple]:
    with conn.cursor() as cursor:
        cursor.execute(statement, args)
        return list(cursor.fetchall())


def _drop_mysql_tables() -> None:
    """Every table the run made (the stores' and the scratch ones), and the stores'
    procedures (named after their tables)."""
    conn = mysql_connect()
    try:
        pattern = f"tlbench\\_{RUN_ID}\\_%"
        routines = mysql_query(
            conn,
            "SELECT routine_name FROM information_schema.routines"
            " WHERE routine_schema = DATABASE() AND routine_name LIKE %s",
            (pattern,),
        )
        for (name,) in routines:
            mysql_query(conn, f"DROP PROCEDURE IF EXISTS `{name}`")
        tables = mysql_query(
            conn,
            "SELECT table_name FROM information_schema.tables"
            " WHERE table_schema = DATABASE() AND table_name LIKE %s",
            (pattern,),
        )
        for (name,) in tables:
            mysql_query(conn, f"DROP TABLE IF EXISTS `{name}`")
    finally:
        conn.close()


def floor_imports(kind: StoreKind) -> str:
    """The modules a `tasklock run` on this store needs, as one import statement: the store
    module of its registry package (``tasklock_cli.stores.registry.STORE_PACKAGES``), the
    run machinery and the fast parser (``cli.entry`` itself imports nothing at its top)."""
    if kind.name not in STORE_PACKAGES:
        raise ValueError(f"{kind.name} is not a store package ({', '.join(STORE_PACKAGES)})")
    store = f"tasklock_cli.stores.{kind.name}.store"  # (its package is lazy)
    return f"import tasklock_cli.cli.fastrun, tasklock_cli.run.supervisor, {store}"


def probe_store(kind: StoreKind) -> str | None:
    """None when the store can be benchmarked here, else why not."""
    try:
        ping, close = kind.raw_ping("probe")
        ping()
        close()
        with open_store(kind.url("probe")) as store:
            store.peek("probe")
    except Exception as exc:
        return f"{kind.name} not usable ({type(exc).__name__}: {exc})"
    return None


def start_etcd(kind: StoreKind) -> str | None:
    """Start the bench's own etcd member for ``kind``; None, or why there is none."""
    binary = shutil.which("etcd")
    if binary is None:
        return "no etcd binary on PATH"
    member = EtcdMember(binary)
    try:
        member.start()
    except (OSError, RuntimeError) as exc:
        member.stop()
        return f"the private etcd member did not start ({exc})"
    kind.etcd = member
    return None


def make_stores(names: Sequence[str], workdir: Path) -> list[StoreKind]:
    kinds = [StoreKind(name, workdir) for name in names]
    for kind in kinds:
        kind.reason = start_etcd(kind) if kind.name == "etcd" else None
        kind.reason = kind.reason or probe_store(kind)
    return kinds


def drop_namespace(kind: StoreKind, namespace: str) -> None:
    """Remove one namespace's leases now (the run-wide cleanup would get them only at exit)."""
    if kind.name == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                (kind.workdir / f"{namespace}.db{suffix}").unlink()
    elif kind.name == "redis":
        _drop_redis_namespace(namespace)
    elif kind.name == "etcd":
        kind.member().drop_prefix(kind.etcd_prefix(namespace))
    elif kind.name == "mysql":
        _drop_mysql_namespace(namespace)
    else:
        import psycopg

        with psycopg.connect(POSTGRES_BASE, autocommit=True) as conn:
            for suffix in ("", "_runs", "_waiters"):  # the leases, the ledger, the queues
                conn.execute(f"DROP TABLE IF EXISTS tlbench_{RUN_ID}_{namespace}{suffix}")


def _drop_mysql_namespace(namespace: str) -> None:
    """One store's tables and procedures (the names the mysql store gives them)."""
    table = f"tlbench_{RUN_ID}_{namespace}"
    conn = mysql_connect()
    try:
        for procedure in ("acquire", "release", "break", "force", "wake", "wake_queue"):
            mysql_query(conn, f"DROP PROCEDURE IF EXISTS `{table}_{procedure}`")
        for suffix in ("", "_runs", "_waiters"):
            mysql_query(conn, f"DROP TABLE IF EXISTS `{table}{suffix}`")
    finally:
        conn.close()


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
