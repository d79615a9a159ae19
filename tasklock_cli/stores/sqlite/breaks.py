"""How an SQLite holder hears of a break: the holder of a lease waiting for a break keeps a
FIFO named ``<hash of key>.<fencing token>`` in the store's holders directory, and a break or
forced release writes to it."""

from __future__ import annotations

import contextlib
import errno
import os
import threading

from tasklock_cli import paths
from tasklock_cli.stores.sqlite.waiting import key_prefix

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


class BreakAlarms:
    """The FIFOs through which this process's held leases hear of a break, one per lease
    (key and fencing token) whose holder waits for one. A FIFO is kept from the first wait
    until the lease is released, so a break between two waits is still there to be read:
    it is never drained (a broken lease stays broken)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = paths.normal(directory)
        self._lock = threading.Lock()
        self._fifos: dict[tuple[str, int], tuple[str, int]] = {}

    def _path(self, key: str, token: int) -> str:
        return paths.joined(self.directory, f"{key_prefix(key)}{token}")

    def listen(self, key: str, token: int) -> tuple[int | None, bool]:
        """``(fd to select on, new)`` for the lease; ``new`` when just made (the caller must
        then look at the lease once: a break before this was sent to nobody). fd None when
        FIFOs cannot be made here."""
        with self._lock:
            known = self._fifos.get((key, token))
            if known is not None:
                return known[1], False
            path = self._path(key, token)
            making = paths.joined(self.directory, f"new.{os.getpid()}.{os.urandom(4).hex()}")
            fd: int | None = None
            try:
                paths.make_dir(self.directory)
                self._remove_dead(key)
                os.mkfifo(making, 0o622)
                fd = os.open(making, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
                os.rename(making, path)  # replaces a dead holder's FIFO of the same name
            except OSError:
                if fd is not None:
                    os.close(fd)
                with contextlib.suppress(OSError):
                    os.unlink(making)
                return None, True
            self._fifos[(key, token)] = (path, fd)
            return fd, True

    def forget(self, key: str, token: int) -> None:
        with self._lock:
            known = self._fifos.pop((key, token), None)
        if known is not None:
            self._close(*known)

    def forget_all(self) -> None:
        with self._lock:
            fifos, self._fifos = list(self._fifos.values()), {}
        for path, fd in fifos:
            self._close(path, fd)

    @staticmethod
    def _close(path: str, fd: int) -> None:
        with contextlib.suppress(OSError):
            os.unlink(path)
        os.close(fd)

    def _remove_dead(self, key: str) -> None:
        """Remove the key's FIFOs whose holders died without releasing (no reader)."""
        prefix = key_prefix(key)
        with contextlib.suppress(OSError):
            for name in os.listdir(self.directory):
                if not name.startswith(prefix):
                    continue
                try:
                    os.close(
                        os.open(paths.joined(self.directory, name), os.O_WRONLY | os.O_NONBLOCK)
                    )
                except OSError as exc:
                    if exc.errno == errno.ENXIO:
                        with contextlib.suppress(OSError):
                            os.unlink(paths.joined(self.directory, name))

    def alarm(self, key: str, token: int) -> None:
        """Tell the holder of ``key``'s lease with ``token`` that it is broken, if it waits
        for that (else it finds out when it starts to). Never raises."""
        try:
            fd = os.open(self._path(key, token), os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # no such FIFO, or no reader: nobody to tell
            return
        try:
            os.write(fd, b"!")
        except OSError:  # full (told already) or its reader closed just now
            pass
        finally:
            os.close(fd)
