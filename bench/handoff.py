"""Section 3: hand-off latency, from one holder's child exiting to the next waiter's child
starting, all through the CLI."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from bench.harness import (
    TASKLOCK,
    Budget,
    Envs,
    Table,
    median,
    p99,
    prose,
    reap,
    spawn,
    wait_until,
    with_store,
)
from bench.stores import StoreKind

HOLDER_SCRIPT = (
    'echo "s $EPOCHREALTIME" >> "$BENCH_LOG"; '
    'while [ ! -e "$BENCH_GO" ]; do sleep 0.005; done; echo "e $EPOCHREALTIME" >> "$BENCH_LOG"'
)


WAITER_SCRIPT = (
    'echo "s $EPOCHREALTIME" >> "$BENCH_LOG"; sleep 0.02; echo "e $EPOCHREALTIME" >> "$BENCH_LOG"'
)


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
