"""Redis-only behaviour beyond the store contract: key layout, wake-ups, faults, durability."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from urllib.parse import urlsplit

import pytest

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import Superseded
from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import FRONT_BAND
from tasklock_cli.stores.model import PRIORITY_BAND
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.provisioning import with_query
from tasklock_cli.stores.redis.store import RedisStore
from tests.support import redis_support
from tests.support import redis_support as _redis_support
from tests.support import services
from tests.support.contract import granted
from tests.support.contract import in_threads
from tests.support.contract import token
from tests.support.contract import waiting_thread
from tests.support.ports import free_port
from tests.support.proxy import TcpProxy
from tests.support.redis_support import require_redis_server

raw_redis = _redis_support.raw_redis  # the fixture, for this module's tests

HOLDER = Holder(host="host-a", pid=4242, user="alice", command=["./job.sh"], note="n")
OTHER = Holder(host="host-b", pid=99, user="bob", command=["true"], note=None)


@pytest.fixture
def opened(redis_url, opened_stores) -> list[Store]:
    """The stores a test opens on the shared Redis: closed before its namespace is dropped."""
    return opened_stores


@pytest.fixture
def redis_store(redis_url, opened):
    redis_store = open_store(redis_url)
    opened.append(redis_store)
    return redis_store


@pytest.fixture
def other(redis_url, opened):
    store = open_store(redis_url)
    opened.append(store)
    return store


@pytest.fixture
def prefix(redis_store) -> bytes:
    return redis_store.prefix.encode()


@pytest.fixture
def private():
    require_redis_server()
    with redis_support.private_redis() as server:
        redis_support.known_namespace(server.url())  # (its default prefix's)
        yield server


# -- key layout ---------------------------------------------------------------------


def test_key_layout_is_a_hash_with_px_and_a_counter_without_ttl(redis_store, raw_redis, prefix):
    owner = token()
    lease = redis_store.acquire("jobs:a", 30, HOLDER, owner)
    lease_key = prefix + b"{jobs:a}:lease"
    fence_key = prefix + b"{jobs:a}:fence"

    assert raw_redis.type(lease_key) == b"hash"
    data = raw_redis.hgetall(lease_key)
    assert set(data) == {b"owner", b"fencing_token", b"holder", b"acquired_at", b"expires_at"}
    assert data[b"owner"] == owner.encode()
    assert int(data[b"fencing_token"]) == lease.fencing_token == 1
    assert int(data[b"acquired_at"]) == int(lease.acquired_at.timestamp() * 1000)
    assert int(data[b"expires_at"]) - int(data[b"acquired_at"]) == 30_000
    assert 29_000 < raw_redis.pttl(lease_key) <= 30_000

    assert raw_redis.type(fence_key) == b"string"
    assert raw_redis.get(fence_key) == b"1"
    assert raw_redis.ttl(fence_key) == -1  # present and persistent (a missing key would be -2)
    # The namespace's failover epoch record: this primary's replid, epoch 0, the TTL asked,
    # and whether a restart would lose nothing (the shared test server: no AOF always).
    epoch_key = prefix + b"{}:epoch"
    replid = raw_redis.info("replication")["master_replid"]
    lossless = raw_redis.config_get("appendfsync")["appendfsync"] == "always" and bool(
        raw_redis.info("persistence")["aof_enabled"]
    )
    assert raw_redis.hgetall(epoch_key) == {
        b"lossless": b"1" if lossless else b"0",
        b"replid": replid.encode(),
        b"run_id": raw_redis.info("server")["run_id"].encode(),
        b"epoch": b"0",
        b"quarantine_until": b"0",
        b"max_ttl": b"30000",
    }
    assert raw_redis.ttl(epoch_key) == -1
    # Nothing else in the namespace.
    assert sorted(raw_redis.scan_iter(match=prefix + b"*")) == sorted(
        [lease_key, fence_key, epoch_key]
    )


def test_times_come_from_the_redis_clock(redis_store, raw_redis):
    seconds, micros = raw_redis.time()
    lease = redis_store.acquire("k", 30, HOLDER, token())
    redis_now = seconds + micros / 1e6
    assert abs(lease.acquired_at.timestamp() - redis_now) < 1


def test_renew_sets_px_and_expires_at(redis_store, raw_redis, prefix):
    lease = redis_store.acquire("k", 2, HOLDER, token())
    renewed = redis_store.renew(lease, 60)
    lease_key = prefix + b"{k}:lease"
    assert 59_000 < raw_redis.pttl(lease_key) <= 60_000
    assert int(raw_redis.hget(lease_key, "expires_at")) == int(
        renewed.expires_at.timestamp() * 1000
    )
    assert renewed.fencing_token == lease.fencing_token


def test_idempotent_acquire_refreshes_px_and_keeps_token(redis_store, raw_redis, prefix):
    owner = token()
    first = redis_store.acquire("k", 2, HOLDER, owner)
    again = redis_store.acquire("k", 60, HOLDER, owner)
    assert again.fencing_token == first.fencing_token
    assert again.acquired_at == first.acquired_at
    assert 59_000 < raw_redis.pttl(prefix + b"{k}:lease") <= 60_000
    assert raw_redis.get(prefix + b"{k}:fence") == b"1"


def test_renew_checks_the_fencing_token_too(redis_store):
    lease = redis_store.acquire("k", 30, HOLDER, token())
    wrong = type(lease)(
        lease.key, lease.owner_token, lease.fencing_token + 1, lease.acquired_at, lease.expires_at
    )
    with pytest.raises(LeaseLost):
        redis_store.renew(wrong, 30)
    assert redis_store.release(wrong) is False
    assert redis_store.peek("k").fencing_token == lease.fencing_token


def test_release_with_keep_for_sets_px(redis_store, raw_redis, prefix):
    lease = redis_store.acquire("k", 30, HOLDER, token())
    assert redis_store.release(lease, keep_for=5) is True
    assert 4_000 < raw_redis.pttl(prefix + b"{k}:lease") <= 5_000


# -- semaphore slots ---------------------------------------------------------------------


def test_semaphore_slots_are_hashes_beside_slot_zero_sharing_one_counter(
    redis_store, raw_redis, prefix
):
    short = redis_store.acquire("pool", 2, HOLDER, token(), limit=3)
    long = redis_store.acquire("pool", 60, OTHER, token(), limit=3)
    slot0, slot1 = prefix + b"{pool}:lease", prefix + b"{pool}:lease:1"
    limit_key, fence_key = prefix + b"{pool}:limit", prefix + b"{pool}:fence"
    assert (short.slot, long.slot) == (0, 1)
    assert raw_redis.hget(slot0, "slot") == b"0" and raw_redis.hget(slot1, "slot") == b"1"
    assert raw_redis.hget(slot0, "limit") == raw_redis.hget(slot1, "limit") == b"3"
    assert int(raw_redis.hget(slot1, "fencing_token")) == long.fencing_token == 2
    assert 59_000 < raw_redis.pttl(slot1) <= 60_000
    assert raw_redis.get(fence_key) == b"2" and raw_redis.ttl(fence_key) == -1
    # The limit outlives the last live slot: at least as long as the longest PX.
    assert (
        raw_redis.get(limit_key) == b"3" and raw_redis.pttl(limit_key) >= raw_redis.pttl(slot1) - 50
    )
    assert sorted(raw_redis.scan_iter(match=prefix + b"*")) == sorted(
        [slot0, slot1, limit_key, fence_key, prefix + b"{}:epoch"]
    )
    renewed = redis_store.renew(long, 120)
    assert 119_000 < raw_redis.pttl(limit_key) <= 120_000
    assert redis_store.release(short) is True
    assert raw_redis.exists(limit_key) == 1  # slot 1 still held
    assert redis_store.release(renewed) is True
    assert raw_redis.exists(slot0, slot1, limit_key) == 0
    _assert_counter(raw_redis, prefix, "pool", 2)


def test_a_plain_lock_keeps_its_layout_of_old(redis_store, raw_redis, prefix):
    redis_store.acquire("k", 30, HOLDER, token())
    data = raw_redis.hgetall(prefix + b"{k}:lease")
    assert b"slot" not in data and b"limit" not in data
    assert raw_redis.exists(prefix + b"{k}:limit") == 0


def test_a_lease_written_before_semaphores_is_slot_zero_of_limit_one(
    redis_store, raw_redis, prefix
):
    """What the previous version left in Redis: the lease hash without slot and limit
    fields, and the counter. Nothing to migrate: it reads as slot 0 of limit 1 and the
    counter counts on."""
    lease_key, fence_key = prefix + b"{old}:lease", prefix + b"{old}:fence"
    seconds, _ = raw_redis.time()
    raw_redis.hset(
        lease_key,
        mapping={
            "owner": "0123abcd",
            "fencing_token": "41",
            "holder": json.dumps(OTHER.to_dict()),
            "acquired_at": seconds * 1000,
            "expires_at": (seconds + 30) * 1000,
        },
    )
    raw_redis.pexpire(lease_key, 30_000)
    raw_redis.set(fence_key, 41)
    (info,) = redis_store.holders("old")
    assert (info.slot, info.limit, info.fencing_token, info.holder) == (0, 1, 41, OTHER)
    with pytest.raises(LimitMismatch) as caught:
        redis_store.acquire("old", 30, HOLDER, token(), limit=3)
    assert (caught.value.held, caught.value.asked) == (1, 3)
    assert redis_store.acquire("old", 30, HOLDER, token()) is None
    assert [i.slot for i in redis_store.force_release("old", 41)] == [0]
    assert redis_store.acquire("old", 30, HOLDER, token(), limit=3).fencing_token == 42


def test_live_slots_above_the_asked_limit_are_a_mismatch(redis_store, other):
    """Held with limit 5 on slots 3 and 4 only: slots 0 to 2 are free, yet a plain lock or a
    limit of 2 would share the key with holders of another limit."""
    leases = [redis_store.acquire("pool", 30, HOLDER, token(), limit=5) for _ in range(5)]
    for lease in leases[:3]:
        assert redis_store.release(lease) is True
    for asked in (1, 2, 4):
        with pytest.raises(LimitMismatch) as caught:
            other.acquire("pool", 30, OTHER, token(), limit=asked)
        assert (caught.value.held, caught.value.asked) == (5, asked)
    assert [i.slot for i in other.holders("pool")] == [3, 4]
    assert other.acquire("pool", 30, OTHER, token(), limit=5).slot == 0


def test_a_limit_left_by_expired_slots_is_no_mismatch_and_goes(
    redis_store, other, raw_redis, prefix
):
    redis_store.acquire("pool", 0.2, HOLDER, token(), limit=4)
    time.sleep(0.35)
    raw_redis.set(prefix + b"{pool}:limit", b"4", px=60_000)  # as if it had outlived its slots
    plain = other.acquire("pool", 30, OTHER, token())
    assert (plain.slot, plain.limit) == (0, 1)
    assert raw_redis.exists(prefix + b"{pool}:limit") == 0
    assert [(i.slot, i.limit) for i in other.holders("pool")] == [(0, 1)]


def test_slot_names_never_read_as_other_keys(redis_store):
    """``x}:lease:1`` is a key of its own, not slot 1 of ``x``; ``x``'s slot 1 is not a key."""
    keys = ["x}:lease:1", "x}:lease", "x}:limit", "x:1"]
    for key in keys:
        assert redis_store.acquire(key, 30, HOLDER, token(), limit=2).slot == 0
    assert [redis_store.acquire("x", 30, HOLDER, token(), limit=2).slot for _ in "ab"] == [0, 1]
    listed = [(i.key, i.slot) for i in redis_store.list(prefix="x")]
    assert listed == sorted([(key, 0) for key in keys] + [("x", 0), ("x", 1)])
    assert [i.slot for i in redis_store.holders("x}:lease")] == [0]


