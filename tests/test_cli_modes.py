"""Lock modes through the real executable, on every store: `run --shared` readers beside
each other and never beside a writer, and `run --also` for several keys at once."""

from __future__ import annotations

import json
import subprocess
import time

from tasklock_cli.stores import open_store
from tests.support.cli import json_events
from tests.support.cli import lost_by
from tests.support.cli import piped
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until

#: Runs until the file named by its first argument exists.
UNTIL = 'while [ ! -e "$0" ]; do sleep 0.02; done'
#: Appends "start NAME" and "end NAME" around a short stay to the log named by $0.
LOGGED = 'echo "start $1" >> "$0"; sleep 0.05; echo "end $1" >> "$0"'


def _holders(url: str, key: str) -> list[tuple[int, str]]:
    with open_store(url) as store:
        return sorted((info.holder.pid, info.mode) for info in store.holders(key))


def _waiters(url: str, key: str) -> list[int]:
    with open_store(url) as store:
        return [waiter.holder.pid for waiter in store.waiters(key)]


def _overlaps(log: str) -> list[str]:
    """Names running beside another of the log's runs."""
    running: set[str] = set()
    beside = []
    for line in log.splitlines():
        what, name = line.split()
        if what == "start":
            if running:
                beside.append(name)
            running.add(name)
        else:
            running.discard(name)
    return beside


# -- --shared ---------------------------------------------------------------------------------


def test_readers_share_and_the_writer_waits_for_them(env, store_url, tmp_path):
    go = tmp_path / "go"
    reader = ["--log-format", "json", "-v", "run", "db", "--shared", "--", "sh", "-c", UNTIL]
    readers = [start(*reader, str(go), env=env) for _ in range(2)]
    wait_until(lambda: len(_holders(store_url, "db")) == 2)
    assert {mode for _, mode in _holders(store_url, "db")} == {"shared"}
    peeked = json.loads(tasklock("peek", "db", "--json", env=env).stdout)
    assert peeked["mode"] == "shared" and len(peeked["holders"]) == 2
    assert all(holder["holder"]["mode"] == "shared" for holder in peeked["holders"])
    assert tasklock("run", "db", "--", "true", env=env).returncode == 75
    writer = start("run", "db", "--wait", "60", "--", "sh", "-c", "echo wrote > $0",
                   str(tmp_path / "wrote"), env=env)  # fmt: skip
    wait_until(lambda: _waiters(store_url, "db") == [writer.pid], timeout=20)
    late_reader = start("run", "db", "--shared", "--wait", "60", "--", "true", env=env)
    wait_until(lambda: _waiters(store_url, "db") == [writer.pid, late_reader.pid], timeout=20)
    assert not (tmp_path / "wrote").exists()
    go.touch()
    outputs = [reader.communicate(timeout=30) for reader in readers]
    assert [reader.returncode for reader in readers] == [0, 0]
    for _, stderr in outputs:
        (acquired,) = [e for e in json_events(stderr) if e["event"] == "acquired"]
        assert acquired["mode"] == "shared"
    assert writer.wait(timeout=60) == 0 and late_reader.wait(timeout=60) == 0


def test_shared_runs_never_overlap_a_writer(env, tmp_path):
    log = tmp_path / "log"
    runs = []
    for n in range(9):
        mode, name = (["--shared"], f"r{n}") if n % 3 else ([], f"w{n}")
        command = ["sh", "-c", LOGGED, str(log), name]
        runs.append(start("run", "db", "--wait", "60", *mode, "--", *command, env=env))
    assert [run.wait(timeout=120) for run in runs] == [0] * 9
    lines = log.read_text().splitlines()
    running: set[str] = set()
    for line in lines:
        what, name = line.split()
        if what == "start":
            assert not (name.startswith("w") and running), lines
            assert not any(other.startswith("w") for other in running), lines
            running.add(name)
        else:
            running.discard(name)


def test_shared_with_limit_is_a_usage_error(env):
    done = tasklock("run", "db", "--shared", "--limit", "2", "--", "true", env=env)
    assert done.returncode == 2
    assert "--shared" in done.stderr and "--limit" in done.stderr


# -- --also -----------------------------------------------------------------------------------


