"""A daemon thread and a flag on ``_thread``, without ``threading``.

``threading`` (with ``_weakrefset``) costs ~3 M instructions (~0.8 ms) of every `run`, whose
only thread is the heartbeat: this is what the heartbeat uses of it. Locks elsewhere on
`run`'s path are ``_thread.allocate_lock()`` and ``_thread.RLock()``, which is what
``threading.Lock`` and ``threading.RLock`` are. ``threading``, when something else imports
it, sees these threads as dummy threads; nothing here needs more of it.
"""

from __future__ import annotations

import _thread
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


class Flag:
    """``threading.Event`` for one waiter: ``set``, ``is_set``, ``wait(timeout)``."""

    __slots__ = ("_clear", "_is_set", "_setting")

    def __init__(self) -> None:
        self._is_set = False
        self._clear = _thread.allocate_lock()  # held while the flag is not set
        self._clear.acquire()
        self._setting = _thread.allocate_lock()

    def set(self) -> None:
        with self._setting:
            if not self._is_set:
                self._is_set = True
                self._clear.release()

    def is_set(self) -> bool:
        return self._is_set

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the flag; whether it is set."""
        if not self._is_set and self._clear.acquire(timeout=max(0.0, timeout)):
            self._clear.release()
        return self._is_set


class DaemonThread:
    """``threading.Thread(target=..., daemon=True)``: ``start``, ``is_alive``, ``join``.
    It never keeps the process alive (`run` ends with ``os._exit``). An exception that
    ``target`` lets out is printed by ``sys.unraisablehook``, as ``_thread`` does. In a
    process forked after its start (a program using the Python API may fork) it is not
    alive, as ``threading`` says of its threads there: it was not copied."""

    __slots__ = ("_pid", "_running", "_target")

    def __init__(self, target: Callable[[], object]) -> None:
        self._target = target
        self._running = _thread.allocate_lock()  # held from start to the target's end
        self._pid = 0  # the process that started it

    def start(self) -> None:
        self._running.acquire()
        self._pid = os.getpid()
        try:
            _thread.start_new_thread(self._run, ())
        except BaseException:
            self._running.release()
            raise

    def _run(self) -> None:
        try:
            self._target()
        finally:
            self._running.release()

    def is_alive(self) -> bool:
        return self._running.locked() and self._pid == os.getpid()

    def join(self, timeout: float) -> None:
        if self.is_alive() and self._running.acquire(timeout=max(0.0, timeout)):
            self._running.release()
