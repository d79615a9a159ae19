"""The harness: budgets, statistics, tables, tracked subprocesses, interleaved timing."""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
import resource
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from bench.builds import Build
from bench.builds import neutral_cwd
from bench.install import interpreter_and_tasklock
from tasklock_cli.stores.model import Holder

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

#: The interpreter of the floors and the `tasklock` timed: those of the private install
#: (bench/install.py) unless --dev-install.
PYTHON, TASKLOCK = interpreter_and_tasklock()


RUN_ID = f"{os.getpid()}"


HOLDER = Holder(host="bench", pid=os.getpid(), user="bench", command=["bench"], note=None)


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
    cli_clients: int = 8
    cli_runs: int = 25
    #: 4c: clients and runs per client of the `--limit 4` hand-off through the CLI.
    limit_clients: int = 16
    limit_runs: int = 10
    sweep_baseline_seconds: float = 1.0
    many_leases: int = 1000
    many_leases_ttl: float = 3.0
    heartbeat_sleep: int = 5
    #: 3c: rounds of the hand-offs between modes (`--shared`), their time bound, and the
    #: numbers of readers.
    modes_rounds: int = 15
    modes_seconds: float = 150.0
    modes_readers: tuple[int, ...] = (1, 4)


FULL = Budget(
    overhead_rounds=30,
    cold_rounds=6,
    roundtrip_seconds=4.0,
    handoff_rounds={1: 30, 8: 4, 32: 2},
    handoff_seconds=120.0,
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
    handoff_rounds={1: 4, 8: 1, 32: 1},
    handoff_seconds=10.0,
    contention_seconds=1.0,
    contention_reps=1,
    scale_leases=10_000,
    scale_insert_seconds=10.0,
    scale_peeks=300,
    sweep_leases=100_000,
    sweep_timeout_seconds=120.0,
    many_leases_seconds=4.0,
    cli_clients=4,
    cli_runs=8,
    limit_runs=3,
    modes_rounds=3,
    modes_seconds=30.0,
)


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

    def add(self, *cells: float | str | None) -> None:
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


LIVE_PROCS: list[subprocess.Popen] = []


def spawn(argv: list[str], env: dict[str, str], **kwargs: Any) -> subprocess.Popen:
    """Start ``argv`` in a new session, from the neutral directory unless told otherwise (a
    ``python -c``/``-m`` started from a checkout imports the checkout's package)."""
    kwargs.setdefault("cwd", neutral_cwd())
    kwargs.setdefault("stdout", subprocess.DEVNULL)
    kwargs.setdefault("stderr", subprocess.DEVNULL)
    proc = subprocess.Popen(argv, env=env, start_new_session=True, **kwargs)
    LIVE_PROCS.append(proc)
    return proc


def reap(proc: subprocess.Popen, timeout: float) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return proc.wait()
    finally:
        with contextlib.suppress(ValueError):
            LIVE_PROCS.remove(proc)


def kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_leftovers() -> None:
    for proc in list(LIVE_PROCS):
        kill_group(proc)
        with contextlib.suppress(Exception):
            proc.wait(timeout=5)
    LIVE_PROCS.clear()


def gather(target: Callable[..., None], args_per_worker: list[tuple], timeout: float) -> list:
    """Run ``target(*args, out)`` in one forked process per args tuple; each puts one result
    on ``out``. The results, in arrival order; every worker is joined (killed if stuck)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    out = ctx.Queue()
    workers = [ctx.Process(target=target, args=(*args, out)) for args in args_per_worker]
    for worker in workers:
        worker.start()
    try:
        return [out.get(timeout=timeout) for _ in workers]
    finally:
        for worker in workers:
            join_or_kill(worker, 10)


def join_or_kill(worker: BaseProcess, timeout: float) -> None:
    """Join a forked ``multiprocessing`` process, killing it if it has not ended within
    ``timeout`` seconds."""
    worker.join(timeout=timeout)
    if worker.is_alive():
        worker.kill()
        worker.join()


def timed_run(argv: list[str], env: dict[str, str]) -> float:
    return timed_usage(argv, env)[0]


def timed_usage(
    argv: list[str], env: dict[str, str], timeout: float = 60
) -> tuple[float, resource.struct_rusage]:
    """Wall time from fork to the wait returning, and the child's rusage (ru_maxrss: KiB).

    A blocking ``os.wait4``, never ``Popen.wait(timeout=...)``: that one polls with sleeps
    doubling from 0.5 ms to 50 ms, so a process was seen to end only at the next poll — a
    35 ms process measured 64 ms, and every time was rounded up to 1, 2, 4 … 31.5, 63.5,
    113.5 ms. A timer kills the process group instead, should it hang."""
    started = time.perf_counter()
    proc = spawn(argv, env)
    watchdog = threading.Timer(timeout, kill_group, args=(proc,))
    watchdog.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        watchdog.cancel()
        LIVE_PROCS.remove(proc)
    elapsed = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}")
    return elapsed, usage


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


@dataclass
class Cmd:
    label: str
    argv: list[str]
    env: dict[str, str]
    group: str = ""
    times: list[float] = field(default_factory=list)
    rss_kib: list[int] = field(default_factory=list)
    #: The build whose package this row must import (checked by bench.builds.prove).
    build: Build | None = None


def interleave(cmds: list[Cmd], rounds: int, rng: random.Random, deadline: float) -> int:
    """Shuffled round robin: every round runs every command once, in a fresh order."""
    done = 0
    for _ in range(rounds):
        if time.monotonic() > deadline:
            break
        for cmd in rng.sample(cmds, len(cmds)):
            elapsed, usage = timed_usage(cmd.argv, cmd.env)
            cmd.times.append(elapsed)
            cmd.rss_kib.append(usage.ru_maxrss)
        done += 1
    return done


def paired_diff_ms(a: Cmd, b: Cmd) -> float:
    n = min(len(a.times), len(b.times))
    return median([(x - y) * 1000 for x, y in zip(a.times[:n], b.times[:n], strict=True)])


def time_block(op: Callable[[], object], count: int, out: list[float]) -> None:
    for _ in range(count):
        started = time.perf_counter()
        op()
        out.append(time.perf_counter() - started)


def timer(op: Callable[[], object], out: list[float]) -> Callable[[int], None]:
    return lambda count: time_block(op, count, out)


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.01)


def timed(op: Callable[[], object]) -> float:
    started = time.perf_counter()
    op()
    return time.perf_counter() - started


def ms(seconds: float) -> str:
    return fmt(seconds * 1000, 3 if seconds < 0.01 else 1)


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


def proc_cpu(pid: int) -> float:
    """CPU seconds of every live thread of ``pid`` (summed per-task schedstat)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9
