"""A forced release never hands the key to a second holder while the first one's command
may still run, and a notification alone changes nothing: through the real executable, on
every store. Processes are named by pid and start time from /proc."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import datetime
from datetime import timedelta
from datetime import timezone
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tasklock_cli.commands.release import LET_GO_TIMEOUT_ENV
from tests.support import procs
from tests.support import report
from tests.support.cli import json_events
from tests.support.cli import lost_by
from tests.support.cli import peek
from tests.support.cli import piped
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until
from tests.test_containment import read_tree
from tests.test_containment import tree_command

#: The second command's first act: print which of the first tree's processes still run.
SURVIVORS = (
    "import json, sys\n"
    "from tests.support import procs\n"
    "tree = [tuple(p) for p in json.loads(sys.argv[1])]\n"
    "print(json.dumps(procs.still_running(tree)), flush=True)\n"
)
#: release --force waits this long here for a holder to let go (10 s for users).
LET_GO_S = 1.0
#: A `peek` started this long before a broken lease's free_at still finds it (a new
#: interpreter, on a loaded machine).
EXPIRY_TOLERANCE_S = 1.0


@pytest.fixture
def env(env):
    return {**env, LET_GO_TIMEOUT_ENV: str(LET_GO_S)}


@pytest.mark.slow  # (waits out a 10 s lease)
def test_a_paused_holder_keeps_the_key_until_its_tree_is_gone(env, store_url, tmp_path):
    command, pids, ready = tree_command(tmp_path)
    # (a TTL that outlasts a slow start of `release` beside other suites: with 4 s the lease
    # ran out before `release` broke it)
    first = start("-v", "--log-format", "json", "run", "k", "--ttl", "10s", "--", *command, env=env)
    second = None
    try:
        tree = read_tree(pids, ready)
        wait_for_holder(store_url, "k")
        os.kill(first.pid, signal.SIGSTOP)  # a frozen VM, a long GC pause
        started = time.monotonic()
        result = tasklock("release", "k", "--force", "--json", env=env)
        took = time.monotonic() - started
        assert result.returncode == 75, result.stderr
        out = json.loads(result.stdout)
        assert (out["freed"], len(out["broken"])) == (False, 1)
        assert LET_GO_S <= took < LET_GO_S + 5  # its let-go wait, not the 10 s default one
        free_at = datetime.fromisoformat(out["free_at"].replace("Z", "+00:00")).timestamp()
        looked_at = time.time()
        if looked_at < free_at - EXPIRY_TOLERANCE_S:  # a loaded machine can take till then
            assert peek(store_url, "k") is not None, (looked_at, free_at)  # taken, broken
        code = [sys.executable, "-c", SURVIVORS, json.dumps(tree)]
        pythonpath = str(Path(__file__).resolve().parent.parent)
        second_env = {**env, "PYTHONPATH": pythonpath}
        second = start("run", "k", "--wait", "60s", "--", *code, env=second_env)
        stdout, stderr = second.communicate(timeout=30)
        assert second.returncode == 0, stderr
        assert json.loads(stdout) == []  # nothing of the first tree ran when it started
        freed_after = time.monotonic() - started
    finally:
        os.kill(first.pid, signal.SIGCONT)
        if second is not None and second.poll() is None:
            second.kill()
    _, first_err = first.communicate(timeout=20)
    assert first.returncode == 70, first_err
    assert lost_by(first_err) in (["resumed-late"], ["rejected"])
    report.record(
        "paused holder, release --force: lock-delay",
        report.store_of(store_url),
        release_s=took,
        second_started_after_s=freed_after,
    )


def _processes_noted(db: Path, key: str) -> bool:
    """The holder has recorded its processes with its lease (it does so right after its
    quiet start)."""
    wait_for_holder(f"sqlite:///{db}", key)  # (the file and its tables exist)
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            "SELECT json_extract(holder, '$.processes') FROM tasklock_leases"
            " WHERE key = ? AND slot = 0",
            (key,),
        ).fetchone()
    return bool(row and row[0])


def test_a_killed_local_holder_is_freed_at_once(cli_env, tmp_path):
    db = tmp_path / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite:///{db}"}
    command, pids, ready = tree_command(tmp_path)
    first = start("run", "k", "--ttl", "30s", "--", *command, env=env)
    tree = read_tree(pids, ready)
    wait_until(lambda: _processes_noted(db, "k"))
    first.kill()
    first.wait()
    started = time.monotonic()
    result = tasklock("release", "k", "--force", "--json", env=env)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["freed"] is True
    assert took < 5  # the executable's start-up included; not the 10 s let-go wait
    assert peek(f"sqlite:///{db}", "k") is None
    assert procs.still_running(tree) == []
    report.record("killed holder, release --force", "sqlite", release_s=took)


@pytest.mark.parametrize("delay_ms", [0, 20, 50, 100, 150])
def test_a_local_holder_killed_as_its_command_starts_is_freed_at_once(cli_env, tmp_path, delay_ms):
    """The wrapper and its guard SIGKILLed 0-150 ms after the command started (before the
    heartbeat's first step): the holder's processes were recorded with the acquire, so
    `release --force` sees them gone and frees the key at once."""
    db = tmp_path / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite:///{db}", LET_GO_TIMEOUT_ENV: "10"}
    show = 'echo "$PPID $$"; exec sleep 30'  # its parent is the guard
    first = start("run", "k", "--ttl", "30s", "--", "sh", "-c", show, env=env)
    guard, command = (int(pid) for pid in piped(first.stdout).readline().split())
    try:
        time.sleep(delay_ms / 1000)
        for pid in (first.pid, guard):
            os.kill(pid, signal.SIGKILL)
        first.wait()
        started = time.monotonic()
        result = tasklock("release", "k", "--force", env=env)
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        assert took < 5  # the executable's start-up included; not the 10 s let-go wait
        assert peek(f"sqlite:///{db}", "k") is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(command, signal.SIGKILL)


def test_the_acquire_itself_records_the_holder_and_its_guard(cli_env, tmp_path):
    """The guard is forked before the acquire, and the acquire's own transaction records it
    with the wrapper (issue 45): an --on-start hook, which runs after the acquire and before
    the command starts, already finds both (the guard: the command's parent)."""
    db = tmp_path / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite:///{db}"}
    seen = tmp_path / "seen"
    read_record = (
        "import sqlite3, sys\n"
        "row = sqlite3.connect(sys.argv[1]).execute(\n"
        "    \"SELECT json_extract(holder, '$.processes.pids') FROM tasklock_leases\"\n"
        "    \" WHERE key = 'k' AND slot = 0\"\n"
        ").fetchone()\n"
        "open(sys.argv[2], 'w').write(row[0])\n"
    )
    hook = f"{sys.executable} -c {shlex.quote(read_record)} {db} {seen}"
    show = 'echo "$PPID"'  # its parent is the guard
    ran = tasklock("run", "k", "--on-start", hook, "--", "sh", "-c", show, env=env)
    assert ran.returncode == 0, ran.stderr
    wrapper_and_guard = [pid for pid, _started in json.loads(seen.read_text())]
    assert wrapper_and_guard[1:] == [int(ran.stdout)]
    assert len(wrapper_and_guard) == 2 and wrapper_and_guard[0] != int(ran.stdout)


def test_a_local_holder_killed_before_it_started_anything_is_freed_at_once(cli_env, tmp_path):
    """A holder SIGKILLed right after its acquire, before it forked its guard: it recorded
    itself with the acquire, so `release --force` sees it gone and frees the key at once."""
    url = f"sqlite:///{tmp_path / 'locks.db'}"
    acquire_then_stop = (
        "import os, signal, socket, sys\n"
        "from tasklock_cli.stores import open_store\n"
        "from tasklock_cli.stores.model import Holder\n"
        "holder = Holder(host=socket.gethostname(), pid=os.getpid(), user='u')\n"
        "assert open_store(sys.argv[1]).acquire('k', 30, holder, 'owner') is not None\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    holder = subprocess.run([sys.executable, "-c", acquire_then_stop, url], cwd=Path.cwd())
    assert holder.returncode == -signal.SIGKILL
    assert peek(url, "k") is not None
    env = {**cli_env, "TASKLOCK_STORE": url, LET_GO_TIMEOUT_ENV: "10"}
    started = time.monotonic()
    result = tasklock("release", "k", "--force", env=env)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started < 5  # the executable's start-up; not the 10 s let-go wait
    assert peek(url, "k") is None


def test_a_lease_kept_by_hold_at_least_is_freed_at_once(env, store_url):
    """--hold-at-least keeps the lease after the command ended and the wrapper exited:
    `release --force` frees it at once on every store (nobody is there to let go), and the
    run's ledger record stays as the run wrote it."""
    env = {name: value for name, value in env.items() if name != LET_GO_TIMEOUT_ENV}
    ran = tasklock("run", "k", "--hold-at-least", "60s", "--", "sh", "-c", "exit 3", env=env)
    assert ran.returncode == 3, ran.stderr
    assert peek(store_url, "k") is not None  # kept
    started = time.monotonic()
    result = tasklock("release", "k", "--force", "--json", env=env)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["freed"] is True
    assert took < 5  # the executable's start-up included; not the 10 s let-go wait
    assert peek(store_url, "k") is None
    (record,) = json.loads(tasklock("history", "k", "--json", env=env).stdout)
    assert (record["outcome"], record["exit_code"]) == ("failed", 3)
    assert record.get("broken_by") is None
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    # In words: nobody let go, the command had ended (not "the holder let go").
    tasklock("run", "k", "--hold-at-least", "60s", "--", "true", env=env)
    said = tasklock("release", "k", "--force", env=env)
    assert said.returncode == 0 and "its command had ended: freed after" in said.stdout, said


def test_a_paused_local_holder_is_not_taken_for_gone(cli_env, tmp_path):
    db = tmp_path / "locks.db"
    env = {**cli_env, "TASKLOCK_STORE": f"sqlite:///{db}", LET_GO_TIMEOUT_ENV: "0.3"}
    first = start("run", "k", "--ttl", "30s", "--", "sleep", "30", env=env)
    try:
        wait_until(lambda: _processes_noted(db, "k"))
        os.kill(first.pid, signal.SIGSTOP)
        result = tasklock("release", "k", "--force", env=env)
        assert result.returncode == 75, result.stdout
        assert peek(f"sqlite:///{db}", "k") is not None
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert first.wait(timeout=20) == 70


def test_the_holder_and_the_ledger_name_who_broke_the_run(env, store_url):
    env = {name: value for name, value in env.items() if name != LET_GO_TIMEOUT_ENV}
    holder = start("run", "k", "--ttl", "30s", "--", "sleep", "30", env=env)
    try:
        info = wait_for_holder(store_url, "k")
        released = tasklock("release", "k", "--force", env=env)
        assert released.returncode == 0, released.stdout
        _, stderr = holder.communicate(timeout=20)
        assert holder.returncode == 70, stderr
    finally:
        holder.kill()
        holder.wait()
    history = tasklock("history", "k", "--json", env=env)
    (run,) = json.loads(history.stdout)
    assert (run["fencing_token"], run["outcome"]) == (info.fencing_token, "lost")
    by = run["broken_by"]
    assert by["host"] == socket.gethostname() and by["pid"] > 0 and by["pid"] != holder.pid
    assert by["user"] == info.holder.user
    who = f"{by['host']} pid {by['pid']} (user {by['user']})"
    assert stderr == (
        f"tasklock: error: lost the lease on 'k' (rejected: broken by release --force from {who});"
        " terminating the command\n"
    )
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    assert json.loads(tasklock("history", "k", "--json", env=env).stdout)[0]["broken_by"] is None


def _moment(ts: str) -> datetime:
    return datetime.fromisoformat(ts.replace("Z", "+00:00"))


# -- forged notifications ------------------------------------------------------------


def _connections_to(pid: int, port: int) -> int:
    """How many established TCP connections process ``pid`` has to ``port`` (its sockets'
    inodes, looked up in its network namespace's tables)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/net/{table}") as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                count += remote_port == port and fields[3] == "01" and fields[9] in inodes
    return count


def _forger(store_url: str, key: str, token: int, holder_pid: int):
    """A function that sends one break notification for the lease, as anyone with access
    to the store can (etcd has none to forge: a holder watches its key's own changes); one
    that tells whether the holder (process ``holder_pid``) listens for them now; the store."""
    from tasklock_cli.stores import open_store

    store = open_store(store_url)
    if store_url.startswith("sqlite"):
        from tasklock_cli.stores.sqlite.entries import key_dir_name
        from tasklock_cli.stores.sqlite.store import SQLiteStore

        assert isinstance(store, SQLiteStore)

        fifo = f"{store.path}.holders/{key_dir_name(key)}/{token}"
        made = functools.partial(os.path.exists, fifo)  # the holder makes it to listen

        def send() -> None:
            try:
                fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            except OSError:
                return  # not made yet
            try:
                os.write(fd, b"!")
            except BlockingIOError:
                pass
            finally:
                os.close(fd)

        return send, made, store
    if store_url.startswith("redis"):
        from tasklock_cli.stores.redis.store import RedisStore

        assert isinstance(store, RedisStore)
        channel = store._names.break_channel(key, token)
        client = store._conn.client

        def subscribed() -> bool:
            return client.pubsub_numsub(channel)[0][1] > 0

        return (lambda: client.publish(channel, "1")), subscribed, store
    if store_url.startswith("postgres"):
        from tasklock_cli.stores.postgres.store import PostgresStore

        assert isinstance(store, PostgresStore)
        store.peek(key)  # learns the table's oid, which names the channel
        pg_channel = store._breaks.channel(key)
        notify = "SELECT pg_notify(%s, %s)"
        # The holder LISTENs on a connection of its own: its second one to the server.
        port = urlsplit(store_url).port or 5432
        return (
            (lambda: store._db.run(lambda conn: conn.execute(notify, (pg_channel, str(token))))),
            (lambda: _connections_to(holder_pid, port) >= 2),
            store,
        )
    if store_url.startswith("mysql"):  # a KILL QUERY of the holder's break watch
        from tasklock_cli.stores.mysql.queue import break_lock_name
        from tasklock_cli.stores.mysql.store import MySQLStore

        assert isinstance(store, MySQLStore)

        name = break_lock_name(store._db.database, store.table_name, key, token)
        kill = "SELECT IS_USED_LOCK(%s)"

        def send_kill(conn) -> None:
            with conn.cursor() as cursor:
                cursor.execute(kill, (name,))
                (watch,) = cursor.fetchone()
                if watch is not None:
                    cursor.execute(f"KILL QUERY {int(watch)}")

        def watched(conn) -> bool:
            with conn.cursor() as cursor:
                cursor.execute(kill, (name,))
                return cursor.fetchone()[0] is not None

        return (lambda: store._db.run(send_kill)), (lambda: store._db.run(watched)), store
    pytest.skip("etcd: no notification to forge (a holder watches its own key)")


def test_a_forged_break_notification_changes_nothing(env, store_url):
    """Flooded with break notifications for its lease, a holder renews at most once per
    retry interval (ttl 3s: renew every 1s, retry every 0.25s), keeps its lease and runs
    its command to the end."""
    holder = start(
        "--log-format", "json", "run", "k", "--ttl", "3s", "--",
        "sh", "-c", "echo $TASKLOCK_FENCING_TOKEN; sleep 3",
        env=env,
    )  # fmt: skip
    line = piped(holder.stdout).readline()
    if not line:  # (say why: the holder ended before its command printed its token)
        holder.wait(timeout=20)
        pytest.fail(f"the holder exited {holder.returncode}: {piped(holder.stderr).read()}")
    token = int(line)
    send, listening, store = _forger(store_url, "k", token, holder.pid)
    sent = 0
    stop = threading.Event()

    def flood() -> None:
        nonlocal sent
        while not stop.is_set():
            send()
            sent += 1
            time.sleep(0.005)  # (~50 per retry interval: the server's own load stays small)

    try:
        wait_until(listening)  # past the holder's quiet start: it listens now
        flooding = threading.Thread(target=flood)
        flooding.start()
        time.sleep(2.0)
        stop.set()
        flooding.join()
        flood_ended = datetime.now(timezone.utc)
        _, stderr = holder.communicate(timeout=20)
    finally:
        stop.set()
        holder.kill()
        store.close()
    assert holder.returncode == 0, stderr
    renewed = [e for e in json_events(stderr) if e["event"] == "renewed"]
    # 3 s of command: 3 scheduled renewals, and 2 s of flood at one per 0.25 s at most
    # (a flood: several notifications per retry interval, so that a holder that renewed on
    # each would show far more than the bound below; 69 in 2 s on a loaded machine, once)
    assert sent > 30
    assert 1 <= len(renewed) <= 3 + 8 + 1, len(renewed)
    after = [e for e in renewed if _moment(e["ts"]) > flood_ended + timedelta(seconds=0.3)]
    assert len(after) <= 1, after  # back on the schedule (every 1 s) once the flood ended
    report.record(
        "forged notifications", report.store_of(store_url), sent=sent, renewals=len(renewed)
    )
