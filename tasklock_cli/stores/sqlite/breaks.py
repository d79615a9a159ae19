"""How an SQLite holder hears of a break.

- The holder of a lease waiting for a break keeps a FIFO named after its fencing token.
- The FIFO is in the key's directory, under the store's holders directory (see entries).
- A break or forced release writes to it."""

from __future__ import annotations

import _thread
import errno
import os

from tasklock_cli.stores.sqlite import entries

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


class BreakAlarms(entries.KeyDirectories):
    """The FIFOs through which this process's held leases hear of a break, one per lease
    (key and fencing token) whose holder waits for one. A FIFO is kept from the first wait
    until the lease is released and no wait on it is under way (the holder's heartbeat may
    still wait on it as the release comes: the store's ``concurrent_release``), or until
    the store is closed (``forget_all``); so a break between two waits is still there to be
    read: it is never drained (a broken lease stays broken)."""

    def __init__(
        self,
        directory: str | Path,
        file_mode: int = entries.PRIVATE_MODE,
        owners: entries.Owners | None = None,
    ) -> None:
        super().__init__(directory, file_mode, owners)
        self._lock = _thread.allocate_lock()
        #: (key, token) -> (the key's directory fd, the FIFO's fd)
        self._fifos: dict[tuple[str, int], tuple[int, int]] = {}
        #: (key, token) -> how many waits on its FIFO are under way (``listen`` to ``done``)
        self._waits: dict[tuple[str, int], int] = {}
        #: Released leases whose FIFO goes when the last wait on it is done.
        self._released: set[tuple[str, int]] = set()

    def listen(self, key: str, token: int) -> tuple[int | None, bool]:
        """``(fd to select on, new)`` for the lease; ``new`` when just made (the caller must
        then look at the lease once: a break before this was sent to nobody). fd None when
        FIFOs cannot be made here."""
        with self._lock:
            known = self._fifos.get((key, token))
            if known is not None:
                self._count_wait(key, token)
                return known[1], False
            dir_fd = self.key_dir(key, create=True)
            if dir_fd is None:
                return None, True
            try:
                self._remove_dead(dir_fd)
                # (the rename replaces a dead holder's FIFO of the same name)
                fd = entries.make_fifo(
                    f"new.{entries.make_unique()}", str(token), dir_fd, self.file_mode
                )
            except OSError:
                os.close(dir_fd)
                return None, True
            self._fifos[(key, token)] = (dir_fd, fd)
            self._count_wait(key, token)
            return fd, True

    def _count_wait(self, key: str, token: int) -> None:
        self._waits[(key, token)] = self._waits.get((key, token), 0) + 1

    def done(self, key: str, token: int) -> None:
        """A wait on the FIFO that ``listen`` gave is over (whatever came of it): the FIFO
        goes if its lease was released meanwhile."""
        with self._lock:
            left = self._waits.pop((key, token), 1) - 1
            if left > 0:
                self._waits[(key, token)] = left
                return
            closing = self._closable(key, token)
        if closing is not None:
            self._close(key, token, *closing)

    def release(self, key: str, token: int) -> None:
        """The lease was released: its FIFO goes now, or when the wait on it under way is
        done (a holder's heartbeat, woken after the release)."""
        with self._lock:
            self._released.add((key, token))
            closing = None if (key, token) in self._waits else self._closable(key, token)
        if closing is not None:
            self._close(key, token, *closing)

    def _closable(self, key: str, token: int) -> tuple[int, int] | None:
        """The FIFO's descriptors, taken out of the books, when its lease was released."""
        if (key, token) not in self._released:
            return None
        self._released.discard((key, token))
        return self._fifos.pop((key, token), None)

    def forget_all(self) -> None:
        with self._lock:
            fifos, self._fifos = dict(self._fifos), {}
            self._waits.clear()
            self._released.clear()
        for (key, token), (dir_fd, fd) in fifos.items():
            self._close(key, token, dir_fd, fd)

    def _close(self, key: str, token: int, dir_fd: int, fd: int) -> None:
        entries.remove(str(token), dir_fd)
        os.close(dir_fd)
        os.close(fd)
        self.remove_key_dir(key)

    def _remove_dead(self, dir_fd: int) -> None:
        """Remove the key's FIFOs whose holders died without releasing (no reader)."""
        for name in entries.names(dir_fd, entries.is_token):
            try:
                fd = entries.open_to_write(name, dir_fd, self.file_mode)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    entries.remove(name, dir_fd)
                continue
            if fd is not None:
                os.close(fd)

    def alarm(self, key: str, token: int) -> None:
        """Tell the holder of ``key``'s lease with ``token`` that it is broken, if it waits
        for that (else it finds out when it starts to). Never raises."""
        dir_fd = self.key_dir(key, create=False)
        if dir_fd is None:
            return
        try:
            fd = entries.open_to_write(str(token), dir_fd, self.file_mode)
        except OSError:  # no such FIFO, or no reader: nobody to tell
            fd = None
        finally:
            os.close(dir_fd)
        if fd is None:
            return
        try:
            os.write(fd, b"!")
        except OSError:  # full (told already) or its reader closed just now
            pass
        finally:
            os.close(fd)
