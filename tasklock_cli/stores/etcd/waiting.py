"""The etcd store's queues of waiters, as etcd's own lock recipe keeps them.

A waiter puts a key of its own in the lock key's queue: ``P wait/<len>:K/<OMS>/<id>``.
The key is on its waiter lease.
Its value is the waiter's holder record and arrival, for ``peek``.
The class OMS (see ``keys``) says front or normal, shared or exclusive, supersede or plain.
The order, by create_revision: the front places newest first, then the normal ones by
priority band (``run --priority``, see ``keys``), oldest first within one.

An acquire takes a slot only while two things hold:

- The places ahead of the caller's admit it (``guard``).
  An exclusive caller is admitted when none is ahead.
  A shared one is admitted when none ahead is exclusive.
  A caller with no place has every place ahead of it.
- Its own place is still there, with its revision.
  A superseded or lapsed place admits nobody.

Wake-ups:

- An exclusive waiter watches the place just ahead of it.
- A shared one watches the nearest exclusive place ahead of it.
- Some waiters have none to watch: the head, or one of the run of shared waiters at the
  head, all of them admitted together.
  Such a waiter watches every slot of the key.
- So a release wakes exactly those that may now be admitted.
- A waiter that goes hands the turn on.
  It goes when it got the lease, gave up or was superseded.
  It also goes when it crashed and its waiter lease ran out.
- A watch starts at the revision of the read before it, so nothing in between is missed.

Supersede:

- A ``--supersede`` run that joins deletes every other supersede place of the key.
  Those are the places of the four supersede classes, minus its own key.
- In the same txn it puts ``P superseded/K``.
- Its victims' places are gone.
- Each victim learns it was superseded at its next acquire.
  That txn's reads show its place gone, and the marker newer than its place.
  A waiter tries at least every waiter_ttl/3.
- It does not learn it by a wake-up of its own: that would take a second watch stream.
- Edge: the marker lives on the newest supersede waiter's lease.
  A superseded run may come back only after that run's client closed.
  It then finds no marker, and joins again as new.

Dead places:

- A tasklock's place is on the waiter lease its name ends with.
  That lease is granted for a few seconds.
- Some places were not put there by a waiter, but by someone else's put.
  They are on no lease, or on another one.
  Or they are on a lease granted for longer than ``WAITER_HORIZON_S``.
- Such a place is dead, and the queue ignores it.
- The next refused acquire or wait that finds it ahead deletes it.
  The acquire then tries again.
- ``sweep`` deletes it too.
  So it cannot hold a free key up.
- A txn cannot compare a lease's TTL, so the acquire's guard still counts a dead place.
- The check comes after a refused acquire, from the queue that acquire's txn read.
  So it costs no round trip while no place needs one.
- It adds one ``timetolive`` per lease this process has not seen before.
"""

from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from collections.abc import Callable
from typing import Any
from typing import NamedTuple

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.etcd.connection import EtcdClient
from tasklock_cli.stores.etcd.connection import EtcdError
from tasklock_cli.stores.etcd.connection import Watch
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import kvs_of
from tasklock_cli.stores.etcd.connection import new_lease_id
from tasklock_cli.stores.etcd.connection import prefix_end
from tasklock_cli.stores.etcd.connection import revision
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.etcd.keys import absent
from tasklock_cli.stores.etcd.keys import place_class
from tasklock_cli.stores.etcd.keys import priority_code
from tasklock_cli.stores.etcd.keys import range_op
from tasklock_cli.stores.etcd.places import Queued
from tasklock_cli.stores.etcd.places import QueueReads
from tasklock_cli.stores.etcd.places import ordered
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.stores.model import Ask
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import place_record
from tasklock_cli.util.fds import wait_readable

