"""The store blacked out while a queue waits.

A holder runs under the lock and four waiters queue behind it in arrival order, all of them
reaching the store through the test's TCP proxy. The proxy blackholes for longer than a
waiter's place lease (``waiter_ttl``, 3 s), so every place runs out on the store, then heals.

Two holders, each TTL chosen against the blackout:

- ``rides-out``: ``--ttl 30s`` outlasts the blackout (README: 30 s rides out about 24 s
  without a renewal). The holder renews after the heal and goes on; the waiters come back to
  the queue behind it and are served in the order of their new places.
- ``loses``: ``--ttl 6s`` does not. The holder's whole tree must be dead before its lease
  runs out on the store (before anyone else could start), the wrapper exits 70 with a
  ``lost`` event (``unreachable``), and the waiters take the free key after the heal.

Either way: never two commands of the key at once (an ``O_EXCL`` marker, real clock times of
every start and end, and each command checks that no process of the holder's tree lives),
every waiter runs (``--wait`` is long enough; nothing hangs), the queue drains within
``waiter_ttl`` plus a margin once the key can be had (no ghost place keeps it stuck), and
``peek --json`` shows no waiters at the end.
"""

from __future__ import annotations

import itertools
import json
import sys
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import WAITER_TTL_S
from tests.support import procs
from tests.support import report
from tests.support.cli import json_events
from tests.support.cli import peek
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_command
from tests.support.cli import wait_until
from tests.support.proxy import TcpProxy

KEY = "deploy:blackout"
WAITERS = 4
#: The blackout lasts at least this long, and anyway until every place ran out on the store
#: (and, for the holder that loses, its lease too).
MIN_BLACKOUT_S = 6.0
#: Each waiter's command runs this long, so that an overlap could not slip between two looks.
JOB_S = 0.3
#: The queue drains within WAITER_TTL_S plus this once the key can be had: four runs one
#: after the other (about 1.5 s idle, 2.2 s beside three other xdist workers on 2 cores)
#: and etcd's whole-second waiter leases. A place left behind by a run that got the key
#: (a ghost) holds each hand-off up for a waiter_ttl and overruns it.
DRAIN_MARGIN_S = 6.0

#: The command of every run. The holder (``hold``) keeps the key until the file ``go``
#: exists, with a ``sleep`` in the background (its tree is two processes); a waiter
#: (``job``) runs JOB_S. Each takes the marker with O_EXCL (another command of the key
#: holds it: an overlap), looks whether a process of the holder's tree still lives
#: (``pid:starttime`` pairs in HOLDER_TREE), and appends its start and end, on the wall
#: clock, to the log.
JOB = r"""
import json, os, signal, subprocess, sys, time
mode, name, log, marker = sys.argv[1:5]

def note(**fields):
    with open(log, "a") as out:
        out.write(json.dumps({"name": name, **fields}) + "\n")

def alive(pid, started):
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return False
    return fields[0] != b"Z" and fields[19].decode() == started

began = time.time()
try:
    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
except FileExistsError:
    fd = None
tree = [pair.split(":") for pair in os.environ.get("HOLDER_TREE", "").split()]
note(
    event="start",
    at=began,
    overlap=fd is None,
    holder_tree_alive=[pid for pid, started in tree if alive(pid, started)],
    token=int(os.environ["TASKLOCK_FENCING_TOKEN"]),
)
if mode == "hold":
    sleeper = subprocess.Popen(["sleep", "300"])
    open(sys.argv[5] + ".ready", "w").close()
    while not os.path.exists(sys.argv[5]):
        time.sleep(0.02)
    sleeper.kill()
    sleeper.wait()
else:
    time.sleep(float(sys.argv[5]))
ended = time.time()
if fd is not None:
    os.close(fd)
    os.unlink(marker)
note(event="end", at=ended)
"""


def _ts(event: dict) -> float:
    return datetime.fromisoformat(event["ts"].replace("Z", "+00:00")).timestamp()


def _waiting_pids(url: str) -> list[int]:
    with open_store(url) as store:
        return [waiter.holder.pid for waiter in store.waiters(KEY)]


def _peek_json(env: dict[str, str]) -> dict:
    return json.loads(tasklock("peek", KEY, "--json", env=env).stdout)


