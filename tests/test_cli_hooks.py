"""Hooks through the real executable, on every store: each fires once, at its event, with
its variables; a failing or hanging hook changes neither the exit code nor when the lock is
released; hooks hold no store connection and outlive nothing; config-file defaults apply."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from tests.support.cli import json_events
from tests.support.cli import piped
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_until
from tests.test_cli_queue import _finish
from tests.test_cli_queue import _start_holder

EVENTS = ("start", "success", "failure", "conflict", "lost")
#: A hook that appends its event's variables, as one JSON line, to the file ``$HOOK_LOG``.
RECORD = (
    "python3 -c 'import json, os; print(json.dumps({k: v for k, v in os.environ.items()"
    ' if k.startswith("TASKLOCK_")}))\' >> "$HOOK_LOG"'
)


def _hooks(*events: str, command: str = RECORD) -> list[str]:
    return [option for event in events for option in (f"--on-{event}", command)]


def _fired(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_each_hook_fires_once_at_its_event_with_its_variables(env, tmp_path):
    log = tmp_path / "hooks.log"
    env = {**env, "HOOK_LOG": str(log)}
    seen = tmp_path / "command.env"
    command = ["sh", "-c", f'echo "$TASKLOCK_FENCING_TOKEN" > {seen}; sleep 0.3; exit 0']
    ok = tasklock("run", "h", *_hooks(*EVENTS), "--", *command, env=env)
    assert ok.returncode == 0, ok.stderr
    start_hook, success = _fired(log)
    token = seen.read_text().strip()
    assert start_hook["TASKLOCK_EVENT"] == "start" and "TASKLOCK_EXIT_CODE" not in start_hook
    assert start_hook["TASKLOCK_FENCING_TOKEN"] == token and start_hook["TASKLOCK_KEY"] == "h"
    assert "TASKLOCK_LEASE_EXPIRES_AT" in start_hook and start_hook["TASKLOCK_SLOT"] == "0"
    assert success["TASKLOCK_EVENT"] == "success" and success["TASKLOCK_EXIT_CODE"] == "0"
    assert success["TASKLOCK_FENCING_TOKEN"] == token
    assert 0.3 <= float(success["TASKLOCK_DURATION_S"]) < 10
    log.unlink()
    failed = tasklock("run", "h", *_hooks(*EVENTS), "--", "sh", "-c", "exit 3", env=env)
    assert failed.returncode == 3
    assert [(h["TASKLOCK_EVENT"], h.get("TASKLOCK_EXIT_CODE")) for h in _fired(log)] == [
        ("start", None),
        ("failure", "3"),
    ]


def test_on_conflict_fires_when_held_and_when_the_queue_is_full(env, store_url, tmp_path):
    log, go = tmp_path / "hooks.log", str(tmp_path / "go")
    env = {**env, "HOOK_LOG": str(log)}
    holder = _start_holder(env, store_url, "c", go)
    held = tasklock("run", "c", *_hooks(*EVENTS), "--", "true", env=env)
    full = tasklock(
        "--log-format", "json", "run", "c", "--wait", "30", "--max-waiting", "0",
        *_hooks(*EVENTS), "--", "true", env=env,
    )  # fmt: skip
    assert (held.returncode, full.returncode) == (75, 75)
    fired = _fired(log)
    assert [h["TASKLOCK_EVENT"] for h in fired] == ["conflict", "conflict"]
    assert all(h["TASKLOCK_KEY"] == "c" and "TASKLOCK_EXIT_CODE" not in h for h in fired)
    assert [e["reason"] for e in json_events(full.stderr) if e["event"] == "conflict"] == [
        "queue-full"
    ]
    open(go, "w").close()
    assert _finish([holder]) == [0]


def test_on_lost_then_on_failure_when_the_lease_is_lost(env, tmp_path):
    log = tmp_path / "hooks.log"
    env = {**env, "HOOK_LOG": str(log)}
    breaks_itself = 'tasklock release "$TASKLOCK_KEY" --force >/dev/null; sleep 30'
    run = tasklock("run", "l", *_hooks(*EVENTS), "--", "sh", "-c", breaks_itself, env=env)
    assert run.returncode == 70, run.stderr
    fired = _fired(log)
    assert [h["TASKLOCK_EVENT"] for h in fired] == ["start", "lost", "failure"]
    lost, failure = fired[1:]
    assert lost["TASKLOCK_EXIT_CODE"] == failure["TASKLOCK_EXIT_CODE"] == "143"  # SIGTERM
    assert lost["TASKLOCK_FENCING_TOKEN"] == fired[0]["TASKLOCK_FENCING_TOKEN"]


def test_a_failing_or_hanging_hook_changes_neither_exit_code_nor_release(env, store_url, tmp_path):
    """on-start fails: the command runs. on-failure hangs: the lock is free while it hangs
    (another run takes it at once), it is killed at --hook-timeout with what it started, and
    the exit code is the command's."""
    pids, hanging = tmp_path / "pids", tmp_path / "hanging"
    hang = f"sleep 60 & echo $! > {pids}; touch {hanging}; sleep 60"
    began = time.monotonic()
    run = start(
        "--log-format", "json", "run", "x", "--hook-timeout", "2s", "--on-start", "exit 9",
        "--on-failure", hang, "--", "sh", "-c", "exit 5", env=env,
    )  # fmt: skip
    wait_until(hanging.exists, timeout=20)
    other = tasklock("run", "x", "--", "true", env=env)
    assert other.returncode == 0, other.stderr  # the lease went before the hook ran
    assert run.wait(timeout=30) == 5
    assert time.monotonic() - began < 15  # the 2 s timeout, not the hook's 60 s
    events = json_events(piped(run.stderr).read())
    warnings = [e["message"] for e in events if e["event"] == "warning"]
    assert any("on-start hook" in w and "exited 9" in w for w in warnings), warnings
    assert any("on-failure hook" in w and "killed after 2s" in w for w in warnings), warnings
    left = int(pids.read_text())
    wait_until(lambda: not _running(left), timeout=10)  # the hook's own child is gone too


