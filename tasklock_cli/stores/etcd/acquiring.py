"""The etcd store's acquire txn: taking the lowest free slot, in one txn, behind the
guards of the key's limit, mode and queue (the store's ``acquire`` sends it)."""

from __future__ import annotations

import itertools
from typing import Any

from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import prefix_end
from tasklock_cli.stores.etcd.keys import SHARED_SHELF
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.etcd.keys import SlotKv
from tasklock_cli.stores.etcd.keys import absent
from tasklock_cli.stores.etcd.keys import family
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.util.records import dataclass

#: The slots one acquire txn tries, nested.
#: etcd counts nested ops against --max-txn-ops (128 by default), along the deepest path.
#: A level takes 3-5 ops.
#: Past these slots, the read of a refusal says where to go on.
#: Shared holders' slots have no limit, but fewer go in one txn.
#: Every level repeats the taking's puts and extras.
#: And a shared txn repeats its chain once per queue alternative.
#: With 16, a shared acquire took 6.1 ms against an exclusive one's 1.6; 4 makes it 2.1.
#: More readers at once go on from where the refusal's read says.
SLOTS_PER_TXN = 24
SHARED_SLOTS_PER_TXN = 4
#: Steps of a txn's plan (see ``taken_slot``) that are not slots: a GUARD level goes on
#: into its success branch or ends in the reads; an EITHER level is a guard with another
#: alternative in its failure branch.
GUARD, EITHER = "guard", "either"
#: A txn's list of operations (or compares), as the JSON gateway takes them.
Ops = list[dict[str, Any]]


@dataclass(frozen=True)
class Taking:
    """An acquisition: what it puts where it takes a slot."""

    key: str
    limit: int
    owner: str
    value: bytes
    lease_id: int
    ttl_s: int
    mode: str = EXCLUSIVE


def acquire_txn(
    keys: EtcdKeys, taking: Taking, start: int, extras: Ops, queue_guards: list[Ops], reads: Ops
) -> tuple[dict[str, Any], list[int | str]]:
    """The acquire's txn: take the lowest free slot from ``start`` on.

    Each slot is a txn nested in the failure branch of the one before: etcd 3.4 has no loop.
    There are at most SLOTS_PER_TXN of them: etcd bounds a txn's ops, nested ones counted in.
    A taking also runs ``extras``.

    Guards:

    - No key of another limit.
      A semaphore's slot 0 without its marker counts as one: it is a plain lock.
      For an exclusive limit-1 caller: no key of any slot or mode at all.
    - No slot taken by us already.
    - ``queue_guards``: the queue admits us (first come, first served).

    Where it ends without a slot, it runs ``reads``.
    Returns the txn and its plan for ``taken_slot``.
    The plan is the slot of each nested level, or GUARD."""
    if taking.mode == SHARED:
        return _shared_txn(keys, taking, start, extras, queue_guards, reads)
    (queue_guard,) = queue_guards  # an exclusive caller's queue guard has no alternative
    key, limit = taking.key, taking.limit
    guards = list(queue_guard)
    if limit > 1:  # no key of another limit, and no slot of ours already (a lost reply)
        guards += [
            *other_limits_absent(keys, key, limit),
            absent(keys.owner_mark(key, taking.owner)),
        ]
    chain: list[dict[str, Any]] = reads
    plan: list[int | str] = []
    for slot in reversed(range(max(start, 1), min(limit, start + SLOTS_PER_TXN))):
        free = [absent(keys.slot_key(key, slot, limit))]
        chain = [nested(free, take_slot_ops(keys, taking, slot) + extras, chain)]
        plan = [slot, *plan]
    if limit > 1:
        marker = {**absent(keys.limit_marker(key, limit)), "result": "GREATER"}
        chain, plan = [nested([marker, *guards], chain, reads)], [GUARD, *plan]
    if start == 0:
        lock_key = keys.lock_key(key)
        # limit 1: no holder of any slot or mode (the lock key, and everything under K NUL)
        first = absent(lock_key) if limit > 1 else {**absent(lock_key), **family(lock_key)}
        chain = [nested([first, *guards], take_slot_ops(keys, taking, 0) + extras, chain)]
        plan = [0, *plan]
    return chain[0]["request_txn"], plan


