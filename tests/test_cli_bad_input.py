"""Bad input gets one clear line and a documented exit code, never a traceback or exit 1
(contract v3, "Exit codes"); an empty store setting is an error, never "use the next one"."""

from __future__ import annotations

import json
import shlex
import subprocess
import time
from urllib.parse import urlsplit

import pytest

from tests.conftest import store_url_for
from tests.support import services
from tests.support.cli import executable
from tests.support.cli import one_error_line
from tests.support.cli import tasklock
from tests.support.services import capabilities_for

HUGE = "999999999999999999999"


def with_parameter(url: str, parameter: str) -> str:
    return url + ("&" if "?" in url else "?") + parameter


# -- empty store settings ------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["run", "k", "--", "true"], ["peek", "k"], ["list"]])
def test_an_empty_store_flag_is_78(cli_env, argv):
    result = tasklock("--store", "", *argv, env=cli_env)
    assert result.returncode == 78
    assert "--store is empty" in one_error_line(result.stderr)


@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_tasklock_store_is_78_not_the_default_store(cli_env, value):
    result = tasklock("run", "k", "--", "echo", "ran", env={**cli_env, "TASKLOCK_STORE": value})
    assert (result.returncode, result.stdout) == (78, "")
    assert "TASKLOCK_STORE is empty" in one_error_line(result.stderr)


def test_an_unset_tasklock_store_is_not_empty(cli_env):
    assert "TASKLOCK_STORE" not in cli_env
    assert tasklock("run", "k", "--", "true", env=cli_env).returncode == 0


def test_an_empty_store_in_the_config_file_is_78_naming_file_and_line(cli_env, tmp_path):
    config = tmp_path / "tasklock.toml"
    config.write_text('ttl = "10s"\nstore = ""\n')
    result = tasklock("--config", str(config), "peek", "k", env=cli_env)
    assert result.returncode == 78
    assert f"{config}:2: setting 'store' is empty" in one_error_line(result.stderr)


def test_an_unusable_store_url_in_the_config_file_names_file_and_line(cli_env, tmp_path):
    config = tmp_path / "tasklock.toml"
    config.write_text('# locks\nstore = "mongodb://x"\n')
    result = tasklock("--config", str(config), "peek", "k", env=cli_env)
    assert result.returncode == 78
    line = one_error_line(result.stderr)
    assert f"{config}:2: setting 'store'" in line
    assert "unknown store URL 'mongodb://x'" in line


def test_a_config_path_that_is_a_directory_says_so(cli_env, tmp_path):
    result = tasklock("--config", str(tmp_path), "peek", "k", env=cli_env)
    assert result.returncode == 78
    assert one_error_line(result.stderr).endswith(f"config file {tmp_path} is a directory")


# -- store URLs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://[::1",
        "redis://[::1",
        "etcd://[::1",
        "sqlite:////",
        "sqlite:///%00",
        "sqlite:///tmp/",
        "sqlite:///tmp/x.db#part",
        "redis://127.0.0.1:6379/abc",
        "redis://127.0.0.1:6379/-1",
        f"redis://127.0.0.1:6379/{HUGE}",
        "postgresql://127.0.0.1:99999/test",
    ],
)
def test_a_url_that_can_never_work_is_78(cli_env, url):
    result = tasklock("--store", url, "peek", "k", env=cli_env)
    assert result.returncode == 78, result.stderr
    one_error_line(result.stderr)


@pytest.mark.parametrize("scheme", ["postgresql", "redis", "rediss", "etcd", "etcds"])
def test_a_malformed_url_is_shown_without_its_password(cli_env, scheme):
    """urlsplit refuses an unclosed '[': the error still shows the URL, never its password."""
    result = tasklock("--store", f"{scheme}://bob:s3cret-pw@[::1:1234/x", "peek", "k", env=cli_env)
    assert result.returncode == 78, result.stderr
    assert "s3cret-pw" not in result.stderr
    assert "bob:***@" in result.stderr
    one_error_line(result.stderr)