#: When the watch breaks, waiting falls back to reading the key this often.
POLL_S = 0.1
#: A waiter whose place moved up (the place ahead of it went) looks again only this much
#: later.
#: That place almost always went in its waiter's acquire, whose command is starting right
#: then.
#: The look is two reads and a new watch, on this machine and on etcd.
#: It would compete with that start for the CPU.
#: And it cannot admit us before that run ends.
#: The pause is long enough to cover the start (2-3 ms), and short beside a run.
#: A run of an instant command may already be over when the look comes.
#: A longer pause (10 ms) made those hand-offs slower.
#: Measured with 8 waiters: 12.6 ms with 10 ms, 7.3 ms with none, 6.8 ms with this one.
MOVED_UP_PAUSE_S = 0.003


#: What ``WaiterQueue.verdict`` finds of our place after a refused acquire.
SUPERSEDED, GONE, AHEAD, CLEAR = "superseded", "gone", "ahead", "clear"
#: The classes of places that joined with ``--supersede`` (see ``keys``).
SUPERSEDE_CLASSES = tuple(
    place_class(f, m, True) for f in (True, False) for m in (SHARED, EXCLUSIVE)
)


class Place(NamedTuple):
    """Our place in a key's queue: its key, its create_revision, how it queued."""

    entry: bytes
    revision: int
    mode: str
    front: bool
    supersede: bool
    priority: int = 0


