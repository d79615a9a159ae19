"""The store drivers (psycopg, redis-py, PyMySQL) through the real executable: imported only
when their store is used."""

from __future__ import annotations

import pytest

from tests.support.blocked_imports import attempts
from tests.support.blocked_imports import env_without
from tests.support.cli import one_error_line
from tests.support.cli import tasklock

DRIVERS = ["psycopg", "redis", "pymysql"]


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


MISSING_DRIVER = {
    "postgresql://127.0.0.1:1/test": (
        "psycopg",
        "tasklock: error: the postgresql store needs the psycopg driver: "
        "pip install 'psycopg[binary]>=3.1'",
    ),
    "postgres://127.0.0.1:1/test": (
        "psycopg",
        "tasklock: error: the postgresql store needs the psycopg driver: "
        "pip install 'psycopg[binary]>=3.1'",
    ),
    "redis://127.0.0.1:1/0": (
        "redis",
        "tasklock: error: the redis store needs the redis driver: pip install 'redis>=5'",
    ),
    "unix:///nowhere/redis.sock": (
        "redis",
        "tasklock: error: the redis store needs the redis driver: pip install 'redis>=5'",
    ),
    "mysql://root@127.0.0.1:1/test": (
        "pymysql",
        "tasklock: error: the mysql store needs the pymysql driver: pip install 'PyMySQL>=1.1'",
    ),
    "mariadb://root@127.0.0.1:1/test": (
        "pymysql",
        "tasklock: error: the mysql store needs the pymysql driver: pip install 'PyMySQL>=1.1'",
    ),
}


@pytest.mark.parametrize("url", sorted(MISSING_DRIVER))
@pytest.mark.parametrize(
    "argv", [["run", "k", "--", "true"], ["peek", "k"], ["doctor"]], ids=["run", "peek", "doctor"]
)
def test_a_missing_driver_is_one_line_and_exit_78(cli_env, tmp_path, url, argv):
    package, message = MISSING_DRIVER[url]
    env = env_without([package], {**cli_env, "TASKLOCK_STORE": url}, tmp_path)
    result = tasklock(*argv, env=env)
    assert result.returncode == 78
    assert one_error_line(result.stderr) == message
    assert result.stdout == ""
    assert attempts(env) == [package]  # refused as a missing package would be


def test_a_missing_driver_of_a_store_given_with_the_store_flag(cli_env, tmp_path):
    env = env_without(["redis"], cli_env, tmp_path)
    result = tasklock("--store", "rediss://127.0.0.1:1/0", "list", env=env)
    assert result.returncode == 78
    assert one_error_line(result.stderr).endswith("pip install 'redis>=5'")


def test_only_the_drivers_import_errors_become_config_errors():
    """An ImportError of tasklock's own code is a bug: it keeps its traceback."""
    from tasklock_cli.errors import ConfigError
    from tasklock_cli.stores import _say_which_driver
    from tasklock_cli.stores.registry import store_package

    redis = store_package("redis")

    own = ImportError("cannot import name 'Gone' from 'tasklock_cli.stores.base'")
    own.name = "tasklock_cli.stores.base"
    _say_which_driver(redis, own)  # not the driver's: left to its caller to raise again
    too_old = r"\(No module named 'redis.backoff'\): pip install 'redis>=5'"
    with pytest.raises(ConfigError, match=too_old):
        _say_which_driver(
            redis, ModuleNotFoundError("No module named 'redis.backoff'", name="redis.backoff")
        )
