"""Suggestions for a mistyped name (an option, a config setting): only names close to it."""

from __future__ import annotations

from collections.abc import Iterable

#: How alike a mistyped name must be to a real one to be suggested: difflib's default (0.6)
#: offers --verbose for --bogus and --store for --json.
SUGGESTION_CUTOFF = 0.7


def close_names(mistyped: str, names: Iterable[str]) -> list[str]:
    """The names close to ``mistyped``, closest first (none when none is close)."""
    from difflib import get_close_matches  # only on a mistake: not every start's import

    return get_close_matches(mistyped, list(names), cutoff=SUGGESTION_CUTOFF)


def did_you_mean(mistyped: str, names: Iterable[str]) -> str:
    """``; did you mean 'ttl'?`` for the config settings close to a mistyped one; '' when
    none is. Compared as the options they stand for (``--tll`` and ``--ttl``), so that a
    setting gets the suggestion its option would: one typo in a short name weighs less
    beside the dashes."""
    close = [name[2:] for name in close_names(f"--{mistyped}", [f"--{name}" for name in names])]
    return f"; did you mean {' or '.join(repr(name) for name in close)}?" if close else ""
