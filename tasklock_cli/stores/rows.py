"""Reading what a store returned, defensively: the one parser of every store's rows.

Anyone who can write to the store can write anything into a row.
Say, a holder that is not JSON, a pid that is a string, a fencing token that is not an
integer, or a time in the year 1e300.

Such a row is *malformed*:

- It is read as far as it can be.
- Each field that could not be read gets a placeholder (``?``, 0, the epoch).
- Each such field is named in the record's ``malformed``, as pairs of field and why.
- It never stops the rows around it from being read.
- When shown, its unreadable fields are ``?`` in text (``util.display``) and null in JSON.
  The record says ``"malformed": true`` (see ``model``).
- ``metrics`` counts such records.

What a store decides with a malformed row is its own statements' business.
This module only reads.
For example:

- A slot whose row cannot be read stays taken until the row's expiry.
  Or until ``release --force`` or ``sweep`` removes it.
- A row whose expiry cannot be read gets the longest a holder's lease could have,
  ``model.unreadable_expiry_bound``.
"""

from __future__ import annotations

from time import time as _time_now

from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import MAX_FENCING_TOKEN
from tasklock_cli.stores.model import MAX_PRIORITY
from tasklock_cli.stores.model import MIN_PRIORITY
from tasklock_cli.stores.model import MODES
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.model import as_integer
from tasklock_cli.stores.model import breaker_of
from tasklock_cli.util import jsontext as json
from tasklock_cli.util.durations import MAX_DURATION_S
from tasklock_cli.util.keys import is_utf8
from tasklock_cli.util.records import replace
from tasklock_cli.util.times import datetime
from tasklock_cli.util.times import timezone

#: The placeholder of a text field that could not be read.
UNREADABLE = "?"
#: The latest time a row may name: later ones (or none that Python can show) are malformed.
_LATEST = datetime(9999, 12, 31, tzinfo=timezone.utc).timestamp()
_EPOCH = datetime.fromtimestamp(0, tz=timezone.utc)
#: A pid, slot or limit a row may hold (pids are 32-bit, limits at most 1000).
_MAX_SMALL = 2**31 - 1
#: No lease runs out further ahead than this (s): the longest TTL or --hold-at-least a
#: tasklock takes (util.durations.MAX_DURATION_S, 100 years), and a day. A later expiry was
#: written by someone else: malformed (``release --force`` bounds it).
_FURTHEST_EXPIRY_S = MAX_DURATION_S + 86400.0


class NotUtf8(str):
    """Text a store returned that was not valid UTF-8, its bad bytes as lone surrogates
    (``surrogateescape``): read as malformed (see ``lenient_text``). Such a key is one key
    per byte string (``b"n\\xff"`` and ``b"n\\xfe"`` stay apart, and apart from a key
    that is written ``n\\xff``), ``safe`` shows it escaped, and its bytes are
    ``util.keys.key_bytes`` again, so it can be read and released."""


