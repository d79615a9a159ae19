"""Section 1: wrapper overhead, the wall time of whole `tasklock run k -- true` processes
beside floors measured the same way (every process ends with ``os._exit`` or is a native
binary: none pays an interpreter teardown that another skips)."""

from __future__ import annotations

import random
import shutil
import subprocess
import time
from pathlib import Path

from bench.builds import BEFORE_GUARD
from bench.builds import Build
from bench.builds import current_build
from bench.builds import neutral_cwd
from bench.builds import prove
from bench.etcd_member import etcdctl_prefix
from bench.harness import PYTHON
from bench.harness import TASKLOCK
from bench.harness import Budget
from bench.harness import Cmd
from bench.harness import Envs
from bench.harness import Table
from bench.harness import fmt
from bench.harness import interleave
from bench.harness import median
from bench.harness import p99
from bench.harness import paired_diff_ms
from bench.harness import prose
from bench.harness import timed_run
from bench.harness import with_store
from bench.stores import StoreKind
from bench.stores import floor_imports

PYTHON_FLOOR = "python -c 'import os; os._exit(0)'"
#: `tasklock --version` without typer (issue 45: target ≤ 1.5 × the python floor).
VERSION = "tasklock --version"
VERSION_TARGET = 1.5
TRUE = "/bin/true"
#: Runs each SQLite row's store serves before the timed rounds, as a store in use has: a
#: run that is the file's only connection reads back the WAL's pages since its last
#: checkpoint. With SQLite's default auto-checkpoint (1000 pages, ~200 runs) a store in
#: use holds 500 on average; a fresh one, only what the bench's own runs wrote. After 100
#: runs of ~5 pages, the timed runs see 500-700 there (or whatever a build's own
#: checkpointing leaves).
SQLITE_RUNS_BEFORE = 100
RSS_TARGET_MIB = 20.0
#: Runs argv[1:] in a forked child and prints the child's ru_maxrss (KiB). Linux keeps
#: ru_maxrss across execve, so a process forked straight from the bench would report at least
#: the bench's own RSS; forked from this small interpreter, at least this one's (a bare
#: Python's, below anything tasklock can be, since tasklock is a Python process too).
RSS_PROBE = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execv(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "print(usage.ru_maxrss, flush=True)\n"
    "os._exit(os.waitstatus_to_exitcode(status))\n"
)


def exit_now(statement: str) -> str:
    """``statement`` then ``os._exit(0)``: no interpreter teardown, as `tasklock` exits."""
    return f"{statement}; import os; os._exit(0)"


#: The driver each network store imports: the floor of `run -- true` on that store.
DRIVERS = {"postgres": "psycopg", "redis": "redis", "mysql": "pymysql"}
#: `run -- true` on each store within this ratio of its driver's import: issue 18's for
#: PostgreSQL and Redis, issue 34's for MySQL.
DRIVER_TARGETS = {"postgres": 1.15, "redis": 1.15, "mysql": 1.3}


def store_commands(kind: StoreKind, env: dict[str, str], tag: str = "") -> list[Cmd]:
    run = [TASKLOCK, "run", "k", "--", "true"]
    floor = [PYTHON, "-c", exit_now(floor_imports(kind))]
    now = current_build()
    return [
        Cmd(f"{kind.name}: tasklock run k -- true{tag}", run, env, kind.name, build=now),
        Cmd(f"{kind.name}: import floor{tag}", floor, env, kind.name, build=now),
    ]


def driver_command(kind: StoreKind, env: dict[str, str]) -> list[Cmd]:
    """`python -c 'import <driver>; import os; os._exit(0)'` for a store with a driver."""
    driver = DRIVERS.get(kind.name)
    if driver is None:
        return []
    statement = exit_now(f"import {driver}")
    return [Cmd(f"python -c '{statement}'", [PYTHON, "-c", statement], env, f"driver:{kind.name}")]


def etcdctl_lock(kind: StoreKind, argv_tail: list[str]) -> list[str]:
    etcdctl = shutil.which("etcdctl") or "etcdctl"
    return [etcdctl, f"--endpoints={kind.member().endpoint}", "lock", *argv_tail]


def overhead_commands(kinds: list[StoreKind], envs: Envs, workdir: Path) -> list[Cmd]:
    cmds: list[Cmd] = []
    for kind in kinds:
        cmds += store_commands(kind, with_store(envs.warm, kind.url("overhead")))
    for kind in kinds:
        cmds += driver_command(kind, envs.warm)
    cmds += [
        Cmd(VERSION, [TASKLOCK, "--version"], envs.warm, build=current_build()),
        Cmd("python -c pass (with teardown)", [PYTHON, "-c", "pass"], envs.warm),
        Cmd(PYTHON_FLOOR, [PYTHON, "-c", "import os; os._exit(0)"], envs.warm),
        Cmd("flock FILE /bin/true", ["flock", str(workdir / "flock.lock"), TRUE], envs.warm),
        Cmd(TRUE, [TRUE], envs.warm),
    ]
    etcd = next((k for k in kinds if k.name == "etcd"), None)
    if etcd is not None and shutil.which("etcdctl"):
        argv = etcdctl_lock(etcd, [f"{etcdctl_prefix('overhead')}etcdctl", TRUE])
        cmds.append(Cmd("etcdctl lock K /bin/true", argv, {**envs.warm, "ETCDCTL_API": "3"}))
    return cmds


