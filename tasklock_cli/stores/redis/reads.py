"""The Redis store's reads: what ``peek``, ``list``, ``history``, ``metrics`` and
``--once-per`` show (the slots, the queue, the run ledger), each slot and queue read in
one script, listings by SCAN. A mixin of ``RedisStore``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from typing import cast

import redis
import redis.exceptions as rexc

from tasklock_cli.errors import ForeignKey
from tasklock_cli.stores import rows as row_parsing
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import LIST_PAGE
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.redis.connection import RedisConnection
from tasklock_cli.stores.redis.keys import RedisKeys
from tasklock_cli.stores.redis.queue import waiter_info
from tasklock_cli.util.times import utc_from_timestamp

#: ``list`` in the store class's body is its method: annotations there say builtins.list.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import builtins

SCAN_COUNT = 10_000

#: A lease hash's fields as ``_record`` takes them (READ_MANY's order).
_LEASE_FIELDS = ("fencing_token", "acquired_at", "expires_at", "holder", "limit", "mode")


def _slot_info(key: str, row: list[Any]) -> LeaseInfo:
    """A lease from a row of the ``slots`` script (see ``RedisStore._slots``)."""
    slot, token, acquired, expires, holder, limit, _pttl, _broken, mode, done = row
    return lease_info_of(key, slot, token, acquired, expires, holder, limit, mode, done)


def lease_info_of(
    key: str,
    slot: object,
    token: Any,
    acquired: Any,
    expires: Any,
    holder: Any,
    limit: Any,
    mode: Any = None,
    done: Any = None,
) -> LeaseInfo:
    # A lease key that exists is live (Redis drops it at its PX); a plain lock's hash (an
    # older tasklock's too) has no limit, an exclusive one no mode, a lease not kept after
    # its command ended no done. (READ_MANY's JSON has false for a missing field.)
    token, acquired, expires, holder, limit, mode = (
        None if value is False else value
        for value in (token, acquired, expires, holder, limit, mode)
    )
    kept = done in (b"1", "1")  # bytes from a script's reply, text from READ_MANY's JSON
    return row_parsing.lease_info(
        key, slot, limit or 1, token, acquired, expires, holder, mode, False, 1000, kept
    )


def _fetch(
    conn: RedisConnection, client: redis.Redis, batch: list[tuple[bytes, str, int]]
) -> list[Any]:
    """Per lease hash: (token, acquired_at, expires_at, holder, limit, mode), None when
    gone, or a type name."""
    names = [name for name, _, _ in batch]
    raw = conn.scripts["read_many"](keys=names, client=client)
    try:
        decoded = json.loads(raw)
    except ValueError:  # a foreign hash with bytes that are not UTF-8: read it plainly
        decoded = None
    if isinstance(decoded, list) and len(decoded) == len(names):
        return [None if row == 0 else row for row in decoded]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hmget(name, [*_LEASE_FIELDS])
    rows: list[Any] = []
    for name, result in zip(names, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(result, rexc.ResponseError):
            kind = client.type(name)  # bytes: the client does not decode responses
            rows.append(kind.decode() if isinstance(kind, bytes) else kind)
        elif isinstance(result, Exception):
            raise result
        else:
            rows.append(None if all(v is None for v in result) else result)
    return rows


def scan(client: redis.Redis, pattern: bytes) -> list[bytes]:
    return list(client.scan_iter(match=pattern, count=SCAN_COUNT))


class RedisReads:
    """The reads of ``RedisStore`` (see the module's docstring)."""

    _conn: RedisConnection
    _names: RedisKeys

    def _slots(self, key: str) -> list[list[Any]]:
        """The key's live slots, in one read: per slot (ordered) [slot, fencing_token,
        acquired_at, expires_at, holder, limit, pttl, broken, mode, done] (None for a
        missing field)."""
        keys = [self._names.lease(key), self._names.name(key, "limit")]
        return self._conn.script("slots", keys, [], key)

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        name = self._names.name(key, "runs")
        try:
            # (redis-py's type also covers withscores= and decode_responses=: plain bytes)
            members = cast(
                "list[bytes]", self._conn.call(lambda c: c.zrevrange(name, 0, limit - 1), key)
            )
        except ForeignKey as exc:  # another application's key: one malformed run
            return [row_parsing.foreign_run(key, exc.found)]
        return [row_parsing.run_record_json(key, member) for member in members]

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        name = self._names.name(key, "success")

        def read(client: redis.Redis) -> list[Any]:
            pipe = client.pipeline(transaction=True)  # one round trip, one moment
            pipe.get(name)
            pipe.time()
            return pipe.execute(raise_on_error=False)

        member, (seconds, micros) = self._conn.call(read, key)
        now = utc_from_timestamp(seconds + micros / 1_000_000)  # Redis's clock, as in TIME
        if isinstance(member, rexc.ResponseError):  # another application's key: none
            return None, now
        return (row_parsing.run_record_json(key, member) if member else None), now

    def ledger_keys(self, prefix: str = "") -> list[str]:
        pattern = self._names.pattern(prefix, b"runs")
        names = set(self._conn.call(lambda c: scan(c, pattern)))
        keys = {self._names.key_of(name, b"runs") for name in names}
        return sorted(key for key in keys if key.startswith(prefix))

    def holders(self, key: str) -> list[LeaseInfo]:
        return [_slot_info(key, row) for row in self._slots(key)]

    def list(self, prefix: str = "", include_expired: bool = False) -> Iterator[LeaseInfo]:
        # Redis frees expired keys itself: include_expired can only ever show live leases.
        # One pattern for every slot's hash (``}:lease`` and ``}:lease:N``); it may match
        # other parts of keys that contain ``}:lease``, which ``slot_of`` leaves out.
        pattern = self._names.pattern(prefix, b"lease*")
        # SCAN returns names in no order: collect them (names only), sort by key and slot,
        # then read and yield the leases page by page.
        scanned = self._conn.call(lambda c: scan(c, pattern))
        slots = {name: self._names.slot_of(name) for name in scanned}
        found = sorted((where, name) for name, where in slots.items() if where is not None)
        return self._read_pages([(name, *where) for where, name in found], prefix)

    def _read_pages(
        self, names: builtins.list[tuple[bytes, str, int]], prefix: str
    ) -> Iterator[LeaseInfo]:
        for start in range(0, len(names), LIST_PAGE):
            batch = names[start : start + LIST_PAGE]
            # (ignore: mypy cannot infer a lambda with a default, which binds the loop's batch)
            rows = self._conn.call(lambda c, batch=batch: _fetch(self._conn, c, batch))  # type: ignore[misc]
            for (_, key, slot), row in zip(batch, rows, strict=True):
                if row is None or not key.startswith(prefix):
                    continue  # expired between SCAN and the read
                if isinstance(row, str):  # another application's key: shown, not fatal
                    yield row_parsing.foreign_lease(key, slot, f"a Redis {row}, not a lease hash")
                    continue
                yield lease_info_of(key, slot, *row)

    def waiters(self, key: str) -> builtins.list[WaiterInfo]:
        return [waiter_info(value) for value in self._queue(key, "")[1:]]

    def _queue(self, key: str, owner: str) -> builtins.list[Any]:
        """How many live places are ahead of ``owner``'s, then each live place."""
        return self._conn.script("waiters", [self._names.name(key, "wake")], [owner], key)

    def waiting_counts(self, prefix: str = "") -> dict[str, int]:
        names = self._conn.call(
            lambda client: scan(client, self._names.pattern(prefix, b"waiters")), None
        )
        counts: dict[str, int] = {}
        for name in sorted(set(names)):
            key = self._names.key_of(name, b"waiters")
            if key.startswith(prefix):
                try:
                    count = len(self._queue(key, "")) - 1
                except ForeignKey:  # another application's key: no queue of ours
                    continue
                if count:
                    counts[key] = count
        return counts