def lenient_text(data: bytes) -> str:
    """Text from a driver's bytes (SQLite's ``text_factory``, a Redis name, a MySQL
    VARBINARY): valid UTF-8 as it is, else a NotUtf8, so one bad row is malformed instead
    of failing the whole statement."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return NotUtf8(data.decode("utf-8", "surrogateescape"))


class RowReader:
    """Reads one row's fields, noting each one it could not read (``problems``)."""

    def __init__(self) -> None:
        self.problems: list[tuple[str, str]] = []

    def note(self, name: str, why: str) -> None:
        self.problems.append((name, why))

    @property
    def malformed(self) -> tuple[tuple[str, str], ...]:
        return tuple(self.problems)

    def integer(self, name: str, value: object, low: int = 0, high: int = _MAX_SMALL) -> int:
        """An integer in [low, high]: an int, or its decimal digits as text or bytes."""
        number = as_integer(value)
        if number is None or not low <= number <= high:
            self.note(name, f"{_shown(value)} is not an integer in [{low}, {high}]")
            return 0
        return number

    def token(self, name: str, value: object) -> int:
        """A fencing token: an integer in [1, 2**63-1] (0 when unreadable: never a token)."""
        return self.integer(name, value, 1, MAX_FENCING_TOKEN)

    def optional_integer(self, name: str, value: object, low: int, high: int) -> int | None:
        return None if value is None else self.integer(name, value, low, high)

    def text(self, name: str, value: object) -> str:
        if isinstance(value, NotUtf8) or (isinstance(value, str) and not is_utf8(value)):
            self.note(name, "is not UTF-8")
            return value
        if isinstance(value, bytes):
            return value.decode("utf-8", "surrogateescape")
        if not isinstance(value, str):
            self.note(name, f"{_shown(value)} is not text")
            return UNREADABLE
        return value

    def optional_text(self, name: str, value: object) -> str | None:
        return None if value is None else self.text(name, value)

    def moment(self, name: str, value: object, per_second: int = 1) -> datetime:
        """A time: a datetime, or seconds (``per_second``: its unit) since the epoch."""
        if isinstance(value, datetime):
            return value.astimezone(timezone.utc)
        seconds = as_number(value)
        if seconds is not None:
            seconds /= per_second
            if -_LATEST <= seconds <= _LATEST:
                return datetime.fromtimestamp(seconds, tz=timezone.utc)
        self.note(name, f"{_shown(value)} is not a time")
        return _EPOCH

    def mode(self, name: str, value: object) -> str:
        """A lock mode; none is exclusive (an older tasklock writes none)."""
        if value is None:
            return EXCLUSIVE
        mode = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
        if mode not in MODES:
            self.note(name, f"{_shown(value)} is not a lock mode")
            return EXCLUSIVE
        return str(mode)

    def json_object(self, name: str, value: object) -> dict:
        """A JSON object, as the driver returned it (decoded or text); {} when it is not."""
        if isinstance(value, NotUtf8):
            self.note(name, "is not UTF-8")
            return {}
        if isinstance(value, (str, bytes, bytearray)):
            try:
                value = json.loads(value)
            except ValueError:
                self.note(name, "is not JSON")
                return {}
        if not isinstance(value, dict):
            self.note(name, f"{_shown(value)} is not a JSON object")
            return {}
        return value

    def holder(self, data: object, name: str = "holder") -> Holder:
        """A holder from its JSON object (decoded or text)."""
        record = self.json_object(name, data) if not isinstance(data, dict) else data
        if not record:
            if not any(problem == name for problem, _ in self.problems):
                self.note(name, "is empty")
            return Holder(UNREADABLE, 0, UNREADABLE)
        command = record.get("command", [])
        if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
            self.note(f"{name}.command", f"{_shown(command)} is not a list of text")
            command = []
        return Holder(
            host=self.text(f"{name}.host", record.get("host", "")),
            pid=self.integer(f"{name}.pid", record.get("pid", 0)),
            user=self.text(f"{name}.user", record.get("user", "")),
            command=list(command),
            note=self.optional_text(f"{name}.note", record.get("note")),
        )


