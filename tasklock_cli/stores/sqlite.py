"""SQLite file store: one machine, many processes.

Expiry runs on CLOCK_BOOTTIME tagged with the kernel's boot id, so a wall-clock jump
changes nothing and a reboot (which ended every holder) frees every lease.

A release wakes the key's longest-waiting waiter on this machine through a FIFO in
``<file>.waiters/`` (see local_wakeups); waiters also look again when the lease runs out.
A break or forced release tells the lease's holder through its FIFO in ``<file>.holders/``.
A broken lease keeps its row, its owner token prefixed with ``broken:`` (see base).
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote
from urllib.parse import urlsplit

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import UsageError
from tasklock_cli.stores.base import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.base import LEDGER_KEEP
from tasklock_cli.stores.base import LIST_PAGE
from tasklock_cli.stores.base import Holder
from tasklock_cli.stores.base import Lease
from tasklock_cli.stores.base import LeaseInfo
from tasklock_cli.stores.base import RunRecord
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.base import StoreCheck
from tasklock_cli.stores.base import prefix_upper_bound
from tasklock_cli.stores.base import utc_from_timestamp
from tasklock_cli.stores.base import wait_readable
from tasklock_cli.stores.doctor import warning
from tasklock_cli.stores.local_wakeups import BreakAlarms
from tasklock_cli.stores.local_wakeups import LocalWakeups
from tasklock_cli.stores.urls import default_sqlite_path
from tasklock_cli.stores.urls import sqlite_url

TABLE = "tasklock_leases"
RUNS_TABLE = "tasklock_runs"
#: typing costs ~2 ms per start: _T is for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TypeVar

    _T = TypeVar("_T")
_BUSY_CODES = {getattr(sqlite3, "SQLITE_BUSY", 5), getattr(sqlite3, "SQLITE_LOCKED", 6)}
SCHEMA_VERSION = 3
BUSY_TIMEOUT_S = 5.0
#: SQLite's own busy handler sleeps ever longer (up to 100 ms a time) while the write lock
#: is taken, so a waiter can miss the moments it is free; it gets only this long per try,
#: and tasklock retries itself every millisecond or so until BUSY_TIMEOUT_S.
BUSY_SLICE_S = 0.003
SWEEP_BATCH = 500
SWEEP_PAUSE_MIN_S = 0.002
#: Where FIFOs cannot be made, waiters poll at this interval instead.
UNSIGNALLED_POLL_S = 0.05
NETWORK_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "fuse.sshfs",
    "glusterfs",
    "ceph",
}

_EXPIRY_INDEX = f"""CREATE INDEX IF NOT EXISTS {TABLE}_expiry ON {TABLE} (boot_id, expires_boot)
    WHERE owner_token IS NOT NULL;"""
# The run ledger: one row per run, written with the release (``data``: RunRecord.fields).
_RUNS_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (
    key           TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    started_at    REAL NOT NULL,
    ended_at      REAL NOT NULL,
    data          TEXT NOT NULL,
    PRIMARY KEY (key, fencing_token)
) WITHOUT ROWID;"""
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    key           TEXT PRIMARY KEY,
    fencing_token INTEGER NOT NULL,
    owner_token   TEXT,
    boot_id       TEXT,
    expires_boot  REAL,
    acquired_at   REAL,
    expires_at    REAL,
    holder        TEXT
) WITHOUT ROWID;
{_EXPIRY_INDEX}
{_RUNS_SCHEMA}
"""
# Version 1 indexed expires_boot alone, which a sweep could only scan from end to end;
# version 2 had no run ledger. (Each step is idempotent, so all run from any version.)
_MIGRATE = f"""
{_EXPIRY_INDEX}
DROP INDEX IF EXISTS {TABLE}_held;
{_RUNS_SCHEMA}
"""
_COLUMNS = {
    "key",
    "fencing_token",
    "owner_token",
    "boot_id",
    "expires_boot",
    "acquired_at",
    "expires_at",
    "holder",
}

# A lease is live when it has an owner, was granted in this boot, and has not run out.
_LIVE = "owner_token IS NOT NULL AND boot_id = :boot AND expires_boot > :now"
# Expired = run out in this boot, or granted in another boot: three ranges of the expiry
# index, so nothing scans the held leases (each repeats the partial index's condition).
_EXPIRED_RANGES = (
    "owner_token IS NOT NULL AND boot_id = :boot AND expires_boot <= :now",
    "owner_token IS NOT NULL AND boot_id < :boot",
    "owner_token IS NOT NULL AND boot_id > :boot",
)
_EXPIRED = "(" + " OR ".join(f"({part})" for part in _EXPIRED_RANGES) + ")"

_ACQUIRE = f"""
INSERT INTO {TABLE} (key, fencing_token, owner_token, boot_id, expires_boot,
                     acquired_at, expires_at, holder)
