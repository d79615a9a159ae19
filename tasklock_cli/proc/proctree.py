"""The processes below a subreaper, read from /proc (Linux).

A subreaper adopts every orphan of its tree, so "below it" is the whole tree: processes that
called setsid or double-forked included. Zombies are left out: they run nothing.
"""

from __future__ import annotations

import os

from tasklock_cli.util import suppressed


def _children_files(pid: int) -> list[int]:
    """Children of ``pid`` from /proc/PID/task/TID/children (one file per thread)."""
    found: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as listing:
            found.extend(int(part) for part in listing.read().split())
    return found


def _parents() -> dict[int, list[int]]:
    """Every process's children, from a scan of /proc/*/stat (when the children files are
    missing: kernels built without CONFIG_PROC_CHILDREN)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None:
                tree.setdefault(stat[1], []).append(int(entry))
    return tree


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` from the third (state) on; OSError when it cannot
    be read (FileNotFoundError: no such process)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:  # the name may hold any bytes, spaces too
        return stat.read().rpartition(b")")[2].decode("ascii").split()


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of ``pid``, or None when it is gone."""
    try:
        fields = stat_fields(pid)
    except OSError:
        return None
    return fields[0], int(fields[1])


def descendants(root: int) -> list[int]:
    """The live processes below ``root`` (not ``root`` itself), parents before children."""
    try:
        _children_files(root)
        children_of = _children_files
    except OSError:
        table = _parents()

        def children_of(pid: int) -> list[int]:
            return table.get(pid, [])

    found: list[int] = []
    todo = [root]
    while todo:
        for child in _safe_children(children_of, todo.pop()):
            stat = _stat(child)
            if stat is not None and stat[0] != "Z":
                found.append(child)
                todo.append(child)
    return found


def _safe_children(children_of, pid: int) -> list[int]:
    try:
        return children_of(pid)
    except OSError:  # it exited while we looked
        return []


def signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with suppressed(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
