"""Reading the process table from /proc: who is alive, whose child, which group."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    pid: int
    state: str
    ppid: int
    pgid: int
    sid: int


def processes() -> Iterator[Proc]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            proc = read(int(entry))
            if proc is not None:
                yield proc


def read(pid: int) -> Proc | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # the name may hold spaces
    except OSError:
        return None
    return Proc(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[3]))


def alive(pid: int) -> bool:
    """Running or sleeping: a zombie has finished."""
    proc = read(pid)
    return proc is not None and proc.state != "Z"


def children(pid: int) -> list[Proc]:
    return [proc for proc in processes() if proc.ppid == pid]


def group_members(pgid: int) -> list[int]:
    return [proc.pid for proc in processes() if proc.pgid == pgid]


def other_groups_in_session(sid: int) -> list[int]:
    """Process groups of a session besides the session leader's own."""
    return sorted({proc.pgid for proc in processes() if proc.sid == sid} - {sid})
