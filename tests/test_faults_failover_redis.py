"""Redis failovers: a replica that missed the holder's acquire is promoted; no second holder
starts while the first could still run, and every later token is greater than every earlier
one (the failover epoch, see tasklock_cli/stores/redis/epochs.py). Sentinel URLs.

The fast tests drive the epoch rule on the shared Redis (a namespace whose record names
another primary) and on a private pair; the slow ones fail a primary over under the real
``tasklock`` executable, with the endpoint moving and with three sentinels.
"""

from __future__ import annotations

import collections
import contextlib
import re
import subprocess
import time
from collections.abc import Callable

import pytest

from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.stores import open_store
from tasklock_cli.stores.failover import EPOCH_SHIFT
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import StoreCheck
from tests.support import redis_support
from tests.support import redis_support as _redis_support
from tests.support import report
from tests.support.cli import one_error_line
from tests.support.cli import piped
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_until
from tests.support.contract import granted
from tests.support.contract import token
from tests.support.failover import EXIT_CODES
from tests.support.failover import Runs
from tests.support.failover import assert_inspections_quiet
from tests.support.failover import assert_inspections_warn
from tests.support.failover import assert_one_at_a_time
from tests.support.failover import long_ttl_holder_fenced
from tests.support.proxy import TcpProxy
from tests.support.redis_failover import replicated_redis
from tests.support.redis_failover import sentinels_for
from tests.support.redis_support import opened_redis
from tests.support.redis_support import require_redis_server

raw_redis = _redis_support.raw_redis  # the fixture, for this module's tests

HOLDER = Holder(host="host-a", pid=4242, user="alice", command=["./job.sh"], note=None)
OTHER = Holder(host="host-b", pid=99, user="bob", command=["true"], note=None)


def redis_ms(raw) -> int:
    seconds, micros = raw.time()
    return seconds * 1000 + micros // 1000


def pretend_failover(raw, prefix: str) -> None:
    """The namespace's record names another primary than the one that answers."""
    raw.hset(prefix.encode() + b"{}:epoch", "replid", "f" * 40)


def end_quarantine(raw, prefix: str) -> None:
    raw.hset(prefix.encode() + b"{}:epoch", "quarantine_until", 0)


# -- the epoch rule, fast ---------------------------------------------------------------


