"""``doctor`` for the SQLite store: the file opened and queried, and its filesystem."""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.stores.doctor import warning
from tasklock_cli.stores.model import StoreCheck
from tasklock_cli.stores.sqlite.entries import PRIVATE_MODE
from tasklock_cli.stores.sqlite.files import owner_name
from tasklock_cli.stores.sqlite.files import world_writable
from tasklock_cli.stores.sqlite.schema import SCHEMA_VERSION
from tasklock_cli.stores.sqlite.schema import TABLE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.sqlite.store import SQLiteStore

NETWORK_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "9p",
    "fuse.sshfs",
    "glusterfs",
    "ceph",
}


def store_checks(store: SQLiteStore) -> list[StoreCheck]:
    """doctor's lines: the file opened and read once, its schema, its filesystem."""
    checks = [StoreCheck("store", True, store.display_url)]
    probe_key = f"tasklock-doctor-{os.urandom(16).hex()}"
    started = time.perf_counter()
    try:
        store.holders(probe_key)
    except (ConfigError, StoreUnavailable) as exc:
        checks.append(StoreCheck("reachable", False, str(exc)))
        checks.append(permissions_check(store.path, store.file_mode))
        return checks
    elapsed = (time.perf_counter() - started) * 1000
    checks.append(StoreCheck("reachable", True, f"opened and queried in {elapsed:.1f} ms"))
    checks.append(StoreCheck("schema", True, f"table {TABLE}, version {SCHEMA_VERSION}"))
    checks.append(StoreCheck("clock", True, "this machine's clock (CLOCK_BOOTTIME); no skew"))
    checks.append(permissions_check(store.path, store.file_mode))
    checks.append(filesystem_check(Path(store.path)))
    return checks


def permissions_check(path: str, file_mode: int) -> StoreCheck:
    """doctor's ``permissions`` line: the file not a symlink, writable by us, writable by
    nobody else unless a group shares it (``?mode=0660``), and then consistently so."""
    problems, warnings = _permission_findings(path, file_mode)
    if problems:
        return StoreCheck("permissions", False, "; ".join(problems))
    if warnings:
        return warning("permissions", "; ".join(warnings))
    shared = f"shared with group {_group(path)}" if file_mode != PRIVATE_MODE else "private"
    return StoreCheck("permissions", True, f"{shared} ({_modes(path)})")


def _permission_findings(path: str, file_mode: int) -> tuple[list[str], list[str]]:
    directory = os.path.dirname(path) or "."
    problems: list[str] = []
    warnings: list[str] = []
    try:
        link = os.lstat(path)
    except FileNotFoundError:
        return [f"{path} does not exist yet (the first run creates it)"], []
    except OSError as exc:
        return [f"cannot look at {path}: {exc.strerror}"], []
    if stat.S_ISLNK(link.st_mode):
        return [f"{path} is a symlink: name the file itself in the store URL"], []
    for name, is_dir in ((path, False), (directory, True)):
        with contextlib.suppress(OSError):
            problem = world_writable(os.stat(name), is_dir)
            if problem:
                problems.append(f"{name} {problem}")
    for name in (path, directory):
        if not os.access(name, os.W_OK):
            problems.append(
                f"{name} is not writable by you ({owner_name(os.getuid())}): it belongs to "
                f"{owner_name(os.stat(name).st_uid)}; chown it, or share it with a group "
                "(?mode=0660)"
            )
    if file_mode == PRIVATE_MODE:
        if link.st_uid not in (0, os.geteuid()):
            problems.append(
                f"{path} belongs to {owner_name(link.st_uid)}: a private store must be yours "
                "(or add ?mode=0660 to share it with the file's group)"
            )
        if stat.S_IMODE(link.st_mode) & 0o077:
            warnings.append(
                f"{path} is readable by others (mode {stat.S_IMODE(link.st_mode):04o}): the "
                f"ledger holds commands and notes; chmod 600 {path}"
            )
        return problems, warnings
    files = [name for name in (path, f"{path}-wal", f"{path}-shm") if os.path.exists(name)]
    for name in files:
        if stat.S_IMODE(os.stat(name).st_mode) & 0o060 != 0o060:
            warnings.append(f"{name} is not read-write for its group: chmod g+rw {name}")
    mode = stat.S_IMODE(os.stat(directory).st_mode)
    if mode & 0o070 != 0o070 or not os.stat(directory).st_mode & stat.S_ISGID:
        warnings.append(
            f"{directory} (mode {mode:04o}) should be the group's, group-writable and "
            f"setgid, so files made there stay the group's: chgrp GROUP {directory}; "
            f"chmod 2770 {directory}"
        )
    return problems, warnings


def _modes(path: str) -> str:
    shown = []
    for name in (os.path.dirname(path) or ".", path):
        with contextlib.suppress(OSError):
            shown.append(f"{name} {stat.S_IMODE(os.stat(name).st_mode):04o}")
    return ", ".join(shown)


def _group(path: str) -> str:
    import grp

    gid = os.stat(path).st_gid
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def filesystem_check(path: Path) -> StoreCheck:
    """doctor's ``filesystem`` line: a warning on a network filesystem."""
    fstype = filesystem_type(path)
    if fstype in NETWORK_FILESYSTEMS or (fstype or "").startswith("fuse"):
        return warning(
            "filesystem",
            f"{path} is on {fstype}: SQLite locking is unreliable on network filesystems; "
            "use PostgreSQL or Redis across machines",
        )
    return StoreCheck("filesystem", True, f"{fstype or 'unknown'} (local)")


def filesystem_type(path: Path) -> str | None:
    """The filesystem type of the mount holding ``path``, from /proc/self/mountinfo."""
    try:
        target = os.path.realpath(path.parent)
        best, best_type = "", None
        with open("/proc/self/mountinfo") as mountinfo:
            for line in mountinfo:
                fields = line.split()
                mount_point = fields[4].replace("\\040", " ")
                fstype = fields[fields.index("-") + 1]
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, best_type = mount_point, fstype
        return best_type
    except (OSError, ValueError, IndexError):
        return None
