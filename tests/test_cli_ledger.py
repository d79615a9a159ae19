"""The run ledger through the real executable: every run that held the lease leaves one
record, written with its release; `history` shows them newest first."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime

import pytest

from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder


def history_json(key: str, env: dict[str, str], *args: str) -> list[dict]:
    result = tasklock("history", key, "--json", *args, env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_history_after_runs_exiting_0_4_0_newest_first(env):
    for code in (0, 4, 0):
        result = tasklock(
            "run", "job", "--note", f"n{code}", "--", "sh", "-c", f"exit {code}", env=env
        )
        assert result.returncode == code, result.stderr

    runs = history_json("job", env)
    assert [(r["outcome"], r["exit_code"]) for r in runs] == [
        ("succeeded", 0),
        ("failed", 4),
        ("succeeded", 0),
    ]
    tokens = [r["fencing_token"] for r in runs]
    assert tokens == sorted(tokens, reverse=True) and len(set(tokens)) == 3
    newest = runs[0]
    assert set(newest) == {
        "key",
        "fencing_token",
        "slot",
        "host",
        "pid",
        "user",
        "command",
        "note",
        "started_at",
        "ended_at",
        "exit_code",
        "outcome",
        "detected_by",
        "broken_by",
        "mode",
    }
    assert newest["key"] == "job" and newest["slot"] == 0 and newest["detected_by"] is None
    assert newest["mode"] == "exclusive"
    assert newest["command"] == ["sh", "-c", "exit 0"] and newest["note"] == "n0"
    assert isinstance(newest["pid"], int) and newest["host"] and newest["user"]
    started = datetime.fromisoformat(newest["started_at"].replace("Z", "+00:00"))
    ended = datetime.fromisoformat(newest["ended_at"].replace("Z", "+00:00"))
    assert started <= ended
    assert history_json("job", env, "--limit", "2") == runs[:2]


def test_history_of_a_key_never_run_is_empty(env):
    assert tasklock("history", "never", "--json", env=env).stdout == "[]\n"
    piped = tasklock("history", "never", env=env)
    assert (piped.returncode, piped.stdout, piped.stderr) == (0, "", "")


@pytest.mark.parametrize("limit", ["0", "-1", "x"])
def test_history_limit_must_be_a_positive_integer(env, limit):
    result = tasklock("history", "k", "--limit", limit, env=env)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""


def test_history_piped_is_tab_separated(sqlite_url, cli_env):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    assert (
        tasklock("run", "k", "--note", "a\tb", "--", "sh", "-c", "exit 3", env=env).returncode == 3
    )
    result = tasklock("history", "k", env=env)
    (line,) = result.stdout.splitlines()
    fields = line.split("\t")
    assert len(fields) == 12
    assert fields[2:7] == ["1", "0", "failed", "3", ""]
    assert fields[10:] == ["a\\tb", "sh -c exit 3"]  # a tab in a field: escaped


def test_a_forced_release_is_recorded_as_lost_rejected(env, store_url):
    holder = start("run", "k", "--ttl", "30s", "--", "sleep", "30", env=env)
    try:
        info = wait_for_holder(store_url, "k")
        assert tasklock("release", "k", "--force", env=env).returncode == 0
        assert holder.wait(timeout=20) == 70
    finally:
        holder.kill()
        holder.wait()
    (run,) = history_json("k", env)
    assert run["fencing_token"] == info.fencing_token
    assert (run["outcome"], run["detected_by"], run["exit_code"]) == ("lost", "rejected", None)


def test_signalled_and_not_found_commands_are_recorded(sqlite_url, cli_env):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    assert tasklock("run", "k", "--", "sh", "-c", "kill -TERM $$", env=env).returncode == 143
    assert tasklock("run", "k", "--", "no-such-command-here", env=env).returncode == 127
    runs = history_json("k", env)
    assert [(r["outcome"], r["exit_code"]) for r in runs] == [("failed", 127), ("signalled", 143)]


def test_a_failing_ledger_write_keeps_the_commands_exit_code(tmp_path, cli_env):
    path = tmp_path / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite:///{path}"}
    assert tasklock("init", env=env).returncode == 0
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TRIGGER no_runs BEFORE INSERT ON tasklock_runs "
            "BEGIN SELECT RAISE(ABORT, 'ledger refused'); END"
        )
    result = tasklock("--log-format", "json", "run", "k", "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    warnings = [e for e in events if e["event"] == "warning"]
    assert len(warnings) == 1 and "ledger refused" in warnings[0]["message"]
    assert [e["event"] for e in events if e["event"] == "released"] == ["released"]
    assert tasklock("peek", "k", env=env).returncode == 1  # released all the same
    assert tasklock("run", "k", "--", "sh", "-c", "exit 5", env=env).returncode == 5
    assert history_json("k", env) == []
