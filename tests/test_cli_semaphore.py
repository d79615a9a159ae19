"""`run KEY --limit N` through the real executable, on every store: up to N holders at
once, each in its own slot; another limit is a configuration error; peek, list, history
and release --force see every slot."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cli import json_events
from tests.support.cli import one_error_line
from tests.support.cli import piped
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_until

#: The command of a holder: it notes its slot and token, then runs until told to stop.
HOLD = (
    'echo "$TASKLOCK_SLOT $TASKLOCK_FENCING_TOKEN" > "$0/held-$TASKLOCK_SLOT"; '
    'while [ ! -e "$0/stop" ]; do sleep 0.05; done'
)


class Holders:
    """Runs of ``tasklock run KEY --limit N`` whose commands hold until ``stop``."""

    def __init__(self, env: dict[str, str], workdir: Path) -> None:
        self.env, self.workdir = env, workdir
        self.runs: list[subprocess.Popen] = []

    def start(self, key: str, *options: str) -> subprocess.Popen:
        run = start("run", key, *options, "--", "sh", "-c", HOLD, str(self.workdir), env=self.env)
        self.runs.append(run)
        return run

    def held(self) -> dict[int, int]:
        """slot -> fencing token, of the commands running now."""
        found = {}
        for marker in self.workdir.glob("held-*"):
            words = marker.read_text().split()
            if len(words) == 2:
                found[int(words[0])] = int(words[1])
        return found

    def wait_held(self, count: int) -> dict[int, int]:
        return wait_until(lambda: len(self.held()) == count and self.held(), timeout=20)

    def stop(self) -> list[int]:
        (self.workdir / "stop").touch()
        codes = [run.wait(timeout=30) for run in self.runs]
        for run in self.runs:
            piped(run.stdout).close()
            piped(run.stderr).close()
        return codes


@pytest.fixture
def holders(env, tmp_path):
    made = Holders(env, tmp_path)
    yield made
    (tmp_path / "stop").touch()
    for run in made.runs:
        if run.poll() is None:
            run.send_signal(signal.SIGTERM)
            run.wait(timeout=30)


def test_three_holders_of_limit_3_overlap_and_a_fourth_conflicts(env, holders):
    for _ in range(3):
        holders.start("pool", "--limit", "3")
    held = holders.wait_held(3)
    assert sorted(held) == [0, 1, 2]
    assert len(set(held.values())) == 3

    fourth = tasklock("run", "pool", "--limit", "3", "--", "true", env=env)
    assert fourth.returncode == 75, fourth.stderr
    assert "all 3 slots of 'pool' are held" in fourth.stderr
    assert all(run.poll() is None for run in holders.runs)  # still all three at once

    assert holders.stop() == [0, 0, 0]
    again = tasklock(
        "run", "pool", "--limit", "3", "--", "sh", "-c", "echo $TASKLOCK_SLOT", env=env
    )
    assert (again.returncode, again.stdout) == (0, "0\n")


def test_a_held_semaphore_refuses_another_limit_naming_both(env, holders):
    holders.start("pool", "--limit", "3")
    holders.wait_held(1)
    for asked in (["--limit", "2"], []):
        result = tasklock("run", "pool", *asked, "--", "true", env=env)
        assert result.returncode == 78, result.stderr
        line = one_error_line(result.stderr)
        number = asked[1] if asked else "1"
        assert "--limit 3" in line and f"--limit {number}" in line, line


def test_a_plain_lock_refuses_a_semaphore_run(env, holders):
    holders.start("k")
    holders.wait_held(1)
    result = tasklock("run", "k", "--limit", "4", "--", "true", env=env)
    assert result.returncode == 78
    line = one_error_line(result.stderr)
    assert "--limit 1" in line and "--limit 4" in line


def test_peek_and_list_show_every_slot(env, holders):
    holders.start("pool", "--limit", "3")
    holders.wait_held(1)
    holders.start("pool", "--limit", "3")
    held = holders.wait_held(2)

    peeked = tasklock("peek", "pool", "--json", env=env)
    assert peeked.returncode == 0
    shown = json.loads(peeked.stdout)
    assert shown["held"] is True and shown["limit"] == 3
    assert (shown["slot"], shown["fencing_token"]) == (0, held[0])  # the lowest token
    assert [(h["slot"], h["fencing_token"], h["limit"]) for h in shown["holders"]] == [
        (0, held[0], 3),
        (1, held[1], 3),
    ]

    listed = json.loads(tasklock("list", "--json", env=env).stdout)
    assert [(entry["key"], entry["slot"]) for entry in listed] == [("pool", 0), ("pool", 1)]
    tsv = tasklock("list", env=env).stdout.splitlines()
    assert [line.split("\t")[-2:] for line in tsv] == [["0", "0"], ["1", "0"]]  # slot, waiting

    human = tasklock("peek", "pool", env=env).stdout
    assert human.startswith("pool: 2 of 3 slots held\n")
    assert "slot      0 of 3" in human and "slot      1 of 3" in human


def test_a_plain_lock_peeks_without_holders(env, holders):
    holders.start("k")
    held = holders.wait_held(1)
    shown = json.loads(tasklock("peek", "k", "--json", env=env).stdout)
    assert (shown["slot"], shown["limit"], shown["fencing_token"]) == (0, 1, held[0])
    assert "holders" not in shown


def test_release_force_breaks_every_slot_or_the_one_with_the_token(env, holders):
    first = holders.start("pool", "--limit", "3", "--log-format", "json")
    holders.wait_held(1)
    # One at a time, so that the second run is the one in slot 1.
    second = holders.start("pool", "--limit", "3", "--log-format", "json")
    holders.wait_held(2)
    third = holders.start("pool", "--limit", "3", "--log-format", "json")
    held = holders.wait_held(3)

    one = tasklock("release", "pool", "--force", "--token", str(held[1]), env=env)
    assert one.returncode == 0 and "the holder let go" in one.stdout, one.stdout
    assert second.wait(timeout=15) == 70
    assert first.poll() is None and third.poll() is None

    rest = tasklock("release", "pool", "--force", env=env)
    assert rest.returncode == 0
    assert rest.stdout.startswith("broke the 2 leases on pool (slots 0, 2);"), rest.stdout
    assert "the holders let go" in rest.stdout
    assert first.wait(timeout=15) == 70 and third.wait(timeout=15) == 70
    assert json.loads(tasklock("peek", "pool", "--json", env=env).stdout)["held"] is False


def test_the_slot_is_in_the_acquired_event_and_the_history(env):
    result = tasklock("--log-format", "json", "run", "pool", "--limit", "2", "--", "true", env=env)
    assert result.returncode == 0, result.stderr
    (acquired,) = [e for e in json_events(result.stderr) if e["event"] == "acquired"]
    assert acquired["slot"] == 0
    (run,) = json.loads(tasklock("history", "pool", "--json", env=env).stdout)
    assert (run["slot"], run["outcome"]) == (0, "succeeded")


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "1001"])
def test_a_bad_limit_is_a_usage_error(cli_env, sqlite_url, value):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    result = tasklock("run", "k", "--limit", value, "--", "true", env=env)
    assert result.returncode == 2, result.stderr
    assert "--limit" in result.stderr and "Traceback" not in result.stderr


def test_a_bad_limit_in_the_config_file_is_a_config_error(cli_env, sqlite_url, tmp_path):
    config = tmp_path / "tasklock.toml"
    config.write_text('ttl = "30s"\nlimit = 0\n')
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url, "TASKLOCK_CONFIG": str(config)}
    result = tasklock("run", "k", "--", "true", env=env)
    assert result.returncode == 78
    line = one_error_line(result.stderr)
    assert "limit" in line and "1 to 1000" in line and "tasklock.toml:2:" in line, line


def test_waiters_of_a_full_semaphore_get_a_slot_as_one_frees(env, holders):
    for _ in range(2):
        holders.start("pool", "--limit", "2")
    holders.wait_held(2)
    started = time.monotonic()
    waiter = start(
        "run",
        "pool",
        "--limit",
        "2",
        "--wait",
        "30s",
        "--",
        "sh",
        "-c",
        "echo $TASKLOCK_SLOT",
        env=env,
    )
    time.sleep(0.5)
    assert waiter.poll() is None
    (holders.workdir / "stop").touch()
    out, _ = waiter.communicate(timeout=30)
    assert waiter.returncode == 0 and out.strip() in ("0", "1")
    assert time.monotonic() - started < 20