def test_a_changed_primary_quarantines_the_namespace_then_tokens_jump(redis_url, raw_redis):
    with opened_redis(redis_url) as store:
        prefix = store.prefix
        first = granted(store.acquire("a", 10, HOLDER, token()))
        assert first.fencing_token == 1
        assert store.release(first)
        survivor = granted(store.acquire("b", 45, HOLDER, token()))  # "survives" the failover

        pretend_failover(raw_redis, prefix)
        before = redis_ms(raw_redis)
        assert store.acquire("a", 10, OTHER, token()) is None
        record = raw_redis.hgetall(prefix.encode() + b"{}:epoch")
        epoch = int(record[b"epoch"])
        assert abs(epoch - before // 1000) <= 1
        # the longest TTL granted (45 s) plus the 2 s margin
        assert 46_000 <= int(record[b"quarantine_until"]) - before <= 47_500
        assert "primary changed" in (store.holdup("a") or "")
        assert store.acquire("c", 10, OTHER, token()) is None  # every key of the namespace
        assert store.renew(survivor, 45).fencing_token == survivor.fencing_token

        end_quarantine(raw_redis, prefix)
        base = epoch << EPOCH_SHIFT
        jumped = granted(store.acquire("a", 10, OTHER, token()))
        assert jumped.fencing_token == base > 2**53  # past a double's exact integers
        assert store.holdup("a") is None
        assert granted(store.acquire("c", 10, OTHER, token())).fencing_token == base
        assert store.release(jumped)
        again = granted(store.acquire("a", 10, OTHER, token()))
        assert again.fencing_token == base + 1  # exact: Lua's doubles never touch it
        assert (store.time_left("a", base + 1) or 0) > 9
        assert store.renew(again, 10).fencing_token == base + 1
        assert store.release(again)
        assert store.release(survivor)


def test_the_ledger_keeps_each_token_of_an_epoch_once(redis_url, raw_redis):
    from tasklock_cli.stores.model import RunRecord

    with opened_redis(redis_url) as store:
        store.release(granted(store.acquire("a", 10, HOLDER, token())))
        pretend_failover(raw_redis, store.prefix)
        assert store.acquire("a", 10, HOLDER, token()) is None
        end_quarantine(raw_redis, store.prefix)
        tokens = []
        for _ in range(3):
            lease = granted(store.acquire("a", 10, HOLDER, token()))
            record = RunRecord("a", lease.fencing_token, HOLDER, lease.acquired_at, 0, "succeeded")
            assert store.release(lease, record=record)
            assert store.release(lease, record=record) is False  # a retry writes no second
            tokens.append(lease.fencing_token)
        assert tokens == [tokens[0], tokens[0] + 1, tokens[0] + 2]
        assert [r.fencing_token for r in store.history("a")] == tokens[::-1]
        success, _ = store.last_success("a")
        assert success is not None
        assert success.fencing_token == tokens[-1]


def test_two_changes_within_a_second_still_raise_the_epoch(redis_url, raw_redis):
    with opened_redis(redis_url) as store:
        store.release(granted(store.acquire("a", 10, HOLDER, token())))
        tokens = []
        for _ in range(2):
            pretend_failover(raw_redis, store.prefix)
            assert store.acquire("a", 10, HOLDER, token()) is None
            end_quarantine(raw_redis, store.prefix)
            lease = granted(store.acquire("a", 10, HOLDER, token()))
            tokens.append(lease.fencing_token)
            store.release(lease)
        assert tokens[1] >= tokens[0] + (1 << EPOCH_SHIFT)


def test_the_quarantine_is_never_shorter_than_the_default_ttl(redis_url, raw_redis):
    with opened_redis(redis_url) as store:
        store.release(granted(store.acquire("a", 1, HOLDER, token())))
        pretend_failover(raw_redis, store.prefix)
        before = redis_ms(raw_redis)
        assert store.acquire("a", 1, HOLDER, token()) is None
        until = int(raw_redis.hget(store.prefix.encode() + b"{}:epoch", "quarantine_until"))
        assert 31_500 <= until - before <= 32_500


def test_a_waiter_in_quarantine_keeps_its_place_and_the_cli_names_the_reason(
    redis_url, raw_redis, cli_env
):
    with opened_redis(redis_url) as store:
        store.release(granted(store.acquire("a", 10, HOLDER, token())))
        pretend_failover(raw_redis, store.prefix)
    env = {**cli_env, "TASKLOCK_STORE": redis_url}
    done = tasklock("--log-format", "json", "run", "a", "--", "true", env=env)
    assert done.returncode == 75, done.stderr
    assert "primary changed" in done.stderr
    waiting = start("--log-format", "json", "run", "a", "--wait", "30s", "--", "true", env=env)
    try:
        wait_until(lambda: raw_redis.zcard(url_prefix(redis_url) + b"{a}:queue") == 1, 10)
        with open_store(redis_url) as store:
            assert len(store.waiters("a")) == 1
        end_quarantine(raw_redis, redis_url.rpartition("prefix=")[2])
        assert waiting.wait(timeout=20) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            waiting.kill()
    stderr = piped(waiting.stderr).read()
    assert '"reason": "the Redis primary changed' in stderr, stderr


def quarantine_for(raw, url: str, seconds: float) -> None:
    """A failover quarantine in the URL's namespace, ending ``seconds`` from now."""
    prefix = url.rpartition("prefix=")[2]
    with open_store(url) as store:
        store.release(granted(store.acquire("warm", 10, HOLDER, token())))
        pretend_failover(raw, prefix)
        assert store.acquire("warm", 10, HOLDER, token()) is None  # the quarantine starts
    until = redis_ms(raw) + int(seconds * 1000)
    raw.hset(prefix.encode() + b"{}:epoch", "quarantine_until", until)


def test_replace_waits_out_a_quarantine_even_without_wait(redis_url, raw_redis, cli_env):
    """--replace waits at least until the old lease could have run out: under a
    quarantine, a lease the old primary granted may still run, though none shows here."""
    quarantine_for(raw_redis, redis_url, 3.0)
    started = time.monotonic()
    done = tasklock(
        "run", "a", "--replace", "--", "true", env={**cli_env, "TASKLOCK_STORE": redis_url}
    )
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started >= 2.5


def test_peek_list_and_release_name_a_quarantine(redis_url, raw_redis, cli_env):
    env = {**cli_env, "TASKLOCK_STORE": redis_url}
    with open_store(redis_url) as store:
        lease = granted(store.acquire("held", 30, HOLDER, token()))
    quarantine_for(raw_redis, redis_url, 30.0)
    assert_inspections_warn(env, "the Redis primary changed", "namespace")
    end_quarantine(raw_redis, url_prefix(redis_url).decode())
    assert_inspections_quiet(env, "primary changed")
    with open_store(redis_url) as store:
        store.release(lease)


def url_prefix(url: str) -> bytes:
    return url.rpartition("prefix=")[2].encode()


def test_another_run_id_under_the_same_replid_is_a_restart(redis_url, raw_redis):
    """A server may keep its replid across a restart (from its RDB file): the run_id,
    new at each start, tells."""
    with open_store(redis_url) as store:
        store.release(granted(store.acquire("a", 10, HOLDER, token())))
        record = url_prefix(redis_url) + b"{}:epoch"
        assert raw_redis.hget(record, "run_id") == raw_redis.info("server")["run_id"].encode()
        raw_redis.hset(record, "run_id", "e" * 40)  # written by the server's previous life
        assert store.acquire("a", 10, OTHER, token()) is None
        assert "primary changed" in (store.holdup("a") or "")
        assert int(raw_redis.hget(record, "epoch")) > 0
        assert raw_redis.hget(record, "run_id") == raw_redis.info("server")["run_id"].encode()


def test_a_record_without_a_run_id_gains_it_without_a_quarantine(redis_url, raw_redis):
    """An older tasklock's record (no run_id): no change of primary."""
    with open_store(redis_url) as store:
        store.release(granted(store.acquire("a", 10, HOLDER, token())))
        record = url_prefix(redis_url) + b"{}:epoch"
        raw_redis.hdel(record, "run_id")
        lease = granted(store.acquire("a", 10, OTHER, token()))
        assert lease.fencing_token == 2
        assert raw_redis.hget(record, "run_id") == raw_redis.info("server")["run_id"].encode()
        assert raw_redis.hget(record, "epoch") == b"0"


def test_epochs_past_the_last_one_tokens_can_carry_are_refused(redis_url, raw_redis):
    with opened_redis(redis_url) as store:
        store.release(granted(store.acquire("a", 10, HOLDER, token())))
        raw_redis.hset(store.prefix.encode() + b"{}:epoch", "epoch", 2 ** (63 - EPOCH_SHIFT) - 1)
        pretend_failover(raw_redis, store.prefix)
        assert store.acquire("a", 10, HOLDER, token()) is None
        end_quarantine(raw_redis, store.prefix)
        with pytest.raises(StoreUnavailable, match="EPOCH"):
            store.acquire("a", 10, HOLDER, token())
        assert raw_redis.get(store.prefix.encode() + b"{a}:fence") == b"1"


def test_a_promoted_replica_without_the_record_starts_an_epoch():
    """The namespace's first acquire happened after the link was cut: the promoted replica
    has no record of it, but its master_replid2 says it took over from another primary."""
    require_redis_server()
    with replicated_redis() as pair:
        old_url = pair.primary.url(prefix="fresh:")
        pair.cut_link()
        redis_support.known_namespace(old_url)  # (on the primary only)
        with open_store(old_url) as store:
            lost = granted(store.acquire("k", 5, HOLDER, token()))
            assert lost.fencing_token == 1
        pair.promote()
        with open_store(pair.replica.url(prefix="fresh:")) as store:
            assert store.acquire("k", 5, OTHER, token()) is None
            assert "primary changed" in (store.holdup("k") or "")
        # A server that never took over from another, but started a moment ago: a restart
        # without persistence may have lost the record, so it quarantines too, and says
        # that `tasklock init` tells it the server is new.
        with open_store(pair.primary.url(prefix="other:")) as store:
            assert store.acquire("k", 5, OTHER, token()) is None
            holdup = store.holdup("k") or ""
            assert "started moments ago" in holdup and "`tasklock init`" in holdup, holdup


def test_a_promoted_replica_with_the_record_starts_an_epoch():
    require_redis_server()
    with replicated_redis() as pair:
        with open_store(redis_support.known_namespace(pair.primary.url(prefix="ns:"))) as store:
            store.release(granted(store.acquire("k", 5, HOLDER, token())))
        pair.wait_synced()
        pair.cut_link()
        pair.primary.kill()
        pair.promote()
        with open_store(pair.replica.url(prefix="ns:")) as store:
            assert store.acquire("k", 5, OTHER, token()) is None
            record = pair.replica.client().hgetall(b"ns:{}:epoch")
            assert int(record[b"epoch"]) > 0


def test_wait_replicas_gives_the_lease_back_when_no_replica_confirms():
    require_redis_server()
    with replicated_redis() as pair:
        confirmed = (
            redis_support.known_namespace(pair.primary.url(prefix="w:")) + "&wait_replicas=1"
        )
        with open_store(confirmed) as store:
            lease = granted(store.acquire("k", 5, HOLDER, token()))
            assert lease.fencing_token == 1
            store.release(lease)
            pair.cut_link()
            wait_until(lambda: pair.primary.client().info("replication")["connected_slaves"] == 0)
            store.set_io_timeout(1.0)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="only 0 of the 1 replicas"):
                store.acquire("k", 5, HOLDER, token())
            assert time.monotonic() - started < 2
            assert store.peek("k") is None  # given back


