"""A PostgreSQL failover with the real `tasklock`: a private primary and a standby streaming
from it, the primary SIGKILLed while a holder's command runs, the standby promoted; clients
use a multi-host URL (primary, standby) with ``target_session_attrs=read-write``.

Async: the replication link is muted before the holder acquires, so the promoted standby
never heard of its lease or its token. The failover epoch keeps every new holder out until
the holder's lease could no longer be valid (the quarantine), and the tokens after the
failover are above every token before it. Sync: the holder's lease survives the promotion
and it runs to the end; the waiter runs after it.

Each run's command writes a marker file (see tests/support/failover.py), so overlaps are
measured, not assumed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import report
from tests.support.cli import json_events
from tests.support.cli import wait_until
from tests.support.failover import KEY
from tests.support.failover import Runs
from tests.support.failover import assert_lost_holder_fenced
from tests.support.failover import assert_one_at_a_time
from tests.support.failover import long_ttl_holder_fenced
from tests.support.pg import PrivatePostgres
from tests.support.pg import pg_bin_dir
from tests.support.pg import private_postgres_unavailable
from tests.support.pg_replication import Backup
from tests.support.pg_replication import ReplicatedPostgres
from tests.support.pg_replication import replicated_postgres
from tests.support.pg_replication import template_data
from tests.support.services import in_ci

pytestmark = [pytest.mark.slow, pytest.mark.waits]


def _unavailable() -> str | None:
    reason = private_postgres_unavailable()
    if reason is None and not (pg_bin_dir() / "pg_basebackup").is_file():  # type: ignore[operator]
        reason = "no pg_basebackup beside initdb"
    return reason


@pytest.fixture(scope="module")
def template() -> Iterator[Path]:
    """One initdb for the module: each test's primary is a copy of it."""
    reason = _unavailable()
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI=true but a private PostgreSQL pair cannot be started: {reason}")
        pytest.skip(reason)
    server = template_data()
    try:
        yield server.data
    finally:
        server.destroy()


def epoch_row(server: PrivatePostgres, table: str) -> tuple[int, float]:
    """(epoch, quarantine length in seconds) of the table's epoch row on ``server``."""
    with server.connection() as conn:
        epoch, length = conn.execute(
            f"SELECT fencing_token, extract(epoch FROM expires_at - acquired_at)::float8"
            f" FROM {table} WHERE key = '' AND slot = -2"
        ).fetchone()
    return int(epoch), float(length or 0.0)


def holders_on(server: PrivatePostgres, table: str) -> list[int]:
    """The tokens of the live leases on KEY as ``server`` (a standby too) has them."""
    with server.connection() as conn:
        rows = conn.execute(
            f"SELECT fencing_token FROM {table} WHERE key = %s AND slot >= 0"
            " AND owner_token IS NOT NULL AND expires_at > clock_timestamp()",
            [KEY],
        ).fetchall()
    return [row[0] for row in rows]


def kill_and_promote(pair: ReplicatedPostgres) -> tuple[float, float]:
    """SIGKILL the primary, promote the standby: (when killed, when promoted), time.time()."""
    killed_at = time.time()
    pair.kill_primary()
    pair.promote()
    return killed_at, time.time()


def test_async_standby_promoted_without_the_holders_writes(template, cli_env, tmp_path):
    table = "failover_async"
    with replicated_postgres(template) as pair:
        runs = Runs(pair.url_for(table), cli_env, tmp_path)
        warm_up = runs.run("warm-up", 0)  # the table and its epoch row, on both servers
        assert warm_up.returncode == 0, warm_up.stderr
        pair.wait_replayed()
        replication = runs.doctor("replication")
        pair.mute_link()  # from here on the standby hears nothing
        runs.start("holder", 120)
        wait_until(lambda: runs.started_file("holder"), timeout=20)
        runs.start("waiter", 1, "--wait", "120s")
        wait_until(runs.waiting, timeout=20)  # it queues behind the holder on the old primary
        assert holders_on(pair.primary, table) == [2]
        assert holders_on(pair.standby, table) == []  # type: ignore[arg-type]
        killed_at, promoted_at = kill_and_promote(pair)
        refused = runs.run("refused", 1)  # started while the holder's command still runs
        epoch_line = runs.doctor("epoch")
        runs.start("late-waiter", 1, "--wait", "120s")
        finished = runs.finish()
        epoch, quarantine = epoch_row(pair.standby, table)  # type: ignore[arg-type]

    moments = (killed_at, promoted_at)
    figures = assert_lost_holder_fenced(runs, finished, refused, epoch, quarantine, moments)
    assert replication.startswith("warn") and "not synchronous: standby1 (async)" in replication
    assert epoch_line.startswith("warn") and "timeline 1 to system" in epoch_line, epoch_line
    report.record("async standby promoted, holder's writes lost", "postgres", **figures)


