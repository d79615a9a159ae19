"""Unit tests of the lease engine's timing with an injected clock: no sleeping."""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import time
from datetime import datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tasklock_cli.errors import Interrupted
from tasklock_cli.errors import UsageError
from tasklock_cli.run.conflict import Conflict
from tasklock_cli.run.keeper import LeaseKeeper
from tasklock_cli.run.options import RunOptions
from tasklock_cli.run.waiter import FIRST_RETRY_S
from tasklock_cli.run.waiter import POLL_CEILING_S
from tasklock_cli.run.waiter import SIGNALLED_POLL_CEILING_S
from tasklock_cli.run.waiter import WAITING_EVENT_EVERY_S
from tasklock_cli.run.waiter import Waiter
from tasklock_cli.run.windows import done_in_window
from tasklock_cli.run.windows import window_start
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.sqlite.store import SQLiteStore
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.durations import parse_duration
from tasklock_cli.util.keys import validate_key

HOLDER = Holder(host="h", pid=1, user="u", command=["true"])


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class SlowStore(SQLiteStore):
    """A real SQLite store on a fake clock whose replies take ``reply_delay`` of that clock,
    and whose waits advance the clock instead of sleeping (so it signals no releases:
    waiters poll it, backing off to POLL_CEILING_S)."""

    signals_release = False

    def __init__(self, path, clock: FakeClock, reply_delay: float = 0.0) -> None:
        super().__init__(path, clock=clock, wall_clock=clock)
        self.fake = clock
        self.reply_delay = reply_delay
        self.waits: list[float] = []
        self.stopped_waiting: list[str] = []

    def acquire(self, *args, **kwargs):
        lease = super().acquire(*args, **kwargs)
        self.fake.advance(self.reply_delay)
        return lease

    def renew(self, *args, **kwargs):
        lease = super().renew(*args, **kwargs)
        self.fake.advance(self.reply_delay)
        return lease

    def wait_for_release(self, key: str, timeout: float, wake_fd: int | None = None) -> None:
        self.waits.append(timeout)
        self.fake.advance(timeout)

    def stop_waiting(self, key: str) -> None:
        self.stopped_waiting.append(key)


@pytest.fixture
def clock():
    return FakeClock()


def test_deadline_counts_from_when_the_request_was_sent(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock, reply_delay=4.0)
    keeper = LeaseKeeper(store, "k", 10.0, HOLDER, clock)
    sent = clock()
    assert keeper.try_acquire()
    assert keeper.deadline == sent + 10.0
    assert keeper.remaining() == pytest.approx(6.0)
    sent = clock()
    keeper.renew()
    assert keeper.deadline == sent + 10.0


def test_waiter_backs_off_to_a_ceiling_and_gives_up_at_the_wait(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 3600.0, HOLDER, clock)
    assert holder.try_acquire()
    waiter_keeper = LeaseKeeper(store, "k", 10.0, HOLDER, clock)
    announced = []
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


class SignallingSlowStore(SlowStore):
    signals_release = True


def test_waiter_of_a_store_that_signals_releases_polls_rarely(tmp_path, clock):
    store = SignallingSlowStore(tmp_path / "db", clock)
    assert LeaseKeeper(store, "k", 3600.0, HOLDER, clock).try_acquire()
    with pytest.raises(Conflict):
        Waiter(LeaseKeeper(store, "k", 10.0, HOLDER, clock), 8.0, rng=lambda: 0.5).acquire()
    assert max(store.waits) == pytest.approx(SIGNALLED_POLL_CEILING_S)


class PlaceKeepingSlowStore(SignallingSlowStore):
    waits_keep_places = True


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
    assert second.fencing_token == first.fencing_token + 1
    assert clock() >= first.deadline
    assert store.stopped_waiting == []  # the acquire itself ended the wait