def test_releases_of_two_slots_wake_two_waiters(redis_url, opened, other, raw_redis, prefix):
    leases = [other.acquire("pool", 30, OTHER, token(), limit=2) for _ in range(2)]
    woke: list[float] = []

    def wait() -> None:
        waiter = open_store(redis_url)
        opened.append(waiter)
        waiter.wait_for_release("pool", 3)
        woke.append(time.monotonic())

    threads = [threading.Thread(target=wait) for _ in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    released = time.monotonic()
    assert all(other.release(lease) for lease in leases)
    for thread in threads:
        thread.join()
    assert len(woke) == 2 and all(at - released < 0.5 for at in woke), woke
    assert raw_redis.llen(prefix + b"{pool}:wake") == 0


def test_the_wake_list_never_holds_more_wake_ups_than_free_slots(redis_store, raw_redis, prefix):
    leases = [redis_store.acquire("pool", 30, HOLDER, token(), limit=3) for _ in range(3)]
    wake_key = prefix + b"{pool}:wake"
    for freed, lease in enumerate(leases, start=1):
        assert redis_store.release(lease) is True
        assert raw_redis.llen(wake_key) == freed
    redis_store.acquire("pool", 30, HOLDER, token(), limit=3)
    assert raw_redis.llen(wake_key) == 2  # one taken by that acquire
    redis_store.acquire("pool", 30, HOLDER, token(), limit=3)
    redis_store.acquire("pool", 30, HOLDER, token(), limit=3)
    assert raw_redis.exists(wake_key) == 0  # full again: no false wake-ups
    assert [i.slot for i in redis_store.force_release("pool")] == [0, 1, 2]
    assert raw_redis.llen(wake_key) == 3


# -- lock modes and the queue's deploy rules ------------------------------------------------


def test_shared_slots_are_marked_and_the_limit_record_covers_them(
    redis_store, other, raw_redis, prefix
):
    """What an older tasklock reads: a shared hash is slot N of limit 1 (no limit field),
    and P{K}:limit, which it takes for the key's limit, covers every live shared slot, so
    its plain acquire (refused while any of those slots is live) never joins readers."""
    leases = [other.acquire("rw", 30, OTHER, token(), mode=SHARED) for _ in range(3)]
    assert [lease.slot for lease in leases] == [0, 1, 2]
    names = [prefix + b"{rw}:lease", prefix + b"{rw}:lease:1", prefix + b"{rw}:lease:2"]
    for slot, name in enumerate(names):
        data = raw_redis.hgetall(name)
        assert data[b"mode"] == b"shared" and int(data[b"slot"]) == slot
        assert b"limit" not in data
    limit_key = prefix + b"{rw}:limit"
    assert other.release(leases[0]) is True
    assert (
        raw_redis.get(limit_key) == b"3"
        and raw_redis.pttl(limit_key) >= raw_redis.pttl(names[2]) - 50
    )
    assert redis_store.acquire("rw", 30, HOLDER, token()) is None
    renewed = other.renew(leases[2], 120)
    assert renewed.mode == SHARED and 119_000 < raw_redis.pttl(limit_key) <= 120_000
    lowest = other.acquire("rw", 30, OTHER, token(), mode=SHARED)
    assert lowest.slot == 0  # the lowest free slot
    assert all(other.release(lease) for lease in (*leases[1:], lowest))
    assert raw_redis.exists(limit_key) == 0


def test_an_older_tasklocks_place_and_lease_read_as_exclusive(redis_store, raw_redis, prefix):
    """No mode anywhere is exclusive: a lease hash of old holds shared runs out, and a
    place of old is an exclusive waiter ahead of them."""
    raw_redis.hset(
        prefix + b"{old}:lease",
        mapping={
            "owner": "o",
            "fencing_token": "7",
            "holder": json.dumps(OTHER.to_dict()),
            "acquired_at": "1",
            "expires_at": "2",
        },
    )
    raw_redis.pexpire(prefix + b"{old}:lease", 500)
    assert redis_store.holders("old")[0].mode == EXCLUSIVE
    assert redis_store.acquire("old", 30, HOLDER, token(), mode=SHARED) is None
    expires = int(raw_redis.time()[0]) * 1000 + 30_000
    raw_redis.zadd(prefix + b"{old}:queue", {"old-waiter": 1})
    value = f"{expires} 1 {json.dumps(OTHER.to_dict())}"
    raw_redis.hset(prefix + b"{old}:waiters", "old-waiter", value)
    time.sleep(0.6)  # the old lease runs out: the old waiter, ahead, keeps the readers out
    assert [w.mode for w in redis_store.waiters("old")] == [EXCLUSIVE]
    assert redis_store.acquire("old", 30, HOLDER, token(), mode=SHARED) is None


def test_a_release_wakes_the_run_of_shared_waiters_at_the_head(
    redis_store, other, raw_redis, prefix
):
    writer = other.acquire("rw", 30, OTHER, token())
    owners = [token() for _ in range(4)]
    modes = (SHARED, SHARED, EXCLUSIVE, SHARED)
    for owner, mode in zip(owners, modes, strict=True):
        assert redis_store.acquire("rw", 30, HOLDER, owner, queue=True, mode=mode) is None
    assert other.release(writer) is True
    woken = [raw_redis.llen(prefix + b"{rw}:wake:" + owner.encode()) for owner in owners]
    assert woken == [1, 1, 0, 0]
    assert raw_redis.llen(prefix + b"{rw}:wake") == 0


def test_a_waiting_writer_is_woken_only_when_the_last_reader_goes(
    redis_store, other, raw_redis, prefix
):
    readers = [other.acquire("rw", 30, OTHER, token(), mode=SHARED) for _ in range(2)]
    writer = token()
    assert redis_store.acquire("rw", 30, HOLDER, writer, queue=True) is None
    wake_key = prefix + b"{rw}:wake:" + writer.encode()
    assert other.release(readers[1]) is True
    assert raw_redis.llen(wake_key) == 0  # a reader still holds it: no false wake-up
    assert other.release(readers[0]) is True
    assert raw_redis.llen(wake_key) == 1


def test_a_shared_waiter_is_woken_when_the_writer_ahead_leaves(redis_url, opened, other):
    reader = other.acquire("rw", 30, OTHER, token(), mode=SHARED)
    writer = open_store(redis_url)
    opened.append(writer)
    assert writer.acquire("rw", 30, HOLDER, token(), queue=True) is None
    waiter = open_store(redis_url)
    opened.append(waiter)
    assert waiter.acquire("rw", 30, HOLDER, token(), queue=True, mode=SHARED) is None
    woke: list[float] = []
    thread = waiting_thread(waiter, "rw", 5, woke)
    time.sleep(0.3)
    assert not woke  # behind the writer, though only a reader holds the key
    writer.stop_waiting("rw")
    left = time.monotonic()
    thread.join()
    assert woke and time.monotonic() - left < 0.5
    assert other.release(reader) is True


def test_superseding_wakes_the_superseded_and_its_marker_tells_once(
    redis_url, opened, redis_store, other, raw_redis, prefix
):
    holder = other.acquire("dep", 30, OTHER, token())
    older, newer = token(), token()
    assert redis_store.acquire("dep", 30, HOLDER, older, queue=True, supersede=True) is None
    record = json.loads(raw_redis.hget(prefix + b"{dep}:waiters", older).split(b" ", 2)[2])
    assert record["supersede"] is True and "mode" not in record
    late = open_store(redis_url)
    opened.append(late)
    assert late.acquire("dep", 30, OTHER, newer, queue=True, supersede=True) is None
    assert raw_redis.llen(prefix + b"{dep}:wake:" + older.encode()) == 1
    assert raw_redis.hexists(prefix + b"{dep}:superseded", older)
    assert raw_redis.zrange(prefix + b"{dep}:queue", 0, -1) == [newer.encode()]
    assert other.release(holder) is True
    with pytest.raises(Superseded):
        redis_store.acquire("dep", 30, HOLDER, older, queue=True, supersede=True)
    assert not raw_redis.hexists(prefix + b"{dep}:superseded", older)
    assert redis_store._queue_place("dep") is None
    # told once: a new attempt is a newcomer, behind the newer run (which it supersedes)
    assert redis_store.acquire("dep", 30, HOLDER, older, queue=True, supersede=True) is None
    with pytest.raises(Superseded):
        late.acquire("dep", 30, OTHER, newer, queue=True, supersede=True)


def test_a_note_cannot_fake_a_places_mode_or_supersede_flag(redis_store, other, raw_redis, prefix):
    """The scripts find the flags as text in a place's record: JSON escapes the quotes of
    a note that spells them."""
    holder = other.acquire("dep", 30, OTHER, token())
    sly = Holder(host="h", pid=1, user="u", note='"mode": "shared", "supersede": true')
    writer, reader = token(), token()
    assert redis_store.acquire("dep", 30, sly, writer, queue=True) is None
    assert other.acquire("dep", 30, OTHER, reader, queue=True, supersede=True) is None
    assert [w.mode for w in redis_store.waiters("dep")] == [EXCLUSIVE, EXCLUSIVE]
    assert other.release(holder) is True
    assert raw_redis.llen(prefix + b"{dep}:wake:" + writer.encode()) == 1  # the head alone
    assert raw_redis.llen(prefix + b"{dep}:wake:" + reader.encode()) == 0
    assert redis_store.acquire("dep", 30, sly, writer, queue=True) is not None  # not superseded


def test_front_places_take_scores_below_the_queue(redis_store, other, raw_redis, prefix):
    holder = other.acquire("dep", 30, OTHER, token())
    first, front = token(), token()
    assert redis_store.acquire("dep", 30, HOLDER, first, queue=True) is None
    assert redis_store.acquire("dep", 30, HOLDER, front, queue=True, front=True) is None
    queue = raw_redis.zrange(prefix + b"{dep}:queue", 0, -1, withscores=True)
    # (below every priority's band: model.FRONT_BAND)
    assert queue == [(front.encode(), float(-FRONT_BAND - 1)), (first.encode(), 1.0)]
    assert other.release(holder) is True
    assert raw_redis.llen(prefix + b"{dep}:wake:" + front.encode()) == 1
    assert raw_redis.llen(prefix + b"{dep}:wake:" + first.encode()) == 0


def test_priorities_take_bands_of_scores(redis_store, other, raw_redis, prefix):
    """A place joins at the end of its priority's band; a plain place's score is what an
    older tasklock gives it (the last + 1), so an older tasklock sees the same order."""
    holder = other.acquire("band", 30, OTHER, token())
    owners = [token() for _ in range(3)]
    for owner, priority in zip(owners, (0, 5, 0), strict=True):
        assert redis_store.acquire("band", 30, HOLDER, owner, queue=True, priority=priority) is None
    queue = raw_redis.zrange(prefix + b"{band}:queue", 0, -1, withscores=True)
    high = float(-5 * PRIORITY_BAND + 1)
    assert queue == [
        (owners[1].encode(), high),
        (owners[0].encode(), 1.0),
        (owners[2].encode(), 2.0),
    ]
    assert other.release(holder) is True


def test_mode_operations_take_one_round_trip_each(redis_url):
    """A shared acquire, a --supersede --replace join, a join that supersedes, and the
    superseded run's Superseded: one script each."""
    with TcpProxy("127.0.0.1", urlsplit(redis_url).port or 6379) as proxy:
        store = open_store(proxy.url_for(redis_url))
        try:
            store.release(granted(store.acquire("warm-up", 30, HOLDER, token())))  # scripts loaded
            counted: dict[str, int] = {}

            def count(name: str, owner: str, **options):
                before = proxy.round_trips
                try:
                    return store.acquire("m", 30, HOLDER, owner, queue=True, **options)
                finally:
                    counted[name] = proxy.round_trips - before

            assert count("shared", token(), mode=SHARED) is not None
            older = token()
            assert count("join", older, supersede=True, front=True) is None
            assert count("supersede", token(), supersede=True) is None
            with pytest.raises(Superseded):
                count("superseded", older, supersede=True)
        finally:
            store.close()
    assert len(counted) == 4 and counted == dict.fromkeys(counted, 1), counted


# -- the fencing counter ----------------------------------------------------------------


def _assert_counter(raw, prefix: bytes, key: str, value: int) -> None:
    fence_key = prefix + b"{" + key.encode() + b"}:fence"
    assert raw.exists(fence_key) == 1
    assert raw.get(fence_key) == str(value).encode()
    assert raw.ttl(fence_key) == -1


def test_counter_survives_release_force_release_expiry_and_sweep(
    redis_store, other, raw_redis, prefix
):
    lease_key = prefix + b"{k}:lease"

    lease = redis_store.acquire("k", 30, HOLDER, token())
    assert redis_store.release(lease) is True
    assert raw_redis.exists(lease_key) == 0
    _assert_counter(raw_redis, prefix, "k", 1)

    redis_store.acquire("k", 30, HOLDER, token())
    (freed,) = other.force_release("k")
    assert freed.fencing_token == 2
    assert raw_redis.exists(lease_key) == 0
    _assert_counter(raw_redis, prefix, "k", 2)

    redis_store.acquire("k", 0.2, HOLDER, token())
    time.sleep(0.4)
    assert raw_redis.exists(lease_key) == 0
    _assert_counter(raw_redis, prefix, "k", 3)

    assert other.sweep() == 0
    assert other.sweep(dry_run=True) == 0
    _assert_counter(raw_redis, prefix, "k", 3)

    assert redis_store.acquire("k", 30, HOLDER, token()).fencing_token == 4


def test_force_release_returns_the_broken_lease_and_keeps_the_counter(
    redis_store, other, raw_redis, prefix
):
    lease = redis_store.acquire("k", 30, HOLDER, token())
    (broken,) = other.force_release("k")
    assert broken.key == "k" and broken.holder == HOLDER
    assert broken.fencing_token == lease.fencing_token
    assert broken.expires_at == lease.expires_at
    assert other.force_release("k") == []
    _assert_counter(raw_redis, prefix, "k", 1)


# -- unusual keys and list ------------------------------------------------------------

GLOBBY = ["a", "a*", "a?", "a[b]", "a[^b]", "a\\*", "{a}", "a}", "}a", "a{", "ab", "b*", "{}"]


def test_glob_and_hash_tag_keys_do_not_collide(redis_store, raw_redis, prefix):
    leases = {key: redis_store.acquire(key, 30, HOLDER, token()) for key in GLOBBY}
    assert all(lease is not None and lease.fencing_token == 1 for lease in leases.values())
    for key in GLOBBY:
        assert redis_store.peek(key).key == key
        _assert_counter(raw_redis, prefix, key, 1)
    assert [i.key for i in redis_store.list()] == sorted(GLOBBY)
    assert [i.key for i in redis_store.list(prefix="a*")] == ["a*"]
    assert [i.key for i in redis_store.list(prefix="a?")] == ["a?"]
    assert [i.key for i in redis_store.list(prefix="a[")] == ["a[^b]", "a[b]"]
    assert [i.key for i in redis_store.list(prefix="a\\")] == ["a\\*"]
    assert [i.key for i in redis_store.list(prefix="{")] == ["{a}", "{}"]
    assert [i.key for i in redis_store.list(prefix="}")] == ["}a"]
    assert [i.key for i in redis_store.list(prefix="a")] == sorted(k for k in GLOBBY if k[0] == "a")
    assert list(redis_store.list(prefix="*")) == []
    # Releasing one never touches its look-alikes.
    assert redis_store.release(leases["a*"]) is True
    assert redis_store.peek("a*") is None
    assert redis_store.peek("a") is not None and redis_store.peek("ab") is not None


def test_keys_that_look_like_our_suffixes_are_ordinary(redis_store):
    keys = ["x}:lease", "x}:fence", "x", "x}:wake"]
    for key in keys:
        assert redis_store.acquire(key, 30, HOLDER, token()).fencing_token == 1
    assert [i.key for i in redis_store.list(prefix="x")] == sorted(keys)


def test_list_uses_scan_never_keys(redis_store, monkeypatch):
    import redis

    for key in ["b", "a", "c"]:
        redis_store.acquire(key, 30, HOLDER, token())
    scans: list[bytes | None] = []
    original_scan = redis.Redis.scan

    def spy_scan(self, *args, **kwargs):
        scans.append(kwargs.get("match"))
        return original_scan(self, *args, **kwargs)

    def no_keys(self, *args, **kwargs):
        raise AssertionError("KEYS must never be used")

    monkeypatch.setattr(redis.Redis, "scan", spy_scan)
    monkeypatch.setattr(redis.Redis, "keys", no_keys)
    assert [i.key for i in redis_store.list()] == ["a", "b", "c"]
    assert [i.key for i in redis_store.list(prefix="b")] == ["b"]
    assert scans and all(match is not None for match in scans)
    assert (scans[-1] or b"").endswith(b"{b*}:lease*")  # every slot's hash: :lease and :lease:N


def test_list_ignores_foreign_keys_and_other_namespaces(redis_store, raw_redis, prefix, redis_url):
    redis_store.acquire("mine", 30, HOLDER, token())
    raw_redis.set(prefix + b"unrelated", b"x")  # not in our layout: never matched by list
    neighbour = open_store(redis_url.replace(redis_store.prefix, redis_store.prefix + "x"))
    try:
        neighbour.acquire("theirs", 30, HOLDER, token())
        assert [i.key for i in redis_store.list()] == ["mine"]
        assert [i.key for i in neighbour.list()] == ["theirs"]
    finally:
        redis_support.drop_namespace(
            redis_url.replace(redis_store.prefix, redis_store.prefix + "x")
        )
        neighbour.close()


def _scanned_names(monkeypatch) -> list[bytes]:
    """Every name the server's SCAN replies carry from now on (the real replies, recorded)."""
    import redis

    names: list[bytes] = []
    original_scan = redis.Redis.scan

    def recording_scan(self, *args, **kwargs):
        cursor, found = original_scan(self, *args, **kwargs)
        names.extend(found)
        return cursor, found

    monkeypatch.setattr(redis.Redis, "scan", recording_scan)
    return names


GLOB_PREFIX = "a[b]*?\\^{"  # every MATCH metacharacter, and a hash-tag brace


def test_list_prefix_scans_only_the_prefix(redis_store, raw_redis, prefix, monkeypatch):
    """SCAN MATCH covers the prefix alone: 20,000 leases outside it never reach the client,
    not even those an unescaped pattern would match."""
    inside = [GLOB_PREFIX + "1", GLOB_PREFIX + "2", GLOB_PREFIX]
    look_alikes = ["ab*?\\^{1", "a[b]x?\\^{", "a[b]*X\\^{", "a[b]*?\\x{", "a[b]*?\\^"]
    for key in inside + look_alikes:
        assert redis_store.acquire(key, 60, HOLDER, token()) is not None
    outside = [f"outside:{i:05d}" for i in range(20_000)]
    pipe = raw_redis.pipeline(transaction=False)
    for key in outside:  # lease-shaped hashes, written in bulk
        pipe.hset(prefix + b"{" + key.encode() + b"}:lease", "fencing_token", 1)
    pipe.execute()
    scanned = _scanned_names(monkeypatch)
    assert [i.key for i in redis_store.list(prefix=GLOB_PREFIX)] == sorted(inside)
    assert sorted(scanned) == sorted(redis_store._names.lease(key) for key in inside)
    scanned.clear()
    assert [i.key for i in redis_store.list(prefix="a[b]*?")] == sorted(
        [*inside, "a[b]*?\\x{", "a[b]*?\\^"]
    )
    assert len(scanned) == 5


def test_a_namespace_with_glob_characters_lists_only_its_own(opened):
    services.require("redis")
    base = f"tasklock-test-{uuid.uuid4().hex[:12]}"
    ours_url = with_query(services.base_url("redis"), prefix=base + "[x]*:")
    theirs_url = with_query(
        services.base_url("redis"), prefix=base + "x:"
    )  # what "[x]*" unescaped matches
    ours, theirs = open_store(ours_url), open_store(theirs_url)
    opened.extend([ours, theirs])
    try:
        ours.acquire("k1", 60, HOLDER, token())
        theirs.acquire("k2", 60, HOLDER, token())
        assert [i.key for i in ours.list()] == ["k1"]
        assert [i.key for i in ours.list(prefix="k")] == ["k1"]
        assert [i.key for i in theirs.list()] == ["k2"]
    finally:
        redis_support.drop_namespace(ours_url)
        redis_support.drop_namespace(theirs_url)


def test_ten_thousand_leases_are_listed_correctly(redis_store, redis_url, opened, prefix):
    from concurrent.futures import ThreadPoolExecutor

    count = 10_000
    keys = [f"bulk:{i:05d}" for i in range(count)]
    clients = [
        open_store(redis_url) for _ in range(4)
    ]  # the acquires in 4 streams: it waits on I/O
    opened.extend(clients)

    def acquire_every_fourth(n: int) -> None:
        for key in keys[n::4]:
            assert clients[n].acquire(key, 120, HOLDER, token()) is not None

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(acquire_every_fourth, range(4)))
    started = time.monotonic()
    listed = list(redis_store.list())
    elapsed = time.monotonic() - started
    assert [i.key for i in listed] == keys
    assert all(i.fencing_token == 1 and i.holder == HOLDER and not i.expired for i in listed)
    assert [i.key for i in redis_store.list(prefix="bulk:0999")] == [
        f"bulk:0999{d}" for d in range(10)
    ]
    print(f"listed {count} leases in {elapsed * 1000:.0f} ms")


