"""The SQLite store class and its statements (the overview is the package's docstring)."""

from __future__ import annotations

import os
import time

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import CounterUnreadable
from tasklock_cli.errors import FencingExhausted
from tasklock_cli.errors import LimitMismatch
from tasklock_cli.errors import QueueFull
from tasklock_cli.errors import Superseded
from tasklock_cli.errors import TasklockError
from tasklock_cli.errors import UsageError
from tasklock_cli.stores import rows as row_parsing
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import BROKEN_OWNER_PREFIX
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import MAX_FENCING_TOKEN
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import breaker
from tasklock_cli.stores.model import breaker_of
from tasklock_cli.stores.model import place_record
from tasklock_cli.stores.model import unreadable_expiry_bound
from tasklock_cli.stores.queueing import QUEUED
from tasklock_cli.stores.queueing import Queued
from tasklock_cli.stores.sqlite import CAPABILITIES
from tasklock_cli.stores.sqlite import queue
from tasklock_cli.stores.sqlite.breaks import BreakAlarms
from tasklock_cli.stores.sqlite.connection import SQLiteConnection
from tasklock_cli.stores.sqlite.connection import sqlite3
from tasklock_cli.stores.sqlite.entries import PRIVATE_MODE
from tasklock_cli.stores.sqlite.entries import Owners
from tasklock_cli.stores.sqlite.files import file_mode_parameter
from tasklock_cli.stores.sqlite.reads import LIVE
from tasklock_cli.stores.sqlite.reads import LIVE_ON_KEY
from tasklock_cli.stores.sqlite.reads import NEWEST_SUCCESS
from tasklock_cli.stores.sqlite.reads import SELECT_LEASES
from tasklock_cli.stores.sqlite.reads import UNREADABLE_EXPIRY
from tasklock_cli.stores.sqlite.reads import SQLiteReads
from tasklock_cli.stores.sqlite.reads import by_key
from tasklock_cli.stores.sqlite.reads import lease_info_of
from tasklock_cli.stores.sqlite.schema import RUNS_TABLE
from tasklock_cli.stores.sqlite.schema import SCHEMA
from tasklock_cli.stores.sqlite.schema import SCHEMA_VERSION
from tasklock_cli.stores.sqlite.schema import TABLE
from tasklock_cli.stores.sqlite.schema import WAITERS_TABLE  # noqa: F401 - named here too
from tasklock_cli.stores.sqlite.waiting import LocalWakeups
from tasklock_cli.stores.urls import default_sqlite_file
from tasklock_cli.stores.urls import sqlite_netloc_and_path
from tasklock_cli.stores.urls import sqlite_url
from tasklock_cli.stores.urls import unknown_parameter
from tasklock_cli.stores.urls import url_parameters
from tasklock_cli.util import jsontext as json
from tasklock_cli.util import paths
from tasklock_cli.util import suppressed
from tasklock_cli.util.fds import wait_readable
from tasklock_cli.util.times import utc_from_timestamp

#: typing costs ~2 ms per start: its names are for the type checker only. ``list`` in
#: SQLiteStore's body is the method: annotations there name the type as builtins.list.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins
    from pathlib import Path

SWEEP_BATCH = 500
SWEEP_PAUSE_MIN_S = 0.002
#: Where FIFOs cannot be made, waiters poll at this interval instead.
UNSIGNALLED_POLL_S = 0.05
#: A shared caller's slots have no bound (SQLite's largest integer).
_UNBOUNDED = 9223372036854775807

# Expired = run out in this boot, or granted in another boot: three ranges of the expiry
# index, so nothing scans the held leases (each repeats the partial index's condition).
_EXPIRED_RANGES = (
    "owner_token IS NOT NULL AND boot_id = :boot AND expires_boot <= :now",
    "owner_token IS NOT NULL AND boot_id < :boot",
    "owner_token IS NOT NULL AND boot_id > :boot",
)
_EXPIRED = "(" + " OR ".join(f"({part})" for part in _EXPIRED_RANGES) + ")"
_BOUND_EXPIRY = f"""UPDATE {TABLE} SET boot_id = :boot, expires_boot = :now + :bound,
                   expires_at = :wall + :bound
WHERE {UNREADABLE_EXPIRY}"""
# A live lease of the key whose expiry lies further ahead than any lease the store granted
# could have (someone else wrote 9999-12-31), and not one kept after its command ended (a
# hold may be longer, and release --force frees that at once): release --force bounds it
# as an unreadable one, so the key frees when a holder's lease could no longer be valid.
_BOUND_FORGED_EXPIRY = f"""UPDATE {TABLE} SET expires_boot = :now + :bound,
                   expires_at = :wall + :bound
WHERE key = :key AND owner_token IS NOT NULL AND boot_id = :boot
  AND expires_boot > :now + :bound AND CASE WHEN json_valid(holder)
      THEN json_extract(holder, '$.done') END IS NOT 1"""