class SignalledStore(SlowStore):
    """Delivers a 'signal' (calls the waiter's interrupt, as the supervisor's handler does)
    inside the store call named by ``during``."""

    def __init__(self, path, clock: FakeClock, during: str) -> None:
        super().__init__(path, clock)
        self.during = during
        self.waiter: Waiter | None = None

    def acquire(self, *args, **kwargs):
        lease = super().acquire(*args, **kwargs)
        if self.during == "acquire" and self.waiter is not None:
            self.waiter.interrupt(signal.SIGTERM)
        return lease

    def wait_for_release(self, key: str, timeout: float, wake_fd: int | None = None) -> None:
        super().wait_for_release(key, timeout)
        if self.during == "wait":
            assert self.waiter is not None
            self.waiter.interrupt(signal.SIGTERM)


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


def test_release_forgets_the_lease_only_after_the_store_confirms(tmp_path, clock):
    from tasklock_cli.errors import StoreUnavailable

    class FlakyRelease(SlowStore):
        fail = True

        def release(self, lease, keep_for=0.0, record=None):
            if self.fail:
                raise StoreUnavailable("down")
            return super().release(lease, keep_for, record)

    store = FlakyRelease(tmp_path / "db", clock)
    keeper = LeaseKeeper(store, "k", 60.0, HOLDER, clock)
    keeper.try_acquire()
    with pytest.raises(StoreUnavailable):
        keeper.release()
    assert keeper.lease is not None
    store.fail = False
    assert keeper.release() is True
    assert keeper.lease is None


@pytest.mark.parametrize(
    ("ttl", "renew", "grace", "loss_grace"),
    [
        (30, None, 5, 5),
        (2, None, 5, (2 - 0.1 - 2 / 3) / 2),
        (10, 5, 5, (10 - 0.5 - 5) / 2),
        (10, 9.9, 5, (10 - 0.5 - 9.5 * 0.75) / 2),  # renewals clamped to 3/4 of the ttl
    ],
)
def test_loss_grace_leaves_room_for_retries(ttl, renew, grace, loss_grace):
    options = RunOptions(key="k", command=["true"], ttl=ttl, renew_every=renew, grace=grace)
    assert options.loss_grace == pytest.approx(loss_grace)
    # the SIGKILL lands before the deadline, after at least one renewal attempt
    assert (
        options.schedule.renew_interval < ttl - options.schedule.safety_margin - options.loss_grace
    )
    assert 0 < options.schedule.safety_margin <= 1.0


def test_the_guard_starts_the_command_with_exactly_the_environment_it_was_given(capfdbinary):
    """The environment goes to an already forked guard over its socket: larger than one
    message, values with `=`, empty values and bytes that are not UTF-8 arrive intact."""

    env = {
        "BIG": "x" * 100_000,
        "EQUALS": "a=b==c",
        "EMPTY": "",
        "RAW": os.fsdecode(b"caf\xe9 \xff"),
        **{f"VAR_{n}": str(n) * 50 for n in range(200)},
    }
    assert run_through_guard(["/usr/bin/env", "-0"], env) == 0
    printed = capfdbinary.readouterr().out
    pairs = [item.split(b"=", 1) for item in printed.split(b"\0") if item]
    assert dict(pairs) == {os.fsencode(k): os.fsencode(v) for k, v in env.items()}


def test_the_environment_preloaded_while_waiting_is_completed_and_overridden_at_start(
    capfdbinary,
):
    """A waiting run hands its guard most of the environment early; the start adds the
    lease's variables, which win over a preloaded value of the same name."""
    preloaded = {"BIG": "y" * 9_000, "TASKLOCK_FENCING_TOKEN": "stale", "KEPT": "k=v"}
    at_start = {"TASKLOCK_FENCING_TOKEN": "42", "TASKLOCK_SLOT": "0"}
    assert run_through_guard(["/usr/bin/env", "-0"], at_start, preloaded) == 0
    printed = capfdbinary.readouterr().out
    pairs = [item.split(b"=", 1) for item in printed.split(b"\0") if item]
    expected = {**preloaded, **at_start}
    assert dict(pairs) == {os.fsencode(k): os.fsencode(v) for k, v in expected.items()}


