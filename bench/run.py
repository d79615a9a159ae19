#!/usr/bin/env python3
"""tasklock benchmark suite: one command, every section, side by side in one run.

    .venv/bin/python bench/run.py [--quick] [--stores sqlite,redis,postgres]
                                  [--markdown bench/RESULTS.md]

Compared commands are interleaved (shuffled round robin) so that a noisy machine slows
all of them alike; every section is bounded in time. See bench/README.md for what each
number means. Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import math
import multiprocessing as mp
import os
import platform
import random
import re
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasklock_cli.stores import open_store  # noqa: E402
from tasklock_cli.stores.base import Holder, Store  # noqa: E402

PYTHON = sys.executable
TASKLOCK = str(Path(PYTHON).parent / "tasklock")
REDIS_BASE = "redis://127.0.0.1:6379/0"
POSTGRES_BASE = "postgresql://127.0.0.1:5432/test"
ALL_STORES = ("sqlite", "redis", "postgres")
RUN_ID = f"{os.getpid()}"
HOLDER = Holder(host="bench", pid=os.getpid(), user="bench", command=["bench"], note=None)


# -- budgets -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Budget:
    overhead_rounds: int
    cold_rounds: int
    roundtrip_seconds: float
    handoff_rounds: dict[int, int]
    handoff_seconds: float
    contention_seconds: float
    contention_reps: int
    scale_leases: int
    scale_insert_seconds: float
    scale_peeks: int
    heartbeat_sleep: int = 5


FULL = Budget(
    overhead_rounds=30,
    cold_rounds=6,
    roundtrip_seconds=4.0,
    handoff_rounds={1: 10, 8: 2, 32: 1},
    handoff_seconds=35.0,
    contention_seconds=2.5,
    contention_reps=2,
    scale_leases=100_000,
    scale_insert_seconds=45.0,
    scale_peeks=2000,
)
QUICK = Budget(
    overhead_rounds=6,
    cold_rounds=1,
    roundtrip_seconds=1.2,
    handoff_rounds={1: 2, 8: 1, 32: 1},
    handoff_seconds=10.0,
    contention_seconds=1.0,
    contention_reps=1,
    scale_leases=10_000,
    scale_insert_seconds=10.0,
    scale_peeks=300,
)


# -- statistics and tables ---------------------------------------------------------------------


def prose(text: str) -> str:
    """A paragraph written across several source lines, as one line."""
    return " ".join(text.split())


def median(values: Sequence[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def p99(values: Sequence[float]) -> float:
    """Nearest-rank 99th percentile (the maximum below 100 samples)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]


