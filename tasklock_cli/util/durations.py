"""Durations: ``500ms``, ``30s``, ``5m``, ``1h30m``, ``2d``, bare seconds, ``inf``."""

from __future__ import annotations

from tasklock_cli.errors import UsageError

_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DIGITS = frozenset("0123456789")  # ASCII only: str.isdigit takes other scripts' too
#: The longest finite duration: 100 years. Longer ones are typos (``inf`` says "for ever"
#: where an option takes it); they would overflow the clocks, sleeps and timestamps they
#: reach (``99999999999999999999999`` seconds is past year 9999), some only after the
#: lock was taken.
MAX_DURATION_S = 36500 * 86400.0
#: ``inf``: for ever (``math.inf``, without loading ``math`` on `run`'s path).
INFINITY = float("inf")


def parse_duration(text: str, *, option: str = "duration", allow_inf: bool = True) -> float:
    """Return seconds (``INFINITY`` for ``inf``); raise UsageError on anything else."""
    raw = text.strip().lower()
    if raw in ("inf", "infinity") and allow_inf:
        return INFINITY
    seconds = _finite_seconds(raw)
    or_inf = " or inf" if allow_inf else ""
    if seconds is None:
        raise UsageError(f"invalid {option} {text!r} ({duration_examples(allow_inf)})")
    if not seconds <= MAX_DURATION_S:
        raise UsageError(f"invalid {option} {text!r} (at most 36500d, 100 years{or_inf})")
    return seconds


def _finite_seconds(raw: str) -> float | None:
    """The seconds ``raw`` (stripped, lower case) writes, or None when it is no duration:
    a number (``1.5``), or parts of a number and a unit (``1h30m``). ASCII digits only. A
    number too long for a float gives ``inf``, which the caller's bound refuses. (Read by
    hand, not with re: ~2.5 ms of the start of every `run` given a duration.)"""
    if not raw.isascii():
        return None
    if 0 < _number_end(raw, 0) == len(raw):
        return float(raw)
    parts = _parts(raw)
    if parts and _units_in_order(parts):
        return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    return None


def _parts(raw: str) -> list[tuple[str, str]] | None:
    """``raw`` as parts of a number and a unit (``1h30m``: ``[("1", "h"), ("30", "m")]``),
    or None when it is not made of them alone. ``ms`` is read before ``m``."""
    parts = []
    at = 0
    while at < len(raw):
        end = _number_end(raw, at)
        unit = "ms" if raw.startswith("ms", end) else raw[end : end + 1]
        if end == at or unit not in _UNIT_SECONDS:
            return None
        parts.append((raw[at:end], unit))
        at = end + len(unit)
    return parts


def _number_end(raw: str, at: int) -> int:
    """Where the number starting at ``at`` ends: digits, then a dot and digits if both are
    there (``1.5``; ``1.`` is the number ``1`` and a dot); ``at`` when no digit is there."""
    end = _digits_end(raw, at)
    if end > at and raw.startswith(".", end):
        fraction_end = _digits_end(raw, end + 1)
        if fraction_end > end + 1:
            return fraction_end
    return end


def _digits_end(raw: str, at: int) -> int:
    while at < len(raw) and raw[at] in _DIGITS:
        at += 1
    return at


def duration_examples(allow_inf: bool = True) -> str:
    """What a duration may look like, for a message about one that is not."""
    expected = "e.g. 500ms, 30s, 5m, 1h30m, 2d, a number of seconds"
    return expected + " or inf" if allow_inf else expected


def _units_in_order(parts: list[tuple[str, str]]) -> bool:
    """Reject ``5s1h`` and ``1m1m``: units must appear once, largest first."""
    order = ["d", "h", "m", "s", "ms"]
    positions = [order.index(unit) for _, unit in parts]
    return positions == sorted(set(positions))


def format_duration(seconds: float) -> str:
    """Compact human form: ``1h30m``, ``12s``, ``250ms``, ``inf``."""
    if seconds in (INFINITY, -INFINITY):
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
