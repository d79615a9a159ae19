"""peek, list, sweep, release --force, init, doctor, and bad input, through the real executable."""

from __future__ import annotations

import json
import os
import sqlite3
import time

import pytest

from tests.support.cli import one_error_line
from tests.support.cli import peek
from tests.support.cli import piped
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder


@pytest.fixture
def store_url(sqlite_url):
    """These tests run on SQLite alone: ``env`` (conftest) names the store of ``sqlite_url``."""
    return sqlite_url


@pytest.fixture
def holder(env, sqlite_url):
    process = start("run", "jobs:held", "--note", "from the fixture", "--", "sleep", "60", env=env)
    info = wait_for_holder(sqlite_url, "jobs:held")
    yield process, info
    process.terminate()
    process.wait()


def test_peek_held_and_free(env, holder):
    process, _info = holder
    held = tasklock("peek", "jobs:held", env=env)
    assert held.returncode == 0
    assert f"pid {process.pid}" in held.stdout and "from the fixture" in held.stdout
    free = tasklock("peek", "jobs:free", env=env)
    assert free.returncode == 1 and free.stdout == "jobs:free is free\n"


def test_peek_json(env, holder):
    process, info = holder
    held = json.loads(tasklock("peek", "jobs:held", "--json", env=env).stdout)
    assert held["held"] is True and held["key"] == "jobs:held"
    assert held["holder"] == {
        "host": info.holder.host,
        "pid": process.pid,
        "user": info.holder.user,
        "command": ["sleep", "60"],
        "note": "from the fixture",
        "mode": "exclusive",
    }
    assert held["mode"] == "exclusive"
    assert held["fencing_token"] == info.fencing_token
    assert held["expired"] is False
    assert held["acquired_at"].endswith("Z") and held["expires_at"].endswith("Z")
    free = tasklock("peek", "nope", "--json", env=env)
    assert free.returncode == 1
    assert json.loads(free.stdout) == {"key": "nope", "held": False, "waiters": []}
    assert held["waiters"] == []


def test_list_json_plain_and_prefix(env, holder):
    empty_prefix = tasklock("list", "--prefix", "other:", "--json", env=env)
    assert empty_prefix.returncode == 0 and json.loads(empty_prefix.stdout) == []
    listed = json.loads(tasklock("list", "--json", env=env).stdout)
    assert [entry["key"] for entry in listed] == ["jobs:held"]
    plain = tasklock("list", env=env).stdout.splitlines()
    assert len(plain) == 1 and plain[0].split("\t")[0] == "jobs:held"
    assert plain[0].split("\t")[2] == str(holder[0].pid)


@pytest.mark.slow  # (many leases listed)
def test_a_long_listing_arrives_whole_through_a_pipe(env, sqlite_url):
    """Several pages of leases, written as they are read: nothing lost at exit."""
    from tasklock_cli.stores import open_store
    from tasklock_cli.stores.model import LIST_PAGE
    from tasklock_cli.stores.model import Holder

    store = open_store(sqlite_url)
    keys = [f"bulk:{n:05d}:{'x' * 200}" for n in range(3 * LIST_PAGE + 1)]
    for key in keys:
        store.acquire(key, 300, Holder(host="h", pid=1, user="u", command=["true"]), key)
    store.close()
    as_json = tasklock("list", "--json", env=env)
    assert as_json.returncode == 0
    assert [entry["key"] for entry in json.loads(as_json.stdout)] == keys
    plain = tasklock("list", "--prefix", "bulk:", env=env)
    assert [line.split("\t")[0] for line in plain.stdout.splitlines()] == keys