def paused_promoted_resumed(pair) -> None:
    """The old primary is SIGSTOPped, its replica promoted, then the old one resumes: it
    still takes itself for the primary (nothing told it otherwise), without a replica."""
    pair.primary.pause()
    pair.promote()
    pair.cut_link()
    pair.primary.resume()


def test_an_old_primary_that_resumes_acknowledges_renewals_without_wait_replicas():
    """The documented limit (README, Store failover): without wait_replicas= (or the
    servers' min-replicas-to-write), an old primary that comes back renews its holder's
    lease beside the new primary, which grants the key once its quarantine ends."""
    require_redis_server()
    with replicated_redis() as pair:
        old_url = redis_support.known_namespace(pair.primary.url(prefix="zombie:"))
        with open_store(old_url) as old:
            lease = granted(old.acquire("k", 30, HOLDER, token()))
            pair.wait_synced()
            paused_promoted_resumed(pair)
            assert old.renew(lease, 30).fencing_token == lease.fencing_token


def test_wait_replicas_fails_renewals_no_replica_confirms():
    """With wait_replicas=1 the same renewal fails (and is retried until the holder's
    deadline, as any failed renewal): an old primary cut off from its replicas cannot
    keep a holder alive. While a replica confirms, renewals succeed."""
    require_redis_server()
    with replicated_redis() as pair:
        old_url = redis_support.known_namespace(pair.primary.url(prefix="zombie:"))
        with open_store(old_url + "&wait_replicas=1") as old:
            lease = granted(old.acquire("k", 30, HOLDER, token()))
            assert old.renew(lease, 30).fencing_token == lease.fencing_token
            paused_promoted_resumed(pair)
            old.set_io_timeout(1.0)
            started = time.monotonic()
            with pytest.raises(StoreUnavailable, match="confirmed the renewal of 'k'"):
                old.renew(lease, 30)
            assert time.monotonic() - started < 2  # WAIT's bound: half the I/O timeout