@pytest.mark.parametrize("holder", ["reaching", "cut-off"])
def test_a_long_ttl_lease_the_standby_missed_ends_before_its_successor(
    template, cli_env, tmp_path, holder
):
    """Issue 46: a ``--ttl 2m`` holder acquired after the link was cut, reaching the
    promoted standby (the multi-host URL) or cut off from it (the old primary's address)."""
    table = "failover_long"
    with replicated_postgres(template) as pair:
        runs = Runs(pair.url_for(table), cli_env, tmp_path)
        assert runs.run("warm-up", 0).returncode == 0
        pair.wait_replayed()
        pair.mute_link()
        url = pair.url_for(table) if holder == "reaching" else pair.primary.url_for(table)
        figures = long_ttl_holder_fenced(runs, url, lambda: kill_and_promote(pair))
    report.record(f"--ttl 2m holder {holder}, async standby promoted", "postgres", **figures)


def test_sync_standby_promoted_keeps_the_holder(template, cli_env, tmp_path):
    table = "failover_sync"
    with replicated_postgres(template, synchronous=True) as pair:
        runs = Runs(pair.url_for(table), cli_env, tmp_path)
        warm_up = runs.run("warm-up", 0)
        assert warm_up.returncode == 0, warm_up.stderr
        replication = runs.doctor("replication")
        # A TTL that outlasts the kill, the promotion and the reconnection on a loaded machine
        # (the holder must renew on the new primary before its deadline), and a command that
        # runs through two renewals.
        runs.start("holder", 10, "--ttl", "15s")
        wait_until(lambda: runs.started_file("holder"), timeout=20)
        runs.start("waiter", 1, "--wait", "120s")
        wait_until(runs.waiting, timeout=20)
        # the holder's commit waited for the standby's flush; its replay may come later
        wait_until(lambda: holders_on(pair.standby, table) == [2], timeout=20)  # type: ignore[arg-type]
        killed_at, promoted_at = kill_and_promote(pair)
        finished = runs.finish()
        epoch, quarantine = epoch_row(pair.standby, table)  # type: ignore[arg-type]

    codes = {name: code for name, (code, _) in finished.items()}
    assert codes == {"holder": 0, "waiter": 0}, finished
    assert replication.startswith("ok") and "synchronous standby(s) standby1" in replication
    holder_events = json_events(finished["holder"][1])
    assert not [e for e in holder_events if e["event"] == "lost"]
    renewed = [e["fencing_token"] for e in holder_events if e["event"] == "renewed"]
    spans = assert_one_at_a_time(runs)
    tokens = {name: token for _, _, token, name in spans}
    assert tokens["holder"] == 2 and set(renewed) == {2}  # renewed on the new primary too
    assert runs.marks("holder")[-1][0] == "end"  # it ran to its end
    assert epoch > 0 and tokens["waiter"] >= epoch << 30
    report.record(
        "sync standby promoted, holder survives",
        "postgres",
        quarantine_s=quarantine,
        tokens=[tokens["warm-up"], tokens["holder"], tokens["waiter"]],
        kill_to_next_run_s=spans[-1][0] - killed_at,
        holder_ran_after_promotion_s=runs.marks("holder")[-1][2] - promoted_at,
        exit_codes=sorted(codes.values()),
    )


def test_the_pair_helper_mutes_the_link(template):
    """The async test's premise: with the link muted, the standby misses commits."""
    with replicated_postgres(template) as pair:
        with pair.primary.connection() as conn:
            conn.execute("CREATE TABLE t (x int)")
        pair.wait_replayed()
        pair.mute_link()
        with pair.primary.connection() as conn:
            conn.execute("INSERT INTO t VALUES (1)")
        time.sleep(0.3)
        assert pair.standby is not None
        with pair.standby.connection() as conn:
            assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0


