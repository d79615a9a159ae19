"""Crash, pause and outage of real wrappers, on every store."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import sys
import time

import pytest

from tests.support import procs
from tests.support import report
from tests.support.cli import json_events
from tests.support.cli import json_run
from tests.support.cli import lost_by
from tests.support.cli import peek
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_command
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until

GUARDED_WRITER = """
import os, sqlite3, sys, time
token = int(os.environ["TASKLOCK_FENCING_TOKEN"])
db = sqlite3.connect(sys.argv[1], isolation_level=None)
open(sys.argv[2], "w").close()
idle = sys.argv[2] + ".idle"
while True:
    changed = db.execute("UPDATE guarded SET token = ? WHERE id = 1 AND token <= ?",
                         (token, token)).rowcount
    with open(sys.argv[3], "a") as log:
        log.write(f"{token} {changed}\\n")
    open(idle, "w").close()  # between writes: holding no lock on the guarded table
    time.sleep(0.1)
    os.unlink(idle)
"""


@pytest.mark.slow
def test_killed_wrapper_lease_is_free_only_after_the_ttl(env, store_url):
    # Long enough that the two runs below are in place before it runs out, however slowly
    # they start on a busy machine: what is timed is the store's expiry, not their start.
    ttl = 6.0
    wrapper = start("run", "k", "--ttl", f"{ttl:g}s", "--", "sleep", "30", env=env)
    info = wait_for_holder(store_url, "k")
    wrapper.kill()
    killed_at = time.time()
    wrapper.wait()
    assert tasklock("run", "k", "--", "true", env=env).returncode == 75
    late = tasklock("--log-format", "json", "run", "k", "--wait", "10s", "--", "true", env=env)
    assert late.returncode == 0
    acquired = next(e for e in json_events(late.stderr) if e["event"] == "acquired")
    assert acquired["fencing_token"] > info.fencing_token
    # When the lease was taken (the event's time), not when that run had ended as well: on
    # a busy machine its exit adds a second that says nothing about the store.
    got_it_after = _timestamp(acquired["ts"]) - killed_at
    # The TTL from the last renewal (up to ttl/3 before the kill), plus at most one retry
    assert ttl * 2 / 3 - 0.05 <= got_it_after <= ttl + 1.5
    report.record(
        "wrapper SIGKILLed, ttl 6s",
        report.store_of(store_url),
        reacquired_after_s=got_it_after,
        early_attempt="conflict",
    )


@pytest.mark.slow
def test_paused_holder_is_fenced_and_killed_on_resume(env, store_url, tmp_path):
    guard = tmp_path / "guard.db"
    db = sqlite3.connect(guard, isolation_level=None)
    db.execute("CREATE TABLE guarded (id INTEGER PRIMARY KEY, token INTEGER)")
    db.execute("INSERT INTO guarded VALUES (1, 0)")
    ready, log = tmp_path / "ready", tmp_path / "log"
    writer = [sys.executable, "-c", GUARDED_WRITER, str(guard), str(ready), str(log)]
    # The store's tables first, with the default I/O timeout: a first run with a 1.5 s TTL
    # makes them within its own 0.25 s, which a loaded CI run once missed (PostgreSQL).
    assert tasklock("init", env=env).returncode == 0
    wrapper = start(
        *json_run("k", "--ttl", "1500ms", command=writer),
        env=env,
        start_new_session=True,
    )
    wait_for_command(wrapper, ready)
    old = peek(store_url, "k")
    assert old is not None
    child_pgids = procs.other_groups_in_session(wrapper.pid)
    idle = tmp_path / "ready.idle"
    while True:  # pause it between two guarded writes, never in the middle of one
        wait_until(idle.exists)
        for pgid in [wrapper.pid, *child_pgids]:
            os.killpg(pgid, signal.SIGSTOP)
        if idle.exists():
            break
        for pgid in [*child_pgids, wrapper.pid]:
            os.killpg(pgid, signal.SIGCONT)
    try:
        time.sleep(2.5)
        guarded_write = (
            "import os, sqlite3, sys; t = int(os.environ['TASKLOCK_FENCING_TOKEN']);"
            "sqlite3.connect(sys.argv[1], isolation_level=None).execute("
            "'UPDATE guarded SET token = ? WHERE id = 1 AND token <= ?', (t, t))"
        )
        new = tasklock(
            *json_run("k", command=[sys.executable, "-c", guarded_write, str(guard)]), env=env
        )
        assert new.returncode == 0, new.stderr
        new_token = json_events(new.stderr)[0]["fencing_token"]
        assert new_token > old.fencing_token
        lines_before_resume = len(log.read_text().splitlines())
    finally:
        for pgid in [*child_pgids, wrapper.pid]:
            # The guard, continued first, may have killed the command's group already.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGCONT)
    _, stderr = wrapper.communicate(timeout=15)
    assert wrapper.returncode == 70
    assert lost_by(stderr) == ["resumed-late"]
    late_writes = log.read_text().splitlines()[lines_before_resume:]
    assert all(line.split()[1] == "0" for line in late_writes), late_writes  # all rejected
    assert db.execute("SELECT token FROM guarded").fetchone() == (new_token,)
    report.record(
        "SIGSTOP wrapper+child 2.5s > ttl 1.5s",
        report.store_of(store_url),
        old_token=old.fencing_token,
        new_token=new_token,
        stale_writes_after_resume=len(late_writes),
        stale_writes_accepted=0,
    )


def _timestamp(rfc3339: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
