"""etcd-only store behaviour: URL parsing, break / forced release / wait-for-break, the
key layout of slots (and what an older tasklock wrote), and the nested acquire txn."""

from __future__ import annotations

import base64
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterator
from datetime import datetime
from datetime import timezone

import pytest

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import Superseded
from tasklock_cli.stores import open_store
from tasklock_cli.stores.etcd import http
from tasklock_cli.stores.etcd.acquiring import SHARED_SLOTS_PER_TXN
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import parse_url
from tasklock_cli.stores.etcd.connection import prefix_end
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.etcd.store import SLOTS_PER_TXN
from tasklock_cli.stores.etcd.store import EtcdStore
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.provisioning import with_query
from tasklock_cli.testing.helpers import blocked_in
from tasklock_cli.testing.helpers import wait_until
from tests.support import services
from tests.support.cli import json_events
from tests.support.cli import start
from tests.support.cli import wait_for_holder
from tests.support.contract import granted

HOLDER = Holder(host="h", pid=1, user="u", command=["true"])


def test_url_lists_members_credentials_prefix_and_tls_files():
    config = parse_url("etcds://bob:p%40ss@a:1,[::1]:2,c/?prefix=x/&cacert=/ca&cert=/c&key=/k")
    assert config.members == [("a", 1), ("::1", 2), ("c", 2379)]
    assert (config.user, config.password, config.prefix, config.tls) == ("bob", "p@ss", "x/", True)
    assert (config.cacert, config.cert, config.key) == ("/ca", "/c", "/k")
    assert parse_url("etcd://h").prefix == "tasklock/"


@pytest.mark.parametrize(
    "url",
    [
        "etcd://h:1/?nope=1",
        "etcd://h:x",
        "etcd://h:1/?cacert=/ca",  # TLS files need etcds://
        "etcds://h:1/?cert=/c",  # cert without key
        "etcd://h:1/?prefix=",
        "etcd://:1",
    ],
)
def test_bad_urls_are_config_errors_without_the_password(url):
    with pytest.raises(ConfigError) as caught:
        parse_url(url.replace("://", "://u:secret-pw@"))
    assert "secret-pw" not in str(caught.value)


def test_prefix_end_is_etcds_range_end():
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\0"


@pytest.fixture
def url() -> Iterator[str]:
    services.require("etcd")
    url = with_query(services.base_url("etcd"), prefix=f"tasklock-test-{uuid.uuid4().hex[:12]}/")
    yield url
    services.cleanup("etcd", url)


def open_etcd(url: str) -> EtcdStore:
    store = open_store(url)
    assert isinstance(store, EtcdStore)
    return store


@pytest.fixture
def clients(url) -> Iterator[tuple[EtcdStore, EtcdStore]]:
    a, b = open_etcd(url), open_etcd(url)
    yield a, b
    a.close()
    b.close()


def test_a_broken_lease_is_held_until_its_owner_lets_go(clients):
    holder, ops = clients
    lease = holder.acquire("k", 30, HOLDER, "owner")
    assert ops.break_lease("k", token=lease.fencing_token + 1) == []  # wrong token
    holder.renew(lease, 30)
    (broken,) = ops.break_lease("k")
    assert broken.fencing_token == lease.fencing_token
    assert [info.fencing_token for info in ops.break_lease("k")] == [lease.fencing_token]
    with pytest.raises(LeaseLost):
        holder.renew(lease, 30)
    assert ops.acquire("k", 30, HOLDER, "other") is None
    assert ops.peek("k").fencing_token == lease.fencing_token
    assert holder.release(lease) is True
    assert ops.peek("k") is None
    nxt = ops.acquire("k", 30, HOLDER, "other")
    assert nxt is not None and nxt.fencing_token > lease.fencing_token


def test_force_release_with_a_token_frees_only_that_lease(clients):
    holder, ops = clients
    lease = holder.acquire("k", 30, HOLDER, "owner")
    assert ops.force_release("k", token=lease.fencing_token + 1) == []
    assert ops.peek("k") is not None
    (freed,) = ops.force_release("k", token=lease.fencing_token)
    assert freed.fencing_token == lease.fencing_token
    assert ops.peek("k") is None
    with pytest.raises(LeaseLost):
        holder.renew(lease, 30)