VALUES (:key, 1, :owner, :boot, :now + :ttl, :wall, :wall + :ttl, :holder)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = CASE WHEN owner_token IS :owner THEN fencing_token ELSE fencing_token + 1 END,
    acquired_at   = CASE WHEN owner_token IS :owner THEN acquired_at ELSE excluded.acquired_at END,
    owner_token = excluded.owner_token, boot_id = excluded.boot_id,
    expires_boot = excluded.expires_boot, expires_at = excluded.expires_at,
    holder = excluded.holder
WHERE owner_token IS NULL OR owner_token IS :owner OR NOT ({_LIVE})
RETURNING fencing_token, acquired_at, expires_at
"""
_RENEW = f"""
UPDATE {TABLE} SET expires_boot = :now + :ttl, expires_at = :wall + :ttl
WHERE key = :key AND owner_token = :owner AND {_LIVE}
RETURNING expires_at
"""
# Freeing a row clears the lease and keeps the key's fencing counter.
_FREE = f"""UPDATE {TABLE} SET owner_token = NULL, boot_id = NULL, expires_boot = NULL,
                   expires_at = NULL, holder = NULL"""
# The owner's release frees its lease, broken or not.
_RELEASE = f"{_FREE} WHERE key = :key AND owner_token IN (:owner, :broken)"
# A lease matching :token (any when NULL), live or not.
_MATCHING = "key = :key AND owner_token IS NOT NULL AND (:token IS NULL OR fencing_token = :token)"
_FORCE_RELEASE = f"{_FREE} WHERE {_MATCHING}"
_RELEASE_LATER = f"""
UPDATE {TABLE} SET expires_boot = :now + :keep, expires_at = :wall + :keep
WHERE key = :key AND owner_token = :owner AND {_LIVE}
"""
_BREAK = f"""
UPDATE {TABLE} SET owner_token = CASE
        WHEN substr(owner_token, 1, length(:prefix)) = :prefix THEN owner_token
        ELSE :prefix || owner_token END