class WaiterQueue(QueueReads):
    """This client's places in the queues of keys: one waiter lease for all of them,
    refreshed while waiting."""

    def __init__(self, client: EtcdClient, keys: EtcdKeys, ttl: Callable[[], float]) -> None:
        self._client = client
        self._keys = keys
        self._ttl = ttl  # the store's waiter_ttl
        self._waiter_lease: int | None = None
        self._waiter_refreshed = 0.0
        self._places: dict[str, Place] = {}
        # a place of ours may exist that _places does not list (a join's reply not read,
        # a leave's delete failed): close then revokes the waiter lease
        self._unsure = False
        # key -> (value, mode, front, supersede, priority) of the place to take when joining
        self._wanted: dict[str, tuple[bytes, str, bool, bool, int]] = {}
        # key -> how many live places its queue had at the last verdict (--max-waiting),
        # and its supersede places of priority bands (superseded by name)
        self._lengths: dict[str, int] = {}
        self._banded_supersede: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()
        # waiter lease id -> whether it was granted for longer than any waiter asks
        self._too_long: dict[int, bool] = {}

    @property
    def ttl_s(self) -> int:
        """Our waiter lease's TTL: whole seconds (etcd raises it to its own minimum)."""
        return max(1, math.ceil(self._ttl()))

    def guard(self, key: str, mode: str) -> list[list[dict[str, Any]]]:
        """Compares that hold while the queue admits a ``mode`` caller (see the module's
        docstring): alternatives, any one of which admits (a range compare cannot say
        "empty or all newer than ours" at once: a shared caller's needs two). A shared
        caller counts every place of a higher band as ahead, whatever its mode (a band's
        exclusive places are not one range)."""
        queue = self._keys.queue_prefix(key)
        place = self.place(key)
        exclusive = mode != SHARED
        if place is None:
            if exclusive:
                return [[_none_in(queue)]]
            banded = [_none_between(queue + b"N0", queue + b"N:"), _none_in(queue + b"Nz")]
            return [[_none_in(queue + b"FX"), _none_in(queue + b"NX"), *banded]]
        own = {
            "key": b64(place.entry),
            "target": "CREATE",
            "create_revision": str(place.revision),
        }
        if place.front:  # ahead: the front places that came later
            ahead = queue + (b"F" if exclusive else b"FX")
            return [[own, _all_created(ahead, "LESS", place.revision + 1)]]
        return _normal_place_guard(queue, place, exclusive, own)

    def reads(self, key: str) -> list[dict[str, Any]]:
        """Range ops for a refused acquire's txn: the key's queue and its superseded mark
        (for ``verdict``)."""
        queue = self._keys.queue_prefix(key)
        whole = {"key": b64(queue), "range_end": b64(prefix_end(queue)), "keys_only": True}
        return [{"request_range": whole}, range_op(self._keys.superseded_key(key))]

    def verdict(self, key: str, mode: str, responses: list[dict[str, Any]]) -> str:
        """What ``reads`` says of a ``mode`` caller: our place SUPERSEDED (a newer supersede
        run joined after it) or GONE (it lapsed), someone AHEAD that keeps us out, or CLEAR."""
        queue_kvs, marker_kvs = (kvs_of(response) for response in responses)
        queue_kvs = self.live_places(queue_kvs, delete=True)
        placed = ordered(self._keys.queue_prefix(key), queue_kvs)
        place = self.place(key)
        if place is not None and not any(
            (queued.name, queued.revision) == (place.entry, place.revision) for queued in placed
        ):
            marked = int(marker_kvs[0].get("mod_revision", 0)) if marker_kvs else 0
            return SUPERSEDED if place.supersede and marked > place.revision else GONE
        self._lengths[key] = len(placed)
        banded = [q.name for q in placed if q.priority and q.letters.endswith("S")]
        self._banded_supersede[key] = banded
        ahead = _ahead(placed, place.entry if place else None)
        return AHEAD if _keeps_out(ahead, mode, place) else CLEAR

    def length(self, key: str) -> int:
        """How many live places ``key``'s queue had at the last ``verdict``."""
        return self._lengths.get(key, 0)

    def join(
        self, key: str, value: bytes, mode: str, front: bool, supersede: bool, priority: int = 0
    ) -> None:
        """Take a place in ``key``'s queue, with ``value``, when we have none (with
        ``supersede``: superseding every other supersede place, in the same txn; in
        ``priority``'s band)."""
        with self._lock:
            self._wanted[key] = (value, mode, front, supersede, priority)
        self._join(key)

    def place(self, key: str) -> Place | None:
        """Our place in ``key``'s queue; None when we have none."""
        with self._lock:
            return self._places.get(key)

    def mode_of(self, key: str) -> str:
        """The mode we wait for ``key`` in."""
        with self._lock:
            place, wanted = self._places.get(key), self._wanted.get(key)
        if place is not None:
            return place.mode
        return wanted[1] if wanted is not None else EXCLUSIVE

    def entry_if_queued(self, key: str) -> bytes | None:
        """Our place in ``key``'s queue, for an acquire to delete with its taking."""
        with self._lock:
            place = self._places.get(key)
            return place.entry if place is not None and self._waiter_lease is not None else None

    def left(self, key: str, wanted: bool = True) -> None:
        """An acquire deleted our place in ``key``'s queue (or found it superseded: then,
        without ``wanted``, how we wanted to queue goes too)."""
        with self._lock:
            self._places.pop(key, None)
            if not wanted:
                self._wanted.pop(key, None)

    def lapsed(self, key: str) -> None:
        """An acquire found our place in ``key``'s queue gone, not superseded: our waiter
        lease may have run out (then every place of ours is gone with it)."""
        self.left(key)
        self._refresh()

    def take_turn(self, key: str, deadline: float, wake_fd: int | None) -> bool:
        """Join ``key``'s queue and wait until we may be admitted (watching the place that
        keeps us out); False when the turn did not come before the deadline or wake_fd, or
        our place went (superseded or lapsed: the next acquire tells which)."""
        while time.monotonic() < deadline:
            had = self.place(key) is not None
            entry = self._join(key)
            ahead, present = self._place(key, entry)
            if not present:
                if had:
                    return False
                self._forget()
                continue
            if ahead is None:
                return True
            outcome = self._watch_place(ahead, deadline, wake_fd)
            if outcome == "woken":
                return False
            if outcome == "matched":  # (see MOVED_UP_PAUSE_S)
                wait_readable([wake_fd], min(MOVED_UP_PAUSE_S, deadline - time.monotonic()))
        return False

    def _watch_place(self, ahead: bytes, deadline: float, wake_fd: int | None) -> str:
        """Wait for the place ``ahead`` to go (``Watch.wait``'s outcome), keeping ours.
        The watch begins now, and the place is looked at once it has: one that went before
        it began is "matched" at once (see ``EtcdClient.open_watch``)."""
        watch = self._client.open_watch({"key": b64(ahead)})
        try:
            _, here = self._client.range(ahead)
            if here is None:
                return "matched"
            return watch.wait(deadline, wake_fd, keep=self._keep())
        finally:
            watch.close()

    def await_release(self, watch: Watch, until: float, wake_fd: int | None) -> bool:
        """Wait on ``watch`` (opened before the caller's look at the key) until a slot's
        key is deleted (a release, a forced release, an expiry: True), ``until`` or
        wake_fd, keeping our place meanwhile; the watch is closed after."""
        try:
            # woken, timed out, or our places gone (the acquire looks again): False
            return watch.wait(until, wake_fd, keep=self._keep()) == "matched"
        finally:
            watch.close()

    def leave(self, key: str) -> None:
        """Give up our place in ``key``'s queue (so the next waiter moves up)."""
        with self._lock:
            place = self._places.pop(key, None)
            self._wanted.pop(key, None)
            if place is None or self._waiter_lease is None:
                return
        try:
            self._client.call(("/v3/kv/deleterange", {"key": b64(place.entry)}))
        except TasklockError:
            with self._lock:
                self._unsure = True  # the place may be there still: close revokes the lease

    def close(self) -> None:
        """Our places in queues go, so the waiters behind move up.

        With none left, because each acquire deleted ours, the waiter lease is not revoked.
        It holds nothing but maybe a superseded mark, and runs out on its own.
        A revoke would be one more write to the cluster's log.
        It would come just when the next holder's acquire needs the log."""
        with self._lock:
            waiter, self._waiter_lease = self._waiter_lease, None
            placed = bool(self._places) or self._unsure
            self._places.clear()
        if waiter is not None and placed:
            with contextlib.suppress(TasklockError):
                self._client.revoke(waiter)

    def _join(self, key: str) -> bytes:
        """Our place in ``key``'s queue (joining, or refreshing our waiter lease when due)."""
        self.keep_if_due()
        with self._lock:
            place = self._places.get(key)
            if place is not None:
                return place.entry
            requests: list[tuple[str, dict[str, Any]]] = []
            if self._waiter_lease is None:
                self._waiter_lease = new_lease_id()
                self._waiter_refreshed = time.monotonic()
                grant = {"ID": str(self._waiter_lease), "TTL": str(self.ttl_s)}
                requests.append(("/v3/lease/grant", grant))
            wanted = self._wanted.get(key, (b"", EXCLUSIVE, False, False, 0))
            value, mode, front, supersede, priority = wanted
            letters = place_class(front, mode, supersede, priority)
            entry = self._keys.queue_entry(key, self._waiter_lease, letters)
            requests.append(("/v3/kv/txn", self._join_txn(key, entry, value, supersede)))
            was_unsure, self._unsure = self._unsure, True  # (the place exists once sent)
            replies = self._client.call(*requests)
            # the txn's revision is our place's create_revision
            self._places[key] = Place(
                entry, revision(replies[-1]), mode, front, supersede, priority
            )
            self._unsure = was_unsure
            return entry

    def _join_txn(self, key: str, entry: bytes, value: bytes, supersede: bool) -> dict[str, Any]:
        """Put our place; with ``supersede`` also delete every other supersede place of the
        key (a txn may not put a key that one of its deletes covers: ours is cut out of
        its class's range) and mark the key superseded."""
        lease = str(self._waiter_lease)
        ops: list[dict[str, Any]] = []
        if supersede:
            queue = self._keys.queue_prefix(key)
            for letters in SUPERSEDE_CLASSES:
                start = queue + letters.encode() + b"/"
                ops.extend(_deletes_but(start, prefix_end(start), entry))
            # (the banded classes are too many for a delete each: the places the refused
            # acquire's txn read)
            for name in self._banded_supersede.get(key, ()):
                if name != entry:
                    ops.append({"request_delete_range": {"key": b64(name)}})
        ops.append({"request_put": {"key": b64(entry), "value": b64(value), "lease": lease}})
        if supersede:
            marker = {"key": b64(self._keys.superseded_key(key)), "value": b64(entry)}
            ops.append({"request_put": {**marker, "lease": lease}})
        return {"compare": [], "success": ops, "failure": []}

    def _refresh(self) -> bool:
        """Keep our places in queues; False when they are gone (the waiter lease ran out)."""
        with self._lock:
            if self._waiter_lease is None:
                return False
            if self._client.keepalive(self._waiter_lease) <= 0:
                self._waiter_lease = None
                self._places.clear()
                return False
            self._waiter_refreshed = time.monotonic()
            return True

    def keep_if_due(self) -> None:
        """Refresh our waiter lease when a third of its TTL has passed since the last."""
        if time.monotonic() >= self._refresh_due_at():
            self._refresh()

    def _refresh_due_at(self) -> float:
        return self._waiter_refreshed + self.ttl_s / 3

    def _keep(self) -> tuple[float, Callable[[], float | None]]:
        """For a watch: when our waiter lease is next due for a refresh, and the refresh
        (which says when the next one is due; None once our places are gone)."""
        return self._refresh_due_at(), self._refresh_until_due

    def _refresh_until_due(self) -> float | None:
        return self._refresh_due_at() if self._refresh() else None

    def _forget(self) -> None:
        with self._lock:
            self._waiter_lease = None
            self._places.clear()

    def _place(self, key: str, entry: bytes) -> tuple[bytes | None, bool]:
        """(the place to watch, None when we may be admitted; whether we are queued)."""
        queue = self._keys.queue_prefix(key)
        body = {"key": b64(queue), "range_end": b64(prefix_end(queue)), "keys_only": True}
        reply = self._client.call(("/v3/kv/range", body))[0]
        placed = ordered(queue, self.live_places(reply.get("kvs", []), delete=True))
        if not any(queued.name == entry for queued in placed):
            return None, False
        place = self.place(key)
        ahead = _ahead(placed, entry)
        if self.mode_of(key) == SHARED:  # only an exclusive place (or a higher band) ahead
            ahead = [queued for queued in ahead if _blocks_shared(queued, place)]
        return (ahead[-1].name if ahead else None), True