def test_a_backup_started_by_crash_recovery_starts_an_epoch(template, cli_env, tmp_path):
    """A base backup (``pg_basebackup -X stream``) started as it is, no ``recovery.signal``:
    crash recovery, then a primary on the same system identifier and timeline, without the
    tokens issued after the backup. Its new start is a new epoch: quarantined, then tokens
    above all of them (before, it issued 3 again after 6)."""
    table = "restored"
    primary = PrivatePostgres(template=template).start()
    backup: Backup | None = None
    try:
        runs = Runs(primary.url_for(table), cli_env, tmp_path)
        for n in range(2):
            assert runs.run(f"before-backup-{n}", 0).returncode == 0
        backup = Backup(primary, primary.port)
        for n in range(4):
            assert runs.run(f"after-backup-{n}", 0).returncode == 0
        primary.stop()
        backup.start()
        runs.env["TASKLOCK_STORE"] = backup.url_for(table)
        refused = runs.run("refused", 0)
        epoch, quarantine = epoch_row(backup, table)
        with backup.connection() as conn:
            conn.execute(f"UPDATE {table} SET expires_at = now() WHERE key = '' AND slot = -2")
        assert runs.run("restored", 0).returncode == 0
    finally:
        for server in (backup, primary):
            if server is not None:
                server.destroy()

    tokens = {name: token for _, _, token, name in runs.spans()}
    assert sorted(tokens.values())[:6] == [1, 2, 3, 4, 5, 6], tokens
    assert refused.returncode == 75 and "restarted" in refused.stderr, refused.stderr
    assert "refused" not in tokens
    assert epoch > 0 and tokens["restored"] == epoch << 30
    report.record(
        "backup started by crash recovery",
        "postgres",
        quarantine_s=quarantine,
        tokens_before=sorted(tokens.values())[:6],
        token_after=tokens["restored"],
    )


def test_a_standby_that_missed_the_epoch_rows_first_write(template, cli_env, tmp_path):
    """A table from before epochs (no epoch row) gets its row from its first acquire; the
    standby misses that write and is promoted. Finding a used table without a row, it
    starts an epoch of its own: quarantined, then tokens above every token of the old
    primary (before, it wrote epoch 0 and issued the old primary's tokens again)."""
    table = "upgraded"
    with replicated_postgres(template) as pair:
        runs = Runs(pair.url_for(table), cli_env, tmp_path)
        assert runs.run("before-epochs", 0).returncode == 0
        with pair.primary.connection() as conn:  # as a tasklock before epochs left it
            conn.execute(f"DELETE FROM {table} WHERE key = '' AND slot = -2")
        pair.wait_replayed()
        pair.mute_link()
        upgrade = runs.run("upgrade-quarantined", 0)  # the first acquire with epochs
        with pair.primary.connection() as conn:  # its quarantine over: as if 33 s had passed
            conn.execute(
                f"UPDATE {table} SET fencing_token = fencing_token - 33, expires_at = now()"
                " WHERE key = '' AND slot = -2"
            )
        assert runs.run("on-old-primary", 0).returncode == 0
        pair.kill_primary()
        pair.promote()
        refused = runs.run("refused", 0)
        epoch, quarantine = epoch_row(pair.standby, table)  # type: ignore[arg-type]
        with pair.standby.connection() as conn:  # type: ignore[union-attr]
            conn.execute(f"UPDATE {table} SET expires_at = now() WHERE key = '' AND slot = -2")
        assert runs.run("after-promotion", 0).returncode == 0

    tokens = {name: token for _, _, token, name in runs.spans()}
    assert upgrade.returncode == 75 and "upgrade-quarantined" not in tokens, upgrade.stderr
    assert refused.returncode == 75 and "primary changed" in refused.stderr, refused.stderr
    assert "refused" not in tokens
    assert tokens["before-epochs"] == 1 < tokens["on-old-primary"] < tokens["after-promotion"]
    assert tokens["after-promotion"] == epoch << 30 and quarantine == 32.0
    report.record(
        "standby missed the epoch row of a table from before epochs",
        "postgres",
        quarantine_s=quarantine,
        tokens=[tokens["before-epochs"], tokens["on-old-primary"], tokens["after-promotion"]],
    )