# The store's record of the longest TTL an acquire has asked for: the holder of the row of
# key '' (no lock key is empty), which is never a lease (no owner).
_LONGEST_TTL_FIELD = "CASE WHEN json_valid(holder) THEN json_extract(holder, '$.max_ttl') END"
_LONGEST_TTL = f"SELECT {_LONGEST_TTL_FIELD} FROM {TABLE} WHERE key = '' AND slot = 0"
_RAISE_LONGEST_TTL = f"""INSERT INTO {TABLE} (key, slot, slot_limit, fencing_token, holder)
VALUES ('', 0, 1, 0, json_object('max_ttl', :ttl))
ON CONFLICT (key, slot) DO UPDATE SET holder = excluded.holder
WHERE owner_token IS NULL AND NOT coalesce(
    typeof({_LONGEST_TTL_FIELD}) IN ('integer', 'real') AND {_LONGEST_TTL_FIELD} >= :ttl, 0)"""

# A holder's field, NULL when the holder is not JSON (a malformed row, see rows: json_extract
# would fail the whole statement).
_HOLDER_FIELD = "CASE WHEN json_valid(holder) THEN json_extract(holder, '$.{}') END"
# A lease's mode, kept in its holder (none: an exclusive lease, as an older tasklock
# writes it; see schema).
_SHARED_LEASE = f"{_HOLDER_FIELD.format('mode')} IS 'shared'"
# The holder with a field set, or as it is when it is not JSON.
_HOLDER_SET = "CASE WHEN json_valid(holder) THEN json_set(holder, '$.{}', {}) ELSE holder END"
# The slot an acquire takes: its own again when it is a retry, else the lowest one with
# no live lease (slot 0, or one just above a held slot), below :span (the limit; no bound
# for a shared caller).
_OWN_SLOT = f"SELECT slot FROM {TABLE} WHERE key = :key AND owner_token = :owner AND slot < :span"
_LOWEST_FREE_SLOT = f"""SELECT min(candidate) FROM (
    SELECT 0 AS candidate
    UNION SELECT slot + 1 FROM {TABLE} WHERE key = :key AND {LIVE_ON_KEY})
WHERE candidate < :span AND NOT EXISTS (
    SELECT 1 FROM {TABLE} WHERE key = :key AND slot = candidate AND {LIVE_ON_KEY})"""
# A live lease of the other mode: a shared caller waits for every exclusive holder to go,
# an exclusive one for every shared holder (whatever slots they hold).
_OTHER_MODE = f"""SELECT 1 FROM {TABLE}
WHERE key = :key AND {LIVE_ON_KEY} AND ({_SHARED_LEASE}) <> (:mode = 'shared')"""
# Rows are only ever freed, never deleted: the highest token of a key's rows counts on.
# A token that is not an integer from 0 up (a real 9.3e18, text, -5: someone else wrote
# it) leaves the counter unknown: NULL. So does the greatest token, which has no next one.
# The NOT NULL column refuses NULL (CounterUnreadable, FencingExhausted), where SQLite would
# go on in floating point, or from 1 again.
_HIGHEST_TOKEN = f"""SELECT CASE WHEN max(typeof(fencing_token) <> 'integer'
                                     OR fencing_token < 0) THEN NULL
                            ELSE coalesce(max(fencing_token), 0) END AS t
FROM {TABLE} WHERE key = :key"""
# Tokens are reserved in blocks, so that most acquires need no sync (docs/design/sqlite.md,
# "Fencing tokens in blocks"): a key's row of slot -1, never a lease (no owner), holds the
# ceiling of its block (the highest token it may issue) and, once the block is on disk,
# the boot it was synced in. Within this boot's block the next token is the highest a
# lease row holds + 1, unsynced; else the highest of all the key's rows + 1 (past any
# boot's ceiling: a power cut may lose the rows' tokens, never a synced ceiling), with a
# new block.
RESERVED_SLOT = -1
#: Tokens per block: what a key's tokens may jump by after a reboot.
TOKEN_BLOCK = 1024
_TOKENS = f"""SELECT ({_HIGHEST_TOKEN}) AS highest,
    coalesce(max(CASE WHEN slot <> {RESERVED_SLOT} THEN fencing_token END), 0) AS issued,
    max(CASE WHEN slot = {RESERVED_SLOT} AND boot_id IS :boot THEN fencing_token END) AS ceiling
FROM {TABLE} WHERE key = :key"""
_NEXT_TOKEN = f"""SELECT CASE WHEN highest IS NULL THEN NULL
                   WHEN issued < ceiling THEN issued + 1
                   WHEN highest < {MAX_FENCING_TOKEN} THEN highest + 1 END
FROM ({_TOKENS})"""
# The key's block, after a token was taken: its ceiling, and whether it is this boot's
# (synced). None: no block yet.
_BLOCK = f"""SELECT fencing_token, boot_id IS :boot FROM {TABLE}
WHERE key = :key AND slot = {RESERVED_SLOT}"""
# A new block from a token drawn past the ceiling, with no boot until it is synced
# (_CONFIRM_BLOCK): until then no acquire draws from it (one that finds it so reserves
# another). :block is 0 where the boot is unknown: every token is then a block of its own,
# synced. Returns the new ceiling.
_RESERVE = f"""INSERT INTO {TABLE} (key, slot, slot_limit, fencing_token, boot_id)
VALUES (:key, {RESERVED_SLOT}, 1, CASE WHEN :token > {MAX_FENCING_TOKEN} - :block
    THEN {MAX_FENCING_TOKEN} ELSE :token + :block END, NULL)
ON CONFLICT (key, slot) DO UPDATE SET
    fencing_token = excluded.fencing_token, boot_id = excluded.boot_id
RETURNING fencing_token"""
# The block, synced, is this boot's (unless another acquire reserved past it meanwhile).
_CONFIRM_BLOCK = f"""UPDATE {TABLE} SET boot_id = :boot
WHERE key = :key AND slot = {RESERVED_SLOT} AND boot_id IS NULL AND fencing_token = :ceiling"""
# A live lease of the key with another limit than asked (LimitMismatch).
_OTHER_LIMIT = f"""SELECT slot_limit FROM {TABLE}
WHERE key = :key AND slot_limit <> :limit AND {LIVE_ON_KEY} LIMIT 1"""
# The queue of waiters (first come, first served; see queue.py): the acquire clears the
# key's dead places first, so the places ahead of ours are live.
_LIVE_COUNT = f"SELECT count(*) FROM {TABLE} WHERE key = :key AND {LIVE_ON_KEY}"
# Our slot again (a retry); or, shared, no exclusive waiter ahead of us; or fewer waiters
# ahead of us than free slots.
_OUR_TURN = f"""(({_OWN_SLOT}) IS NOT NULL OR CASE WHEN :mode = 'shared'
    THEN NOT {queue.EXCLUSIVE_AHEAD}
    ELSE ({queue.AHEAD_COUNT}) < :limit - ({_LIVE_COUNT}) END)"""
