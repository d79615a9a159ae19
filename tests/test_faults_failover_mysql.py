"""A MariaDB failover with the real `tasklock`: a private primary and an asynchronous
replica replicating from it, the primary SIGKILLed while a holder's command runs, the
replica promoted and the clients' endpoint moved to it (a virtual IP or DNS name).

The replication link is muted before the holder acquires, so the promoted replica never
heard of its lease or its token. The failover epoch keeps every new holder out until the
holder's lease could no longer be valid (the quarantine), and the tokens after the
failover are above every token before it.

Each run's command writes a marker file (its token, its start, then a line every 20 ms),
so overlaps are measured, not assumed (see tests/support/failover.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.support import report
from tests.support.cli import tasklock
from tests.support.cli import wait_until
from tests.support.failover import KEY
from tests.support.failover import Runs
from tests.support.failover import assert_lost_holder_fenced
from tests.support.failover import long_ttl_holder_fenced
from tests.support.mysql_replication import PrivateMariaDB
from tests.support.mysql_replication import ReplicatedMariaDB
from tests.support.mysql_replication import replicated_mariadb
from tests.support.mysql_replication import require_private_mariadb

pytestmark = [pytest.mark.slow, pytest.mark.waits]


@pytest.fixture
def pair() -> Iterator[ReplicatedMariaDB]:
    require_private_mariadb("a private MariaDB pair")
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
    wait_until(runs.waiting, timeout=20)  # it queues behind the holder on the old primary
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

    others = {"on-replica": (on_replica.returncode, 69)}
    figures = assert_lost_holder_fenced(
        runs, finished, refused, epoch, quarantine, (killed_at, promoted_at), others
    )
    assert "read-only" in on_replica.stderr, on_replica.stderr
    assert replication.startswith("warn") and "1 replica(s) (server_id 2), asynchronous" in (
        replication
    ), replication
    assert epoch_line.startswith("warn"), epoch_line
    assert "changed from server_id 1 on" in epoch_line and "to server_id 2 on" in epoch_line
    report.record("async replica promoted, holder's writes lost", "mysql", **figures)


@pytest.mark.parametrize("holder", ["reaching", "cut-off"])
def test_a_long_ttl_lease_the_replica_missed_ends_before_its_successor(
    pair, cli_env, tmp_path, holder
):
    """Issue 46: a ``--ttl 2m`` holder acquired after the link was cut, reaching the
    promoted replica (the endpoint that moves) or cut off from it (the old primary's
    address)."""
    table = "failover_long"
    runs = Runs(pair.url_for(table), cli_env, tmp_path)
    assert runs.run("warm-up", 0).returncode == 0
    pair.wait_replicated()
    pair.mute_link()
    url = pair.url_for(table) if holder == "reaching" else pair.primary.url(table=table)

    def fail_over() -> None:
        pair.kill_primary()
        pair.promote()

    figures = long_ttl_holder_fenced(runs, url, fail_over)
    report.record(f"--ttl 2m holder {holder}, async replica promoted", "mysql", **figures)