def test_unknown_url_parameters_are_78_on_every_store(cli_env, store_url):
    result = tasklock("--store", with_parameter(store_url, "bogus=1"), "peek", "k", env=cli_env)
    assert result.returncode == 78, result.stderr
    assert "unknown parameter 'bogus'" in one_error_line(result.stderr)


@pytest.mark.parametrize(
    ("kind", "parameters"),
    [
        ("postgres", "connect_timeout=3&application_name=tasklock-test"),  # libpq's
        ("redis", "socket_timeout=3&health_check_interval=5&client_name=x"),  # redis-py's
    ],
)
def test_the_drivers_own_url_parameters_still_work(cli_env, tmp_path, kind, parameters):
    services.require(kind)
    url = with_parameter(store_url_for(kind, tmp_path), parameters)
    try:
        result = tasklock("--store", url, "peek", "k", env=cli_env)
    finally:
        services.cleanup(kind, url)
    assert (result.returncode, result.stderr) == (1, "")  # free


@pytest.mark.server  # Redis
def test_a_redis_database_the_server_lacks_is_78(cli_env):
    services.require("redis")
    url = urlsplit(services.base_url("redis"))._replace(path="/99", query="").geturl()
    result = tasklock("--store", url, "peek", "k", env=cli_env)
    assert result.returncode == 78, result.stderr
    assert "no such database" in one_error_line(result.stderr)


# -- numbers -------------------------------------------------------------------------------


def test_a_huge_history_limit_is_a_usage_error_on_every_store(cli_env, store_url):
    result = tasklock("--store", store_url, "history", "k", "--limit", HUGE, env=cli_env)
    assert result.returncode == 2, result.stderr
    assert "--limit must be from 1 to" in one_error_line(result.stderr)
    largest = tasklock(
        "--store", store_url, "history", "k", "--limit", str(2**31 - 1), "--json", env=cli_env
    )
    assert (largest.returncode, largest.stdout) == (0, "[]\n"), largest.stderr


@pytest.mark.parametrize("token", [HUGE, "-1"])
@pytest.mark.parametrize("command", [["check", "k"], ["release", "k", "--force"]])
def test_a_token_no_store_can_have_is_a_usage_error(cli_env, command, token):
    result = tasklock(*command, "--token", token, env=cli_env)
    assert result.returncode == 2
    assert "a fencing token is from 0 to" in one_error_line(result.stderr)


# -- option suggestions, JSON --------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "suggested"),
    [
        (["--bogus", "peek", "k"], None),
        (["peek", "k", "--bogus"], None),
        (["run", "k", "--bogus", "--", "true"], None),
        (["list", "--jsn"], "--json"),
        (["run", "k", "--tll", "5s", "--", "true"], "--ttl"),
        (["sweep", "--dry"], "--dry-run"),
        (["peek", "k", "--prefix", "x"], None),  # an option of list, not of peek
    ],
)
def test_suggestions_name_only_close_options_of_that_command(cli_env, argv, suggested):
    result = tasklock(*argv, env=cli_env)
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    if suggested is None:
        assert "Possible options" not in line
    else:
        assert line.endswith(f"(Possible options: {suggested})")


