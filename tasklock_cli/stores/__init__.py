"""Store registry: open a store from its URL, importing each driver only when its scheme is used."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tasklock_cli.errors import ConfigError
from tasklock_cli.stores.base import Store

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


def default_sqlite_path() -> Path:
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "tasklock" / "locks.db"


def sqlite_url(path: Path) -> str:
    """``sqlite:///ABS/PATH.db``: the path's own leading slash is the URL's third."""
    return f"sqlite://{path}" if path.is_absolute() else f"sqlite:///{path}"


def default_store_url() -> str:
    return sqlite_url(default_sqlite_path())


def open_store(url: str) -> Store:
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    backend = _SCHEMES.get(scheme)
    if backend == "sqlite":
        from tasklock_cli.stores.sqlite import SQLiteStore

        return SQLiteStore.from_url(url)
    if backend == "postgres":
        from tasklock_cli.stores.postgres import PostgresStore

        return PostgresStore.from_url(url)
    if backend == "redis":
        from tasklock_cli.stores.redis import RedisStore

        return RedisStore.from_url(url)
    if backend == "etcd":
        from tasklock_cli.stores.etcd import EtcdStore

        return EtcdStore.from_url(url)
    known = ", ".join(f"{name}://" for name in _SCHEMES)
    raise ConfigError(f"unknown store URL {redact_url(url)!r} (expected one of {known})")


_PASSWORD_IN_CONNINFO = re.compile(r"(password\s*=\s*)(\S+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (userinfo, ``?password=`` or conninfo)."""
    redacted = _PASSWORD_IN_CONNINFO.sub(r"\1***", url)
    try:
        parts = urlsplit(redacted)
    except ValueError:
        return redacted
    netloc = parts.netloc
    userinfo, at, hostinfo = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return redacted
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))
