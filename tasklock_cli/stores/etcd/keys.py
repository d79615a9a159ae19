"""The etcd store's key layout, and reading its slots back.

Under the namespace prefix ``P`` (``?prefix=``, default ``tasklock/``), for lock key ``K``
(stored exactly, UTF-8)::

    P lock/K                    slot 0; a plain lock is slot 0 of limit 1.
    P lock/K NUL N/S            slot S > 0 of K held with limit N; S = 0: the limit marker.
    P lock/K NUL 0/S            shared slot S >= 0 (``run --shared``).
    P owner/K NUL <owner>       a semaphore or shared holder's mark, on its lease.
    P broken/K [NUL S]          the fencing token of a broken lease in slot S.
    P wait/<len>:K/<OMS>/<id>   a waiter's place in K's queue (``waiting``).
    P superseded/K              the newest ``--supersede`` join to K's queue.
    P runs/K NUL <token>        the run ledger: one JSON record per run.
    P success/K                 K's newest run that succeeded.

``P lock/K``, slot 0:

- Its value is JSON, attached to the holder's lease, with these fields:

  - owner;
  - holder;
  - acquired_at (ms, client clock);
  - ttl;
  - limit (semaphores only);
  - done: true once kept after its command ended (``run --hold-at-least``).

- Fencing token = the key's create_revision.
  etcd's global revision only ever grows.
  So a key created again, in any slot, gets a greater one.
  That holds after release, expiry and forced release alike.
  No counter can be reset or deleted.

``P lock/K NUL N/S``, a semaphore's other slots:

- S has SLOT_DIGITS digits, so key order is slot order.
- A slot S > 0 holds the same as the lock key.
- For S = 0 it is the limit marker, put on slot 0's lease with the lock key.
- Keys hold no control characters.
  So no other key's lock key starts with ``K NUL``.
  A range from ``K`` to ``K \x01`` holds K's slots and nothing else: one read, one watch.
- A key held with limit N has no key under ``K NUL`` of another limit.
  The acquire's txn compares that.

``P lock/K NUL 0/S``, shared slots:

- The name says "limit 0"; what it reports says limit 1.
- A shared slot is never the lock key.
  So the lock key exists exactly while an exclusive (or semaphore) holder holds slot 0.
- An exclusive limit-1 acquire compares the whole range ``K`` .. ``K \x01`` empty.
  That means no holder of any mode or slot.
- A shared acquire compares the lock key and every other limit's keys absent.
- An older tasklock sees shared slots as another limit's, and is refused.

``P owner/K NUL <owner>``: a retry after a lost reply finds its own slot by this mark.
It does not take a free one instead.

``P broken/K [NUL S]``:

- Its value is the fencing token of a broken lease in slot S.
- There is no ``NUL S`` for slot 0.
- It is attached, with the slot's keys, to the breaker's lease
  (see ``EtcdStore.break_lease``).

``P wait/<len>:K/<OMS>/<id>``, a waiter's place:

- It is on the waiter's lease; id is that lease's hex ID.
- Its value is the holder and its arrival.
- The class OMS is three letters:

  - O = F (front, ``run --replace``) or N (normal);
  - M = S (shared) or X (exclusive);
  - S = S (joined with ``--supersede``) or P (plain).

- A normal place with a priority (``run --priority`` P, not 0) has its band's code after
  the N: ``N<100-P, 3 digits>MS`` for P > 0 (``N095XP`` for 5), ``Nz<-P, 3 digits>MS``
  for P < 0 (``Nz003SP`` for -3). Digits sort before the letters S and X, and z after
  them: the bands sort highest priority first, with priority 0's (``NXP``, as an older
  tasklock writes it) between. An older tasklock reads a banded place as a normal
  exclusive one.
- Queue order, by create_revision:

  - the F places first, NEWEST first: a later ``front`` goes ahead of an earlier one;
  - then the N places, by band, and oldest first within one.

- So "ahead of a normal place R" is "any F place, a place of a higher band, or one of its
  own band created before R": each a contiguous range of names.
- And "ahead of a front place R" is "an F place created after R".
- Range compares on create_revision over ``Q F``, ``Q N``, ``Q FX``, ``Q NX`` say this in
  the acquire's txn.
- Why upper-case letters: an older tasklock's place is ``Q <lower-case hex>``.
  It falls in none of those ranges, only in the whole queue's.
  It is read as a normal exclusive place.

``P superseded/K``:

- Every ``--supersede`` run that joins K's queue puts it, on its waiter lease.
- It does so in the txn that deletes every other supersede place of K.
- So its mod_revision is the newest such join.
- Take a waiter whose supersede place was created at R.
  If that place is gone while this key's mod_revision is above R, the waiter was
  superseded (see ``waiting``).

``P runs/K NUL <token>``, the run ledger:

- The token has 20 digits, so key order is token order.
- Keys hold no control characters, so NUL ends K.
- The release's txn puts each record.
- The acquire's txn counts K's records and reads the oldest.
  So the release's txn can trim the ledger to the last LEDGER_KEEP runs.

``P success/K``:

- It is as in the ledger, but started_at is on the member's clock (see ``etcd``).
- The same txn as its record puts it, but the trim does not touch it.
- ``--once-per`` and ``metrics`` read it.
"""

