"""Queue controls through the real executable, on every store: ``--priority`` serves the
highest first (arrival order among equals, the writer rule kept in that order), ``peek``
shows it, and ``--max-waiting`` gives up at once with ``reason: queue-full``."""

from __future__ import annotations

import json
import time

from tests.support.cli import json_events
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_until
from tests.test_cli_queue import _finish
from tests.test_cli_queue import _queue_length
from tests.test_cli_queue import _start_holder


def _start_waiter(env, url: str, key: str, name: str, order: str, *options: str):
    """A run of ``key`` that appends ``name`` to ``order``, in the queue when this returns."""
    before = _queue_length(url, key)
    command = ["sh", "-c", f'echo {name} >> "$0"', order]
    run = start("run", key, "--wait", "60", "--note", name, *options, "--", *command, env=env)
    wait_until(lambda: _queue_length(url, key) == before + 1, timeout=20)
    return run


def _served(order: str) -> list[str]:
    with open(order) as served:
        return served.read().split()


def test_the_highest_priority_is_served_first_whatever_the_arrival(env, store_url, tmp_path):
    go, order = str(tmp_path / "go"), str(tmp_path / "order")
    holder = _start_holder(env, store_url, "q", go)
    runs = [
        _start_waiter(env, store_url, "q", "A", order),
        _start_waiter(env, store_url, "q", "B", order, "--priority", "0"),
        _start_waiter(env, store_url, "q", "C", order, "--priority", "5"),
        _start_waiter(env, store_url, "q", "D", order, "--priority", "-3"),
    ]
    peeked = json.loads(tasklock("peek", "q", "--json", env=env).stdout)
    shown = [(w["note"], w["priority"]) for w in peeked["waiters"]]
    assert shown == [("C", 5), ("A", 0), ("B", 0), ("D", -3)]
    assert "priority 5" in tasklock("peek", "q", env=env).stdout
    open(go, "w").close()
    assert _finish([holder, *runs]) == [0] * 5
    assert _served(order) == ["C", "A", "B", "D"]


def test_an_exclusive_waiter_blocks_the_shared_runs_behind_it_in_priority_order(
    env, store_url, tmp_path
):
    """X (priority 5) came last but goes first, and the shared runs behind it wait for it;
    S2's higher priority takes it ahead of S1."""
    go, order = str(tmp_path / "go"), str(tmp_path / "order")
    holder = _start_holder(env, store_url, "rw", go)
    runs = [
        _start_waiter(env, store_url, "rw", "S1", order, "--shared"),
        _start_waiter(env, store_url, "rw", "S2", order, "--shared", "--priority", "2"),
        _start_waiter(env, store_url, "rw", "X", order, "--priority", "5"),
    ]
    peeked = json.loads(tasklock("peek", "rw", "--json", env=env).stdout)
    assert [w["note"] for w in peeked["waiters"]] == ["X", "S2", "S1"]
    open(go, "w").close()
    assert _finish([holder, *runs]) == [0] * 4
    assert _served(order)[0] == "X"
    assert sorted(_served(order)[1:]) == ["S1", "S2"]


def test_max_waiting_gives_up_at_once_when_the_queue_is_that_long(env, store_url, tmp_path):
    go, order = str(tmp_path / "go"), str(tmp_path / "order")
    holder = _start_holder(env, store_url, "cap", go)
    waiter = _start_waiter(env, store_url, "cap", "A", order)
    began = time.monotonic()
    capped = tasklock(
        "--log-format", "json", "run", "cap", "--wait", "60", "--max-waiting", "1",
        "--", "sh", "-c", 'echo never >> "$0"', order, env=env,
    )  # fmt: skip
    assert capped.returncode == 75, capped.stderr
    assert time.monotonic() - began < 5  # (not the 60 s wait)
    (conflict,) = [e for e in json_events(capped.stderr) if e["event"] == "conflict"]
    assert conflict["reason"] == "queue-full" and conflict["key"] == "cap"
    assert _queue_length(store_url, "cap") == 1  # it never joined
    room = tasklock(
        "run", "cap", "--max-waiting", "1", "--conflict-exit-code", "9", "true", env=env
    )
    assert room.returncode == 9  # (--wait 0 never joins: a plain conflict)
    open(go, "w").close()
    assert _finish([holder, waiter]) == [0, 0]
    assert _served(order) == ["A"]


def test_max_waiting_0_never_waits(env, store_url, tmp_path):
    go = str(tmp_path / "go")
    holder = _start_holder(env, store_url, "none", go)
    began = time.monotonic()
    run = tasklock(
        "--log-format", "json", "run", "none", "--wait", "60", "--max-waiting", "0",
        "--", "true", env=env,
    )  # fmt: skip
    assert run.returncode == 75
    assert time.monotonic() - began < 5
    assert [e.get("reason") for e in json_events(run.stderr) if e["event"] == "conflict"] == [
        "queue-full"
    ]
    open(go, "w").close()
    assert _finish([holder]) == [0]