def baseline_commands(kinds: list[StoreKind], envs: Envs, baselines: list[Build]) -> list[Cmd]:
    """`tasklock run k -- true` on SQLite with each baseline build (its own install and its
    own database file: the schema may differ), to compare with today's row."""
    sqlite = next((k for k in kinds if k.name == "sqlite"), None)
    if sqlite is None:
        return []
    return [
        Cmd(
            f"sqlite: tasklock run k -- true, {build.title}",
            [build.tasklock, "run", "k", "--", "true"],
            with_store(envs.warm, sqlite.url(f"overhead-{build.name}")),
            "baseline",
            build=build,
        )
        for build in baselines
    ]


def proofs(cmds: list[Cmd]) -> list[str]:
    """Prove every row that names a build imports that build's package (WrongBuild if not)."""
    lines = [prove(c.label, c.argv, c.env, c.build) for c in cmds if c.build is not None]
    for line in lines:
        print(f"proof: {line}", flush=True)
    return lines


def cold_commands(kinds: list[StoreKind], envs: Envs) -> list[Cmd]:
    cmds: list[Cmd] = []
    for kind in kinds:
        cmds += store_commands(kind, with_store(envs.cold, kind.url("overhead")), " (no .pyc)")
    return cmds


def rss_mib(cmd: Cmd, samples: int = 3) -> float:
    """The largest ru_maxrss of ``samples`` runs of ``cmd``, through RSS_PROBE (MiB)."""
    found = 0
    for _ in range(samples):
        probe = subprocess.run(
            [PYTHON, "-c", RSS_PROBE, *cmd.argv],
            env=cmd.env,
            cwd=neutral_cwd(),
            capture_output=True,
            text=True,
        )
        if probe.returncode != 0 or not probe.stdout.split():
            raise RuntimeError(f"RSS probe of {cmd.label} failed: {probe.stderr[-300:]}")
        found = max(found, int(probe.stdout.split()[-1]))
    return found / 1024


def overhead_row(table: Table, cmd: Cmd, floor: Cmd | None, python_floor: Cmd) -> None:
    med = median(cmd.times) * 1000
    ratio = med / (median(floor.times) * 1000) if floor else None
    over = paired_diff_ms(cmd, floor) if floor else None
    python_row = cmd.argv[0] == PYTHON or cmd.build is not None
    is_python = python_row and cmd is not python_floor
    table.add(
        cmd.label,
        len(cmd.times),
        med,
        p99(cmd.times) * 1000,
        rss_mib(cmd) if python_row else None,
        floor.label.removeprefix(f"{cmd.group}: ") if floor else "—",
        fmt(ratio),
        fmt(over),
        fmt(paired_diff_ms(cmd, python_floor)) if is_python else "—",
        fmt(med / (median(python_floor.times) * 1000)) if is_python else "—",
    )


def section_overhead(
    kinds: list[StoreKind], envs: Envs, budget: Budget, workdir: Path, baselines: list[Build]
) -> Table:
    table = Table(
        "1. Wrapper overhead (wall time per invocation)",
        ["command", "n", "median ms", "p99 ms", "max RSS MiB", "floor", "× floor",
         "over floor ms", "over python floor ms", "× python floor"],
    )  # fmt: skip
    live = [k for k in kinds if k.reason is None]
    warm = overhead_commands(live, envs, workdir) + baseline_commands(live, envs, baselines)
    cold = cold_commands(live, envs)
    proven = proofs(warm + cold)
    for cmd in warm:  # one warm-up run each: fills the bytecode cache and the page cache
        timed_run(cmd.argv, cmd.env)
    for cmd in warm:
        if cmd.label.startswith("sqlite: tasklock run"):
            for _ in range(SQLITE_RUNS_BEFORE):
                timed_run(cmd.argv, cmd.env)
    rng = random.Random(1)
    interleave(warm, budget.overhead_rounds, rng, time.monotonic() + 6 * budget.overhead_rounds)
    interleave(cold, budget.cold_rounds, rng, time.monotonic() + 8 * budget.cold_rounds)
    by_label = {c.label: c for c in warm + cold}
    python_floor, true = by_label[PYTHON_FLOOR], by_label[TRUE]
    for kind in kinds:
        if kind.reason is not None:
            table.skip(kind.name, kind.reason)
            continue
        mine = [c for c in warm + cold if c.group == kind.name]
        for run_cmd, floor in ((mine[0], mine[1]), (mine[2], mine[3])):
            overhead_row(table, run_cmd, floor, python_floor)
            overhead_row(table, floor, python_floor, python_floor)
        driver_rows(table, mine[0], [c for c in warm if c.group == f"driver:{kind.name}"],
                    python_floor)  # fmt: skip
    olds = [c for c in warm if c.group == "baseline"]
    for old in olds:
        now = by_label["sqlite: tasklock run k -- true"]
        again = Cmd(f"{now.label}, now vs {old.build.title if old.build else ''}", now.argv,
                    now.env, now.group, now.times, now.rss_kib, now.build)  # fmt: skip
        overhead_row(table, again, old, python_floor)
        overhead_row(table, old, python_floor, python_floor)
    for cmd in warm:
        if not cmd.group and cmd is not true:
            python_based = cmd.argv[0] == PYTHON or cmd.label == VERSION
            overhead_row(table, cmd, python_floor if python_based else true, python_floor)
    overhead_row(table, true, None, python_floor)
    if not any(c.label.startswith("etcdctl") for c in warm):
        table.add("etcdctl lock K /bin/true", "skipped: no etcd member or no etcdctl", *[""] * 8)
    table.notes += overhead_notes(olds)
    table.notes += [f"Proof (`PYTHONVERBOSE=1`, same argv, env and cwd): {p}" for p in proven]
    return table


