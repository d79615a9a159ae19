"""The etcd store's run ledger (``P runs/K NUL <token>``, ``P success/K``: see ``keys``).

A release's txn puts its run's record (and, for a success, the key's newest success) and
trims the oldest records its acquire's txn counted and read.
"""

from __future__ import annotations

import json
import math
import time
from datetime import datetime
from datetime import timezone
from typing import Any

from tasklock_cli.stores import rows as row_parsing
from tasklock_cli.stores.etcd.connection import EtcdClient
from tasklock_cli.stores.etcd.connection import EtcdError
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import prefix_end
from tasklock_cli.stores.etcd.connection import unb64
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import LIST_PAGE
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field
from tasklock_cli.util.times import utc_from_timestamp

#: The oldest ledger records an acquire reads, for its release to trim (more than one,
#: so that a ledger grown past LEDGER_KEEP shrinks back).
TRIM_READ = 4


@dataclass
class LedgerAtAcquire:
    """What an acquire's txn read of its key's ledger, for the release to trim."""

    runs: int = 0  # the key's records in the ledger at the acquisition
    oldest_runs: list[bytes] = field(default_factory=list)  # the first TRIM_READ of them
    member_date: str | None = None  # the Date header of the acquisition's reply


class EtcdLedger:
    def __init__(self, client: EtcdClient, keys: EtcdKeys) -> None:
        self._client = client
        self._keys = keys

    def oldest_runs_op(self, key: str) -> dict[str, Any]:
        """A range op counting ``key``'s ledger records and reading the oldest names."""
        start = self._keys.runs_prefix(key)
        body = {
            "key": b64(start),
            "range_end": b64(prefix_end(start)),
            "keys_only": True,
            "limit": str(TRIM_READ),
            "sort_order": "ASCEND",
            "sort_target": "KEY",
        }
        return {"request_range": body}

    def record_ops(self, record: RunRecord, read: LedgerAtAcquire | None) -> list[dict[str, Any]]:
        """The txn ops that put ``record`` into the ledger (again: the same key) and trim
        the oldest records counted at the acquisition down to LEDGER_KEEP."""
        value = {
            "fencing_token": record.fencing_token,
            "started_at": math.floor(record.started_at.timestamp() * 1000),
            "ended_at": math.floor(time.time() * 1000),
            **record.fields(),
        }
        name = self._keys.run_key(record.key, record.fencing_token)
        ops: list[dict[str, Any]] = [
            {"request_put": {"key": b64(name), "value": b64(json.dumps(value).encode())}}
        ]
        if record.outcome == "succeeded":
            # Successes are released in token order (a run whose lease could have been
            # taken over is lost, not succeeded), so the last one put is the newest.
            member_started = http_date(read.member_date) if read is not None else None
            if member_started is not None:
                value["started_at"] = math.floor(member_started * 1000)
            success = b64(self._keys.success_key(record.key))
            ops.append({"request_put": {"key": success, "value": b64(json.dumps(value).encode())}})
        if read is not None:
            excess = read.runs + 1 - LEDGER_KEEP
            for old in read.oldest_runs[: max(0, excess)]:
                if old != name:
                    ops.append({"request_delete_range": {"key": b64(old)}})
        return ops

    def history(self, key: str, limit: int) -> list[RunRecord]:
        start = self._keys.runs_prefix(key)
        body = {
            "key": b64(start),
            "range_end": b64(prefix_end(start)),
            "limit": str(limit),
            "sort_order": "DESCEND",
            "sort_target": "KEY",
        }
        reply = self._client.call(("/v3/kv/range", body))[0]
        return self._run_records(key, reply.get("kvs", []))

    def _run_records(self, key: str, kvs: list[dict[str, Any]]) -> list[RunRecord]:
        """The runs in ``kvs``, each read defensively (see rows): a record that cannot be read
        is shown as malformed, and the others as they are."""
        records = []
        for kv in kvs:
            records.append(row_parsing.run_record_json(key, unb64(kv.get("value"))))
        return records

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        name = self._keys.success_key(key)
        try:
            [reply], date = self._client.members.call_dated([("/v3/kv/range", {"key": b64(name)})])
        except EtcdError as exc:
            raise self._client.translate(exc) from None
        now = http_date(date)
        if now is None:  # no Date header (a proxy dropped it?): this machine's clock
            now = time.time()
        kvs = reply.get("kvs", [])
        return (self._run_records(key, kvs)[0] if kvs else None), utc_from_timestamp(now)

    def ledger_keys(self, prefix: str) -> list[str]:
        start, strip = self._keys.ledger_start(prefix)
        end = prefix_end(start)
        keys: set[str] = set()
        while True:
            body = {"key": b64(start), "range_end": b64(end), "keys_only": True}
            body["limit"] = str(LIST_PAGE)
            reply = self._client.call(("/v3/kv/range", body))[0]
            kvs = reply.get("kvs", [])
            for kv in kvs:
                name = unb64(kv["key"])[strip:]
                keys.add(name.partition(b"\0")[0].decode("utf-8", "replace"))
            if not reply.get("more") or not kvs:
                return sorted(keys)
            start = unb64(kvs[-1]["key"]) + b"\0"


_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def http_date(text: str | None) -> float | None:
    """An HTTP Date header (``Tue, 15 Nov 1994 08:12:31 GMT``) as Unix time; None if none."""
    if text is None:
        return None
    try:
        _, day, month, year, clock, _ = text.split()
        hour, minute, second = (int(part) for part in clock.split(":"))
        moment = datetime(
            int(year), _MONTHS.index(month) + 1, int(day), hour, minute, second, tzinfo=timezone.utc
        )
    except (AttributeError, ValueError):
        return None
    return moment.timestamp()