@pytest.mark.slow
@pytest.mark.parametrize("holder_fate", ["rides-out", "loses"])
def test_store_blacked_out_while_a_queue_waits(network_store_url, cli_env, tmp_path, holder_fate):
    url = network_store_url
    parts = urlsplit(url)
    direct = {**cli_env, "TASKLOCK_STORE": url}  # the test's own looks, never cut off
    job, log, marker = tmp_path / "job.py", tmp_path / "log", tmp_path / "marker"
    go = tmp_path / "go"
    job.write_text(JOB)
    python = [sys.executable, str(job)]
    ttl = "30s" if holder_fate == "rides-out" else "6s"

    with TcpProxy(parts.hostname or "127.0.0.1", parts.port) as proxy:
        cut_off = {**cli_env, "TASKLOCK_STORE": proxy.url_for(url)}
        json_run = ["--log-format", "json", "run", KEY]
        hold = [*python, "hold", "holder", str(log), str(marker), str(go)]
        holder = start(*json_run, "--ttl", ttl, "--grace", "1s", "--", *hold, env=cut_off)
        runs = [holder]
        try:
            wait_for_command(holder, Path(f"{go}.ready"), timeout=30)
            held = peek(url, KEY)
            assert held is not None and held.holder.pid == holder.pid
            tree = procs.command_tree(holder.pid)
            assert len(tree) >= 2, tree  # python and its background sleep
            identities = procs.identities(tree)
            waiter_env = {**cut_off, "HOLDER_TREE": " ".join(f"{p}:{s}" for p, s in identities)}

            waiters = []
            for n in range(WAITERS):
                wait = [*json_run, "--wait", "180", "--note", f"w{n}", "--"]
                command = [*python, "job", f"w{n}", str(log), str(marker), str(JOB_S)]
                waiters.append(start(*wait, *command, env=waiter_env))
                runs.append(waiters[-1])
                wait_until(lambda: len(_waiting_pids(url)) == len(waiters), timeout=30)
            arrival = [waiter.pid for waiter in waiters]
            before = _peek_json(direct)
            assert before["held"] is True and before["fencing_token"] == held.fencing_token
            assert [w["pid"] for w in before["waiters"]] == arrival

            watcher, tree_dead_at = procs.death_watch(tree)
            watcher.start()
            proxy.blackhole()
            blackout_began = time.monotonic()
            # The premise: the blackout outlives every place (nobody can renew one).
            wait_until(lambda: _waiting_pids(url) == [], timeout=WAITER_TTL_S + 15, interval=0.1)
            if holder_fate == "loses":
                wait_until(lambda: peek(url, KEY) is None, timeout=30)
                # The safety promise: the holder's tree ended before its lease ran out.
                assert tree_dead_at, "the holder's lease ran out on the store, its tree lives"
                assert not any(procs.alive(pid) for pid in tree)
                # The holder's marker stays behind a killed command; nobody can start before
                # the heal, and the tree's end is checked against every start below.
                marker.unlink()
            else:
                still = peek(url, KEY)
                assert still is not None and still.fencing_token == held.fencing_token
            time.sleep(max(0.0, MIN_BLACKOUT_S - (time.monotonic() - blackout_began)))
            blackout = time.monotonic() - blackout_began
            proxy.heal()
            healed_at = time.time()

            if holder_fate == "rides-out":
                # Every waiter comes back: its place ran out, and it takes a new one at the
                # end of the queue in the order the waiters come back (the old order is gone
                # with the places). From then on, first come, first served again.
                wait_until(lambda: len(_waiting_pids(url)) == WAITERS, timeout=WAITER_TTL_S + 30)
                after = _peek_json(direct)
                assert after["fencing_token"] == held.fencing_token
                rejoined = [w["pid"] for w in after["waiters"]]
                assert sorted(rejoined) == sorted(arrival)
                go.touch()
            # (loses: the blackout outlived the places and the lease alike. The waiters come
            # back to a free key: the first to reach the store takes it, the others queue
            # in the order they come back. No order of arrival survives; each runs once.)

            outputs = [run.communicate(timeout=120) for run in runs]
        finally:
            proxy.heal()
            go.touch()
            for run in runs:
                if run.poll() is None:
                    run.kill()
                    run.wait()

    holder_events = json_events(outputs[0][1])
    waiter_events = [json_events(stderr) for _, stderr in outputs[1:]]
    lost = [e["detected_by"] for e in holder_events if e["event"] == "lost"]
    if holder_fate == "rides-out":
        assert holder.returncode == 0, outputs[0][1]
        assert lost == []
    else:
        assert holder.returncode == 70, outputs[0][1]
        assert lost == ["unreachable"]
    for waiter, (_, stderr) in zip(waiters, outputs[1:], strict=True):
        # A store that does not answer while a run waits is retried like a held key, as
        # long as --wait lasts (180 s here): every waiter runs; none gives up, none hangs.
        assert waiter.returncode == 0, stderr

    # Never two commands at once, on the wall clock and by the marker.
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    starts = {line["name"]: line for line in lines if line["event"] == "start"}
    ends = {line["name"]: line["at"] for line in lines if line["event"] == "end"}
    assert sorted(starts) == sorted(["holder"] + [f"w{n}" for n in range(WAITERS)])
    if holder_fate == "loses":
        assert "holder" not in ends
        (ends["holder"],) = tree_dead_at
    intervals = sorted((starts[name]["at"], ends[name], name) for name in starts)
    assert intervals[0][2] == "holder"
    for (_, end, name), (begin, _, following) in itertools.pairwise(intervals):
        assert end < begin, f"{following} started before {name} ended"
    for name, line in starts.items():
        assert not line["overlap"], f"{name} found the marker of another command"
        assert line["holder_tree_alive"] == [], f"{name} started beside the holder's tree"
    served = [name for _, _, name in intervals[1:]]
    tokens = [starts[name]["token"] for name in ["holder", *served]]
    assert tokens == sorted(set(tokens)), tokens  # fencing tokens in the order served

    names_by_pid = {waiter.pid: f"w{n}" for n, waiter in enumerate(waiters)}
    if holder_fate == "rides-out":
        # The queue the waiters came back to is the order they are served in.
        assert served == [names_by_pid[pid] for pid in rejoined]
        key_free_at = next(_ts(e) for e in holder_events if e["event"] == "released")
    else:
        key_free_at = healed_at
    last_release = max(
        _ts(e) for events in waiter_events for e in events if e["event"] == "released"
    )
    drained_in = last_release - key_free_at
    assert drained_in < WAITER_TTL_S + DRAIN_MARGIN_S, drained_in

    free = _peek_json(direct)
    assert free == {"key": KEY, "held": False, "waiters": []}
    report.record(
        f"blackout {blackout:.0f}s while {WAITERS} wait, holder {holder_fate}",
        report.store_of(url),
        queue_drained_after_s=drained_in,
        holder_exit=holder.returncode,
    )
