"""The waiter (run.waiter) on an injected clock, no sleeping: back-off, wake-ups, signals,
--replace and --supersede."""

from __future__ import annotations

import itertools
import math
import signal

import pytest

from tasklock_cli.errors import Interrupted
from tasklock_cli.run.conflict import Conflict
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.waiter import FIRST_RETRY_S
from tasklock_cli.run.waiter import POLL_CEILING_S
from tasklock_cli.run.waiter import SIGNALLED_POLL_CEILING_S
from tasklock_cli.run.waiter import WAITING_EVENT_EVERY_S
from tasklock_cli.run.waiter import Waiter
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import LeaseInfo
from tests.support.contract import granted
from tests.support.engine import HOLDER
from tests.support.engine import FakeClock
from tests.support.engine import PlaceKeepingSlowStore
from tests.support.engine import SignalledStore
from tests.support.engine import SignallingSlowStore
from tests.support.engine import SlowStore


@pytest.fixture
def clock():
    return FakeClock()


def test_waiter_backs_off_to_a_ceiling_and_gives_up_at_the_wait(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 3600.0, HOLDER, clock)
    assert holder.try_acquire()
    waiter_keeper = LeaseKeeper(store, "k", 10.0, HOLDER, clock)
    announced: list[LeaseInfo] = []
    started = clock()
    with pytest.raises(Conflict) as conflict:
        Waiter(waiter_keeper, 2.0, on_waiting=announced.append, rng=lambda: 0.5).acquire()
    assert clock() - started == pytest.approx(2.0)
    assert store.waits[0] == pytest.approx(FIRST_RETRY_S)
    assert max(store.waits) == pytest.approx(POLL_CEILING_S)
    assert store.waits[:4] == sorted(store.waits[:4])
    assert len(announced) == 1 and announced[0].fencing_token == holder.fencing_token
    assert conflict.value.exit_code == 75
    assert "is held by h pid 1" in str(conflict.value)
    assert store.stopped_waiting == ["k"]  # its place in the queue is given up


def test_waiter_of_a_store_that_signals_releases_polls_rarely(tmp_path, clock):
    store = SignallingSlowStore(tmp_path / "db", clock)
    assert LeaseKeeper(store, "k", 3600.0, HOLDER, clock).try_acquire()
    with pytest.raises(Conflict):
        Waiter(LeaseKeeper(store, "k", 10.0, HOLDER, clock), 8.0, rng=lambda: 0.5).acquire()
    assert max(store.waits) == pytest.approx(SIGNALLED_POLL_CEILING_S)


@pytest.mark.parametrize("flag", [None, "supersede"])
def test_a_waiter_whose_waits_keep_its_place_looks_seldom_unless_it_may_be_superseded(
    tmp_path, clock, flag
):
    """Where a store's waits keep the place and lose no wake-up (etcd), a plain waiter's
    looks only back the wake-up up: every QUIET_LOOK_CEILING_S. One that may find its
    place superseded still looks every second. The `waiting` event
    still comes every WAITING_EVENT_EVERY_S."""
    from tasklock_cli.run.waiter import QUIET_LOOK_CEILING_S

    store = PlaceKeepingSlowStore(tmp_path / "db", clock)
    assert LeaseKeeper(store, "k", 3600.0, HOLDER, clock).try_acquire()
    announced: list[float] = []
    options = {flag: True} if flag else {}
    keeper = LeaseKeeper(store, "k", 10.0, HOLDER, clock)
    waiter = Waiter(keeper, 100.0, on_waiting=lambda _: announced.append(clock()), **options)
    waiter.rng = lambda: 1.0  # the longest waits the back-off allows
    with pytest.raises(Conflict):
        waiter.acquire()
    ceiling = SIGNALLED_POLL_CEILING_S if flag else QUIET_LOOK_CEILING_S
    assert max(store.waits) <= ceiling * 1.5 and max(store.waits) >= ceiling
    gaps = [later - earlier for earlier, later in itertools.pairwise(announced)]
    assert gaps and all(gap == pytest.approx(WAITING_EVENT_EVERY_S) for gap in gaps), gaps


def test_waiter_with_zero_wait_does_not_wait(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock)
    assert LeaseKeeper(store, "k", 60.0, HOLDER, clock).try_acquire()
    with pytest.raises(Conflict):
        Waiter(LeaseKeeper(store, "k", 60.0, HOLDER, clock), 0.0).acquire()
    assert store.waits == []


def test_waiter_gets_the_lease_once_it_expires_on_the_store_clock(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock)
    first = LeaseKeeper(store, "k", 1.0, HOLDER, clock)
    assert first.try_acquire()
    second = LeaseKeeper(store, "k", 1.0, HOLDER, clock)
    Waiter(second, math.inf).acquire()
    assert second.fencing_token == granted(first.lease).fencing_token + 1
    assert clock() >= first.deadline
    assert store.stopped_waiting == []  # the acquire itself ended the wait


@pytest.mark.parametrize("during", ["wait", "acquire"])
def test_a_signal_stops_the_wait_but_never_cuts_a_store_call_short(tmp_path, clock, during):
    store = SignalledStore(tmp_path / "db", clock, during)
    assert LeaseKeeper(store, "k", 60.0, HOLDER, clock).try_acquire()
    store.waiter = waiter = Waiter(LeaseKeeper(store, "k", 60.0, HOLDER, clock), 10.0)
    with pytest.raises(Interrupted) as stopped:
        waiter.acquire()
    assert stopped.value.exit_code == 128 + signal.SIGTERM
    # In the wait: out of it at once. In an acquire: that call finished, no wait followed.
    assert len(store.waits) == (1 if during == "wait" else 0)
    # A wait cut short may have left a store call half done: the caller closes the store.
    assert store.stopped_waiting == []


