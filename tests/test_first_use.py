"""What a first-time user trips over, through the real executable: errors in JSON logs,
store URLs that depend on the current directory, config values, waiting messages."""

from __future__ import annotations

import json
import time

import pytest

from tests.support.cli import json_events
from tests.support.cli import one_error_line
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder


@pytest.fixture
def store_url(sqlite_url):
    """These tests run on SQLite alone: ``env`` (conftest) names the store of ``sqlite_url``."""
    return sqlite_url


def json_lines(stderr: str) -> list[dict]:
    """Every stderr line, each of which must be a JSON object."""
    return [json.loads(line) for line in stderr.splitlines()]


def only_error(stderr: str) -> dict:
    records = json_lines(stderr)
    errors = [record for record in records if record["event"] == "error"]
    assert len(errors) == 1, stderr
    return errors[0]


# -- errors as JSON with --log-format json ---------------------------------------------------


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--log-format", "json", "run", "k"], 2, "no command"),
        (["--log-format=json", "run", "k", "--ttl", "30x", "--", "true"], 2, "invalid --ttl"),
        (["--log-format", "json", "run", "k", "--bogus", "--", "true"], 2, "--bogus"),
        (["--log-format", "json", "frobnicate"], 2, "frobnicate"),
        (["run", "k", "--log-format", "json", "--", "/nonexistent/cmd"], 127, "/nonexistent"),
        (["run", "k", "--log-format", "json", "--ttl", "30x", "--", "true"], 2, "invalid --ttl"),
        (["--log-format", "json", "run", "k", "--", "/nonexistent/cmd"], 127, "/nonexistent"),
        (["--log-format", "json", "--store", "nope://x", "list"], 78, "unknown store URL"),
        (["--log-format", "json", "--store", "redis://127.0.0.1:1/0", "peek", "k"], 69, ""),
        (["--log-format", "json", "--config", "/nonexistent.toml", "list"], 78, "does not exist"),
    ],
)
def test_errors_are_json_objects_with_log_format_json(env, args, code, fragment):
    result = tasklock(*args, env=env)
    assert result.returncode == code, result.stderr
    error = only_error(result.stderr)
    assert error["code"] == code
    assert fragment in error["message"]
    assert not error["message"].startswith("tasklock: error")
    assert set(error) == {"event", "code", "message", "ts"}  # no traceback without -v


def test_with_v_the_json_error_carries_the_traceback_in_the_object(env):
    result = tasklock("--log-format", "json", "-v", "--store", "nope://x", "list", env=env)
    assert result.returncode == 78
    error = only_error(result.stderr)
    assert error["traceback"].startswith("Traceback (most recent call last)")


def test_text_errors_stay_one_plain_line(env):
    result = tasklock("run", "k", "--ttl", "30x", "--", "true", env=env)
    assert result.returncode == 2
    assert "invalid --ttl" in one_error_line(result.stderr)


# -- SQLite URLs ------------------------------------------------------------------------------


def test_a_relative_sqlite_url_is_a_usage_error_creating_nothing(cli_env, tmp_path):
    result = tasklock(
        "--store", "sqlite://relative.db", "run", "k", "--", "true", env=cli_env, cwd=tmp_path
    )
    assert result.returncode == 2
    line = one_error_line(result.stderr)
    assert "sqlite:///ABS/PATH" in line
    assert list(tmp_path.iterdir()) == []


def test_an_explicit_sqlite_path_in_a_missing_directory_is_not_created(cli_env, tmp_path):
    url = f"sqlite:///{tmp_path}/missing/deeper/locks.db"
    result = tasklock("--store", url, "run", "k", "--", "true", env=cli_env)
    assert result.returncode == 78
    line = one_error_line(result.stderr)
    assert f"{tmp_path}/missing/deeper" in line and "does not exist" in line
    assert not (tmp_path / "missing").exists()


def test_the_default_store_directory_is_created(cli_env, tmp_path):
    result = tasklock("run", "k", "--", "true", env=cli_env)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "state" / "tasklock" / "locks.db").is_file()