def test_doctor_warns_of_replicas_whose_old_primary_could_renew_on():
    """Replicas, but neither wait_replicas= nor min-replicas-to-write >= 1: a warning that
    says what to set; either of them silences it."""
    require_redis_server()
    with replicated_redis() as pair:
        url = pair.primary.url(prefix="doc:")

        def replication(query: str = "") -> StoreCheck:
            with open_store(url + query) as store:
                return {check.name: check for check in store.doctor()}["replication"]

        unconfirmed = replication()
        assert unconfirmed.ok and unconfirmed.warning
        assert "split brain" in unconfirmed.detail
        assert "wait_replicas=N" in unconfirmed.detail
        assert "min-replicas-to-write" in unconfirmed.detail
        confirmed = replication("&wait_replicas=1")
        assert confirmed.ok and not confirmed.warning
        assert "acquire and renewal waits for 1" in confirmed.detail
        assert not replication("&wait_replicas=2").ok  # more than are connected
        client = pair.primary.client()
        client.config_set("min-replicas-to-write", 1)
        client.config_set("min-replicas-max-lag", 5)
        client.close()
        bounded = replication()
        assert bounded.ok and not bounded.warning
        assert "min-replicas-max-lag 5s" in bounded.detail


# -- sentinel URLs: parsing and errors, fast ------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        "redis+sentinel://:s3cret-pw@127.0.0.1:1/",  # no service
        "redis+sentinel://:s3cret-pw@127.0.0.1:1/svc/x",  # no database number
        "redis+sentinel://:s3cret-pw@127.0.0.1:99999/svc",
        "redis+sentinel://:s3cret-pw@127.0.0.1:1/svc?colour=blue",
        "redis+sentinel://:s3cret-pw@127.0.0.1:1/svc?wait_replicas=many",
        "rediss+sentinel://:s3cret-pw@127.0.0.1:1/svc/1/2",
        "redis+sentinel://:s3cret-pw@[::1/svc",  # an unclosed IPv6 bracket
        "redis+sentinel://:s3cret-pw@127.0.0.1:1,[::1/svc",
        "redis+sentinel://:s3cret-pw@[::1]26379/svc",
    ],
)
def test_malformed_sentinel_urls_are_one_line_78_without_the_password(bad, cli_env):
    done = tasklock("--store", bad, "peek", "k", env=cli_env)
    assert done.returncode == 78, done.stderr
    line = one_error_line(done.stderr)
    assert "s3cret-pw" not in line


