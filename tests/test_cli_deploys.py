"""Deploy queues through the real executable, on every store: `run --replace` (cancel the
running deploy: never beside the old tree) and `run --supersede` (only the newest waits)."""

from __future__ import annotations

import json
import time

from tasklock_cli.stores import open_store
from tests.support import procs
from tests.support.cli import json_events
from tests.support.cli import lost_by
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until

#: The old deploy: a process tree (a shell and a background child) that runs until killed,
#: writing the tree's pids to the file named by its first argument.
OLD_DEPLOY = 'sleep 300 & echo "$$ $!" > "$0"; wait'
#: The new deploy: fails (99) when a process of the old tree, named by pid and start time
#: in the file ``$0``, is still running when it starts; else records that it ran.
NEW_DEPLOY = """
while read pid start; do
  if [ -r /proc/$pid/stat ] && [ "$(cut -d' ' -f22 /proc/$pid/stat)" = "$start" ]; then
    echo "old process $pid still running" >&2; exit 99
  fi
done < "$0"
echo ran > "$1"
"""


def _waiters(url: str, key: str) -> list[int]:
    with open_store(url) as store:
        return [waiter.holder.pid for waiter in store.waiters(key)]


def _old_tree(tmp_path, env, url: str, key: str):
    pids = tmp_path / "old-pids"
    old = start(
        "--log-format", "json", "run", key, "--ttl", "20s", "--",
        "sh", "-c", OLD_DEPLOY, str(pids), env=env,
    )  # fmt: skip
    wait_for_holder(url, key)
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2)
    identified = procs.identities([int(pid) for pid in pids.read_text().split()])
    assert len(identified) == 2
    (tmp_path / "old-tree").write_text("".join(f"{pid} {st}\n" for pid, st in identified))
    return old, identified


def test_replace_ends_the_old_tree_before_the_new_command_starts(env, store_url, tmp_path):
    old, identified = _old_tree(tmp_path, env, store_url, "deploy:prod")
    ran = tmp_path / "ran"
    started = time.monotonic()
    new = tasklock(
        "--log-format", "json", "run", "deploy:prod", "--replace", "--",
        "sh", "-c", NEW_DEPLOY, str(tmp_path / "old-tree"), str(ran), env=env,
    )  # fmt: skip
    assert new.returncode == 0, new.stderr
    assert ran.read_text() == "ran\n"
    # a responsive holder lets go within a second or two, not at its lease's end (20 s)
    assert time.monotonic() - started < 10
    _, old_stderr = old.communicate(timeout=30)
    assert old.returncode == 70, old_stderr
    assert lost_by(old_stderr) == ["replaced"]
    assert procs.still_running(identified) == []
    (replaced, *_) = [
        run
        for run in json.loads(tasklock("history", "deploy:prod", "--json", env=env).stdout)
        if run["pid"] == old.pid
    ]
    assert (replaced["outcome"], replaced["detected_by"]) == ("lost", "replaced")
    broken_by = replaced["broken_by"]
    assert set(broken_by) == {"host", "pid", "user"}
    assert broken_by["pid"] != old.pid and broken_by["user"] == replaced["user"]
    (lost,) = [event for event in json_events(old_stderr) if event["event"] == "lost"]
    who = f"{broken_by['host']} pid {broken_by['pid']} (user {broken_by['user']})"
    assert lost["detail"] == f"replaced by run --replace from {who}"  # the holder is told


def test_replace_goes_ahead_of_the_waiting_runs(env, store_url, tmp_path):
    old, _ = _old_tree(tmp_path, env, store_url, "deploy:prod")
    order = tmp_path / "order"
    waiter = start(
        "run", "deploy:prod", "--wait", "60", "--", "sh", "-c", 'echo waiter >> "$0"', str(order),
        env=env,
    )  # fmt: skip
    wait_until(lambda: _waiters(store_url, "deploy:prod") == [waiter.pid], timeout=20)
    new = tasklock(
        "run", "deploy:prod", "--replace", "--", "sh", "-c", 'echo replacer >> "$0"', str(order),
        env=env,
    )  # fmt: skip
    assert new.returncode == 0, new.stderr
    assert waiter.wait(timeout=60) == 0
    assert old.wait(timeout=30) == 70
    assert order.read_text().split() == ["replacer", "waiter"]


def test_replace_on_a_free_key_is_a_plain_run(env):
    done = tasklock("--log-format", "json", "run", "k", "--replace", "--", "true", env=env)
    assert done.returncode == 0, done.stderr
    assert [event["event"] for event in json_events(done.stderr)] == ["acquired", "released"]
    assert tasklock("peek", "k", env=env).returncode == 1


def test_supersede_keeps_only_the_newest_waiting_run(env, store_url, tmp_path):
    go, order = tmp_path / "go", tmp_path / "order"
    holder = start(
        "run", "deploy", "--", "sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.02; done', str(go),
        env=env,
    )  # fmt: skip
    wait_for_holder(store_url, "deploy")

    def waiting_run(name: str, *flags: str):
        run = start(
            "--log-format", "json", "run", "deploy", "--wait", "60", *flags, "--",
            "sh", "-c", f'echo {name} >> "$0"', str(order), env=env,
        )  # fmt: skip
        wait_until(lambda: run.pid in _waiters(store_url, "deploy"), timeout=20)
        return run

    older = waiting_run("older", "--supersede")
    plain = waiting_run("plain")
    newer = waiting_run("newer", "--supersede")
    superseded_at = time.monotonic()
    _, older_stderr = older.communicate(timeout=20)
    # told at once (at the latest at its next attempt, within a second)
    assert time.monotonic() - superseded_at < 3
    assert older.returncode == 75, older_stderr
    (event,) = [e for e in json_events(older_stderr) if e["event"] == "superseded"]
    assert event["key"] == "deploy"
    assert _waiters(store_url, "deploy") == [plain.pid, newer.pid]
    go.touch()
    assert [run.wait(timeout=60) for run in (holder, plain, newer)] == [0, 0, 0]
    assert order.read_text().split() == ["plain", "newer"]


def test_supersede_uses_the_conflict_exit_code(env, store_url, tmp_path):
    go = tmp_path / "go"
    holder = start(
        "run", "k", "--", "sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.02; done', str(go),
        env=env,
    )  # fmt: skip
    wait_for_holder(store_url, "k")
    older = start(
        "run", "k", "--wait", "60", "--supersede", "--conflict-exit-code", "9", "--", "true",
        env=env,
    )  # fmt: skip
    wait_until(lambda: older.pid in _waiters(store_url, "k"), timeout=20)
    newer = start("run", "k", "--wait", "60", "--supersede", "--", "true", env=env)
    _, stderr = older.communicate(timeout=20)
    assert older.returncode == 9
    assert "newer --supersede run" in stderr
    go.touch()
    assert [holder.wait(timeout=60), newer.wait(timeout=60)] == [0, 0]
