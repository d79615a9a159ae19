"""What stores and the engine pass around: leases, holders, waiters, run records, the
checks of ``doctor``, and the constants every store keeps to."""

from __future__ import annotations

# --priority's bounds are the setting's (config sits below the stores); the bands use them.
from tasklock_cli.config.settings import MAX_PRIORITY
from tasklock_cli.config.settings import MIN_PRIORITY  # noqa: F401 - the stores import it here
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field
from tasklock_cli.util.records import replace
from tasklock_cli.util.times import rfc3339

TYPE_CHECKING = False
if TYPE_CHECKING:
    from datetime import datetime

#: The greatest fencing token (a signed 64-bit integer: SQL's bigint): an acquire that would
#: issue a greater one fails (``FencingExhausted``), and a token above it read from a
#: store is malformed.
MAX_FENCING_TOKEN = 2**63 - 1
#: No tasklock ever puts a waiter's place further ahead than this.
#: Its waiter_ttl is a few seconds.
#: A place that expires later than this from now was not written by a waiter.
#: It was forged, or a clock went wrong.
#: Such a place is dead: the queue ignores it.
#: The next acquire of its key removes it, and so does ``sweep``.
#: So it cannot hold a free key up.
WAITER_HORIZON_S = 60.0
#: A lease whose expiry cannot be read was not written so by any holder.
#: Its expiry is none, or not a time, or it has no TTL on a store whose TTLs decide.
#: A tasklock's every acquire and renewal writes one.
#: Its holder, if it has one, renewed last before now, with at most the longest TTL the
#: store has granted.
#: So its lease is valid until at most now + that.
#: ``sweep`` and ``release --force`` give such a lease the expiry now +
#: ``unreadable_expiry_bound``.
#: It runs out then, as any lease does.
#: A live holder's next renewal rewrites it.
#: The floor covers a store that records no longest TTL yet (an older tasklock's default
#: --ttl).
#: The margin covers a holder's send time and the clocks of two servers.
UNREADABLE_EXPIRY_FLOOR_S = 30.0
UNREADABLE_EXPIRY_MARGIN_S = 2.0
#: Rows per read of a listing (see ``Store.list``).
LIST_PAGE = 1000
#: A waiter wakes this long after the lease it waits on runs out, so it finds it expired.
EXPIRY_SLACK_S = 0.002
#: A waiter's place in a key's queue lives this long unless its waiter renews it (every
#: attempt does): a crashed waiter's place runs out by itself and the queue moves on.
WAITER_TTL_S = 3.0

#: A broken lease keeps its place on the store with its owner token prefixed by this: its
#: owner's renew no longer matches (LeaseLost) and nobody else may take it while it is live,
#: but its owner's release still matches. No schema change: an older tasklock sharing the
#: store sees a broken lease as someone else's, so its renewals fail and it lets go.
#: (Owner tokens are hex: the prefix cannot occur in one.)
BROKEN_OWNER_PREFIX = "broken:"

#: Lock modes (``run --shared``): an exclusive holder holds its key alone; any number of
#: shared holders hold it together.
EXCLUSIVE = "exclusive"
SHARED = "shared"
MODES = (EXCLUSIVE, SHARED)

#: How the SQL stores fold a priority into a place's order number (``seq`` or ``ord``):
#: ``arrival - priority * PRIORITY_BAND``, and for a ``front`` place ``-arrival -
#: FRONT_BAND``. Arrival numbers stay below 2**40, so the bands never overlap: an order
#: number sorts by (front first, priority high to low, arrival). A priority-0 place's
#: number is its arrival, as an older tasklock writes it, so older tasklocks sharing the
#: store read the same order.
PRIORITY_BAND = 2**40
FRONT_BAND = (MAX_PRIORITY + 1) * PRIORITY_BAND


@dataclass(frozen=True)
class Ask:
    """How an acquire asks, beyond key and lease (see ``Store.acquire``)."""

    mode: str = EXCLUSIVE
    supersede: bool = False
    front: bool = False
    #: ``run --priority``: the queue is served highest priority first, then by arrival;
    #: ``front`` places before all. Every "ahead of" of ``Store.acquire`` reads this
    #: order, so the writer rule holds in it.
    priority: int = 0
    #: ``run --max-waiting``: a caller without a place does not join a queue of this many
    #: live waiters or more (``QueueFull``; a caller with a place keeps it); None: no cap.
    max_waiting: int | None = None