# -- waiting ----------------------------------------------------------------------------


def test_wait_for_release_wakes_on_release_from_another_client(redis_store, other):
    lease = other.acquire("k", 30, OTHER, token())
    released_at: list[float] = []

    def release_later():
        time.sleep(0.3)
        released_at.append(time.monotonic())
        assert other.release(lease) is True

    thread = threading.Thread(target=release_later)
    started = time.monotonic()
    thread.start()
    redis_store.wait_for_release("k", 5)
    woke = time.monotonic()
    thread.join()
    assert woke - started < 2, "waited (close to) the full timeout: no wake-up"
    assert released_at and woke - released_at[0] < 1.0  # the release, not the 5 s timeout
    assert redis_store.acquire("k", 30, HOLDER, token()) is not None


def test_wait_for_release_honours_its_timeout_and_can_repeat(redis_store, other):
    lease = other.acquire("k", 30, OTHER, token())
    for _ in range(3):  # each wait leaves the connection clean for the next
        started = time.monotonic()
        redis_store.wait_for_release("k", 0.2)
        assert 0.15 < time.monotonic() - started < 2  # its timeout, not the 5 s I/O one
    other.acquire("j", 30, OTHER, token())
    timer = threading.Timer(0.2, lambda: other.release(lease))
    timer.start()
    started = time.monotonic()
    redis_store.wait_for_release("k", 5)
    timer.join()
    assert time.monotonic() - started < 1.5