def run_through_guard(
    command: list[str], env: dict[str, str], preloaded: dict[str, str] | None = None
) -> int:
    import select

    from tasklock_cli.proc.process import Child

    child = Child(command)
    if preloaded is not None:
        child.preload(preloaded)
    child.start(env)
    while not child.tree_empty:
        select.select([child], [], [], 5)
        child.poll()
    return child.exit_code()


def test_the_command_runs_in_its_own_group_with_default_signals_and_only_fds_0_to_2():
    import select

    from tasklock_cli.proc.process import Child

    child = Child(["sleep", "30"])
    child.start({"PATH": os.environ["PATH"]})
    try:
        with open(f"/proc/{child.pid}/status") as lines:
            status = dict(line.rstrip("\n").split(":\t", 1) for line in lines)
        assert os.getpgid(child.pid) == child.pid  # its group is its own
        ignored = int(status["SigIgn"], 16)
        for signum in (signal.SIGPIPE, signal.SIGXFSZ):  # Python's own ignores stay Python's
            assert not ignored & (1 << (signum - 1))
        assert int(status["SigBlk"], 16) == 0
        assert sorted(os.listdir(f"/proc/{child.pid}/fd")) == ["0", "1", "2"]
    finally:
        child.signal_group(signal.SIGKILL)
        while not child.tree_empty:
            select.select([child], [], [], 5)
            child.poll()


def test_a_command_that_cannot_be_run_is_reported(tmp_path):
    from tasklock_cli.errors import CommandNotExecutable
    from tasklock_cli.errors import CommandNotFound
    from tasklock_cli.proc.process import Child

    with pytest.raises(CommandNotFound, match="command not found: no-such-command"):
        Child(["no-such-command"]).start({"PATH": os.environ["PATH"]})
    with pytest.raises(CommandNotExecutable, match=f"command not executable: {tmp_path}"):
        Child([str(tmp_path)]).start({})
    assert run_through_guard([sys.executable, "-c", "pass"], {}) == 0  # the next one runs


def test_a_guard_whose_command_never_starts_is_ended(tmp_path):
    from tasklock_cli.proc.process import Child

    marker = tmp_path / "ran"
    child = Child(["touch", str(marker)])
    child.cancel()
    assert not marker.exists()
    with pytest.raises(ChildProcessError):
        os.waitpid(child.guard_pid, os.WNOHANG)  # collected


# -- durations and keys -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("500ms", 0.5),
        ("30s", 30),
        ("5m", 300),
        ("1h30m", 5400),
        ("2d", 172800),
        ("12", 12),
        ("1.5", 1.5),
        ("1h0m5s", 3605),
        ("inf", math.inf),
        (" 10s ", 10),
    ],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "s", "-1s", "1x", "5s1h", "1m1m", "1 h", "1e3", "nan", "1h 30m", "10sec", "∞"]
)
def test_bad_durations(text):
    with pytest.raises(UsageError):
        parse_duration(text)


def test_inf_can_be_refused():
    with pytest.raises(UsageError):
        parse_duration("inf", allow_inf=False)


@given(st.integers(min_value=0, max_value=10**6))
def test_bare_seconds_round_trip(n):
    assert parse_duration(str(n)) == n