_ACQUIRE = f"""
WITH chosen (slot) AS MATERIALIZED (SELECT coalesce(({_OWN_SLOT}), ({_LOWEST_FREE_SLOT})))
INSERT INTO {TABLE} (key, slot, slot_limit, fencing_token, owner_token, boot_id,
                     expires_boot, acquired_at, expires_at, holder)
SELECT :key, slot, :limit, ({_NEXT_TOKEN}), :owner, :boot, :now + :ttl,
       :wall, :wall + :ttl, :holder
FROM chosen WHERE slot IS NOT NULL AND NOT EXISTS ({_OTHER_LIMIT})
  AND NOT EXISTS ({_OTHER_MODE}) AND {_OUR_TURN}
ON CONFLICT (key, slot) DO UPDATE SET
    fencing_token = CASE WHEN owner_token IS :owner THEN fencing_token
                         ELSE excluded.fencing_token END,
    acquired_at   = CASE WHEN owner_token IS :owner THEN acquired_at
                         ELSE excluded.acquired_at END,
    slot_limit = excluded.slot_limit, owner_token = excluded.owner_token,
    boot_id = excluded.boot_id, expires_boot = excluded.expires_boot,
    expires_at = excluded.expires_at, holder = excluded.holder
WHERE owner_token IS NULL OR owner_token IS :owner OR NOT ({LIVE})
RETURNING slot, fencing_token, acquired_at, expires_at
"""
# One lease: its key, slot and owner token.
_OWN_LEASE = "key = :key AND slot = :slot AND owner_token = :owner"
_RENEW = f"""
UPDATE {TABLE} SET expires_boot = :now + :ttl, expires_at = :wall + :ttl
WHERE {_OWN_LEASE} AND {LIVE_ON_KEY}
RETURNING expires_at
"""
# Freeing a row clears the lease and keeps the key's fencing counter.
_FREE = f"""UPDATE {TABLE} SET owner_token = NULL, boot_id = NULL, expires_boot = NULL,
                   expires_at = NULL, holder = NULL"""