def as_number(value: object) -> float | None:
    """A finite int or float, or one as text or bytes."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (bytes, str)):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, (int, float)):
        number = float(value)
        if number - number == 0:  # finite
            return number
    return None


def _shown(value: object) -> str:
    """A bad value, short, for a problem's description (escaped when printed)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def lease_info(
    key: str,
    slot: object,
    limit: object,
    token: object,
    acquired_at: object,
    expires_at: object,
    holder: object,
    mode: object,
    expired: bool,
    per_second: int = 1,
    kept: bool = False,
) -> LeaseInfo:
    """A lease as an observer sees it, from a row's raw fields; ``holder``: its JSON
    object (``mode`` in it too, where the store keeps it there: then pass None).

    ``kept``: the store marked the lease kept after its command ended, outside the holder
    (Redis, etcd); the SQL stores mark it in the holder's JSON (``"done": true``)."""
    read = RowReader()
    record = read.json_object("holder", holder)
    if mode is None and "mode" in record:
        mode = record["mode"]
    expiry = read.moment("expires_at", expires_at, per_second)
    if expiry.timestamp() > _time_now() + _FURTHEST_EXPIRY_S:
        read.note("expires_at", f"{expiry:%Y-%m-%d} is further ahead than any lease runs")
    return LeaseInfo(
        key=read.text("key", key),
        holder=read.holder(record),
        fencing_token=read.token("fencing_token", token),
        acquired_at=read.moment("acquired_at", acquired_at, per_second),
        expires_at=expiry,
        expired=expired,
        slot=read.integer("slot", slot),
        limit=read.integer("limit", 1 if limit is None else limit, 1, _MAX_SMALL) or 1,
        mode=read.mode("mode", mode),
        malformed=read.malformed,
        kept=kept or record.get("done") is True,
    )


def waiter_info(holder: object, since: object, mode: object, per_second: int = 1) -> WaiterInfo:
    """A waiting run, from its place's raw fields (``mode`` in ``holder`` when None)."""
    read = RowReader()
    record = read.json_object("holder", holder)
    if mode is None:
        mode = record.get("mode")
    priority = record.get("priority", 0)
    return WaiterInfo(
        holder=read.holder(record),
        since=read.moment("since", since, per_second),
        mode=read.mode("mode", mode),
        priority=read.integer("priority", priority, MIN_PRIORITY, MAX_PRIORITY),
        malformed=read.malformed,
    )


def run_record(
    key: str,
    token: object,
    started_at: object,
    ended_at: object,
    data: object,
    per_second: int = 1,
) -> RunRecord:
    """A run of the ledger, from its raw fields (``data``: RunRecord.fields, as JSON)."""
    read = RowReader()
    fields = read.json_object("data", data)
    return RunRecord(
        key=read.text("key", key),
        fencing_token=read.token("fencing_token", token),
        holder=read.holder(fields.get("holder")),
        started_at=read.moment("started_at", started_at, per_second),
        ended_at=None if ended_at is None else read.moment("ended_at", ended_at, per_second),
        exit_code=read.optional_integer("exit_code", fields.get("exit_code"), -255, 255),
        outcome=read.text("outcome", fields.get("outcome", UNREADABLE)),
        detected_by=read.optional_text("detected_by", fields.get("detected_by")),
        slot=read.integer("slot", fields.get("slot", 0)),
        broken_by=breaker_of(fields.get("broken_by")),
        mode=read.mode("mode", fields.get("mode")),
        malformed=read.malformed,
    )


def foreign_lease(key: str, slot: int, found: str) -> LeaseInfo:
    """A lease's name that holds something else (``found``: another application's key of
    another type under the store's prefix): a record that cannot be read, shown and
    counted as malformed, and never in the way of the other keys."""
    info = lease_info(key, slot, 1, None, None, None, None, None, False)
    return replace(info, malformed=(("lease", f"is {found}"), *info.malformed))


def foreign_run(key: str, found: str) -> RunRecord:
    """A ledger's name that holds something else (as ``foreign_lease``): one malformed
    run."""
    record = run_record(key, None, None, None, None)
    return replace(record, malformed=(("runs", f"is {found}"), *record.malformed))


def run_record_json(key: str, value: bytes) -> RunRecord:
    """A run of a ledger that keeps each as one JSON object with its fencing token and
    times (ms) in it (Redis, etcd)."""
    try:
        data = json.loads(value)
    except ValueError:
        data = value  # (reported: not JSON)
    fields = data if isinstance(data, dict) else {}
    token, started = fields.get("fencing_token"), fields.get("started_at")
    return run_record(key, token, started, fields.get("ended_at"), data, per_second=1000)