from __future__ import annotations

import json
import time
from typing import Any
from typing import NamedTuple

from tasklock_cli.errors import ConfigError
from tasklock_cli.stores import rows as row_parsing
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import kvs_of
from tasklock_cli.stores.etcd.connection import unb64
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import LeaseInfo

#: Slot numbers in key names have this many digits (zero-padded: key order is slot order).
SLOT_DIGITS = 10


#: The limit in the names of shared slots' keys (shared holders report limit 1).
SHARED_SHELF = 0


class SlotKv(NamedTuple):
    """A slot of a key as read: the etcd kv of its key (slot 0: the lock key)."""

    key: str
    slot: int
    limit: int
    kv: dict[str, Any]
    mode: str = EXCLUSIVE

    @property
    def token(self) -> int:
        return int(self.kv["create_revision"])

    @property
    def lease_id(self) -> int:
        return int(self.kv.get("lease", 0))

    @property
    def owner(self) -> str:
        return str((decode_value(unb64(self.kv.get("value"))) or {}).get("owner", ""))


class EtcdKeys:
    """The names of a namespace's keys, and its slots read back from them."""

    def __init__(self, prefix: str, display_url: str) -> None:
        self.prefix = prefix
        self.display_url = display_url
        self._p = prefix.encode("utf-8")

    def lock_key(self, key: str) -> bytes:
        return self._p + b"lock/" + key.encode("utf-8")

    def slot_key(self, key: str, slot: int, limit: int, mode: str = EXCLUSIVE) -> bytes:
        """Where slot ``slot`` of ``key`` held with ``limit`` keeps its lease.

        - Slot 0 is in the lock key, as a plain lock, which it is with limit 1.
        - The other slots are under the key's own ``NUL`` prefix.
        - A shared slot is always there, under limit SHARED_SHELF."""
        if mode == SHARED:
            return self.lock_key(key) + f"\0{SHARED_SHELF}/{slot:0{SLOT_DIGITS}d}".encode()
        if slot == 0:
            return self.lock_key(key)
        return self.lock_key(key) + f"\0{limit}/{slot:0{SLOT_DIGITS}d}".encode()

    def slot_names(
        self, key: str, slot: int, limit: int, owner: str, mode: str = EXCLUSIVE
    ) -> list[bytes]:
        """The keys a holder of the slot puts on its lease.

        - The slot's key.
        - For a semaphore or a shared holder, its owner mark.
          A retry finds its own slot by it, though another is free.
        - For a semaphore's slot 0, the limit marker.
          It sits where slot 0 would be among the other slots."""
        names = [self.slot_key(key, slot, limit, mode)]
        if limit > 1 or mode == SHARED:
            names.append(self.owner_mark(key, owner))
        if limit > 1 and slot == 0:
            names.append(self.limit_marker(key, limit))
        return names

    def owner_mark(self, key: str, owner: str) -> bytes:
        return self._p + b"owner/" + key.encode("utf-8") + b"\0" + owner.encode("utf-8")

    def limit_marker(self, key: str, limit: int) -> bytes:
        return self.lock_key(key) + f"\0{limit}/{0:0{SLOT_DIGITS}d}".encode()

    def broken_key(self, key: str, slot: int = 0) -> bytes:
        name = self._p + b"broken/" + key.encode("utf-8")
        return name if slot == 0 else name + f"\0{slot:0{SLOT_DIGITS}d}".encode()

    def broken_by_key(self, key: str, slot: int = 0) -> bytes:
        """Who broke the slot (JSON), beside its broken mark and on the same lease
        (outside the marks' range: ``slot_reads`` never reads it)."""
        name = self._p + b"brokenby/" + key.encode("utf-8")
        return name if slot == 0 else name + f"\0{slot:0{SLOT_DIGITS}d}".encode()

    def queue_prefix(self, key: str) -> bytes:
        raw = key.encode("utf-8")
        return self._p + b"wait/" + str(len(raw)).encode() + b":" + raw + b"/"

    def queue_entry(self, key: str, waiter_lease: int, place_class: str) -> bytes:
        """A place in ``key``'s queue of class ``place_class`` (see ``place_class``)."""
        return self.queue_prefix(key) + f"{place_class}/{waiter_lease:016x}".encode()

    def superseded_key(self, key: str) -> bytes:
        return self._p + b"superseded/" + key.encode("utf-8")

    def success_key(self, key: str) -> bytes:
        return self._p + b"success/" + key.encode("utf-8")

    def runs_prefix(self, key: str) -> bytes:
        return self._p + b"runs/" + key.encode("utf-8") + b"\0"

    def run_key(self, key: str, token: int) -> bytes:
        return self.runs_prefix(key) + f"{token:020d}".encode()

    def ledger_start(self, prefix: str) -> tuple[bytes, int]:
        """Where the ledger's keys starting with ``prefix`` begin, and the length to strip."""
        return self._p + b"runs/" + prefix.encode("utf-8"), len(self._p + b"runs/")

    # -- slots read back ---------------------------------------------------------------

    def slot_reads(self, key: str) -> list[dict[str, Any]]:
        """Range ops reading every slot key of ``key`` and every broken mark."""
        return [
            {"request_range": family(self.lock_key(key))},
            {"request_range": family(self.broken_key(key))},
        ]

    def slots_from(self, responses: list[dict[str, Any]]) -> tuple[list[SlotKv], set[int]]:
        """The live slots (ordered by slot) and the broken tokens ``slot_reads`` read."""
        lock_kvs, broken_kvs = (kvs_of(response) for response in responses)
        slots = [held for kv in lock_kvs if (held := self.slot_of(kv)) is not None]
        broken = {int(value) for kv in broken_kvs if (value := unb64(kv.get("value"))).isdigit()}
        return sorted(slots, key=lambda held: held.slot), broken

    def slot_of(self, kv: dict[str, Any]) -> SlotKv | None:
        """The slot a key under the lock prefix holds; None for a limit marker."""
        rest = unb64(kv["key"])[len(self.lock_key("")) :]
        name, nul, tail = rest.partition(b"\0")
        key = name.decode("utf-8", "replace")
        if not nul:
            record = decode_value(unb64(kv.get("value"))) or {}
            return SlotKv(key, 0, row_parsing.as_integer(record.get("limit", 1)) or 1, kv)
        limit_text, _, slot_text = tail.partition(b"/")
        if not (limit_text.isdigit() and slot_text.isdigit()):
            raise self.foreign(unb64(kv["key"]), "lease")
        slot = int(slot_text)
        if int(limit_text) == SHARED_SHELF:
            return SlotKv(key, slot, 1, kv, SHARED)
        return None if slot == 0 else SlotKv(key, slot, int(limit_text), kv)

    def info(self, held: SlotKv, remaining: float) -> LeaseInfo | None:
        """What an observer sees of a slot whose lease has ``remaining`` seconds (None when
        it ran out: -1)."""
        if remaining < 0:
            return None  # the lease ran out between the two reads
        # A value that is not a lease record is a malformed row (see rows): shown as such.
        # A key that exists is live: etcd deletes it with its lease.
        record = decode_value(unb64(held.kv.get("value"))) or {}
        holder, acquired = record.get("holder"), record.get("acquired_at")
        return row_parsing.lease_info(
            held.key,
            held.slot,
            held.limit,
            held.token,
            acquired,
            (time.time() + remaining) * 1000,
            holder,
            held.mode,
            False,
            per_second=1000,
            kept=record.get("done") is True,  # the release's keep_for (store._keep_done)
        )

    def foreign(self, name: bytes, what: str) -> ConfigError:
        return ConfigError(
            f"{self.display_url}: etcd key {name.decode('utf-8', 'replace')!r} is not a "
            f"tasklock {what}; another application uses the prefix {self.prefix!r}"
        )