def test_a_hook_dies_with_tasklock(env, tmp_path):
    """tasklock killed (SIGKILL) while its on-start hook runs: the hook and what it started
    are killed too, within a second or two."""
    pids = tmp_path / "pids"
    hook = f'sleep 60 & echo "$$ $!" > {pids}.tmp; mv {pids}.tmp {pids}; sleep 60'
    run = start("run", "d", "--on-start", hook, "--", "true", env=env)
    wait_until(pids.exists, timeout=20)
    os.kill(run.pid, signal.SIGKILL)
    run.wait(timeout=10)
    left = [int(pid) for pid in pids.read_text().split()]
    wait_until(lambda: not any(_running(pid) for pid in left), timeout=5)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_hooks_inherit_no_descriptor_of_tasklock(env, tmp_path):
    """Store connections (and every other descriptor) are not the hook's: it starts with
    0, 1 and 2 only (3 is the listing's own)."""
    listing = tmp_path / "fds"
    show = f"python3 -c 'import os; print(sorted(os.listdir(\"/proc/self/fd\")))' > {listing}"
    for event in ("start", "success"):
        assert tasklock("run", "f", f"--on-{event}", show, "--", "true", env=env).returncode == 0
        assert listing.read_text().strip() == "['0', '1', '2', '3']", event


def test_config_file_defaults_for_hooks_priority_and_the_queue(env, store_url, tmp_path):
    log, go = tmp_path / "hooks.log", str(tmp_path / "go")
    config = tmp_path / "tasklock.toml"
    config.write_text(
        f'on-success = {json.dumps(RECORD)}\nhook-timeout = "3s"\npriority = 7\n'
        '[keys."capped:*"]\nmax-waiting = 0\n'
    )
    env = {**env, "HOOK_LOG": str(log), "TASKLOCK_CONFIG": str(config)}
    assert tasklock("run", "d", "--", "true", env=env).returncode == 0
    assert [h["TASKLOCK_EVENT"] for h in _fired(log)] == ["success"]
    holder = _start_holder(env, store_url, "capped:1", go)
    capped = tasklock("--log-format", "json", "run", "capped:1", "--wait", "30", "true", env=env)
    assert capped.returncode == 75
    assert "queue-full" in capped.stderr
    waiter = start("run", "capped:1", "--wait", "30", "--max-waiting", "5", "true", env=env)

    def priorities() -> list[int]:
        shown = json.loads(tasklock("peek", "capped:1", "--json", env=env).stdout)
        return [w["priority"] for w in shown["waiters"]]

    assert wait_until(lambda: priorities() == [7], timeout=20)
    open(go, "w").close()
    assert _finish([holder, waiter]) == [0, 0]