def test_list_all_shows_expired_until_sweep(env, sqlite_url):
    killed = start("run", "short", "--ttl", "300ms", "--", "sleep", "30", env=env)
    wait_for_holder(sqlite_url, "short")
    killed.kill()
    killed.wait()
    time.sleep(0.5)
    assert json.loads(tasklock("list", "--json", env=env).stdout) == []
    everything = json.loads(tasklock("list", "--all", "--json", env=env).stdout)
    assert [(e["key"], e["expired"]) for e in everything] == [("short", True)]
    assert json.loads(tasklock("sweep", "--dry-run", "--json", env=env).stdout) == {
        "would_remove": 1
    }
    assert json.loads(tasklock("sweep", "--json", env=env).stdout) == {"removed": 1}
    assert tasklock("sweep", env=env).stdout == "removed 0 expired leases\n"
    assert json.loads(tasklock("list", "--all", "--json", env=env).stdout) == []


def test_release_needs_force(env, holder):
    result = tasklock("release", "jobs:held", env=env)
    assert result.returncode == 2 and "--force" in one_error_line(result.stderr)


def test_release_force_of_a_free_key(env):
    result = tasklock("release", "free", "--force", env=env)
    assert result.returncode == 0 and result.stdout == "free was not held\n"


def test_init_and_print_sql(env, sqlite_url):
    result = tasklock("init", env=env)
    assert result.returncode == 0
    sql = tasklock("init", "--print-sql", env=env).stdout
    assert "CREATE TABLE IF NOT EXISTS tasklock_leases" in sql
    scratch = sqlite3.connect(":memory:")
    scratch.executescript(sql)  # valid DDL


def test_doctor(env):
    result = tasklock("doctor", env=env)
    assert result.returncode == 0, result.stdout
    assert "reachable" in result.stdout and "schema" in result.stdout


def test_doctor_redacts_passwords(cli_env):
    env = {**cli_env, "TASKLOCK_STORE": "redis://user:s3cret-pw@127.0.0.1:1/0"}
    result = tasklock("doctor", env=env)
    assert "s3cret-pw" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "key", ['it\'s "q"', "a b", "ключ 🔒", "x'; DROP TABLE tasklock_leases;--", "100%_*{tag}"]
)
def test_unusual_keys_work_through_the_cli(env, sqlite_url, key):
    result = tasklock("run", key, "--", "sh", "-c", 'printf %s "$TASKLOCK_KEY"', env=env)
    assert result.returncode == 0 and result.stdout == key
    assert tasklock("peek", key, env=env).returncode == 1


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["run", "", "--", "true"], "empty"),
        (["run", "a\x01b", "--", "true"], "control character"),
        (["run", "line\nbreak", "--", "true"], "control character"),
        (["run", "x" * 513, "--", "true"], "limit is 512"),
        (["run", "k" * 10_000, "--", "true"], "limit is 512"),
        (["run", "k", "--ttl", "30x", "--", "true"], "invalid --ttl"),
        (["run", "k", "--ttl", "-5s", "--", "true"], ""),
        (["run", "k", "--ttl", "inf", "--", "true"], "--ttl"),
        (["run", "k", "--wait", "soon", "--", "true"], "invalid --wait"),
        (["run", "k", "--grace", "1s1h", "--", "true"], "invalid --grace"),
        (["run", "k", "--ttl", "10s", "--renew-every", "10s", "--", "true"], "--renew-every"),
        (["run", "k", "--conflict-exit-code", "256", "--", "true"], "conflict-exit-code"),
        (["run", "k"], "no command"),
        (["run", "k", "--bogus", "--", "true"], "--bogus"),
        (["--log-format", "xml", "list"], "log-format"),
        (["peek"], ""),
        (["frobnicate"], ""),
    ],
)
def test_usage_errors_exit_2_with_one_line(env, sqlite_url, args, fragment):
    result = tasklock(*args, env=env)
    assert result.returncode == 2, result
    assert fragment in one_error_line(result.stderr)
    assert peek(sqlite_url, "k") is None


