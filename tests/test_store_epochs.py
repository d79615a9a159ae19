"""Failover epochs on one server, the cases PostgreSQL and MySQL/MariaDB share: a change of
primary is played by rewriting the identity recorded in the table's epoch row (each store's
own cases are in test_postgres_epochs.py and test_mysql_epochs.py; the real promotions in
test_faults_failover_*.py)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import RunRecord
from tests.conftest import store_url_for
from tests.support import services
from tests.support.cli import json_events
from tests.support.cli import json_run
from tests.support.cli import lost_by
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.contract import granted
from tests.support.contract import in_threads
from tests.support.contract import token
from tests.support.epochs import admin
from tests.support.epochs import default_port
from tests.support.epochs import end_quarantine
from tests.support.epochs import epoch_row
from tests.support.epochs import old_primary
from tests.support.epochs import play_failover
from tests.support.epochs import primary_changed
from tests.support.epochs import server_identity
from tests.support.epochs import set_epoch
from tests.support.epochs import with_epoch_row
from tests.support.failover import assert_inspections_quiet
from tests.support.failover import assert_inspections_warn
from tests.support.proxy import TcpProxy

HOLDER = Holder(host="h", pid=1, user="u", command=["job"], note=None)


@pytest.fixture(params=["postgres", "mysql"])
def url(request, tmp_path) -> Iterator[str]:
    services.require(request.param)
    fresh = store_url_for(request.param, tmp_path)
    yield fresh
    services.cleanup(request.param, fresh)


@pytest.fixture
def stores(url, opened_stores) -> list[Store]:
    """The stores a test opens (open_one): closed before its table is dropped."""
    return opened_stores


def open_one(url: str, opened: list[Store]) -> Store:
    store = open_store(url)
    opened.append(store)
    return store


def test_a_changed_primary_starts_an_epoch_and_quarantines_every_key(url, stores):
    store, other = open_one(url, stores), open_one(url, stores)
    survived = granted(store.acquire("k", 10, HOLDER, token()))
    store.release(granted(store.acquire("j", 20, HOLDER, token())))
    play_failover(url)
    before = time.time()

    assert other.acquire("free", 5, HOLDER, token()) is None
    assert primary_changed(url) in (other.holdup("free") or "")
    assert other.acquire("j", 5, HOLDER, token(), queue=True) is None  # a waiter too
    epoch, identity, previous, max_ttl, length, left = epoch_row(url)
    assert (identity, previous, max_ttl) == (server_identity(url), old_primary(url), 20)
    assert int(before) - 2 <= epoch <= time.time() + 2  # the server's clock, in seconds
    assert length == 32  # max(longest TTL 20 s, 30 s) + 2 s
    assert 30 < left <= 32
    assert store.renew(survived, 10).fencing_token == survived.fencing_token  # it survived

    end_quarantine(url)
    lease = granted(other.acquire("free", 5, HOLDER, token()))
    assert lease.fencing_token == epoch << EPOCH_SHIFT
    assert lease.fencing_token < 2**63 - 1
    other.release(lease)
    assert (
        granted(other.acquire("free", 5, HOLDER, token())).fencing_token == lease.fencing_token + 1
    )
    assert other.holdup("free") is None
    other.stop_waiting("j")
    later = granted(store.acquire("j", 5, HOLDER, token()))
    assert later.fencing_token == epoch << EPOCH_SHIFT  # every key starts above the epoch's


def test_the_quarantine_covers_the_longest_ttl_granted(url, stores):
    store = open_one(url, stores)
    store.release(granted(store.acquire("k", 45, HOLDER, token())))
    store.release(granted(store.acquire("k", 10, HOLDER, token())))
    play_failover(url)
    assert store.acquire("k", 5, HOLDER, token()) is None
    assert epoch_row(url)[3:5] == (45, 47)


def test_an_epoch_is_one_more_than_the_last_when_the_clock_is_behind_it(url, stores):
    store = open_one(url, stores)
    with_epoch_row(store, url)
    ahead = int(time.time()) + 100_000
    set_epoch(url, ahead)
    play_failover(url)
    assert store.acquire("k", 5, HOLDER, token()) is None
    assert epoch_row(url)[0] == ahead + 1


def test_racing_acquires_start_one_epoch(url, stores):
    clients = [open_one(url, stores) for _ in range(6)]
    with_epoch_row(clients[0], url)
    for client in clients:
        client.init_schema()
    play_failover(url)
    results: list[object] = []
    go = threading.Barrier(len(clients))

    def acquire(client: Store, key: str) -> None:
        go.wait()
        results.append(client.acquire(key, 5, HOLDER, token()))

    in_threads(acquire, [(client, f"k{n}") for n, client in enumerate(clients)])
    assert results == [None] * len(clients)  # all quarantined
    assert epoch_row(url)[2] == old_primary(url)  # one epoch: a second would name this server


def test_a_waiter_sleeps_out_the_quarantine(url, stores):
    store = open_one(url, stores)
    with_epoch_row(store, url)
    play_failover(url)
    me = token()
    assert store.acquire("k", 5, HOLDER, me, queue=True) is None
    end_quarantine(url, after=1.0)
    assert store.acquire("k", 5, HOLDER, me, queue=True) is None
    assert 0.5 < (store._time_until_free("k") or 0) <= 1.0
    started = time.monotonic()
    store.wait_for_release("k", 5)
    assert 0.5 < time.monotonic() - started < 3.0  # the quarantine's end, not the wait's 5 s
    assert store.acquire("k", 5, HOLDER, me, queue=True) is not None


def test_nothing_shows_the_epoch_row(url, stores):
    store = open_one(url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    play_failover(url)
    store.acquire("k", 5, HOLDER, token())
    assert list(store.list(include_expired=True)) == []
    assert store.sweep(dry_run=True) == 0 and store.sweep() == 0
    assert store.waiting_counts() == {} and store.ledger_keys() == []
    assert store.force_release("") == [] and store.break_lease("") == []
    assert epoch_row(url)[2] == old_primary(url)  # and sweep left it alone


def test_the_acquire_that_starts_an_epoch_is_still_one_round_trip(url, stores):
    """The identity, the epoch row and its new epoch are read and written by the acquire
    (statement or procedure) itself; an acquire that meets a quarantine sends one statement
    more, which ends a forged quarantine (a real one is left as it is)."""
    parts = urlsplit(url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or default_port(url)) as proxy:
        store = open_one(proxy.url_for(url), stores)
        store.release(granted(store.acquire("k", 5, HOLDER, token())))  # connected, table made
        play_failover(url)
        before = proxy.round_trips
        assert store.acquire("k", 5, HOLDER, token()) is None  # starts the epoch
        end_quarantine(url)
        assert store.acquire("k", 5, HOLDER, token()) is not None  # its first token
        assert proxy.round_trips - before == 3  # (1 + the forged quarantine's bound, 1)


def test_a_retry_of_a_lease_that_ran_out_meets_the_quarantine(url, stores):
    """An acquire whose reply was lost, retried on the promoted server after its lease ran
    out there: the server may lack who took the key since, so the retry is a new acquire
    (quarantined), never the old lease brought back."""
    store = open_one(url, stores)
    me = token()
    assert store.acquire("k", 0.3, HOLDER, me) is not None  # (its reply "lost")
    time.sleep(0.5)
    play_failover(url)
    assert store.acquire("k", 5, HOLDER, me) is None
    assert store.holders("k") == []
    end_quarantine(url)
    assert (
        granted(store.acquire("k", 5, HOLDER, me)).fencing_token >= epoch_row(url)[0] << EPOCH_SHIFT
    )


def test_a_retry_of_a_live_lease_is_recognised_in_the_quarantine(url, stores):
    """A lease the promoted server has, live: the retry gets it back (no one else can hold
    the key meanwhile)."""
    store = open_one(url, stores)
    me = token()
    first = granted(store.acquire("k", 30, HOLDER, me))
    play_failover(url)
    again = store.acquire("k", 30, HOLDER, me)
    assert again is not None and again.fencing_token == first.fencing_token


def test_peek_list_and_release_warn_of_a_quarantine_only_while_it_lasts(url, stores, cli_env):
    """A quarantine keeps free keys from new holders too: the real executable's ``peek``,
    ``list`` and ``release --force`` say so on stderr (the JSON keeps its shape)."""
    env = {**cli_env, "TASKLOCK_STORE": url}
    store = open_one(url, stores)
    store.acquire("held", 30, HOLDER, token())
    assert_inspections_quiet(env, primary_changed(url))  # epoch 0: no quarantine recorded
    play_failover(url)
    assert store.acquire("warm", 5, HOLDER, token()) is None  # the quarantine starts
    assert_inspections_warn(env, primary_changed(url), "table")
    end_quarantine(url)  # over: the row still records its end, in the past
    assert_inspections_quiet(env, primary_changed(url))


def test_reading_the_quarantine_starts_no_epoch(url, stores):
    """Only an acquire starts an epoch: ``quarantine()`` on a server that is not the one
    recorded reads the row and leaves it as it was."""
    store = open_one(url, stores)
    with_epoch_row(store, url)
    play_failover(url)
    before = epoch_row(url)
    assert before[:2] == (0, old_primary(url))
    assert store.quarantine() is None
    assert epoch_row(url) == before
    assert store.acquire("k", 5, HOLDER, token()) is None  # the acquire starts it
    text = store.quarantine()
    assert text is not None and text.startswith(primary_changed(url))
    more = re.search(r"for (\d+\.\d)s more", text)
    assert more, text
    left = float(more[1])
    assert 30 < left <= 32  # max(longest TTL 5 s, 30 s) + 2 s, read from the row


def test_a_failed_quarantine_read_is_the_store_unavailable(url, stores):
    """As on Redis: ``quarantine()`` raises the store's error (``peek`` then exits 69)."""
    parts = urlsplit(url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or default_port(url)) as proxy:
        store = open_one(proxy.url_for(url), stores)
        assert store.holders("k") == []  # connected, table made
        proxy.close()
        with pytest.raises(StoreUnavailable):
            store.quarantine()


