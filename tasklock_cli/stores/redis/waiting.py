"""The Redis store's wake-up primitive: each key's wake list.

A release pushes onto the wake list, and a waiter BLPOPs it.
``RedisStore`` keeps the look at the key; base.py keeps the skeleton.

- A release between the look and the BLPOP leaves its wake-up in the list, so it is not
  missed.
- Each release wakes one waiter, so N waiters do not all rush at the store when one of them
  can win.
- When the key has a queue (see ``queue``), the waiter woken is its head, on a wake list of
  its own (``P{K}:wake:<owner>``).
  Or it is each of the run of shared waiters at its head.
- A BLPOP cut short by a signal may have taken a wake-up with it.
  So it is marked while under way, and ``close`` passes such a wake-up on.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import Counter
from collections.abc import Iterator

import redis.exceptions as rexc

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.redis.connection import RedisConnection
from tasklock_cli.util.fds import fd_readable
from tasklock_cli.util.fds import wait_readable

#: What the waiting primitives raise on trouble (see ``Store.waiting_trouble``).
WAITING_TROUBLE = (rexc.RedisError, TasklockError, OSError)
#: ``_blpop_or_wake``: the wake-up fd was readable first.
_WOKEN = object()


class RedisWakeLists:
    def __init__(self, conn: RedisConnection) -> None:
        self._conn = conn
        # The keys of BLPOPs under way, per thread: left there only when a signal cuts
        # one short, so that close passes on the wake-up it may have taken.
        self._blocked_lock = threading.Lock()
        self._blocked_on: Counter[str] = Counter()

    def await_wakeup(
        self, key: str, until: float, wake_fd: int | None, wake: bytes | None = None
    ) -> None:
        """BLPOP the wake list ``wake`` (default: the key's) until ``until``. With
        ``wake_fd``, the BLPOP's socket is selected on together with it: once it is
        readable the BLPOP is abandoned with its connection, and the wake-up it may have
        taken is passed on."""
        wake = wake or self._conn.names.name(key, "wake")
        while True:
            # Slices well inside the socket timeout; BLPOP's timeout 0 means forever.
            left = min(until - time.monotonic(), self._conn.io_timeout / 2)
            if left < 0.001 or fd_readable(wake_fd):
                return
            seconds = math.floor(left * 1000) / 1000
            with self._blocked(key):
                if wake_fd is None:
                    # (ignore: mypy cannot infer a lambda with a default, which binds the
                    # loop's seconds)
                    popped = self._conn.call(lambda c, s=seconds: c.blpop([wake], timeout=s), key)  # type: ignore[misc]
                else:
                    popped = self._blpop_or_wake(wake, seconds, wake_fd)
            if popped is _WOKEN:
                self.pass_on(key)
                return
            if popped is not None:
                return

    @contextlib.contextmanager
    def _blocked(self, key: str) -> Iterator[None]:
        """Mark a BLPOP on ``key`` under way; the mark stays when a signal's exception
        cuts it short (close then passes on the wake-up it may have taken)."""
        with self._blocked_lock:
            self._blocked_on[key] += 1
        try:
            yield
        except WAITING_TROUBLE:
            self._unblocked(key)
            raise
        self._unblocked(key)

    def _unblocked(self, key: str) -> None:
        with self._blocked_lock:
            self._blocked_on[key] -= 1
            if self._blocked_on[key] <= 0:
                del self._blocked_on[key]

    def _blpop_or_wake(self, wake: bytes, seconds: float, wake_fd: int) -> object:
        """BLPOP on a pool connection whose socket is selected on with ``wake_fd``: the
        popped element, None at BLPOP's timeout, or _WOKEN when ``wake_fd`` came first."""
        pool = self._conn.client.connection_pool
        conn = pool.get_connection()
        try:
            conn.send_command("BLPOP", wake, seconds)
            sock = conn._sock  # (redis-py keeps the socket there; selected on, not read)
            if sock is None:
                raise rexc.ConnectionError("the connection closed while sending BLPOP")
            ready = wait_readable([sock.fileno(), wake_fd], seconds + self._conn.io_timeout)
            if sock.fileno() in ready:
                return conn.read_response()
            conn.disconnect()  # abandoned: the server drops the BLPOP with the connection
            if not ready:
                raise rexc.TimeoutError(f"no answer to BLPOP within {seconds:g} s")
            return _WOKEN
        except BaseException:
            conn.disconnect()
            raise
        finally:
            pool.release(conn)

    def pass_on(self, key: str) -> None:
        """A waiter leaving early may have taken the last release's wake-up: while the key
        is free, one is left for the next waiter. Never raises."""
        names = self._conn.names
        keys = [names.lease(key), names.name(key, "wake"), names.name(key, "limit")]
        with contextlib.suppress(TasklockError):
            self._conn.script("pass_on", keys, [], key)

    def close(self) -> None:
        """Pass on the wake-ups that BLPOPs cut short may have popped."""
        with self._blocked_lock:
            blocked, self._blocked_on = list(self._blocked_on), Counter()
        for key in blocked:  # the wake-up it may have popped goes to the next waiter
            self.pass_on(key)
