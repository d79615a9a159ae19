"""The wake-up entries beside an SQLite store.

They are FIFOs in ``X.db.waiters/`` and ``X.db.holders/``.
They are made and written safely in directories others may write to.

Each key has its own subdirectory, named by a hash of the key.
So a release lists only that key's entries, however many others the directory holds.

Directories are opened with ``O_NOFOLLOW`` and used through their fds.
An entry is written only when it is what tasklock makes there:

- its name has the expected pattern;
- ``lstat`` shows a FIFO owned by us, the directory's owner or root (anyone's on a
  group-shared store);
- the fd opened with ``O_NOFOLLOW`` is that same FIFO.

Anything else is left alone.

A directory is used only when the fd opened with ``O_NOFOLLOW`` shows one that ``Owners``
trusts.
One we make gets its mode through that fd (``fchmod``), never by name.
A name can be swapped for a symlink between ``mkdir`` and ``chmod``.
"""

from __future__ import annotations

import errno
import os
import stat

try:  # the built-in SHA-256: hashlib would load OpenSSL (milliseconds on every run)
    from _sha256 import sha256 as _sha256  # Python < 3.12
except ImportError:  # pragma: no cover - the module's name from 3.12 on
    try:
        from _sha2 import sha256 as _sha256
    except ImportError:
        from hashlib import sha256 as _sha256

from tasklock_cli.util import paths
from tasklock_cli.util import suppressed

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

#: The mode of a private store's files; a group-shared store's is 0o660 (``?mode=0660``).
PRIVATE_MODE = 0o600
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FIFO = os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITE_FIFO = os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
#: How often to try again when a key's empty directory is removed while we open it.
_RETRIES = 3


def key_dir_name(key: str) -> str:
    """The directory of a key's wake-up entries: a hash of its bytes (a key that is not
    UTF-8, which someone else wrote into the file, carries its bytes as surrogates)."""
    return _sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:24]


def directory_mode(file_mode: int) -> int:
    """A store's directories: 0700, or 0770 and setgid (the group carries on) when
    shared."""
    return 0o700 if file_mode == PRIVATE_MODE else 0o2770


def make_unique() -> str:
    """A name part no other process will pick: ``<time_ns>.<pid>.<random>``."""
    import time

    return f"{time.time_ns():020d}.{os.getpid()}.{os.urandom(4).hex()}"


def is_unique(name: str) -> bool:
    """Has ``name`` the form ``make_unique`` gives?"""
    parts = name.split(".")
    return (
        len(parts) == 3
        and len(parts[0]) == 20
        and _decimal(parts[0])
        and _decimal(parts[1])
        and len(parts[2]) == 8
        and all(char in "0123456789abcdef" for char in parts[2])
    )


def _decimal(text: str) -> bool:
    return text.isascii() and text.isdigit()


def is_token(name: str) -> bool:
    return _decimal(name) and name[0] != "0"


class Owners:
    """Who may own the directories beside a store.

    - Us and root.
    - The store file's owner.
    - On a group-shared store, for a directory of that group: the members of the store
      file's group.
      The group database names them, by their primary group or the group's member list.

    A directory anyone may write to (not sticky) is nobody's to trust."""

    def __init__(self, file_mode: int = PRIVATE_MODE) -> None:
        self.file_mode = file_mode
        self.uids = {0, os.geteuid()}
        self.group: int | None = None

    def know_store(self, store: os.stat_result) -> None:
        """The store file is known (and trusted): its owner, and its group when shared."""
        self.uids.add(store.st_uid)
        if self.file_mode != PRIVATE_MODE:
            self.group = store.st_gid

    def distrust(self, status: os.stat_result) -> str | None:
        """Why what is found beside the store (a directory, as ``lstat`` shows it) may not
        be used, or None when it may."""
        mode = stat.S_IMODE(status.st_mode)
        if stat.S_ISDIR(status.st_mode) and mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
            return f"is writable by every user (mode {mode:04o})"
        if status.st_uid in self.uids:
            return None
        group = self.group
        if group is not None and status.st_gid == group and is_member(status.st_uid, group):
            return None
        return f"belongs to {owner_name(status.st_uid)}, whom this store does not trust"


class KeyDirectories:
    """Each key's directory under ``directory`` (``X.db.waiters/``, ``X.db.holders/``), as
    ``owners`` trust them, and the mode of the entries made in them (``file_mode``)."""

    def __init__(
        self,
        directory: str | Path,
        file_mode: int = PRIVATE_MODE,
        owners: Owners | None = None,
    ) -> None:
        """``owners``: whose directories to use (the store's, once it is open)."""
        self.directory = paths.normal(directory)
        self.file_mode = file_mode
        self.owners = owners or Owners(file_mode)

    def key_dir(self, key: str, create: bool) -> int | None:
        """An fd of ``key``'s directory, or None (see ``open_key_dir``)."""
        return open_key_dir(self.directory, key, self.owners, create)

    def remove_key_dir(self, key: str) -> None:
        """Remove ``key``'s directory when it is empty (else leave it)."""
        remove_key_dir(self.directory, key, self.owners)