def test_a_fresh_table_runs_at_once_with_or_without_init(url, stores, cli_env):
    """A table tasklock never used (a CI job's fresh database): the first run is granted at
    once, token 1, whether `tasklock init` made the table first or the run did."""
    env = {**cli_env, "TASKLOCK_STORE": url}
    command = ["sh", "-c", "echo $TASKLOCK_FENCING_TOKEN"]
    first = tasklock("run", "k", "--", *command, env=env)
    assert (first.returncode, first.stdout.strip()) == (0, "1"), first.stderr
    assert tasklock("init", env=env).returncode == 0
    again = tasklock("run", "k", "--", *command, env=env)
    assert (again.returncode, again.stdout.strip()) == (0, "2"), again.stderr


def test_a_lease_table_lost_in_use_is_made_again_at_a_new_epoch(url, stores):
    """The lease table dropped while a lease is held, its run ledger kept: the holder's next
    renewal loses the lease at once (MySQL's failed until its deadline), and the table the
    next acquire makes again starts a new epoch, a quarantine, then tokens above every one
    the ledger recorded. Before, that acquire was granted at once with token 1, beside the
    holder still running."""
    store, other = open_one(url, stores), open_one(url, stores)
    for _ in range(3):
        lease = granted(store.acquire("k", 10, HOLDER, token()))
        ran = RunRecord("k", lease.fencing_token, HOLDER, lease.acquired_at, 0, "succeeded")
        store.release(lease, record=ran)
    held = granted(store.acquire("k", 10, HOLDER, token()))
    admin(url, "DROP TABLE {table}")

    with pytest.raises(LeaseLost):
        store.renew(held, 10)
    assert other.acquire("k", 5, HOLDER, token()) is None
    assert "the table was lost and made again" in (other.holdup("k") or "")
    epoch, _, previous, _, length, left = epoch_row(url)
    assert (previous, length) == ("recreated", 32)  # (no TTL on record: the default's)
    assert 30 < left <= 32
    end_quarantine(url)
    taken = granted(other.acquire("k", 5, HOLDER, token()))
    assert taken.fencing_token >= epoch << EPOCH_SHIFT > held.fencing_token


