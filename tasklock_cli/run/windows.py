"""``--once-per``'s arithmetic: windows aligned to the Unix epoch on the store's clock."""

from __future__ import annotations

from datetime import datetime
from datetime import timedelta
from datetime import timezone

from tasklock_cli.stores.model import RunRecord

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def window_start(now: datetime, period: float) -> datetime:
    """The start of the window of ``period`` seconds that holds ``now``; windows are
    aligned to the Unix epoch (``1h``: each UTC hour). Exact to the microsecond."""
    length = timedelta(seconds=period)
    return EPOCH + ((now - EPOCH) // length) * length


def done_in_window(success: RunRecord | None, now: datetime, period: float) -> bool:
    """Whether ``success`` started in the window of ``period`` holding ``now`` (both times
    on the store's clock). A start after ``now`` (a clock stepped back) counts as in it."""
    return success is not None and success.started_at >= window_start(now, period)