# The owner's release frees its lease, broken or not.
_RELEASE = f"{_FREE} WHERE key = :key AND slot = :slot AND owner_token IN (:owner, :broken)"
# The leases matching :token (every slot's when NULL), live or not.
_MATCHING = "key = :key AND owner_token IS NOT NULL AND (:token IS NULL OR fencing_token = :token)"
_FORCE_RELEASE = f"{_FREE} WHERE {_MATCHING}"
# (``done``: its command has ended; nothing runs under the lease any more)
_RELEASE_LATER = f"""
UPDATE {TABLE} SET expires_boot = :now + :keep, expires_at = :wall + :keep,
                   holder = {_HOLDER_SET.format("done", "json('true')")}
WHERE {_OWN_LEASE} AND {LIVE_ON_KEY}
"""
# The columns of a lease as observers see it. A lease whose expiry cannot be read shows
# what it has instead: not a time, so malformed. (Not in a RETURNING clause: SQLite 3.40
# compares a REAL column holding an integral value wrongly there; the break bounds such
# expiries first, so its rows need no such check.)
_RETURNED_COLUMNS = "key, slot, slot_limit, fencing_token, acquired_at, expires_at, holder"
_ALREADY_BROKEN = "substr(owner_token, 1, length(:prefix)) = :prefix"
# (the first break's breaker stays: SET sees the row as it was)
_BREAK = f"""
UPDATE {TABLE} SET
    owner_token = CASE WHEN {_ALREADY_BROKEN} THEN owner_token ELSE :prefix || owner_token END,
    holder = CASE WHEN {_ALREADY_BROKEN} THEN holder
                  ELSE {_HOLDER_SET.format("broken_by", "json(:by)")} END
WHERE {_MATCHING} AND {LIVE_ON_KEY}
RETURNING {_RETURNED_COLUMNS}, 1
"""
_BROKEN_BY = f"""SELECT {_HOLDER_FIELD.format("broken_by")} FROM {TABLE}
WHERE key = :key AND slot = :slot AND fencing_token = :token AND owner_token = :broken"""
# The holder's processes, recorded with its lease (see processes.py).
_NOTE_PROCESSES = f"""UPDATE {TABLE}
SET holder = {_HOLDER_SET.format("processes", "json(:processes)")}
WHERE key = :key AND slot = :slot AND fencing_token = :token AND owner_token IN (:owner, :broken)"""
_PROCESSES = f"""SELECT {_HOLDER_FIELD.format("processes")}, {_HOLDER_FIELD.format("done")}
FROM {TABLE} WHERE key = :key AND fencing_token = :token AND {LIVE_ON_KEY}"""
# Our lease is still ours, unbroken (expired or not: the renewal tells that).
_INTACT = f"""SELECT 1 FROM {TABLE}
WHERE key = :key AND owner_token = :owner AND fencing_token = :token"""
# A key's live leases, their limit, the seconds (this boot's clock) until the first runs
# out, until the first exclusive one does (NULL: none), and how many are shared.
_FULLNESS = f"""SELECT count(*), max(slot_limit), min(expires_boot) - :now,
       min(CASE WHEN NOT ({_SHARED_LEASE}) THEN expires_boot END) - :now,
       coalesce(sum({_SHARED_LEASE}), 0)
FROM {TABLE} WHERE key = :key AND {LIVE_ON_KEY}"""
# Seconds left of the live, unbroken lease with a fencing token.
_TIME_LEFT = f"""SELECT expires_boot - :now FROM {TABLE}
WHERE key = :key AND fencing_token = :token AND {LIVE_ON_KEY}
  AND substr(owner_token, 1, length(:prefix)) <> :prefix"""
# A run already in the ledger (a retried release) is kept as first written.
_RECORD_RUN = f"""INSERT INTO {RUNS_TABLE} (key, fencing_token, started_at, ended_at, data)
VALUES (:key, :token, :started, :wall, :data) ON CONFLICT DO NOTHING"""
_TRIM_RUNS = f"""DELETE FROM {RUNS_TABLE} WHERE key = :key AND fencing_token < (
    SELECT fencing_token FROM {RUNS_TABLE} WHERE key = :key
     ORDER BY fencing_token DESC LIMIT 1 OFFSET {LEDGER_KEEP - 1})
  AND fencing_token IS NOT (SELECT fencing_token {NEWEST_SUCCESS})"""

#: What a hand-off runs that nothing before it has: the release's statements, and those of
#: an acquire that takes the key after a wait. Compiled ahead (``SQLiteConnection.prepare``)
#: by a run that waits, and by a holder as it first waits for a break (~0.2 ms together).
_HAND_OFF_STATEMENTS = (
    _RELEASE,
    queue.WAKE_SET,
    _RECORD_RUN,
    _TRIM_RUNS,
    _RAISE_LONGEST_TTL,
    _BLOCK,
    _RESERVE,
    queue.LEAVE,
)


def boot_clock() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


#: The boot where the kernel does not say: a reboot cannot be told from it, so every token
#: issued then is synced (a block of one, ``_RESERVE``).
UNKNOWN_BOOT = "unknown-boot"


def current_boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot_id:
            return boot_id.read().strip()
    except OSError:
        return UNKNOWN_BOOT


#: The query parameters a sqlite:/// URL may carry: ``mode=0660``, a group-shared store.
URL_PARAMETERS: tuple[str, ...] = ("mode",)


def _checked_parameters(url: str) -> dict[str, str]:
    """The URL's query parameters; ConfigError for a '#' or a parameter it does not take."""
    if "#" in url:
        raise ConfigError(
            f"sqlite URL {url!r}: a '#' ends the path there (write %23 for a '#' in a file name)"
        )
    parameters = url_parameters(url)
    for name in parameters:
        if name not in URL_PARAMETERS:
            known = ", ".join(URL_PARAMETERS) or "a sqlite:/// URL takes none"
            raise unknown_parameter("sqlite", url, name, known)
    return parameters


