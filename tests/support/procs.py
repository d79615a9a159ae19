"""Reading the process table from /proc: who is alive, whose child, which group."""

from __future__ import annotations

import os
import threading
import time
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


def _fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` from its third field on (the name may hold spaces and any bytes:
    a test names a process with bytes that are not UTF-8)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rpartition(b")")[2].decode("ascii").split()


def read(pid: int) -> Proc | None:
    try:
        fields = _fields(pid)
    except OSError:
        return None
    return Proc(pid, fields[0], int(fields[1]), int(fields[2]), int(fields[3]))


def alive(pid: int) -> bool:
    """Running or sleeping: a zombie has finished."""
    proc = read(pid)
    return proc is not None and proc.state != "Z"


def children(pid: int) -> list[Proc]:
    return [proc for proc in processes() if proc.ppid == pid]


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    table = list(processes())
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for proc in table:
            if proc.ppid == parent and proc.state != "Z":
                found.append(proc.pid)
                todo.append(proc.pid)
    return found


def command_tree(wrapper_pid: int) -> list[int]:
    """The command's processes under a running wrapper: everything below its guard."""
    (guard,) = [proc.pid for proc in children(wrapper_pid) if proc.state != "Z"]
    return descendants(guard)


def group_members(pgid: int) -> list[int]:
    return [proc.pid for proc in processes() if proc.pgid == pgid]


def other_groups_in_session(sid: int) -> list[int]:
    """Process groups of a session besides the session leader's own."""
    return sorted({proc.pgid for proc in processes() if proc.sid == sid} - {sid})


def cmdline(pid: int) -> bytes | None:
    """``/proc/PID/cmdline`` as its raw bytes (each argument ends in NUL), None once the
    process is gone. Bytes: a parallel test runs commands whose arguments are not UTF-8
    (``caf\\xe9.db``), which a text read would fail on."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as arguments:
            return arguments.read()
    except OSError:  # gone (ENOENT, ESRCH) or not ours to read (EACCES)
        return None


def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot): with the pid, names it for good."""
    try:
        return int(_fields(pid)[19])
    except (OSError, IndexError, ValueError):
        return None


def identities(pids: list[int]) -> list[tuple[int, int]]:
    """(pid, start time) of each live process of ``pids``."""
    found = [(pid, start_time(pid)) for pid in pids]
    return [(pid, started) for pid, started in found if started is not None]


def still_running(identified: list[tuple[int, int]]) -> list[int]:
    """Those of ``identified`` still running as the same processes (not zombies)."""
    return [pid for pid, started in identified if start_time(pid) == started and alive(pid)]


def death_watch(pids: list[int]) -> tuple[threading.Thread, list[float]]:
    """A thread (not started) that appends to the returned list the wall-clock time at
    which none of ``pids`` is alive any more, looking every 2 ms."""
    dead_at: list[float] = []

    def watch() -> None:
        while any(alive(pid) for pid in pids):
            time.sleep(0.002)
        dead_at.append(time.time())

    return threading.Thread(target=watch, daemon=True), dead_at
