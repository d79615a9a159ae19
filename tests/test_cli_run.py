"""`tasklock run` through the real executable on the default SQLite store."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tasklock_cli.stores import open_store
from tests.support import procs
from tests.support.cli import json_events
from tests.support.cli import lost_by
from tests.support.cli import one_error_line
from tests.support.cli import peek
from tests.support.cli import piped
from tests.support.cli import python
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until


@pytest.fixture
def store_url(sqlite_url):
    """These tests run on SQLite alone: ``env`` (conftest) names the store of ``sqlite_url``."""
    return sqlite_url


def test_runs_the_command_and_passes_its_output_and_exit_code(env):
    result = tasklock("run", "demo", "--", "sh", "-c", "echo hello; echo oops >&2; exit 3", env=env)
    assert result.returncode == 3
    assert result.stdout == "hello\n"
    assert result.stderr == "oops\n"  # nothing of tasklock's own on a quiet success


def test_default_store_is_created_under_xdg_state_home(cli_env):
    result = tasklock("run", "demo", "--", "echo", "hello", env=cli_env)
    assert result.returncode == 0 and result.stdout == "hello\n"
    assert os.path.exists(os.path.join(cli_env["XDG_STATE_HOME"], "tasklock", "locks.db"))


def test_child_environment_has_key_token_and_expiry(env):
    script = 'echo "$TASKLOCK_KEY|$TASKLOCK_FENCING_TOKEN|$TASKLOCK_LEASE_EXPIRES_AT"'
    first = tasklock("run", "jobs:x", "--ttl", "45s", "--", "sh", "-c", script, env=env)
    second = tasklock("run", "jobs:x", "--", "sh", "-c", script, env=env)
    key, token, expires = first.stdout.strip().split("|")
    assert key == "jobs:x"
    assert int(second.stdout.split("|")[1]) > int(token) >= 1
    assert expires.endswith("Z") and "T" in expires


def test_killed_child_gives_128_plus_signal(env):
    result = tasklock("run", "k", "--", "sh", "-c", "kill -KILL $$", env=env)
    assert result.returncode == 128 + signal.SIGKILL


def test_conflict_exits_75_without_running_the_command(env, sqlite_url, tmp_path):
    holder = start("run", "k", "--note", "the holder", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(sqlite_url, "k")
        marker = tmp_path / "ran"
        result = tasklock("run", "k", "--", "touch", str(marker), env=env)
        assert result.returncode == 75
        assert not marker.exists()
        line = result.stderr.strip()
        assert "'k' is held by" in line and f"pid {holder.pid}" in line

        custom = tasklock("run", "k", "--conflict-exit-code", "0", "--", "true", env=env)
        assert custom.returncode == 0

        quiet = tasklock("-q", "run", "k", "--", "true", env=env)
        assert quiet.returncode == 75 and quiet.stderr == ""

        as_json = tasklock("--log-format", "json", "run", "k", "--", "true", env=env)
        (event,) = json_events(as_json.stderr)
        assert event["event"] == "conflict" and event["key"] == "k"
        assert event["holder"]["pid"] == holder.pid and event["holder"]["note"] == "the holder"
    finally:
        holder.terminate()
        holder.wait()


def test_wait_gets_the_lock_when_the_holder_releases(env, sqlite_url, tmp_path):
    go = tmp_path / "go"
    holder = start(
        "run", "k", "--", "sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.02; done', str(go), env=env
    )
    wait_for_holder(sqlite_url, "k")
    waiter = start(
        "--log-format", "json", "run", "k", "--wait", "20s", "--", "echo", "mine", env=env
    )
    with open_store(sqlite_url) as store:
        wait_until(lambda: store.waiters("k"), timeout=20)  # it waits: only then let go
    go.touch()
    stdout, stderr = waiter.communicate(timeout=30)
    assert holder.wait(timeout=30) == 0
    assert waiter.returncode == 0 and stdout == "mine\n"
    events = [e["event"] for e in json_events(stderr)]
    assert events == ["waiting", "acquired", "released"]


def test_wait_runs_out_with_a_conflict(env, sqlite_url):
    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(sqlite_url, "k")
        started = time.monotonic()
        result = tasklock("run", "k", "--wait", "600ms", "--", "true", env=env)
        assert result.returncode == 75
        assert time.monotonic() - started >= 0.6
        assert "waiting for 'k' held by" in result.stderr
    finally:
        holder.terminate()
        holder.wait()


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (["/nonexistent/program"], 127),
        (["no-such-command-anywhere"], 127),
        (["/etc/hostname"], 126),
    ],
)
def test_command_not_found_or_not_executable_releases_the_lock(env, sqlite_url, command, code):
    result = tasklock("run", "k", "--", *command, env=env)
    assert result.returncode == code
    assert command[0] in one_error_line(result.stderr)
    assert peek(sqlite_url, "k") is None


def test_verbose_text_shows_acquired_and_released(env):
    result = tasklock("-v", "run", "k", "--", "true", env=env)
    assert result.returncode == 0
    assert "acquired 'k' (fencing token" in result.stderr
    assert "released 'k'" in result.stderr


def test_release_is_immediate_after_the_child_exits(env, sqlite_url):
    assert tasklock("run", "k", "--ttl", "1h", "--", "true", env=env).returncode == 0
    assert peek(sqlite_url, "k") is None


def test_hold_at_least_keeps_the_lease_after_an_early_exit(env, sqlite_url):
    assert tasklock("run", "k", "--hold-at-least", "1500ms", "--", "true", env=env).returncode == 0
    info = peek(sqlite_url, "k")
    assert info is not None
    assert tasklock("run", "k", "--", "true", env=env).returncode == 75
    wait_until(lambda: peek(sqlite_url, "k") is None, timeout=5)
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0


def test_force_release_terminates_the_holder_with_70(env, sqlite_url, tmp_path):
    log = tmp_path / "log"
    holder = start(
        "--log-format",
        "json",
        "run",
        "k",
        "--ttl",
        "2s",
        "--",
        "sh",
        "-c",
        f"trap 'echo term >> {log}; exit 0' TERM; sleep 30 & wait",
        env=env,
    )
    info = wait_for_holder(sqlite_url, "k")
    broke = tasklock("release", "k", "--force", env=env)
    assert broke.returncode == 0 and f"pid {holder.pid}" in broke.stdout
    _, stderr = holder.communicate(timeout=10)
    assert holder.returncode == 70
    lost = [e for e in json_events(stderr) if e["event"] == "lost"]
    assert lost and lost[0]["detected_by"] == "rejected"
    assert lost[0]["fencing_token"] == info.fencing_token
    assert log.read_text() == "term\n"


def test_max_lifetime_terminates_with_70(env):
    started = time.monotonic()
    result = tasklock(
        "--log-format", "json", "run", "k", "--max-lifetime", "700ms", "--", "sleep", "30", env=env
    )
    assert result.returncode == 70
    assert time.monotonic() - started < 10
    (lost,) = [e for e in json_events(result.stderr) if e["event"] == "lost"]
    assert lost["detected_by"] == "max-lifetime"


@pytest.mark.parametrize("signame", ["INT", "TERM", "HUP", "QUIT", "USR1", "USR2"])
def test_signals_are_forwarded_to_the_child(env, sqlite_url, tmp_path, signame):
    log = tmp_path / "log"
    ready = tmp_path / "ready"
    script = (
        f"trap 'echo {signame} > {log}; exit 9' {signame}; touch {ready}; "
        "while :; do sleep 0.05; done"
    )
    wrapper = start("run", "k", "--", "sh", "-c", script, env=env)
    wait_until(ready.exists)
    wrapper.send_signal(getattr(signal, f"SIG{signame}"))
    assert wrapper.wait(timeout=10) == 9
    assert log.read_text() == f"{signame}\n"
    assert peek(sqlite_url, "k") is None


def test_sigterm_releases_at_once(env, sqlite_url):
    wrapper = start("run", "k", "--ttl", "1h", "--", "sleep", "30", env=env)
    wait_for_holder(sqlite_url, "k")
    wrapper.terminate()
    assert wrapper.wait(timeout=10) == 128 + signal.SIGTERM
    assert peek(sqlite_url, "k") is None
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0


@pytest.mark.parametrize("signame", ["TERM", "INT", "HUP"])
def test_a_signal_while_waiting_stops_the_wait_and_leaves_the_queue(
    env, sqlite_url, tmp_path, signame
):
    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(sqlite_url, "k")
        waiter = start("--log-format", "json", "run", "k", "--wait", "inf", "--", "true", env=env)
        assert json.loads(piped(waiter.stderr).readline())["event"] == "waiting"
        waiter.send_signal(getattr(signal, f"SIG{signame}"))
        assert waiter.wait(timeout=10) == 128 + getattr(signal, f"SIG{signame}")
        assert piped(waiter.stderr).read() == ""  # no traceback, no error line
        assert list((tmp_path / "locks.db.waiters").glob("*")) == []  # no FIFO left
        held = peek(sqlite_url, "k")
        assert held is not None and held.holder.pid == holder.pid
    finally:
        holder.terminate()
        holder.wait()


def test_a_hand_off_leaves_no_wake_up_entry_behind(env, sqlite_url, tmp_path):
    """The holder's break FIFO, the waiter's queue FIFO and their key directories are gone
    once both runs ended: the waiter's directory, kept past its acquire so that removing it
    is not part of the hand-off, is tidied at its release."""
    go = tmp_path / "go"
    wait_for_go = f'while [ ! -e "{go}" ]; do sleep 0.01; done'
    holder = start("run", "k", "--", "sh", "-c", wait_for_go, env=env)
    waiters, holders = tmp_path / "locks.db.waiters", tmp_path / "locks.db.holders"
    try:
        wait_for_holder(sqlite_url, "k")
        waiter = start("--log-format", "json", "run", "k", "--wait", "inf", "--", "true", env=env)
        assert json.loads(piped(waiter.stderr).readline())["event"] == "waiting"
        wait_until(lambda: list(holders.glob("*/*")) and list(waiters.glob("*/*")), timeout=10)
        go.touch()
        assert holder.wait(timeout=10) == 0
        assert waiter.wait(timeout=10) == 0
    finally:
        go.touch()
        holder.wait(timeout=10)
    assert list(waiters.glob("*")) == []
    assert list(holders.glob("*")) == []


def test_child_ignoring_sigterm_is_killed_after_grace(env, sqlite_url, tmp_path):
    ready = tmp_path / "ready"
    wrapper = start(
        "run",
        "k",
        "--grace",
        "500ms",
        "--",
        "sh",
        "-c",
        f"trap '' TERM; touch {ready}; while :; do sleep 0.05; done",
        env=env,
    )
    wait_until(ready.exists)
    sent = time.monotonic()
    wrapper.terminate()
    assert wrapper.wait(timeout=10) == 128 + signal.SIGKILL
    assert time.monotonic() - sent >= 0.45
    assert peek(sqlite_url, "k") is None


def test_a_background_job_is_terminated_before_the_release(env, sqlite_url, tmp_path):
    """`sh -c 'job &'` returns at once: the job must not run on unlocked, so it gets
    SIGTERM before the lease is released (more in tests/test_containment.py)."""
    log, ready = tmp_path / "log", tmp_path / "ready"
    job = (
        f"(trap 'echo term >> {log}; exit 0' TERM; touch {ready}; while :; do sleep 0.05; done) &"
        f" while [ ! -e {ready} ]; do sleep 0.01; done"  # its trap is set: now exit
    )
    result = tasklock("run", "k", "--", "sh", "-c", job, env=env)
    assert result.returncode == 0, result.stderr
    assert log.read_text() == "term\n"
    assert peek(sqlite_url, "k") is None


# Crash and pause of the wrapper, on every store: tests/test_faults_stores.py.


def test_lazy_imports_sqlite_path_imports_no_network_driver(env):
    code = (
        "import sys\n"
        "from tasklock_cli.cli.app import run_cli\n"
        "for argv in (['--help'], ['run', 'k', '--', 'true'], ['list']):\n"
        "    assert run_cli(argv) == 0, argv\n"
        "bad = [m for m in ('psycopg', 'redis') if m in sys.modules]\n"
        "print(bad)\n"
    )
    result = python(code, env)
    assert result.stdout.strip().splitlines()[-1] == "[]", result.stderr


def test_orphaned_grandchildren_are_reaped_no_zombies(env, tmp_path):
    """Orphans of the command are re-parented to its guard (subreaper) and reaped by it."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    wrapper = start(
        "run",
        "k",
        "--",
        "sh",
        "-c",
        f"for i in 1 2 3 4 5; do (sleep 0.05 &); done; touch {ready}; "
        f"while [ ! -e {go} ]; do sleep 0.02; done",
        env=env,
    )
    wait_until(ready.exists)
    (guard,) = procs.children(wrapper.pid)
    # The orphans exit after 0.05 s and the guard reaps them: the command (the scan sees
    # the guard's children) is left alone under it, however late; a zombie would stay.
    wait_until(lambda: [proc.state != "Z" for proc in procs.children(guard.pid)] == [True])
    go.touch()
    assert wrapper.wait(timeout=10) == 0


