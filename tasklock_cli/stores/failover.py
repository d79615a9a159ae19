"""Failover epochs: the design the PostgreSQL, Redis and MySQL stores share.

Each store writes it in its own SQL or Lua.
The argument is in docs/design/postgres.md.

- A store records the server its primary was.
- An acquire that finds another starts a new epoch.
  So does a restart, where the store can tell.
- The new epoch is ``max(previous + 1, the server's clock in whole seconds)``.
- A new epoch's quarantine keeps every key from new holders for ``quarantine_length``.
- That length is the longest TTL recorded (at least the default ``--ttl``), plus a margin.
  So every lease the old primary may have granted has run out before a new one is granted.
- A key's next fencing token is ``max(counter + 1, epoch << EPOCH_SHIFT)``, below 2**63.
"""

from __future__ import annotations

import time

from tasklock_cli.stores.model import MAX_FENCING_TOKEN

#: Tokens of epoch ``e`` start at ``e << EPOCH_SHIFT``.
EPOCH_SHIFT = 30
#: The greatest epoch whose first token is a token (``e << EPOCH_SHIFT`` <= 2**63-1).
MAX_EPOCH = MAX_FENCING_TOKEN >> EPOCH_SHIFT
#: The quarantine is never shorter than this (s) plus the margin: the default ``--ttl``,
#: for leases whose TTL the new primary's record does not know of.
DEFAULT_TTL_S = 30.0
#: Added to the quarantine (s): a holder's send time before the server's clock, the
#: clocks of two servers.
QUARANTINE_MARGIN_S = 2.0
#: A recorded longest TTL above this (s, about 31 years) is no TTL a client asked for.
LONGEST_TTL_S = 1e9
#: The ``identity`` of a new lease table's epoch row when the run ledger beside it holds
#: runs: the table was lost (dropped) and made again, without its counters. Naming no
#: server, it has the first acquire start an epoch above the ledger's tokens.
RECREATED = "recreated"
#: Why such an epoch began, as the end of "epoch N began when ...".
RECREATED_CHANGE = "the table was made again beside the run ledger of a lost one"


def quarantine_length(max_ttl: float | None) -> float:
    """How long a new epoch's quarantine lasts (s), given the longest TTL recorded (s)."""
    return max(max_ttl or 0.0, DEFAULT_TTL_S) + QUARANTINE_MARGIN_S


def quarantine_text(change: str, scope: str, left: float | None) -> str | None:
    """What a quarantine with ``left`` seconds to run means, None when over or when none was
    recorded (``left`` None): ``change`` says what happened to the primary, ``scope`` what
    the quarantine covers ("table")."""
    if left is None or left <= 0:
        return None
    return (
        f"{change}: no new lease in this {scope} for {left:.1f}s more, until every lease "
        "the old primary may have granted has run out"
    )


def fresh_server_text(server: str, scope: str, left: float | None) -> str | None:
    """What the quarantine of a server that started a moment ago without any record of the
    ``scope`` means (``left`` s to run; None when over): it cannot tell new from restarted
    and emptied, and the operator can say which (``tasklock init``)."""
    if left is None or left <= 0:
        return None
    return (
        f"{server} started moments ago and has no record of this {scope}: it may have "
        "restarted and lost leases that still run, so no new lease for "
        f"{left:.1f}s more; if it is new (nothing was held before), run `tasklock init` "
        "to say so"
    )


class Quarantines:
    """The keys whose last acquire met a quarantine, when it ends (monotonic) and why."""

    def __init__(self) -> None:
        self._ends: dict[str, tuple[float, str]] = {}

    def met(self, key: str, left_ms: int | None, cause: str = "failover") -> None:
        """Our acquire of ``key`` met a quarantine with ``left_ms`` ms to run (None: none),
        for ``cause`` (the store's word: 'failover', 'fresh')."""
        if left_ms is None:
            self._ends.pop(key, None)
        else:
            self._ends[key] = (time.monotonic() + max(0, left_ms) / 1000, cause)

    def left(self, key: str) -> float:
        """Seconds left of the quarantine our last acquire of ``key`` met (0 or less: none)."""
        return self._ends.get(key, (0.0, ""))[0] - time.monotonic()

    def cause(self, key: str) -> str:
        """Why that quarantine was (its ``cause``; '' when none was met)."""
        return self._ends.get(key, (0.0, ""))[1]


def after_failover(length: float) -> str:
    """What a failover costs, for ``doctor``: ``length``, the quarantine's (s)."""
    return (
        f"after a failover, no new lease in the table for {length:g}s (the longest TTL "
        f"granted, at least {DEFAULT_TTL_S:g}s, + {QUARANTINE_MARGIN_S:g}s), then tokens "
        "above every earlier one"
    )