def test_each_release_wakes_one_waiter_the_longest_waiting_first(redis_url, opened, other):
    lease = other.acquire("k", 30, OTHER, token())
    woke: dict[int, float] = {}

    def wait(n: int) -> None:
        waiter = open_store(redis_url)
        opened.append(waiter)
        waiter.wait_for_release("k", 2.5)
        woke[n] = time.monotonic()

    threads = []
    for n in range(3):
        threads.append(threading.Thread(target=wait, args=(n,)))
        threads[-1].start()
        time.sleep(0.15)  # waiter 0 waits longest
    released = time.monotonic()
    assert other.release(lease) is True
    for thread in threads:
        thread.join()
    early = sorted(n for n, at in woke.items() if at - released < 1.0)
    assert early == [0], {n: round(at - released, 3) for n, at in woke.items()}


def test_a_release_between_the_look_and_the_block_is_not_missed(redis_store, other, monkeypatch):
    lease = other.acquire("k", 30, OTHER, token())
    real_call, calls = redis_store._conn.call, []

    def call_then_release(operation, key=None):
        result = real_call(operation, key)
        calls.append(key)
        if len(calls) == 1:  # the lease was just seen held: release it before the BLPOP
            assert other.release(lease) is True
        return result

    monkeypatch.setattr(redis_store._conn, "call", call_then_release)
    started = time.monotonic()
    redis_store.wait_for_release("k", 3)
    assert time.monotonic() - started < 1
    assert len(calls) == 2


