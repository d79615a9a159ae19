"""The SQLite driver, imported without what a plain run never uses.

The store uses ``_sqlite3``, the C module that the ``sqlite3`` package re-exports
(``connect``, ``Connection`` and the errors are the same objects): the package's dbapi2
imports ``datetime`` (~6 M instructions of every `run`) for date adapters tasklock never
uses. Other Pythons, without that C module: the package.

``_sqlite3`` itself reads ``functools.lru_cache`` when it is imported (its statement cache),
and ``functools`` brings ``collections`` with ``operator``, ``keyword``, ``reprlib`` and
``types``: about 1 ms of a 7 ms interpreter start, for one function. In the `tasklock`
command's own process (``util.own_process``, one thread while it imports) its import gets
a stand-in ``functools`` whose ``lru_cache`` builds the same cache, from ``_functools``
(the C half that ``functools.lru_cache`` itself wraps); the stand-in is gone once
``_sqlite3`` is loaded, so any later ``import functools`` gets the real module (and any
other name asked of the stand-in is the real module's). Where
``functools`` is loaded already (a program using the Python API), or the stand-in does not
serve, ``_sqlite3`` is imported as it is.

Import the driver from here (``connection`` re-exports it): whichever module of the store
is imported first must not load it with all of that.
"""

from __future__ import annotations

import sys

from tasklock_cli.util.lazy import StandIn

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import sqlite3
    from collections.abc import Callable


def _lru_cache(maxsize: int | None = 128, typed: bool = False) -> Callable:
    """``functools.lru_cache(maxsize)`` as ``_sqlite3`` calls it: a decorator making the C
    cache ``functools`` makes. (Its ``cache_info``, which ``_sqlite3`` never calls, would
    fail: the named tuple is ``functools``'.)"""
    import _functools  # type: ignore[import-not-found]

    if isinstance(maxsize, int) and maxsize < 0:
        maxsize = 0  # (as functools.lru_cache)

    def decorating(function: Callable) -> Callable:
        return _functools._lru_cache_wrapper(function, maxsize, typed, tuple)

    return decorating


def _import_lean() -> None:
    """Import ``_sqlite3`` with the stand-in ``functools`` where that is safe (see above)."""
    import tasklock_cli.util as util

    if "_sqlite3" in sys.modules or "functools" in sys.modules or not util.own_process:
        return
    stand_in = StandIn("functools")  # any other name: the real module's
    stand_in.lru_cache = _lru_cache  # type: ignore[attr-defined]
    sys.modules["functools"] = stand_in
    try:
        import _sqlite3  # noqa: F401
    except Exception:  # no C module, or one that wants more of functools: imported below
        sys.modules.pop("_sqlite3", None)
    finally:
        if sys.modules.get("functools") is stand_in:
            del sys.modules["functools"]


if not TYPE_CHECKING:
    _import_lean()
    try:
        import _sqlite3 as sqlite3
    except ImportError:  # not CPython
        import sqlite3

__all__ = ["sqlite3"]