@given(
    st.lists(st.sampled_from(["d", "h", "m", "s", "ms"]), min_size=1, unique=True),
    st.lists(st.integers(min_value=0, max_value=999), min_size=5, max_size=5),
)
def test_composed_durations_sum_their_parts(units, counts):
    order = ["d", "h", "m", "s", "ms"]
    units = sorted(units, key=order.index)
    size = {"d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = list(zip(counts[: len(units)], units, strict=True))
    text = "".join(f"{c}{u}" for c, u in parts)
    assert parse_duration(text) == pytest.approx(sum(c * size[u] for c, u in parts))


@given(st.text())
def test_parse_duration_never_crashes(text):
    try:
        value = parse_duration(text)
    except UsageError:
        return
    assert value >= 0


@given(st.floats(min_value=0, max_value=10**7, allow_nan=False))
def test_format_duration_is_parseable(seconds):
    assert parse_duration(format_duration(seconds)) >= 0


@given(st.text(min_size=1, max_size=200))
def test_validate_key_accepts_or_refuses_cleanly(key):
    try:
        assert validate_key(key) == key
    except UsageError as error:
        assert "key" in str(error)
    else:
        assert not any(ord(c) < 32 or 127 <= ord(c) < 160 for c in key)


def test_key_limits():
    validate_key("x" * 512)
    with pytest.raises(UsageError):
        validate_key("x" * 513)
    with pytest.raises(UsageError):
        validate_key("é" * 257)  # 514 bytes
    with pytest.raises(UsageError):
        validate_key("bad\udcffkey")  # invalid UTF-8 from argv


def test_sqlite_expiry_ignores_the_wall_clock(tmp_path):
    """A client whose wall clock is an hour off neither steals nor extends a lease."""
    import time

    path = tmp_path / "db"
    honest = SQLiteStore(path)
    skewed_ahead = SQLiteStore(path, wall_clock=lambda: time.time() + 3600)
    skewed_behind = SQLiteStore(path, wall_clock=lambda: time.time() - 3600)
    lease = honest.acquire("k", 30, HOLDER, "owner-a")
    assert lease is not None
    assert skewed_ahead.acquire("k", 30, HOLDER, "owner-b") is None
    short = skewed_behind.acquire("short", 0.2, HOLDER, "owner-c")
    time.sleep(0.3)
    assert honest.acquire("short", 30, HOLDER, "owner-d").fencing_token > short.fencing_token


@pytest.mark.parametrize(
    ("prefix", "upper"),
    [
        ("app:", "app;"),
        ("a", "b"),
        ("", None),
        ("z\U0010ffff", "{"),
        ("\U0010ffff", None),
        ("x\ud7ff", "x\ue000"),
    ],
)
def test_prefix_upper_bound(prefix, upper):
    from tasklock_cli.stores.model import prefix_upper_bound

    assert prefix_upper_bound(prefix) == upper


@given(st.text(min_size=1, max_size=5), st.text(max_size=5))
def test_every_key_with_the_prefix_sorts_below_the_bound(prefix, rest):
    from tasklock_cli.stores.model import prefix_upper_bound

    upper = prefix_upper_bound(prefix)
    key = prefix + rest
    assert upper is None or key < upper
    assert key >= prefix


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


def test_giving_up_names_the_holder_at_the_end_and_the_one_the_wait_began_with(tmp_path, clock):
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

    store.wait_for_release = wait_then_let_second_take_over
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


# -- --once-per windows -------------------------------------------------------------------


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _success(started_at: datetime) -> RunRecord:
    holder = Holder(host="h", pid=1, user="u")
    return RunRecord("k", 1, holder, started_at, 0, "succeeded")


@pytest.mark.parametrize(
    ("now", "period", "start"),
    [
        ("2024-05-01T13:59:59.999999+00:00", 3600, "2024-05-01T13:00:00+00:00"),
        ("2024-05-01T14:00:00+00:00", 3600, "2024-05-01T14:00:00+00:00"),
        ("2024-05-01T23:30:00+00:00", 86400, "2024-05-01T00:00:00+00:00"),
        ("1970-01-01T00:00:04.400+00:00", 1.5, "1970-01-01T00:00:03+00:00"),
        ("2024-05-01T14:00:03.5+00:00", 2, "2024-05-01T14:00:02+00:00"),
    ],
)
def test_once_per_windows_are_aligned_to_the_unix_epoch(now, period, start):
    assert window_start(_utc(now), period) == _utc(start)


def test_a_window_is_done_by_a_success_that_started_in_it():
    now = _utc("2024-05-01T14:20:00+00:00")
    assert done_in_window(_success(_utc("2024-05-01T14:00:00+00:00")), now, 3600)
    assert done_in_window(_success(_utc("2024-05-01T14:25:00+00:00")), now, 3600)  # clock back
    assert not done_in_window(_success(_utc("2024-05-01T13:59:59.999999+00:00")), now, 3600)
    assert not done_in_window(None, now, 3600)


# -- --replace and --supersede in the waiter ---------------------------------------------------


def test_replace_waits_past_the_wait_while_the_lease_it_broke_is_live(tmp_path, clock):
    """A holder that does not let go keeps its broken lease until it runs out on the store's
    clock: --replace (with --wait 0) waits for that, then takes the key."""
    store = SlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 30.0, HOLDER, clock)
    assert holder.try_acquire()
    replacer = LeaseKeeper(store, "k", 10.0, Holder("h2", 2, "v"), clock)
    broken = []
    Waiter(replacer, 0.0, rng=lambda: 0.5, replace=True, on_broken=broken.extend).acquire()
    assert [info.fencing_token for info in broken] == [holder.fencing_token]
    assert replacer.fencing_token > holder.fencing_token
    # the holder never let go: the replacer got the key once the lease ran out, not sooner
    assert 30.0 <= clock() - holder.acquired_at <= 30.0 + POLL_CEILING_S * 2
    assert store.broken_by(holder.lease) is None  # freed by expiry, no longer on the store