class _CutShort(BaseException):
    """What a signal handler raising in the middle of a wait looks like."""


def test_closing_a_store_whose_wait_was_cut_short_passes_the_wake_up_on(
    redis_url, redis_store, other, raw_redis, prefix
):
    """Its BLPOP may have taken the release's wake-up just before the signal: while the key
    is free, the close leaves one for the next waiter."""
    lease = other.acquire("k", 30, HOLDER, token())
    quitter = open_store(redis_url)

    def cut_short(*_):
        raise _CutShort

    previous = signal.signal(signal.SIGALRM, cut_short)
    signal.setitimer(signal.ITIMER_REAL, 0.3)
    try:
        with pytest.raises(_CutShort):
            quitter.wait_for_release("k", 5)  # blocked in BLPOP when the alarm comes
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert other.release(lease) is True
    wake_key = prefix + b"{k}:wake"
    assert raw_redis.lpop(wake_key) == b"1"  # as if the quitter's BLPOP had taken it
    quitter.close()
    assert raw_redis.llen(wake_key) == 1  # passed on


def test_closing_a_store_after_an_ordinary_wait_leaves_no_wake_up(
    redis_store, other, raw_redis, prefix
):
    lease = other.acquire("k", 30, HOLDER, token())
    redis_store.wait_for_release("k", 0.1)
    assert other.release(lease) is True
    raw_redis.delete(prefix + b"{k}:wake")
    redis_store.close()
    assert raw_redis.llen(prefix + b"{k}:wake") == 0