def test_unreachable_sentinels_are_69(cli_env):
    from tests.support.ports import free_port

    hosts = ",".join(f"127.0.0.1:{free_port()}" for _ in range(3))
    done = tasklock(
        "--store", f"redis+sentinel://:s3cret-pw@{hosts}/svc", "run", "k", "--", "true",
        env=cli_env,
    )  # fmt: skip
    assert done.returncode == 69, done.stderr
    line = one_error_line(done.stderr)
    assert "no primary for service 'svc'" in line and "s3cret-pw" not in line


def test_a_service_the_sentinels_do_not_know_is_78(cli_env):
    """Every sentinel answers, none monitors the service: a wrong URL, not a store down."""
    require_redis_server()
    server = redis_support.PrivateRedis().start()
    try:
        with sentinels_for(server.port) as sentinels:
            sentinels.wait_ready(replicas=0)
            hosts = ",".join(f"127.0.0.1:{port}" for port in sentinels.ports)
            url = f"redis+sentinel://:s3cret-pw@{hosts}/no-such-service"
            done = tasklock("--store", url, "run", "k", "--", "true", env=cli_env)
            assert done.returncode == 78, done.stderr
            line = one_error_line(done.stderr)
            assert "'no-such-service' is unknown to 3 of the 3 sentinels" in line
            assert "s3cret-pw" not in line
    finally:
        server.stop()


# -- failovers under the real executable, slow ---------------------------------------------


def failover_run(tmp_path, cli_env, url: str, pair, fail_over, waiters: int = 3) -> dict:
    """Warm up (the replica learns the namespace), cut the link, start a holder, fail over
    with ``fail_over()``, start waiters; check safety; return the figures."""
    runs = Runs(url, cli_env, tmp_path, key="k", options=())
    warm = runs.start("warm-up", 0.1)
    assert warm.wait(timeout=30) == 0, piped(warm.stderr).read()
    pair.wait_synced()
    pair.cut_link()
    holder = runs.start("holder", 60)
    wait_until(lambda: runs.started_file("holder"), 15)
    killed_at = time.time()
    fail_over()
    queued = []
    for n in range(waiters):
        queued.append(runs.start(f"waiter-{n}", 0.5, "--wait", "120s"))
        time.sleep(0.2)
    codes = [process.wait(timeout=150) for process in [holder, *queued]]
    stderr = {process.pid: piped(process.stderr).read() for process in [holder, *queued]}
    assert set(codes) <= EXIT_CODES, stderr
    assert codes[0] == 70, stderr[holder.pid]  # its lease did not survive: it ended its tree
    assert codes[1:] == [0] * waiters, stderr
    spans = assert_one_at_a_time(runs)
    assert len(spans) == 2 + waiters
    holder_end = spans[1][1]
    first_after = spans[2][0]
    return {
        "token_before": spans[1][2],
        "token_after": spans[2][2],
        "holder_ran_after_kill_s": round(holder_end - killed_at, 2),
        "kill_to_next_run_s": round(first_after - killed_at, 2),
    }


def endpoint_moves(pair, endpoint: TcpProxy, killed: bool) -> Callable[[], None]:
    """A failover behind an endpoint that moves: the primary SIGKILLed (``killed``: its
    clients' connections reset) or SIGSTOPped (they hang, as behind a partition), the
    replica promoted, the endpoint re-pointed at it."""

    def fail_over() -> None:
        if killed:
            pair.primary.kill()
        else:
            pair.primary.pause()
        pair.promote()
        endpoint.retarget("127.0.0.1", pair.replica.port, cut=killed)

    return fail_over