def driver_rows(table: Table, run_cmd: Cmd, drivers: list[Cmd], python_floor: Cmd) -> None:
    """The driver's bare import, and the store's `run -- true` once more with it as floor."""
    for driver in drivers:
        overhead_row(table, driver, python_floor, python_floor)
        rerun = Cmd(f"{run_cmd.label} (vs its driver's import; target × floor ≤ "
                    f"{DRIVER_TARGETS[run_cmd.group]})", run_cmd.argv, run_cmd.env, run_cmd.group,
                    run_cmd.times, run_cmd.rss_kib)  # fmt: skip
        overhead_row(table, rerun, driver, python_floor)


def overhead_notes(olds: list[Cmd]) -> list[str]:
    notes = [
        prose(
            f"""floor: what the row is compared with, measured the same way in the same rounds.
            A `tasklock run` row's floor is its store's import floor, `python -c 'import
            tasklock_cli.cli.fastrun, tasklock_cli.run.supervisor,
            tasklock_cli.stores.<store>.store; import os; os._exit(0)'` (a plain `run` is parsed
            without typer); an import floor's is
            the python floor `{PYTHON_FLOOR}`; native commands' is `/bin/true`. Every Python
            floor ends with `os._exit(0)` as `tasklock` does, so none pays an interpreter
            teardown that tasklock skips (`python -c pass (with teardown)` shows what that
            teardown costs). `× floor` = ratio of medians; `over floor ms` = median of
            per-round paired differences (this row − floor in the same round)."""
        ),
        prose(
            f"""max RSS (Python rows): the largest `ru_maxrss` of 3 more runs, each forked from a
            small probe interpreter that reports its child's rusage from `os.wait4` (Linux
            keeps ru_maxrss across execve, so a child forked straight from the bench would
            report at least the bench's own RSS). A reading is the largest of the process and
            the descendants it waited for (`true`, the guard). The issue's target: `tasklock
            run` on SQLite ≤ {RSS_TARGET_MIB:g} MiB."""
        ),
        prose(
            """Warm rows: PYTHONDONTWRITEBYTECODE removed and a private PYTHONPYCACHEPREFIX,
            filled by one warm-up run of each command before timing. `(no .pyc)` rows:
            PYTHONDONTWRITEBYTECODE=1 (as this environment sets it) with an empty cache prefix,
            i.e. every module compiled from source. Commands are run in a freshly shuffled
            order each round (interleaved); wall time runs from the fork to a blocking
            `os.wait4` returning."""
        ),
    ]
    notes.append(
        prose(
            f"""Driver rows (PostgreSQL, Redis, MySQL): `python -c 'import psycopg; import os;
            os._exit(0)'` and the same for `redis` and `pymysql`, the bare driver import that
            issues 18 (PostgreSQL, Redis) and 34 (MySQL) set as the floor of `run -- true` on
            those stores; the `(vs its driver's import …)` row repeats the store's `tasklock
            run k -- true` samples with that import as its floor: the target is `× floor` ≤
            {DRIVER_TARGETS["postgres"]} on PostgreSQL and Redis, ≤ {DRIVER_TARGETS["mysql"]}
            on MySQL."""
        )
    )
    notes.append(
        prose(
            f"""`{VERSION}`: the installed `tasklock` script (bin/tasklock), which prints the
            version without typer (issue 45's target: ≤ {VERSION_TARGET:g} × the python
            floor); its floor is the python floor."""
        )
    )
    if olds:
        notes.append(
            prose(
                f"""Baselines: each `…, <commit>` row runs `tasklock run k -- true` on SQLite
                (a database file of its own) with a regular install of that commit (its tree
                from `git archive`, `pip install`ed in a venv of its own), interleaved with
                every other row; the `now vs <commit>` row repeats today's `tasklock run` samples
                with that baseline as its floor: `over floor ms` and `× floor` are what changed
                since ({BEFORE_GUARD}: the guard process and everything after it). Every
                process runs from an empty directory outside the checkout, and each row naming a
                build was first run once with `PYTHONVERBOSE=1` and refused unless every
                `tasklock_cli` it imported is its build's (the proof lines below)."""
            )
        )
    return notes