class SQLiteStore(SQLiteReads, Store, capabilities=CAPABILITIES):
    def __init__(
        self,
        path: str | Path,
        clock=boot_clock,
        wall_clock=time.time,
        create_parent: bool = False,
        file_mode: int = PRIVATE_MODE,
    ) -> None:
        self.path = paths.normal(path)
        self.file_mode = file_mode
        shared = "" if file_mode == PRIVATE_MODE else f"?mode={file_mode:04o}"
        self.display_url = sqlite_url(path) + shared
        self._clock = clock
        self._wall = wall_clock
        self._boot = current_boot_id()
        owners = Owners(file_mode)  # whose directories beside the file to use (learnt at open)
        self._db = SQLiteConnection(self.path, create_parent, file_mode, owners)
        beside = paths.with_name_suffix
        self._wakeups = LocalWakeups(beside(self.path, ".waiters"), file_mode, owners)
        self._alarms = BreakAlarms(beside(self.path, ".holders"), file_mode, owners)

    @classmethod
    def from_url(cls, url: str) -> SQLiteStore:
        netloc, raw_path = sqlite_netloc_and_path(url)
        if netloc:  # sqlite://x.db: a file that moves with the current directory
            raise UsageError(
                f"sqlite URL {url!r} is not an absolute path (sqlite://x.db would depend "
                "on the current directory, so cron and a shell would use different "
                "stores); use sqlite:///ABS/PATH.db (three slashes)"
            )
        parameters = _checked_parameters(url)
        names_a_file = raw_path and "\0" not in raw_path and not raw_path.endswith("/")
        path = paths.normal(raw_path) if names_a_file else ""
        if not paths.name(path):
            raise ConfigError(f"sqlite URL {url!r} names no file (use sqlite:///ABS/PATH.db)")
        # Only the default store's directory is made; an explicit path names a place the
        # user chose, and a missing directory there is more likely a typo.
        return cls(
            path,
            create_parent=path == default_sqlite_file(),
            file_mode=file_mode_parameter(parameters.get("mode")),
        )

    def _times(self) -> dict:
        return {"boot": self._boot, "now": self._clock(), "wall": self._wall()}

    # -- the interface --------------------------------------------------------------

    def _acquire(
        self, key: str, ttl: float, holder: Holder, owner: str, limit: int, queue: bool, ask: Ask
    ) -> Lease | Queued | None:
        recorded = json.dumps(
            {**place_record(holder, ask), "mode": ask.mode, **_own_processes(self._boot, holder)}
        )
        params = {
            **self._times(),
            "key": key,
            "ttl": ttl,
            "owner": owner,
            "holder": recorded,
            "limit": limit,
            **_ask_params(ask, limit),
            "waiter_ttl": self.waiter_ttl,
            "fifo": self._wakeups.name if self._wakeups.key == key else None,
            "block": TOKEN_BLOCK if self._boot != UNKNOWN_BOOT else 0,
        }
        with self._db.write(durable=True) as conn:  # the queue and the taking
            taking = _Taking.run(conn, params, queue)
        if taking.unsynced:  # on disk before the token is used
            self._db.sync()
            if taking.new_block is not None and params["block"]:
                self._confirm_block(key, taking.new_block)
        elif taking.queued:  # (ahead of a later sync, a new block's or a success's: the WAL alone)
            self._db.sync_directory()
        # The superseded waiters hear of it; the run now at the head of the queue, which a
        # superseded place may have held up, is woken.
        self._wakeups.wake(key, taking.to_tell, fallback=False)
        if taking.left_superseded:
            if self._wakeups.key == key:
                self._wakeups.leave()
            raise Superseded(key)
        taking.raise_refusal(key, limit, ask)
        row = taking.row
        if row is None:
            return QUEUED if taking.queued else None
        self._wakeups.leave(tidy=False)  # its FIFO and directory go at the release, later
        slot, token, acquired_at, expires_at = row
        return Lease(
            key,
            owner,
            token,
            utc_from_timestamp(acquired_at),
            utc_from_timestamp(expires_at),
            slot=slot,
            limit=limit,
            mode=ask.mode,
        )

    def _confirm_block(self, key: str, ceiling: int) -> None:
        """Mark the block of tokens up to ``ceiling``, synced, as this boot's: the next
        acquires draw from it unsynced. Should this fail, they reserve another."""
        params = {"key": key, "ceiling": ceiling, "boot": self._boot}
        with suppressed(TasklockError), self._db.write() as conn:
            conn.execute(_CONFIRM_BLOCK, params)

    def renew(self, lease: Lease, ttl: float) -> Lease:
        params = {**self._times(), **_lease_params(lease), "ttl": ttl}
        with self._db.write() as conn:
            row = conn.execute(_RENEW, params).fetchone()
        return lease.renewed_until(None if row is None else utc_from_timestamp(row[0]))

    def release(self, lease: Lease, keep_for: float = 0.0, record: RunRecord | None = None) -> bool:
        params = {**self._times(), **_lease_params(lease), "keep": keep_for}
        params["broken"] = BROKEN_OWNER_PREFIX + lease.owner_token
        freed, head = False, []
        durable = _a_success(record)  # synced after the wake-up (SQLiteConnection.sync)
        with self._db.write(durable=durable) as conn:
            kept = keep_for > 0 and conn.execute(_RELEASE_LATER, params).rowcount == 1
            if not kept:  # (a broken lease is freed, keep_for or not)
                freed = conn.execute(_RELEASE, params).rowcount == 1
                head = _head_run(conn, params) if freed else []
            if record is not None:
                _record_run(conn, record, params["wall"])
        if freed:
            self._wakeups.wake(lease.key, head)
        if durable:
            self._db.sync()
        # Then the tidying, which the next run need not wait for: its removals are
        # journalled writes (milliseconds each on a busy disk). The lease's break FIFO goes
        # once no wait on it is under way: the heartbeat may still wait (``concurrent_release``).
        self._wakeups.tidy(lease.key)
        self._alarms.release(lease.key, lease.fencing_token)
        return kept or freed

    def time_left(self, key: str, fencing_token: int) -> float | None:
        params = {**self._times(), "key": key, "token": fencing_token}
        rows = self._db.read(*by_key(_TIME_LEFT, {**params, "prefix": BROKEN_OWNER_PREFIX}))
        return max(0.0, float(rows[0][0])) if rows else None

    def sweep(self, dry_run: bool = False) -> int:
        if dry_run:
            sql = f"SELECT count(*) FROM {TABLE} WHERE {_EXPIRED}"
            return int(self._db.read(sql, self._times())[0][0])
        # One range at a time: LIMIT then stops a batch early (the OR of the three would
        # collect every expired row first).
        with self._db.write() as conn:  # dead places in queues (not counted: no leases)
            conn.execute(queue.SWEEP, self._times())
            _bound_unreadable_expiries(conn, self._times())
        removed = 0
        for expired in _EXPIRED_RANGES:
            victims = f"SELECT key, slot FROM {TABLE} WHERE {expired} LIMIT {SWEEP_BATCH}"
            clear = f"{_FREE} WHERE (key, slot) IN ({victims})"
            while True:
                started = time.monotonic()
                with self._db.write() as conn:
                    count = conn.execute(clear, self._times()).rowcount
                removed += count
                if count < SWEEP_BATCH:
                    break
                # Small batches, and a pause twice as long as each, so acquirers retrying a
                # busy database (see connection.when_not_busy) get the write lock
                # between batches.
                time.sleep(max(SWEEP_PAUSE_MIN_S, 2 * (time.monotonic() - started)))
        return removed

    def break_lease(
        self, key: str, token: int | None = None, by: Holder | None = None
    ) -> builtins.list[LeaseInfo]:
        params = {
            **self._times(),
            "key": key,
            "token": token,
            "prefix": BROKEN_OWNER_PREFIX,
            "by": json.dumps(breaker(by)),
        }
        with self._db.write() as conn:
            bound = _bound_unreadable_expiries(conn, params)
            conn.execute(*by_key(_BOUND_FORGED_EXPIRY, {**params, "bound": bound}))
            rows = conn.execute(*by_key(_BREAK, params)).fetchall()
        broken = sorted((lease_info_of(row) for row in rows), key=lambda info: info.slot)
        for info in broken:
            self._alarms.alarm(key, info.fencing_token)
        return broken

    def broken_by(self, lease: Lease) -> dict | None:
        params = {
            "key": lease.key,
            "slot": lease.slot,
            "token": lease.fencing_token,
            "broken": BROKEN_OWNER_PREFIX + lease.owner_token,
        }
        rows = self._db.read(_BROKEN_BY, params)
        return breaker_of(rows[0][0]) if rows else None

    def note_processes(self, lease: Lease, guard_pid: int) -> None:
        from tasklock_cli.stores.sqlite.processes import processes_of

        params = {
            **_lease_params(lease),
            "token": lease.fencing_token,
            "broken": BROKEN_OWNER_PREFIX + lease.owner_token,
            "processes": json.dumps(processes_of(self._boot, [os.getpid(), guard_pid])),
        }
        with self._db.write() as conn:
            conn.execute(_NOTE_PROCESSES, params)

    def free_if_holder_gone(self, key: str, token: int) -> bool:
        rows = self._db.read(*by_key(_PROCESSES, {**self._times(), "key": key, "token": token}))
        if not rows:
            return False
        processes, done = rows[0]
        # Kept after its command ended (--hold-at-least), or its processes are gone.
        gone = bool(done) or (processes is not None and _all_gone(processes, self._boot))
        return gone and bool(self.force_release(key, token))

    def force_release(self, key: str, token: int | None = None) -> builtins.list[LeaseInfo]:
        params = {**self._times(), "key": key, "token": token}
        with self._db.write() as conn:
            matching = f"{SELECT_LEASES} WHERE {_MATCHING} ORDER BY slot"
            rows = conn.execute(*by_key(matching, params)).fetchall()
            if rows:
                conn.execute(*by_key(_FORCE_RELEASE, params))
            head = _head_run(conn, params) if rows else []
        freed = [lease_info_of(row) for row in rows]
        if freed:
            self._wakeups.wake(key, head)
        for info in freed:
            self._alarms.alarm(key, info.fencing_token)
        return freed

    def wait_for_break(self, lease: Lease, timeout: float, wake_fd: int | None = None) -> bool:
        """Wait on the lease's FIFO in ``<file>.holders/``, which a break writes to. Made
        at the first wait, then looked at once: a break before the FIFO existed told nobody;
        kept until the lease is released and this wait is over (a release may come while
        it goes on: ``concurrent_release``), or the store is closed."""
        fd, new = self._alarms.listen(lease.key, lease.fencing_token)
        if fd is None:  # no FIFOs here: learnt of at the next renewal
            wait_readable([wake_fd], timeout)
            return False
        try:
            if new:
                if not self._intact(lease):  # broken, or released already: this wait its last
                    self._alarms.release(lease.key, lease.fencing_token)
                    return True
                self._db.prepare(_HAND_OFF_STATEMENTS)  # while the command runs: for the release
            if fd not in wait_readable([fd, wake_fd], timeout):
                return False
            _drain(fd)  # a hint, told once: the renewal that follows asks the store
            return True
        finally:
            self._alarms.done(lease.key, lease.fencing_token)

    def _intact(self, lease: Lease) -> bool:
        params = {"key": lease.key, "owner": lease.owner_token, "token": lease.fencing_token}
        return bool(self._db.read(_INTACT, params))

    # -- waiting (the skeleton is base's): FIFOs, or polling where there are none ------

    def _prepare_wait(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        self._wakeups.register(key)  # (before the look: a release after it is not missed)
        self._db.prepare(_HAND_OFF_STATEMENTS)  # (once)
        return True

    def _time_until_free(self, key: str) -> float | None:
        params = {**self._times(), "key": key, "owner": self._queue_place(key) or ""}
        ((live, limit, remaining, exclusive_remaining, shared),) = self._db.read(_FULLNESS, params)
        ((mode, ahead, exclusive_ahead),) = self._db.read(queue.STATE, params)
        if mode == SHARED:  # (waits for exclusive holders only, and exclusive waiters ahead)
            if exclusive_remaining is not None:
                return float(exclusive_remaining)
            return self.waiter_ttl if exclusive_ahead else None
        if live and (live >= limit or shared):
            return float(remaining)
        free = limit - live if live else 1  # (a free key's limit is the next taker's)
        return None if ahead < free else self.waiter_ttl

    def _await_wakeup(self, key: str, until: float, wake_fd: int | None) -> None:
        """A release of the key on this machine wakes the waiters it may admit: the head of
        the queue, and with it the shared run at the head."""
        left = until - time.monotonic()
        if self._wakeups.key != key:  # no FIFOs here: look again soon
            wait_readable([wake_fd], min(left, UNSIGNALLED_POLL_S))
        else:
            self._wakeups.wait(left, wake_fd)

    def _leave_queue(self, key: str, owner: str | None) -> None:
        self._wakeups.give_up(key, self._leave_place(key, owner))

    def _leave_place(self, key: str, owner: str | None) -> builtins.list[str]:
        """Leave our place in ``key``'s queue; the FIFOs of the run now first in it."""
        if owner is None:
            return []
        params = {**self._times(), "key": key, "owner": owner}
        with suppressed(TasklockError), self._db.write() as conn:
            conn.execute(queue.LEAVE, params)
            return _head_run(conn, params)
        return []

    def init_schema(self) -> str | None:
        self._db.open()
        return None

    def schema_sql(self) -> str:
        return SCHEMA.strip() + f"\nPRAGMA user_version = {SCHEMA_VERSION};\n"

    def close_before_exit(self) -> None:
        """``close`` without the checkpoint of SQLite's last close (``SQLiteConnection.close``)."""
        self._leave_queues()
        self._close(checkpoint=False)

    def _close(self, checkpoint: bool = True) -> None:
        # Still listening at close (the base has left our places in queues): the wait was
        # cut short (a signal), maybe just after a wake-up was read. Waking the next waiter
        # costs it one look at most.
        if self._wakeups.key is not None:
            self._wakeups.give_up(self._wakeups.key)
        self._wakeups.tidy_left()  # (an acquire's, not released)
        self._alarms.forget_all()
        self._db.close(checkpoint)


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


def _all_gone(processes: str, boot: str) -> bool:
    """Whether the processes a holder recorded are all gone; False when the record cannot
    be read (a malformed row: it is not known to be gone)."""
    from tasklock_cli.stores.sqlite.processes import all_gone

    try:
        return all_gone(json.loads(processes), boot)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError):
        return False


