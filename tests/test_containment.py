"""Nothing the lock covers outlives it: the command's whole process tree (processes that
call setsid or double-fork included) is terminated when the wrapper dies, when the lease is
lost, and when the command exits leaving processes behind, before anyone else gets the lock.

Every test runs the real executable on every store; the tree is identified by pid and
start time from /proc, so a recycled pid never passes for a survivor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.support import procs
from tests.support import report
from tests.support.cli import json_events
from tests.support.cli import lost_by
from tests.support.cli import peek
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until

# A two-level tree that escapes its process group three ways: a plain background job, one
# that calls setsid (a new session), and one double-forked (its parent exits at once).
TREE = (
    "sleep 300 & echo $! >> {pids}; "
    "setsid sleep 301 & echo $! >> {pids}; "
    "(sleep 302 & echo $! >> {pids}); "
    "echo $$ >> {pids}; touch {ready}; {then}"
)


def tree_command(tmp_path: Path, then: str = "sleep 303") -> tuple[list[str], Path, Path]:
    pids, ready = tmp_path / "pids", tmp_path / "ready"
    return ["sh", "-c", TREE.format(pids=pids, ready=ready, then=then)], pids, ready


def read_tree(pids: Path, ready: Path) -> list[tuple[int, int]]:
    wait_until(ready.exists)
    tree = procs.identities([int(line) for line in pids.read_text().split()])
    assert len(tree) == 4, tree
    return tree


def gone_within(tree: list[tuple[int, int]], seconds: float) -> float:
    """Seconds until every process of ``tree`` is gone; fails after ``seconds``."""
    started = time.monotonic()
    wait_until(lambda: not procs.still_running(tree), timeout=seconds, interval=0.01)
    return time.monotonic() - started


# The next holder's command: exit 1 if any process of the old tree still runs beside it.
OVERLAP_CHECK = """
import sys
def start_time(pid):
    try:  # bytes: a recycled pid may be another test's process, named in any bytes
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return None
    return None if fields[0] == b"Z" else int(fields[19])