def _normal_place_guard(
    queue: bytes, place: Place, exclusive: bool, own: dict[str, Any]
) -> list[list[dict[str, Any]]]:
    """``guard``'s alternatives for a normal ``place`` (its compare: ``own``): no front
    place (a shared one: no exclusive front place), no place of a higher band, and none of
    our band (a shared one: its exclusive places) created before ours."""
    higher = [_none_between(*span) for span in _higher_bands(queue, place.priority)]
    low, high = _band(queue, place.priority, None if exclusive else "X")
    newer = _all_created_between(low, high, "GREATER", place.revision - 1)
    if exclusive:  # (ours is in our band: never empty)
        return [[own, _none_in(queue + b"F"), *higher, newer]]
    common = [own, _none_in(queue + b"FX"), *higher]
    return [[*common, _none_between(low, high)], [*common, newer]]


def _none_in(start: bytes) -> dict[str, Any]:
    """A compare that holds while no key starts with ``start``."""
    return {**absent(start), "range_end": b64(prefix_end(start))}


def _none_between(low: bytes, high: bytes) -> dict[str, Any]:
    """A compare that holds while no key lies in [low, high)."""
    return {**absent(low), "range_end": b64(high)}


def _all_created_between(low: bytes, high: bytes, result: str, than: int) -> dict[str, Any]:
    """``_all_created`` over the keys in [low, high)."""
    return {**_all_created(low, result, than), "range_end": b64(high)}