def test_also_holds_every_key_and_names_every_token(env, store_url, tmp_path):
    out = tmp_path / "env"
    done = tasklock(
        "run", "app:staging", "--also", "db:staging", "--",
        "sh", "-c", 'echo "$TASKLOCK_FENCING_TOKEN $TASKLOCK_FENCING_TOKENS" > "$0"', str(out),
        env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    first, tokens = out.read_text().split(" ", 1)
    tokens = json.loads(tokens)
    assert set(tokens) == {"app:staging", "db:staging"}
    assert int(first) == tokens["app:staging"]
    for key in tokens:
        (run,) = json.loads(tasklock("history", key, "--json", env=env).stdout)
        assert (run["fencing_token"], run["outcome"]) == (tokens[key], "succeeded")
        assert tasklock("peek", key, env=env).returncode == 1


def test_also_with_wait_0_holds_none_when_it_cannot_have_all(env, store_url, tmp_path):
    go = tmp_path / "go"
    holder = start("run", "b", "--", "sh", "-c", UNTIL, str(go), env=env)
    wait_for_holder(store_url, "b")
    done = tasklock("run", "a", "--also", "b", "--also", "c", "--", "true", env=env)
    assert done.returncode == 75, done.stderr
    assert "'b'" in done.stderr
    for key in ("a", "c"):
        assert tasklock("peek", key, env=env).returncode == 1
    go.touch()
    assert holder.wait(timeout=30) == 0


def test_also_in_opposite_orders_never_deadlocks_nor_overlaps(env, tmp_path):
    log = tmp_path / "log"
    runs = []
    for n in range(8):
        first, second = ("x", "y") if n % 2 else ("y", "x")
        command = ["sh", "-c", LOGGED, str(log), f"run{n}"]
        runs.append(start("run", first, "--also", second, "--wait", "120", "--", *command, env=env))
    codes = [run.wait(timeout=180) for run in runs]
    assert codes == [0] * 8, [piped(run.stderr).read() for run in runs]
    assert len(log.read_text().splitlines()) == 16
    assert _overlaps(log.read_text()) == []


def test_a_forced_release_of_one_key_ends_the_run_and_frees_the_other(env, store_url, tmp_path):
    run = start(
        "--log-format", "json", "run", "a", "--also", "b", "--ttl", "20s", "--",
        "sleep", "300", env=env,
    )  # fmt: skip
    wait_for_holder(store_url, "a")
    wait_for_holder(store_url, "b")
    released = time.monotonic()
    forced = tasklock("release", "b", "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    _, stderr = run.communicate(timeout=30)
    assert run.returncode == 70, stderr
    assert lost_by(stderr) == ["rejected"]
    assert time.monotonic() - released < 15
    for key in ("a", "b"):
        assert tasklock("peek", key, env=env).returncode == 1
        (record,) = json.loads(tasklock("history", key, "--json", env=env).stdout)
        assert record["outcome"] == "lost"


def test_also_names_a_key_twice(env):
    done = tasklock("run", "a", "--also", "a", "--", "true", env=env)
    assert done.returncode == 2
    done = tasklock("run", "a", "--also", "", "--", "true", env=env)
    assert done.returncode == 2
    assert subprocess.run(["true"]).returncode == 0


def test_a_killed_shared_holder_lets_the_writer_in_only_after_its_tree_is_gone(
    env, store_url, tmp_path
):
    """A reader's wrapper is SIGKILLed: its guard ends the reader's tree, its lease runs out
    on the store's clock, and only then does the waiting writer start, beside no process
    of that tree (checked by pid and start time)."""
    from tests.support import procs
    from tests.test_cli_deploys import NEW_DEPLOY
    from tests.test_cli_deploys import OLD_DEPLOY

    pids = tmp_path / "reader-pids"
    reader = start(
        "run", "db", "--shared", "--ttl", "4s", "--", "sh", "-c", OLD_DEPLOY, str(pids), env=env
    )  # fmt: skip
    wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 2)
    identified = procs.identities([int(pid) for pid in pids.read_text().split()])
    assert len(identified) == 2
    (tmp_path / "tree").write_text("".join(f"{pid} {st}\n" for pid, st in identified))
    ran = tmp_path / "ran"
    writer = start(
        "--log-format", "json", "run", "db", "--wait", "60", "--",
        "sh", "-c", NEW_DEPLOY, str(tmp_path / "tree"), str(ran), env=env,
    )  # fmt: skip
    wait_until(lambda: _waiters(store_url, "db") == [writer.pid], timeout=20)
    reader.kill()
    killed_at = time.monotonic()
    assert reader.wait(timeout=10) == -9
    _, stderr = writer.communicate(timeout=60)
    assert writer.returncode == 0, stderr
    assert ran.read_text() == "ran\n"
    assert procs.still_running(identified) == []
    # the lease ran out on the store's clock (4 s, etcd rounding up): not at once, not late
    assert time.monotonic() - killed_at < 15