def fmt(value: float | int | str | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return f"{value:,}"
    if math.isnan(value):
        return "—"
    return f"{value:,.{digits}f}"


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def add(self, *cells: object) -> None:
        self.rows.append([c if isinstance(c, str) else fmt(c) for c in cells])

    def skip(self, label: str, reason: str) -> None:
        self.rows.append([label, f"skipped: {reason}", *[""] * (len(self.headers) - 2)])

    def text(self) -> str:
        widths = [
            max(len(r[i]) for r in [self.headers, *self.rows]) for i in range(len(self.headers))
        ]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
        body = [line(self.headers), line(["-" * w for w in widths]), *map(line, self.rows)]
        notes = [f"  * {n}" for n in self.notes]
        return "\n".join([f"== {self.title}  ({self.seconds:.0f} s)", *body, *notes, ""])

    def markdown(self) -> str:
        row = lambda cells: "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"  # noqa: E731
        body = [row(self.headers), row(["---"] * len(self.headers)), *map(row, self.rows)]
        notes = [f"- {n}" for n in self.notes]
        head = f"## {self.title}\n\n_section time {self.seconds:.0f} s_\n"
        return "\n".join([head, *body, "", *notes, ""])


# -- processes: tracked, in their own groups, never left behind --------------------------------

_LIVE_PROCS: list[subprocess.Popen] = []


def spawn(argv: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen:
    kwargs.setdefault("stdout", subprocess.DEVNULL)
    kwargs.setdefault("stderr", subprocess.DEVNULL)
    proc = subprocess.Popen(argv, env=env, start_new_session=True, **kwargs)
    _LIVE_PROCS.append(proc)
    return proc


def reap(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return proc.wait()
    finally:
        with contextlib.suppress(ValueError):
            _LIVE_PROCS.remove(proc)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_leftovers() -> None:
    for proc in list(_LIVE_PROCS):
        kill_group(proc)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
    _LIVE_PROCS.clear()


def timed_run(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    code = reap(spawn(argv, env), timeout=60)
    elapsed = time.perf_counter() - started
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {code}")
    return elapsed


# -- stores ------------------------------------------------------------------------------------


@dataclass
class StoreKind:
    """One backend: how to name a private namespace on it, ping it raw, and clean it up."""

    name: str
    module: str
    workdir: Path
    reason: str | None = None

    def url(self, namespace: str) -> str:
        if self.name == "sqlite":
            return f"sqlite:///{self.workdir / f'{namespace}.db'}"
        if self.name == "redis":
            return f"{REDIS_BASE}?prefix=tlbench:{RUN_ID}:{namespace}:"
        return f"{POSTGRES_BASE}?table=tlbench_{RUN_ID}_{namespace}"

    def raw_ping(self, namespace: str) -> tuple[Callable[[], object], Callable[[], None]]:
        """The driver's own cheapest round trip against the same server/file, and a closer."""
        if self.name == "sqlite":
            conn = sqlite3.connect(self.workdir / f"{namespace}.db", isolation_level=None)
            return (lambda: conn.execute("SELECT 1").fetchone()), conn.close
        if self.name == "redis":
            import redis

            client = redis.Redis.from_url(REDIS_BASE)
            return client.ping, client.close
        import psycopg

        pg = psycopg.connect(POSTGRES_BASE, autocommit=True)
        return (lambda: pg.execute("SELECT 1").fetchone()), pg.close

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            if self.name == "redis":
                _drop_redis_namespace()
            elif self.name == "postgres":
                _drop_postgres_tables()


def _drop_redis_namespace() -> None:
    import redis

    client = redis.Redis.from_url(REDIS_BASE)
    batch: list[bytes] = []
    for name in client.scan_iter(match=f"tlbench:{RUN_ID}:*", count=10_000):
        batch.append(name)
        if len(batch) >= 5000:
            client.delete(*batch)
            batch.clear()
    if batch:
        client.delete(*batch)
    client.close()


def _drop_postgres_tables() -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(POSTGRES_BASE, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT schemaname, tablename FROM pg_tables WHERE tablename LIKE %s",
            (f"tlbench\\_{RUN_ID}\\_%",),
        ).fetchall()
        for schema, table in rows:
            conn.execute(
                sql.SQL("DROP TABLE IF EXISTS {} CASCADE").format(sql.Identifier(schema, table))
            )


def probe_store(kind: StoreKind) -> str | None:
    """None when the store can be benchmarked here, else why not."""
    try:
        __import__(f"tasklock_cli.stores.{kind.module}")
    except Exception as exc:
        return f"import tasklock_cli.stores.{kind.module} failed ({exc})"
    try:
        ping, close = kind.raw_ping("probe")
        ping()
        close()
        with open_store(kind.url("probe")) as store:
            store.peek("probe")
    except Exception as exc:
        return f"{kind.name} not reachable ({type(exc).__name__}: {exc})"
    return None


def make_stores(names: Sequence[str], workdir: Path) -> list[StoreKind]:
    modules = {"sqlite": "sqlite", "redis": "redis", "postgres": "postgres"}
    kinds = [StoreKind(name, modules[name], workdir) for name in names]
    for kind in kinds:
        kind.reason = probe_store(kind)
    return kinds


# -- environments for subprocesses -------------------------------------------------------------


@dataclass
class Envs:
    warm: dict[str, str]
    cold: dict[str, str]


def make_envs(workdir: Path) -> Envs:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TASKLOCK_", "PYTHON"))}
    base.update(
        LC_ALL="C",
        XDG_CONFIG_HOME=str(workdir / "xdg-config"),
        XDG_STATE_HOME=str(workdir / "xdg-state"),
    )
    warm = {**base, "PYTHONPYCACHEPREFIX": str(workdir / "pycache-warm")}
    cold_dir = workdir / "pycache-empty"
    cold_dir.mkdir()
    cold = {**base, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPYCACHEPREFIX": str(cold_dir)}
    return Envs(warm, cold)


def with_store(env: dict[str, str], url: str) -> dict[str, str]:
    return {**env, "TASKLOCK_STORE": url}


# -- 1. wrapper overhead -----------------------------------------------------------------------


@dataclass
class Cmd:
    label: str
    argv: list[str]
    env: dict[str, str]
    group: str = ""
    times: list[float] = field(default_factory=list)


def overhead_commands(kinds: list[StoreKind], envs: Envs, workdir: Path) -> list[Cmd]:
    cmds: list[Cmd] = []
    for kind in kinds:
        env = with_store(envs.warm, kind.url("overhead"))
        imports = (
            f"import tasklock_cli.cli, tasklock_cli.supervisor, tasklock_cli.stores.{kind.module}"
        )
        cmds.append(
            Cmd(
                f"{kind.name}: tasklock run k -- true",
                [TASKLOCK, "run", "k", "--", "true"],
                env,
                kind.name,
            )
        )
        cmds.append(Cmd(f"{kind.name}: import floor", [PYTHON, "-c", imports], env, kind.name))
    cmds.append(Cmd("python -c pass", [PYTHON, "-c", "pass"], envs.warm))
    cmds.append(Cmd("flock FILE true", ["flock", str(workdir / "flock.lock"), "true"], envs.warm))
    cmds.append(Cmd("true", ["true"], envs.warm))
    return cmds


def cold_commands(kinds: list[StoreKind], envs: Envs) -> list[Cmd]:
    cmds: list[Cmd] = []
    for kind in kinds:
        env = with_store(envs.cold, kind.url("overhead"))
        imports = (
            f"import tasklock_cli.cli, tasklock_cli.supervisor, tasklock_cli.stores.{kind.module}"
        )
        cmds.append(
            Cmd(
                f"{kind.name}: tasklock run (no .pyc)",
                [TASKLOCK, "run", "k", "--", "true"],
                env,
                kind.name,
            )
        )
        cmds.append(
            Cmd(f"{kind.name}: import floor (no .pyc)", [PYTHON, "-c", imports], env, kind.name)
        )
    return cmds


def interleave(cmds: list[Cmd], rounds: int, rng: random.Random, deadline: float) -> int:
    """Shuffled round robin: every round runs every command once, in a fresh order."""
    done = 0
    for _ in range(rounds):
        if time.monotonic() > deadline:
            break
        for cmd in rng.sample(cmds, len(cmds)):
            cmd.times.append(timed_run(cmd.argv, cmd.env))
        done += 1
    return done


def paired_diff_ms(a: Cmd, b: Cmd) -> float:
    n = min(len(a.times), len(b.times))
    return median([(x - y) * 1000 for x, y in zip(a.times[:n], b.times[:n], strict=True)])


def overhead_row(table: Table, cmd: Cmd, floor: Cmd | None, bare_python: Cmd) -> None:
    med = median(cmd.times) * 1000
    ratio = med / (median(floor.times) * 1000) if floor else None
    over = paired_diff_ms(cmd, floor) if floor and floor is not cmd else None
    over_python = paired_diff_ms(cmd, bare_python) if cmd.argv[0] in (PYTHON, TASKLOCK) else None
    table.add(
        cmd.label,
        len(cmd.times),
        med,
        p99(cmd.times) * 1000,
        fmt(ratio),
        fmt(over),
        fmt(over_python),
    )


def section_overhead(kinds: list[StoreKind], envs: Envs, budget: Budget, workdir: Path) -> Table:
    table = Table(
        "1. Wrapper overhead (wall time per invocation)",
        [
            "command",
            "n",
            "median ms",
            "p99 ms",
            "× floor",
            "over floor ms",
            "over `python -c pass` ms",
        ],
    )
    live = [k for k in kinds if k.reason is None]
    warm, cold = overhead_commands(live, envs, workdir), cold_commands(live, envs)
    for cmd in warm:  # one warm-up run each: fills the bytecode cache and the page cache
        timed_run(cmd.argv, cmd.env)
    rng = random.Random(1)
    interleave(warm, budget.overhead_rounds, rng, time.monotonic() + 4 * budget.overhead_rounds)
    interleave(cold, budget.cold_rounds, rng, time.monotonic() + 8 * budget.cold_rounds)
    bare = next(c for c in warm if c.label == "python -c pass")
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        mine = [c for c in warm + cold if c.group == kind.name]
        for run_cmd, floor in ((mine[0], mine[1]), (mine[2], mine[3])):
            overhead_row(table, run_cmd, floor, bare)
            overhead_row(table, floor, floor, bare)
    for cmd in warm:
        if not cmd.group:
            overhead_row(table, cmd, None, bare)
    table.add(
        "etcdctl lock",
        "skipped: etcdctl is not installed" if not shutil.which("etcdctl") else "not run",
        "",
        "",
        "",
        "",
        "",
    )
    table.notes += [
        prose(
            """`× floor` / `over floor`: against the same store's import floor (`python -c 'import
                tasklock_cli.cli, tasklock_cli.supervisor, tasklock_cli.stores.<store>'`); `over …`
                columns are medians of per-round paired differences."""
        ),
        prose(
            """Warm rows: PYTHONDONTWRITEBYTECODE removed and a private PYTHONPYCACHEPREFIX, filled
                by one warm-up run of each command before timing. `(no .pyc)` rows:
                PYTHONDONTWRITEBYTECODE=1 (as this environment sets it) with an empty cache prefix,
                i.e. every module compiled from source."""
        ),
        prose(
            """Commands are run in a freshly shuffled order each round (interleaved); wall time
                includes fork/exec from the benchmark process."""
        ),
    ]
    return table


# -- 2. store round trips ----------------------------------------------------------------------


def time_block(op: Callable[[], object], count: int, out: list[float]) -> None:
    for _ in range(count):
        started = time.perf_counter()
        op()
        out.append(time.perf_counter() - started)


def roundtrip_ops(store: Store) -> dict[str, Callable[[], object]]:
    token = secrets.token_hex(16)
    held = store.acquire("rt-renew", 60, HOLDER, secrets.token_hex(16))
    assert held is not None, "could not take the renew key"

    def cycle() -> None:
        lease = store.acquire("rt-cycle", 60, HOLDER, token)
        assert lease is not None
        store.release(lease)

    return {"cycle": cycle, "renew": lambda: store.renew(held, 60)}


def measure_roundtrips(
    kind: StoreKind, seconds: float, rng: random.Random
) -> dict[str, list[float]]:
    ping, close_raw = kind.raw_ping("roundtrip")
    store = open_store(kind.url("roundtrip"))
    try:
        ops = {"raw": ping, **roundtrip_ops(store)}
        samples: dict[str, list[float]] = {name: [] for name in ops}
        for op in ops.values():  # warm-up: connections, prepared statements, script cache
            time_block(op, 30, [])
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name in rng.sample(list(ops), len(ops)):
                time_block(ops[name], 25, samples[name])
        return samples
    finally:
        store.close()
        close_raw()


def section_roundtrips(
    kinds: list[StoreKind], budget: Budget, single_rates: dict[str, float]
) -> Table:
    us = 1e6
    table = Table(
        "2. Store round trips (Python API, one process, one key)",
        [
            "store",
            "raw p50 µs",
            "raw p99 µs",
            "acq+rel p50 µs",
            "acq+rel p99 µs",
            "cycles/s",
            "renew p50 µs",
            "renew p99 µs",
            "acq+rel / raw",
            "renew / raw",
        ],
    )
    rng = random.Random(2)
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        s = measure_roundtrips(kind, budget.roundtrip_seconds, rng)
        raw, cyc, ren = (median(s[k]) for k in ("raw", "cycle", "renew"))
        single_rates[kind.name] = len(s["cycle"]) / sum(s["cycle"])
        table.add(
            kind.name,
            raw * us,
            p99(s["raw"]) * us,
            cyc * us,
            p99(s["cycle"]) * us,
            single_rates[kind.name],
            ren * us,
            p99(s["renew"]) * us,
            cyc / raw,
            ren / raw,
        )
    table.notes += [
        prose(
            """raw = the driver's cheapest round trip on its own connection in the same run:
                sqlite3 `SELECT 1` on the same file, redis-py `PING`, psycopg `SELECT 1`
                (autocommit)."""
        ),
        prose(
            """acq+rel = one `acquire` + one `release` (two store round trips; on SQLite two write
                transactions). cycles/s = samples / time spent in them. Blocks of 25 of each op, in
                shuffled order, repeated."""
        ),
    ]
    return table


# -- 3. hand-off latency -----------------------------------------------------------------------

HOLDER_SCRIPT = (
    'echo "s $EPOCHREALTIME" >> "$BENCH_LOG"; '
    'while [ ! -e "$BENCH_GO" ]; do sleep 0.005; done; echo "e $EPOCHREALTIME" >> "$BENCH_LOG"'
)
WAITER_SCRIPT = (
    'echo "s $EPOCHREALTIME" >> "$BENCH_LOG"; sleep 0.02; echo "e $EPOCHREALTIME" >> "$BENCH_LOG"'
)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def read_events(log: Path) -> list[tuple[float, str]]:
    if not log.exists():
        return []
    events = []
    for line in log.read_text().splitlines():
        kind, _, stamp = line.partition(" ")
        events.append((float(stamp), kind))
    return sorted(events)


def handoff_round(
    kind: StoreKind, env: dict[str, str], waiters: int, tag: str, workdir: Path
) -> tuple[list[float], int]:
    """One holder, then ``waiters`` queued behind it; returns (hand-off latencies, overlaps)."""
    rundir = workdir / f"handoff-{tag}"
    rundir.mkdir()
    log, go = rundir / "log", rundir / "go"
    env = {**with_store(env, kind.url("handoff")), "BENCH_LOG": str(log), "BENCH_GO": str(go)}
    argv = [TASKLOCK, "run", f"hot-{tag}", "--wait", "inf", "--", "bash", "-c"]
    procs = [spawn([*argv, HOLDER_SCRIPT], env)]
    try:
        wait_until(lambda: len(read_events(log)) >= 1, 15, "the holder to start")
        errs = [rundir / f"w{i}.err" for i in range(waiters)]
        for err in errs:
            procs.append(spawn([*argv, WAITER_SCRIPT], env, stderr=err.open("w")))
        wait_until(lambda: all("waiting" in e.read_text() for e in errs), 30 + waiters, "waiters")
        time.sleep(0.3)  # let every waiter settle into its steady polling/listening state
        go.touch()
        for proc in procs:
            reap(proc, timeout=20 + waiters)
    finally:
        for proc in procs:
            if proc.poll() is None:
                reap(proc, timeout=0)
    return handoff_latencies(read_events(log))


def handoff_latencies(events: list[tuple[float, str]]) -> tuple[list[float], int]:
    kinds = [k for _, k in events]
    overlaps = sum(1 for a, b in itertools.pairwise(kinds) if a == b == "s")
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(events) if a[1] == "e" and b[1] == "s"]
    return gaps, overlaps


def section_handoff(kinds: list[StoreKind], envs: Envs, budget: Budget, workdir: Path) -> Table:
    table = Table(
        "3. Hand-off latency (previous holder's child exits → next waiter's child starts)",
        ["store", "waiters", "rounds", "hand-offs", "p50 ms", "p99 ms", "max ms", "overlaps"],
    )
    live = [k for k in kinds if k.reason is None]
    results: dict[tuple[str, int], tuple[int, list[float], int]] = {}
    for waiters, rounds in budget.handoff_rounds.items():
        deadline = time.monotonic() + budget.handoff_seconds
        for r in range(rounds):
            if r and time.monotonic() > deadline:
                break
            for kind in live:  # stores interleaved round by round
                gaps, overlaps = handoff_round(
                    kind, envs.warm, waiters, f"{kind.name}-{waiters}-{r}", workdir
                )
                done, all_gaps, all_overlaps = results.get((kind.name, waiters), (0, [], 0))
                results[(kind.name, waiters)] = (done + 1, all_gaps + gaps, all_overlaps + overlaps)
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        for waiters in budget.handoff_rounds:
            done, gaps, overlaps = results[(kind.name, waiters)]
            ms = [g * 1000 for g in gaps]
            table.add(
                kind.name,
                waiters,
                done,
                len(ms),
                median(ms),
                p99(ms),
                max(ms) if ms else None,
                overlaps,
            )
    table.notes += [
        prose(
            """Each round: one `tasklock run hot --wait inf -- bash -c …` holder, then N waiters
                started and confirmed waiting (their `waiting` event), 0.3 s settle, then the
                holder's child exits. Each child appends `s $EPOCHREALTIME` on start, sleeps 20 ms,
                appends `e $EPOCHREALTIME` just before exiting (bash's builtin clock: no fork,
                unlike `date +%s.%N`). Hand-off = next `s` − previous `e`."""
        ),
        prose(
            """It includes the old wrapper noticing its child's exit, the release round trip, the
                waiter waking (SQLite: polling with backoff up to 50 ms ×0.5–1.5 jitter; Redis:
                pub/sub; PostgreSQL: LISTEN/NOTIFY) and spawning the child. `overlaps` counts two
                children running at once (must be 0)."""
        ),
    ]
    return table


# -- 4. throughput under contention ------------------------------------------------------------


def contention_worker(url: str, keys: list[str], start_at: float, end_at: float, out: Any) -> None:
    store = open_store(url)
    rng = random.Random(os.getpid())
    token = secrets.token_hex(16)
    store.peek(keys[0])  # connect before the start line
    acquired = attempts = 0
    time.sleep(max(0.0, start_at - time.time()))
    while time.time() < end_at:
        attempts += 1
        lease = store.acquire(rng.choice(keys), 30, HOLDER, token)
        if lease is not None:
            acquired += 1
            store.release(lease)
    store.close()
    out.put((acquired, attempts))


def run_workers(url: str, keys: list[str], procs: int, seconds: float) -> tuple[int, int]:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.time() + 1.0
    workers = [
        ctx.Process(target=contention_worker, args=(url, keys, start_at, start_at + seconds, out))
        for _ in range(procs)
    ]
    for w in workers:
        w.start()
    try:
        results = [out.get(timeout=seconds + 60) for _ in workers]
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
                w.join()
    return sum(r[0] for r in results), sum(r[1] for r in results)


def section_contention(
    kinds: list[StoreKind], budget: Budget, single_rates: dict[str, float]
) -> Table:
    table = Table(
        "4. Throughput under contention (8 processes, Python API, acquire then release at once)",
        ["store", "keys", "acquisitions/s", "attempts/s", "success %", "× 1-process cycles/s (§2)"],
    )
    modes = {"1 hot key": ["hot"], "100 distinct": [f"key-{i:03d}" for i in range(100)]}
    live = [k for k in kinds if k.reason is None]
    totals: dict[tuple[str, str], list[int]] = {}
    for _ in range(budget.contention_reps):
        for kind in live:
            for mode, keys in modes.items():
                got, tried = run_workers(kind.url("contention"), keys, 8, budget.contention_seconds)
                acc = totals.setdefault((kind.name, mode), [0, 0])
                acc[0], acc[1] = acc[0] + got, acc[1] + tried
    seconds = budget.contention_seconds * budget.contention_reps
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        for mode in modes:
            got, tried = totals[(kind.name, mode)]
            single = single_rates.get(kind.name)
            table.add(
                kind.name,
                mode,
                got / seconds,
                tried / seconds,
                100 * got / max(tried, 1),
                fmt(got / seconds / single) if single else "—",
            )
    table.notes += [
        prose(
            f"""8 forked workers, each with its own store connection, started together,
                {budget.contention_seconds:g} s × {budget.contention_reps} reps (stores and modes
                interleaved). A worker picks a key (the hot one, or uniformly among 100), tries
                `acquire`; on success `release`s at once. acquisitions/s counts successes; attempts
                include conflicts (None)."""
        ),
    ]
    return table


# -- 5. scale ----------------------------------------------------------------------------------


def insert_worker(
    url: str, index: int, names: list[str], ttl: float, deadline: float, out: Any
) -> None:
    store = open_store(url)
    token = secrets.token_hex(16)
    done = 0
    for name in names:
        if time.time() > deadline:
            break
        store.acquire(name, ttl, HOLDER, token)
        done += 1
    store.close()
    out.put((index, done))


def api_insert(url: str, names: list[str], ttl: float, seconds: float, procs: int) -> list[str]:
    """Insert through ``store.acquire`` from ``procs`` forked processes; returns what made it."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    deadline = time.time() + seconds
    chunks = [names[i::procs] for i in range(procs)]
    workers = [
        ctx.Process(target=insert_worker, args=(url, i, chunk, ttl, deadline, out))
        for i, chunk in enumerate(chunks)
    ]
    for w in workers:
        w.start()
    try:
        counts = dict(out.get(timeout=seconds + 60) for _ in workers)
    finally:
        for w in workers:
            w.join(timeout=10)
            if w.is_alive():
                w.kill()
                w.join()
    return sorted(name for i, chunk in enumerate(chunks) for name in chunk[: counts[i]])


def postgres_batch_insert(table: str, names: list[str], ttl: float) -> None:
    """Rows shaped exactly as PostgresStore.acquire writes them, 10,000 per statement."""
    import psycopg
    from psycopg.types.json import Jsonb

    statement = f"""
        INSERT INTO {table} (key, fencing_token, owner_token, holder, acquired_at, expires_at)
        SELECT k, 1, md5(k), %(holder)s, clock_timestamp(),
               clock_timestamp() + %(ttl)s * interval '1 second'
        FROM unnest(%(keys)s::text[]) AS k"""
    with psycopg.connect(POSTGRES_BASE, autocommit=True) as conn:
        for start in range(0, len(names), 10_000):
            params = {"holder": Jsonb(HOLDER.to_dict()), "ttl": ttl}
            conn.execute(statement, {**params, "keys": names[start : start + 10_000]})


def insert_leases(
    kind: StoreKind, namespace: str, names: list[str], ttl: float, seconds: float
) -> tuple[list[str], float, str]:
    """(inserted names, seconds, how): SQL batch on PostgreSQL (checked through the API,
    falling back to the API on any mismatch), the API elsewhere (SQLite: one process,
    since its writers serialise anyway; Redis: four)."""
    started = time.perf_counter()
    url = kind.url(namespace)
    with open_store(url) as store:
        store.peek("schema")  # creates the table where there is one
        if kind.name == "postgres":
            with contextlib.suppress(Exception):
                postgres_batch_insert(f"tlbench_{RUN_ID}_{namespace}", names, ttl)
                if ttl < 1 or store.peek(names[-1]) is not None:
                    return names, time.perf_counter() - started, "SQL batch"
    procs = 1 if kind.name == "sqlite" else 4
    done = api_insert(url, names, ttl, seconds, procs)
    return done, time.perf_counter() - started, f"API, {procs} proc{'s' if procs > 1 else ''}"


def timed(op: Callable[[], object]) -> float:
    started = time.perf_counter()
    op()
    return time.perf_counter() - started


def compare_peeks(
    targets: dict[str, tuple[Store, list[str]]], count: int, rng: random.Random
) -> dict[str, list[float]]:
    """Blocks of 50 peeks at random keys of each target, targets in shuffled order."""
    out: dict[str, list[float]] = {label: [] for label in targets}
    for _ in range(max(1, count // 50)):
        for label in rng.sample(list(targets), len(targets)):
            store, keys = targets[label]
            for key in rng.choices(keys, k=50):
                out[label].append(timed(lambda s=store, k=key: s.peek(k)))
    return out


def list_times(
    store: Store, prefixes: dict[str, str], reps: int, rng: random.Random
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {label: [] for label in prefixes}
    counts: dict[str, int] = {}
    for _ in range(reps):
        for label in rng.sample(list(prefixes), len(prefixes)):
            started = time.perf_counter()
            counts[label] = sum(1 for _ in store.list(prefix=prefixes[label]))
            out[label].append(time.perf_counter() - started)
    return {f"{label} → {counts[label]:,} rows": times for label, times in out.items()}


def cli_list_times(kind: StoreKind, env: dict[str, str], prefix: str, reps: int) -> list[float]:
    argv = [TASKLOCK, "list", "--prefix", prefix, "--json"]
    return [timed_run(argv, with_store(env, kind.url("scale"))) for _ in range(reps)]


def scale_one(
    kind: StoreKind, env: dict[str, str], budget: Budget, table: Table, rng: random.Random
) -> None:
    names = [f"scale:{i:06d}" for i in range(budget.scale_leases)]
    keys, secs, how = insert_leases(kind, "scale", names, 3600, budget.scale_insert_seconds)
    rate = f"{len(keys) / secs:,.0f}/s"
    table.add(kind.name, f"insert {len(keys):,} live leases ({how})", f"{secs:.1f} s", rate, "")
    with open_store(kind.url("scale")) as full:
        peek_rows(kind, full, keys, budget, table, rng)
        list_rows(kind, full, keys, table, rng)
        last = keys[-1][:-2]
        cli = cli_list_times(kind, env, last, 3)
        label = f"`tasklock list --prefix {last} --json` (CLI)"
        table.add(kind.name, label, ms(median(cli)), ms(max(cli)), "")
        sweep_one(kind, full, budget, table)


def peek_rows(
    kind: StoreKind,
    full: Store,
    keys: list[str],
    budget: Budget,
    table: Table,
    rng: random.Random,
) -> None:
    """peek hits on the full store and on a 100-lease one, and misses on an empty one."""
    small_keys = keys[:100]
    with open_store(kind.url("small")) as small, open_store(kind.url("empty")) as empty:
        token = secrets.token_hex(16)
        for name in small_keys:
            small.acquire(name, 3600, HOLDER, token)
        empty.peek("x")
        targets = {
            f"peek hit, {len(keys):,}-lease store": (full, keys),
            "peek hit, 100-lease store": (small, small_keys),
            "peek miss, empty store": (empty, small_keys),
        }
        times = compare_peeks(targets, budget.scale_peeks, rng)
    base = median(times["peek hit, 100-lease store"])
    for label, samples in times.items():
        ratio = fmt(median(samples) / base)
        table.add(kind.name, label, ms(median(samples)), ms(p99(samples)), ratio)


def list_rows(
    kind: StoreKind, store: Store, keys: list[str], table: Table, rng: random.Random
) -> None:
    first, last = keys[0][:-2], keys[-1][:-2]
    narrow = {f"prefix {first!r} (first)": first, f"prefix {last!r} (last)": last}
    for label, times in list_times(store, narrow, 10, rng).items():
        table.add(kind.name, f"list {label}", ms(median(times)), ms(p99(times)), "")
    for label, times in list_times(store, {"prefix 'scale:' (all)": "scale:"}, 2, rng).items():
        table.add(kind.name, f"list {label}", ms(median(times)), ms(max(times)), "")


def sweep_one(kind: StoreKind, store: Store, budget: Budget, table: Table) -> None:
    if kind.name == "redis":
        t = timed(store.sweep)
        table.add(kind.name, "sweep (Redis expires keys itself; sweep = PING)", ms(t), "", "")
        return
    names = [f"expired:{i:06d}" for i in range(budget.scale_leases)]
    done, _, _ = insert_leases(kind, "scale", names, 0.001, budget.scale_insert_seconds)
    inserted = len(done)
    time.sleep(0.1)
    started = time.perf_counter()
    removed = store.sweep()
    elapsed = time.perf_counter() - started
    table.add(
        kind.name, f"sweep {removed:,} expired of {inserted:,} (+ live ones)", ms(elapsed), "", ""
    )
    table.add(kind.name, "sweep again (nothing expired)", ms(timed(store.sweep)), "", "")


def ms(seconds: float) -> str:
    return fmt(seconds * 1000, 3 if seconds < 0.01 else 1)


def section_scale(kinds: list[StoreKind], envs: Envs, budget: Budget) -> Table:
    table = Table(
        f"5. Scale ({budget.scale_leases:,} leases)",
        ["store", "operation", "p50 (or total)", "p99 / max (or rate)", "× 100-lease peek"],
    )
    rng = random.Random(5)
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        scale_one(kind, envs.warm, budget, table, rng)
    table.notes += [
        prose(
            """Times in ms. Live leases (ttl 1 h) inserted through `store.acquire` (SQLite: one
            process, its writers serialise anyway; Redis: 4 forked processes), bounded in time:
            the row says how many made it. PostgreSQL: one `INSERT … SELECT unnest(…)` per
            10,000 rows shaped as `acquire` writes them, checked with `peek` (falls back to the
            API). peek: random keys, blocks of 50, the three targets in shuffled order; hits
            return a lease, misses None. list: `store.list(prefix=…)` for 100-row prefixes at
            the start and at the end of the key range, 10 reps each, interleaved; the CLI row is
            the same list as a whole `tasklock list` process."""
        ),
        prose(
            """sweep: as many more leases with a 1 ms ttl inserted, then one `sweep()` timed (it is
                destructive, so n = 1), then a second one with nothing left to remove."""
        ),
    ]
    return table


# -- 6. heartbeat cost -------------------------------------------------------------------------

HEARTBEAT_AT = (2.0, 2.5)  # seconds after start: steady window opens, RSS is read


def proc_sample(pid: int) -> dict[str, float]:
    """VmRSS / VmHWM (MiB), threads, and CPU seconds so far (schedstat: ns resolution)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(re.findall(r"^(\w+):\s+(\d+)", status, re.MULTILINE))
    on_cpu_ns = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    return {
        "rss": int(fields["VmRSS"]) / 1024,
        "hwm": int(fields["VmHWM"]) / 1024,
        "threads": int(fields["Threads"]),
        "cpu": on_cpu_ns / 1e9,
    }


@dataclass
class Watched:
    label: str
    proc: subprocess.Popen
    started: float
    samples: dict[float, dict[str, float]] = field(default_factory=dict)
    rusage: Any = None


def heartbeat_variants(kind: StoreKind, sleep: int) -> dict[str, list[str]]:
    imports = f"import tasklock_cli.cli, tasklock_cli.supervisor, tasklock_cli.stores.{kind.module}"
    run = [TASKLOCK, "run"]
    return {
        f"tasklock run k -- sleep {sleep}": [*run, f"hb-{kind.name}", "--", "sleep", str(sleep)],
        "… --ttl 1s (renews every 333 ms)": [
            *[*run, f"hb1-{kind.name}", "--ttl", "1s"],
            *["--", "sleep", str(sleep)],
        ],
        "import floor, then sleep": [PYTHON, "-c", f"{imports}; import time; time.sleep({sleep})"],
    }


def heartbeat_group(kind: StoreKind, env: dict[str, str], sleep: int) -> list[Watched]:
    """The three variants of one store, started together and sampled until they exit."""
    store_env = with_store(env, kind.url("heartbeat"))
    watched = [
        Watched(f"{kind.name}: {label}", spawn(argv, store_env), time.monotonic())
        for label, argv in heartbeat_variants(kind, sleep).items()
    ]
    sample_until_done(watched, (*HEARTBEAT_AT, sleep - 0.4))
    return watched


def sample_until_done(watched: list[Watched], at: Sequence[float]) -> None:
    pending = {id(w): list(at) for w in watched}
    while any(w.rusage is None for w in watched):
        for w in watched:
            if w.rusage is None:
                sample_due(w, pending[id(w)])
        time.sleep(0.01)


def sample_due(w: Watched, due: list[float]) -> None:
    if due and time.monotonic() - w.started >= due[0]:
        with contextlib.suppress(OSError, KeyError):
            w.samples[due[0]] = proc_sample(w.proc.pid)
        due.pop(0)
    pid, status, usage = os.wait4(w.proc.pid, os.WNOHANG)
    if pid:
        w.rusage = usage
        w.proc.returncode = os.waitstatus_to_exitcode(status)
        _LIVE_PROCS.remove(w.proc)


def heartbeat_row(table: Table, w: Watched, sleep: int) -> None:
    opened, at_rss = (w.samples.get(t, {}) for t in HEARTBEAT_AT)
    last = w.samples.get(sleep - 0.4, {})
    total = (w.rusage.ru_utime + w.rusage.ru_stime) * 1000
    steady = (last.get("cpu", math.nan) - opened.get("cpu", math.nan)) * 1000
    span = sleep - 0.4 - HEARTBEAT_AT[0]
    table.add(
        w.label,
        at_rss.get("rss", math.nan),
        last.get("hwm", math.nan),
        fmt(at_rss.get("threads"), 0),
        total,
        steady,
        steady / span,
    )


def section_heartbeat(kinds: list[StoreKind], envs: Envs, budget: Budget) -> Table:
    sleep = budget.heartbeat_sleep
    table = Table(
        f"6. Heartbeat cost (one wrapper around `sleep {sleep}`)",
        ["process", "RSS MiB", "peak RSS MiB", "threads", "CPU total ms",
         f"CPU {HEARTBEAT_AT[0]:g}→{sleep - 0.4:g} s ms", "CPU ms/s steady"],
    )  # fmt: skip
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        for w in heartbeat_group(kind, envs.warm, sleep):
            heartbeat_row(table, w, sleep)
    table.notes += [
        prose(
            f"""RSS = VmRSS from /proc/PID/status at {HEARTBEAT_AT[1]:g} s; peak = VmHWM just
            before exit; threads at {HEARTBEAT_AT[1]:g} s. CPU total = user+sys from wait4 over
            the whole life (start-up included; `sleep` itself adds ~1 ms). Steady CPU =
            /proc/PID/schedstat on-CPU time between {HEARTBEAT_AT[0]:g} s and {sleep - 0.4:g} s
            (after start-up). The three processes of a store run at the same time; stores one
            after another."""
        ),
    ]
    return table


# -- report ------------------------------------------------------------------------------------


def machine_info() -> dict[str, str]:
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": str(os.cpu_count()),
        "cpu": model.group(1) if model else "unknown",
        "kernel": platform.release(),
        "python": f"{platform.python_version()} ({PYTHON})",
        "load before run": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def versions() -> str:
    from importlib.metadata import version

    parts = []
    for dist in ("tasklock", "typer", "click", "redis", "psycopg"):
        with contextlib.suppress(Exception):
            parts.append(f"{dist} {version(dist)}")
    return ", ".join(parts)


def render_markdown(
    tables: list[Table], info: dict[str, str], argv: list[str], total: float
) -> str:
    lines = [
        "# tasklock benchmark results",
        "",
        "Generated by `bench/run.py`; see `bench/README.md` for what each number means. "
        "Timings are from one noisy 2-core machine: compare rows within a table, not across runs.",
        "",
        *[f"- **{k}**: {v}" for k, v in info.items()],
        f"- **packages**: {versions()}",
        f"- **command**: `.venv/bin/python bench/run.py {' '.join(argv)}` (total {total:.0f} s)",
        "- **bytecode**: "
        + prose(
            """the environment sets PYTHONDONTWRITEBYTECODE=1; benchmark subprocesses run with it
            removed and a private PYTHONPYCACHEPREFIX filled by one warm-up run of each command,
            except the `(no .pyc)` rows of section 1 (variable set, empty cache: every module
            compiled each time)."""
        ),
        "",
    ]
    return "\n".join(lines + [t.markdown() for t in tables])


@contextlib.contextmanager
def workspace(kinds_names: Sequence[str]) -> Iterator[tuple[Path, list[StoreKind]]]:
    workdir = Path(tempfile.mkdtemp(prefix="tasklock-bench-"))
    kinds: list[StoreKind] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        kinds = make_stores(kinds_names, workdir)
        yield workdir, kinds
    finally:
        kill_leftovers()
        for kind in kinds:
            kind.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)
        signal.signal(signal.SIGTERM, previous)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="about one minute instead of about five"
    )
    parser.add_argument(
        "--stores",
        default=",".join(ALL_STORES),
        help="comma-separated subset of sqlite,redis,postgres",
    )
    parser.add_argument(
        "--markdown", metavar="FILE", help="also write the tables as Markdown to FILE"
    )
    parser.add_argument(
        "--sections", default="1,2,3,4,5,6", help="comma-separated section numbers to run"
    )
    args = parser.parse_args(argv)
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = set(args.stores) - set(ALL_STORES)
    if unknown:
        parser.error(f"unknown store(s): {', '.join(sorted(unknown))}")
    args.sections = {int(s) for s in args.sections.split(",")}
    return args


def warm_bytecode(kinds: list[StoreKind], envs: Envs) -> None:
    """Fill the private bytecode cache: one `tasklock run` and one import floor per store."""
    for kind in kinds:
        if kind.reason is None:
            for cmd in overhead_commands([kind], envs, Path(tempfile.gettempdir()))[:2]:
                timed_run(cmd.argv, cmd.env)


def run_sections(args: argparse.Namespace, workdir: Path, kinds: list[StoreKind]) -> list[Table]:
    budget = QUICK if args.quick else FULL
    envs = make_envs(workdir)
    warm_bytecode(kinds, envs)
    single: dict[str, float] = {}
    sections: dict[int, Callable[[], Table]] = {
        1: lambda: section_overhead(kinds, envs, budget, workdir),
        2: lambda: section_roundtrips(kinds, budget, single),
        3: lambda: section_handoff(kinds, envs, budget, workdir),
        4: lambda: section_contention(kinds, budget, single),
        5: lambda: section_scale(kinds, envs, budget),
        6: lambda: section_heartbeat(kinds, envs, budget),
    }
    tables = []
    for number, section in sections.items():
        if number not in args.sections:
            continue
        started = time.monotonic()
        table = section()
        table.seconds = time.monotonic() - started
        print(table.text(), flush=True)
        tables.append(table)
    return tables


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    info = machine_info()
    print("  ".join(f"{k}: {v}" for k, v in info.items()), flush=True)
    started = time.monotonic()
    with workspace(args.stores) as (workdir, kinds):
        for kind in kinds:
            if kind.reason:
                print(f"{kind.name}: skipped: {kind.reason}", flush=True)
        tables = run_sections(args, workdir, kinds)
    total = time.monotonic() - started
    print(f"total {total:.0f} s")
    if args.markdown:
        Path(args.markdown).write_text(render_markdown(tables, info, argv, total))
        print(f"wrote {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
