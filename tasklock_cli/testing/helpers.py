"""What the store contract's cases share: two holders, owner tokens, a short lease, a
granted acquire, a run's ledger record, a waiter in a thread, calls raced in threads,
hypothesis settings for a store, waiting for a condition or for a thread's wait to be under
way (see ``tasklock_cli.testing``)."""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator

from hypothesis import HealthCheck
from hypothesis import settings

from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import RunRecord

HOLDER = Holder(
    host="host-a", pid=4242, user="alice", command=["./job.sh", "--all"], note="nightly"
)
OTHER = Holder(host="host-b", pid=99, user="bob", command=["true"], note=None)

SHORT_TTL = 0.4
PAST_SHORT_TTL = 0.6


def short_ttl(store) -> tuple[float, float]:
    """A short lease on this store, and a wait after which it has expired: SHORT_TTL and
    PAST_SHORT_TTL, unless the store's leases cannot be that short (``Store.min_ttl``) or
    are freed late (``Store.expiry_lag``)."""
    ttl = max(SHORT_TTL, store.min_ttl)
    return ttl, ttl + (PAST_SHORT_TTL - SHORT_TTL) + store.expiry_lag


def token() -> str:
    return uuid.uuid4().hex


def granted(lease: Lease | None) -> Lease:
    """The lease of an acquire the test needs granted (``Store.acquire`` returns None for a
    refusal): fails the test there, instead of an AttributeError on None further on."""
    assert lease is not None, "the acquire was refused"
    return lease


def run_record(
    lease: Lease,
    holder: Holder = HOLDER,
    exit_code: int | None = 0,
    outcome: str = "succeeded",
    detected_by: str | None = None,
    broken_by: dict | None = None,
) -> RunRecord:
    """The ledger record that ``tasklock run`` releases ``lease`` with (the lease's key,
    token, slot and start): a success unless told otherwise."""
    return RunRecord(
        key=lease.key,
        fencing_token=lease.fencing_token,
        holder=holder,
        started_at=lease.acquired_at,
        exit_code=exit_code,
        outcome=outcome,
        detected_by=detected_by,
        slot=lease.slot,
        broken_by=broken_by,
    )


def waiting_thread(waiter, key: str, timeout: float, woke: list[float]) -> threading.Thread:
    """A started thread in which ``waiter`` waits for ``key`` (``wait_for_release``), then
    adds the monotonic time it woke to ``woke``."""

    def wait() -> None:
        waiter.wait_for_release(key, timeout)
        woke.append(time.monotonic())

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    return thread


def in_threads(target: Callable[..., object], arguments: Iterable[tuple]) -> None:
    """``target(*args)`` for each ``args`` of ``arguments``, each in a thread of its own, all
    started before the first is joined; returns once every one has ended."""
    threads = [threading.Thread(target=target, args=args) for args in arguments]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def on_the_store(max_examples: int) -> settings:
    """Hypothesis settings for a property test on the ``store`` fixture: few examples (each
    makes round trips to a real server), no deadline, and the one store (a function-scoped
    fixture) shared by every example, each on keys of its own."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


def wait_until(predicate: Callable[[], object], timeout: float = 10, interval: float = 0.02):
    """``predicate()``'s first true value, looked at every ``interval``; AssertionError
    when none came within ``timeout`` seconds."""
    give_up = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > give_up:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)


def blocked_in(thread: threading.Thread, name: str, settle: float = 0.01) -> bool:
    """Whether ``thread`` is blocked inside a call of the function ``name``: asleep in the
    kernel on something other than a lock (a select, poll or read), at the same point of
    its stack ``settle`` seconds apart -- its wait proper, not a round trip on the way.
    For a test whose act must come while a wait is under way (Linux: ``/proc``)."""
    first = _blocked_at(thread, name)
    if first is None:
        return False
    time.sleep(settle)
    return _blocked_at(thread, name) == first


def _blocked_at(thread: threading.Thread, name: str) -> tuple[int, int] | None:
    """Where ``thread`` is blocked inside ``name`` (its innermost frame and instruction);
    None when it is not."""
    top = sys._current_frames().get(thread.ident or 0)
    frame = top
    while frame is not None and frame.f_code.co_name != name:
        frame = frame.f_back
    if frame is None or top is None:
        return None
    try:
        with open(f"/proc/self/task/{thread.native_id}/wchan") as wchan:
            where = wchan.read().strip()
    except OSError:
        return None
    if where in ("", "0") or "futex" in where:  # running, or waiting for a lock (the GIL)
        return None
    return id(top), top.f_lasti


def wake_pipe_pair() -> Iterator[tuple[int, int]]:
    """A pipe's two ends (read, write) for a wake-up fd, closed afterwards (a fixture's
    body)."""
    read_end, write_end = os.pipe()
    yield read_end, write_end
    os.close(read_end)
    os.close(write_end)
