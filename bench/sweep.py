"""Section 5b: a sweep of many expired leases while an acquirer runs."""

from __future__ import annotations

import functools
import hashlib
import json
import math
import multiprocessing as mp
import os
import queue
import random
import secrets
import sqlite3
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from bench.baselines import POSTGRES_BASE
from bench.baselines import REDIS_BASE
from bench.baselines import postgres_batch_insert
from bench.baselines import redis_prefix
from bench.baselines import sqlite_pragmas
from bench.harness import HOLDER
from bench.harness import RUN_ID
from bench.harness import Budget
from bench.harness import Table
from bench.harness import fmt
from bench.harness import join_or_kill
from bench.harness import median
from bench.harness import ms
from bench.harness import p99
from bench.harness import prose
from bench.harness import timed
from bench.stores import StoreKind
from bench.stores import drop_namespace
from tasklock_cli.errors import TasklockError
from tasklock_cli.stores import open_store

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
            lease = log.call(op, functools.partial(store.acquire, key, 30, HOLDER, token))
            if lease is not None:
                # (ignore: mypy cannot infer a lambda with a default, which binds the loop's lease)
                log.call(OP_RELEASE, lambda le=lease: store.release(le) or None)  # type: ignore[misc]
    store.close()
    out.put(log)


def sqlite_fill_expired(path: Path, names: list[str]) -> None:
    """Rows shaped as the SQLite store's acquire writes them, granted SWEEP_AGE_S ago (this
    boot, CLOCK_BOOTTIME) for SWEEP_TTL_S; expiries 1 µs apart in key order; one
    executemany in one transaction, on the store file's journal settings. The table is
    the one the store created (found in sqlite_master): the bench writes the file format,
    it imports nothing of the store's."""
    with open_store(f"sqlite://{path}") as store:
        store.init_schema()
        store.peek("schema")
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    now, wall = time.clock_gettime(time.CLOCK_BOOTTIME), time.time()
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
    pragmas = sqlite_pragmas(path)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        table = lease_table(conn)
        for name, value in pragmas.items():
            conn.execute(f"PRAGMA {name}={value}")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            f"""INSERT INTO {table} (key, slot, slot_limit, fencing_token, owner_token,
                                     boot_id, expires_boot, acquired_at, expires_at, holder)
                VALUES (?, 0, 1, 1, ?, ?, ?, ?, ?, ?)""",
            rows,
        )
        conn.execute("COMMIT")
    finally:
        conn.close()


def lease_table(conn: sqlite3.Connection) -> str:
    """The store's lease table: the one with a ``key`` and an ``expires_boot`` column."""
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        columns = {row[1] for row in conn.execute(f"PRAGMA table_info('{name}')")}
        if {"key", "expires_boot"} <= columns:
            return str(name)
    raise RuntimeError("no lease table in the SQLite store's file")


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
    sweep_window: tuple[float, float] = (0.0, 0.0)
    baseline_window: tuple[float, float] = (0.0, 0.0)
    ping_seconds: float | None = None
    wal_bytes: int | None = None  # PostgreSQL: WAL the server wrote during the sweep
    log: OpLog = field(default_factory=OpLog)


def wal_position() -> int:
    """The server's current WAL position in bytes (all sessions' writes, not just ours)."""
    import psycopg

    from tasklock_cli.stores.postgres.connection import one_row

    with psycopg.connect(POSTGRES_BASE, autocommit=True) as conn:
        return int(one_row(conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn"))[0])


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
            run.sweep_window = (started, ended)
        run.baseline_window = (base_start, run.sweep_window[0])
        stop.set()
        run.log = out.get(timeout=120)
    finally:
        stop.set()
        join_or_kill(proc, 10)
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
        wal = f", {run.wal_bytes / 2**20:,.0f} MiB WAL" if run.wal_bytes is not None else ""
        label = f"sweep() while the acquirer runs: rows removed{wal}"
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


#: Why 5b has no MySQL row (yet): its fill writes each store's rows directly.
MYSQL_SWEEP_SKIP = (
    "not measured yet: the fill writes the store's rows directly (per store: SQLite, "
    "PostgreSQL, Redis), and no MySQL fill is written; section 5 sweeps MySQL leases "
    "inserted through the API"
)


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
        if kind.name == "etcd":
            table.skip(kind.name, "etcd revokes expired leases itself: there is nothing to sweep")
            continue
        if kind.name == "mysql":
            table.skip(kind.name, MYSQL_SWEEP_SKIP)
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
            bench process, timed (n = 1: it is destructive)."""
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