def test_replace_breaks_in_its_own_name_and_marks_it(tmp_path, clock):
    store = SlowStore(tmp_path / "db", clock)
    holder = LeaseKeeper(store, "k", 30.0, HOLDER, clock)
    assert holder.try_acquire()
    replacer = LeaseKeeper(store, "k", 10.0, Holder("h2", 2, "v"), clock)
    waiter = Waiter(replacer, 0.0, replace=True)
    assert waiter._break_holders() is True
    assert store.broken_by(holder.lease) == {"host": "h2", "pid": 2, "user": "v", "replaced": True}
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


def test_stopping_the_reports_waits_for_a_renewal_under_way_and_starts_none(tmp_path):
    """The wrapper stops its heartbeat's reports before it releases (and, where the store
    allows, releases before the thread has ended). A renewal already under way is finished
    and what it finds is reported first (a lease broken meanwhile is still a loss); none
    begins after, so the release cannot be taken for a loss."""
    import threading

    from tasklock_cli.errors import LeaseLost
    from tasklock_cli.events import EventLog
    from tasklock_cli.run.heartbeat import Heartbeat

    store = SQLiteStore(tmp_path / "db")
    keeper = LeaseKeeper(store, "k", 1.0, HOLDER)
    assert keeper.try_acquire()
    renewing, answer = threading.Event(), threading.Event()
    renewals: list[float] = []

    def renew(lease, ttl):
        renewals.append(time.monotonic())
        renewing.set()
        answer.wait(5)
        raise LeaseLost("broken by an operator")

    store.renew = renew
    reports: list[tuple] = []
    heartbeat = Heartbeat(
        keeper,
        RunOptions(key="k", command=["true"], ttl=1.0),
        EventLog(stream=open(os.devnull, "w")),  # noqa: SIM115 - closed with the process
        on_loss=lambda *found: reports.append(("lost", *found)),
        on_renewed=lambda lease: reports.append(("renewed", lease)),
        on_deadline=lambda: reports.append(("deadline",)),
    )
    heartbeat.start()
    stopper = threading.Thread(target=heartbeat.stop_reports)
    try:
        assert renewing.wait(5)
        stopper.start()
        stopper.join(0.2)
        assert stopper.is_alive()  # it waits for the renewal under way
        answer.set()
        stopper.join(5)
        assert not stopper.is_alive()
        assert [report[0] for report in reports] == ["lost"]  # found before the stop: counts
        heartbeat.join(5)
        assert len(renewals) == 1  # and none after it
    finally:
        answer.set()
        heartbeat.close()
        store.close()
