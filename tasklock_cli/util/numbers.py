"""Whole numbers typed by people or written in URLs: ASCII decimal digits only.

``str.isdigit`` also accepts ``²`` and other scripts' digits, which ``int`` then refuses
(a ValueError where a clear error was meant) or reads (``٣`` as 3); ``int`` alone also
accepts ``+5``, `` 5`` and ``5_0``. These accept exactly ``[-]DIGITS``.
"""

from __future__ import annotations


def is_decimal(text: str, signed: bool = False) -> bool:
    """Whether ``text`` is ASCII digits (after one ``-`` when ``signed``)."""
    digits = text[1:] if signed and text.startswith("-") else text
    return digits.isascii() and digits.isdigit()


def decimal(text: str, low: int, high: int) -> int | None:
    """``text`` as an int from ``low`` to ``high``, or None when it is not ASCII digits
    (after one ``-`` when ``low`` is negative) or is out of range."""
    if not is_decimal(text, signed=low < 0) or len(text) > 40:
        return None
    value = int(text)
    return value if low <= value <= high else None
