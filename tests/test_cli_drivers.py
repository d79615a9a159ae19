"""The store drivers (psycopg, redis-py) through the real executable: imported only when their
store is used."""

from __future__ import annotations

import pytest

from tests.support.blocked_imports import attempts, env_without
from tests.support.cli import tasklock

DRIVERS = ["psycopg", "redis"]


@pytest.fixture
def no_drivers(cli_env, sqlite_url, tmp_path) -> dict[str, str]:
    return env_without(DRIVERS, {**cli_env, "TASKLOCK_STORE": sqlite_url}, tmp_path)


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["run", "k", "--", "true"],
        ["list"],
        ["list", "--json"],
        ["sweep"],
        ["doctor"],
    ],
)
def test_help_and_the_sqlite_store_never_import_a_network_driver(no_drivers, argv):
    result = tasklock(*argv, env=no_drivers)
    assert result.returncode == 0, result.stderr
    assert attempts(no_drivers) == []


def test_peek_on_sqlite_never_imports_a_network_driver(no_drivers):
    assert tasklock("peek", "k", env=no_drivers).returncode == 1  # free
    assert attempts(no_drivers) == []
