"""SQLite's durability across a power cut (issue 39): the commit that reserves a new block of
fencing tokens is on disk before the command starts (the tokens within a block need no
sync: tests/test_sqlite_token_blocks.py), and a run's success (what ``--once-per`` reads) is
on disk before tasklock exits. Seen in the system calls, under strace: a power cut cannot be
played here, a missing sync can be seen."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasklock_cli.stores.sqlite.connection import WAL_CHECKPOINT_PAGES
from tests.support import services
from tests.support.cli import executable
from tests.support.cli import tasklock


def _strace() -> str:
    found = shutil.which("strace")
    if found is None:
        if services.in_ci():
            pytest.fail("CI=true but strace is not installed (.ci/run installs it)")
        pytest.skip("strace is not installed (.ci/run installs it)")
    return found


def _syncs_around_the_command(db: Path, args: list[str], env: dict) -> tuple[int, int]:
    """How many syncs of the database or its WAL tasklock ``args`` makes before the
    command's exec of /bin/true, and after it."""
    trace = db.parent / "trace"
    calls = "trace=fdatasync,fsync,execve"
    done = subprocess.run(
        [_strace(), "-f", "-y", "-o", str(trace), "-e", calls, executable(), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = trace.read_text().splitlines()
    [started] = [i for i, line in enumerate(lines) if 'execve("/bin/true"' in line]
    ours = re.compile(r"f(data)?sync\(\d+<" + re.escape(str(db)) + r"(-wal)?>")
    syncs = [i for i, line in enumerate(lines) if ours.search(line)]
    return sum(i < started for i in syncs), sum(i > started for i in syncs)


def test_a_token_is_on_disk_before_the_command_and_a_success_before_exit(tmp_path, cli_env):
    """With ``synchronous=NORMAL`` alone a WAL commit reaches the disk at the next
    checkpoint: after a power cut the counter could roll back past its block and the same
    token be issued again, or a ``--once-per`` success vanish and the job run twice in its
    window. The first run of a key in a boot reserves its block. Another
    connection stays open here, as a neighbouring run's would, so neither the WAL's creation
    nor the last close's checkpoint syncs in tasklock's place."""
    db = tmp_path / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite://{db}"}
    assert tasklock("run", "warm", "--", "true", env=env).returncode == 0
    neighbour = sqlite3.connect(db)
    try:
        neighbour.execute("SELECT count(*) FROM sqlite_master").fetchall()
        args = ["run", "k", "--once-per", "1h", "--", "/bin/true"]
        before, after = _syncs_around_the_command(db, args, env)
    finally:
        neighbour.close()
    assert before >= 1, "no sync between the acquire's commit and the command's exec"
    assert after >= 1, "no sync of the success record before tasklock exits"


def test_a_run_leaves_the_wal_for_the_next_one_without_a_checkpoint(tmp_path, cli_env):
    """`tasklock run` closes the store without the checkpoint SQLite makes as the last
    connection closes (issue 45): no sync after the command but the release's own, which
    here records a success (``--once-per``), and the WAL stays, so the next run does not make
    it again (no sync before the command but the acquire's, which reserves the key's first
    block; none on the next run of that key). The next run reads what the WAL holds: the
    first run's record."""
    db = tmp_path / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite://{db}"}
    first = tasklock("run", "k", "--once-per", "1s", "--", "true", env=env)
    assert first.returncode == 0, first.stderr
    assert Path(f"{db}-wal").stat().st_size > 0  # left, with the first run's commits
    args = ["run", "j", "--once-per", "1h", "--", "/bin/true"]
    assert _syncs_around_the_command(db, args, env) == (1, 1)  # j's first block
    again = ["run", "j", "--", "/bin/true"]
    assert _syncs_around_the_command(db, again, env) == (0, 1)  # a token of that block
    history = tasklock("history", "k", "--json", env=env)
    assert history.returncode == 0, history.stderr
    assert [run["outcome"] for run in json.loads(history.stdout)] == ["succeeded"]


def test_a_release_wakes_the_next_waiter_before_syncing_its_success(tmp_path, cli_env):
    """The release's sync of a success is off the hand-off: its commit wakes the waiter
    first, then is synced (the waiter's acquire, a token of the key's block, syncs nothing),
    and tasklock exits only after that sync. (Again when the
    waiter's own look took the key between the release's commit and its wake-up: then
    there was nobody to wake.)"""
    for attempt in range(3):
        lines = _hand_off_trace(tmp_path / str(attempt), cli_env)
        woke = [i for i, line in enumerate(lines) if re.search(r"write\(\d+<[^>]*\.waiters/", line)]
        if woke:
            break
    assert woke, "the release woke no waiter"
    synced = [i for i, line in enumerate(lines) if re.search(r"f(data)?sync\(\d+<[^>]*-wal>", line)]
    [command_pid] = {line.split()[0] for line in lines if 'execve("/bin/sh", ["/bin/sh"' in line}
    [ended] = [
        i for i, line in enumerate(lines) if re.match(rf"{command_pid}\s+\+\+\+ exited", line)
    ]
    assert not [i for i in synced if ended < i < woke[0]], "the release synced before its wake-up"
    assert [i for i in synced if i > woke[0]], "the success was not synced after the wake-up"


def _hand_off_trace(directory: Path, cli_env: dict) -> list[str]:
    """The system calls (strace) of a holder whose command succeeds while a waiter waits."""
    directory.mkdir()
    db = directory / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite://{db}"}
    assert tasklock("run", "warm", "--", "true", env=env).returncode == 0
    trace, go = directory / "trace", directory / "go"
    script = f"while [ ! -e {go} ]; do sleep 0.01; done"
    calls = ["-f", "-y", "-o", str(trace), "-e", "trace=write,fdatasync,fsync,execve"]
    holder = subprocess.Popen(
        [_strace(), *calls, executable(), "run", "k", "--", "/bin/sh", "-c", script], env=env
    )
    waiter = None
    try:
        deadline = time.monotonic() + 30
        while '"k"' not in tasklock("list", "--json", env=env).stdout:
            assert time.monotonic() < deadline, "the holder never held k"
            time.sleep(0.05)
        waiter = subprocess.Popen(
            [executable(), "run", "k", "--wait", "30s", "--", "true"],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert waiter.stderr is not None
        assert "waiting" in waiter.stderr.readline()
        while not list(directory.glob("locks.db.waiters/*/0*")):  # its place made
            assert time.monotonic() < deadline, "the waiter never made its FIFO"
            time.sleep(0.01)
        go.touch()
        assert holder.wait(timeout=60) == 0
        assert waiter.wait(timeout=60) == 0
    finally:
        go.touch()
        for process in (holder, waiter):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()
    return trace.read_text().splitlines()


_RUN_AND_LEAVE = """
import os, socket, sys
from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import Holder, RunRecord

holder = Holder(host=socket.gethostname(), pid=os.getpid(), user="u", command=["true"])
for _ in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:  # one run's store work, ended as `tasklock run` ends: os._exit
        store = open_store(sys.argv[1])
        lease = store.acquire("k", 30, holder, os.urandom(8).hex())
        record = RunRecord("k", lease.fencing_token, holder, lease.acquired_at, 0, "succeeded")
        store.release(lease, record=record)
        store.close_before_exit()
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
"""


@pytest.mark.slow
def test_the_wal_runs_leave_stays_bounded(tmp_path):
    """Runs that leave the WAL (``close_before_exit``) let it grow only to the store's
    auto-checkpoint (``WAL_CHECKPOINT_PAGES``, checkpointed by the commit that passes it,
    then written over from its start): 300 runs of 5 frames each would be 1500 pages
    without it, and SQLite's default (1000 pages) would have each run read back ~500 on
    average as it opens the file."""
    db = tmp_path / "locks.db"
    runs = subprocess.run(
        [sys.executable, "-c", _RUN_AND_LEAVE, f"sqlite://{db}", "300"], timeout=300
    )
    assert runs.returncode == 0
    page = 4096
    frame = page + 24
    assert Path(f"{db}-wal").stat().st_size <= 32 + (WAL_CHECKPOINT_PAGES + 10) * frame
    assert db.stat().st_size > page  # checkpointed into the database file
