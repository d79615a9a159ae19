"""``--once-per``'s windows (run.windows): aligned to the Unix epoch on the store's clock."""

from __future__ import annotations

from datetime import datetime

import pytest

from tasklock_cli.run.windows import done_in_window
from tasklock_cli.run.windows import window_start
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import RunRecord


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text)


def _success(started_at: datetime) -> RunRecord:
    holder = Holder(host="h", pid=1, user="u")
    return RunRecord("k", 1, holder, started_at, 0, "succeeded")


@pytest.mark.parametrize(
    ("now", "period", "start"),
    [
        ("2024-05-01T13:59:59.999999+00:00", 3600, "2024-05-01T13:00:00+00:00"),
        ("2024-05-01T14:00:00+00:00", 3600, "2024-05-01T14:00:00+00:00"),
        ("2024-05-01T23:30:00+00:00", 86400, "2024-05-01T00:00:00+00:00"),
        ("1970-01-01T00:00:04.400+00:00", 1.5, "1970-01-01T00:00:03+00:00"),
        ("2024-05-01T14:00:03.5+00:00", 2, "2024-05-01T14:00:02+00:00"),
    ],
)
def test_once_per_windows_are_aligned_to_the_unix_epoch(now, period, start):
    assert window_start(_utc(now), period) == _utc(start)


def test_a_window_is_done_by_a_success_that_started_in_it():
    now = _utc("2024-05-01T14:20:00+00:00")
    assert done_in_window(_success(_utc("2024-05-01T14:00:00+00:00")), now, 3600)
    assert done_in_window(_success(_utc("2024-05-01T14:25:00+00:00")), now, 3600)  # clock back
    assert not done_in_window(_success(_utc("2024-05-01T13:59:59.999999+00:00")), now, 3600)
    assert not done_in_window(None, now, 3600)