def test_a_wake_up_left_unclaimed_is_dropped_by_the_next_acquire(
    redis_store, other, raw_redis, prefix
):
    lease = other.acquire("k", 30, OTHER, token())
    assert other.release(lease) is True
    wake_key = prefix + b"{k}:wake"
    assert raw_redis.llen(wake_key) == 1 and 0 < raw_redis.pttl(wake_key) <= 5_000
    other.acquire("k", 30, OTHER, token())
    assert raw_redis.exists(wake_key) == 0
    started = time.monotonic()
    redis_store.wait_for_release("k", 0.4)  # held again: nothing may wake us early
    assert time.monotonic() - started >= 0.35


def test_foreign_key_at_the_wake_list_is_a_clear_error(redis_store, raw_redis, prefix):
    wake_key = prefix + b"{bad}:wake"
    raw_redis.set(wake_key, b"someone else's")
    with pytest.raises(ConfigError) as caught:
        redis_store.acquire("bad", 30, HOLDER, token())
    assert repr(wake_key.decode()) in str(caught.value) and "string" in str(caught.value)
    assert raw_redis.get(wake_key) == b"someone else's"
    assert raw_redis.exists(prefix + b"{bad}:lease", prefix + b"{bad}:fence") == 0


def test_wait_for_release_on_a_dead_store_just_times_out(private):
    store = open_store(private.url())
    try:
        store.acquire("k", 30, HOLDER, token())
        private.kill()
        started = time.monotonic()
        store.wait_for_release("k", 0.3)  # never raises
        assert time.monotonic() - started < 2
    finally:
        store.close()


# -- scripts, foreign keys ------------------------------------------------------------------


def test_script_flush_is_survived(private):
    """On a private server: SCRIPT FLUSH empties the cache of every client of a server,
    so it must not hit the other tests' stores on the shared one."""
    redis_store, other = open_store(private.url()), open_store(private.url())
    raw = private.client()
    try:
        lease = granted(redis_store.acquire("k", 30, HOLDER, token()))
        raw.script_flush()
        renewed = redis_store.renew(lease, 30)
        raw.script_flush()
        assert redis_store.release(renewed) is True
        raw.script_flush()
        assert granted(other.acquire("k", 30, OTHER, token())).fencing_token == 2
        raw.script_flush()
        (freed,) = redis_store.force_release("k")
        assert freed.holder == OTHER
    finally:
        redis_store.close()
        other.close()


def test_foreign_string_at_a_lease_key_is_a_clear_error(redis_store, raw_redis, prefix):
    good = redis_store.acquire("good", 30, HOLDER, token())
    lease_key = prefix + b"{bad}:lease"
    raw_redis.set(lease_key, b"someone else's")
    for attempt in (
        lambda: redis_store.acquire("bad", 30, HOLDER, token()),
        lambda: redis_store.peek("bad"),
        lambda: redis_store.force_release("bad"),
    ):
        with pytest.raises(ConfigError) as caught:
            attempt()
        assert repr(lease_key.decode()) in str(caught.value)
        assert "string" in str(caught.value)
    # A listing shows it as a malformed record and goes on (issue 40).
    listed = {info.key: info for info in redis_store.list()}
    assert set(listed) == {"good", "bad"} and not listed["good"].malformed
    assert listed["bad"].malformed[0] == ("lease", "is a Redis string, not a lease hash")
    # Nothing was touched: the foreign key, no counter created, our other lease intact.
    assert raw_redis.get(lease_key) == b"someone else's" and raw_redis.ttl(lease_key) == -1
    assert raw_redis.exists(prefix + b"{bad}:fence") == 0
    assert redis_store.peek("good").fencing_token == good.fencing_token
    assert redis_store.renew(good, 30).fencing_token == good.fencing_token