def lease_value(owner_token: str, holder: Holder, sent: float, ttl_s: int, limit: int) -> bytes:
    """A slot key's value; ``limit`` only for a semaphore (a plain lock's value is as an
    older tasklock writes it)."""
    value: dict[str, Any] = {
        "owner": owner_token,
        "holder": holder.to_dict(),
        "acquired_at": int(sent * 1000),
        "ttl": ttl_s,
    }
    if limit > 1:
        value["limit"] = limit
    return json.dumps(value, sort_keys=True).encode()


def decode_value(value: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(value)
    except ValueError:
        return None
    return record if isinstance(record, dict) and "owner" in record else None


def absent(name: bytes) -> dict[str, Any]:
    """A compare that holds while ``name`` does not exist (with a range_end: no key in it)."""
    return {"key": b64(name), "target": "CREATE", "create_revision": "0"}


def place_class(front: bool, mode: str, supersede: bool, priority: int = 0) -> str:
    """The class letters of a queue place (see the layout above): with a priority, its
    band's code between O and M."""
    code = "" if front else priority_code(priority)
    return (
        ("F" if front else "N")
        + code
        + ("S" if mode == SHARED else "X")
        + ("S" if supersede else "P")
    )


def priority_code(priority: int) -> str:
    """A normal place's band code (see the layout above): none for 0, ``000``..``099`` for
    100..1 (higher first), ``z001``..``z100`` for -1..-100 (after every band above)."""
    if priority > 0:
        return f"{100 - priority:03d}"
    return f"z{-priority:03d}" if priority < 0 else ""


def code_priority(code: str) -> int | None:
    """The priority of a band ``code`` (``priority_code``'s inverse); None when not one."""
    negative = code.startswith("z")
    digits = code[1:] if negative else code
    if len(digits) != 3 or not (digits.isascii() and digits.isdigit()):
        return None
    value = -int(digits) if negative else 100 - int(digits)
    if value == 0 or not -100 <= value <= 100 or (value < 0) != negative:
        return None
    return value


def family(name: bytes) -> dict[str, str]:
    """The range of ``name`` and every key under ``name`` NUL (its slots, its marks)."""
    return {"key": b64(name), "range_end": b64(name + b"\x01")}


def range_op(name: bytes) -> dict[str, Any]:
    return {"request_range": {"key": b64(name)}}


def moves_to_lease(names: list[bytes], lease_id: int) -> list[dict[str, Any]]:
    return [
        {"request_put": {"key": b64(name), "ignore_value": True, "lease": str(lease_id)}}
        for name in names
    ]