def test_invalid_utf8_key_is_a_usage_error(env):
    import subprocess

    from tests.support.cli import executable

    result = subprocess.run(
        [executable().encode(), b"run", b"bad\xff", b"--", b"true"],
        env=env,
        capture_output=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert b"UTF-8" in result.stderr and b"Traceback" not in result.stderr


def test_unknown_scheme_is_a_config_error(env):
    result = tasklock("--store", "mongodb://db/x", "list", env=env)
    assert result.returncode == 78
    assert "unknown store URL" in one_error_line(result.stderr)


def test_unwritable_sqlite_path_is_a_config_error(env, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "sub").mkdir()
    os.chmod(locked / "sub", 0o500)
    if os.geteuid() == 0:
        target = "/proc/tasklock-cannot-be-here/locks.db"
    else:
        target = f"{locked}/sub/deeper/locks.db"
    result = tasklock("--store", f"sqlite:///{target}", "run", "k", "--", "true", env=env)
    assert result.returncode == 78
    one_error_line(result.stderr)


def test_corrupt_database_is_a_clear_error_and_is_not_overwritten(env, tmp_path):
    corrupt = tmp_path / "corrupt.db"
    garbage = b"this is not a sqlite database at all" * 100
    corrupt.write_bytes(garbage)
    result = tasklock("--store", f"sqlite:///{corrupt}", "run", "k", "--", "true", env=env)
    assert result.returncode == 78
    assert "not a tasklock SQLite database" in one_error_line(result.stderr)
    assert corrupt.read_bytes() == garbage


def test_foreign_table_is_refused_and_untouched(env, tmp_path):
    path = tmp_path / "foreign.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE tasklock_leases (id INTEGER PRIMARY KEY, payload TEXT)")
    db.execute("INSERT INTO tasklock_leases (payload) VALUES ('keep me')")
    db.commit()
    db.close()
    result = tasklock("--store", f"sqlite:///{path}", "run", "k", "--", "true", env=env)
    assert result.returncode == 78
    assert "not a tasklock table" in one_error_line(result.stderr)
    assert sqlite3.connect(path).execute("SELECT payload FROM tasklock_leases").fetchall() == [
        ("keep me",)
    ]


def test_verbose_errors_show_a_traceback(env):
    result = tasklock("-v", "--store", "mongodb://x", "list", env=env)
    assert result.returncode == 78
    assert "Traceback" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("tasklock: error: ")


def test_version_and_module_entry_point(env):
    import subprocess
    import sys

    by_script = tasklock("--version", env=env)
    by_module = subprocess.run(
        [sys.executable, "-m", "tasklock_cli", "--version"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert by_script.returncode == 0 and by_script.stdout.startswith("tasklock ")
    assert by_module.stdout == by_script.stdout


def test_list_watch_refreshes_until_interrupted(env, holder):
    import signal

    # A shell's background job inherits SIGINT ignored, and Python keeps it so: give the
    # watcher the default disposition, as at a terminal, whoever runs the tests.
    restore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)  # noqa: E731
    watcher = start("list", "--watch", "--interval", "200ms", env=env, preexec_fn=restore_sigint)
    seen, deadline = "", time.monotonic() + 20  # however slowly a loaded machine starts it
    while seen.count("jobs:held") < 3 and time.monotonic() < deadline:
        line = piped(watcher.stdout).readline()
        if not line:
            break
        seen += line
    watcher.send_signal(signal.SIGINT)
    out, _ = watcher.communicate(timeout=10)
    assert watcher.returncode == 0
    listings = [block for block in (seen + out).split("\n\n") if block.strip()]
    assert len(listings) >= 3
    assert all(block.split("\t")[0] == "jobs:held" for block in listings)
    assert tasklock("list", "--watch", "--json", env=env).returncode == 2


@pytest.mark.parametrize(
    "url", ["redis://:pw-secret@127.0.0.1:1/0", "postgresql://u:pw-secret@127.0.0.1:1/test"]
)
@pytest.mark.parametrize("command", [["run", "k", "--", "true"], ["peek", "k"], ["list"]])
def test_unreachable_store_exits_69_with_the_password_redacted(cli_env, url, command):
    started = time.monotonic()
    result = tasklock("--store", url, *command, env=cli_env)
    assert result.returncode == 69
    line = one_error_line(result.stderr)
    assert "pw-secret" not in line and "***" in line
    assert time.monotonic() - started < 10
