"""``doctor`` on the MySQL/MariaDB store: reachability and round trip, the server, the
tables and procedures, the server's clock against ours, the replicas of this server and
what a failover to them keeps, and the table's failover epoch. It changes nothing
(nothing is created)."""

from __future__ import annotations

import time

from tasklock_cli.stores.doctor import closest_clock_offset
from tasklock_cli.stores.doctor import reachable_checks
from tasklock_cli.stores.doctor import server_clock_check
from tasklock_cli.stores.doctor import warning
from tasklock_cli.stores.failover import RECREATED
from tasklock_cli.stores.failover import RECREATED_CHANGE
from tasklock_cli.stores.failover import after_failover
from tasklock_cli.stores.failover import quarantine_length
from tasklock_cli.stores.model import StoreCheck
from tasklock_cli.stores.mysql.driver import pymysql
from tasklock_cli.stores.mysql.epochs import EPOCH_ROW
from tasklock_cli.stores.mysql.epochs import SERVER
from tasklock_cli.stores.mysql.epochs import describe_identity
from tasklock_cli.stores.mysql.schema import INSPECT
from tasklock_cli.stores.mysql.schema import MySQLSchema

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from tasklock_cli.stores.mysql.store import MySQLStore


def store_checks(store: MySQLStore) -> list[StoreCheck]:
    db, schema = store._db, store._schema  # the package's own parts
    checks, found = reachable_checks(
        db.display_url, lambda: db.run(lambda conn: _probe(conn, schema), ensure_schema=False)
    )
    if found is None:
        return checks
    version, read_only = found["server"]
    if read_only:
        detail = f"{version} is read-only (read_only = ON: a replica?); no lease is taken here"
        checks.append(StoreCheck("server", False, detail))
    else:
        checks.append(StoreCheck("server", True, version))
    checks.append(StoreCheck("schema", *found["schema"]))
    if not read_only:
        epoch = found["epoch"]
        length = quarantine_length(epoch[3] if epoch else None)
        checks.append(_replication_check(found["replication"], length))
        checks.append(_epoch_check(found["identity"], epoch, length))
    checks.append(server_clock_check(*found["clock"]))
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
        epoch = None
        if described[0] and "will be created" not in described[1]:
            cursor.execute(EPOCH_ROW.replace("{table}", schema.table_name))
            epoch = cursor.fetchone()
        return {
            "rtt": rtt,
            "server": (_server(version), bool(read_only)),
            "schema": described,
            "clock": closest_clock_offset(lambda: _server_clock(cursor)),
            "identity": _identity(cursor, version),
            "replication": _replication(cursor),
            "epoch": epoch,
        }


def _identity(cursor: Any, version: str) -> str:
    """This server's identity as the acquire procedure reads it (see epochs.IDENTITY)."""
    cursor.execute(SERVER)
    identity = str(cursor.fetchone()[0])
    if "mariadb" not in version.lower():
        cursor.execute("SELECT @@server_uuid")
        identity += f":{cursor.fetchone()[0]}"
    return identity


def _replication(cursor: Any) -> dict[str, Any]:
    """Durability and replication settings, the replicas connected to this server (None
    when the user may not see them) and whether this server replicates from another."""
    cursor.execute(SERVER)
    _, _, flush, log_bin = cursor.fetchone()
    cursor.execute("SHOW GLOBAL VARIABLES LIKE 'rpl_semi_sync_%'")
    settings = {_text(name).lower(): _text(value) for name, value in cursor.fetchall()}
    cursor.execute("SHOW GLOBAL STATUS LIKE 'Rpl_semi_sync_%clients'")
    clients = sum(int(value) for _, value in cursor.fetchall() if str(value).isdigit())
    replicas = None
    try:
        cursor.execute("SHOW SLAVE HOSTS")
        replicas = [f"server_id {_text(row[0])}" for row in cursor.fetchall()]
    except pymysql.err.MySQLError:  # needs REPLICATION MASTER ADMIN / REPLICATION SLAVE
        pass
    replicating = None
    try:
        cursor.execute("SHOW SLAVE STATUS")
        replicating = cursor.fetchone() is not None
    except pymysql.err.MySQLError:
        pass
    semi_sync = any(
        settings.get(name) == "ON"
        for name in ("rpl_semi_sync_master_enabled", "rpl_semi_sync_source_enabled")
    )
    return {
        "flush": int(flush),
        "log_bin": bool(log_bin),
        "semi_sync": semi_sync,
        "semi_sync_clients": clients,
        "replicas": replicas,
        "replicating": replicating,
    }


def _replication_check(found: dict[str, Any], length: float) -> StoreCheck:
    """What a crash of this server, or a failover to its replicas, keeps."""
    after = after_failover(length)
    if found["flush"] != 1:
        return warning(
            "replication",
            f"innodb_flush_log_at_trx_commit is {found['flush']}: a crash of the server can "
            "lose the last leases and tokens, and a restart starts no new epoch",
        )
    if found["replicating"]:
        return warning(
            "replication",
            "this server replicates from another (SHOW SLAVE STATUS) but is writable: "
            "point tasklock at the primary",
        )
    replicas = found["replicas"]
    if replicas is None:
        return warning(
            "replication",
            "the replicas of this server are not shown to this user (SHOW SLAVE HOSTS needs "
            f"REPLICATION MASTER ADMIN or REPLICATION SLAVE); {after}",
        )
    if not replicas:
        return StoreCheck("replication", True, "no replica is connected to this server")
    count = len(replicas)
    if found["semi_sync"] and found["semi_sync_clients"] >= count:
        return warning(
            "replication",
            f"{count} semi-synchronous replica(s) ({', '.join(replicas)}): a commit waits for "
            "one of them to have it, but falls back to asynchronous after "
            "rpl_semi_sync_master_timeout, so a promoted one may still lack the latest leases; "
            f"{after}",
        )
    listed = ", ".join(replicas)
    return warning(
        "replication",
        f"{count} replica(s) ({listed}), asynchronous: a promoted one may lack the latest "
        "leases and "
        f"tokens (their holders exit 70 at their next renewal); {after}",
    )


def _epoch_check(identity: str, epoch: tuple | None, length: float) -> StoreCheck:
    here = describe_identity(identity)
    if epoch is None:
        return StoreCheck("epoch", True, f"none recorded yet (the first acquire records {here})")
    number, recorded, previous, _, quarantine_left = epoch
    recorded = _text(recorded) if recorded is not None else None
    if recorded != identity:
        return warning(
            "epoch",
            f"epoch {number} was recorded on {describe_identity(recorded)}, this primary is "
            f"{here}: the next acquire starts a new epoch and a quarantine of {length:g}s",
        )
    if quarantine_left is not None and float(quarantine_left) > 0:
        previous = _text(previous) if previous is not None else None
        why = (
            RECREATED_CHANGE
            if previous == RECREATED
            else f"the primary changed from {describe_identity(previous)} to {here}"
        )
        return warning(
            "epoch",
            f"epoch {number} began when {why}: no new lease for {float(quarantine_left):.1f}s more",
        )
    return StoreCheck(
        "epoch",
        True,
        f"epoch {number} on {here}; a change of primary starts a quarantine of {length:g}s",
    )


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _server(version: str) -> str:
    return (
        f"MariaDB {version.split('-')[0]}" if "mariadb" in version.lower() else f"MySQL {version}"
    )


def _server_clock(cursor: Any) -> float:
    cursor.execute("SELECT UNIX_TIMESTAMP(SYSDATE(6))")
    return float(cursor.fetchone()[0])