def _band(queue: bytes, priority: int, mode_letter: str | None = None) -> tuple[bytes, bytes]:
    """The names of priority ``priority``'s normal places in ``queue`` (only those of
    ``mode_letter``, S or X, when given), as a range [low, high)."""
    code = priority_code(priority).encode()
    if not code and mode_letter is None:  # priority 0: NS..., NX... (an older tasklock's too)
        return queue + b"NS", queue + b"NY"
    start = queue + b"N" + code + (mode_letter or "").encode()
    return start, prefix_end(start)


def _higher_bands(queue: bytes, priority: int) -> list[tuple[bytes, bytes]]:
    """The ranges of the bands above ``priority``'s (none above 100)."""
    low = queue + b"N0"  # the first band, 100's (N000)
    high = _band(queue, priority)[0] if priority else queue + b"N:"
    return [(low, high)] if low < high else []


def _all_created(start: bytes, result: str, than: int) -> dict[str, Any]:
    """A compare that holds while every key starting with ``start`` was created
    ``result`` (GREATER, LESS) than revision ``than``. An empty range is compared as one
    key created at 0: LESS holds there, GREATER does not."""
    return {
        "key": b64(start),
        "range_end": b64(prefix_end(start)),
        "target": "CREATE",
        "result": result,
        "create_revision": str(than),
    }


