"""Importing a module's name on first use (PEP 562), so a package can name its class
without importing what the class needs; a module's stand-in, for a third party's import
that would load what a run never uses (the drivers' modules: ``stores/*/driver.py``)."""

from __future__ import annotations

import sys

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
else:
    ModuleType = type(sys)  # (the same class, without importing types)


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


class StandIn(ModuleType):
    """A module's stand-in in ``sys.modules`` while a third party is imported: the names set
    on it answer themselves; any other name is the real module's, imported on first use
    (``real_module``)."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):  # the import machinery's questions (__path__, __spec__...)
            raise AttributeError(name)
        return getattr(real_module(self.__name__), name)


def real_module(name: str) -> ModuleType:
    """The module ``name`` itself, imported now if it is not yet, or if only its stand-in
    is in ``sys.modules`` (which it then replaces)."""
    module = sys.modules.get(name)
    if module is None or isinstance(module, StandIn):
        sys.modules.pop(name, None)
        module = import_module(name)
    return module