def test_loss_terminates_what_the_command_started_outside_its_group(env, sqlite_url, tmp_path):
    """A job the command moved to a session of its own (setsid) is still under the lock: on
    loss it gets SIGTERM too, not only the SIGKILL after --grace."""
    log, ready = tmp_path / "log", tmp_path / "ready"
    job = f"trap 'echo term >> {log}; exit 0' TERM; touch {ready}; while :; do sleep 0.05; done"
    command = f'setsid sh -c "{job}" & while :; do sleep 0.05; done'
    wrapper = start(
        "--log-format", "json", "run", "k", "--grace", "5s", "--", "sh", "-c", command, env=env
    )
    wait_until(ready.exists)
    assert tasklock("release", "k", "--force", env=env).returncode == 0
    _, stderr = wrapper.communicate(timeout=15)
    assert wrapper.returncode == 70
    assert lost_by(stderr) == ["rejected"]
    assert log.read_text() == "term\n"


def _imported_modules(env: dict[str, str], *args: str) -> set[str]:
    """The modules a real `tasklock ...` imports, from -X importtime."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tasklock_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return {
        line.split("|")[-1].strip().split(".")[0]
        for line in result.stderr.splitlines()
        if line.startswith("import time:")
    }


def test_a_plain_run_never_imports_the_cli_framework(env):
    """`run KEY [OPTIONS] -- COMMAND` is parsed without typer (start-up cost); anything
    else (here, help) still goes through typer."""
    plain = _imported_modules(env, "-v", "run", "k", "--ttl", "5s", "-q", "--", "true")
    unwanted = {"typer", "click", "rich", "psycopg", "redis", "secrets", "tomllib", "_hashlib"}
    assert not plain & unwanted, plain
    assert "typer" in _imported_modules(env, "run", "--help")
