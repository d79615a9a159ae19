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
import hashlib
import itertools
import json
import math
import multiprocessing as mp
import os
import platform
import queue
import random
import re
import resource
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tasklock_cli import clock as clocks  # noqa: E402
from tasklock_cli.errors import StoreUnavailable, TasklockError  # noqa: E402
from tasklock_cli.lease import LeaseKeeper  # noqa: E402
from tasklock_cli.stores import open_store, sqlite_url  # noqa: E402
from tasklock_cli.stores.base import Holder, Store  # noqa: E402
from tasklock_cli.supervisor import RunOptions  # noqa: E402

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
    sweep_leases: int
    sweep_timeout_seconds: float
    many_leases_seconds: float
    sweep_baseline_seconds: float = 1.0
    many_leases: int = 1000
    many_leases_ttl: float = 3.0
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
    sweep_leases=1_000_000,
    sweep_timeout_seconds=600.0,
    many_leases_seconds=10.0,
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
    sweep_leases=100_000,
    sweep_timeout_seconds=120.0,
    many_leases_seconds=4.0,
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

    def raw_write(
        self, namespace: str, store: Store, options: str = ""
    ) -> tuple[Callable[[], object], Callable[[], None], str] | None:
        """The cheapest durable write beside the store: a one-row autocommit UPDATE of a
        scratch table on its own connection; (op, closer, synchronous_commit seen), or None
        (Redis). SQLite: a separate file with the store connection's journal settings."""
        if self.name == "redis":
            return None
        if self.name == "sqlite":
            pragmas = sqlite_pragmas(store)
            conn = sqlite3.connect(self.workdir / f"{namespace}-scratch.db", isolation_level=None)
            for name, value in pragmas.items():
                conn.execute(f"PRAGMA {name}={value}")
            conn.execute(
                "CREATE TABLE scratch (k TEXT PRIMARY KEY, v INTEGER NOT NULL) WITHOUT ROWID"
            )
            conn.execute("INSERT INTO scratch VALUES ('a', 0)")
            update = RAW_WRITE.format(table="scratch")
            return (lambda: conn.execute(update)), conn.close, ""
        import psycopg

        table = f"tlbench_{RUN_ID}_{namespace}_scratch"
        pg = psycopg.connect(POSTGRES_BASE + (f"?{options}" if options else ""), autocommit=True)
        pg.execute(f"CREATE TABLE {table} (k text PRIMARY KEY, v bigint NOT NULL)")
        pg.execute(f"INSERT INTO {table} VALUES ('a', 0)")
        setting = str(pg.execute("SHOW synchronous_commit").fetchone()[0])
        update = RAW_WRITE.format(table=table)

        def close() -> None:
            with contextlib.suppress(Exception):
                pg.execute(f"DROP TABLE IF EXISTS {table}")
            pg.close()

        return (lambda: pg.execute(update)), close, setting

    def cleanup(self) -> None:
        with contextlib.suppress(Exception):
            if self.name == "redis":
                _drop_redis_namespace()
            elif self.name == "postgres":
                _drop_postgres_tables()


def sqlite_pragmas(store: Store) -> dict[str, str]:
    """journal_mode and synchronous as the store's own connection has them (private API)."""
    found = {"journal_mode": "WAL", "synchronous": "NORMAL"}  # what SQLiteStore sets today
    connection = getattr(store, "_connection", None)
    if connection is not None:
        conn = connection()
        found["journal_mode"] = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
        level = int(conn.execute("PRAGMA synchronous").fetchone()[0])
        found["synchronous"] = ("OFF", "NORMAL", "FULL", "EXTRA")[level]
    return found


def _drop_redis_namespace(namespace: str = "") -> None:
    import redis

    client = redis.Redis.from_url(REDIS_BASE)
    batch: list[bytes] = []
    pattern = f"tlbench:{RUN_ID}:{f'{namespace}:' if namespace else ''}*"
    for name in client.scan_iter(match=pattern, count=10_000):
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

#: libpq `options` for the attribution-only PostgreSQL rows (see section_roundtrips' notes).
ASYNC_COMMIT = "options=-c%20synchronous_commit%3Doff"
ASYNC_TAG = " async"
RAW_WRITE = "UPDATE {table} SET v = v + 1 WHERE k = 'a'"


def time_block(op: Callable[[], object], count: int, out: list[float]) -> None:
    for _ in range(count):
        started = time.perf_counter()
        op()
        out.append(time.perf_counter() - started)


def timer(op: Callable[[], object], out: list[float]) -> Callable[[int], None]:
    return lambda count: time_block(op, count, out)


def cycle_timer(
    store: Store, key: str, samples: dict[str, list[float]], tag: str
) -> Callable[[int], None]:
    """acquire and release timed separately (and together), on one key, one owner token."""
    token = secrets.token_hex(16)
    acq, rel, cyc = (samples.setdefault(f"{op}{tag}", []) for op in ("acquire", "release", "cycle"))

    def run(count: int) -> None:
        for _ in range(count):
            started = time.perf_counter()
            lease = store.acquire(key, 60, HOLDER, token)
            acquired = time.perf_counter()
            assert lease is not None, f"could not take {key}"
            store.release(lease)
            released = time.perf_counter()
            acq.append(acquired - started)
            rel.append(released - acquired)
            cyc.append(released - started)

    return run


def store_setting(store: Store, name: str) -> str:
    """A PostgreSQL setting as the store's own connection sees it (private API: bench only)."""
    run = getattr(store, "_run", None)
    if run is None:
        return "?"
    return str(run(lambda conn: conn.execute(f"SHOW {name}").fetchone()[0]))