@dataclass(frozen=True)
class Holder:
    """Who holds a lease; shown by ``peek`` and ``list``."""

    host: str
    pid: int
    user: str
    command: list[str] = field(default_factory=list)
    note: str | None = None
    #: The guard of the holder's command (``proc.guard``), forked before the acquire: a
    #: store that can tell when a holder on its machine is gone records it with the lease
    #: in the acquire itself (SQLite). Not shown, not read back from a store.
    guard_pid: int | None = None

    def to_dict(self) -> dict:
        return {
            "host": self.host,
            "pid": self.pid,
            "user": self.user,
            "command": list(self.command),
            "note": self.note,
        }


@dataclass(frozen=True)
class Lease:
    """A lease as its owner knows it. ``owner_token`` is the secret that scopes renew/release."""

    key: str
    owner_token: str
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime
    #: The semaphore slot held (0..limit-1); a plain lock is slot 0 of limit 1. Shared
    #: holders each have a slot of their own (0, 1, ...) under limit 1.
    slot: int = 0
    limit: int = 1
    mode: str = EXCLUSIVE

    def renewed_until(self, expires_at: datetime | None) -> Lease:
        """This lease, renewed until ``expires_at``; LeaseLost when the store renewed
        nothing (None: the lease is no longer ours)."""
        if expires_at is None:
            from tasklock_cli.errors import LeaseLost

            raise LeaseLost(f"the lease on {self.key!r} is no longer ours")
        return replace(self, expires_at=expires_at)


@dataclass(frozen=True)
class LeaseInfo:
    """A lease as an observer sees it (``peek``/``list``); the owner token is never exposed."""

    key: str
    holder: Holder
    fencing_token: int
    acquired_at: datetime
    expires_at: datetime
    expired: bool
    slot: int = 0
    limit: int = 1
    mode: str = EXCLUSIVE
    #: What could not be read of the row: (field, why) pairs; empty for a good row.
    malformed: tuple = ()
    #: Its command has ended and only ``run --hold-at-least`` keeps the key, until
    #: ``expires_at`` (``Store.release`` with ``keep_for``): nothing runs under it.
    kept: bool = False

    @property
    def shared(self) -> bool:
        return self.mode == SHARED

    def to_json(self) -> dict:
        shown = {
            "key": self.key,
            "holder": {**self.holder.to_dict(), "mode": self.mode},
            "mode": self.mode,
            "fencing_token": self.fencing_token,
            "acquired_at": rfc3339(self.acquired_at),
            "expires_at": rfc3339(self.expires_at),
            "expired": self.expired,
            "slot": self.slot,
            "limit": self.limit,
            "kept": self.kept,
            "kept_until": rfc3339(self.expires_at) if self.kept else None,
        }
        shown = with_malformed(shown, self.malformed)
        if shown["expires_at"] is None:  # unreadable: so is how long it is kept
            shown["kept_until"] = None
        return shown


@dataclass(frozen=True)
class WaiterInfo:
    """A run waiting for a key, as ``peek`` shows it (its owner token is never exposed)."""

    holder: Holder
    since: datetime
    mode: str = "exclusive"
    malformed: tuple = ()
    #: ``run --priority`` (an older tasklock's place has none: 0).
    priority: int = 0

    def to_json(self) -> dict:
        shown = {
            "host": self.holder.host,
            "pid": self.holder.pid,
            "user": self.holder.user,
            "since": rfc3339(self.since),
            "note": self.holder.note,
            "mode": self.mode,
            "priority": self.priority,
        }
        return with_malformed(shown, self.malformed, flat_holder=True)


#: The run ledger keeps at least this many runs per key; a write trims older ones.
LEDGER_KEEP = 100
#: ``RunRecord.outcome`` values.
OUTCOMES = ("succeeded", "failed", "signalled", "lost", "done-already")


@dataclass(frozen=True)
class RunRecord:
    """One run that held a lease, as the run ledger keeps it (written with the release).

    ``ended_at`` is None until the store writes the record: it takes the time from its own
    clock where it has one (as it did for ``started_at``, the lease's acquisition)."""

    key: str
    fencing_token: int
    holder: Holder
    started_at: datetime
    exit_code: int | None
    outcome: str
    detected_by: str | None = None
    slot: int = 0
    ended_at: datetime | None = None
    #: Who broke the lease (``release --force``): {"host", "pid", "user"}; None otherwise.
    broken_by: dict | None = None
    mode: str = EXCLUSIVE
    malformed: tuple = ()

    @property
    def shared(self) -> bool:
        return self.mode == SHARED

    def fields(self) -> dict:
        """Everything but key, token and times, as the stores keep it (JSON-able)."""
        return {
            "slot": self.slot,
            "holder": self.holder.to_dict(),
            "exit_code": self.exit_code,
            "outcome": self.outcome,
            "detected_by": self.detected_by,
            "broken_by": self.broken_by,
            "mode": self.mode,
        }

    def to_json(self) -> dict:
        holder = self.holder
        shown = {
            "key": self.key,
            "fencing_token": self.fencing_token,
            "slot": self.slot,
            "host": holder.host,
            "pid": holder.pid,
            "user": holder.user,
            "command": list(holder.command),
            "note": holder.note,
            "started_at": rfc3339(self.started_at),
            "ended_at": rfc3339(self.ended_at) if self.ended_at else None,
            "exit_code": self.exit_code,
            "outcome": self.outcome,
            "detected_by": self.detected_by,
            "broken_by": self.broken_by,
            "mode": self.mode,
        }
        return with_malformed(shown, self.malformed, flat_holder=True)