@pytest.mark.slow
@pytest.mark.waits
@pytest.mark.parametrize("primary", ["killed", "hung"])
def test_failover_to_an_endpoint_that_moves(primary, tmp_path, cli_env):
    """``killed``: SIGKILL, so the holder's connections are reset and it finds out at once;
    ``hung``: SIGSTOP with the holder's connections left hanging (a partitioned host), so it
    runs on until a renewal on a new connection reaches the promoted replica: without the
    quarantine the waiters would start beside it."""
    require_redis_server()
    with replicated_redis() as pair, TcpProxy("127.0.0.1", pair.primary.port) as endpoint:
        url = endpoint.url_for(redis_support.known_namespace(pair.primary.url(prefix="moving:")))
        fail_over = endpoint_moves(pair, endpoint, killed=primary == "killed")
        figures = failover_run(tmp_path, cli_env, url, pair, fail_over)
    scenario = f"primary {primary}, endpoint moved to the promoted replica"
    report.record(scenario, "redis", **figures)
    assert figures["token_after"] > 2**60 > figures["token_before"]
    assert figures["kill_to_next_run_s"] >= 30  # the quarantine: at least the default TTL


@pytest.mark.slow
@pytest.mark.waits
@pytest.mark.parametrize("holder", ["reaching", "cut-off"])
def test_a_long_ttl_lease_the_replica_missed_ends_before_its_successor(holder, tmp_path, cli_env):
    """Issue 46: a ``--ttl 2m`` holder acquired after the link was cut, reaching the
    promoted replica (the endpoint that moves) or cut off from it (the old primary's
    address, SIGSTOPped: its connections hang, as behind a partition)."""
    require_redis_server()
    with replicated_redis() as pair, TcpProxy("127.0.0.1", pair.primary.port) as endpoint:
        direct = redis_support.known_namespace(pair.primary.url(prefix="long:"))
        runs = Runs(endpoint.url_for(direct), cli_env, tmp_path, key="k", options=())
        warm = runs.start("warm-up", 0.1)
        assert warm.wait(timeout=30) == 0, piped(warm.stderr).read()
        pair.wait_synced()
        pair.cut_link()
        fail_over = endpoint_moves(pair, endpoint, killed=holder == "reaching")
        url = endpoint.url_for(direct) if holder == "reaching" else direct
        figures = long_ttl_holder_fenced(runs, url, fail_over)
    report.record(f"--ttl 2m holder {holder}, replica promoted", "redis", **figures)


@pytest.mark.slow
@pytest.mark.waits
def test_failover_by_three_sentinels(tmp_path, cli_env):
    require_redis_server()
    with replicated_redis() as pair, sentinels_for(pair.primary.port) as sentinels:
        sentinels.wait_ready()
        redis_support.known_namespace(pair.primary.url(prefix="sentinel:"))
        url = sentinels.url("sentinel:")
        doctor = tasklock("--store", url, "doctor", env=cli_env)
        assert f"name 127.0.0.1:{pair.primary.port} the primary" in doctor.stdout
        assert f"127.0.0.1:{pair.replica.port}" in doctor.stdout

        def fail_over() -> None:
            pair.primary.kill()
            sentinels.wait_primary(pair.replica.port)

        figures = failover_run(tmp_path, cli_env, url, pair, fail_over)
        doctor = tasklock("--store", url, "doctor", env=cli_env)
        assert f"name 127.0.0.1:{pair.replica.port} the primary" in doctor.stdout
        epoch = re.search(r"epoch (\d+)", doctor.stdout)
        assert epoch and int(epoch.group(1)) > 0, doctor.stdout  # (epoch 0: no failover seen)
    report.record("primary SIGKILLed, sentinels fail over", "redis+sentinel", **figures)
    assert figures["token_after"] > 2**60 > figures["token_before"]


SOAK_S = 60.0
SOAK_KILL_AT_S = 10.0


