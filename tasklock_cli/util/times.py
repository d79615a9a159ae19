"""Wall-clock times as the store and the contract show them: UTC, RFC 3339."""

from __future__ import annotations

from datetime import datetime
from datetime import timezone


def utc_from_timestamp(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=timezone.utc)


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
