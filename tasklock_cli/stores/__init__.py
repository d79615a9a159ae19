"""Opening a store from its URL (see ``registry``), importing its driver only then."""

from __future__ import annotations

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.registry import Driver
from tasklock_cli.stores.registry import known_schemes
from tasklock_cli.stores.registry import package_for_scheme
from tasklock_cli.stores.urls import default_store_url  # noqa: F401 - the package's names for them
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import scrub
from tasklock_cli.stores.urls import sqlite_url  # noqa: F401 - the package's names for them
from tasklock_cli.stores.urls import url_passwords
from tasklock_cli.stores.urls import url_scheme
from tasklock_cli.stores.urls import url_syntax_problem

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType


def open_store(url: str, allow_in_process: bool = False) -> Store:
    """The store ``url`` names, from the registry: its package reads the URL (a malformed
    one is refused here), its driver is imported now and only now. A store that lives in
    this process only (``memory://``) is refused unless ``allow_in_process``: a lock no
    other process sees excludes nobody."""
    scheme = url_scheme(url) if "://" in url else ""
    package = package_for_scheme(scheme)
    if package is None:
        known = ", ".join(f"{name}://" for name in known_schemes())
        raise ConfigError(f"unknown store URL {redact_url(url)!r} (expected one of {known})")
    if getattr(package, "IN_PROCESS", False) and not allow_in_process:
        raise ConfigError(
            f"{redact_url(url)!r} is an in-process store for tests: no other process sees "
            "its locks (the Python API takes it with Locks(..., allow_memory=True))"
        )
    problem = getattr(package, "url_problem", url_syntax_problem)(url)
    if problem:
        raise ConfigError(f"malformed store URL {redact_url(url)!r}: {problem}")
    try:
        store_class = getattr(package, package.__all__[0])
    except ImportError as exc:
        _say_which_driver(package, exc)
        raise
    try:
        return store_class.from_url(url)
    except TasklockError as exc:
        _scrubbed(exc, url)
        raise


def _scrubbed(exc: TasklockError, url: str) -> None:
    """``exc`` without the passwords of ``url``, wherever its message quotes the URL or a
    piece of it (a parameter's name, a port, a database that is a password's piece):
    every error of a URL's reading is scrubbed here, once."""
    secrets = url_passwords(url)
    if secrets:
        exc.args = (scrub(exc, sorted(secrets)), *exc.args[1:])


def _say_which_driver(package: ModuleType, exc: ImportError) -> None:
    """Turn the ImportError of the store package's driver (``DRIVER``) into one line naming
    the package to install; an ImportError of anything else (our own modules included, or
    of a store without a driver) stays a bug with its traceback (returns: the caller
    raises it again)."""
    driver: Driver | None = package.DRIVER
    if driver is None or not _raised_by(exc, driver.package):
        return
    message = f"the {package.TITLE} store needs the {driver.package} driver"
    if exc.name != driver.package:  # installed but broken or too old: say what failed
        message += f" ({str(exc).splitlines()[0] if str(exc) else exc.name})"
    raise ConfigError(f"{message}: pip install '{driver.install}'") from exc


def _raised_by(exc: ImportError, package: str) -> bool:
    """Whether ``package`` is what could not be imported: it (or a submodule) is missing, or
    the error comes from the package's own code (say psycopg without a libpq to load)."""
    if (exc.name or "").partition(".")[0] == package:
        return True
    import traceback

    frames = traceback.walk_tb(exc.__traceback__)
    return any(
        str(frame.f_globals.get("__name__", "")).partition(".")[0] == package for frame, _ in frames
    )
