"""Section 6: the heartbeat's cost in memory and CPU, for one wrapper and for 1,000 leases
held by one process."""

from __future__ import annotations

import contextlib
import math
import multiprocessing as mp
import os
import resource
import secrets
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from bench.harness import HOLDER
from bench.harness import LIVE_PROCS
from bench.harness import PYTHON
from bench.harness import TASKLOCK
from bench.harness import Budget
from bench.harness import Envs
from bench.harness import Table
from bench.harness import fmt
from bench.harness import join_or_kill
from bench.harness import proc_cpu
from bench.harness import proc_sample
from bench.harness import prose
from bench.harness import spawn
from bench.harness import with_store
from bench.stores import StoreKind
from bench.stores import drop_namespace
from bench.stores import floor_imports
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.errors import TasklockError
from tasklock_cli.run.schedule import RenewalSchedule
from tasklock_cli.run.schedule import renewal_schedule
from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import Lease

HEARTBEAT_AT = (2.0, 2.5)  # seconds after start: steady window opens, RSS is read


@dataclass
class Watched:
    label: str
    proc: subprocess.Popen
    started: float
    samples: dict[float, dict[str, float]] = field(default_factory=dict)
    rusage: Any = None


def heartbeat_variants(kind: StoreKind, sleep: int) -> dict[str, list[str]]:
    imports = floor_imports(kind)
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
        LIVE_PROCS.remove(w.proc)


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


def keeper_clock() -> float:
    """The clock the wrapper keeps its local deadline on (CLOCK_BOOTTIME: counts suspend)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


@dataclass
class Held:
    """One lease kept through the store API the way the wrapper keeps it: the local
    deadline is ttl after the moment the acquire or renew was sent."""

    store: Store
    key: str
    ttl: float
    lease: Lease | None = None
    acquired_at: float = 0.0
    deadline: float = 0.0
    token: str = field(default_factory=lambda: secrets.token_hex(16))

    def try_acquire(self) -> bool:
        sent = keeper_clock()
        self.lease = self.store.acquire(self.key, self.ttl, HOLDER, self.token)
        if self.lease is not None:
            self.acquired_at, self.deadline = sent, sent + self.ttl
        return self.lease is not None

    def renew(self) -> None:
        assert self.lease is not None
        sent = keeper_clock()
        self.lease = self.store.renew(self.lease, self.ttl)
        self.deadline = max(self.deadline, sent + self.ttl)

    def release(self) -> None:
        if self.lease is not None:
            self.store.release(self.lease)


@dataclass
class HeldStats:
    """What the renewal threads saw (lists: appends are atomic across threads)."""

    renewed: list[float] = field(default_factory=list)  # completion times
    late: list[float] = field(default_factory=list)  # completed after deadline − margin
    failed: list[str] = field(default_factory=list)  # one error text per failed renewal
    lost: list[str] = field(default_factory=list)  # threads that gave their lease up


def renew_loop(
    keeper: Held, options: RenewalSchedule, stop: threading.Event, stats: HeldStats
) -> None:
    """The wrapper's heartbeat schedule: wait until the next renewal, renew, reschedule
    (retry sooner after StoreUnavailable; give up on LeaseLost or a passed deadline)."""
    next_renewal = keeper.acquired_at + options.renew_interval
    while not stop.wait(max(0.0, next_renewal - keeper_clock())):
        if keeper_clock() >= keeper.deadline:
            stats.lost.append("local deadline passed before the renewal")
            return
        due = keeper.deadline - options.safety_margin
        try:
            keeper.renew()
        except StoreUnavailable as exc:
            stats.failed.append(f"StoreUnavailable: {exc}"[:160])
            next_renewal = keeper_clock() + options.renew_retry_interval
            continue
        except Exception as exc:  # LeaseLost, or anything the supervisor would lose on
            stats.failed.append(f"{type(exc).__name__}: {exc}"[:160])
            stats.lost.append(f"renewal raised {type(exc).__name__}")
            return
        done = keeper_clock()
        stats.renewed.append(done)
        if done > due:
            stats.late.append(done)
        next_renewal = keeper_clock() + options.renew_interval


def many_leases_child(url: str, count: int, ttl: float, conn: Any) -> None:
    """Forked: one store, ``count`` held leases on it, each acquired and then renewed by
    its own thread on the supervisor's schedule, until told to stop; then all released."""
    options = renewal_schedule(ttl)
    store = open_store(url)
    store.set_io_timeout(options.io_timeout)  # as Supervisor.run does
    store.peek("hb:connect")  # the connection exists before the 'before' sample
    conn.send("ready")
    conn.recv()
    stop, stats = threading.Event(), HeldStats()
    keepers: list[Held] = []
    threads: list[threading.Thread] = []
    refused: list[str] = []
    problem = ""
    for i in range(count):
        keeper = Held(store, f"hb:{i:04d}", ttl)
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
    interval = renewal_schedule(ttl).renew_interval
    proc = ctx.Process(target=many_leases_child, args=(url, count, ttl, theirs))
    proc.start()
    assert proc.pid is not None  # started
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
        join_or_kill(proc, 30)
        drop_namespace(kind, "hb_many")
    return run


def held_row(table: Table, kind: StoreKind, run: HeldRun, budget: Budget) -> None:
    interval = renewal_schedule(budget.many_leases_ttl).renew_interval
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
    options = renewal_schedule(ttl)
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
            leases on it (keys `hb:0000`…), acquires each and starts its renewal thread at once —
            the wrapper's heartbeat loop, restated on the store API: sleep until the
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
            process with its store connection open, before the first lease; after: at
            the end of the steady window; KiB / lease = the difference ÷ leases held. CPU =
            on-CPU time of all the process's threads over the steady window (per-thread
            /proc schedstat); the store server's own CPU is not in it. Thread limits here:
            {thread_limits()}; a thread that cannot start is reported in `leases held`."""
        ),
    ]
    return table
