"""The queue of waiting runs through the real executable: served in arrival order on every
store, shown by peek, list and metrics, and a waiter killed in the middle of the queue."""

from __future__ import annotations

import json
import os
import signal
import time

from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import WAITER_TTL_S
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until

#: The holder's command: runs until the test creates the file ``go`` in its directory.
HOLD_UNTIL_GO = 'while [ ! -e "$0" ]; do sleep 0.02; done'


def _queue_length(url: str, key: str) -> int:
    with open_store(url) as store:
        return len(store.waiters(key))


def _start_holder(env, url: str, key: str, go: str):
    holder = start("run", key, "--", "sh", "-c", HOLD_UNTIL_GO, go, env=env)
    wait_for_holder(url, key)
    return holder


def _start_waiters(env, url: str, key: str, count: int, order: str, note: str = "") -> list:
    """``count`` runs of ``key`` that each append their number to ``order``, started one
    after the other: each is in the queue before the next starts."""
    runs = []
    for n in range(count):
        command = ["sh", "-c", f'echo {n} >> "$0"', order]
        runs.append(
            start("run", key, "--wait", "60", "--note", f"{note}{n}", "--", *command, env=env)
        )
        wait_until(lambda: _queue_length(url, key) == len(runs), timeout=20)
    return runs


def _finish(processes: list) -> list[int]:
    return [process.wait(timeout=60) for process in processes]


def test_waiting_runs_are_served_in_arrival_order(env, store_url, tmp_path):
    go, order = str(tmp_path / "go"), str(tmp_path / "order")
    holder = _start_holder(env, store_url, "q", go)
    waiters = _start_waiters(env, store_url, "q", 5, order)
    open(go, "w").close()
    assert _finish([holder, *waiters]) == [0] * 6
    with open(order) as served:
        assert served.read().split() == ["0", "1", "2", "3", "4"]


def test_peek_list_and_metrics_show_the_queue(cli_env, sqlite_url, tmp_path):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    go, order = str(tmp_path / "go"), str(tmp_path / "order")
    holder = _start_holder(env, sqlite_url, "deploy:prod", go)
    waiters = _start_waiters(env, sqlite_url, "deploy:prod", 2, order, note="commit ")
    try:
        peeked = json.loads(tasklock("peek", "deploy:prod", "--json", env=env).stdout)
        assert peeked["held"] is True
        assert [(w["pid"], w["note"], w["mode"]) for w in peeked["waiters"]] == [
            (waiters[0].pid, "commit 0", "exclusive"),
            (waiters[1].pid, "commit 1", "exclusive"),
        ]
        first = peeked["waiters"][0]
        assert set(first) == {"host", "pid", "user", "since", "note", "mode", "priority"}
        assert first["priority"] == 0
        assert first["since"].endswith("Z") and first["user"] == peeked["holder"]["user"]
        text = tasklock("peek", "deploy:prod", env=env).stdout
        assert "waiting   2, served in this order:" in text
        assert text.index(f"pid {waiters[0].pid}") < text.index(f"pid {waiters[1].pid}")
        listed = json.loads(tasklock("list", "--json", env=env).stdout)
        assert [(entry["key"], entry["waiting"]) for entry in listed] == [("deploy:prod", 2)]
        (line,) = tasklock("list", env=env).stdout.splitlines()
        assert line.split("\t")[0] == "deploy:prod" and line.split("\t")[-1] == "2"
        metrics = tasklock("metrics", env=env).stdout
        assert 'tasklock_waiting{key="deploy:prod"} 2\n' in metrics
    finally:
        open(go, "w").close()
        assert _finish([holder, *waiters]) == [0, 0, 0]
    free = json.loads(tasklock("peek", "deploy:prod", "--json", env=env).stdout)
    assert free == {"key": "deploy:prod", "held": False, "waiters": []}


def test_a_waiter_killed_in_the_middle_of_the_queue(env, store_url, tmp_path):
    """The ones behind it are served in order, within the killed waiter's lease."""
    go, order = str(tmp_path / "go"), str(tmp_path / "order")
    holder = _start_holder(env, store_url, "q", go)
    waiters = _start_waiters(env, store_url, "q", 3, order)
    os.kill(waiters[1].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    assert waiters[1].wait(timeout=10) == -signal.SIGKILL
    open(go, "w").close()
    assert _finish([holder, waiters[0], waiters[2]]) == [0, 0, 0]
    with open(order) as served:
        assert served.read().split() == ["0", "2"]
    # etcd keeps a waiter lease in whole seconds, and frees it up to a second late
    assert time.monotonic() - killed_at < WAITER_TTL_S + 2.5