old = [tuple(map(int, item.split(":"))) for item in sys.argv[1:]]
sys.exit(1 if [pid for pid, started in old if start_time(pid) == started] else 0)
"""


def overlap_check(tree: list[tuple[int, int]]) -> list[str]:
    return [sys.executable, "-c", OVERLAP_CHECK, *(f"{pid}:{started}" for pid, started in tree)]


@pytest.mark.slow
def test_a_killed_wrapper_takes_its_whole_tree_along(env, store_url, tmp_path):
    command, pids, ready = tree_command(tmp_path)
    wrapper = start("run", "k", "--ttl", "3s", "--", *command, env=env)
    tree = read_tree(pids, ready)
    old = wait_for_holder(store_url, "k")
    wrapper.kill()
    took = gone_within(tree, 1.0)
    wrapper.wait()
    # The lease outlives the tree (nobody released it), and the next holder, once it
    # expires, runs beside nothing of the old tree.
    assert peek(store_url, "k") is not None
    late = tasklock(
        "--log-format", "json", "run", "k", "--wait", "10s", "--", *overlap_check(tree), env=env
    )
    assert late.returncode == 0, late.stderr
    token = next(e for e in json_events(late.stderr) if e["event"] == "acquired")["fencing_token"]
    assert token > old.fencing_token
    report.record("wrapper SIGKILLed: tree gone", report.store_of(store_url), tree_gone_s=took)


def test_descendants_left_running_are_terminated_before_the_release(env, store_url, tmp_path):
    command, pids, _ready = tree_command(tmp_path, then="exit 3")
    result = tasklock("--log-format", "json", "run", "k", "--", *command, env=env)
    assert result.returncode == 3, result.stderr
    tree = procs.identities([int(line) for line in pids.read_text().split()])
    assert procs.still_running(tree) == []
    events = json_events(result.stderr)
    names = [event["event"] for event in events]
    assert names == ["acquired", "orphans-terminated", "released"], names
    assert events[1]["count"] == 3
    assert peek(store_url, "k") is None


def test_a_descendant_whose_name_is_not_utf8_is_terminated_too(env, tmp_path):
    """/proc/PID/stat holds the process's name as its raw bytes: a command that names itself
    with bytes that are not UTF-8 must not hide from (or break) the scan of the tree."""
    pid_file = tmp_path / "orphan.pid"
    orphan = (
        "import ctypes, os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    ctypes.CDLL(None).prctl(15, b'n\\xff\\xfe) x', 0, 0, 0)\n"
        f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(300)\n"
        "else:\n"
        f"    while not os.path.exists({str(pid_file)!r}): time.sleep(0.01)\n"
        "    os._exit(4)\n"
    )
    command = [sys.executable, "-c", orphan]
    result = tasklock("--log-format", "json", "run", "k", "--", *command, env=env)
    assert result.returncode == 4, result.stderr
    assert not procs.alive(int(pid_file.read_text()))
    assert [e["event"] for e in json_events(result.stderr)][-2:] == [
        "orphans-terminated",
        "released",
    ]


def test_an_orphan_ignoring_sigterm_is_killed_after_grace(env, tmp_path):
    ready = tmp_path / "ready"
    seconds = f"300.{os.getpid()}{time.monotonic_ns() % 10**6}"  # this test's own sleep
    orphan = f'trap "" TERM; touch {ready}; sleep {seconds}'
    job = f"(trap '' TERM; setsid sh -c '{orphan}' &) ; exit 0"
    result = tasklock(
        "--log-format", "json", "run", "k", "--grace", "600ms", "--", "sh", "-c", job, env=env
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert ready.exists()
    at = {e["event"]: datetime.fromisoformat(e["ts"][:-1]) for e in json_events(result.stderr)}
    took = (at["orphans-terminated"] - at["acquired"]).total_seconds()
    # its grace, from the acquire on (the executable's start-up, which a loaded machine
    # makes long, left out): not the default grace of 5 s
    assert 0.6 <= took < 3, took
    sleeping = f"sleep\x00{seconds}\x00".encode()
    assert not [p for p in procs.processes() if p.state != "Z" and procs.cmdline(p.pid) == sleeping]


def test_the_scan_for_survivors_reads_any_arguments_and_vanished_processes():
    """The survivors' scan above reads every process's arguments: a parallel test's command
    with arguments that are not UTF-8, or one that ends meanwhile, must not break it."""
    named = subprocess.Popen([b"sh", b"-c", b"sleep 30", b"caf\xe9.db"])
    try:
        # (Popen returns once the exec closed its pipe, which the kernel does before it
        # sets up the new image's arguments: for a moment they read empty.)
        wait_until(lambda: procs.cmdline(named.pid) != b"")
        assert procs.cmdline(named.pid) == b"sh\x00-c\x00sleep 30\x00caf\xe9.db\x00"
    finally:
        named.kill()
        named.wait()
    assert procs.cmdline(named.pid) is None


def test_a_lost_lease_terminates_processes_outside_the_group(env, store_url, tmp_path):
    command, pids, ready = tree_command(tmp_path)
    wrapper = start("--log-format", "json", "run", "k", "--ttl", "3s", "--", *command, env=env)
    tree = read_tree(pids, ready)
    assert tasklock("release", "k", "--force", env=env).returncode == 0
    _, stderr = wrapper.communicate(timeout=15)
    assert wrapper.returncode == 70, stderr
    assert procs.still_running(tree) == []
    assert lost_by(stderr) == ["rejected"]


@pytest.mark.slow
def test_a_paused_wrapper_cannot_keep_its_tree_running_past_the_deadline(env, store_url, tmp_path):
    """SIGSTOP of the wrapper alone: its guard kills the tree at the deadline by itself,
    while the lease is still live on the store; resumed, the wrapper reports the loss."""
    command, pids, ready = tree_command(tmp_path)
    wrapper = start("--log-format", "json", "run", "k", "--ttl", "2s", "--", *command, env=env)
    tree = read_tree(pids, ready)
    wait_for_holder(store_url, "k")
    os.kill(wrapper.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        took = gone_within(tree, 3.0)
        assert took < 2.0  # before the lease (ttl 2s from the last renewal) runs out
    finally:
        os.kill(wrapper.pid, signal.SIGCONT)
    _, stderr = wrapper.communicate(timeout=15)
    assert wrapper.returncode == 70, stderr
    assert lost_by(stderr) == ["resumed-late"]
    report.record(
        "wrapper SIGSTOPped: guard kills tree",
        report.store_of(store_url),
        tree_gone_after_stop_s=time.monotonic() - stopped if took is None else took,
    )


def test_a_killed_guard_leaves_the_wrapper_to_kill_the_tree(env, store_url, tmp_path):
    command, pids, ready = tree_command(tmp_path)
    wrapper = start("run", "k", "--ttl", "5s", "--", *command, env=env)
    tree = read_tree(pids, ready)
    children = [p for p in procs.children(wrapper.pid) if p.state != "Z"]
    assert len(children) == 1, children  # the guard (the command is the guard's child)
    os.kill(children[0].pid, signal.SIGKILL)
    _, stderr = wrapper.communicate(timeout=15)
    assert wrapper.returncode == 70, stderr
    assert "guard" in stderr
    assert procs.still_running(tree) == []
    assert peek(store_url, "k") is None, stderr  # released on the way out


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_cuts_a_store_call_blocked_on_the_network_short(
    network_store_url, cli_env, signum
):
    """The store answers nothing (a blackholed link): a signal still ends tasklock within
    200 ms with 128+N, runs nothing and, healed, the store shows nothing held."""
    from urllib.parse import urlsplit

    from tests.support.proxy import TcpProxy

    parts = urlsplit(network_store_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port) as proxy:
        proxy.blackhole()
        env = {**cli_env, "TASKLOCK_STORE": proxy.url_for(network_store_url)}
        wrapper = start("run", "k", "--wait", "10s", "--", "echo", "ran", env=env)
        wait_until(lambda: proxy.accepted)  # connected to the proxy: blocked from now on
        time.sleep(0.2)
        assert wrapper.poll() is None
        sent = time.monotonic()
        wrapper.send_signal(signum)
        out, _ = wrapper.communicate(timeout=10)
        took = time.monotonic() - sent
        assert wrapper.returncode == 128 + signum
        assert "ran" not in out
        assert took < 0.2, took  # the contract's 200 ms itself: not widened for load
        proxy.heal()
    assert peek(network_store_url, "k") is None
    report.record(
        f"{signal.Signals(signum).name} during a blackholed store call",
        report.store_of(network_store_url),
        exit_after_s=took,
    )


def test_a_forced_release_stops_the_holder_long_before_its_next_renewal(env, store_url, tmp_path):
    """With a 30 s ttl the next renewal is 10 s away: the holder still hears of the break
    at once, terminates its tree and lets go, and `release` returns only then."""
    command, pids, ready = tree_command(tmp_path)
    wrapper = start("--log-format", "json", "run", "k", "--ttl", "30s", "--", *command, env=env)
    tree = read_tree(pids, ready)
    held = wait_for_holder(store_url, "k")
    wrong = tasklock("release", "k", "--force", "--token", str(held.fencing_token + 1), env=env)
    assert wrong.returncode == 0, wrong.stderr
    assert wrapper.poll() is None and peek(store_url, "k") is not None  # only that token

    started = time.monotonic()
    result = tasklock("release", "k", "--force", "--token", str(held.fencing_token), env=env)
    took = time.monotonic() - started
    assert result.returncode == 0, result.stderr
    assert procs.still_running(tree) == []  # nothing of the old holder runs by now
    assert "the holder let go after" in result.stdout, result.stdout
    assert took < 5.0, took  # not the next renewal, 10 s away (CLI start included)
    _, stderr = wrapper.communicate(timeout=15)
    assert wrapper.returncode == 70
    assert lost_by(stderr) == ["rejected"]
    nxt = tasklock("--log-format", "json", "run", "k", "--", "true", env=env)
    token = next(e for e in json_events(nxt.stderr) if e["event"] == "acquired")["fencing_token"]
    assert token > held.fencing_token
    let_go = float(result.stdout.rsplit("after ", 1)[1].rstrip("s\n"))
    report.record("release --force, ttl 30s", report.store_of(store_url), holder_let_go_s=let_go)


def waiting_guard(waiter_pid: int) -> int:
    """The guard a waiting run forked while it waits; the command has not started."""
    (guard,) = wait_until(
        lambda: [p.pid for p in procs.children(waiter_pid) if p.state != "Z"], interval=0.01
    )
    assert procs.children(guard) == []
    return guard


def test_a_waiting_run_has_its_guard_ready_and_one_that_gives_up_leaves_none(
    env, store_url, tmp_path
):
    marker = tmp_path / "ran"
    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(store_url, "k")
        # (3 s: on a loaded machine the store calls before the wait can take most of 1 s,
        # and the guard, forked once the run waits, would be gone before it was looked for)
        waiter = start("run", "k", "--wait", "3s", "--", "touch", str(marker), env=env)
        guard = waiting_guard(waiter.pid)
        _, stderr = waiter.communicate(timeout=15)
        assert waiter.returncode == 75, stderr
        assert not procs.alive(guard)  # ended and collected before tasklock exits
        assert not marker.exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_waiter_takes_its_guard_along(env, store_url):
    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(store_url, "k")
        waiter = start("run", "k", "--wait", "inf", "--", "true", env=env)
        guard = waiting_guard(waiter.pid)
        waiter.kill()
        waiter.wait()
        wait_until(lambda: not procs.alive(guard), timeout=1.0, interval=0.01)
    finally:
        holder.kill()
        holder.wait()
