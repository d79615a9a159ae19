"""Pieces of `tasklock doctor` shared by the stores."""

from __future__ import annotations

from tasklock_cli.stores.model import StoreCheck

#: A store clock further than this from ours is worth a warning (times shown look off).
CLOCK_WARN_S = 1.0


def clock_check(whose: str, offset: float, uncertainty: float, decides: str) -> StoreCheck:
    """The ``clock`` line: ``offset`` seconds of the store's clock from ours, measured to
    within ``uncertainty`` seconds; ``decides`` says what the store's clock is used for."""
    detail = (
        f"{whose} clock is {abs(offset) * 1000:.0f} ms "
        f"{'ahead of' if offset >= 0 else 'behind'} this machine's "
        f"(±{uncertainty * 1000:.1f} ms); {decides}"
    )
    if abs(offset) - uncertainty > CLOCK_WARN_S:
        detail += "; times shown by peek/list will look off on this machine"
        return StoreCheck("clock", True, detail, warning=True)
    return StoreCheck("clock", True, detail)


def warning(name: str, detail: str) -> StoreCheck:
    return StoreCheck(name, True, detail, warning=True)