def roundtrip_timers(
    kind: StoreKind, samples: dict[str, list[float]], closers: list[Callable[[], None]]
) -> tuple[dict[str, Callable[[int], None]], dict[str, str]]:
    """Every timed operation of one store (raw baselines, store API, PostgreSQL's attribution
    variant), and what was checked along the way (``SHOW synchronous_commit``)."""
    ping, close_ping = kind.raw_ping("roundtrip")
    closers.append(close_ping)
    timers = {"raw": timer(ping, samples.setdefault("raw", []))}
    checked: dict[str, str] = {}
    variants = [("", "")]
    if kind.name == "postgres":
        variants.append((ASYNC_TAG, ASYNC_COMMIT))
    for tag, options in variants:
        url = kind.url("roundtrip") + (f"&{options}" if options else "")
        store = open_store(url)
        closers.append(store.close)
        store.peek("rt-connect")
        if options:
            checked[tag] = store_setting(store, "synchronous_commit")
        write = kind.raw_write(f"roundtrip{tag.strip()}", store, options)
        if write is not None:
            op, close_write, setting = write
            closers.append(close_write)
            timers[f"write{tag}"] = timer(op, samples.setdefault(f"write{tag}", []))
            if options:
                checked[f"write{tag}"] = setting
        timers[f"cycle{tag}"] = cycle_timer(store, f"rt-cycle{tag.strip()}", samples, tag)
        held = store.acquire(f"rt-renew{tag.strip()}", 60, HOLDER, secrets.token_hex(16))
        assert held is not None, "could not take the renew key"
        renew = samples.setdefault(f"renew{tag}", [])
        timers[f"renew{tag}"] = timer(lambda s=store, h=held: s.renew(h, 60), renew)
    return timers, checked


def measure_roundtrips(
    kind: StoreKind, seconds: float, rng: random.Random
) -> tuple[dict[str, list[float]], dict[str, str]]:
    samples: dict[str, list[float]] = {}
    closers: list[Callable[[], None]] = []
    try:
        timers, checked = roundtrip_timers(kind, samples, closers)
        for run in timers.values():  # warm-up: connections, prepared statements, script cache
            run(30)
        for values in samples.values():
            values.clear()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for name in rng.sample(list(timers), len(timers)):
                timers[name](25)
        return samples, checked
    finally:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                close()


RAW_LABELS = {
    "sqlite": "sqlite3 `SELECT 1`, same file",
    "redis": "redis-py `PING`",
    "postgres": "psycopg `SELECT 1`",
}
WRITE_LABELS = {
    "sqlite": "raw durable write (sqlite3 1-row `UPDATE`, scratch file)",
    "postgres": "raw durable write (psycopg 1-row `UPDATE`, autocommit)",
}
#: The issue's PostgreSQL target: acquire and renew each one round trip.
PG_TARGET = "÷ raw ≤ 2.5"


def roundtrip_rows(
    table: Table, kind: StoreKind, s: dict[str, list[float]], checked: dict[str, str]
) -> None:
    us = 1e6
    raw = median(s["raw"])
    rows = [
        ("raw", f"raw round trip ({RAW_LABELS[kind.name]})"),
        ("write", WRITE_LABELS.get(kind.name, "")),
        ("acquire", "acquire"),
        ("release", "release"),
        ("cycle", "acquire + release (cycle)"),
        ("renew", "renew"),
    ]
    if ASYNC_TAG in checked:
        what = "[synchronous_commit=off: attribution only]"
        rows += [
            (f"write{ASYNC_TAG}", f"raw durable write {what}"),
            (f"acquire{ASYNC_TAG}", f"acquire {what}"),
            (f"release{ASYNC_TAG}", f"release {what}"),
            (f"renew{ASYNC_TAG}", f"renew {what}"),
        ]
        table.notes.append(
            prose(
                f"""{kind.name}: `SHOW synchronous_commit` on the attribution rows'
                connections: store {checked[ASYNC_TAG]}, raw write
                {checked.get("write" + ASYNC_TAG, "?")}."""
            )
        )
    for name, label in rows:
        samples = s.get(name)
        if not samples:
            continue
        tag = ASYNC_TAG if name.endswith(ASYNC_TAG) else ""
        write = s.get(f"write{tag}")
        target = PG_TARGET if kind.name == "postgres" and name in ("acquire", "renew") else ""
        table.add(
            kind.name,
            label,
            len(samples),
            median(samples) * us,
            p99(samples) * us,
            len(samples) / sum(samples),
            fmt(median(samples) / raw) if name != "raw" else "1.00",
            fmt(median(samples) / median(write)) if write else "—",
            target,
        )


