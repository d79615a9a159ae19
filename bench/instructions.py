"""Section 7: instructions, not time. Section 1's commands (and the baselines' `run`) each
once under ``valgrind --tool=callgrind``, reading the instructions of the process itself:
for `tasklock run`, the wrapper, not its guard or `true`. Repeatable on the same build,
inputs and environment whatever else the machine does, so a start-up change shows here
when wall times on a loaded 2-core machine drown it. Not a time: a fork, an exec, the
kernel's work and a disk's sync count nothing here."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from bench.builds import Build
from bench.builds import neutral_cwd
from bench.harness import Envs
from bench.harness import Table
from bench.harness import fmt
from bench.harness import timed_run
from bench.overhead import DRIVERS
from bench.overhead import PYTHON_FLOOR
from bench.overhead import baseline_commands
from bench.overhead import overhead_commands
from bench.stores import StoreKind

#: valgrind's summary line of one process: ``==PID== Collected : N``.
_COLLECTED = re.compile(r"^==(\d+)== Collected : (\d+)", re.MULTILINE)
_FIRST_PID = re.compile(r"^==(\d+)==", re.MULTILINE)
#: Rows that are not Python processes of ours or a floor: nothing to count.
_NATIVE = ("flock", "/bin/true", "etcdctl")
#: What each row is compared with, beside `python -c pass` (the issue's yardstick).
PASS = "python -c pass (with teardown)"


def instructions(argv: list[str], env: dict[str, str], timeout: float = 300.0) -> int:
    """Instructions (user space) of the process ``argv`` starts, not of its children:
    valgrind names the first process it reports on first; a forked child reports its own
    total (which counts its parent's work before the fork) under its own pid."""
    result = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        env=env,
        cwd=neutral_cwd(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    first = _FIRST_PID.search(result.stderr)
    totals = {pid: int(count) for pid, count in _COLLECTED.findall(result.stderr)}
    if result.returncode != 0 or first is None or first.group(1) not in totals:
        tail = result.stderr.strip().splitlines()[-3:]
        raise RuntimeError(f"{argv[0]} under valgrind: exit {result.returncode}: {tail}")
    return totals[first.group(1)]


def floor_of(label: str, group: str) -> str | None:
    """The row a row is compared with: a run with its store's import floor, an import floor
    and a driver's import with `python -c pass`, a run on a driver's store also with its
    driver's import (issue 45's targets)."""
    if label.endswith("tasklock run k -- true") and group in DRIVERS:
        return f"python -c 'import {DRIVERS[group]}; import os; os._exit(0)'"
    if label in (PYTHON_FLOOR, PASS):
        return None
    return PASS


def section_instructions(
    kinds: list[StoreKind], envs: Envs, workdir: Path, baselines: list[Build]
) -> Table:
    table = Table(
        "7. Instructions per process (callgrind; the wrapper alone for `run`)",
        ["command", "instructions (M)", "× python -c pass", "compared with", "× that"],
    )
    if shutil.which("valgrind") is None:
        table.skip("every row", "no valgrind on PATH")
        return table
    live = [k for k in kinds if k.reason is None]
    cmds = overhead_commands(live, envs, workdir) + baseline_commands(live, envs, baselines)
    cmds = [c for c in cmds if not c.label.startswith(_NATIVE) and c.argv[0] != "flock"]
    counted: dict[str, float] = {}
    for cmd in cmds:
        try:
            timed_run(cmd.argv, cmd.env)  # warm: bytecode cached, the key's row made
            counted[cmd.label] = instructions(cmd.argv, cmd.env) / 1e6
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            table.skip(cmd.label, str(exc)[:160])
    base = counted.get(PASS)
    for cmd in cmds:
        if cmd.label not in counted:
            continue
        value = counted[cmd.label]
        other = floor_of(cmd.label, cmd.group)
        ratio = value / counted[other] if other in counted else None
        table.add(
            cmd.label,
            fmt(value, 1),
            fmt(value / base) if base else "—",
            other or "—",
            fmt(ratio) if ratio else "—",
        )
    table.notes.append(
        "Each command run once to warm its bytecode and its store's row, then once under "
        "`valgrind --tool=callgrind`; the count is the started process's own (for `tasklock "
        "run`, the wrapper: its guard and `true` are counted apart by valgrind and left out). "
        "The same build, inputs and environment give the same count within a fraction of a "
        "percent, whatever the machine's load. Kernel time (fork, exec, page faults, syncs) "
        "and the store server's work are not in it: section 1's wall times have them."
    )
    return table