def _bound_unreadable_expiries(conn: sqlite3.Connection, params: dict) -> float:
    """Give every lease whose expiry cannot be read (of ``params["key"]``'s, when given)
    the longest expiry a holder's lease can have from now (model.unreadable_expiry_bound),
    which it returns."""
    row = conn.execute(_LONGEST_TTL).fetchone()
    bound = unreadable_expiry_bound(row_parsing.as_number(row[0]) if row else None)
    where = " AND key = :key" if "key" in params else ""
    conn.execute(*by_key(_BOUND_EXPIRY + where, {**params, "bound": bound}))
    return bound


def _drain(fd: int) -> None:
    with suppressed(OSError):
        while os.read(fd, 512):
            pass


def _lease_params(lease: Lease) -> dict:
    return {"key": lease.key, "slot": lease.slot, "owner": lease.owner_token}


def _head_run(conn: sqlite3.Connection, params: dict) -> list[str]:
    """The FIFOs of the waiters a release may admit (see ``queue.WAKE_SET``)."""
    return [row[0] for row in conn.execute(*by_key(queue.WAKE_SET, params)) if row[0]]


def _a_success(record: RunRecord | None) -> bool:
    """Whether the release records a success, which is on disk before tasklock exits (its
    commit is durable): a power cut must not let ``--once-per`` run the job again."""
    return record is not None and record.outcome == "succeeded"