def section_roundtrips(
    kinds: list[StoreKind], budget: Budget, single_rates: dict[str, float]
) -> Table:
    table = Table(
        "2. Store round trips (Python API, one process, one key)",
        ["store", "operation", "n", "p50 µs", "p99 µs", "ops/s", "÷ raw", "÷ raw write",
         "target"],
    )  # fmt: skip
    rng = random.Random(2)
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        samples, checked = measure_roundtrips(kind, budget.roundtrip_seconds, rng)
        single_rates[kind.name] = len(samples["cycle"]) / sum(samples["cycle"])
        roundtrip_rows(table, kind, samples, checked)
    table.notes[:0] = [
        prose(
            """raw = the driver's cheapest round trip on its own connection in the same run:
                sqlite3 `SELECT 1` on the same file, redis-py `PING`, psycopg `SELECT 1`
                (autocommit). raw write = the cheapest durable write, also on its own
                connection: `UPDATE scratch SET v = v + 1 WHERE k = 'a'`, one row, autocommit
                (SQLite: a scratch file with the store connection's journal_mode and
                synchronous; PostgreSQL: a scratch table in the same database, dropped after;
                Redis has none). `÷ raw` / `÷ raw write` = this row's p50 over theirs: e.g. the
                renew row's `÷ raw write` is renew / raw write."""
        ),
        prose(
            """acquire and release are timed separately within acquire + release cycles on one
                key (on SQLite each is one write transaction); ops/s = samples / time spent in
                them (the cycle row's is section 4's `cycles/s`). Blocks of 25 of each timed
                operation, in shuffled order, repeated until the time bound."""
        ),
        prose(
            f"""target: the issue's PostgreSQL goal, acquire and renew each one round trip, i.e.
                p50 ≤ 2.5 × `SELECT 1`. The `synchronous_commit=off` rows (PostgreSQL only) open
                a second store on `{POSTGRES_BASE}?{ASYNC_COMMIT}` (libpq passes `options` to the
                server; the label shows `SHOW synchronous_commit` on that store's connection):
                attribution only — what the same statements cost without waiting for the WAL
                flush. Not a supported setting: after a server crash the last commits can be
                lost, and a fencing token could then be handed out twice."""
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
                waiter waking (SQLite: a byte written to the longest waiter's FIFO; Redis:
                BLPOP on the key's wake list; PostgreSQL: LISTEN/NOTIFY for the first waiter in
                line, the others queued behind it on an advisory lock: one waiter woken per
                release) and spawning the child. `overlaps` counts two children running at once
                (must be 0)."""
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


def postgres_batch_insert(
    table: str,
    names: list[str],
    ttl: float,
    age: float = 0.0,
    per_statement: int = 10_000,
    one_transaction: bool = False,
) -> None:
    """Rows shaped exactly as PostgresStore.acquire writes them (one clock reading per row,
    taken ``age`` seconds back), ``per_statement`` rows per statement; autocommit, or all in
    one transaction."""
    import psycopg
    from psycopg.types.json import Jsonb

    statement = f"""
        INSERT INTO {table} (key, fencing_token, owner_token, holder, acquired_at, expires_at)
        SELECT k, 1, md5(k), %(holder)s, t, t + %(ttl)s * interval '1 second'
        FROM (SELECT k, clock_timestamp() - %(age)s * interval '1 second' AS t
                FROM unnest(%(keys)s::text[]) AS k) AS n"""
    params = {"holder": Jsonb(HOLDER.to_dict()), "ttl": ttl, "age": age}
    with (
        psycopg.connect(POSTGRES_BASE, autocommit=True) as conn,
        conn.transaction() if one_transaction else contextlib.nullcontext(),
    ):
        for start in range(0, len(names), per_statement):
            conn.execute(statement, {**params, "keys": names[start : start + per_statement]})


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


# -- 5b. sweep of many expired leases while an acquirer runs ------------------------------------

#: The expired leases were granted this long before the fill ...
SWEEP_AGE_S = 60.0
#: ... for this long: they ran out about 30 s before the fill (SQL stores).
SWEEP_TTL_S = 30.0
#: Redis: leases written expired, for the baseline's takeovers (the big set is still live then).
SWEEP_POOL = 20_000
SWEEP_TARGET = "max ≤ 100 ms"
OP_FRESH, OP_TAKEOVER, OP_RANDOM, OP_RELEASE = 0, 1, 2, 3
OP_NAMES = {
    OP_FRESH: "acquire, fresh key",
    OP_TAKEOVER: "acquire, takeover of an expired lease not yet swept",
    OP_RANDOM: "acquire, random one of the expired keys",
    OP_RELEASE: "release",
}
OK, NO_LEASE, FAILED = 0, 1, 2


@dataclass
class OpLog:
    """Every store call of the acquirer: start (monotonic), duration, which call, outcome."""

    starts: array = field(default_factory=lambda: array("d"))
    spans: array = field(default_factory=lambda: array("d"))
    ops: array = field(default_factory=lambda: array("b"))
    outcomes: array = field(default_factory=lambda: array("b"))
    errors: dict[str, int] = field(default_factory=dict)

    def call(self, op: int, run: Callable[[], Any]) -> Any:
        started = time.monotonic()
        text = ""
        try:
            result = run()
            outcome = OK if result is not None else NO_LEASE
            if result is None:
                text = f"{OP_NAMES[op]}: returned None/False"
        except TasklockError as exc:
            result, outcome = None, FAILED
            text = f"{type(exc).__name__}: {exc}"[:160]
        if text:
            self.errors[text] = self.errors.get(text, 0) + 1
        self.starts.append(started)
        self.spans.append(time.monotonic() - started)
        self.ops.append(op)
        self.outcomes.append(outcome)
        return result

    def window(self, start: float, end: float, overlapping: bool) -> list[int]:
        """Indexes of the calls inside [start, end] (or overlapping it at all)."""
        if overlapping:
            return [
                i
                for i, (s, d) in enumerate(zip(self.starts, self.spans, strict=True))
                if s <= end and s + d >= start
            ]
        return [
            i
            for i, (s, d) in enumerate(zip(self.starts, self.spans, strict=True))
            if s >= start and s + d <= end
        ]


def sweep_acquirer(
    url: str,
    names: list[str],
    pool: list[str],
    pool_until: float,
    stop: Any,
    out: Any,
) -> None:
    """Forked: own store connection; in turn acquire+release a fresh key, take over
    (acquire+release) an expired lease from the end of ``names`` down (the sweep starts at
    the other end), and one picked at random (maybe swept already, maybe in the batch being
    swept); takeovers use ``pool`` (each key once, as far as it goes) until ``pool_until``."""
    store = open_store(url)
    token = secrets.token_hex(16)
    rng = random.Random(os.getpid())
    store.peek("warm-up")  # connected (and Redis scripts loaded) before saying ready
    log = OpLog()
    hard_stop = time.monotonic() + 3600
    old, fresh, pooled = len(names) - 1, 0, 0
    out.put("ready")
    while not stop.is_set() and time.monotonic() < hard_stop:
        for op in (OP_FRESH, OP_TAKEOVER, OP_RANDOM):
            if op != OP_FRESH and pool and time.monotonic() < pool_until:
                key, pooled = pool[pooled % len(pool)], pooled + 1
            elif op == OP_TAKEOVER and old >= 0:
                key, old = names[old], old - 1
            elif op == OP_RANDOM:
                key = rng.choice(names)
            else:
                key, fresh, op = f"fresh:{fresh:07d}", fresh + 1, OP_FRESH
            lease = log.call(op, lambda k=key: store.acquire(k, 30, HOLDER, token))
            if lease is not None:
                log.call(OP_RELEASE, lambda le=lease: store.release(le) or None)
    store.close()
    out.put(log)


def sqlite_fill_expired(path: Path, names: list[str]) -> None:
    """Rows shaped as SQLiteStore's `_ACQUIRE` writes them, granted SWEEP_AGE_S ago (this
    boot, CLOCK_BOOTTIME) for SWEEP_TTL_S; expiries 1 µs apart in key order; one
    executemany in one transaction, on the store connection's journal settings."""
    from tasklock_cli.stores.sqlite import TABLE, boot_clock, current_boot_id

    boot, now, wall = current_boot_id(), boot_clock(), time.time()
    holder = json.dumps(HOLDER.to_dict())
    rows = (
        (
            name,
            hashlib.md5(name.encode()).hexdigest(),
            boot,
            now - SWEEP_AGE_S + SWEEP_TTL_S + i * 1e-6,
            wall - SWEEP_AGE_S + i * 1e-6,
            wall - SWEEP_AGE_S + SWEEP_TTL_S + i * 1e-6,
            holder,
        )
        for i, name in enumerate(names)
    )
    with open_store(sqlite_url(path)) as store:
        pragmas = sqlite_pragmas(store)  # also creates the schema
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for name, value in pragmas.items():
            conn.execute(f"PRAGMA {name}={value}")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            f"""INSERT INTO {TABLE} (key, fencing_token, owner_token, boot_id, expires_boot,
                                     acquired_at, expires_at, holder)
                VALUES (?, 1, ?, ?, ?, ?, ?, ?)""",
            rows,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def redis_prefix(kind: StoreKind, namespace: str) -> str:
    return kind.url(namespace).split("prefix=", 1)[1]


#: What RedisStore's acquire script writes for a free key, for many keys per call:
#: KEYS = lease, fence, lease, fence, …; ARGV = holder JSON, expires_at (ms), owner tokens.
REDIS_FILL = """
local t = redis.call('TIME')
local now = string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
for i = 1, #KEYS, 2 do
  local token = redis.call('INCR', KEYS[i + 1])
  redis.call('HSET', KEYS[i], 'owner', ARGV[2 + (i + 1) / 2],
             'fencing_token', string.format('%d', token), 'holder', ARGV[1],
             'acquired_at', now, 'expires_at', ARGV[2])
  redis.call('PEXPIREAT', KEYS[i], ARGV[2])
end
return #KEYS / 2
"""


def redis_writer(client: Any, prefix: str) -> Callable[[Any, list[str], int], None]:
    """Queue REDIS_FILL calls (1,000 leases each) for ``names`` on a pipeline. The expiry is
    set with PEXPIREAT: the stored state is what the acquire script's PEXPIRE leaves."""
    script = client.register_script(REDIS_FILL)
    holder = json.dumps(HOLDER.to_dict())

    def write(pipe: Any, names: list[str], expires_ms: int) -> None:
        for start in range(0, len(names), 1000):
            batch = names[start : start + 1000]
            keys = [f"{prefix}{{{n}}}:{part}" for n in batch for part in ("lease", "fence")]
            owners = [hashlib.md5(n.encode()).hexdigest() for n in batch]
            script(keys=keys, args=[holder, expires_ms, *owners], client=pipe)

    return write


def redis_fill(prefix: str, names: list[str], lead: float) -> float:
    """Write ``names`` as leases that all run out at one moment, ``lead`` seconds after the
    fill ends (estimated from the first chunk, written with a provisional expiry and moved
    at the end); returns that moment on the monotonic clock."""
    import redis

    client = redis.Redis.from_url(REDIS_BASE)
    write = redis_writer(client, prefix)
    chunk = 10_000
    try:
        pipe = client.pipeline(transaction=False)
        started = time.monotonic()
        write(pipe, names[:chunk], int((time.time() + 3600) * 1000))
        pipe.execute()
        per_chunk = time.monotonic() - started
        rest = math.ceil(max(0, len(names) - chunk) / chunk)
        expires_ms = int((time.time() + 1.3 * per_chunk * (rest + 1) + lead) * 1000)
        for start in range(chunk, len(names), chunk):
            write(pipe, names[start : start + chunk], expires_ms)
            pipe.execute()
        for name in names[:chunk]:
            lease = f"{prefix}{{{name}}}:lease"
            pipe.hset(lease, "expires_at", expires_ms)
            pipe.pexpireat(lease, expires_ms)
        pipe.execute()
        return time.monotonic() + (expires_ms / 1000 - time.time())
    finally:
        client.close()


def redis_pool(prefix: str, pool: list[str]) -> None:
    """Leases that run out 1 ms after being written: what an expired lease looks like."""
    import redis

    client = redis.Redis.from_url(REDIS_BASE)
    pipe = client.pipeline(transaction=False)
    redis_writer(client, prefix)(pipe, pool, int(time.time() * 1000) + 1)
    pipe.execute()
    client.close()


@dataclass
class SweepRun:
    filled: int = 0
    fill_seconds: float = 0.0
    how: str = ""
    checked: str = ""
    removed: int = 0
    batches: int | None = None
    sweep_window: tuple[float, float] = (0.0, 0.0)
    baseline_window: tuple[float, float] = (0.0, 0.0)
    ping_seconds: float | None = None
    wal_bytes: int | None = None  # PostgreSQL: WAL the server wrote during the sweep
    log: OpLog = field(default_factory=OpLog)


def wal_position() -> int:
    """The server's current WAL position in bytes (all sessions' writes, not just ours)."""
    import psycopg

    with psycopg.connect(POSTGRES_BASE, autocommit=True) as conn:
        return int(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0])