def test_doctor_json(cli_env, sqlite_url):
    result = tasklock("--store", sqlite_url, "doctor", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    checks = json.loads(result.stdout)
    assert {"check": "config", "ok": True, "detail": "none (built-in defaults)"} in checks
    *plain, last = checks
    assert all(set(check) == {"check", "ok", "detail"} for check in plain)
    assert set(last) == {"check", "ok", "detail", "capabilities"}
    assert {check["check"] for check in checks} >= {"store", "reachable", "schema"}


def test_doctor_json_shows_the_stores_capabilities(cli_env, sqlite_url):
    """The record the SQLite package declares, through the real executable: last, of the
    checks' shape, always ok, with the record itself under ``capabilities``."""
    result = tasklock("--store", sqlite_url, "doctor", "--json", env=cli_env)
    assert result.returncode == 0, result.stderr
    last = json.loads(result.stdout)[-1]
    assert (last["check"], last["ok"]) == ("capabilities", True)
    assert last["capabilities"] == {
        "signals_release": True,
        "concurrent_release": True,
        "waits_keep_places": False,
        "byte_keys": True,
        "min_ttl": 0.0,
        "expiry_lag": 0.0,
        "waiter_ttl": 3.0,
        "failover_window": None,
    }
    assert last["capabilities"] == capabilities_for(sqlite_url).as_json()
    assert "byte_keys=true" in last["detail"] and "failover_window=null" in last["detail"]


def test_doctor_text_ends_with_the_same_capabilities(cli_env, sqlite_url):
    """The text report has the JSON's checks, capabilities last, the same words."""
    text = tasklock("--store", sqlite_url, "doctor", env=cli_env)
    as_json = json.loads(tasklock("--store", sqlite_url, "doctor", "--json", env=cli_env).stdout)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert [line.split()[1] for line in lines] == [check["check"] for check in as_json]
    assert lines[-1] == f"ok    capabilities {as_json[-1]['detail']}"


def test_doctor_json_on_an_unreachable_store_is_69(cli_env):
    result = tasklock("--store", "redis://127.0.0.1:1/0", "doctor", "--json", env=cli_env)
    assert result.returncode == 69
    reachable = [c for c in json.loads(result.stdout) if c["check"] == "reachable"]
    assert reachable[0]["ok"] is False


# -- etcd: say what happened, at once ------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "said"),
    [
        ("etcd://127.0.0.1:1", "127.0.0.1:1: connection refused"),
        ("etcd://[::1]:1", "[::1]:1: connection refused"),
        ("etcd://nosuchhost.invalid:2379", "nosuchhost.invalid:2379: unknown host"),
    ],
)
def test_etcd_says_no_member_is_reachable_as_fast_as_the_other_stores(cli_env, url, said):
    started = time.monotonic()
    result = tasklock("--store", url, "peek", "k", env=cli_env)
    took = time.monotonic() - started
    assert result.returncode == 69
    line = one_error_line(result.stderr)
    assert "no etcd member reachable" in line
    assert said in line
    assert "within 5s" not in line
    assert took < 3, took


# -- odd numbers, hosts and bytes: one line, never exit 1 (issue 40) -----------------------

#: A host label of 64 characters: Python's resolver (idna) refuses it.
LONG_LABEL = "a" * 64 + ".example.com"


@pytest.mark.parametrize(
    "args",
    [
        ["history", "k", "--limit", "٣"],
        ["release", "k", "--force", "--token", "١"],
        ["release", "k", "--force", "--token", "²"],
    ],
)
def test_other_digits_in_integer_options_are_usage_errors(cli_env, sqlite_url, args):
    """Integer options take ASCII digits only, on every command (not ``٣`` read as 3)."""
    result = tasklock(*args, env={**cli_env, "TASKLOCK_STORE": sqlite_url})
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert "not a whole number in ASCII digits" in one_error_line(result.stderr)


@pytest.mark.parametrize(
    "options",
    [
        ["--limit", "²"],
        ["--limit", "٣"],  # (click's INT read Arabic-Indic 3 as 3)
        ["--limit", "--5"],
        ["--conflict-exit-code", "²"],
        ["--done-exit-code=--1"],
        ["--ttl", HUGE],
        ["--once-per", HUGE],
        ["--hold-at-least", "9" * 400],
    ],
)
def test_odd_numbers_for_run_are_usage_errors_before_anything_is_acquired(
    cli_env, sqlite_url, options
):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    for _ in range(2):  # (--once-per failed only once a success was on record)
        result = tasklock("run", "k", *options, "--", "echo", "ran", env=env)
        assert (result.returncode, result.stdout) == (2, ""), result.stderr
        one_error_line(result.stderr)
    assert tasklock("peek", "k", env=env).returncode == 1  # free: nothing was acquired


