"""Durations: ``500ms``, ``30s``, ``5m``, ``1h30m``, ``2d``, bare seconds, ``inf``."""

from __future__ import annotations

import math

from tasklock_cli.errors import UsageError

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART_PATTERN = r"(\d+(?:\.\d+)?)(ms|s|m|h|d)"
_BARE_NUMBER_PATTERN = r"\d+(?:\.\d+)?"
#: The longest finite duration: 100 years. Longer ones are typos (``inf`` says "for ever"
#: where an option takes it); they would overflow the clocks, sleeps and timestamps they
#: reach (``99999999999999999999999`` seconds is past year 9999), some only after the
#: lock was taken.
MAX_DURATION_S = 36500 * 86400.0


class _Patterns:
    """Compiled on first use: a `run` without duration flags never imports re (~2.5 ms)."""

    _compiled: _Patterns | None = None

    def __init__(self) -> None:
        import re

        self.part = re.compile(_PART_PATTERN)
        self.bare_number = re.compile(_BARE_NUMBER_PATTERN)

    @classmethod
    def compiled(cls) -> _Patterns:
        if cls._compiled is None:
            cls._compiled = cls()
        return cls._compiled


def parse_duration(text: str, *, option: str = "duration", allow_inf: bool = True) -> float:
    """Return seconds (``math.inf`` for ``inf``); raise UsageError on anything else."""
    raw = text.strip().lower()
    if raw in ("inf", "infinity") and allow_inf:
        return math.inf
    seconds = _finite_seconds(raw)
    or_inf = " or inf" if allow_inf else ""
    if seconds is None:
        raise UsageError(f"invalid {option} {text!r} ({duration_examples(allow_inf)})")
    if not seconds <= MAX_DURATION_S:
        raise UsageError(f"invalid {option} {text!r} (at most 36500d, 100 years{or_inf})")
    return seconds


def _finite_seconds(raw: str) -> float | None:
    """The seconds ``raw`` (stripped, lower case) writes, or None when it is no duration.
    ASCII digits only (``\\d`` would take other scripts' digits). A number too long for a
    float gives ``inf``, which the caller's bound refuses."""
    patterns = _Patterns.compiled()
    if not raw.isascii():
        return None
    if patterns.bare_number.fullmatch(raw):
        return float(raw)
    part = patterns.part
    if raw and part.sub("", raw) == "" and _units_in_order(raw):
        return sum(float(n) * _UNIT_SECONDS[u] for n, u in part.findall(raw))
    return None


def duration_examples(allow_inf: bool = True) -> str:
    """What a duration may look like, for a message about one that is not."""
    expected = "e.g. 500ms, 30s, 5m, 1h30m, 2d, a number of seconds"
    return expected + " or inf" if allow_inf else expected


def _units_in_order(raw: str) -> bool:
    """Reject ``5s1h`` and ``1m1m``: units must appear once, largest first."""
    order = ["d", "h", "m", "s", "ms"]
    positions = [order.index(unit) for _, unit in _Patterns.compiled().part.findall(raw)]
    return positions == sorted(set(positions))


def format_duration(seconds: float) -> str:
    """Compact human form: ``1h30m``, ``12s``, ``250ms``, ``inf``."""
    if math.isinf(seconds):
        return "inf"
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.1f}s".replace(".0s", "s")
    whole = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts[:2])
