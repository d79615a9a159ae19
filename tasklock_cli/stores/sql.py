"""What the stores on a SQL server (PostgreSQL, MySQL) share.

- The connection's frame:

  - one connection, used under a lock;
  - opened on first use, and anew after a failure;
  - bounded by the I/O timeout.

- The store methods that only hand off to the connection and to the schema.

Each store's ``connection`` keeps what its driver does: opening and setting up a session,
``run`` with its retries, the driver's errors as tasklock's. (SQLite's store is a file on
this machine: it shares none of this.)
"""

from __future__ import annotations

import _thread
import contextlib
import math
from abc import ABC
from abc import abstractmethod

from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.urls import scrub

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from collections.abc import Iterable
    from datetime import datetime
    from typing import Any
    from typing import Protocol
    from typing import TypeVar

    _T = TypeVar("_T")

    class _Schema(Protocol):
        def schema_sql(self) -> str: ...


DEFAULT_IO_TIMEOUT_S = 5.0


class SqlConnection(ABC):
    """The store's one connection (``current``, the driver's), used under ``lock`` through
    ``run``. ``secrets``: what to scrub from messages (the URL's passwords)."""

    def __init__(self, display_url: str, secrets: Iterable[str]) -> None:
        self.display_url = display_url
        self._secrets = list(secrets)
        self.io_timeout = DEFAULT_IO_TIMEOUT_S
        self.lock = _thread.RLock()  # threading.RLock (threading is not on `run`'s path)
        self.current: Any = None
        self._applied_timeout: float | None = None  # the I/O timeout the session has
        self._schema_ok = False  # the schema was found or made current in this session
        self._schema_seen = False  # ... in any session of this process (``schema_timeout``)

    @abstractmethod
    def run(
        self,
        operation: Callable[[Any], _T],
        *,
        idempotent: bool = True,
        ensure_schema: bool = True,
    ) -> _T:
        """Run ``operation`` on the connection, mapping every failure to a tasklock error."""

    def scrub(self, text: str) -> str:
        """``text`` without the secrets, on one line (the drivers' messages may span lines)."""
        return " ".join(scrub(text, self._secrets).split())

    def schema_timeout(self) -> float:
        """How long making or migrating the tables may take: on this process's first look
        at them, the default I/O timeout at least, whatever a run's own (a short TTL's is a
        fraction of a second): a first use may meet a busy server, or wait for another first
        user making them. Once they were found or made, the I/O timeout: a renewal or release
        that finds them changed (after a reconnection) holds a lease, and must not wait
        past it (the supervisor's deadline would end the run meanwhile)."""
        if self._schema_seen:
            return self.io_timeout
        return max(self.io_timeout, DEFAULT_IO_TIMEOUT_S)

    def _schema_confirmed(self) -> None:
        """The tables were found or made current: in this session, and so in this process."""
        self._schema_ok = self._schema_seen = True

    def set_io_timeout(self, seconds: float) -> None:
        if math.isfinite(seconds) and seconds > 0:
            with self.lock:
                self.io_timeout = seconds  # applied to the connection on its next use

    def drop(self) -> None:
        """Close the connection; the next call opens a new one."""
        conn, self.current = self.current, None
        self._session_ended()
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _session_ended(self) -> None:
        """The session is gone (dropped, or replaced by a new one): what it had, it lost."""
        self._schema_ok = False

    def close(self) -> None:
        with self.lock:
            self.drop()


class SqlStore(Store):
    """A store on a SQL server: its connection ``_db`` and its tables ``_schema``. Its
    traits are its package's ``CAPABILITIES`` (``failover_window``: a promoted asynchronous
    standby or replica may lack the last leases, see ``failover``)."""

    _db: SqlConnection
    _schema: _Schema

    def set_io_timeout(self, seconds: float) -> None:
        self._db.set_io_timeout(seconds)

    def init_schema(self) -> str | None:
        self._db.run(lambda conn: None)  # (a first use makes what is missing)
        return None

    def schema_sql(self) -> str:
        return self._schema.schema_sql()


def taken_lease(
    key: str,
    owner: str,
    columns: tuple,
    to_utc: Callable[[Any], datetime],
    to_text: Callable[[Any], str] = str,
) -> Lease:
    """The lease an acquire took, from its reply's ``(slot, slot_limit, fencing_token,
    acquired_at, expires_at, mode)``, the driver's times made UTC by ``to_utc``."""
    slot, slot_limit, token, acquired_at, expires_at, mode = columns
    return Lease(
        key,
        owner,
        int(token),
        to_utc(acquired_at),
        to_utc(expires_at),
        slot=int(slot),
        limit=int(slot_limit),
        mode=to_text(mode),
    )
