"""The waiter's side of ``Store``: its places in queues, which the base records from what
``_acquire`` returns and leaves on ``stop_waiting`` and ``close``, and the loop every
store's ``wait_for_release`` shares. A store supplies the parts (``_time_until_free``,
``_leave_queue``, and where it hears of releases ``_prepare_wait`` / ``_await_wakeup``)."""

from __future__ import annotations

import time
from abc import ABC
from abc import abstractmethod

from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import QueueFull
from tasklock_cli.errors import Superseded
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.model import EXPIRY_SLACK_S
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.traits import StoreTraits
from tasklock_cli.util import suppressed
from tasklock_cli.util.fds import fd_readable
from tasklock_cli.util.fds import wait_readable

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class Queued:
    """What ``_acquire`` returns when the caller got no slot and holds a place in the key's
    queue under its owner token (joined or kept): ``QUEUED``, the one instance."""

    def __repr__(self) -> str:
        return "QUEUED"


QUEUED = Queued()


class Waiting(StoreTraits, ABC):
    """Queue places and waiting for a release (see the module's docstring)."""

    #: What this store's waiting primitives raise on trouble; the wait then ends in
    #: ``_wait_after_trouble`` and the caller's next acquire reports the store's state.
    waiting_trouble: tuple[type[BaseException], ...] = (OSError,)

    def wait_for_release(self, key: str, timeout: float, wake_fd: int | None = None) -> None:
        """Block until a slot of ``key`` may be free, at most ``timeout`` seconds.

        A slot may be free when a release woke us, or when the first live lease ran out. The
        wait ends at once when ``wake_fd`` becomes readable. It is not read: a signal
        handler's wake-up pipe ends a wait without raising out of a blocking call. Never
        raises.

        The skeleton every store shares: take this waiter's turn and start listening
        (``_prepare_wait``). Then look at how long the key stays full (``_time_until_free``),
        so a release after the listening began is not missed. Then wait for a wake-up until
        then (``_await_wakeup``)."""
        if timeout <= 0:
            return
        deadline = time.monotonic() + timeout
        try:
            if not self._prepare_wait(key, deadline, wake_fd) or fd_readable(wake_fd):
                return
            left = self._time_until_free(key)
            if left is None:
                return
            until = min(deadline, time.monotonic() + max(0.0, left) + EXPIRY_SLACK_S)
            self._await_wakeup(key, until, wake_fd)
        except self.waiting_trouble:
            self._wait_after_trouble(key, deadline, wake_fd)

    def _prepare_wait(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        """Queue for ``key`` where waiters take turns, and start listening for its release.
        False when the wait should end now (the turn did not come before ``deadline``: the
        caller looks again). Nothing by default."""
        return True

    @abstractmethod
    def _time_until_free(self, key: str) -> float | None:
        """Seconds until the first live lease of a full ``key`` runs out on the store's
        clock; None when a slot is free now for us (fewer live leases than their limit,
        and fewer waiters ahead of us than free slots: see ``_queue_place``). Behind
        waiters that come first, ``waiter_ttl`` (their places may run out)."""

    def _await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        """Wait for a release of ``key`` to wake us, until ``until`` (monotonic) or until
        ``wake_fd`` is readable. By default nothing wakes us (a store that only polls):
        the key is looked at again (``_time_until_free``) every ``release_poll_s``, so a
        release is seen that late at most."""
        while True:
            left = until - time.monotonic()
            if left <= 0 or wait_readable([wake_fd], min(left, self.release_poll_s)):
                return
            if self._time_until_free(key) is None:
                return

    def _wait_after_trouble(self, key: str, deadline: float, wake_fd: int | None) -> None:
        """The waiting primitives failed: sleep out the wait (on ``wake_fd``)."""
        wait_readable([wake_fd], deadline - time.monotonic())

    def _record_place(
        self, key: str, owner: str, acquire: Callable[[], Lease | Queued | None]
    ) -> Lease | None:
        """Run the store's ``acquire`` of ``key`` under ``owner`` and record our place in
        the key's queue as it left it (see ``Store._acquire``); the lease, or None."""
        places = self._queue_places()
        try:
            outcome = acquire()
        except (Superseded, LimitMismatch, QueueFull):
            places.pop(key, None)  # refused: the store kept no place of ours
            raise
        if isinstance(outcome, Queued):
            places[key] = owner
            return None
        places.pop(key, None)
        return outcome

    def _queue_places(self) -> dict[str, str]:
        """The keys in whose queues we hold a place, and the owner token it is under: what
        the last ``_acquire`` of each key returned (``QUEUED``), until ``stop_waiting``.
        Made on first use, so a store's ``__init__`` owes the base nothing."""
        return self.__dict__.setdefault("_queue_places_by_key", {})

    def _queue_place(self, key: str) -> str | None:
        """The owner token of our place in ``key``'s queue; None when we have none."""
        return self._queue_places().get(key)

    def _leave_queues(self) -> None:
        """``stop_waiting`` for every key we hold a place for (at ``close``); trouble with
        one leaves that place to run out."""
        for key in list(self._queue_places()):
            with suppressed(TasklockError):
                self.stop_waiting(key)

    def stop_waiting(self, key: str) -> None:
        """The caller has given up waiting for ``key`` but keeps the store open: leave the
        key's queue of waiters (so releases wake the others) and pass on a wake-up it was
        sent but will not use. Getting the lease, or ``close``, does the same."""
        self._leave_queue(key, self._queue_places().pop(key, None))

    @abstractmethod
    def _leave_queue(self, key: str, owner: str | None) -> None:
        """``stop_waiting``, the store's own part: leave our place in ``key``'s queue, held
        under ``owner`` (None: we hold none there), and stop listening for its release.
        Trouble may raise (``close`` and the waiter carry on: the place then runs out)."""