def test_a_huge_watch_interval_is_a_usage_error(cli_env, sqlite_url):
    result = tasklock("--store", sqlite_url, "list", "--watch", "--interval", HUGE, env=cli_env)
    assert result.returncode == 2
    assert "at most 36500d" in one_error_line(result.stderr)


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:6379/0?wait_replicas=%C2%B2",
        "redis://127.0.0.1:6379/%C2%B2",
        "redis://127.0.0.1:6379/0?db=%D9%A3",
        "mysql://root@127.0.0.1:²/test",
        "redis+sentinel://127.0.0.1:²/svc",
        "redis+sentinel://127.0.0.1:26379/svc/%C2%B2",
        "redis+sentinel://[zz]:1/svc",
        "etcd://127.0.0.1:²",
        "etcd://127.0.0.1:+1",
    ],
)
def test_unicode_digits_and_odd_hosts_in_urls_are_78(cli_env, url):
    result = tasklock("--store", url, "peek", "k", env=cli_env)
    assert result.returncode == 78, result.stderr
    one_error_line(result.stderr)


@pytest.mark.parametrize(
    "url",
    [
        "rediss://127.0.0.1:6379/0?ssl_ca_certs={missing}",
        "rediss://127.0.0.1:6379/0?ssl_certfile={missing}&ssl_keyfile={missing}",
        "mysql://root@127.0.0.1:3306/test?ssl_ca={missing}",
        "etcds://127.0.0.1:2379?cacert={missing}",
    ],
)
def test_a_tls_file_that_cannot_be_read_is_78(cli_env, tmp_path, url):
    """A CA, certificate or key file that is not there can never work: 78, as any other
    wrong value of the store URL, not 69 (the store unavailable: worth a retry)."""
    url = url.format(missing=tmp_path / "no-such.pem")
    result = tasklock("--store", url, "run", "k", "--", "true", env=cli_env)
    assert result.returncode == 78, result.stderr
    one_error_line(result.stderr)


@pytest.mark.parametrize(
    "url",
    [
        f"redis://{LONG_LABEL}:6379/0",
        f"rediss://{LONG_LABEL}:6379/0",
        f"redis+sentinel://{LONG_LABEL}:26379/svc",
        f"rediss+sentinel://127.0.0.1:1,{LONG_LABEL}:26379/svc",
        f"postgresql://{LONG_LABEL}/test",
        f"postgres:///test?host=127.0.0.1,{LONG_LABEL}",
        f"mysql://root@{LONG_LABEL}/test",
        f"mariadb://root@{LONG_LABEL}:3306/test",
        f"etcd://{LONG_LABEL}:2379",
        f"etcds://127.0.0.1:1,{LONG_LABEL}:2379",
        "redis://a..b:6379/0",
    ],
)
def test_a_host_name_no_resolver_takes_is_78_on_every_network_store(cli_env, url):
    result = tasklock("--store", url, "peek", "k", env=cli_env)
    assert result.returncode == 78, result.stderr
    assert "is not a valid host name" in one_error_line(result.stderr)


def test_an_empty_command_name_is_not_found(cli_env, sqlite_url):
    """As a shell says of it (127), not a traceback of the guard's (exit 1)."""
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    result = tasklock("run", "k", "--", "", "arg", env=env)
    assert result.returncode == 127, result.stderr
    assert one_error_line(result.stderr) == "tasklock: error: command not found: ''"
    assert tasklock("peek", "k", env=env).returncode == 1  # released


