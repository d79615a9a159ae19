"""A lock held by someone else: the error a run ends with, and how a holder is described."""

from __future__ import annotations

from tasklock_cli.errors import NotGranted
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.util.durations import format_duration


class Conflict(NotGranted):
    """The lock is held by someone else and the wait (if any) ran out. (Imported where one
    is raised or shown: a run that gets its lock never imports this module.)"""

    def __init__(
        self,
        key: str,
        holder: LeaseInfo | None,
        waited: float = 0.0,
        first_holder: LeaseInfo | None = None,
        holdup: str | None = None,
    ) -> None:
        self.key = key
        self.holder = holder
        self.waited = waited
        self.first_holder = first_holder
        self.holdup = holdup if holder is None else None
        if self.holdup:  # nobody holds it: say what keeps the key instead
            message = describe_holdup(key, waited, self.holdup)
        else:
            message = describe_conflict(key, holder, waited, first_holder)
        super().__init__(message)


def describe_holder(info: LeaseInfo) -> str:
    from tasklock_cli.util.display import shown

    holder, bad = info.holder, info.malformed
    pid = shown(bad, "holder.pid", holder.pid)
    token = shown(bad, "fencing_token", info.fencing_token)
    malformed = ", a malformed record" if bad else ""
    kept = ", its command ended: kept by --hold-at-least" if info.kept else ""
    return f"{holder.host} pid {pid} (user {holder.user}, token {token}{malformed}{kept})"


def describe_holdup(key: str, waited: float, holdup: str) -> str:
    """A key that nobody holds and the store would not grant (``Store.holdup`` says why)."""
    gave_up = f"gave up waiting {format_duration(waited)}: " if waited > 0 else ""
    return f"{gave_up}{key!r} is not granted: {holdup}"


def describe_conflict(
    key: str,
    info: LeaseInfo | None,
    waited: float = 0.0,
    first_holder: LeaseInfo | None = None,
) -> str:
    held = (
        f"{key!r} is held"
        if info is None or info.limit == 1
        else (f"all {info.limit} slots of {key!r} are held, the longest")
    )
    if waited <= 0:
        if info is None:
            return f"{held} by someone else"
        from tasklock_cli.util.display import shown

        until = shown(info.malformed, "expires_at", f"{info.expires_at:%Y-%m-%dT%H:%M:%SZ}")
        return f"{held} by {describe_holder(info)} until {until}"
    gave_up = f"gave up waiting {format_duration(waited)}: {held} by"
    if info is None:
        return f"{gave_up} someone else"
    if first_holder is not None and first_holder.fencing_token == info.fencing_token:
        # a fencing token names one acquisition: the same one at both ends held throughout
        return f"{gave_up} {describe_holder(info)}, who held it throughout"
    began = f" (by {describe_holder(first_holder)} when the wait began)" if first_holder else ""
    return f"{gave_up} {describe_holder(info)} now{began}"
