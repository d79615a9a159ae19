"""A record read from a store, shown to people: a field that could not be read as ``?``,
and what was wrong with the record, in words.

A record read defensively (``stores.rows``) names its unreadable fields in ``malformed``,
as pairs of field and why. Those fields hold placeholders (0, ``?``, the epoch), which
must not be shown as if they were the store's: the table renderer (``cli.render``) and a
conflict's message (``run.conflict``, which the Python API's errors carry too) show them
through these. JSON output shows them as null instead (``stores.model``).
"""

from __future__ import annotations

#: How a field that could not be read is shown, whatever its placeholder.
UNREADABLE_SHOWN = "?"


def unreadable(malformed: tuple, name: str) -> bool:
    """Whether ``malformed`` names field ``name`` or its record (``holder`` for
    ``holder.pid``)."""
    part = name.partition(".")[0]
    return any(bad in (name, part) for bad, _ in malformed)


def shown(malformed: tuple, name: str, value: object) -> str:
    """Field ``name`` as text: ``?`` when it could not be read (``unreadable``)."""
    return UNREADABLE_SHOWN if unreadable(malformed, name) else str(value)


def problems(malformed: tuple) -> str:
    """What was wrong with a malformed record, in words ('' for a good one)."""
    return "; ".join(f"{name} {why}" for name, why in malformed)