def test_foreign_counter_is_a_clear_error(redis_store, raw_redis, prefix):
    fence_key = prefix + b"{bad}:fence"
    for value in (b"not a number", None):
        raw_redis.delete(fence_key)
        if value is None:
            raw_redis.rpush(fence_key, b"x")
        else:
            raw_redis.set(fence_key, value)
        with pytest.raises(ConfigError) as caught:
            redis_store.acquire("bad", 30, HOLDER, token())
        assert repr(fence_key.decode()) in str(caught.value)
        assert raw_redis.exists(prefix + b"{bad}:lease") == 0


def test_foreign_hash_without_our_fields_is_shown_malformed_not_crashed(
    redis_store, raw_redis, prefix
):
    raw_redis.hset(prefix + b"{bad}:lease", mapping={b"color": b"blue"})
    shown = redis_store.peek("bad")
    assert shown is not None and "fencing_token" in dict(shown.malformed)
    [listed] = redis_store.list()
    assert listed.key == "bad" and listed.malformed
    raw_redis.hset(prefix + b"{bad}:lease", mapping={b"holder": b"\xff\xfe not utf-8"})
    [listed] = redis_store.list()
    assert ("holder", "is not JSON") in listed.malformed
    assert redis_store.acquire("bad", 30, HOLDER, token()) is None  # held by "someone"


# -- durability: what FLUSHALL and a restart without persistence do ------------------------


def test_flushall_restarts_the_counter_so_tokens_repeat(redis_store, redis_url):
    """Documented behaviour: tokens are only as durable as Redis's data.

    After FLUSHALL on a server up for longer than the quarantine floor (here: the
    namespace's keys deleted on the shared server) the counter starts again at 1 and a
    token issued before is issued again; the old holder's renew is rejected.
    """
    first = redis_store.acquire("k", 30, HOLDER, token())
    redis_store.release(first)
    second = redis_store.acquire("k", 30, HOLDER, token())
    assert (first.fencing_token, second.fencing_token) == (1, 2)
    assert redis_support.drop_namespace(redis_url) > 0
    with pytest.raises(LeaseLost):
        redis_store.renew(second, 30)
    again = redis_store.acquire("k", 30, OTHER, token())
    assert again.fencing_token == 1  # repeats a token issued before the flush


