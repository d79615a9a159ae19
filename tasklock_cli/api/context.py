"""``locks.lock(...)``: the context manager, for ``with`` and ``async with``.

Sync: entering acquires (waiting as asked), leaving releases. The block is never
interrupted; when the lease was lost meanwhile, leaving it normally raises ``LockLost``.

Async: the blocking parts (acquire, release) run in a worker thread, so the event loop
goes on. On a loss the task running the block is cancelled, and the ``CancelledError``
that causes leaves the block as ``LockLost``. An exception the block raised itself always
propagates unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

from tasklock_cli.api import lease as leases
from tasklock_cli.api.hold import LeaseHold
from tasklock_cli.api.lease import Lease


def outcome_of(exc: BaseException | None) -> tuple[str, int | None]:
    """The run ledger's outcome and exit code of a block that ended with ``exc``: as
    ``python`` would exit (0, or 1 for an exception); ``signalled`` for an interrupt."""
    if exc is None or isinstance(exc, GeneratorExit):
        return "succeeded", 0
    if isinstance(exc, Exception):
        return "failed", 1
    return "signalled", None


class LockContext:
    """One use of ``locks.lock(...)``: entered once, by ``with`` or ``async with``."""

    def __init__(self, make_hold: Callable[[], LeaseHold]) -> None:
        self._make_hold = make_hold
        self._hold: LeaseHold | None = None
        self._context_token: object = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False  # we cancelled the task for a loss
        self._leaving = False
        self._abandoned = False  # the task was cancelled while acquiring
        self._abandoning = threading.Lock()

    # -- with -----------------------------------------------------------------------------

    def __enter__(self) -> Lease:
        hold = self._start()
        hold.acquire()
        return self._held(hold)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        hold = self._end()
        hold.release(*outcome_of(exc))
        if hold.loss is not None and exc is None:
            raise hold.lost_error()

    def _start(self) -> LeaseHold:
        if self._hold is not None:
            raise RuntimeError("a locks.lock(...) is entered once; call lock() again")
        self._hold = self._make_hold()
        return self._hold

    def _held(self, hold: LeaseHold) -> Lease:
        lease = Lease(hold)
        self._context_token = leases.push(lease)
        return lease

    def _end(self) -> LeaseHold:
        assert self._hold is not None, "left before it was entered"
        leases.pop(self._context_token)
        return self._hold

    # -- async with -----------------------------------------------------------------------

    async def __aenter__(self) -> Lease:
        loop = asyncio.get_running_loop()
        acquiring = loop.run_in_executor(None, self._start_and_acquire)
        try:
            hold = await asyncio.shield(acquiring)
        except asyncio.CancelledError:
            await self._abandon(acquiring)
            raise
        self._task = asyncio.current_task()
        hold.on_loss(lambda: _call_soon(loop, self._cancel_for_loss))
        return self._held(hold)

    def _start_and_acquire(self) -> LeaseHold:
        """(In a worker thread.) Open the stores and acquire; a cancellation meanwhile
        (``_abandon``) stops the wait, or the acquire before it begins."""
        hold = self._start()
        with self._abandoning:
            if self._abandoned:
                hold.cancel_waiting()
        hold.acquire()
        return hold

    async def _abandon(self, acquiring: asyncio.Future[LeaseHold]) -> None:
        """The task was cancelled while acquiring: stop the acquire, and give back a lease
        it got meanwhile."""
        with self._abandoning:
            self._abandoned = True
            hold = self._hold
        if hold is not None:
            hold.cancel_waiting()
        with contextlib.suppress(BaseException):
            await asyncio.wait({acquiring})
        if not acquiring.cancelled() and acquiring.exception() is None:
            acquiring.result().release("signalled", None)

    def _cancel_for_loss(self) -> None:
        """(On the loop.) Cancel the block's task, unless it is leaving already."""
        if self._leaving or self._task is None or self._cancelled:
            return
        self._cancelled = True
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._leaving = True
        hold = self._end()
        hold.no_more_callbacks()
        outcome = outcome_of(exc)
        await self._finish(lambda: hold.release(*outcome))
        ours = self._cancelled and (exc is None or isinstance(exc, asyncio.CancelledError))
        if self._cancelled and self._task is not None and hasattr(self._task, "uncancel"):
            self._task.uncancel()  # (3.11+) the cancellation was ours, and is answered
        if hold.loss is not None and (exc is None or ours):
            raise hold.lost_error() from exc

    async def _finish(self, release: Callable[[], None]) -> None:
        """Run ``release`` in a worker thread to its end. Our own cancellation for a loss
        may still be pending (the block ended before it came): it is absorbed here; any
        other is raised once the release is done."""
        releasing = asyncio.get_running_loop().run_in_executor(None, release)
        other: asyncio.CancelledError | None = None
        absorbed = False
        while not releasing.done():
            try:
                await asyncio.shield(releasing)
            except asyncio.CancelledError as cancelled:
                if self._cancelled and not absorbed:
                    absorbed = True
                else:
                    other = cancelled
        releasing.result()
        if other is not None:
            raise other


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
    """``callback`` on ``loop``, from any thread; nothing when the loop has closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback)
