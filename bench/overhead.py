"""Section 1: wrapper overhead, the wall time of whole `tasklock run k -- true` processes
beside floors measured the same way."""

from __future__ import annotations

import random
import shutil
import time
from pathlib import Path

from bench.harness import (
    PYTHON,
    TASKLOCK,
    Budget,
    Cmd,
    Envs,
    Table,
    fmt,
    interleave,
    median,
    p99,
    paired_diff_ms,
    prose,
    timed_run,
    with_store,
)
from bench.stores import StoreKind, floor_imports


def overhead_commands(kinds: list[StoreKind], envs: Envs, workdir: Path) -> list[Cmd]:
    cmds: list[Cmd] = []
    for kind in kinds:
        env = with_store(envs.warm, kind.url("overhead"))
        imports = floor_imports(kind)
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
        imports = floor_imports(kind)
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
