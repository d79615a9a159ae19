"""Breaking a slot of the etcd store, and its holder hearing of it.

A break moves the slot's keys to a new lease, the breaker's.
That lease is granted for the time the old one had left.
A broken mark goes on it too.
Then the break revokes the old lease.

- The holder's keepalive fails at once.
- Nobody else can take the slot meanwhile.
- The fencing token (create_revision) stays the same.

The holder watches its slot's key for that move, or its deletion.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.etcd import http
from tasklock_cli.stores.etcd.connection import EtcdClient
from tasklock_cli.stores.etcd.connection import EtcdError
from tasklock_cli.stores.etcd.connection import b64
from tasklock_cli.stores.etcd.connection import is_delete
from tasklock_cli.stores.etcd.connection import kvs_of
from tasklock_cli.stores.etcd.connection import new_lease_id
from tasklock_cli.stores.etcd.connection import unb64
from tasklock_cli.stores.etcd.keys import EtcdKeys
from tasklock_cli.stores.etcd.keys import SlotKv
from tasklock_cli.stores.etcd.keys import moves_to_lease
from tasklock_cli.stores.etcd.keys import range_op
from tasklock_cli.stores.etcd.waiting import poll_until
from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.util.fds import wait_readable

#: How long a holder that saw its slot's key move or go waits for its etcd lease's revoke
#: (``SlotBreaker.revoked_after_change``), and how often it looks meanwhile.
REVOKE_WAIT_S = 0.5
REVOKE_POLL_S = 0.005


class SlotBreaker:
    """Breaks slots, and waits for the break of a slot of ours."""

    def __init__(self, client: EtcdClient, keys: EtcdKeys) -> None:
        self._client = client
        self._keys = keys

    def break_slot(self, held: SlotKv, already_broken: bool, by: bytes) -> LeaseInfo | None:
        """Break the slot as read (``held``) in the name of ``by`` (JSON); what it was, or
        None when its lease ran out or another holder has it now."""
        mark = self._keys.broken_key(held.key, held.slot)
        for attempt in range(5):
            if attempt:
                reread = self._reread(held, mark)
                if reread is None:
                    return None
                held, already_broken = reread
            remaining = self._client.remaining(held.lease_id) if held.lease_id else -1.0
            info = self._keys.info(held, remaining)
            if info is None:
                continue
            if already_broken:
                return info
            # At least what the old lease can have left: etcd answered whole seconds cut
            # down, and ``remaining`` is their middle. Nothing is taken off for the time
            # since the answer: a stall here must not make the broken key free early.
            left = max(1, math.ceil(remaining + 0.5))
            if self._move_to_new_lease(held, mark, left, by):
                self._client.revoke(held.lease_id)
                return info
        return None

    def _reread(self, held: SlotKv, mark: bytes) -> tuple[SlotKv, bool] | None:
        """The slot read again (and whether it is broken); None once another lease holds it."""
        name = self._keys.slot_key(held.key, held.slot, held.limit, held.mode)
        reply = self._client.txn([], [range_op(name), range_op(mark)], [])
        lock_kvs, broken_kvs = (kvs_of(r) for r in reply.get("responses", []))
        if not lock_kvs or int(lock_kvs[0]["create_revision"]) != held.token:
            return None
        broken = bool(broken_kvs) and unb64(broken_kvs[0].get("value")) == str(held.token).encode()
        return held._replace(kv=lock_kvs[0]), broken

    def _move_to_new_lease(self, held: SlotKv, mark: bytes, ttl_s: int, by: bytes) -> bool:
        new_id = new_lease_id()
        name = b64(self._keys.slot_key(held.key, held.slot, held.limit, held.mode))
        names = self._keys.slot_names(held.key, held.slot, held.limit, held.owner, held.mode)
        put_mark = {"key": b64(mark), "value": b64(str(held.token).encode()), "lease": str(new_id)}
        by_key = self._keys.broken_by_key(held.key, held.slot)
        put_by = {"key": b64(by_key), "value": b64(by), "lease": str(new_id)}
        txn = {
            "compare": [
                {"key": name, "target": "CREATE", "create_revision": str(held.token)},
                {"key": name, "target": "LEASE", "lease": str(held.lease_id)},
            ],
            "success": [
                *moves_to_lease(names, new_id),
                {"request_put": put_mark},
                {"request_put": put_by},
            ],
            "failure": [],
        }
        return self._client.on_new_lease(new_id, ttl_s, txn) is not None

    def broken_by(self, lease: Lease) -> bytes | None:
        """Who broke ``lease`` (JSON, as ``break_slot`` was given it); None when it is not
        broken."""
        mark = self._keys.broken_key(lease.key, lease.slot)
        by_key = self._keys.broken_by_key(lease.key, lease.slot)
        reply = self._client.txn([], [range_op(mark), range_op(by_key)], [])
        mark_kvs, by_kvs = (kvs_of(r) for r in reply.get("responses", []))
        if not mark_kvs or unb64(mark_kvs[0].get("value")) != str(lease.fencing_token).encode():
            return None
        return unb64(by_kvs[0].get("value")) if by_kvs else None

    def wait_for_break(
        self, lease: Lease, lease_id: int | None, timeout: float, wake_fd: int | None
    ) -> bool:
        """Block until the lease (on etcd lease ``lease_id``, when known) is broken or freed
        by force (True), ``timeout`` passes or wake_fd is readable (False). Opens a watch
        of the slot's key, then reads the key (a break before the watch began shows
        there); polls it when the watch fails."""
        deadline = time.monotonic() + max(0.0, timeout)

        def gone(kv: dict[str, Any] | None) -> bool:
            if kv is None or int(kv.get("create_revision", 0)) != lease.fencing_token:
                return True
            return lease_id is not None and int(kv.get("lease", 0)) != lease_id

        name = self._keys.slot_key(lease.key, lease.slot, lease.limit, lease.mode)
        try:
            watch = self._client.open_watch({"key": b64(name)})  # before the look
            try:
                kv, _ = self._client.range(name)
                if not gone(kv):
                    if lease_id is None:
                        lease_id = int(kv.get("lease", 0)) if kv else None
                    if watch.wait(deadline, wake_fd, _deleted_or(gone)) != "matched":
                        return False
            finally:
                watch.close()
            if lease_id is not None:
                self._until_revoked(lease_id, wake_fd)
            return True
        except (TasklockError, EtcdError, OSError, http.Woken):
            return poll_until(deadline, wake_fd, lambda: gone(self._client.range(name)[0]))

    def _until_revoked(self, lease_id: int, wake_fd: int | None) -> None:
        """Wait (at most REVOKE_WAIT_S) until etcd lease ``lease_id`` is gone.

        A break moves the slot's keys to the breaker's lease, then revokes ours, a round
        trip later; a forced release revokes it too. The holder renews to check what it saw.
        A keepalive of our emptied lease between the two would succeed, and the holder would
        find out only at its next look, a second later (``release --force`` then said "let go
        after 1.01s"). Waiting for the revoke makes that renewal fail at once. A slot that
        ran out or was released has its lease gone already, or a wake_fd that ends this."""
        give_up = time.monotonic() + REVOKE_WAIT_S
        while self._client.remaining(lease_id) >= 0 and time.monotonic() < give_up:
            if wait_readable([wake_fd], REVOKE_POLL_S):
                return


def _deleted_or(
    gone: Callable[[dict[str, Any] | None], bool],
) -> Callable[[dict[str, Any]], bool]:
    """Matches a watch event that deletes the key or leaves it ``gone`` (another lease)."""
    return lambda event: is_delete(event) or gone(event.get("kv"))
