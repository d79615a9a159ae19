"""Importing tasklock's own modules with less of importlib's search: the command's start.

A `run` imports some 60 of them, and importlib's path finder spends about 20 µs on each
before its code runs: the directory stat'ed for changes, each suffix tried, the source
stat'ed twice, the cached bytecode's header checked in Python. ``PackageFinder``, first in
``sys.meta_path``, finds a package's modules from one listing of each of its directories,
and its loader (importlib's own ``SourceFileLoader``, with a shorter ``get_code``) runs the
cached bytecode when its header names the source's current mtime and size: importlib's
own check. Anything else (no cached bytecode, a hash-based one, another Python's, a stale
one) goes importlib's way, which also writes the cache. Paired, regular installs, `run --
true` on SQLite: 0.96 of its time without it.

``cli.entry`` installs it for the command alone: programs using the Python API import as
usual.
"""

from __future__ import annotations

import _imp
import _io
import marshal
import os
import sys

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib import _bootstrap_external as _external
    from importlib.machinery import ModuleSpec
    from importlib.machinery import SourceFileLoader
    from types import CodeType
else:
    _external = sys.modules.get("_frozen_importlib_external")  # importlib's, loaded at start
    if _external is None:  # (an interpreter that does not freeze it)
        from importlib import _bootstrap_external as _external
    SourceFileLoader = _external.SourceFileLoader
_CODE = type(sys._getframe().f_code)  # types.CodeType, without importing types
#: The header of bytecode cached by timestamp (flags 0) for this Python.
_TIMESTAMP_HEADER = _external.MAGIC_NUMBER + b"\0\0\0\0"


class SourceLoader(SourceFileLoader):
    """importlib's ``SourceFileLoader`` (its source, resources and cache writing), whose
    ``get_code`` takes current bytecode without importlib's steps in Python."""

    def get_code(self, fullname: str) -> CodeType | None:
        source = self.path
        try:
            cached = _external.cache_from_source(source)  # (sys.pycache_prefix too)
            stat = os.stat(source)
            with _io.open_code(cached) as file:
                data = file.read()
        except (OSError, NotImplementedError):
            return self._importlibs(fullname)
        if (
            data[:8] == _TIMESTAMP_HEADER
            and int.from_bytes(data[8:12], "little") == int(stat.st_mtime) & 0xFFFFFFFF
            and int.from_bytes(data[12:16], "little") == stat.st_size & 0xFFFFFFFF
        ):
            try:
                code = marshal.loads(memoryview(data)[16:])
            except (EOFError, ValueError, TypeError):
                code = None
            if not isinstance(code, _CODE):
                return self._importlibs(fullname)  # a truncated or foreign cache
            _imp._fix_co_filename(code, source)  # type: ignore[attr-defined]  # (a moved tree)
            return code
        return self._importlibs(fullname)

    def _importlibs(self, fullname: str) -> CodeType | None:
        """importlib's ``get_code``; a source gone since the listing (a package upgraded
        under a long run) is a module not found, as importlib's finder would have said."""
        try:
            return super().get_code(fullname)
        except FileNotFoundError:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname) from None


class PackageFinder:
    """Finds the modules and subpackages of ``package`` (imported already) from a listing
    of each of its directories, read once, in importlib's order (a package before a module
    of the same name); None for anything else, which importlib's finders then look for (a
    name not listed, an extension module, a package of several directories)."""

    def __init__(self, package: str) -> None:
        self._prefix = package + "."
        self._listings: dict[str, frozenset[str]] = {}
        self._extensions = tuple(_imp.extension_suffixes())

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: object = None
    ) -> ModuleSpec | None:
        if path is None or len(path) != 1 or not fullname.startswith(self._prefix):
            return None
        directory = path[0]
        name = fullname.rpartition(".")[2]
        listing = self._listing(directory)
        if name in listing and "__init__.py" in self._listing(f"{directory}/{name}"):
            location, search = f"{directory}/{name}/__init__.py", [f"{directory}/{name}"]
        elif name + ".py" in listing:
            location, search = f"{directory}/{name}.py", None
        else:
            return None
        if any(name + suffix in listing for suffix in self._extensions):
            return None  # importlib would take the extension module (a compiled build)
        loader = SourceLoader(fullname, location)
        return _external.spec_from_file_location(
            fullname, location, loader=loader, submodule_search_locations=search
        )

    def _listing(self, directory: str) -> frozenset[str]:
        listing = self._listings.get(directory)
        if listing is None:
            try:
                listing = frozenset(os.listdir(directory))
            except OSError:  # not a directory (a module's name), or unreadable
                listing = frozenset()
            self._listings[directory] = listing
        return listing

    def invalidate_caches(self) -> None:
        """``importlib.invalidate_caches``: list the directories again."""
        self._listings.clear()


def install(package: str = "tasklock_cli") -> None:
    """Put a ``PackageFinder`` of ``package`` first in ``sys.meta_path`` (once)."""
    prefix = package + "."
    if not any(getattr(finder, "_prefix", None) == prefix for finder in sys.meta_path):
        sys.meta_path.insert(0, PackageFinder(package))