class _Taking:
    """What an acquire's transaction did.

    It did one of these:

    - took the lease row;
    - found another limit in the way;
    - joined or kept a place;
    - did not join a queue as long as ``--max-waiting`` (``QueueFull``);
    - left its superseded place (``Superseded``).

    It also names the FIFOs to tell when it superseded older places: theirs, and the head
    run's."""

    row: tuple | None = None
    new_block: int | None = None  # the ceiling of a new block of tokens reserved
    unsynced = False  # its token lies in no block synced in this boot (see _take_token)
    other_limit: int | None = None
    queued = False
    left_superseded = False
    queue_full = False
    to_tell: tuple[str, ...] = ()

    def raise_refusal(self, key: str, limit: int, ask: Ask) -> None:
        """LimitMismatch (another limit in the way), QueueFull (not joined)."""
        if self.other_limit is not None:
            raise LimitMismatch(key, self.other_limit, limit)
        if self.queue_full:
            raise QueueFull(key, ask.max_waiting or 0)

    def _take_token(self, conn: sqlite3.Connection, params: dict) -> None:
        """The lease's token against the key's block: past its ceiling (a token drawn anew
        past every row), a new block, to be synced; within this boot's block, nothing to
        sync; otherwise (a token kept by a retry of the same owner, from a block not yet
        synced or of another boot) a sync, and the block stays as it is: its ceiling still
        bounds what was issued from it."""
        block = conn.execute(_BLOCK, params).fetchone()
        if block is None or block[0] < params["token"]:
            self.new_block = conn.execute(_RESERVE, params).fetchone()[0]
            self.unsynced = True
        else:
            self.unsynced = not block[1]

    @classmethod
    def run(cls, conn: sqlite3.Connection, params: dict, queue_up: bool) -> _Taking:
        taking = cls()
        conn.execute(queue.CLEAR_DEAD, params)
        if conn.execute(queue.TAKE_SUPERSEDED, params).fetchone() is not None:
            taking.left_superseded = True
            return taking
        try:
            taking.row = conn.execute(_ACQUIRE, params).fetchone()
        except sqlite3.IntegrityError:  # no next token (see _NEXT_TOKEN)
            if conn.execute(_HIGHEST_TOKEN, params).fetchone()[0] is None:
                raise CounterUnreadable(params["key"]) from None
            if conn.execute(_NEXT_TOKEN, params).fetchone()[0] is None:
                raise FencingExhausted(params["key"]) from None
            raise
        if taking.row is None:
            other = conn.execute(_OTHER_LIMIT, params).fetchone()
            taking.other_limit = None if other is None else int(other[0])
        if taking.row is not None:
            conn.execute(_RAISE_LONGEST_TTL, params)
            taking._take_token(conn, {**params, "token": taking.row[1]})
        if taking.row is not None or taking.other_limit is not None or not queue_up:
            conn.execute(queue.LEAVE, params)
            return taking
        if (
            params["max_waiting"] is not None
            and conn.execute(queue.QUEUE_FULL, params).fetchone()[0]
        ):
            taking.queue_full = True
            return taking
        if params["supersede"]:
            head = _head_run(conn, params)
            fifos = [row[0] for row in conn.execute(queue.SUPERSEDE, params) if row[0]]
            if fifos:  # (and the waiters at the head now that were not before)
                now_first = [name for name in _head_run(conn, params) if name not in head]
                taking.to_tell = (*fifos, *now_first)
        conn.execute(queue.JOIN, params)
        taking.queued = True
        return taking


