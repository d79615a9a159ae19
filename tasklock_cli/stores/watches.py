"""How a holder hears that its lease was broken, for stores that hear it on a line of their
own (a LISTEN connection, a subscription, a FIFO): ``BreakWatches`` keeps one watch per held
lease, ``SocketBreakWatch`` is a watch on a socket."""

from __future__ import annotations

import _thread
import time
from collections.abc import Callable

from tasklock_cli.stores.model import Lease
from tasklock_cli.util.fds import fd_readable
from tasklock_cli.util.fds import wait_readable

#: typing costs ~2 ms per start: BreakWatch is for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class BreakWatch(Protocol):
        """A holder's open line for hearing that its lease was broken (a LISTEN connection,
        a subscription): made at its first wait, kept until its release."""

        lock: _thread.LockType

        def wait(self, deadline: float, wake_fd: int | None) -> bool: ...

        def close(self) -> None: ...


class SocketBreakWatch:
    """A break watch on a socket of its own: ``_fileno`` is selected on together with the
    caller's ``wake_fd``, and ``_heard`` reads (never blocking) whether our break is among
    what has arrived. What is heard is a hint (anyone with access to the store can send
    one): a wait returns it once, and the caller asks the store (it renews)."""

    def __init__(self) -> None:
        self.lock = _thread.allocate_lock()  # one waiter at a time

    def _fileno(self) -> int:
        raise NotImplementedError

    def _heard(self) -> bool:
        raise NotImplementedError

    def wait(self, deadline: float, wake_fd: int | None) -> bool:
        """True when a break of ours is heard before ``deadline`` (each notification
        once); False at the deadline or when ``wake_fd`` is readable."""
        while True:
            if self._heard():
                return True
            left = deadline - time.monotonic()
            if left <= 0 or fd_readable(wake_fd):
                return False
            fileno = self._fileno()
            ready = wait_readable([fileno, wake_fd], left)
            if ready and fileno not in ready:
                return False  # wake_fd alone


class BreakWatches:
    """The waiting skeleton of ``Store.wait_for_break``.

    It serves stores that hear of a break on a line of their own.

    - There is one watch per held lease.
    - It is opened at the first wait.
      Then the lease is looked at once, so a break before it is seen.
    - It is kept until ``drop``.
    - Trouble with a watch is not a break.
      The watch is dropped, and the next wait opens another.
      That wait sleeps on ``wake_fd``.
      The renewals report the store's state."""

    def __init__(self, open_watch: Callable[[Lease], tuple[BreakWatch, bool]], trouble: tuple):
        self._open = open_watch  # -> (watch, found broken when opened)
        self._trouble = trouble  # the exceptions that mean "this watch failed"
        self._lock = _thread.allocate_lock()
        self._watches: dict[tuple[str, int], BreakWatch] = {}

    def wait(self, lease: Lease, timeout: float, wake_fd: int | None) -> bool:
        deadline = time.monotonic() + max(0.0, timeout)
        try:
            with self._lock:
                watch = self._watches.get((lease.key, lease.fencing_token))
            if watch is None:
                watch, broken = self._open(lease)
                with self._lock:
                    self._watches[(lease.key, lease.fencing_token)] = watch
                if broken:
                    return True
            with watch.lock:
                return watch.wait(deadline, wake_fd)
        except self._trouble:
            self.drop(lease)
            wait_readable([wake_fd], deadline - time.monotonic())
            return False

    def drop(self, lease: Lease) -> None:
        """The lease is released: its watch closes."""
        with self._lock:
            watch = self._watches.pop((lease.key, lease.fencing_token), None)
        if watch is not None:
            watch.close()

    def close(self) -> None:
        with self._lock:
            watches, self._watches = list(self._watches.values()), {}
        for watch in watches:
            watch.close()
