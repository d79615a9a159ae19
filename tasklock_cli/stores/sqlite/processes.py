"""Telling whether a holder's processes still run.

A holder on this machine records two processes: its own, and its command's guard.
For each it records the pid and start time, with its boot and pid namespace.
``release --force`` on the same machine can then see that they are gone.
It frees the lease at once, rather than waiting for it to run out."""

from __future__ import annotations

import os

from tasklock_cli.proc.proctree import stat_fields


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot); None when there is no
    such process. OSError when it cannot be told (``/proc`` hidden, or missing)."""
    try:
        fields = stat_fields(pid)
    except (FileNotFoundError, ProcessLookupError):
        return None
    # fields[0] is field 3 (state); starttime is field 22. A zombie is gone for us.
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


def processes_of(boot: str, pids: list[int]) -> dict:
    """What a holder records: its boot, pid namespace and each process with its start."""
    known = []
    for pid in pids:
        started = start_time(pid)
        if started is not None:
            known.append([pid, started])
    return {"boot": boot, "pidns": pid_namespace(), "pids": known}


def all_gone(recorded: dict, boot: str) -> bool:
    """True only when ``recorded`` (``processes_of``) names processes of this boot and pid
    namespace and none of them runs any more; False when any runs or it cannot be told."""
    try:
        if recorded.get("boot") != boot or recorded.get("pidns") != pid_namespace():
            return False
        pids = [(int(pid), int(started)) for pid, started in recorded["pids"]]
        # The holder alone (recorded with its acquire) or with its guard (recorded before
        # its command can start): none of them running means no command runs either.
        if not pids:
            return False
        return all(start_time(pid) != started for pid, started in pids)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return False