def test_a_run_whose_lease_table_is_dropped_ends_and_the_next_waits(url, cli_env):
    """The same through the executable: the holder exits 70 at its next renewal
    (``rejected``), and the next run is refused (75) with the quarantine's reason, not
    granted token 1 beside it."""
    env = {**cli_env, "TASKLOCK_STORE": url}
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0  # (in the ledger)
    holder = start(*json_run("k", "--ttl", "3s", command=["sleep", "30"]), env=env)
    wait_for_holder(url, "k")
    admin(url, "DROP TABLE {table}")
    _, stderr = holder.communicate(timeout=30)
    assert (holder.returncode, lost_by(stderr)) == (70, ["rejected"]), stderr
    refused = tasklock("run", "k", "--", "true", env=env)
    assert refused.returncode == 75, refused.stderr
    assert "the table was lost and made again" in refused.stderr


def test_a_forged_quarantine_end_lasts_no_longer_than_a_real_one(url, stores, cli_env):
    """Anyone who may write the table may write its epoch row: a quarantine end 1000 years
    ahead (or PostgreSQL's 'infinity') keeps keys from holders no longer than a real
    quarantine would (the longest TTL granted or the floor, plus the margin), and never
    makes a run or `peek` fail."""
    env = {**cli_env, "TASKLOCK_STORE": url}
    store = open_one(url, stores)
    store.release(granted(store.acquire("k", 5, HOLDER, token())))
    if "mysql" in url:
        forgeries = ["UPDATE {table} SET expires_at = '9999-12-31' WHERE `key` = '' AND slot = -2"]
    else:
        forgeries = [
            f"UPDATE {{table}} SET expires_at = {end} WHERE key = '' AND slot = -2"
            for end in ("now() + interval '1000 years'", "'infinity'")
        ]
    for forgery in forgeries:
        admin(url, forgery)
        done = tasklock("--log-format", "json", "run", "k", "--", "true", env=env)
        assert done.returncode == 75, done.stderr
        [conflict] = [e for e in json_events(done.stderr) if e["event"] == "conflict"]
        more = re.search(r"for (\d+\.\d)s more", conflict["reason"])
        assert more and float(more[1]) <= 32.5, conflict
        peeked = tasklock("peek", "k", env=env)
        assert peeked.returncode == 1, peeked.stderr
        more = re.search(r"for (\d+\.\d)s more", peeked.stderr)
        assert more and float(more[1]) <= 32.5, peeked.stderr
        # The bound is kept: the quarantine ends then, not at the next look again.
        assert _quarantine_left_as_stored(url) <= 32.5


def _quarantine_left_as_stored(url: str) -> float:
    """Seconds to the quarantine end the epoch row holds (not bounded by the reader)."""
    if "mysql" in url:
        statement = (
            "SELECT TIMESTAMPDIFF(MICROSECOND, SYSDATE(6), expires_at) / 1e6 FROM {table}"
            " WHERE `key` = '' AND slot = -2"
        )
    else:
        statement = (
            "SELECT extract(epoch FROM expires_at - clock_timestamp())::float8 FROM {table}"
            " WHERE key = '' AND slot = -2"
        )
    [(left,)] = admin(url, statement)
    return float(left)
