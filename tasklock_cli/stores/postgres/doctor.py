"""``doctor`` on the PostgreSQL store: reachability and round trip, primary or standby,
the table, the server's clock against ours. It changes nothing (no table is created)."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.doctor import clock_check
from tasklock_cli.stores.model import StoreCheck
from tasklock_cli.stores.postgres.connection import one_row
from tasklock_cli.stores.postgres.schema import PgSchema

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.postgres.store import PostgresStore


def store_checks(store: PostgresStore) -> list[StoreCheck]:
    db, schema = store._db, store._schema  # the package's own parts
    checks = [StoreCheck("store", True, db.display_url)]
    try:
        found = db.run(lambda conn: _probe(conn, schema), ensure_schema=False)
    except TasklockError as exc:
        checks.append(StoreCheck("reachable", False, str(exc)))
        return checks
    rtt_ms = found["rtt"] * 1000
    checks.append(StoreCheck("reachable", True, f"SELECT 1 round trip {rtt_ms:.1f} ms"))
    version = found["version"]
    if found["standby"]:
        detail = (
            f"PostgreSQL {version} is a read-only standby; "
            "add target_session_attrs=read-write to the URL"
        )
        checks.append(StoreCheck("server", False, detail))
    else:
        checks.append(StoreCheck("server", True, f"PostgreSQL {version} (primary)"))
    ok, detail = found["schema"]
    checks.append(StoreCheck("schema", ok, detail))
    offset, elapsed = found["clock"]
    checks.append(
        clock_check("the server's", offset, elapsed / 2, "the server's clock decides expiry")
    )
    return checks


def _probe(conn: psycopg.Connection, schema: PgSchema) -> dict[str, Any]:
    started = time.perf_counter()
    conn.execute("SELECT 1").fetchone()
    rtt = time.perf_counter() - started
    version, standby = one_row(
        conn.execute("SELECT current_setting('server_version'), pg_is_in_recovery()")
    )
    return {
        "rtt": rtt,
        "version": version,
        "standby": standby,
        "schema": schema.describe(conn),
        "clock": _clock_offset(conn),
    }


def _clock_offset(conn: psycopg.Connection) -> tuple[float, float]:
    """(server clock - ours, round trip) in seconds: the sample of three with the shortest
    round trip."""
    best: tuple[float, float] | None = None
    for _ in range(3):
        before, started = time.time(), time.perf_counter()
        query = "SELECT extract(epoch FROM clock_timestamp())::float8"
        server = one_row(conn.execute(query))[0]
        elapsed = time.perf_counter() - started
        offset = float(server) - (before + elapsed / 2)
        if best is None or elapsed < best[1]:
            best = (offset, elapsed)
    assert best is not None
    return best
