"""Importing a module's name on first use (PEP 562), so a package can name its class
without importing what the class needs."""

from __future__ import annotations

import sys

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType


def import_module(name: str) -> ModuleType:
    """``importlib.import_module(name)`` for an absolute ``name``, without importing
    importlib (it brings warnings: ~0.7 ms of every start)."""
    __import__(name)
    return sys.modules[name]


def import_on_first_use(package: str, module: str, name: str) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``name`` from its ``module``
    when it is first asked for (PEP 562)."""

    def attribute(wanted: str) -> object:
        if wanted != name:
            raise AttributeError(f"module {package!r} has no attribute {wanted!r}")
        return getattr(import_module(f"{package}.{module}"), name)

    return attribute