def fill_expired(kind: StoreKind, names: list[str], run: SweepRun, lead: float) -> float:
    """Fill the namespace; returns when the leases run out (monotonic; now for SQL)."""
    started = time.perf_counter()
    url = kind.url("sweep")
    expire_at = time.monotonic()
    if kind.name == "sqlite":
        sqlite_fill_expired(kind.workdir / "sweep.db", names)
        run.how = "executemany, one transaction"
    elif kind.name == "postgres":
        table = f"tlbench_{RUN_ID}_sweep"
        with open_store(url) as store:
            store.peek("schema")
        postgres_batch_insert(
            table, names, SWEEP_TTL_S, SWEEP_AGE_S, per_statement=100_000, one_transaction=True
        )
        import psycopg

        with psycopg.connect(POSTGRES_BASE, autocommit=True) as conn:
            conn.execute(f"ANALYZE {table}")
            # The fill's ~500 MiB of WAL would otherwise set off checkpoints that run
            # during the sweep; leases that expired over days would long be checkpointed.
            checkpoint = "CHECKPOINT"
            try:
                conn.execute(checkpoint)
            except psycopg.Error:  # not a superuser nor pg_checkpoint: measured without it
                checkpoint = "no CHECKPOINT (not permitted)"
        run.how = f"INSERT … unnest, 100,000 a statement, one transaction; ANALYZE; {checkpoint}"
    else:
        expire_at = redis_fill(redis_prefix(kind, "sweep"), names, lead)
        run.how = "pipelined fill-script calls, all running out together"
    run.fill_seconds = time.perf_counter() - started
    run.filled = len(names)
    return expire_at


