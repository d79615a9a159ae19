"""A MariaDB failover with the real `tasklock`: a private primary and an asynchronous
replica replicating from it, the primary SIGKILLed while a holder's command runs, the
replica promoted and the clients' endpoint moved to it (a virtual IP or DNS name).

The replication link is muted before the holder acquires, so the promoted replica never
heard of its lease or its token. The failover epoch keeps every new holder out until the
holder's lease could no longer be valid (the quarantine), and the tokens after the
failover are above every token before it.

Each run's command writes a marker file (its token, its start, then a line every 20 ms),
so overlaps are measured, not assumed (the machinery is the PostgreSQL failover test's).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support import report
from tests.support.cli import json_events
from tests.support.cli import tasklock
from tests.support.cli import wait_until
from tests.support.mysql_replication import PrivateMariaDB
from tests.support.mysql_replication import ReplicatedMariaDB
from tests.support.mysql_replication import private_mariadb_unavailable
from tests.support.mysql_replication import replicated_mariadb
from tests.support.services import in_ci
from tests.test_faults_failover_postgres import EXIT_CODES
from tests.test_faults_failover_postgres import KEY
from tests.test_faults_failover_postgres import Runs
from tests.test_faults_failover_postgres import assert_one_at_a_time

pytestmark = pytest.mark.slow

EPOCH_SHIFT = 30


@pytest.fixture
def pair() -> Iterator[ReplicatedMariaDB]:
    reason = private_mariadb_unavailable()
    if reason is not None:
        if in_ci():
            pytest.fail(f"CI=true but a private MariaDB pair cannot be started: {reason}")
        pytest.skip(reason)
    with replicated_mariadb() as started:
        yield started


def epoch_row(server: PrivateMariaDB, table: str) -> tuple[int, float]:
    """(epoch, quarantine length in seconds) of the table's epoch row on ``server``."""
    [(epoch, length)] = server.execute(
        "SELECT fencing_token, TIMESTAMPDIFF(MICROSECOND, acquired_at, expires_at) / 1e6"
        f" FROM test.`{table}` WHERE `key` = '' AND slot = -2"
    )
    return int(epoch), float(length or 0.0)


def holders_on(server: PrivateMariaDB, table: str) -> list[int]:
    """The tokens of the live leases on KEY as ``server`` (a replica too) has them."""
    rows = server.execute(
        f"SELECT fencing_token FROM test.`{table}` WHERE `key` = '{KEY}' AND slot >= 0"
        " AND owner_token IS NOT NULL AND expires_at > UTC_TIMESTAMP(6)"
    )
    return [int(row[0]) for row in rows]


def test_async_replica_promoted_without_the_holders_writes(pair, cli_env, tmp_path):
    table = "failover_async"
    runs = Runs(pair.url_for(table), cli_env, tmp_path)
    warm_up = runs.run("warm-up", 0)  # the tables, the procedures and the epoch row
    assert warm_up.returncode == 0, warm_up.stderr
    pair.wait_replicated()
    replication = runs.doctor("replication")
    pair.mute_link()  # from here on the replica hears nothing
    runs.start("holder", 120)
    wait_until(lambda: runs.started_file("holder"), timeout=20)
    runs.start("waiter", 1, "--wait", "120s")
    time.sleep(0.5)  # the waiter queues behind the holder on the old primary
    assert holders_on(pair.primary, table) == [2]
    assert holders_on(pair.replica, table) == []
    on_replica = tasklock(
        "run", KEY, "--", "true", env={**runs.env, "TASKLOCK_STORE": pair.replica.url(table=table)}
    )
    killed_at = time.time()
    pair.kill_primary()
    pair.promote()
    promoted_at = time.time()
    refused = runs.run("refused", 1)  # started while the holder's command still runs
    epoch_line = runs.doctor("epoch")
    runs.start("late-waiter", 1, "--wait", "120s")
    finished = runs.finish()
    epoch, quarantine = epoch_row(pair.replica, table)

    codes = {name: code for name, (code, _) in finished.items()}
    codes["refused"] = refused.returncode
    codes["on-replica"] = on_replica.returncode
    assert set(codes.values()) <= EXIT_CODES, codes
    expected = {"holder": 70, "waiter": 0, "late-waiter": 0, "refused": 75, "on-replica": 69}
    assert codes == expected, finished
    assert "read-only" in on_replica.stderr, on_replica.stderr
    assert "primary changed" in refused.stderr, refused.stderr
    assert replication.startswith("warn") and "1 replica(s) (server_id 2), asynchronous" in (
        replication
    ), replication
    assert epoch_line.startswith("warn"), epoch_line
    assert "changed from server_id 1 on" in epoch_line and "to server_id 2 on" in epoch_line
    waiting = [e for e in json_events(finished["late-waiter"][1]) if e["event"] == "waiting"]
    assert "primary changed" in waiting[0]["reason"], waiting
    lost = [e for e in json_events(finished["holder"][1]) if e["event"] == "lost"]
    assert [e["detected_by"] for e in lost] in (["rejected"], ["unreachable"]), lost
    spans = assert_one_at_a_time(runs)
    tokens = {name: token for _, _, token, name in spans}
    assert tokens["warm-up"] == 1 and tokens["holder"] == 2  # the replica never saw 2
    assert epoch > 0 and tokens["waiter"] >= epoch << EPOCH_SHIFT
    assert tokens["late-waiter"] >= epoch << EPOCH_SHIFT
    assert "refused" not in tokens  # its command never ran
    assert 32.0 <= quarantine < 33.0  # max(longest TTL 6 s, 30 s) + 2 s
    holder_end = runs.marks("holder")[-1][2]
    first_after = min(spans[2][0], spans[3][0])
    report.record(
        "async replica promoted, holder's writes lost",
        "mysql",
        quarantine_s=quarantine,
        tokens_before=[tokens["warm-up"], tokens["holder"]],
        tokens_after=sorted([tokens["waiter"], tokens["late-waiter"]]),
        kill_to_next_run_s=first_after - killed_at,
        holder_ran_after_promotion_s=holder_end - promoted_at,
        exit_codes=sorted(codes.values()),
    )