def owner_name(uid: int) -> str:
    import pwd

    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def group_name(gid: int) -> str:
    import grp

    try:
        return f"{grp.getgrgid(gid).gr_name} (gid {gid})"
    except KeyError:
        return f"gid {gid}"


def is_member(uid: int, gid: int) -> bool:
    """Does the group database make user ``uid`` a member of group ``gid``?"""
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False
    if user.pw_gid == gid:
        return True
    try:
        return user.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def open_key_dir(top: str, key: str, owners: Owners, create: bool) -> int | None:
    """An fd of ``key``'s directory under ``top`` (made, with ``top``, when ``create``);
    None when there is none, or either is not a plain directory (a symlink, a file) that
    ``owners`` trusts."""
    for _ in range(_RETRIES):
        top_fd = _open_dir(top, None, owners, create)
        if top_fd is None:
            return None
        try:
            return _open_dir(key_dir_name(key), top_fd, owners, create)
        except FileNotFoundError:  # removed, empty, just as we came: make it again
            continue
        finally:
            os.close(top_fd)
    return None


def _open_dir(name: str, dir_fd: int | None, owners: Owners, create: bool) -> int | None:
    made = False
    if create:
        try:
            os.mkdir(name, 0o700, dir_fd=dir_fd)
            made = True
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        fd = os.open(name, _DIRECTORY, dir_fd=dir_fd)
    except FileNotFoundError:
        if dir_fd is not None and create:
            raise
        return None
    except OSError:  # ELOOP (a symlink), ENOTDIR, EACCES: no entries here
        return None
    try:
        status = os.fstat(fd)
        if made and status.st_uid == os.geteuid():  # as asked, whatever the umask
            with suppressed(OSError):
                os.fchmod(fd, directory_mode(owners.file_mode))
                status = os.fstat(fd)
    except OSError:
        status = None
    if status is None or owners.distrust(status):
        os.close(fd)
        return None
    return fd


def names(dir_fd: int, valid) -> list[str]:
    """The names in the directory that ``valid`` accepts, sorted."""
    try:
        return sorted(name for name in os.listdir(dir_fd) if valid(name))
    except OSError:
        return []


def open_to_write(name: str, dir_fd: int, file_mode: int) -> int | None:
    """An fd to write to the FIFO ``name`` when it is one tasklock made; None when it is
    something else (left alone). OSError as ``open`` raises it: ENXIO when the FIFO has
    no reader, ENOENT when it is gone."""
    before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if not _trusted(before, dir_fd, file_mode):
        return None
    fd = os.open(name, _WRITE_FIFO, dir_fd=dir_fd)
    after = os.fstat(fd)
    if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISFIFO(
        after.st_mode
    ):
        os.close(fd)
        return None
    return fd


def _trusted(entry: os.stat_result, dir_fd: int, file_mode: int) -> bool:
    if not stat.S_ISFIFO(entry.st_mode):
        return False
    if file_mode != PRIVATE_MODE or entry.st_uid in (0, os.geteuid()):
        return True
    return entry.st_uid == os.fstat(dir_fd).st_uid


def make_fifo(making: str, final: str, dir_fd: int, file_mode: int) -> int:
    """Make a FIFO under the name ``making``, and return its fd.

    - Open it read-write.
      A read-only FIFO whose last writer has gone reads as end-of-file.
      So select() would report it ready for good.
    - Give it the store's mode.
    - Then rename it to ``final``: nobody sees the FIFO without its reader.

    OSError when it cannot be made; nothing is left then."""
    fd: int | None = None
    try:
        os.mkfifo(making, PRIVATE_MODE, dir_fd=dir_fd)
        fd = os.open(making, _READ_FIFO, dir_fd=dir_fd)
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):  # replaced between the two calls
            raise OSError(errno.EEXIST, "not the FIFO we made", making)
        os.fchmod(fd, file_mode)
        os.rename(making, final, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        if fd is not None:
            os.close(fd)
        for name in (making, final):  # (final is ours alone: a unique name, or our token)
            remove(name, dir_fd)
        raise
    return fd


def remove(name: str, dir_fd: int) -> None:
    with suppressed(OSError):
        os.unlink(name, dir_fd=dir_fd)


def remove_key_dir(top: str, key: str, owners: Owners) -> None:
    """Remove ``key``'s directory when it is empty (else leave it)."""
    top_fd = _open_dir(top, None, owners, create=False)
    if top_fd is None:
        return
    try:
        with suppressed(OSError):
            os.rmdir(key_dir_name(key), dir_fd=top_fd)
    finally:
        os.close(top_fd)