WHERE {_MATCHING} AND {_LIVE}
RETURNING key, fencing_token, acquired_at, expires_at, holder, 1
"""
# Our lease is still ours, unbroken (expired or not: the renewal tells that).
_INTACT = f"""SELECT 1 FROM {TABLE}
WHERE key = :key AND owner_token = :owner AND fencing_token = :token"""
# Seconds (this boot's clock) until the live lease on a key runs out; no row = free.
_REMAINING = f"SELECT expires_boot - :now FROM {TABLE} WHERE key = :key AND {_LIVE}"
_SELECT = (
    f"SELECT key, fencing_token, acquired_at, expires_at, holder, ({_LIVE}) AS live FROM {TABLE}"
)
# Seconds left of the live, unbroken lease with a fencing token.
_TIME_LEFT = f"""SELECT expires_boot - :now FROM {TABLE}
WHERE key = :key AND fencing_token = :token AND {_LIVE}
  AND substr(owner_token, 1, length(:prefix)) <> :prefix"""
# A run already in the ledger (a retried release) is kept as first written.
_RECORD_RUN = f"""INSERT INTO {RUNS_TABLE} (key, fencing_token, started_at, ended_at, data)
VALUES (:key, :token, :started, :wall, :data) ON CONFLICT DO NOTHING"""
# The key's newest success (``--once-per``, ``metrics``); the trim never removes it.
_NEWEST_SUCCESS = f"""FROM {RUNS_TABLE}
WHERE key = :key AND json_extract(data, '$.outcome') = 'succeeded'
ORDER BY fencing_token DESC LIMIT 1"""
_TRIM_RUNS = f"""DELETE FROM {RUNS_TABLE} WHERE key = :key AND fencing_token < (
    SELECT fencing_token FROM {RUNS_TABLE} WHERE key = :key
     ORDER BY fencing_token DESC LIMIT 1 OFFSET {LEDGER_KEEP - 1})
  AND fencing_token IS NOT (SELECT fencing_token {_NEWEST_SUCCESS})"""
_LAST_SUCCESS = f"SELECT key, fencing_token, started_at, ended_at, data {_NEWEST_SUCCESS}"
_HISTORY = f"""SELECT key, fencing_token, started_at, ended_at, data FROM {RUNS_TABLE}
WHERE key = :key ORDER BY fencing_token DESC LIMIT :limit"""
_LEDGER_KEYS = f"""SELECT DISTINCT key FROM {RUNS_TABLE}
WHERE key >= :prefix AND substr(key, 1, :n) = :prefix ORDER BY key"""


def boot_clock() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def current_boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "unknown-boot"


class SQLiteStore(Store):
    signals_release = True  # among processes on this machine (see local_wakeups)

    def __init__(
        self, path: Path, clock=boot_clock, wall_clock=time.time, create_parent: bool = False
    ) -> None:
        self.path = path
        self._create_parent = create_parent
        self.display_url = sqlite_url(path)
        self._clock = clock
        self._wall = wall_clock
        self._boot = current_boot_id()
        self._conn: sqlite3.Connection | None = None
        # One connection, shared by the threads of a process (the heartbeat and the main
        # thread, or many leases held through the API): one transaction at a time on it.
        self._lock = threading.RLock()
        self._wakeups = LocalWakeups(path.with_name(path.name + ".waiters"))
        self._alarms = BreakAlarms(path.with_name(path.name + ".holders"))

    @classmethod
    def from_url(cls, url: str) -> SQLiteStore:
        parts = urlsplit(url)
        if parts.netloc:  # sqlite://x.db: a file that moves with the current directory
            raise UsageError(
                f"sqlite URL {url!r} is not an absolute path (sqlite://x.db would depend "
                "on the current directory, so cron and a shell would use different "
                "stores); use sqlite:///ABS/PATH.db (three slashes)"
            )
        raw_path = unquote(parts.path)
        if not raw_path or raw_path == "/":
            raise ConfigError(f"sqlite URL {url!r} names no file (use sqlite:///ABS/PATH.db)")
        path = Path(raw_path)
        # Only the default store's directory is made; an explicit path names a place the
        # user chose, and a missing directory there is more likely a typo.
        return cls(path, create_parent=path == default_sqlite_path())

    # -- connection ---------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> sqlite3.Connection:
        if self._create_parent:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"cannot create {self.path.parent}: {exc.strerror}") from exc
        elif not self.path.parent.is_dir():
            raise ConfigError(
                f"the directory of the SQLite store {self.path} does not exist "
                f"(create {self.path.parent} or choose another path)"
            )
        try:
            conn = sqlite3.connect(
                self.path, timeout=BUSY_SLICE_S, isolation_level=None, check_same_thread=False
            )
            self._when_not_busy(lambda: conn.execute("PRAGMA journal_mode=WAL"))
            conn.execute("PRAGMA synchronous=NORMAL")
            self._ensure_schema(conn)
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc
        return conn

    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info({TABLE})")}
        if not columns:
            script = f"BEGIN IMMEDIATE;{SCHEMA}PRAGMA user_version={SCHEMA_VERSION};COMMIT;"
            self._when_not_busy(lambda: conn.executescript(script))
            return
        if columns != _COLUMNS:
            raise ConfigError(
                f"{self.path}: table {TABLE} exists but is not a tasklock table "
                f"(columns: {', '.join(sorted(columns))})"
            )
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version < SCHEMA_VERSION:
            script = f"BEGIN IMMEDIATE;{_MIGRATE}PRAGMA user_version={SCHEMA_VERSION};"
            script += "COMMIT;"
            self._when_not_busy(lambda: conn.executescript(script))

    def _translate(self, exc: sqlite3.Error) -> Exception:
        message = str(exc)
        lowered = message.lower()
        if "not a database" in lowered or "malformed" in lowered:
            return ConfigError(f"{self.path} is not a tasklock SQLite database ({message})")
        if "readonly" in lowered or "unable to open" in lowered or "permission" in lowered:
            return ConfigError(f"cannot write {self.path} ({message})")
        return StoreUnavailable(f"{self.path}: {message}")

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            conn = self._connection()
            try:
                self._when_not_busy(lambda: conn.execute("BEGIN IMMEDIATE"))
                try:
                    yield conn
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                self._when_not_busy(lambda: conn.execute("COMMIT"))
            except sqlite3.Error as exc:
                raise self._translate(exc) from exc

    def _read(self, sql: str, params: dict) -> list[sqlite3.Row]:
        try:
            with self._lock:
                conn = self._connection()
                return self._when_not_busy(lambda: conn.execute(sql, params).fetchall())
        except sqlite3.Error as exc:
            raise self._translate(exc) from exc

    @staticmethod
    def _when_not_busy(operation: Callable[[], _T]) -> _T:
        """Retry ``operation`` while the database is busy, at short intervals, for at most
        BUSY_TIMEOUT_S; then the busy error is the caller's."""
        give_up_at = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                return operation()
            except sqlite3.OperationalError as exc:
                busy = getattr(exc, "sqlite_errorcode", None) in _BUSY_CODES
                if not (busy or "database is locked" in str(exc)):
                    raise
                if time.monotonic() >= give_up_at:
                    raise
            import random  # only when busy: ~1 ms of start-up otherwise

            time.sleep(random.uniform(0.0005, 0.0015))

    def _times(self) -> dict:
        return {"boot": self._boot, "now": self._clock(), "wall": self._wall()}

    # -- the interface --------------------------------------------------------------

    def acquire(self, key: str, ttl: float, holder: Holder, owner_token: str) -> Lease | None:
        params = {
            **self._times(),
            "key": key,
            "ttl": ttl,
            "owner": owner_token,
            "holder": json.dumps(holder.to_dict()),
        }
        with self._write() as conn:
            row = conn.execute(_ACQUIRE, params).fetchone()
        if row is None:
            return None
        self._wakeups.leave()
        token, acquired_at, expires_at = row
        return Lease(
            key, owner_token, token, utc_from_timestamp(acquired_at), utc_from_timestamp(expires_at)
        )

    def renew(self, lease: Lease, ttl: float) -> Lease:
        params = {**self._times(), "key": lease.key, "owner": lease.owner_token, "ttl": ttl}
        with self._write() as conn:
            row = conn.execute(_RENEW, params).fetchone()
        return lease.renewed_until(None if row is None else utc_from_timestamp(row[0]))

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        params = {
            **self._times(),
            "key": lease.key,
            "owner": lease.owner_token,
            "broken": BROKEN_OWNER_PREFIX + lease.owner_token,
            "keep": keep_for,
        }
        freed = False
        with self._write() as conn:
            kept = keep_for > 0 and conn.execute(_RELEASE_LATER, params).rowcount == 1
            if not kept:  # (a broken lease is freed, keep_for or not)
                freed = conn.execute(_RELEASE, params).rowcount == 1
            if record is not None:
                self._record_run(conn, record, params["wall"])
        self._alarms.forget(lease.key, lease.fencing_token)
        if freed:
            self._wakeups.wake_one(lease.key)
        return kept or freed

    @staticmethod
    def _record_run(conn: sqlite3.Connection, record: RunRecord, wall: float) -> None:
        params = {
            "key": record.key,
            "token": record.fencing_token,
            "started": record.started_at.timestamp(),
            "wall": wall,
            "data": json.dumps(record.fields()),
        }
        conn.execute(_RECORD_RUN, params)
        conn.execute(_TRIM_RUNS, params)

    def time_left(self, key: str, fencing_token: int) -> float | None:
        params = {**self._times(), "key": key, "token": fencing_token}
        rows = self._read(_TIME_LEFT, {**params, "prefix": BROKEN_OWNER_PREFIX})
        return max(0.0, float(rows[0][0])) if rows else None

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        rows = self._read(_HISTORY, {"key": key, "limit": limit})
        return [_run_record(*row) for row in rows]

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        # This machine's wall clock, which also timed every run's start (acquired_at).
        rows = self._read(_LAST_SUCCESS, {"key": key})
        now = utc_from_timestamp(self._wall())
        return (_run_record(*rows[0]) if rows else None), now

    def ledger_keys(self, prefix: str = "") -> list[str]:
        rows = self._read(_LEDGER_KEYS, {"prefix": prefix, "n": len(prefix)})
        return [row[0] for row in rows]

    def peek(self, key: str) -> LeaseInfo | None:
        rows = self._read(f"{_SELECT} WHERE key = :key AND {_LIVE}", {**self._times(), "key": key})
        return _lease_info(rows[0]) if rows else None

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        condition = "owner_token IS NOT NULL" if include_expired else _LIVE
        upper = prefix_upper_bound(prefix)
        bounded = " AND key < :upper" if upper is not None else ""
        sql = (
            f"{_SELECT} WHERE {condition} AND key >= :prefix{bounded} AND key > :after"
            f" AND substr(key, 1, :n) = :prefix ORDER BY key LIMIT {LIST_PAGE}"
        )
        after = ""  # keys are never empty
        while True:  # each page judged live on the clock as it is read
            times = self._times()
            params = {**times, "prefix": prefix, "n": len(prefix), "upper": upper, "after": after}
            rows = self._read(sql, params)
            yield from (_lease_info(row) for row in rows)
            if len(rows) < LIST_PAGE:
                return
            after = rows[-1][0]

    def sweep(self, dry_run: bool = False) -> int:
        if dry_run:
            sql = f"SELECT count(*) FROM {TABLE} WHERE {_EXPIRED}"
            return int(self._read(sql, self._times())[0][0])
        # One range at a time: LIMIT then stops a batch early (the OR of the three would
        # collect every expired row first).
        removed = 0
        for expired in _EXPIRED_RANGES:
            victims = f"SELECT key FROM {TABLE} WHERE {expired} LIMIT {SWEEP_BATCH}"
            clear = f"{_FREE} WHERE key IN ({victims})"
            while True:
                started = time.monotonic()
                with self._write() as conn:
                    count = conn.execute(clear, self._times()).rowcount
                removed += count
                if count < SWEEP_BATCH:
                    break
                # Small batches, and a pause twice as long as each, so acquirers retrying
                # a busy database (see _when_not_busy) get the write lock between batches.
                time.sleep(max(SWEEP_PAUSE_MIN_S, 2 * (time.monotonic() - started)))
        return removed

    def break_lease(self, key: str, token: int | None = None) -> LeaseInfo | None:
        params = {**self._times(), "key": key, "token": token, "prefix": BROKEN_OWNER_PREFIX}
        with self._write() as conn:
            row = conn.execute(_BREAK, params).fetchone()
        if row is None:
            return None
        info = _lease_info(row)
        self._alarms.alarm(key, info.fencing_token)
        return info

    def force_release(self, key: str, token: int | None = None) -> LeaseInfo | None:
        params = {**self._times(), "key": key, "token": token}
        with self._write() as conn:
            row = conn.execute(f"{_SELECT} WHERE {_MATCHING}", params).fetchone()
            if row is None:
                return None
            conn.execute(_FORCE_RELEASE, params)
        info = _lease_info(row)
        self._wakeups.wake_one(key)
        self._alarms.alarm(key, info.fencing_token)
        return info

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """Wait on the lease's FIFO in ``<file>.holders/``, which a break writes to. Made
        at the first wait and kept until release, then looked at once: a break before the
        FIFO existed told nobody."""
        fd, new = self._alarms.listen(lease.key, lease.fencing_token)
        if fd is None:  # no FIFOs here: learnt of at the next renewal
            return super().wait_for_break(lease, timeout, wake_fd)
        if new and not self._intact(lease):
            return True
        return fd in wait_readable([fd, wake_fd], timeout)

    def _intact(self, lease: Lease) -> bool:
        params = {"key": lease.key, "owner": lease.owner_token, "token": lease.fencing_token}
        return bool(self._read(_INTACT, params))

    def wait_for_release(self, key: str, timeout: float, wake_fd: int | None = None) -> None:
        """Wait for a release on this machine to wake us (one waiter per release, the one
        waiting longest), at most until the lease runs out. Registering comes before the
        look at the lease, so a release in between is seen by that look."""
        if timeout <= 0:
            return
        if not self._wakeups.register(key):  # no FIFOs here: poll
            wait_readable([wake_fd], min(timeout, UNSIGNALLED_POLL_S))
            return
        rows = self._read(_REMAINING, {**self._times(), "key": key})
        if not rows:
            return  # free already
        self._wakeups.wait(min(timeout, max(0.0, rows[0][0]) + 0.002), wake_fd)

    def stop_waiting(self, key: str) -> None:
        self._wakeups.give_up(key)

    def init_schema(self) -> None:
        self._connection()

    def schema_sql(self) -> str:
        return SCHEMA.strip() + f"\nPRAGMA user_version = {SCHEMA_VERSION};\n"

    def doctor(self) -> list[StoreCheck]:
        checks = [StoreCheck("store", True, self.display_url)]
        started = time.perf_counter()
        try:
            self._connection()
            probe_key = f"tasklock-doctor-{os.urandom(16).hex()}"
            self.peek(probe_key)
        except (ConfigError, StoreUnavailable) as exc:
            checks.append(StoreCheck("reachable", False, str(exc)))
            return checks
        elapsed = (time.perf_counter() - started) * 1000
        checks.append(StoreCheck("reachable", True, f"opened and queried in {elapsed:.1f} ms"))
        checks.append(StoreCheck("schema", True, f"table {TABLE}, version {SCHEMA_VERSION}"))
        checks.append(StoreCheck("clock", True, "this machine's clock (CLOCK_BOOTTIME); no skew"))
        checks.append(filesystem_check(self.path))
        return checks

    def close(self) -> None:
        # Still in a queue at close: the wait was cut short (a signal), maybe just after
        # a wake-up was read. Waking the next waiter costs it one look at most.
        if self._wakeups.key is not None:
            self._wakeups.give_up(self._wakeups.key)
        self._alarms.forget_all()
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _lease_info(row: tuple) -> LeaseInfo:
    key, token, acquired_at, expires_at, holder, live = row
    return LeaseInfo(
        key=key,
        holder=Holder.from_dict(json.loads(holder or "{}")),
        fencing_token=int(token),
        acquired_at=utc_from_timestamp(acquired_at or 0),
        expires_at=utc_from_timestamp(expires_at or 0),
        expired=not live,
    )


def _run_record(key: str, token: int, started: float, ended: float, data: str) -> RunRecord:
    return RunRecord.from_fields(
        key, token, utc_from_timestamp(started), utc_from_timestamp(ended), json.loads(data)
    )


def filesystem_check(path: Path) -> StoreCheck:
    """doctor's ``filesystem`` line: a warning on a network filesystem."""
    fstype = filesystem_type(path)
    if fstype in NETWORK_FILESYSTEMS or (fstype or "").startswith("fuse"):
        return warning(
            "filesystem",
            f"{path} is on {fstype}: SQLite locking is unreliable on network filesystems; "
            "use PostgreSQL or Redis across machines",
        )
    return StoreCheck("filesystem", True, f"{fstype or 'unknown'} (local)")


def filesystem_type(path: Path) -> str | None:
    """The filesystem type of the mount holding ``path``, from /proc/self/mountinfo."""
    try:
        target = os.path.realpath(path.parent)
        best, best_type = "", None
        with open("/proc/self/mountinfo") as mountinfo:
            for line in mountinfo:
                fields = line.split()
                mount_point = fields[4].replace("\\040", " ")
                fstype = fields[fields.index("-") + 1]
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, fstype
        return best_type
    except (OSError, ValueError, IndexError):
        return None