@pytest.mark.slow
@pytest.mark.waits
def test_sentinel_soak_with_the_primary_killed_midway(tmp_path, cli_env):
    """Four loops run short commands on one key for a minute; the primary is SIGKILLed
    after 10 s (the replica behind: its link was cut just before)."""
    require_redis_server()
    with replicated_redis() as pair, sentinels_for(pair.primary.port) as sentinels:
        sentinels.wait_ready()
        redis_support.known_namespace(pair.primary.url(prefix="soak:"))
        runs = Runs(sentinels.url("soak:"), cli_env, tmp_path, key="k", options=())
        codes: collections.Counter[int] = collections.Counter()
        started = time.monotonic()
        killed_at = None
        live: list[subprocess.Popen] = []
        while time.monotonic() - started < SOAK_S or live:
            for process in [p for p in live if p.poll() is not None]:
                codes[process.returncode] += 1
                live.remove(process)
            while time.monotonic() - started < SOAK_S and len(live) < 4:
                live.append(runs.start(f"run-{len(runs.started):04d}", 0.2, "--wait", "5s"))
            if killed_at is None and time.monotonic() - started >= SOAK_KILL_AT_S:
                pair.cut_link()
                time.sleep(0.3)  # a few acquires the replica never receives
                pair.primary.kill()
                killed_at = time.time()
            time.sleep(0.05)
    assert set(codes) <= EXIT_CODES, codes
    assert killed_at is not None, "the soak ended before the primary was killed"
    spans = assert_one_at_a_time(runs)
    # The new primary's runs are those of the new epoch (a run the old primary granted may
    # still start a moment after the kill).
    after = [span for span in spans if span[2] >= 1 << 60]
    assert after, "no run after the failover"
    before = [span for span in spans if span[2] < 1 << 60]
    assert before and after[0][0] > killed_at
    report.record(
        "soak 60 s, 4 loops, primary SIGKILLed at 10 s",
        "redis+sentinel",
        runs=sum(codes.values()),
        ran=len(spans),
        exits=dict(sorted(codes.items())),
        ran_before=len(before),
        ran_after=len(after),
        kill_to_next_run_s=round(after[0][0] - killed_at, 2),
        token_before=before[-1][2],
        token_after=after[0][2],
    )


@pytest.mark.slow
@pytest.mark.waits
def test_with_wait_replicas_an_old_primary_that_resumes_keeps_no_holder_alive(tmp_path, cli_env):
    """The old primary is paused (SIGSTOP) while its replica, which has the holder's lease,
    is promoted and a waiter's first acquire there starts the quarantine; then the old one
    resumes and still takes itself for the primary. With wait_replicas=1 it cannot confirm
    the holder's renewals (it has no replica left): they fail, and the holder ends its tree
    at its deadline, before the new primary grants the key. (Without wait_replicas= it
    would renew forever beside the new holder: the documented limit, shown by
    test_an_old_primary_that_resumes_acknowledges_renewals_without_wait_replicas.)"""
    require_redis_server()
    with replicated_redis() as pair:
        old_url = redis_support.known_namespace(pair.primary.url(prefix="pz:"))
        # (the waiter's URL asks for no replica: the promoted server has none here)
        runs = Runs(old_url + "&wait_replicas=1", cli_env, tmp_path, key="k", options=())
        holder = runs.start("holder", 60)
        wait_until(lambda: runs.started_file("holder"), 15)
        pair.wait_synced()
        paused_at = time.time()
        pair.primary.pause()
        pair.promote()
        pair.cut_link()
        runs.env = {**cli_env, "TASKLOCK_STORE": pair.replica.url(prefix="pz:")}
        waiter = runs.start("waiter", 0.5, "--wait", "120s")
        promoted = pair.replica.client()
        wait_until(lambda: promoted.hget(b"pz:{}:epoch", "epoch") != b"0", 15)  # quarantined
        promoted.close()
        pair.primary.resume()
        codes = [holder.wait(timeout=150), waiter.wait(timeout=150)]
        stderr = [piped(holder.stderr).read(), piped(waiter.stderr).read()]
    assert codes == [70, 0], stderr
    assert '"detected_by": "unreachable"' in stderr[0], stderr[0]
    spans = assert_one_at_a_time(runs)
    assert len(spans) == 2
    assert spans[1][2] > 2**60 > spans[0][2]
    report.record(
        "old primary paused, replica promoted, old primary resumed; wait_replicas=1",
        "redis",
        holder_ran_after_pause_s=round(spans[0][1] - paused_at, 2),
        pause_to_next_run_s=round(spans[1][0] - paused_at, 2),
    )