def place_record(holder: Holder, ask: Ask) -> dict:
    """What a waiter's place keeps of it: the holder, with its priority when not 0 (a plain
    place's record is what an older tasklock writes; ``rows.waiter_info`` reads it)."""
    record = holder.to_dict()
    if ask.priority:
        record["priority"] = ask.priority
    return record


def with_malformed(shown: dict, malformed: tuple, flat_holder: bool = False) -> dict:
    """A record's JSON, and when its row was malformed: its unreadable fields null and
    ``"malformed": true`` with the ``"problems"`` (a good row's JSON is unchanged)."""
    if not malformed:
        return shown
    for name, _why in malformed:
        part, _, sub = name.partition(".")
        if part == "holder":
            names = [sub] if sub else ["host", "pid", "user", "command", "note"]
            holder = shown if flat_holder else shown.get("holder", {})
            for each in names:
                if each in holder:
                    holder[each] = None
        elif part in shown:
            shown[part] = None
    shown["malformed"] = True
    shown["problems"] = [f"{name}: {why}" for name, why in malformed]
    return shown


class Replacer(Holder):
    """A holder that breaks leases to take their key (``run --replace``): the broken
    holder's loss is ``replaced`` rather than ``rejected``. (Holder's fields, no new ones.)"""

    @classmethod
    def of(cls, holder: Holder) -> Replacer:
        return cls(holder.host, holder.pid, holder.user, list(holder.command), holder.note)


def breaker(holder: Holder | None) -> dict | None:
    """Who breaks a lease, as the store keeps it with the lease (``broken_by``): host, pid
    and user, and ``replaced`` when a ``run --replace`` broke it."""
    if holder is None:
        return None
    by: dict = {"host": holder.host, "pid": holder.pid, "user": holder.user}
    if isinstance(holder, Replacer):
        by["replaced"] = True
    return by


def as_integer(value: object) -> int | None:
    """An int, or the decimal digits of one as text or bytes (no float, no bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        value = value.encode("ascii", "replace")
    if isinstance(value, bytes):
        digits = value[1:] if value.startswith(b"-") else value
        if digits.isdigit() and len(digits) <= 20:
            return int(value)
    return None


def breaker_of(data: object) -> dict | None:
    """``broken_by`` as a store returned it (a dict, or JSON text); None when none or
    not one."""
    if isinstance(data, (str, bytes)):
        from tasklock_cli.util import jsontext as json

        try:
            data = json.loads(data)
        except ValueError:
            return None
    if not isinstance(data, dict):
        return None
    by: dict = {
        "host": str(data.get("host", "")),
        "pid": as_integer(data.get("pid")) or 0,
        "user": str(data.get("user", "")),
    }
    if data.get("replaced") is True:
        by["replaced"] = True
    return by


@dataclass(frozen=True)
class StoreCheck:
    """One line of ``doctor`` output."""

    name: str
    ok: bool
    detail: str
    warning: bool = False


def prefix_upper_bound(prefix: str) -> str | None:
    """The least string above every key that starts with ``prefix`` (code point order, which
    is byte order in UTF-8), so a prefix scan can stop early; None where there is none."""
    chars = list(prefix)
    while chars:
        last = ord(chars.pop()) + 1
        if 0xD800 <= last <= 0xDFFF:  # surrogates are not characters: skip to the next one
            last = 0xE000
        if last <= 0x10FFFF:
            return "".join(chars) + chr(last)
    return None


def unreadable_expiry_bound(longest_ttl: float | None) -> float:
    """How long from now a lease whose expiry cannot be read may still be valid, given the
    longest TTL its store has granted (None: not recorded); see UNREADABLE_EXPIRY_FLOOR_S."""
    return max(longest_ttl or 0.0, UNREADABLE_EXPIRY_FLOOR_S) + UNREADABLE_EXPIRY_MARGIN_S
