"""Global options (--store, --config, --log-format, -v, -q) before or after the command name,
through the real executable."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import Holder
from tests.support.cli import json_events
from tests.support.cli import one_error_line
from tests.support.cli import tasklock
from tests.support.contract import granted

HOLDER = Holder(host="elsewhere", pid=4242, user="alice", command=["./job.sh"], note="held")
PEEK_SELF = ["sh", "-c", "tasklock peek k --json"]  # the child looks at its own lease


@pytest.fixture
def store_url(sqlite_url):
    """These tests run on SQLite alone: ``env`` (conftest) names the store of ``sqlite_url``."""
    return sqlite_url


@pytest.fixture
def other_url(tmp_path) -> str:
    """A second store, not the one TASKLOCK_STORE names."""
    return f"sqlite:///{tmp_path}/other.db"


def _hold(url: str, key: str) -> Iterator[None]:
    with open_store(url) as store:
        lease = store.acquire(key, 60, HOLDER, uuid.uuid4().hex)
        assert lease is not None
        yield
        store.release(lease)


@pytest.fixture
def held_in_env_store(sqlite_url) -> Iterator[None]:
    yield from _hold(sqlite_url, "k")


@pytest.fixture
def held_in_other_store(other_url) -> Iterator[None]:
    yield from _hold(other_url, "k")


def _lease_seconds(peek_json: str) -> float:
    """The lease's length as peek shows it, which a renewal would lengthen: the tests use
    TTLs of 45 s and more, whose first renewal comes after 15 s, not before the peek."""
    info = json.loads(peek_json)
    acquired, expires = (
        datetime.fromisoformat(info[f][:-1]) for f in ("acquired_at", "expires_at")
    )
    return (expires - acquired).total_seconds()


# -- --store -------------------------------------------------------------------------------


def test_store_after_peek(env, other_url, held_in_other_store):
    result = tasklock("peek", "k", "--store", other_url, "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["holder"]["host"] == "elsewhere"
    assert tasklock("peek", "k", "--json", env=env).returncode == 1  # free in TASKLOCK_STORE


def test_store_given_before_and_after_takes_the_later(
    env, sqlite_url, other_url, held_in_other_store
):
    later_other = tasklock("--store", sqlite_url, "peek", "k", f"--store={other_url}", env=env)
    assert later_other.returncode == 0, later_other.stderr
    later_env = tasklock("--store", other_url, "peek", "k", "--store", sqlite_url, env=env)
    assert later_env.returncode == 1, later_env.stderr
    assert later_env.stdout == "k is free\n"


def test_run_with_store_and_verbose_after_the_key(env, other_url):
    result = tasklock(
        "run", "k", "--ttl", "45s", "--store", other_url, "-v", "--", *PEEK_SELF,
        env={**env, "TASKLOCK_STORE": other_url},  # for the child's own peek
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert _lease_seconds(result.stdout) == 45
    assert result.stderr.splitlines() == [
        "tasklock: acquired 'k' (fencing token 1, ttl 45s)",
        "tasklock: released 'k'",
    ]
    with open_store(other_url) as store:
        assert store.peek("k") is None  # released, and it was this store's first token
    assert tasklock("run", "k", "--store", other_url, "--", "true", env=env).returncode == 0


def test_run_flags_are_taken_before_the_double_dash_only(env, sqlite_url):
    result = tasklock("run", "k", "--", "echo", "--store", "x", "-v", "-q", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "--store x -v -q\n"
    assert result.stderr == ""  # neither -v nor -q was taken by tasklock
    with open_store(sqlite_url) as store:
        assert granted(store.acquire("k", 5, HOLDER, uuid.uuid4().hex)).fencing_token == 2


def test_a_note_that_looks_like_an_option_is_the_note(env):
    result = tasklock("run", "k", "--note", "-v", "--", *PEEK_SELF, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["holder"]["note"] == "-v"
    assert result.stderr == ""  # not verbose: -v was the note


# -- --config ------------------------------------------------------------------------------


def test_config_after_the_command(env, tmp_path, other_url, held_in_other_store):
    config = tmp_path / "after.toml"
    config.write_text(f'store = "{other_url}"\nttl = "47s"\n')
    env = {k: v for k, v in env.items() if k != "TASKLOCK_STORE"}
    held = tasklock("peek", "k", "--config", str(config), env=env)
    assert held.returncode == 0, held.stderr
    free = tasklock("run", "j", "--config", str(config), "--", "sh", "-c", "true", env=env)
    assert free.returncode == 0, free.stderr
    own = tasklock(
        "run", "j", "--config", str(config), "--",
        "sh", "-c", f"tasklock --config {config} peek j --json",
        env=env,
    )  # fmt: skip
    assert own.returncode == 0, own.stderr
    assert _lease_seconds(own.stdout) == 47
    missing = tasklock("peek", "k", "--config", str(tmp_path / "nope.toml"), env=env)
    assert missing.returncode == 78
    one_error_line(missing.stderr)


# -- --log-format, -v, -q ----------------------------------------------------------------


def test_log_format_and_quiet_after_list(env, held_in_env_store):
    result = tasklock("list", "-q", "--log-format", "json", "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert [entry["key"] for entry in json.loads(result.stdout)] == ["k"]
    assert result.stderr == ""


def test_log_format_after_run_shows_a_conflict_as_json(env, held_in_env_store):
    result = tasklock("run", "k", "--log-format", "json", "--", "true", env=env)
    assert result.returncode == 75
    [event] = json_events(result.stderr)
    assert event["event"] == "conflict" and event["key"] == "k"
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["run", "k", "-q", "--", "true"], False),
        (["-v", "run", "k", "--quiet", "--", "true"], False),
        (["-q", "run", "k", "-v", "--", "true"], True),
        (["-q", "run", "k", "-vv", "--", "true"], True),
        (["--log-format", "json", "run", "k", "--log-format", "text", "--", "true"], True),
    ],
    ids=["quiet-after", "quiet-after-verbose", "verbose-after-quiet", "vv-after", "text-after"],
)
def test_the_later_verbosity_and_format_win(env, held_in_env_store, argv, shown):
    result = tasklock(*argv, env=env)
    assert result.returncode == 75
    if shown:
        [line] = result.stderr.splitlines()
        assert line.startswith("tasklock: ") and line.endswith("; not running the command")
    else:
        assert result.stderr == ""


def test_verbose_and_quiet_on_the_same_side_are_a_usage_error(env):
    result = tasklock("peek", "k", "-v", "-q", env=env)
    assert result.returncode == 2
    assert one_error_line(result.stderr) == "tasklock: error: -v and -q exclude each other"


def test_a_bad_log_format_after_the_command_is_a_usage_error(env):
    result = tasklock("peek", "k", "--log-format", "xml", env=env)
    assert result.returncode == 2
    assert "invalid --log-format 'xml'" in one_error_line(result.stderr)


def test_command_help_mentions_the_global_options(env):
    result = tasklock("peek", "--help", env=env)
    assert result.returncode == 0
    assert "Global options (--store, --config, --log-format, -v, -q) may also come after" in (
        " ".join(result.stdout.split())
    )
    assert "--store URL" not in result.stdout  # listed once, under tasklock --help


def test_runs_help_says_where_global_options_go_and_it_is_so(env):
    """For run, a global option after the command is the command's argument: its help says
    so, and names KEY as the other lines do (typer 0.28's usage line said {KEY})."""
    shown = tasklock("run", "--help", env=env)
    assert shown.returncode == 0
    usage, *_ = shown.stdout.splitlines()
    assert usage == "Usage: tasklock run [OPTIONS] KEY [--] COMMAND [ARG...]"
    text = " ".join(shown.stdout.split())
    assert "may also come after KEY, before COMMAND (after COMMAND they are its arguments)" in text
    after_key = tasklock("run", "k", "-q", "--log-format", "json", "--", "echo", "hi", env=env)
    assert (after_key.returncode, after_key.stdout, after_key.stderr) == (0, "hi\n", "")
    after_command = tasklock("run", "k", "--", "echo", "hi", "-q", env=env)
    assert (after_command.returncode, after_command.stdout) == (0, "hi -q\n")
    for other in ("peek", "release", "history"):
        assert f"tasklock {other} [OPTIONS] KEY" in tasklock(other, "--help", env=env).stdout
