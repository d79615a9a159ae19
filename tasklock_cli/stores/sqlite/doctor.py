"""``doctor`` for the SQLite store: the file opened and queried, and its filesystem."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import StoreUnavailable
from tasklock_cli.stores.base import StoreCheck
from tasklock_cli.stores.doctor import warning
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
        return checks
    elapsed = (time.perf_counter() - started) * 1000
    checks.append(StoreCheck("reachable", True, f"opened and queried in {elapsed:.1f} ms"))
    checks.append(StoreCheck("schema", True, f"table {TABLE}, version {SCHEMA_VERSION}"))
    checks.append(StoreCheck("clock", True, "this machine's clock (CLOCK_BOOTTIME); no skew"))
    checks.append(filesystem_check(Path(store.path)))
    return checks


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