def _deletes_but(start: bytes, end: bytes, kept: bytes) -> list[dict[str, Any]]:
    """Delete ops for the keys from ``start`` to ``end``, ``kept`` excepted."""
    if not start <= kept < end:
        return [{"request_delete_range": {"key": b64(start), "range_end": b64(end)}}]
    ranges = [(start, kept), (kept + b"\0", end)]
    return [
        {"request_delete_range": {"key": b64(low), "range_end": b64(high)}}
        for low, high in ranges
        if low < high
    ]


def _ahead(placed: list[Queued], entry: bytes | None) -> list[Queued]:
    """The places ahead of ``entry`` (all of them for a caller with none)."""
    names = [queued.name for queued in placed]
    return placed[: names.index(entry)] if entry in names else placed


def _keeps_out(ahead: list[Queued], mode: str, place: Place | None) -> bool:
    """Whether the places ``ahead`` keep a ``mode`` caller (at ``place``) out."""
    if mode == SHARED:
        return any(_blocks_shared(queued, place) for queued in ahead)
    return bool(ahead)


def _blocks_shared(queued: Queued, place: Place | None) -> bool:
    """Whether ``queued``, ahead of a shared caller at ``place``, keeps it out (as ``guard``
    says): an exclusive place, or a normal place of a higher band than ours (of any band
    but 0 for a caller without a place)."""
    if queued.mode == EXCLUSIVE:
        return True
    if queued.front:
        return False
    if place is None:
        return queued.priority != 0
    return not place.front and queued.priority > place.priority


def waiter_value(holder: Holder, sent: float, ask: Ask | None = None) -> bytes:
    """A place's value: the waiter's holder record (with its priority) and when it came
    (ms, its clock)."""
    record = holder.to_dict() if ask is None else place_record(holder, ask)
    return json.dumps({"holder": record, "since": int(sent * 1000)}).encode()


def poll_until(deadline: float, wake_fd: int | None, done: Callable[[], bool]) -> bool:
    """Ask ``done()`` every POLL_S until it is True; False at the deadline or on wake_fd."""
    while True:
        with contextlib.suppress(TasklockError, EtcdError, OSError):
            if done():
                return True
        left = deadline - time.monotonic()
        if left <= 0 or wait_readable([wake_fd], min(POLL_S, left)):
            return False