def test_server_killed_and_restarted_never_renews_silently(private):
    store = open_store(private.url())
    store.set_io_timeout(1)
    try:
        lease = granted(store.acquire("k", 30, HOLDER, token()))
        private.kill()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.renew(lease, 30)
        assert time.monotonic() - started < 3
        private.start()  # same port, --save "": the data is gone
        with pytest.raises(LeaseLost):
            store.renew(lease, 30)
        # The first call after the restart reconnected by itself.
        assert store.peek("k") is None
        # The epoch record went with the data; a server up for less than the quarantine
        # floor keeps new leases out until the floor after its start, and tokens jump.
        client = private.client()
        assert store.acquire("k", 30, OTHER, token()) is None
        assert "`tasklock init`" in (store.holdup("k") or "")
        record = client.hgetall(b"tasklock-test:{}:epoch")
        # Whole seconds up, read first: the server started between uptime and uptime + 1 s
        # before `now` (read in milliseconds: whole seconds gave up to 1 s too much left).
        uptime = int(client.info("server")["uptime_in_seconds"])
        seconds, micros = client.time()
        left = int(record[b"quarantine_until"]) - (seconds * 1000 + micros // 1000)
        assert 30_000 - (uptime + 1) * 1000 - 100 <= left <= 34_000 - uptime * 1000
        assert int(record[b"epoch"]) >= seconds - 1
        client.close()
    finally:
        store.close()


def test_paused_server_times_out_within_the_io_timeout(private):
    store = open_store(private.url())
    store.set_io_timeout(0.5)
    try:
        lease = granted(store.acquire("k", 30, HOLDER, token()))
        private.pause()
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            store.renew(lease, 30)
        assert time.monotonic() - started < 2  # one timeout, no hidden retries
        private.resume()
        assert store.renew(lease, 30).fencing_token == lease.fencing_token
    finally:
        private.resume()
        store.close()


def test_idle_connection_closed_by_server_is_reconnected(private):
    store = open_store(private.url())
    try:
        lease = granted(store.acquire("k", 30, HOLDER, token()))
        private.client().client_kill_filter(_type="normal", skipme=True)
        assert store.renew(lease, 30).fencing_token == lease.fencing_token
    finally:
        store.close()


# -- errors ---------------------------------------------------------------------------------


def test_wrong_password_is_reported_without_the_password():
    require_redis_server()
    with redis_support.private_redis(password="right-Secret-42") as server:
        for url in (
            server.url(password="wrong-Pa55word"),
            server.url(password=""),
            server.url(password="") + "&password=wrong-Pa55word",
        ):
            store = open_store(url)
            try:
                with pytest.raises(ConfigError) as caught:
                    store.acquire("k", 30, HOLDER, token())
                message = str(caught.value)
                assert "wrong-Pa55word" not in message and "right-Secret-42" not in message
                assert "credentials" in message
                checks = {c.name: c for c in store.doctor()}
                assert checks["reachable"].ok is False
                assert "wrong-Pa55word" not in checks["reachable"].detail
                assert "wrong-Pa55word" not in checks["store"].detail
            finally:
                store.close()
        good = open_store(redis_support.known_namespace(server.url()))
        try:
            assert granted(good.acquire("k", 30, HOLDER, token())).fencing_token == 1
            assert "right-Secret-42" not in good.display_url
        finally:
            good.close()


def test_unreachable_port_is_store_unavailable_quickly():
    services.require("redis")
    store = open_store(f"redis://127.0.0.1:{free_port()}/0")
    store.set_io_timeout(1)
    try:
        for call in (
            lambda: store.acquire("k", 30, HOLDER, token()),
            lambda: store.peek("k"),
            lambda: list(store.list()),
            lambda: store.sweep(),
        ):
            started = time.monotonic()
            with pytest.raises(StoreUnavailable):
                call()
            assert time.monotonic() - started < 3
        checks = {c.name: c for c in store.doctor()}
        assert checks["reachable"].ok is False
    finally:
        store.close()


def test_bad_urls_are_config_errors():
    services.require("redis")
    with pytest.raises(ConfigError):
        open_store("redis://127.0.0.1:notaport/0")
    with pytest.raises(ConfigError):
        open_store("redis://127.0.0.1:6379/0?no_such_option=1")


def test_prefix_is_taken_from_the_url_and_defaults_to_tasklock():
    services.require("redis")
    default = open_store("redis://127.0.0.1:6379/0")
    custom = open_store("redis://127.0.0.1:6379/0?prefix=team%20a:&socket_timeout=3")
    try:
        assert isinstance(default, RedisStore) and isinstance(custom, RedisStore)
        assert default.prefix == "tasklock:"
        assert custom.prefix == "team a:"
        assert custom.display_url == "redis://127.0.0.1:6379/0?prefix=team%20a:&socket_timeout=3"
    finally:
        default.close()
        custom.close()


def test_set_io_timeout_applies_to_new_connections(redis_store, redis_url):
    redis_store.set_io_timeout(1.5)
    kwargs = redis_store._conn.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == 1.5 and kwargs["socket_connect_timeout"] == 1.5
    assert redis_store.acquire("k", 30, HOLDER, token()) is not None
    # A timeout in the URL does not defeat the supervisor's bound.
    overridden = open_store(redis_url + "&socket_timeout=60&protocol=3")
    try:
        assert isinstance(overridden, RedisStore)
        overridden.set_io_timeout(1.5)
        kwargs = overridden._conn.client.connection_pool.connection_kwargs
        assert kwargs["socket_timeout"] == 1.5 and kwargs["protocol"] == 2
        info = overridden.peek("k")
        assert info is not None and info.fencing_token == 1
    finally:
        overridden.close()


def test_more_threads_than_pooled_connections_wait_for_one(redis_store):
    from tasklock_cli.stores.redis.connection import MAX_CONNECTIONS

    leases = [
        redis_store.acquire(f"k{n}", 30, HOLDER, token()) for n in range(MAX_CONNECTIONS + 50)
    ]
    errors: list[BaseException] = []

    def renew(lease) -> None:
        try:
            for _ in range(5):
                redis_store.renew(lease, 30)
        except BaseException as exc:  # collected: a thread's failure must fail the test
            errors.append(exc)

    in_threads(renew, [(lease,) for lease in leases])
    assert errors == []


def test_store_sockets_are_not_inherited_by_children(redis_store, other):
    lease = other.acquire("k", 30, OTHER, token())
    releaser = threading.Timer(0.1, lambda: other.release(lease))
    releaser.start()
    redis_store.wait_for_release("k", 2)  # a blocking BLPOP on its own pooled connection
    releaser.join()
    redis_store.peek("k")
    sockets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                sockets.append(int(fd))
        except OSError:
            continue
    assert sockets
    assert not [fd for fd in sockets if os.get_inheritable(fd)]


# -- doctor ---------------------------------------------------------------------------------


def test_doctor_reports_every_check(redis_store):
    checks = {c.name: c for c in redis_store.doctor()}
    assert set(checks) >= {
        "store",
        "reachable",
        "server",
        "persistence",
        "eviction",
        "scripts",
        "clock",
    }
    assert all(c.ok for c in checks.values())
    assert "ms" in checks["reachable"].detail
    assert "Redis" in checks["server"].detail


def test_doctor_warns_about_persistence_and_eviction(private):
    private.client().config_set("maxmemory-policy", "volatile-lru")
    store = open_store(private.url())
    try:
        checks = {c.name: c for c in store.doctor()}
        assert checks["persistence"].warning and "durable" in checks["persistence"].detail
        assert checks["eviction"].warning and "volatile" in checks["eviction"].detail
    finally:
        store.close()


def test_doctor_is_quiet_with_aof_and_noeviction():
    require_redis_server()
    with redis_support.private_redis(persistence=True) as server:
        store = open_store(server.url())
        try:
            checks = {c.name: c for c in store.doctor()}
            assert not checks["persistence"].warning, checks["persistence"].detail
            assert not checks["eviction"].warning
        finally:
            store.close()


def test_doctor_when_config_is_disabled():
    require_redis_server()
    with redis_support.private_redis(extra_args=["--rename-command", "CONFIG", '""']) as server:
        store = open_store(server.url())
        try:
            checks = {c.name: c for c in store.doctor()}
            assert checks["persistence"].warning
            assert "could not be checked" in checks["persistence"].detail
            assert checks["eviction"].ok  # from INFO memory instead
        finally:
            store.close()


# -- test support ---------------------------------------------------------------------------


def test_drop_namespace_removes_only_that_prefix(redis_store, raw_redis, prefix, redis_url):
    redis_store.acquire("k", 30, HOLDER, token())
    raw_redis.set(prefix[:-1] + b"-neighbour", b"keep")
    try:
        assert redis_support.drop_namespace(redis_url) == 3  # lease, counter, epoch record
        assert list(raw_redis.scan_iter(match=prefix + b"*")) == []
        assert raw_redis.get(prefix[:-1] + b"-neighbour") == b"keep"
    finally:
        raw_redis.delete(prefix[:-1] + b"-neighbour")


def test_unix_socket_urls_work(tmp_path):
    require_redis_server()
    sock = tmp_path / "redis.sock"
    with redis_support.private_redis(extra_args=["--unixsocket", str(sock)]) as server:
        assert server.ping()
        deadline = time.monotonic() + 5
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        store = open_store(f"unix://{sock}?db=0&prefix=unix-test:")
        redis_support.known_namespace(server.url(prefix="unix-test:"))
        try:
            lease = granted(store.acquire("k", 30, HOLDER, token()))
            assert lease.fencing_token == 1
            info = store.peek("k")
            assert info is not None and info.holder == HOLDER
            assert [i.key for i in store.list()] == ["k"]
            releaser = threading.Timer(0.1, lambda: store.release(lease))
            releaser.start()
            other = open_store(f"unix://{sock}?db=0&prefix=unix-test:")
            try:
                started = time.monotonic()
                other.wait_for_release("k", 5)
                assert time.monotonic() - started < 2
            finally:
                releaser.join()
                other.close()
        finally:
            store.close()


def test_a_semaphores_operations_take_one_round_trip_each(redis_url):
    """Slots change nothing of the one round trip: acquire (also into slot 2, also when
    every slot is held or the limit does not match), renew, release, holders."""
    with TcpProxy("127.0.0.1", urlsplit(redis_url).port or 6379) as proxy:
        store = open_store(proxy.url_for(redis_url))
        try:
            store.release(granted(store.acquire("warm-up", 30, HOLDER, token())))  # scripts loaded
            counted: dict[str, int] = {}

            def count(name: str, operation):
                before = proxy.round_trips
                try:
                    return operation()
                finally:
                    counted[name] = proxy.round_trips - before

            first = count("acquire", lambda: store.acquire("pool", 30, HOLDER, token(), limit=3))
            store.acquire("pool", 30, HOLDER, token(), limit=3)
            third = count("acquire slot 2", lambda: store.acquire("pool", 30, OTHER, token(), 3))
            assert (first.slot, third.slot) == (0, 2)
            assert count("full", lambda: store.acquire("pool", 30, OTHER, token(), 3)) is None
            with pytest.raises(LimitMismatch):
                count("mismatch", lambda: store.acquire("pool", 30, OTHER, token()))
            count("renew", lambda: store.renew(third, 30))
            assert len(count("holders", lambda: store.holders("pool"))) == 3
            assert count("release", lambda: store.release(third)) is True
        finally:
            store.close()
    assert len(counted) == 7 and counted == dict.fromkeys(counted, 1), counted


def test_a_call_reads_no_package_metadata(redis_url):
    """No CLIENT SETINFO, so no redis-py version read from its package metadata
    (importlib.metadata with the email package's parser, ~4 ms of a run): the connections
    are given ``driver_info=None`` wherever redis-py takes it."""
    from tests.support.imports import loaded_after_a_call

    assert loaded_after_a_call(redis_url, ["email.parser"]) == []
