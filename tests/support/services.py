"""Where the test PostgreSQL, Redis, MySQL/MariaDB and etcd are, whether they are up, and how
to clean up after a test. etcd is a private member the tests start themselves
(``tests/support/etcd.py``), unless ``TASKLOCK_TEST_ETCD_URL`` names one.

On a machine without them the store tests skip with the reason; in CI (``CI=true``) a missing
service is a failure, never a skip.
"""

from __future__ import annotations

import functools
import os
import socket
from urllib.parse import urlsplit

import pytest

DEFAULT_POSTGRES_URL = "postgresql://127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MYSQL_URL = "mysql://root@127.0.0.1:3306/test"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def base_postgres_url() -> str:
    return os.environ.get("TASKLOCK_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)


def base_redis_url() -> str:
    return os.environ.get("TASKLOCK_TEST_REDIS_URL", DEFAULT_REDIS_URL)


def base_mysql_url() -> str:
    return os.environ.get("TASKLOCK_TEST_MYSQL_URL", DEFAULT_MYSQL_URL)


def _with_query(url: str, **params: str) -> str:
    separator = "&" if "?" in url else "?"
    return url + separator + "&".join(f"{k}={v}" for k, v in params.items())


def postgres_url(table: str) -> str:
    return _with_query(base_postgres_url(), table=table)


def redis_url(prefix: str) -> str:
    return _with_query(base_redis_url(), prefix=prefix)


def mysql_url(table: str) -> str:
    return _with_query(base_mysql_url(), table=table)


def etcd_url(prefix: str) -> str:
    from tests.support import etcd

    return _with_query(etcd.base_url(), prefix=prefix)


def _etcd_unavailable_reason() -> str | None:
    import os

    from tests.support import etcd

    if not os.environ.get("TASKLOCK_TEST_ETCD_URL") and etcd.etcd_binary() is None:
        return (
            "the etcd binary is not installed (Debian: apt-get install etcd-server; "
            "or set TASKLOCK_TEST_ETCD_URL)"
        )
    try:
        etcd.base_url()
    except (OSError, RuntimeError) as exc:
        return f"could not start a private etcd member ({exc})"
    return None


@functools.cache
def unavailable_reason(kind: str) -> str | None:
    """None when the store kind can be tested here, else why not."""
    if kind in ("sqlite", "memory"):  # in this process or a file: always here
        return None
    if kind == "etcd":
        return _etcd_unavailable_reason()
    module = {"postgres": "psycopg", "redis": "redis", "mysql": "pymysql"}[kind]
    try:
        __import__(module)
    except ImportError:
        return f"{module} is not installed (pip install '.[test]')"
    url = {"postgres": base_postgres_url, "redis": base_redis_url, "mysql": base_mysql_url}[kind]()
    parts = urlsplit(url)
    port = parts.port or {"postgres": 5432, "redis": 6379, "mysql": 3306}[kind]
    try:
        socket.create_connection((parts.hostname or "127.0.0.1", port), timeout=2).close()
    except OSError as exc:
        return f"no {kind} server at {parts.hostname}:{port} ({exc.strerror or exc})"
    try:
        __import__(f"tasklock_cli.stores.{kind}")
    except ImportError as exc:
        return f"tasklock's {kind} store is not available ({exc})"
    return None


def require(kind: str) -> None:
    reason = unavailable_reason(kind)
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI=true but the {kind} store cannot be tested: {reason}")
    pytest.skip(reason)


def cleanup(kind: str, url: str) -> None:
    """Drop what a test's namespace left behind on a shared server."""
    if kind == "memory":
        from tasklock_cli.stores.memory.connection import drop_space

        drop_space(url.removeprefix("memory://"))
    elif kind == "postgres":
        from tests.support import pg

        pg.drop_namespace(url)
    elif kind == "redis":
        from tests.support import redis_support

        redis_support.drop_namespace(url)
    elif kind == "etcd":
        from tests.support import etcd

        etcd.drop_namespace(url)
    elif kind == "mysql":
        from tests.support import mysql_support

        mysql_support.drop_namespace(url)
