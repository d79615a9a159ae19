"""What every layer uses and that knows nothing of locks: clocks, durations, whole
numbers, key rules, the sanitiser of foreign text, a malformed record's fields shown, data
classes and paths without their costly imports, file descriptors, times, lazy imports;
``suppressed``, below.
"""

from __future__ import annotations


class suppressed:
    """``contextlib.suppress`` without ``contextlib``: that module costs ~2.5 M instructions
    (~0.7 ms) of every `run`. ``with suppressed(OSError): ...`` ends the block quietly on
    those exceptions (their subclasses too), as ``suppress`` does."""

    __slots__ = ("_kinds",)

    def __init__(self, *kinds: type[BaseException]) -> None:
        self._kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, value: object, traceback: object) -> bool:
        return kind is not None and issubclass(kind, self._kinds)