def _shared_txn(
    keys: EtcdKeys, taking: Taking, start: int, extras: Ops, queue_guards: list[Ops], reads: Ops
) -> tuple[dict[str, Any], list[int | str]]:
    """A shared caller's acquire txn: the guards, then the lowest free shared slot from
    ``start`` on.

    The guards:

    - No exclusive holder: no lock key, no other limit's slot.
    - No slot of ours.
    - The queue admits us, in one of the alternatives of ``queue_guards``.
      Each alternative is tried in the failure branch of the one before."""
    key = taking.key
    chain: list[dict[str, Any]] = reads
    slots = list(range(start, start + SHARED_SLOTS_PER_TXN))
    for slot in reversed(slots):
        free = [absent(keys.slot_key(key, slot, 1, SHARED))]
        chain = [nested(free, take_slot_ops(keys, taking, slot) + extras, chain)]
    common = [
        absent(keys.lock_key(key)),
        *other_limits_absent(keys, key, SHARED_SHELF),
        absent(keys.owner_mark(key, taking.owner)),
    ]
    otherwise = reads
    for guard in reversed(queue_guards):
        otherwise = [nested([*common, *guard], chain, otherwise)]
    plan: list[int | str] = [*[EITHER] * (len(queue_guards) - 1), GUARD, *slots]
    return otherwise[0]["request_txn"], plan


def take_slot_ops(keys: EtcdKeys, taking: Taking, slot: int) -> list[dict[str, Any]]:
    value, lease = b64(taking.value), str(taking.lease_id)
    names = keys.slot_names(taking.key, slot, taking.limit, taking.owner, taking.mode)
    return [{"request_put": {"key": b64(name), "value": value, "lease": lease}} for name in names]


def other_limits_absent(keys: EtcdKeys, key: str, limit: int) -> list[dict[str, Any]]:
    """Compares that hold while no slot key of another limit than ``limit`` exists (shared
    slots are limit SHARED_SHELF's)."""
    slots = keys.lock_key(key) + b"\0"
    ours = slots + f"{limit}/".encode()
    return [
        {**absent(slots), "range_end": b64(ours)},
        {**absent(prefix_end(ours)), "range_end": b64(prefix_end(slots))},
    ]


def nested(compare: list[dict], success: list[dict], failure: list[dict]) -> dict[str, Any]:
    return {"request_txn": {"compare": compare, "success": success, "failure": failure}}


def taken_slot(
    reply: dict[str, Any], plan: list[int | str]
) -> tuple[int | None, list[dict[str, Any]]]:
    """Follow the acquire's nested txn (see ``acquire_txn``) down to where it ended: the
    slot taken (None when none was) and the responses of that level."""
    node, at = reply, 0
    while at < len(plan):
        step = plan[at]
        succeeded = bool(node.get("succeeded"))
        responses = node.get("responses", [])
        if isinstance(step, int) and succeeded:
            return step, responses
        if step == GUARD and not succeeded:
            return None, responses
        at += 1
        if step == EITHER and succeeded:  # past the other alternatives, into the slots
            while at < len(plan) and not isinstance(plan[at], int):
                at += 1
        if at == len(plan):
            return None, responses
        node = responses[0]["response_txn"]
    return None, []


def free_slot(taking: Taking, slots: list[SlotKv]) -> int | None:
    """The lowest slot a ``taking`` may try after a refusal read ``slots`` (none of them
    ours, their limits as the taking's): None when the live holders keep it out."""
    taken = {held.slot for held in slots}
    if taking.mode == SHARED:
        if any(held.mode != SHARED for held in slots):
            return None
        return next(slot for slot in itertools.count() if slot not in taken)
    if any(held.mode == SHARED for held in slots):
        return None
    return next((slot for slot in range(taking.limit) if slot not in taken), None)


def has_free_slot(slots: list[SlotKv], mode: str) -> bool:
    """Whether a ``mode`` caller may find a slot free among the live ``slots``."""
    if mode == SHARED:
        return all(held.mode == SHARED for held in slots)
    return not slots or (slots[0].mode != SHARED and len(slots) < slots[0].limit)