def test_wait_for_break_wakes_promptly_times_out_and_heeds_wake_fd(clients, monkeypatch):
    holder, ops = clients
    lease = holder.acquire("k", 30, HOLDER, "owner")
    started = time.monotonic()
    assert holder.wait_for_break(lease, 0.2) is False
    assert 0.2 <= time.monotonic() - started < 2.0  # its timeout, not the 5 s I/O timeout
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"x")
        started = time.monotonic()
        assert holder.wait_for_break(lease, 5, read_end) is False
        assert time.monotonic() - started < 2.0  # the wake fd, not the 5 s timeout
    finally:
        os.close(read_end)
        os.close(write_end)

    def breaker() -> None:
        time.sleep(0.2)
        ops.break_lease("k")

    looks: list[bytes] = []
    real_range = holder._client.range

    def counted_range(name):
        looks.append(name)
        return real_range(name)

    monkeypatch.setattr(holder._client, "range", counted_range)
    thread = threading.Thread(target=breaker)
    thread.start()
    assert holder.wait_for_break(lease, 5) is True
    thread.join()
    # Heard through the watch: one look at the key as it opened, no polling after it (a
    # poll every 0.1 s and a loaded machine's scheduler delay it alike: counted, not timed).
    assert len(looks) == 1, looks
    assert holder.wait_for_break(lease, 5) is True  # a break before the call is seen


