"""SQLite's durability across a power cut (issue 39): the commit that issues a fencing token
is on disk before the command starts, and a run's success (what ``--once-per`` reads) is on
disk before tasklock exits. Seen in the system calls, under strace: a power cut cannot be
played here, a missing sync can be seen."""

from __future__ import annotations

import re
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

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
    checkpoint: after a power cut the counter could roll back and the same token be issued
    again, or a ``--once-per`` success vanish and the job run twice in its window. Another
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