# -- config values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "line", "setting", "fragment"),
    [
        ('ttl = "inf"\n', 1, "ttl", "setting 'ttl' is not a duration: 'inf' (e.g. 500ms"),
        ('\nttl = "50ms"\n', 2, "ttl", "at least 100ms"),
        ('grace = "inf"\n', 1, "grace", "setting 'grace' is not a duration: 'inf'"),
        ('[keys."a:*"]\nmax-lifetime = "0"\n', 2, "max-lifetime", "must be positive"),
        ('ttl = "10s"\nrenew-every = "10s"\n', 2, "renew-every", "shorter than ttl"),
    ],
)
def test_bad_config_values_are_config_errors_naming_file_and_line(
    env, tmp_path, text, line, setting, fragment
):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    result = tasklock("--config", str(config), "run", "a:b", "--", "true", env=env)
    assert result.returncode == 78, result.stderr
    message = one_error_line(result.stderr)
    assert f"{config}:{line}: setting {setting!r}" in message
    assert fragment in message
    assert "or inf" not in message


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ('tll = "5s"\n', 1, "setting 'tll' is not a tasklock setting; did you mean 'ttl'?"),
        ('stor = "x"\n', 1, "setting 'stor' is not a tasklock setting; did you mean 'store'?"),
        (
            '[keys."a:*"]\nhold-atleast = "1m"\n',
            2,
            "setting 'hold-atleast' is not a run setting; did you mean 'hold-at-least'?",
        ),
        ("bogus = 1\n", 1, "setting 'bogus' is not a tasklock setting"),  # nothing close
        (
            'wait = "forever"\n',
            1,
            "setting 'wait' is not a duration: 'forever' (e.g. 500ms, 30s, 5m, 1h30m, 2d, a "
            "number of seconds or inf)",
        ),
    ],
)
def test_a_mistyped_config_setting_gets_a_suggestion_as_a_mistyped_option_does(
    env, tmp_path, text, line, message
):
    config = tmp_path / "typo.toml"
    config.write_text(text)
    result = tasklock("--config", str(config), "run", "a:b", "--", "true", env=env)
    assert result.returncode == 78, result.stderr
    assert one_error_line(result.stderr) == f"tasklock: error: {config}:{line}: {message}"
    option = tasklock("run", "a:b", "--tll", "5s", "--", "true", env=env)
    assert "(Possible options: --ttl)" in one_error_line(option.stderr)  # as for the option


def test_a_flag_that_conflicts_with_the_file_is_a_usage_error(env, tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('renew-every = "20s"\n')
    result = tasklock("--config", str(config), "run", "k", "--ttl", "10s", "--", "true", env=env)
    assert result.returncode == 2
    assert "--renew-every must be shorter than ttl (10s)" in one_error_line(result.stderr)


def test_the_duration_error_offers_inf_only_where_it_is_allowed(env):
    ttl = tasklock("run", "k", "--ttl", "soon", "--", "true", env=env)
    wait = tasklock("run", "k", "--wait", "soon", "--", "true", env=env)
    assert ttl.returncode == wait.returncode == 2
    assert "or inf" not in one_error_line(ttl.stderr)
    assert "or inf" in one_error_line(wait.stderr)


# -- list --interval, blank keys --------------------------------------------------------------


@pytest.mark.parametrize("interval", ["0", "50ms", "0.09"])
def test_list_watch_refuses_intervals_under_100ms(env, interval):
    result = tasklock("list", "--watch", "--interval", interval, env=env, timeout=10)
    assert result.returncode == 2
    assert "--interval must be at least 100ms" in one_error_line(result.stderr)


@pytest.mark.parametrize("command", [["run", "   ", "--", "true"], ["peek", " \t "]])
def test_a_blank_key_is_refused_like_an_empty_one(env, command):
    result = tasklock(*command, env=env)
    assert result.returncode == 2
    assert "the lock key is blank" in one_error_line(result.stderr)


# -- waiting ----------------------------------------------------------------------------------


@pytest.fixture
def held(env, sqlite_url):
    holder = start("run", "k", "--", "sleep", "60", env=env)
    try:
        yield wait_for_holder(sqlite_url, "k")
    finally:
        holder.terminate()
        holder.wait()


def test_giving_up_after_a_wait_says_how_long_and_that_one_holder_held_throughout(env, held):
    result = tasklock("run", "k", "--wait", "1s", "--", "true", env=env)
    assert result.returncode == 75
    lines = result.stderr.strip().splitlines()
    who = f"{held.holder.host} pid {held.holder.pid} (user {held.holder.user}, token 1)"
    assert lines == [
        f"tasklock: waiting for 'k' held by {who}",
        f"tasklock: gave up waiting 1s: 'k' is held by {who}, who held it throughout; "
        "not running the command",
    ]
    immediate = tasklock("run", "k", "--", "true", env=env)
    assert immediate.returncode == 75
    assert immediate.stderr.startswith(f"tasklock: 'k' is held by {who} until ")


@pytest.mark.slow
@pytest.mark.waits
def test_a_long_wait_repeats_the_waiting_event_every_30s(env, held):
    started = time.monotonic()
    result = tasklock("--log-format", "json", "run", "k", "--wait", "32s", "--", "true", env=env)
    assert result.returncode == 75
    events = json_events(result.stderr)
    waiting = [e for e in events if e["event"] == "waiting"]
    assert len(waiting) == 2, result.stderr
    assert all(e["holder"]["pid"] == held.holder.pid for e in waiting)
    assert [e["event"] for e in events] == ["waiting", "waiting", "conflict"]
    assert time.monotonic() - started < 40


def test_an_error_the_run_goes_on_after_is_a_json_object_too():
    import io

    from tasklock_cli.events import EventLog

    stream = io.StringIO()
    EventLog("json", stream=stream).error("could not release 'k' (store down)")
    record = json.loads(stream.getvalue())
    assert set(record) == {"event", "message", "ts"}
    assert (record["event"], record["message"]) == ("error", "could not release 'k' (store down)")
    text = io.StringIO()
    EventLog("text", stream=text).error("could not release 'k'")
    assert text.getvalue() == "tasklock: error: could not release 'k'\n"
