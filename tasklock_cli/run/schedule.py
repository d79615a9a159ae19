"""When `run` renews a lease, and the margins that follow: ``RenewalSchedule``, derived
from the lease's ttl (or its store's failover window) and ``--renew-every`` alone.

Its own module, below both ``run.options`` (``RunOptions.schedule``) and ``run.heartbeat``
(which renews on it and takes the RunOptions): the benchmark's restated heartbeat
(bench/heartbeat.py) uses the same schedule without a run.
"""

from __future__ import annotations

from tasklock_cli.util.records import dataclass


@dataclass(frozen=True)
class RenewalSchedule:
    """When `run` renews a lease of ``ttl``: the one definition of the schedule (the
    wrapper's RunOptions and the benchmark's restated heartbeat both use it)."""

    ttl: float
    renew_every: float | None = None  # --renew-every; None: ttl/3

    @property
    def safety_margin(self) -> float:
        """Kept between the child's SIGKILL and the local deadline."""
        return min(1.0, max(0.05, self.ttl * 0.05))

    @property
    def renew_interval(self) -> float:
        """--renew-every (ttl/3 by default), but never so close to the ttl that the first
        renewal would come after the child had to be stopped."""
        wanted = self.renew_every if self.renew_every is not None else self.ttl / 3
        return min(wanted, (self.ttl - self.safety_margin) * 0.75)

    @property
    def renew_retry_interval(self) -> float:
        return max(0.05, min(1.0, self.renew_interval / 4))

    @property
    def io_timeout(self) -> float:
        return max(0.25, min(5.0, self.renew_interval / 2))


def renewal_schedule(ttl: float, renew_every: float | None = None) -> RenewalSchedule:
    """`run`'s renewal schedule for ``ttl`` and ``--renew-every`` (None: its default)."""
    return RenewalSchedule(ttl, renew_every)