def test_a_holder_lets_go_of_a_break_as_soon_as_its_lease_is_revoked(url, cli_env, monkeypatch):
    """A break moves the slot's keys to the breaker's lease, then revokes the holder's, a
    round trip later. A holder that renewed in between (the keepalive of its emptied lease
    succeeds) once heard of the break only at its next look, a second later: `release
    --force` said "let go after 1.01s" on etcd, 0.02s elsewhere. Here the revoke comes 0.3 s
    after the move, and the holder, through the real executable, is lost right after it."""
    env = {**cli_env, "TASKLOCK_STORE": url}
    holder = start("--log-format", "json", "run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(url, "k")
        ops = open_etcd(url)
        real_revoke = ops._client.revoke
        monkeypatch.setattr(ops._client, "revoke", lambda lease_id: _late(real_revoke, lease_id))
        broke_at = time.time()
        assert len(ops.break_lease("k", by=HOLDER)) == 1
        _, stderr = holder.communicate(timeout=20)
        ops.close()
    finally:
        holder.kill()
        holder.wait()
    (lost,) = [event for event in json_events(stderr) if event["event"] == "lost"]
    after = datetime.fromisoformat(lost["ts"][:-1]).replace(tzinfo=timezone.utc).timestamp()
    # the revoke's 0.3 s and the holder's next look, not the second its hints wait
    assert 0.3 <= after - broke_at < 0.8, stderr


def _late(revoke: Callable[[int], bool], lease_id: int) -> bool:
    time.sleep(0.3)
    return revoke(lease_id)


@pytest.fixture
def auth_member() -> Iterator[str]:
    """A private member with etcd authentication on (user root, password root-pw)."""
    services.require("etcd")
    from tests.support import etcd

    member = etcd.EtcdCluster(1, heartbeat_ms=50, election_ms=500)
    member.start()
    try:
        base = member.client_url(0)
        etcd.post(base, "/v3/auth/user/add", {"name": "root", "password": "root-pw"})
        etcd.post(base, "/v3/auth/role/add", {"name": "root"})
        etcd.post(base, "/v3/auth/user/grant", {"user": "root", "role": "root"})
        etcd.post(base, "/v3/auth/enable", {})
        yield f"127.0.0.1:{member.client_ports[0]}"
    finally:
        member.stop()


def test_etcd_auth_right_wrong_and_missing_credentials(auth_member, cli_env):
    from tests.support.cli import one_error_line
    from tests.support.cli import tasklock

    def run(userinfo: str):
        url = f"etcd://{userinfo}{auth_member}/?prefix=auth/"
        return tasklock("run", "k", "--", "true", env={**cli_env, "TASKLOCK_STORE": url})

    assert run("root:root-pw@").returncode == 0
    wrong = run("root:not-the-pw@")
    assert wrong.returncode == 78, wrong.stderr
    assert "refused the credentials" in one_error_line(wrong.stderr)
    assert "not-the-pw" not in wrong.stderr
    missing = run("")
    assert missing.returncode == 78, missing.stderr
    assert "requires authentication" in one_error_line(missing.stderr)


def _older_tasklocks_lock(url: str, key: str) -> int:
    """A plain lock as the previous tasklock writes it (no slots, no limit); its token."""
    from tests.support import etcd

    config = parse_url(url)
    base = "http://{}:{}".format(*config.members[0])
    etcd.post(base, "/v3/lease/grant", {"ID": "4242", "TTL": "30"})
    value = {"owner": "old", "holder": HOLDER.to_dict(), "acquired_at": 1, "ttl": 30}
    name = (config.prefix + "lock/" + key).encode()
    put = {"key": b64(name), "value": b64(json.dumps(value).encode()), "lease": "4242"}
    reply = etcd.post(base, "/v3/kv/put", put)
    return int(reply["header"]["revision"])


def test_a_lock_of_the_previous_version_is_slot_zero_of_limit_one(url, clients):
    holder, ops = clients
    old_token = _older_tasklocks_lock(url, "k")
    (info,) = ops.holders("k")
    assert (info.slot, info.limit, info.fencing_token) == (0, 1, old_token)
    assert holder.acquire("k", 30, HOLDER, "new") is None
    with pytest.raises(LimitMismatch) as caught:
        holder.acquire("k", 30, HOLDER, "new", limit=3)
    assert (caught.value.held, caught.value.asked) == (1, 3)
    assert [freed.fencing_token for freed in ops.force_release("k")] == [old_token]
    lease = holder.acquire("k", 30, HOLDER, "new", limit=3)
    assert lease.slot == 0 and lease.fencing_token > old_token


def test_a_plain_lock_keeps_the_previous_versions_key_and_value(url, clients):
    """An older tasklock sharing the store sees a plain lock as before: its lock key, and a
    value with the fields it knows."""
    from tests.support import etcd

    holder, _ = clients
    lease = holder.acquire("k", 30, HOLDER, "owner")
    config = parse_url(url)
    base = "http://{}:{}".format(*config.members[0])
    start = (config.prefix + "lock/").encode()
    body = {"key": b64(start), "range_end": b64(prefix_end(start))}
    (kv,) = etcd.post(base, "/v3/kv/range", body)["kvs"]
    assert base64.b64decode(kv["key"]) == start + b"k"
    assert int(kv["create_revision"]) == lease.fencing_token
    value = json.loads(base64.b64decode(kv["value"]))
    assert sorted(value) == ["acquired_at", "holder", "owner", "ttl"]


def count_exchanges(monkeypatch) -> list[int]:
    """From now on, the number of requests of each HTTP exchange with etcd (pipelined
    requests are one exchange)."""
    exchanges: list[int] = []
    exchange = http.Connection.exchange

    def counted(connection, requests, deadline):
        exchanges.append(len(requests))
        return exchange(connection, requests, deadline)

    monkeypatch.setattr(http.Connection, "exchange", counted)
    return exchanges


def test_a_semaphore_acquire_is_one_pipelined_exchange_however_many_slots_it_tries(
    clients, monkeypatch
):
    holder, other = clients
    for _ in range(SLOTS_PER_TXN - 1):
        assert holder.acquire("pool", 30, HOLDER, uuid.uuid4().hex, limit=SLOTS_PER_TXN)
    exchanges = count_exchanges(monkeypatch)
    lease = other.acquire("pool", 30, HOLDER, "last", limit=SLOTS_PER_TXN)
    assert lease.slot == SLOTS_PER_TXN - 1
    assert exchanges == [2]  # the lease grant and the txn, pipelined
    exchanges.clear()
    assert other.acquire("pool", 30, HOLDER, "one-too-many", limit=SLOTS_PER_TXN) is None
    assert exchanges == [2]


def test_a_limit_past_one_txn_goes_on_where_the_read_says(clients):
    """Past SLOTS_PER_TXN slots (etcd's bound on a txn's ops) the refusal's read tells
    the next txn where the lowest free slot is."""
    holder, other = clients
    limit = SLOTS_PER_TXN + 5
    leases = [
        holder.acquire("wide", 30, HOLDER, uuid.uuid4().hex, limit=limit) for _ in range(limit)
    ]
    assert [lease.slot for lease in leases] == list(range(limit))
    tokens = [lease.fencing_token for lease in leases]
    assert tokens == sorted(set(tokens))
    assert other.acquire("wide", 30, HOLDER, "x", limit=limit) is None
    assert holder.release(leases[SLOTS_PER_TXN + 2]) is True
    again = other.acquire("wide", 30, HOLDER, "x", limit=limit)
    assert again.slot == SLOTS_PER_TXN + 2 and again.fencing_token > tokens[-1]
    assert [info.slot for info in other.holders("wide")] == list(range(limit))


def test_a_slot_key_cannot_be_another_keys_lock(clients):
    """A key whose name looks like another key's slot is a key of its own."""
    holder, other = clients
    leases = [holder.acquire("a", 30, HOLDER, uuid.uuid4().hex, limit=2) for _ in range(2)]
    look_alike = "a/2/" + "1".zfill(10)
    assert other.acquire(look_alike, 30, HOLDER, "o") is not None
    assert [info.slot for info in other.holders("a")] == [0, 1]
    assert [(info.key, info.slot) for info in other.list()] == [
        ("a", 0),
        ("a", 1),
        (look_alike, 0),
    ]
    assert holder.release(leases[1]) is True


# -- lock modes and the queue's classes ------------------------------------------------------


def test_shared_slots_cannot_be_mistaken_for_a_plain_lock_by_an_older_tasklock():
    """An older tasklock's exclusive acquire compares the lock key absent and no key under
    ``K NUL`` but limit 1's: every shared slot's key is in what it compares."""
    keys = EtcdKeys("p/", "etcd://h")
    lock = keys.lock_key("k")
    for slot in (0, 1, 12):
        name = keys.slot_key("k", slot, 1, SHARED)
        assert name != lock and lock + b"\0" <= name < lock + b"\x001/"


def test_shared_slots_past_one_txn_go_on_where_the_read_says(clients):
    holder, other = clients
    count = SHARED_SLOTS_PER_TXN + 3
    leases = [holder.acquire("r", 30, HOLDER, uuid.uuid4().hex, mode=SHARED) for _ in range(count)]
    assert [lease.slot for lease in leases] == list(range(count))
    assert {(lease.mode, lease.limit) for lease in leases} == {(SHARED, 1)}
    assert holder.release(leases[SHARED_SLOTS_PER_TXN + 1]) is True
    again = other.acquire("r", 30, HOLDER, "x", mode=SHARED)
    assert again.slot == SHARED_SLOTS_PER_TXN + 1
    assert again.fencing_token > max(lease.fencing_token for lease in leases)
    assert other.acquire("r", 30, HOLDER, "y", mode=SHARED).slot == count
    assert other.acquire("r", 30, HOLDER, "w") is None


def _waits(client: EtcdStore, key: str, seconds: float, woken: dict, name: str):
    def wait() -> None:
        client.wait_for_release(key, seconds)
        woken[name] = time.monotonic()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def test_a_release_wakes_the_run_of_shared_waiters_at_the_head_and_no_one_else(url):
    """Queue: shared, shared, exclusive. The release wakes both shared waiters (they are
    admitted together); the exclusive one watches the shared place ahead of it."""
    clients = [open_etcd(url) for _ in range(4)]
    try:
        writer, *waiters = clients
        lease = granted(writer.acquire("k", 30, HOLDER, "writer"))
        modes = (SHARED, SHARED, EXCLUSIVE)
        for n, (client, mode) in enumerate(zip(waiters, modes, strict=True)):
            assert client.acquire("k", 30, HOLDER, f"w{n}", queue=True, mode=mode) is None
        woken: dict[str, float] = {}
        threads = [_waits(client, "k", 2.5, woken, f"w{n}") for n, client in enumerate(waiters)]
        # each has taken its turn and watches: the shared ones the slots, the exclusive one
        # the shared place ahead of it
        watching = ("await_release", "await_release", "_watch_place")
        wait_until(lambda: all(map(blocked_in, threads, watching)))
        assert woken == {}
        released = time.monotonic()
        assert writer.release(lease) is True
        for thread in threads[:2]:
            thread.join(5)
        assert set(woken) == {"w0", "w1"}
        assert all(released < at < released + 0.5 for at in woken.values()), (released, woken)
        assert "w2" not in woken  # not a thundering herd
        for thread in threads:
            thread.join(5)
    finally:
        for client in clients:
            client.close()


def test_front_places_go_newest_first_and_supersede_across_modes(url):
    clients = [open_etcd(url) for _ in range(6)]
    try:
        holder, plain, first, second, older, newer = clients
        lease = granted(holder.acquire("k", 30, HOLDER, "holder"))

        def joins(client: EtcdStore, pid: int, **queueing) -> None:
            who = Holder("h", pid, "u")
            assert client.acquire("k", 30, who, f"o{pid}", queue=True, **queueing) is None

        joins(plain, 1)
        joins(first, 2, front=True)
        joins(second, 3, front=True, mode=SHARED)
        joins(older, 4, supersede=True, mode=SHARED)
        assert [(w.holder.pid, w.mode) for w in holder.waiters("k")] == [
            (3, SHARED),
            (2, EXCLUSIVE),
            (1, EXCLUSIVE),
            (4, SHARED),
        ]
        joins(newer, 5, supersede=True, front=True)  # an exclusive one supersedes a shared one
        assert [w.holder.pid for w in holder.waiters("k")] == [5, 3, 2, 1]
        with pytest.raises(Superseded):
            older.acquire("k", 30, Holder("h", 4, "u"), "o4", queue=True, mode=SHARED)
        assert holder.waiting_counts() == {"k": 4}
        assert holder.release(lease) is True
        assert second.acquire("k", 30, Holder("h", 3, "u"), "o3", mode=SHARED) is None
        assert newer.acquire("k", 30, Holder("h", 5, "u"), "o5") is not None
    finally:
        for client in clients:
            client.close()


def test_a_woken_waiters_acquire_attaches_its_fresh_spare_lease_without_a_keepalive(
    clients, monkeypatch
):
    """A refused acquire keeps its lease for the next; taken within SPARE_FRESH_S, the
    acquire is the txn alone, and its holder's deadline counts from the lease's keepalive,
    not from the acquire. A staler spare is kept alive in the same exchange."""
    from tasklock_cli.run.keeper import LeaseKeeper
    from tasklock_cli.stores.etcd.store import SPARE_FRESH_S
    from tasklock_cli.util import clock as clocks

    holder, waiter = clients
    held = granted(holder.acquire("k", 30, HOLDER, "holder"))
    keeper = LeaseKeeper(waiter, "k", 30, HOLDER)
    assert keeper.try_acquire(queue=True) is False  # grants the spare lease
    exchanges = count_exchanges(monkeypatch)
    assert holder.release(held) is True
    time.sleep(0.2)
    waiter.wait_for_release("k", 5)  # sees the slot free: the acquire goes straight
    exchanges.clear()
    before = clocks.monotonic()
    assert keeper.try_acquire(queue=True) is True
    assert exchanges == [1]  # the txn alone
    assert granted(keeper.lease).fencing_token > held.fencing_token
    # the deadline counts from the spare's keepalive, at least 0.2 s before the acquire
    assert before + 30 - SPARE_FRESH_S <= keeper.deadline <= before + 30 - 0.2
    left = waiter.time_left("k", granted(keeper.lease).fencing_token)
    assert left is not None and left >= keeper.remaining() - 1  # etcd: whole seconds

    # a spare kept alive longer ago than SPARE_FRESH_S is kept alive by the acquire
    assert keeper.release() is True
    again = holder.acquire("k", 30, HOLDER, "holder-2")
    stale = LeaseKeeper(waiter, "k", 30, HOLDER)
    assert stale.try_acquire(queue=True) is False
    assert holder.release(again) is True
    waiter.wait_for_release("k", 5)
    later = clocks.monotonic() + SPARE_FRESH_S + 0.5
    monkeypatch.setattr(clocks, "monotonic", lambda: later)
    exchanges.clear()
    before = stale.clock()  # the keeper's own clock, not the one moved on
    assert stale.try_acquire(queue=True) is True
    assert exchanges == [2]  # the keepalive and the txn, pipelined
    assert stale.deadline >= before + 30  # its TTL began with this acquire


def test_a_waiters_tries_without_a_release_heard_write_nothing(clients, monkeypatch):
    """A refused acquire's txn is a Raft write (a disk sync on every member), even with
    nothing put: a waiter whose wait heard no release looks with reads alone, and sends
    the acquire's txn only once a slot is free for it."""
    holder, waiter = clients
    held = holder.acquire("k", 30, HOLDER, "holder")
    assert waiter.acquire("k", 30, HOLDER, "waiter", queue=True) is None  # joins the queue
    sent: list[dict] = []
    call = waiter._client.members.call

    def recorded(requests):
        sent.extend(body for path, body in requests if path == "/v3/kv/txn")
        return call(requests)

    monkeypatch.setattr(waiter._client.members, "call", recorded)
    for _ in range(3):
        waiter.wait_for_release("k", 0.05)  # runs out: no release heard
        assert waiter.acquire("k", 30, HOLDER, "waiter", queue=True) is None
    assert sent and not any(_writes(txn) for txn in sent)

    assert holder.release(held) is True
    waiter.wait_for_release("k", 5)
    sent.clear()
    lease = waiter.acquire("k", 30, HOLDER, "waiter", queue=True)
    assert lease is not None and len(sent) == 1 and _writes(sent[0])  # the txn at once


def test_a_waiters_looks_keep_its_spare_lease_alive(clients, monkeypatch):
    """The spare lease a refused acquire granted outlives a wait longer than its TTL (the
    looks keep it alive): the acquire after the release is still the txn alone."""
    holder, waiter = clients
    held = holder.acquire("k", 30, HOLDER, "holder")
    assert waiter.acquire("k", 2, HOLDER, "waiter", queue=True) is None
    spare = waiter._spare.lease_id
    until = time.monotonic() + 3.5  # past the spare's TTL of 2 s
    while time.monotonic() < until:
        waiter.wait_for_release("k", 0.3)
        assert waiter.acquire("k", 2, HOLDER, "waiter", queue=True) is None
    assert holder.release(held) is True
    waiter.wait_for_release("k", 5)
    exchanges = count_exchanges(monkeypatch)
    lease = waiter.acquire("k", 2, HOLDER, "waiter", queue=True)
    assert lease is not None and exchanges == [1]
    assert waiter._held[("k", "waiter", lease.fencing_token)].lease_id == spare


def test_a_waiter_lease_is_revoked_at_close_only_while_it_holds_places(url, clients, monkeypatch):
    """A run that waited and then took the lock holds no place any more: its waiter lease
    runs out on its own, without a revoke (a write to the log, just as the next holder's
    acquire needs it). A run that gives up with its place still there revokes it, so the
    waiters behind it move up at once."""
    holder, waiter = clients
    held = holder.acquire("k", 30, HOLDER, "holder")
    assert waiter.acquire("k", 30, HOLDER, "waiter", queue=True) is None
    assert holder.acquire("k2", 30, HOLDER, "holder") is not None
    assert waiter.acquire("k2", 30, HOLDER, "waiter", queue=True) is None  # a second place
    sent: list[str] = []
    call = waiter._client.members.call

    def recorded(requests):
        sent.extend(path for path, _ in requests)
        return call(requests)

    monkeypatch.setattr(waiter._client.members, "call", recorded)
    assert holder.release(held) is True
    waiter.wait_for_release("k", 5)
    assert waiter.acquire("k", 30, HOLDER, "waiter", queue=True) is not None
    waiter._queue.close()  # still waiting for k2: its place goes with the lease
    assert "/v3/lease/revoke" in sent
    assert holder.waiters("k2") == []

    other = EtcdStore.from_url(url)
    try:
        lease = holder.acquire("k3", 30, HOLDER, "holder")
        assert other.acquire("k3", 30, HOLDER, "other", queue=True) is None
        assert holder.release(lease) is True
        other.wait_for_release("k3", 5)
        assert other.acquire("k3", 30, HOLDER, "other", queue=True) is not None
        revoked: list[int] = []
        monkeypatch.setattr(other._client, "revoke", revoked.append)
        other._queue.close()
        assert revoked == []  # its only place went with its acquire
    finally:
        other.close()


def test_a_chunk_cut_short_is_read_whole_later():
    """A streamed reply read up to a deadline that falls inside a chunk (its size line
    come, its data not) goes on where it was: the watch of a waiter outlives the
    refreshes of its lease."""
    import socket

    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        connection = http.Connection("127.0.0.1", port, None, time.monotonic() + 5)
        peer, _ = server.accept()
        with peer:
            stream = http.Stream(connection)
            peer.sendall(b'1b\r\n{"result": {"events": [')
            assert stream.next(time.monotonic() + 0.05) is None  # the deadline, mid-chunk
            peer.sendall(b"]}}\n\r\n")
            assert stream.next(time.monotonic() + 5) == {"result": {"events": []}}
            peer.sendall(b"0\r\n\r\n")
            with pytest.raises(http.HttpError):
                stream.next(time.monotonic() + 5)  # the stream ended
        connection.close()


def test_a_waiter_keeps_one_watch_while_it_keeps_its_place(clients, monkeypatch):
    """A waiter's lease is refreshed every third of its TTL on the client's connection,
    its watch going on: one watch for the whole wait, not one per refresh."""
    holder, waiter = clients
    held = holder.acquire("k", 30, HOLDER, "holder")
    assert waiter.acquire("k", 30, HOLDER, "waiter", queue=True) is None
    streams: list[str] = []
    keepalives: list[str] = []
    open_stream, call = waiter._client.members.open_stream, waiter._client.members.call

    def counted_stream(path, body, deadline):
        streams.append(path)
        return open_stream(path, body, deadline)

    def counted_call(requests):
        keepalives.extend(path for path, _ in requests if path == "/v3/lease/keepalive")
        return call(requests)

    monkeypatch.setattr(waiter._client.members, "open_stream", counted_stream)
    monkeypatch.setattr(waiter._client.members, "call", counted_call)
    waiter.wait_for_release("k", 2.6)  # the waiter lease (3 s) is refreshed twice
    assert streams == ["/v3/watch"] and len(keepalives) >= 2
    assert [info.holder.pid for info in holder.waiters("k")] == [HOLDER.pid]  # still queued
    assert holder.release(held) is True


def test_a_waiter_whose_watch_fails_keeps_its_place_while_it_polls(clients, monkeypatch):
    """With its watch broken, a waiter polls the key; its wait can outlast its waiter lease
    (a plain waiter waits up to QUIET_LOOK_CEILING_S between looks), so the polling keeps
    the lease alive: the waiter keeps its place in the queue."""
    from tasklock_cli.stores.etcd.connection import EtcdError

    holder, waiter = clients
    held = holder.acquire("k", 30, HOLDER, "holder")
    assert waiter.acquire("k", 30, HOLDER, "waiter", queue=True) is None

    def broken(*_args, **_kwargs):
        raise EtcdError(14, "the watch broke")

    monkeypatch.setattr(waiter._client, "open_watch", broken)
    waiter.wait_for_release("k", 5.0)  # longer than the 3 s waiter lease
    assert len(holder.waiters("k")) == 1
    assert holder.release(held) is True


def test_a_release_right_after_a_waiters_look_wakes_it_at_once(clients, monkeypatch):
    """A waiter opens its watch before it looks at the key: a release just after the look
    is heard at once. (A watch that starts at the look's revision starts in the past once
    the release is in, and etcd catches such watches up only every 100 ms.)"""
    import statistics

    from tasklock_cli.stores.etcd import store as etcd_store

    holder, waiter = clients
    look = etcd_store.read_slots
    heard_after: list[float] = []
    for attempt in range(5):
        held = holder.acquire("k", 30, HOLDER, f"holder-{attempt}")
        assert waiter.acquire("k", 30, HOLDER, "waiter", queue=True) is None
        released: list[float] = []

        def look_then_release(client, keys, key, held=held, released=released):
            found = look(client, keys, key)
            if not released:
                assert holder.release(held) is True
                released.append(time.monotonic())
            return found

        monkeypatch.setattr(etcd_store, "read_slots", look_then_release)
        waiter.wait_for_release("k", 5)
        heard_after.append(time.monotonic() - released[0])
        monkeypatch.setattr(etcd_store, "read_slots", look)
        lease = waiter.acquire("k", 30, HOLDER, "waiter", queue=True)
        assert lease is not None and waiter.release(lease) is True
    assert statistics.median(heard_after) < 0.025, heard_after


def _writes(txn: dict) -> bool:
    """Whether a txn (nested ones included) has a put or a delete in either branch."""
    for op in [*txn.get("success", []), *txn.get("failure", [])]:
        if "request_put" in op or "request_delete_range" in op:
            return True
        if "request_txn" in op and _writes(op["request_txn"]):
            return True
    return False
