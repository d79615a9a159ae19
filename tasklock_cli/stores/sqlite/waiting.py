"""Release wake-ups between processes on one machine, for the SQLite store.

Each waiter of a key owns a FIFO in a directory beside the database, named
``<hash of key>.<time_ns>.<pid>.<random>``, and keeps it open for reading while it waits.
A release lists the key's FIFOs and writes one byte to the oldest one whose reader is
still there, so one release wakes one waiter, the one that has waited longest. A FIFO
without a reader (its waiter died) cannot be opened for writing: the release removes it
and tries the next.

A waiter that is not woken (its waker died between commit and wake-up, or the holder
was on another machine sharing the file) still polls, at its caller's ceiling.

Holders are told of a break the same way (``BreakAlarms``): the holder of a lease waiting
for a break keeps a FIFO named ``<hash of key>.<fencing token>`` in its own directory, and
a break or forced release writes to it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time

try:  # the built-in SHA-256: hashlib would load OpenSSL (milliseconds on every run)
    from _sha256 import sha256 as _sha256  # Python < 3.12
except ImportError:  # pragma: no cover - the module's name from 3.12 on
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:
        from hashlib import sha256 as _sha256

from tasklock_cli import paths
from tasklock_cli.stores.base import wait_readable

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


def key_prefix(key: str) -> str:
    return _sha256(key.encode()).hexdigest()[:24] + "."


class LocalWakeups:
    def __init__(self, directory: str | Path) -> None:
        self.directory = paths.normal(directory)
        self._key: str | None = None
        self._path: str | None = None
        self._fd: int | None = None

    @property
    def key(self) -> str | None:
        """The key whose queue we are in, if any."""
        return self._key

    @property
    def name(self) -> str | None:
        """Our FIFO's name in the directory, while we have one."""
        return None if self._path is None else self._path.rpartition("/")[2]

    def register(self, key: str) -> bool:
        """Join the queue of ``key``'s waiters (keeping our place if already in it);
        False when this machine cannot make FIFOs there (the caller just polls)."""
        if self._key == key and self._fd is not None:
            return True
        self.leave()
        unique = f"{time.time_ns():020d}.{os.getpid()}.{os.urandom(4).hex()}"
        path = paths.joined(self.directory, f"{key_prefix(key)}{unique}")
        # Made and opened under a name no release looks at, then renamed: a release never
        # finds the FIFO without its reader (which it would take for a dead waiter's).
        making = paths.joined(self.directory, f"new.{unique}")
        fd: int | None = None
        try:
            paths.make_dir(self.directory)
            os.mkfifo(making, 0o622)  # anyone may wake us; only we read
            # Read-write, not read-only: a read-only FIFO whose last writer has gone reads
            # as end-of-file, so select() would report it ready for good after the first
            # wake-up and a waiter that then lost the race would spin.
            fd = os.open(making, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            os.rename(making, path)
            self._key, self._path, self._fd = key, path, fd
        except BaseException as exc:  # OSError, or a signal that stops the wait: undo it all
            self._key = self._path = self._fd = None
            if fd is not None:
                os.close(fd)
            for name in (making, path):
                with contextlib.suppress(OSError):
                    os.unlink(name)
            if isinstance(exc, OSError):
                return False
            raise
        return True

    def wait(self, timeout: float, wake_fd: int | None = None) -> bool:
        """Block up to ``timeout`` for a wake-up on the registered key, or until ``wake_fd``
        is readable (not read); True when woken by a release."""
        fd = self._fd
        with contextlib.suppress(InterruptedError):
            if fd in wait_readable([fd, wake_fd], timeout):
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 64)
                return True
        return False

    def leave(self) -> None:
        """Leave the queue: the holder, or a waiter that gave up, wants no wake-ups."""
        fd, path = self._fd, self._path
        self._key = self._path = self._fd = None
        if fd is not None:
            os.close(fd)
        if path is not None:
            with contextlib.suppress(OSError):
                os.unlink(path)

    def give_up(self, key: str, first: str | None = None) -> None:
        """Leave ``key``'s queue and wake the next waiter, always.

        A wake-up meant for us cannot be told apart reliably from none: a releaser that
        opened our FIFO before we unlinked it may write after any look we take, up to our
        close (after it, the write fails and the releaser tries the next waiter itself);
        and a wait cut short by a signal may have read one and dropped it. A wake-up we
        pass on needlessly costs the next waiter one look at the lease."""
        if self._key != key or self._fd is None:
            return
        self.leave()
        self.wake_one(key, first)

    def wake_one(self, key: str, first: str | None = None) -> None:
        """Wake the longest-waiting live waiter of ``key`` -- the one whose FIFO is named
        ``first`` (the head of the key's queue) when it is there -- if any. Never raises."""
        prefix = key_prefix(key)
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.startswith(prefix))
        except OSError:
            return
        names.sort(key=lambda name: name != first)  # (stable: then the oldest)
        for name in names:
            path = paths.joined(self.directory, name)
            if path == self._path:
                continue
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # no reader: its waiter is gone
                    with contextlib.suppress(OSError):
                        os.unlink(path)
                continue
            try:
                os.write(fd, b"!")
            except BlockingIOError:  # woken already and not yet read; it will look
                pass
            except OSError:  # EPIPE: its reader closed just now; the next one, then
                continue
            finally:
                os.close(fd)
            return
