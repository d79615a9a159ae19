"""Store registry: open a store from its URL, importing each driver only when its scheme is used."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tasklock_cli.errors import ConfigError
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.urls import default_store_url  # noqa: F401 - the package's names for them
from tasklock_cli.stores.urls import redact_url
from tasklock_cli.stores.urls import sqlite_url  # noqa: F401 - the package's names for them
from tasklock_cli.stores.urls import url_scheme
from tasklock_cli.stores.urls import url_syntax_problem
from tasklock_cli.util.records import dataclass

_SCHEMES = {
    "sqlite": "sqlite",
    "postgresql": "postgres",
    "postgres": "postgres",
    "redis": "redis",
    "rediss": "redis",
    "unix": "redis",
    "etcd": "etcd",
    "etcds": "etcd",
}


@dataclass(frozen=True)
class _Driver:
    """The third-party package a store module imports, and how to install it."""

    store: str  # as users name the store
    package: str  # the top-level import name
    install: str  # the pip requirement


_DRIVERS = {
    "postgres": _Driver("postgresql", "psycopg", "psycopg[binary]>=3.1"),
    "redis": _Driver("redis", "redis", "redis>=5"),
}


def open_store(url: str) -> Store:
    scheme = url_scheme(url) if "://" in url else ""
    backend = _SCHEMES.get(scheme)
    # (etcd's parser reads its list of members itself: see urls.split_url)
    if backend not in (None, "etcd") and not url.startswith("sqlite:///"):
        problem = url_syntax_problem(url)
        if problem:
            raise ConfigError(f"malformed store URL {redact_url(url)!r}: {problem}")
    if backend == "sqlite":
        from tasklock_cli.stores.sqlite.store import SQLiteStore

        return SQLiteStore.from_url(url)
    if backend == "postgres":
        with _driver_needed(_DRIVERS[backend]):
            from tasklock_cli.stores.postgres.store import PostgresStore
        return PostgresStore.from_url(url)
    if backend == "redis":
        with _driver_needed(_DRIVERS[backend]):
            from tasklock_cli.stores.redis.store import RedisStore
        return RedisStore.from_url(url)
    if backend == "etcd":
        from tasklock_cli.stores.etcd.store import EtcdStore

        return EtcdStore.from_url(url)
    known = ", ".join(f"{name}://" for name in _SCHEMES)
    raise ConfigError(f"unknown store URL {redact_url(url)!r} (expected one of {known})")


@contextmanager
def _driver_needed(driver: _Driver) -> Iterator[None]:
    """Turn the driver's ImportError into one line naming the package to install; an
    ImportError of anything else (our own modules included) stays a bug with its traceback."""
    try:
        yield
    except ImportError as exc:
        if not _raised_by(exc, driver.package):
            raise
        message = f"the {driver.store} store needs the {driver.package} driver"
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
