"""The Redis store's break watches (``BreakWatches`` in base.py runs them).

A holder waiting for a break SUBSCRIBEs to its lease's break channel.
It does so on a connection of its own, made at its first wait and kept until release.
Then it looks at the lease once.

Why pub/sub rather than a per-lease list to BLPOP:

- The holder selects on the subscription's socket together with ``wake_fd``.
- So it can stop at any moment.
- There is no blocked command to cancel, and nothing is left on the server.
- A message published before the subscription is not needed.
  The look after subscribing sees the break.
"""

from __future__ import annotations

import contextlib
import time

import redis
import redis.exceptions as rexc

from tasklock_cli.stores.model import Lease
from tasklock_cli.stores.redis.connection import RedisConnection
from tasklock_cli.stores.watches import SocketBreakWatch


class BreakSubscription(SocketBreakWatch):
    """A holder's own subscription to its lease's break channel."""

    def __init__(self, pubsub: redis.client.PubSub, channel: bytes) -> None:
        super().__init__()
        self.pubsub = pubsub
        self.channel = channel

    def subscribe(self, timeout: float) -> None:
        """SUBSCRIBE and wait for the server's confirmation (from then on nothing is missed)."""
        self.pubsub.subscribe(self.channel)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            message = self.pubsub.get_message(timeout=deadline - time.monotonic())
            if message is not None and message["type"] == "subscribe":
                return
        raise rexc.TimeoutError(f"no answer to SUBSCRIBE within {timeout:g} s")

    def _fileno(self) -> int:
        sock = self.pubsub.connection._sock if self.pubsub.connection else None
        if sock is None:
            raise rexc.ConnectionError("the subscription's connection is closed")
        return sock.fileno()

    def _heard(self) -> bool:
        """Read every message already here (redis-py may buffer several); never blocks."""
        heard = False
        while (message := self.pubsub.get_message(timeout=0)) is not None:
            heard |= message["type"] == "message" and message["channel"] == self.channel
        return heard

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.pubsub.close()


def open_break_subscription(conn: RedisConnection, lease: Lease) -> tuple[BreakSubscription, bool]:
    """A new subscription for the lease, and whether the lease was found broken on making
    it."""
    channel = conn.names.break_channel(lease.key, lease.fencing_token)
    subscription = BreakSubscription(conn.client.pubsub(), channel)
    try:
        subscription.subscribe(conn.io_timeout)  # confirmed before the look
        intact = conn.script(
            "intact",
            [conn.names.lease(lease.key, lease.slot)],
            [lease.owner_token, lease.fencing_token],
            lease.key,
        )
    except BaseException:
        subscription.close()
        raise
    return subscription, int(intact) != 1
