"""Release wake-ups between processes on one machine, for the SQLite store.

Each waiter of a key owns a FIFO in the key's directory beside the database.

- The directory is ``X.db.waiters/<hash of key>/`` (see entries).
- The FIFO is named ``<time_ns>.<pid>.<random>``.
- The waiter keeps it open for reading while it waits.

A release writes one byte to the FIFOs of the waiters it may admit:

- Those FIFOs are named in the waiters' places in the queue.
- They are the head's, and, when the head is shared, those of the shared run at the head.
- When none of them is there, the release writes to the oldest FIFO whose reader is still
  there.
- So a release wakes the waiters whose turn it is, and no herd.
- A FIFO without a reader (its waiter died) cannot be opened for writing.
  The release removes it and tries the next.
- An entry that is not such a FIFO is left alone.

A waiter may not be woken.
Its waker may have died between commit and wake-up.
Or the holder was on another machine sharing the file.
Such a waiter still polls, at its caller's ceiling.

Holders are told of a break the same way (``BreakAlarms``).
The holder of a lease waiting for a break keeps a FIFO named after its fencing token.
The FIFO is in the key's directory under ``X.db.holders/``.
A break or forced release writes to it.
"""

from __future__ import annotations

import errno
import os

from tasklock_cli.stores.sqlite import entries
from tasklock_cli.util import suppressed
from tasklock_cli.util.fds import wait_readable


class LocalWakeups(entries.KeyDirectories):
    """Our place among the waiters of a key (one at a time), and the wake-ups of others."""

    # Set on the instance by ``register``, back to None by ``leave``.
    _key: str | None = None
    _name: str | None = None
    _dir_fd: int | None = None
    _fd: int | None = None
    # What ``leave(tidy=False)`` left for ``tidy``: (key, its directory's fd, our FIFO's name).
    _left: tuple[str, int, str] | None = None

    @property
    def key(self) -> str | None:
        """The key whose queue we are in, if any."""
        return self._key

    @property
    def name(self) -> str | None:
        """Our FIFO's name in the directory, while we have one."""
        return self._name

    def register(self, key: str) -> bool:
        """Join the queue of ``key``'s waiters (keeping our place if already in it);
        False when this machine cannot make FIFOs there (the caller just polls)."""
        if self._key == key and self._fd is not None:
            return True
        self.leave()
        for _ in range(3):  # again if the key's empty directory is removed meanwhile
            dir_fd = self.key_dir(key, create=True)
            if dir_fd is None:
                return False
            unique = entries.make_unique()
            # Made and opened under a name no release looks at, then renamed: a release
            # never finds the FIFO without its reader (it would take it for a dead waiter's).
            try:
                fd = entries.make_fifo(f"new.{unique}", unique, dir_fd, self.file_mode)
            except BaseException as exc:  # OSError, or a signal that stops the wait: undone
                os.close(dir_fd)
                if isinstance(exc, FileNotFoundError):
                    continue
                self.remove_key_dir(key)
                if isinstance(exc, OSError):
                    return False
                raise
            self._key, self._name, self._dir_fd, self._fd = key, unique, dir_fd, fd
            return True
        return False

    def wait(self, timeout: float, wake_fd: int | None = None) -> bool:
        """Block up to ``timeout`` for a wake-up on the registered key, or until ``wake_fd``
        is readable (not read); True when woken by a release."""
        fd = self._fd
        with suppressed(InterruptedError):
            if fd in wait_readable([fd, wake_fd], timeout):
                with suppressed(BlockingIOError):
                    os.read(fd, 64)
                return True
        return False

    def leave(self, tidy: bool = True) -> None:
        """Leave the queue: the holder, or a waiter that gave up, wants no wake-ups. Without
        ``tidy`` our FIFO and the key's directory stay for ``tidy`` to remove later: a run
        that has just acquired keeps those removals (journalled writes, milliseconds on a
        busy disk) off the hand-off, between its acquire and its command's start. The FIFO
        has no reader from now on: a release that tries it takes it for a dead waiter's
        (it removes it and wakes the next one), as it would after a crash."""
        self.tidy_left()
        key, fd, name, dir_fd = self._key, self._fd, self._name, self._dir_fd
        self._key = self._name = self._dir_fd = self._fd = None
        if fd is not None:
            os.close(fd)
        if dir_fd is not None:
            if key is not None and name is not None and not tidy:
                self._left = (key, dir_fd, name)
                return
            if name is not None:
                entries.remove(name, dir_fd)
            os.close(dir_fd)
        if key is not None and tidy:
            self.tidy(key)

    def tidy(self, key: str) -> None:
        """Remove our FIFO that ``leave(tidy=False)`` left, and ``key``'s directory if it
        is empty (no waiter's FIFO in it)."""
        self._remove_left()
        self.remove_key_dir(key)

    def tidy_left(self) -> None:
        """``tidy`` the key that ``leave(tidy=False)`` left our FIFO in, if any."""
        key = self._remove_left()
        if key is not None:
            self.remove_key_dir(key)

    def _remove_left(self) -> str | None:
        if self._left is None:
            return None
        key, dir_fd, name = self._left
        self._left = None
        entries.remove(name, dir_fd)
        os.close(dir_fd)
        return key

    def give_up(self, key: str, first: list[str] | None = None) -> None:
        """Leave ``key``'s queue and wake the next waiters (``first``: the run at the head
        of the queue), always.

        A wake-up meant for us cannot be told apart reliably from none:

        - A releaser may have opened our FIFO before we unlinked it.
          It may then write after any look we take, up to our close.
          After our close, the write fails, and the releaser tries the next waiter itself.
        - A wait cut short by a signal may have read a wake-up and dropped it.

        A wake-up we pass on needlessly costs the next waiter one look at the lease."""
        if self._key != key or self._fd is None:
            return
        self.leave()
        self.wake(key, first or [])

    def wake_one(self, key: str, first: str | None = None) -> None:
        """Wake the longest-waiting live waiter of ``key`` -- the one whose FIFO is named
        ``first`` (the head of the key's queue) when it is there -- if any. Never raises."""
        self.wake(key, [first] if first else [])

    def wake(self, key: str, run: list[str] | tuple[str, ...], fallback: bool = True) -> None:
        """Wake the live waiters of ``key`` whose FIFOs are named in ``run``.

        Those are the waiters a release may admit: the head of the queue and the shared run
        with it.
        When none of them is there and ``fallback`` is set, wake the longest-waiting live one.
        Never raises."""
        if not run and not fallback:
            return
        dir_fd = self.key_dir(key, create=False)
        if dir_fd is None:
            return
        try:
            own = self._name if self._key == key else None
            woken = False
            for name in run:
                if name != own and entries.is_unique(name) and self._woke(name, dir_fd):
                    woken = True
            if woken or not fallback:
                return
            for name in entries.names(dir_fd, entries.is_unique):  # (oldest first)
                if name != own and name not in run and self._woke(name, dir_fd):
                    return
        finally:
            os.close(dir_fd)

    def _woke(self, name: str, dir_fd: int) -> bool:
        try:
            fd = entries.open_to_write(name, dir_fd, self.file_mode)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader: its waiter is gone
                entries.remove(name, dir_fd)
            return False
        if fd is None:  # not a FIFO tasklock made: left alone
            return False
        try:
            os.write(fd, b"!")
        except BlockingIOError:  # woken already and not yet read; it will look
            pass
        except OSError:  # EPIPE: its reader closed just now; the next one, then
            return False
        finally:
            os.close(fd)
        return True