def test_a_command_name_that_is_not_utf8_is_not_found(cli_env, sqlite_url):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    result = subprocess.run(
        [executable().encode(), b"run", b"k", b"--", b"\xff"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    stderr = result.stderr.decode()
    assert result.returncode == 127, stderr
    assert one_error_line(stderr) == "tasklock: error: command not found: \\xff"
    assert tasklock("peek", "k", env=env).returncode == 1  # released


@pytest.mark.parametrize("command", [["metrics"], ["list", "--json"], ["--version"]])
@pytest.mark.parametrize("redirect", ["> /dev/full", ">&-"])
def test_output_that_cannot_be_written_is_78_not_a_traceback(
    cli_env, sqlite_url, command, redirect
):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    argv = " ".join(shlex.quote(word) for word in [executable(), *command])
    result = subprocess.run(
        ["sh", "-c", f"exec {argv} {redirect}"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 78, result.stderr
    assert "cannot write the output" in one_error_line(result.stderr)


# -- passwords are never printed (issue 40) ------------------------------------------------

PASSWORD_URLS = [
    "redis://u:PW1a?PW1b@127.0.0.1:1/0",
    "redis://u:PW1a/PW1b@127.0.0.1:1/0",
    "rediss://u:PW1a#PW1b@127.0.0.1:1/0",
    "mysql://u:PW1a#PW1b@127.0.0.1:1/test",
    "mariadb://u:PW1a?PW1b@127.0.0.1:1/test",
    "postgresql://u:PW1a?PW1b@127.0.0.1:1/test",
    "postgresql://u:PW1a/PW1b@127.0.0.1:1/test",
    "redis+sentinel://u:PW1a?PW1b@127.0.0.1:1/svc",
    "redis+sentinel://u:PW1a#PW1b@127.0.0.1:1/svc",
    "etcd://u:PW1a/PW1b@127.0.0.1:1",
    "postgresql://u@127.0.0.1:1/test?pass%77ord=PW1aPW1b",
    "postgresql://u@127.0.0.1:1/test?sslpass%77ord=PW1aPW1b",
    "redis://127.0.0.1:1/0?pass%77ord=PW1aPW1b",
    "redis+sentinel://127.0.0.1:1/svc?sentinel_pass%77ord=PW1aPW1b",
    "host=127.0.0.1 port=1 dbname=test password='PW1a PW1b'",
]


@pytest.mark.parametrize("url", PASSWORD_URLS)
@pytest.mark.parametrize(
    "command",
    [
        ["peek", "k"],
        ["doctor", "--json"],
        ["--log-format", "json", "list"],
        ["-v", "run", "k", "--", "true"],
    ],
)
def test_no_password_is_printed_however_the_url_writes_it(cli_env, url, command):
    """Unencoded '?', '/', '#' in the userinfo's password, percent-encoded parameter names
    (libpq and redis-py read pass%77ord as password), a quoted conninfo password: not a
    piece of them in errors, doctor, JSON errors or -v tracebacks."""
    result = tasklock("--store", url, *command, env=cli_env)
    assert result.returncode in (69, 78), result.stderr
    shown = result.stdout + result.stderr
    assert "PW1a" not in shown and "PW1b" not in shown, shown
    assert "***" in shown


@pytest.mark.parametrize(
    "command",
    [[b"peek", b"k\xff"], [b"history", b"k\xff"], [b"release", b"k\xff", b"--force"]],
)
def test_a_key_that_is_not_utf8_is_looked_up_or_refused_never_exit_1(cli_env, store_url, command):
    """SQLite, MySQL and Redis may hold such a key (someone wrote it): it is looked up as
    its bytes. PostgreSQL and etcd cannot: a usage error."""
    result = subprocess.run(
        [executable().encode(), b"--store", store_url.encode(), *command],
        env=cli_env,
        capture_output=True,
        timeout=60,
    )
    stderr = result.stderr.decode()
    if not capabilities_for(store_url).byte_keys:  # PostgreSQL's text, etcd's keys
        assert result.returncode == 2, stderr
        assert "not valid UTF-8" in one_error_line(stderr)
    else:
        assert (result.returncode, stderr) == ((1 if command[0] == b"peek" else 0), ""), stderr


@pytest.mark.parametrize("command", [[b"list"], [b"metrics"]])
def test_a_prefix_that_is_not_utf8_is_a_usage_error(cli_env, sqlite_url, command):
    result = subprocess.run(
        [executable().encode(), b"--store", sqlite_url.encode(), *command, b"--prefix", b"\xff"],
        env=cli_env,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--prefix is not valid UTF-8" in one_error_line(result.stderr.decode())
