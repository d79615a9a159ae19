"""``doctor`` on the MySQL/MariaDB store: reachability and round trip, the server, the
tables and procedures, the server's clock against ours. It changes nothing (nothing is
created)."""

from __future__ import annotations

import time

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.doctor import clock_check
from tasklock_cli.stores.model import StoreCheck
from tasklock_cli.stores.mysql.driver import pymysql
from tasklock_cli.stores.mysql.schema import INSPECT
from tasklock_cli.stores.mysql.schema import MySQLSchema

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from tasklock_cli.stores.mysql.store import MySQLStore


def store_checks(store: MySQLStore) -> list[StoreCheck]:
    db, schema = store._db, store._schema  # the package's own parts
    checks = [StoreCheck("store", True, db.display_url)]
    try:
        found = db.run(lambda conn: _probe(conn, schema), ensure_schema=False)
    except TasklockError as exc:
        checks.append(StoreCheck("reachable", False, str(exc)))
        return checks
    rtt_ms = found["rtt"] * 1000
    checks.append(StoreCheck("reachable", True, f"SELECT 1 round trip {rtt_ms:.1f} ms"))
    version, read_only = found["server"]
    if read_only:
        checks.append(StoreCheck("server", False, f"{version} is read-only (read_only = ON)"))
    else:
        checks.append(StoreCheck("server", True, version))
    ok, detail = found["schema"]
    checks.append(StoreCheck("schema", ok, detail))
    offset, elapsed = found["clock"]
    checks.append(
        clock_check("the server's", offset, elapsed / 2, "the server's clock decides expiry")
    )
    return checks


def _probe(conn: pymysql.connections.Connection, schema: MySQLSchema) -> dict[str, Any]:
    with conn.cursor() as cursor:
        started = time.perf_counter()
        cursor.execute("SELECT 1")
        cursor.fetchall()
        rtt = time.perf_counter() - started
        cursor.execute("SELECT VERSION(), @@read_only")
        version, read_only = cursor.fetchone()
        cursor.execute(INSPECT, schema.inspection_params())
        described = schema.describe(cursor.fetchall())
        return {
            "rtt": rtt,
            "server": (_server(version), bool(read_only)),
            "schema": described,
            "clock": _clock_offset(cursor),
        }


def _server(version: str) -> str:
    return (
        f"MariaDB {version.split('-')[0]}" if "mariadb" in version.lower() else f"MySQL {version}"
    )


def _clock_offset(cursor: Any) -> tuple[float, float]:
    """(server clock - ours, round trip) in seconds: the sample of three with the shortest
    round trip."""
    best: tuple[float, float] | None = None
    for _ in range(3):
        before, started = time.time(), time.perf_counter()
        cursor.execute("SELECT UNIX_TIMESTAMP(SYSDATE(6))")
        server = cursor.fetchone()[0]
        elapsed = time.perf_counter() - started
        offset = float(server) - (before + elapsed / 2)
        if best is None or elapsed < best[1]:
            best = (offset, elapsed)
    assert best is not None
    return best