def test_a_long_wait_repeats_the_waiting_announcement_naming_the_holder(tmp_path, clock):
    store = SignallingSlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 3600.0, HOLDER, clock)
    assert holder.try_acquire()
    announced: list[tuple[float, int]] = []
    started = clock()

    def note(info):
        announced.append((clock() - started, info.fencing_token))

    with pytest.raises(Conflict) as conflict:
        Waiter(LeaseKeeper(store, "k", 10.0, HOLDER, clock), 100.0, on_waiting=note).acquire()
    times = [at for at, _ in announced]
    assert len(announced) == 4  # at 0, then every WAITING_EVENT_EVERY_S (30 s) up to 100 s
    assert times[0] == 0
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert all(WAITING_EVENT_EVERY_S <= gap <= WAITING_EVENT_EVERY_S + 1.5 for gap in gaps), gaps
    assert {token for _, token in announced} == {holder.fencing_token}
    assert str(conflict.value) == (
        "gave up waiting 1m40s: 'k' is held by h pid 1 (user u, token 1), who held it throughout"
    )
    assert conflict.value.waited == 100.0


def test_giving_up_names_the_holder_at_the_end_and_the_one_the_wait_began_with(
    tmp_path, clock, monkeypatch
):
    store = SlowStore(tmp_path / "db", clock)
    first = LeaseKeeper(store, "k", 1.0, HOLDER, clock)
    assert first.try_acquire()
    later_holder = Holder(host="h2", pid=2, user="u2", command=["true"])
    second = LeaseKeeper(store, "k", 3600.0, later_holder, clock)
    assert not second.try_acquire(queue=True)  # first in the queue: served before our waiter

    waiter = Waiter(LeaseKeeper(store, "k", 10.0, HOLDER, clock), 5.0)
    original_wait = store.wait_for_release

    def wait_then_let_second_take_over(key, timeout, wake_fd=None):
        original_wait(key, timeout)
        if clock() > first.deadline and second.lease is None:
            assert second.try_acquire(queue=True)

    monkeypatch.setattr(store, "wait_for_release", wait_then_let_second_take_over)
    with pytest.raises(Conflict) as conflict:
        waiter.acquire()
    assert str(conflict.value) == (
        "gave up waiting 5s: 'k' is held by h2 pid 2 (user u2, token 2) now "
        "(by h pid 1 (user u, token 1) when the wait began)"
    )


def test_an_immediate_conflict_says_until_when_not_how_long_it_waited(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock)
    assert LeaseKeeper(store, "k", 60.0, HOLDER, clock).try_acquire()
    with pytest.raises(Conflict) as conflict:
        Waiter(LeaseKeeper(store, "k", 60.0, HOLDER, clock), 0.0).acquire()
    assert str(conflict.value).startswith("'k' is held by h pid 1 (user u, token 1) until ")
    assert conflict.value.waited == 0.0


def test_replace_waits_past_the_wait_while_the_lease_it_broke_is_live(tmp_path, clock):
    """A holder that does not let go keeps its broken lease until it runs out on the store's
    clock: --replace (with --wait 0) waits for that, then takes the key."""
    store = SlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 30.0, HOLDER, clock)
    assert holder.try_acquire()
    replacer = LeaseKeeper(store, "k", 10.0, Holder("h2", 2, "v"), clock)
    broken: list[LeaseInfo] = []
    Waiter(replacer, 0.0, rng=lambda: 0.5, replace=True, on_broken=broken.extend).acquire()
    assert [info.fencing_token for info in broken] == [holder.fencing_token]
    assert granted(replacer.lease).fencing_token > granted(holder.lease).fencing_token
    # the holder never let go: the replacer got the key once the lease ran out, not sooner
    assert 30.0 <= clock() - holder.acquired_at <= 30.0 + POLL_CEILING_S * 2
    assert store.broken_by(granted(holder.lease)) is None  # freed by expiry, no longer on the store


def test_replace_breaks_in_its_own_name_and_marks_it(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 30.0, HOLDER, clock)
    assert holder.try_acquire()
    replacer = LeaseKeeper(store, "k", 10.0, Holder("h2", 2, "v"), clock)
    waiter = Waiter(replacer, 0.0, replace=True)
    assert waiter._break_holders() is True
    assert store.broken_by(granted(holder.lease)) == {
        "host": "h2",
        "pid": 2,
        "user": "v",
        "replaced": True,
    }
    assert holder.release() is True
    assert waiter._break_holders() is False


def test_a_plain_wait_is_not_extended(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 30.0, HOLDER, clock)
    assert holder.try_acquire()
    started = clock()
    with pytest.raises(Conflict):
        Waiter(LeaseKeeper(store, "k", 10.0, HOLDER, clock), 2.0, rng=lambda: 0.5).acquire()
    assert clock() - started == pytest.approx(2.0)


def test_a_superseded_waiter_gives_up_and_leaves(tmp_path, clock):
    from tasklock_cli.errors import Superseded

    store = SlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 3600.0, HOLDER, clock)
    assert holder.try_acquire()
    older = LeaseKeeper(store, "k", 10.0, Holder("h", 3, "u"), clock)
    assert not older.try_acquire(queue=True, supersede=True)
    newer = LeaseKeeper(SlowStore(tmp_path / "db", clock), "k", 10.0, Holder("h", 4, "u"), clock)
    assert not newer.try_acquire(queue=True, supersede=True)
    with pytest.raises(Superseded):
        Waiter(older, 60.0, supersede=True).acquire()
    assert store.stopped_waiting == ["k"]
    assert [waiter.holder.pid for waiter in store.waiters("k")] == [4]