def _ask_params(ask: Ask, limit: int) -> dict:
    """The acquire statements' parameters of an ``ask``."""
    return {
        "mode": ask.mode,
        "span": _UNBOUNDED if ask.mode == SHARED else limit,
        "supersede": ask.supersede,
        "front": ask.front,
        "priority": ask.priority,
        "max_waiting": ask.max_waiting,
    }


#: This process (and its command's guard) as ``_own_processes`` records them, per (boot,
#: pid, guard): the same for every acquire of the process (a waiter's retries included),
#: read from /proc once.
_OWN_PROCESSES: dict[tuple[str, int, int | None], dict] = {}


def _own_processes(boot: str, holder: Holder) -> dict:
    """A holder that is this process records itself with its acquire, and the guard of
    its command when it has one already (``Holder.guard_pid``: a run forks it before the
    acquire), so that it is seen as gone from the first instant; a holder named for another
    process records nothing."""
    if holder.pid != os.getpid():
        return {}
    which = (boot, holder.pid, holder.guard_pid)
    recorded = _OWN_PROCESSES.get(which)
    if recorded is None:
        from tasklock_cli.stores.sqlite.processes import processes_of

        pids = [holder.pid] if holder.guard_pid is None else [holder.pid, holder.guard_pid]
        recorded = {"processes": processes_of(boot, pids)}
        _OWN_PROCESSES[which] = recorded
    return recorded
