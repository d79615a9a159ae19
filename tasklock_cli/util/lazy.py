"""Importing a module's name on first use (PEP 562), so a package can name its class
without importing what the class needs."""

from __future__ import annotations

from collections.abc import Callable


def import_on_first_use(package: str, module: str, name: str) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``name`` from its ``module``
    when it is first asked for (PEP 562)."""

    def attribute(wanted: str) -> object:
        if wanted != name:
            raise AttributeError(f"module {package!r} has no attribute {wanted!r}")
        from importlib import import_module

        return getattr(import_module(f"{package}.{module}"), name)

    return attribute
