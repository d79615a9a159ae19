"""``doctor`` on the PostgreSQL store: reachability and round trip, primary or standby,
the table, the server's clock against ours, the standbys streaming from it and what a
failover to them keeps, and the table's failover epoch. It changes nothing (no table is
created)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.errors as pgerr
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tasklock_cli.stores.doctor import closest_clock_offset
from tasklock_cli.stores.doctor import reachable_checks
from tasklock_cli.stores.doctor import server_clock_check
from tasklock_cli.stores.doctor import warning
from tasklock_cli.stores.failover import after_failover
from tasklock_cli.stores.failover import quarantine_length
from tasklock_cli.stores.model import StoreCheck
from tasklock_cli.stores.postgres.connection import one_row
from tasklock_cli.stores.postgres.epochs import EPOCH_ROW
from tasklock_cli.stores.postgres.epochs import REPLICATION
from tasklock_cli.stores.postgres.epochs import SERVER_IDENTITY
from tasklock_cli.stores.postgres.epochs import describe_change
from tasklock_cli.stores.postgres.epochs import describe_identity
from tasklock_cli.stores.postgres.epochs import refusal
from tasklock_cli.stores.postgres.epochs import refused_function
from tasklock_cli.stores.postgres.schema import PgSchema

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.postgres.store import PostgresStore


def store_checks(store: PostgresStore) -> list[StoreCheck]:
    db, schema = store._db, store._schema  # the package's own parts
    checks, found = reachable_checks(
        db.display_url,
        lambda: db.run(lambda conn: _probe(conn, schema, db.scrub), ensure_schema=False),
    )
    if found is None:
        return checks
    version = found["version"]
    if found["standby"]:
        detail = (
            f"PostgreSQL {version} is a read-only standby; "
            "add target_session_attrs=read-write to the URL"
        )
        checks.append(StoreCheck("server", False, detail))
    else:
        checks.append(StoreCheck("server", True, f"PostgreSQL {version} (primary)"))
    checks.append(StoreCheck("schema", *found["schema"]))
    if not found["standby"]:
        epoch = found["epoch"]
        length = quarantine_length(epoch[5] if epoch else None)
        checks.append(_replication_check(found["replication"], length, _host_count(db)))
        checks.append(_durability_check(found["replication"][3]))
        if found["refused"]:
            checks.append(StoreCheck("epoch", False, found["refused"]))
        else:
            checks.append(_epoch_check(found["identity"], found["started"], epoch, length))
    checks.append(server_clock_check(*found["clock"]))
    return checks


def _probe(
    conn: psycopg.Connection, schema: PgSchema, scrub: Callable[[str], str]
) -> dict[str, Any]:
    sent = time.perf_counter()
    conn.execute("SELECT 1").fetchone()
    rtt = time.perf_counter() - sent
    version, standby = one_row(
        conn.execute("SELECT current_setting('server_version'), pg_is_in_recovery()")
    )
    described = schema.describe(conn)
    identity: object = None
    server_started: object = None
    replication: list | None = None
    epoch: tuple | None = None
    refused: str | None = None
    if not standby:
        replication = list(one_row(conn.execute(REPLICATION)))
        try:
            identity, server_started = one_row(conn.execute(SERVER_IDENTITY))
        except psycopg.Error as exc:
            name = refused_function(exc)
            if name is None:
                raise
            refused = refusal(name, scrub(str(exc)))
        if described[0]:  # a tasklock table, or none yet
            try:
                epoch = conn.execute(sql.SQL(EPOCH_ROW).format(table=schema.table)).fetchone()
            except pgerr.UndefinedTable:
                epoch = None
    return {
        "rtt": rtt,
        "version": version,
        "standby": standby,
        "schema": described,
        "clock": closest_clock_offset(lambda: _server_clock(conn)),
        "identity": identity,
        "started": server_started,
        "refused": refused,
        "replication": replication,
        "epoch": epoch,
    }


def _host_count(db: Any) -> int:
    try:
        hosts = conninfo_to_dict(db._conninfo).get("host") or ""
    except psycopg.Error:
        return 1
    return max(1, len(str(hosts).split(",")))


def _durability_check(fsync: object) -> StoreCheck:
    """Whether a crash of the machine keeps what the server committed (``fsync``)."""
    if fsync == "off":
        return warning(
            "durability",
            "fsync is off: a crash of the machine can lose committed leases, tokens and "
            "--once-per successes (or corrupt the database); the restart's crash recovery "
            "then quarantines new leases and tokens jump, but a lost success runs again",
        )
    return StoreCheck("durability", True, "fsync on: a commit survives a crash")


def _replication_check(replication: list, length: float, hosts: int) -> StoreCheck:
    """What a failover to the standbys streaming from this primary keeps."""
    sync_commit, sync_names, standbys, _ = replication
    after = after_failover(length)
    names = [str(name) for name, _, _ in standbys]
    states = {state for _, _, state in standbys}
    if sync_commit == "off":
        return warning(
            "replication",
            "synchronous_commit is off: a crash can lose the last leases and tokens, and "
            "after the crash of one server process PostgreSQL reinitialises without a new "
            "start, so no new epoch covers them",
        )
    if not standbys:
        if hosts > 1:
            return warning(
                "replication",
                f"the URL names {hosts} hosts but no standby streams from this primary: a "
                "promoted copy lacks the leases and tokens granted since it stopped "
                f"streaming; {after}",
            )
        return StoreCheck("replication", True, "no standby streams from this server")
    listed = ", ".join(names)
    if None in states:
        return warning(
            "replication",
            f"{len(standbys)} standby(s) stream from this primary; whether they are "
            "synchronous is shown only to roles with pg_monitor",
        )
    waits = sync_commit in ("on", "remote_write", "remote_apply")
    # (quorum: a commit waits for some of them, so any one of them may lack it)
    unconfirmed = [
        f"{name} ({state})"
        for name, (_, _, state) in zip(names, standbys, strict=True)
        if state != "sync"
    ]
    if unconfirmed or not waits:
        why = (
            f"standby(s) not synchronous: {', '.join(unconfirmed)}"
            if unconfirmed
            else f"synchronous_commit is {sync_commit}"
        )
        return warning(
            "replication",
            f"{why}: a promoted one may lack the latest leases and tokens (their holders "
            f"exit 70 at their next renewal); {after}",
        )
    return StoreCheck(
        "replication",
        True,
        f"synchronous standby(s) {listed} (synchronous_commit {sync_commit}, "
        f"synchronous_standby_names '{sync_names}'): a promoted one has "
        f"every lease granted, whose holders run on; {after}",
    )


def _epoch_check(
    identity: object, started: object, epoch: tuple | None, length: float
) -> StoreCheck:
    here = describe_identity(identity, started)
    if epoch is None:
        return StoreCheck("epoch", True, f"none recorded yet (the first acquire records {here})")
    number, recorded, recorded_start, previous, previous_start, _, quarantine_left = epoch
    if recorded != identity or recorded_start not in (started, None):
        return warning(
            "epoch",
            f"epoch {number} was recorded on {describe_identity(recorded, recorded_start)}, "
            f"this primary is {here}: the next acquire starts a new epoch and a quarantine "
            f"of {length:g}s",
        )
    if quarantine_left is not None and quarantine_left > 0:
        return warning(
            "epoch",
            f"epoch {number} began when {describe_change(previous, previous_start, identity)}: "
            f"no new lease for {quarantine_left:.1f}s more",
        )
    return StoreCheck(
        "epoch",
        True,
        f"epoch {number} on {here}; a change of primary or a restart starts a quarantine of "
        f"{length:g}s",
    )


def _server_clock(conn: psycopg.Connection) -> float:
    return float(one_row(conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8"))[0])
