"""Section 5: peek, list and sweep on a store holding many leases."""

from __future__ import annotations

import contextlib
import functools
import random
import secrets
import time
from typing import Any

from bench.baselines import postgres_batch_insert
from bench.harness import HOLDER
from bench.harness import RUN_ID
from bench.harness import TASKLOCK
from bench.harness import Budget
from bench.harness import Envs
from bench.harness import Table
from bench.harness import fmt
from bench.harness import gather
from bench.harness import median
from bench.harness import ms
from bench.harness import p99
from bench.harness import prose
from bench.harness import timed
from bench.harness import timed_run
from bench.harness import with_store
from bench.stores import StoreKind
from bench.sweep import sweep_table
from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Store


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
    deadline = time.time() + seconds
    chunks = [names[i::procs] for i in range(procs)]
    args = [(url, i, chunk, ttl, deadline) for i, chunk in enumerate(chunks)]
    counts = dict(gather(insert_worker, args, seconds + 60))
    return sorted(name for i, chunk in enumerate(chunks) for name in chunk[: counts[i]])


def insert_leases(
    kind: StoreKind, namespace: str, names: list[str], ttl: float, seconds: float
) -> tuple[list[str], float, str]:
    """(inserted names, seconds, how): SQL batch on PostgreSQL (checked through the API,
    falling back to the API on any mismatch), the API elsewhere (SQLite: one process,
    since its writers serialise anyway; Redis, MySQL: four)."""
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


def compare_peeks(
    targets: dict[str, tuple[Store, list[str]]], count: int, rng: random.Random
) -> dict[str, list[float]]:
    """Blocks of 50 peeks at random keys of each target, targets in shuffled order."""
    out: dict[str, list[float]] = {label: [] for label in targets}
    for _ in range(max(1, count // 50)):
        for label in rng.sample(list(targets), len(targets)):
            store, keys = targets[label]
            for key in rng.choices(keys, k=50):
                out[label].append(timed(functools.partial(store.peek, key)))
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


#: Stores whose server removes expired leases itself: their sweep() only checks the store.
SELF_EXPIRING = {
    "redis": "Redis expires keys itself; sweep = PING",
    "etcd": "etcd revokes expired leases itself; sweep = a status call",
}


def sweep_one(kind: StoreKind, store: Store, budget: Budget, table: Table) -> None:
    if kind.name in SELF_EXPIRING:
        t = timed(store.sweep)
        table.add(kind.name, f"sweep ({SELF_EXPIRING[kind.name]})", ms(t), "", "")
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
            process, its writers serialise anyway; Redis, MySQL: 4 forked processes), bounded
            in time:
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