def check_fill(kind: StoreKind, names: list[str], run: SweepRun) -> None:
    with open_store(kind.url("sweep")) as store:
        if kind.name == "redis":
            live = sum(store.peek(n) is not None for n in (names[0], names[-1]))
            run.checked = f"peek first/last → {live} of 2 live until then"
            return
        count = store.sweep(dry_run=True)
        peeks = sum(store.peek(n) is None for n in (names[0], names[len(names) // 2], names[-1]))
        listed = list(store.list(prefix=names[-1][:-1], include_expired=True))
        expired = sum(info.expired for info in listed)
        run.checked = (
            f"dry-run count {count:,}; peek first/middle/last → {peeks} of 3 None;"
            f" list {names[-1][:-1]!r} → {expired} of {len(listed)} expired"
        )


def sweep_batch_size(store: Store) -> int | None:
    size = getattr(sys.modules.get(type(store).__module__), "SWEEP_BATCH", None)
    return size if isinstance(size, int) else None


def sweep_under_load(kind: StoreKind, budget: Budget) -> SweepRun:
    """Fill, start the acquirer, record its baseline, sweep (or wait for Redis's expiry)."""
    run = SweepRun()
    names = [f"sweep:{i:07d}" for i in range(budget.sweep_leases)]
    lead = budget.sweep_baseline_seconds + 2.0  # Redis: acquirer start-up + baseline
    expire_at = fill_expired(kind, names, run, lead)
    check_fill(kind, names, run)
    pool: list[str] = []
    if kind.name == "redis":
        pool = [f"sweep-pool:{i:05d}" for i in range(SWEEP_POOL)]
        redis_pool(redis_prefix(kind, "sweep"), pool)
    ctx = mp.get_context("fork")  # before the bench opens its own connection to the file
    out, stop = ctx.Queue(), ctx.Event()
    args = (kind.url("sweep"), names, pool, expire_at, stop, out)
    proc = ctx.Process(target=sweep_acquirer, args=args)
    proc.start()
    try:
        out.get(timeout=60)  # ready
        time.sleep(0.3)  # the acquirer's first calls warm up its connection
        base_start = time.monotonic()
        if kind.name == "redis":
            run_redis_expiry(kind, names, pool, expire_at, budget, run)
        else:
            with open_store(kind.url("sweep")) as store:
                store.peek("connect")
                time.sleep(max(0.0, base_start + budget.sweep_baseline_seconds - time.monotonic()))
                wal = wal_position() if kind.name == "postgres" else None
                started = time.monotonic()
                run.removed = store.sweep()
                ended = time.monotonic()
                if wal is not None:
                    run.wal_bytes = wal_position() - wal
                size = sweep_batch_size(store)
            run.batches = run.removed // size + 1 if size else None
            run.sweep_window = (started, ended)
        run.baseline_window = (base_start, run.sweep_window[0])
        stop.set()
        run.log = out.get(timeout=120)
    finally:
        stop.set()
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join()
        drop_namespace(kind, "sweep")
    return run


#: Redis's expiry of the big set has ended when INFO expired_keys, having grown by the set's
#: size, grows at less than this fraction of its mean rate since the leases ran out.
BURST_OVER = 0.05


def run_redis_expiry(
    kind: StoreKind,
    names: list[str],
    pool: list[str],
    expire_at: float,
    budget: Budget,
    run: SweepRun,
) -> None:
    """Wait for the moment all leases run out, then for Redis to have expired them.

    INFO expired_keys is server-wide, and the acquirer's releases leave wake-up lists that
    expire a few seconds later (at about the acquirer's release rate, far below the burst's
    rate), so 'done' is: grown by at least len(names), and then the burst is over — the
    count grows at under BURST_OVER × its mean rate; the end is dated back to where that
    slow stretch began."""
    import redis

    client = redis.Redis.from_url(REDIS_BASE)
    prefix = redis_prefix(kind, "sweep")
    try:
        time.sleep(max(0.0, expire_at - 0.3 - time.monotonic()))
        pipe = client.pipeline(transaction=False)
        for name in pool:  # pool leftovers expire now, not inside the measured window
            pipe.exists(f"{prefix}{{{name}}}:lease")
        pipe.execute()
        before = int(client.info("stats")["expired_keys"])
        time.sleep(max(0.0, expire_at - time.monotonic()))
        seen: list[tuple[float, int]] = [(expire_at, 0)]
        end = None
        with open_store(kind.url("sweep")) as store:
            store.peek("connect")
            give_up = expire_at + budget.sweep_timeout_seconds
            while end is None and time.monotonic() < give_up:
                time.sleep(0.02)
                seen.append((time.monotonic(), int(client.info("stats")["expired_keys"]) - before))
                if run.ping_seconds is None and seen[-1][1] > len(names) // 4:
                    run.ping_seconds = timed(store.sweep)
                end = burst_end(seen, len(names))
        run.sweep_window = (expire_at, end or time.monotonic())
        run.removed = max((n for t, n in seen if t <= run.sweep_window[1]), default=0)
    finally:
        client.close()


def burst_end(seen: list[tuple[float, int]], size: int) -> float | None:
    """When the expiry burst ended, from (time, expired so far) samples; None while it runs."""
    now, total = seen[-1]
    if total < size or now - seen[0][0] <= 0.2:
        return None
    slow = BURST_OVER * total / (now - seen[0][0])
    recent = [(t, n) for t, n in seen if now - t >= 0.1]
    if not recent or (total - recent[-1][1]) / (now - recent[-1][0]) >= slow:
        return None
    end = now
    for t, n in reversed(seen[:-1]):  # back to where the slow stretch began
        if (total - n) / (now - t) >= slow:
            break
        end = t
    return end


def drop_namespace(kind: StoreKind, namespace: str) -> None:
    """Remove one namespace's leases now (the run-wide cleanup would get them only at exit)."""
    if kind.name == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                (kind.workdir / f"{namespace}.db{suffix}").unlink()
    elif kind.name == "redis":
        _drop_redis_namespace(namespace)
    else:
        import psycopg

        with psycopg.connect(POSTGRES_BASE, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS tlbench_{RUN_ID}_{namespace}")


def latency_row(
    table: Table,
    kind: StoreKind,
    label: str,
    log: OpLog,
    picked: list[int],
    seconds: float,
    target: str = "",
) -> None:
    spans = [log.spans[i] * 1000 for i in picked]
    rate = f"{len(spans) / seconds:,.0f} calls/s" if seconds > 0 and spans else ""
    table.add(
        kind.name,
        label,
        len(spans),
        fmt(median(spans), 3),
        fmt(p99(spans), 3),
        fmt(max(spans) if spans else None, 3),
        rate,
        target,
    )


def sweep_rows(table: Table, kind: StoreKind, run: SweepRun) -> None:
    secs = run.fill_seconds
    table.notes.append(f"{kind.name} fill check: {run.checked}.")
    table.add(
        kind.name,
        f"fill: expired leases ({run.how})",
        run.filled,
        ms(secs),
        "",
        "",
        f"{run.filled / secs:,.0f} leases/s",
        "",
    )
    start, end = run.sweep_window
    if kind.name == "redis":
        label = "Redis's own expiry: all run out at once → INFO expired_keys growth (burst)"
    else:
        batches = f", {run.batches:,} batches" if run.batches else ""
        mean = f", {(end - start) / run.batches * 1000:.1f} ms each" if run.batches else ""
        wal = f", {run.wal_bytes / 2**20:,.0f} MiB WAL" if run.wal_bytes is not None else ""
        label = f"sweep() while the acquirer runs: rows removed{batches}{mean}{wal}"
    rate = f"{run.removed / (end - start):,.0f} removed/s" if end > start else ""
    table.add(kind.name, label, run.removed, ms(end - start), "", "", rate, "")
    if run.ping_seconds is not None:
        table.add(kind.name, "sweep() meanwhile (= PING)", 1, ms(run.ping_seconds), "", "", "", "")
    log = run.log
    during = log.window(start, end, overlapping=True)
    every = "acquirer during sweep: every call"
    latency_row(table, kind, every, log, during, end - start, SWEEP_TARGET)
    for op, name in OP_NAMES.items():
        picked = [i for i in during if log.ops[i] == op]
        latency_row(table, kind, f"… {name}", log, picked, 0)
    failed = [i for i in during if log.outcomes[i] != OK]
    if failed:
        latency_row(table, kind, "… failed (error or no lease)", log, failed, 0)
    b0, b1 = run.baseline_window
    base = log.window(b0, b1, overlapping=False)
    label = f"acquirer baseline, no sweep ({b1 - b0:.1f} s): every call"
    latency_row(table, kind, label, log, base, b1 - b0)
    if log.errors:
        worst = sorted(log.errors.items(), key=lambda item: -item[1])[:2]
        shown = "; ".join(f"{count:,}× {text}" for text, count in worst)
        table.notes.append(f"{kind.name}: acquirer calls that failed (whole run): {shown}.")


def sweep_table(kinds: list[StoreKind], budget: Budget) -> Table:
    n = budget.sweep_leases
    table = Table(
        f"5b. Sweep of {n:,} expired leases while an acquirer runs",
        ["store", "measurement", "n", "total / p50 ms", "p99 ms", "max ms", "rate", "target"],
    )
    started = time.monotonic()
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        try:
            run = sweep_under_load(kind, budget)
        except (TasklockError, TimeoutError, OSError, queue.Empty) as exc:
            table.skip(kind.name, f"failed: {type(exc).__name__}: {exc}")
            continue
        sweep_rows(table, kind, run)
    table.seconds = time.monotonic() - started
    table.notes[:0] = [
        prose(
            f"""Per store, a fresh namespace (SQLite file, PostgreSQL table, Redis prefix) filled
            with {n:,} leases written directly, shaped as the store's acquire writes them
            (fencing token 1, holder JSON, owner token), granted {SWEEP_AGE_S:g} s ago for
            {SWEEP_TTL_S:g} s — SQLite: this boot's id, CLOCK_BOOTTIME expiry in the past;
            PostgreSQL: `expires_at` in the past, then `ANALYZE` (as autovacuum would soon
            do) and `CHECKPOINT` (the fill's WAL would otherwise start checkpoints during the
            sweep; leases that ran out over time would long be checkpointed). The fill
            check reads some back through the store API. Dropped again right after, before
            the next store."""
        ),
        prose(
            f"""A forked acquirer with its own store connection loops over three acquire +
            release pairs: a fresh key; one of the expired leases, taken from the end of the
            key range downwards (the sweeps clear them from the start: expiry order on SQLite,
            table order on PostgreSQL), so it is a takeover of a lease still waiting to be
            swept; and a key picked at random among all {n:,} (maybe swept already, maybe in
            the batch being swept: where a row lock can make it wait). Every store call is
            timed. Baseline: the same loop for {budget.sweep_baseline_seconds:g} s just before
            the sweep (Redis: from the acquirer's start until the leases run out). During
            sweep: calls overlapping the sweep at all. The sweep is one `store.sweep()` in the
            bench process, timed (n = 1: it is destructive); `batches` = rows removed ÷ the
            store module's SWEEP_BATCH, + 1."""
        ),
        prose(
            f"""Redis: nothing to sweep (`sweep()` is a PING, timed once meanwhile) — the {n:,}
            leases are written by pipelined calls of a script doing per lease what the acquire
            script does for a free key (INCR the counter, HSET the five fields, set the expiry),
            all to run out at one moment a few seconds after the fill, and the 'sweep' is
            Redis's own expiry of them: from that moment until INFO `expired_keys` (server
            wide) has grown by at least {n:,} and then slows to under {BURST_OVER:.0%} of its
            mean rate (the acquirer's releases leave wake-up lists that expire seconds later,
            at the acquirer's pace; other clients' expiries count too: `n`, the count at
            the end, is about {n:,}). Before that moment the big set is still live, so the
            baseline's takeovers use up to {SWEEP_POOL:,} other leases, each once, written to
            expire 1 ms after being written. During the expiry a takeover may find its lease
            already gone."""
        ),
        prose(
            """target: the issue's — a sweep must not block an acquirer for more than 100 ms,
            i.e. the during-sweep max ≤ 100 ms. Reported, not checked."""
        ),
    ]
    return table


def section_scale(kinds: list[StoreKind], envs: Envs, budget: Budget) -> list[Table]:
    started = time.monotonic()
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
    table.seconds = time.monotonic() - started
    return [table, sweep_table(kinds, budget)]


# -- 6. heartbeat cost -------------------------------------------------------------------------

HEARTBEAT_AT = (2.0, 2.5)  # seconds after start: steady window opens, RSS is read


def proc_sample(pid: int) -> dict[str, float]:
    """VmRSS / VmHWM (MiB), threads, and CPU seconds so far of every live thread (per-task
    schedstat: ns resolution; /proc/PID/schedstat alone is the main thread's)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(re.findall(r"^(\w+):\s+(\d+)", status, re.MULTILINE))
    return {
        "rss": int(fields["VmRSS"]) / 1024,
        "hwm": int(fields["VmHWM"]) / 1024,
        "threads": int(fields["Threads"]),
        "cpu": proc_cpu(pid),
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
        WRAPPER_TARGET if ": tasklock run" in w.label or ": …" in w.label else "",
    )


#: The issue's memory target for one `tasklock run` wrapper (the RSS columns are MiB).
WRAPPER_TARGET = "RSS ≤ 40 MB"


def section_heartbeat(kinds: list[StoreKind], envs: Envs, budget: Budget) -> list[Table]:
    started = time.monotonic()
    sleep = budget.heartbeat_sleep
    table = Table(
        f"6. Heartbeat cost (one wrapper around `sleep {sleep}`)",
        ["process", "RSS MiB", "peak RSS MiB", "threads", "CPU total ms",
         f"CPU {HEARTBEAT_AT[0]:g}→{sleep - 0.4:g} s ms", "CPU ms/s steady", "target"],
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
            the whole life (start-up included; `sleep` itself adds ~1 ms). Steady CPU = on-CPU
            time of all the process's threads (per-thread /proc schedstat, so the heartbeat
            thread counts) between {HEARTBEAT_AT[0]:g} s and {sleep - 0.4:g} s (after
            start-up). The three processes of a store run at the same time; stores one after
            another."""
        ),
        prose(
            f"""target: the issue's, {WRAPPER_TARGET} for one `tasklock run` wrapper, beside its
            rows (RSS columns are MiB: 40 MB = 38.1 MiB, 40 MiB = 41.9 MB). Reported, not
            checked."""
        ),
    ]
    table.seconds = time.monotonic() - started
    return [table, many_leases_table(kinds, budget)]


# -- 6b. many leases held by one process ---------------------------------------------------------


@dataclass
class HeldStats:
    """What the renewal threads saw (lists: appends are atomic across threads)."""

    renewed: list[float] = field(default_factory=list)  # completion times
    late: list[float] = field(default_factory=list)  # completed after deadline − margin
    failed: list[str] = field(default_factory=list)  # one error text per failed renewal
    lost: list[str] = field(default_factory=list)  # threads that gave their lease up


def renew_loop(
    keeper: LeaseKeeper, options: RunOptions, stop: threading.Event, stats: HeldStats
) -> None:
    """Supervisor._heartbeat's schedule: wait until the next renewal, renew, reschedule
    (retry sooner after StoreUnavailable; give up on LeaseLost or a passed deadline)."""
    next_renewal = keeper.acquired_at + options.renew_interval
    while not stop.wait(max(0.0, next_renewal - keeper.clock())):
        if keeper.clock() >= keeper.deadline:
            stats.lost.append("local deadline passed before the renewal")
            return
        due = keeper.deadline - options.safety_margin
        try:
            keeper.renew()
        except StoreUnavailable as exc:
            stats.failed.append(f"StoreUnavailable: {exc}"[:160])
            next_renewal = keeper.clock() + options.renew_retry_interval
            continue
        except Exception as exc:  # LeaseLost, or anything the supervisor would lose on
            stats.failed.append(f"{type(exc).__name__}: {exc}"[:160])
            stats.lost.append(f"renewal raised {type(exc).__name__}")
            return
        done = keeper.clock()
        stats.renewed.append(done)
        if done > due:
            stats.late.append(done)
        next_renewal = keeper.clock() + options.renew_interval


def many_leases_child(url: str, count: int, ttl: float, conn: Any) -> None:
    """Forked: one store, ``count`` LeaseKeepers on it, each acquired and then renewed by
    its own thread on the supervisor's schedule, until told to stop; then all released."""
    options = RunOptions(key="hb", command=["bench"], ttl=ttl)
    store = open_store(url)
    store.set_io_timeout(options.io_timeout)  # as Supervisor.run does
    store.peek("hb:connect")  # the connection exists before the 'before' sample
    conn.send("ready")
    conn.recv()
    stop, stats = threading.Event(), HeldStats()
    keepers: list[LeaseKeeper] = []
    threads: list[threading.Thread] = []
    refused: list[str] = []
    problem = ""
    for i in range(count):
        keeper = LeaseKeeper(store, f"hb:{i:04d}", ttl, HOLDER)
        try:
            acquired = keeper.try_acquire()
        except TasklockError as exc:
            refused.append(f"{type(exc).__name__}: {exc}"[:160])
            continue
        if not acquired:
            refused.append("held by someone else")
            continue
        keepers.append(keeper)
        thread = threading.Thread(
            target=renew_loop, args=(keeper, options, stop, stats), daemon=True
        )
        try:
            thread.start()
        except RuntimeError as exc:  # "can't start new thread": a thread or memory limit
            problem = f"thread {len(threads) + 1} did not start ({exc})"
            break
        threads.append(thread)
    if refused:
        problem = f"{len(refused):,} acquires failed, e.g. {refused[0]}" + (
            f"; {problem}" if problem else ""
        )
    conn.send((keeper_clock(), len(keepers), len(threads), problem))
    conn.recv()
    stop.set()
    for thread in threads:
        thread.join(timeout=options.io_timeout + 1)
    for keeper in keepers:
        with contextlib.suppress(TasklockError):
            keeper.release()
    store.close()
    conn.send(stats)


def keeper_clock() -> float:
    """The clock LeaseKeeper and the supervisor use (CLOCK_BOOTTIME where there is one)."""
    return clocks.monotonic()


def proc_cpu(pid: int) -> float:
    """CPU seconds of every live thread of ``pid`` (summed per-task schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


def thread_limits() -> str:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,}"
    maximum = Path("/proc/sys/kernel/threads-max").read_text().strip()
    return f"ulimit -u {limit}, kernel threads-max {int(maximum):,}"


@dataclass
class HeldRun:
    held: int = 0
    threads: int = 0
    problem: str = ""
    before: dict[str, float] = field(default_factory=dict)
    after: dict[str, float] = field(default_factory=dict)
    cpu: float = math.nan
    window: tuple[float, float] = (0.0, 0.0)
    stats: HeldStats = field(default_factory=HeldStats)


def hold_many(kind: StoreKind, budget: Budget) -> HeldRun:
    ctx = mp.get_context("fork")
    ours, theirs = ctx.Pipe()
    url = kind.url("hb_many")
    count, ttl = budget.many_leases, budget.many_leases_ttl
    interval = RunOptions(key="hb", command=["bench"], ttl=ttl).renew_interval
    proc = ctx.Process(target=many_leases_child, args=(url, count, ttl, theirs))
    proc.start()
    run = HeldRun()

    def receive(timeout: float) -> Any:
        if not ours.poll(timeout):
            raise TimeoutError(f"{kind.name}: the lease-holding process did not answer")
        return ours.recv()

    try:
        receive(60)
        run.before = proc_sample(proc.pid)
        ours.send("go")
        started, run.held, run.threads, run.problem = receive(120 + count * 0.1)
        # steady: every lease has been renewed at least once by now
        time.sleep(max(0.0, started + interval + 0.5 - keeper_clock()))
        w0, c0 = keeper_clock(), proc_cpu(proc.pid)
        time.sleep(budget.many_leases_seconds)
        w1, c1 = keeper_clock(), proc_cpu(proc.pid)
        run.after = proc_sample(proc.pid)
        run.window, run.cpu = (w0, w1), c1 - c0
        ours.send("stop")
        run.stats = receive(60 + count * 0.1)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
            proc.join()
        drop_namespace(kind, "hb_many")
    return run


def held_row(table: Table, kind: StoreKind, run: HeldRun, budget: Budget) -> None:
    interval = RunOptions(key="hb", command=["bench"], ttl=budget.many_leases_ttl).renew_interval
    w0, w1 = run.window
    span = w1 - w0
    renewed = sum(1 for t in run.stats.renewed if w0 <= t <= w1)
    grown = run.after.get("rss", math.nan) - run.before.get("rss", math.nan)
    held = f"{run.held:,} of {budget.many_leases:,}" + (" (see below)" if run.problem else "")
    if run.problem:
        table.notes.append(f"{kind.name}: {run.problem}.")
    table.add(
        kind.name,
        held,
        fmt(run.after.get("threads"), 0),
        renewed / span,
        run.held / interval,
        len(run.stats.failed),
        len(run.stats.late),
        run.before.get("rss", math.nan),
        run.after.get("rss", math.nan),
        grown * 1024 / max(run.held, 1),
        run.cpu * 1000 / span,
        run.cpu * 1e6 / span / max(run.held, 1),
    )
    if run.stats.failed or run.stats.lost:
        common: dict[str, int] = {}
        for text in run.stats.failed:
            common[text] = common.get(text, 0) + 1
        worst = sorted(common.items(), key=lambda item: -item[1])[:2]
        shown = "; ".join(f"{n:,}× {text}" for text, n in worst)
        why: dict[str, int] = {}
        for reason in run.stats.lost:
            why[reason] = why.get(reason, 0) + 1
        reasons = ", ".join(f"{n:,}× {reason}" for reason, n in why.items())
        lost = f"; threads that gave their lease up: {reasons}" if why else ""
        table.notes.append(f"{kind.name}: failed renewals: {shown}{lost}.")


def many_leases_table(kinds: list[StoreKind], budget: Budget) -> Table:
    n, ttl = budget.many_leases, budget.many_leases_ttl
    options = RunOptions(key="hb", command=["bench"], ttl=ttl)
    table = Table(
        f"6b. {n:,} leases held by one process through the store API (ttl {ttl:g} s)",
        ["store", "leases held", "threads", "renewals/s", "expected/s", "failed", "late",
         "RSS before MiB", "RSS after MiB", "KiB / lease", "CPU ms/s", "CPU µs/s per lease"],
    )  # fmt: skip
    started = time.monotonic()
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        try:
            run = hold_many(kind, budget)
        except (TasklockError, TimeoutError, OSError) as exc:
            table.skip(kind.name, f"failed: {type(exc).__name__}: {exc}")
            continue
        held_row(table, kind, run, budget)
    table.seconds = time.monotonic() - started
    table.notes[:0] = [
        prose(
            f"""One process forked from the bench opens one store (`open_store`, I/O timeout
            {options.io_timeout:g} s as the supervisor sets it), creates {n:,}
            `tasklock_cli.lease.LeaseKeeper`s on it (keys `hb:0000`…), acquires each and starts
            its renewal thread at once — the loop of `Supervisor._heartbeat`: sleep until the
            next renewal, renew, schedule the next one `renew_interval` = {options.renew_interval:g}
            s later (StoreUnavailable: retry after {options.renew_retry_interval:g} s). Expected
            = leases ÷ renew_interval; renewals/s counts renewals completed in the steady
            window: {budget.many_leases_seconds:g} s starting one renew_interval + 0.5 s after
            the last thread started. Each renewal is one store write."""
        ),
        prose(
            f"""failed = renewals that raised (whole hold); late = renewals that completed after
            the lease's local deadline minus the safety margin ({options.safety_margin:g} s),
            i.e. when a supervisor would already be stopping its command. RSS before: the
            process with its store connection open, before the first LeaseKeeper; after: at
            the end of the steady window; KiB / lease = the difference ÷ leases held. CPU =
            on-CPU time of all the process's threads over the steady window (per-thread
            /proc schedstat); the store server's own CPU is not in it. Thread limits here:
            {thread_limits()}; a thread that cannot start is reported in `leases held`."""
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
        "--quick", action="store_true", help="about two minutes instead of about seven"
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
    sections: dict[int, Callable[[], Table | list[Table]]] = {
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
        result = section()
        if isinstance(result, Table):  # a section of several tables times each itself
            result.seconds = time.monotonic() - started
            result = [result]
        for table in result:
            print(table.text(), flush=True)
        tables += result
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
