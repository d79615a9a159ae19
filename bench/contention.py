"""Section 4: throughput under contention, N processes acquiring and releasing at once."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import secrets
import time
from typing import Any

from bench.harness import HOLDER, Budget, Table, fmt, prose
from bench.stores import StoreKind
from tasklock_cli.stores import open_store


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
