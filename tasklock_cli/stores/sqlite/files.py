"""The SQLite store's file and directory on a host with several users.

They are made private (0600 in a 0700 directory), or group-shared as ``?mode=0660`` asks.
They are refused (78) when trusting them would let someone else choose what tasklock writes
or reads:

- A store path that is a symlink.
  It may be another application's database.
- A file or directory anyone may write to.
  Anyone could forge or remove leases.
  A directory with the sticky bit (``/tmp``) is fine, since others cannot replace our file.
- A private store (no ``?mode=0660``) whose file belongs to another user.
  Say it was made in /tmp in advance: that user could forge or remove leases.
- A group-shared store whose file is not of the group a store made there would be shared
  with.
  That group is the directory's when it is setgid, else ours.
- A group-shared store whose owner is neither us, root nor a member of that group.
- A directory beside the store (``X.db.waiters/``, ``X.db.holders/``) that is not a plain
  directory of someone the store trusts (see ``entries.Owners``).
- As root, the default store in a directory of another user.
  ``sudo -E``, or ``su`` without ``-``, keeps the user's ``$HOME``.
  Root would then write where that user can plant symlinks.
  And it would leave a file the user can no longer write.
"""

from __future__ import annotations

import os
import stat

from tasklock_cli.errors import ConfigError
from tasklock_cli.stores.sqlite.entries import PRIVATE_MODE
from tasklock_cli.stores.sqlite.entries import Owners
from tasklock_cli.stores.sqlite.entries import directory_mode
from tasklock_cli.stores.sqlite.entries import group_name
from tasklock_cli.stores.sqlite.entries import is_member
from tasklock_cli.stores.sqlite.entries import owner_name
from tasklock_cli.util import paths

#: The modes ``?mode=`` may ask for: private, or read-write for the file's group.
FILE_MODES = {"0600": 0o600, "600": 0o600, "0660": 0o660, "660": 0o660}


def file_mode_parameter(value: str | None) -> int:
    """The file mode of ``?mode=VALUE`` (private when not given); ConfigError when bad."""
    if value is None:
        return PRIVATE_MODE
    mode = FILE_MODES.get(value)
    if mode is None:
        raise ConfigError(
            f"sqlite URL parameter mode={value!r} is not a store mode "
            "(0600: private, the default; 0660: shared with the file's group)"
        )
    return mode


#: The directories beside a store (see entries).
SIDE_DIRECTORIES = (".waiters", ".holders")


def prepare(path: str, file_mode: int, default_store: bool, owners: Owners | None = None) -> None:
    """Make sure the store file at ``path`` may be trusted, creating it (and, for the
    default store, its directory) with the right modes, and the directories beside it;
    ConfigError (78) when not. ``owners`` learns the store file's owner and group."""
    directory = paths.parent(path)
    if default_store and os.geteuid() == 0:
        refuse_foreign_home(path)
    if default_store:
        make_dirs(directory, directory_mode(file_mode))
    elif not paths.is_dir(directory):
        raise ConfigError(
            f"the directory of the SQLite store {path} does not exist "
            f"(create {directory} or choose another path)"
        )
    refuse_open_to_all(directory, is_dir=True)
    status = create_file(path, file_mode)
    owners = owners or Owners(file_mode)
    owners.know_store(status)
    refuse_untrusted_side_dirs(path, owners)


def refuse_untrusted_side_dirs(path: str, owners: Owners) -> None:
    """What is found at the names of the directories beside the store must be someone's
    that ``owners`` trusts: its owner could plant entries tasklock writes to. (One of
    ours that is not a plain directory, a symlink say, is only never used: waiters
    then poll.)"""
    for suffix in SIDE_DIRECTORIES:
        side = path + suffix
        try:
            status = os.lstat(side)
        except OSError:
            continue  # missing (made when needed) or unreadable (then unused)
        problem = owners.distrust(status)
        if problem and stat.S_ISLNK(status.st_mode):
            problem = f"is a symlink of {owner_name(status.st_uid)}, whom the store does not trust"
        if problem:
            raise ConfigError(
                f"{side} {problem}: refusing the store beside it (whoever controls that "
                f"directory could plant entries tasklock writes to); remove {side}"
            )


def refuse_foreign_home(path: str) -> None:
    """As root: the store file, and the nearest directory above it that exists, must be
    root's."""
    for candidate in (path, *_ancestors(path)):
        try:
            owner = os.lstat(candidate).st_uid
        except FileNotFoundError:
            continue
        except OSError:
            return
        if owner != 0:
            raise ConfigError(
                f"{candidate} belongs to {owner_name(owner)}: as root, tasklock does not use "
                "a default store in another user's directory (sudo -E or su without - keep "
                "their $HOME); use sudo -i, or choose a store with --store"
            )
        if candidate != path:
            return


def _ancestors(path: str):
    while True:
        above = paths.parent(path)
        if above == path:
            return
        yield above
        path = above


def make_dirs(directory: str, mode: int) -> None:
    """The default store's directory, made ``mode``, and any missing above it (0700, as
    the XDG spec says)."""
    if paths.is_dir(directory):
        return
    above = paths.parent(directory)
    if above != directory:
        make_dirs(above, 0o700)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        if not paths.is_dir(directory):
            raise ConfigError(
                f"cannot create {directory}: it exists and is not a directory"
            ) from None
        return
    except OSError as exc:
        raise ConfigError(f"cannot create {directory}: {exc.strerror}") from exc
    set_mode_of_made_dir(directory, mode)


def set_mode_of_made_dir(directory: str, mode: int) -> None:
    """Give the directory we just made ``mode`` through an fd opened without following
    a symlink (its name may have been swapped for one since ``mkdir``), and only when
    the fd shows our own directory."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(directory, flags)
    except OSError as exc:
        raise ConfigError(
            f"cannot create {directory}: it was replaced as it was made ({exc.strerror})"
        ) from exc
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise ConfigError(
                f"cannot create {directory}: it was replaced as it was made (now it belongs "
                f"to {owner_name(os.fstat(fd).st_uid)})"
            )
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def refuse_open_to_all(path: str, is_dir: bool) -> None:
    try:
        status = os.lstat(path)
    except OSError:
        return  # what is missing or unreadable, opening tells
    problem = world_writable(status, is_dir)
    if problem:
        raise ConfigError(f"{path} {problem}: refusing to use it as a store")


def world_writable(status: os.stat_result, is_dir: bool) -> str | None:
    """Why anyone may change what a file (or a directory's entries) says, or None."""
    mode = stat.S_IMODE(status.st_mode)
    if not mode & stat.S_IWOTH or (is_dir and mode & stat.S_ISVTX):
        return None
    return (
        f"is writable by every user (mode {mode:04o}): anyone could forge or remove leases "
        f"(chmod o-w; share it with a group instead: ?mode=0660)"
    )


def create_file(path: str, file_mode: int) -> os.stat_result:
    """Create the store file with ``file_mode`` (whatever the umask; SQLite gives its
    -wal and -shm files the same), or check the one there; its status."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, file_mode)
    except FileExistsError:
        return check_existing(path, file_mode)
    except OSError as exc:
        raise ConfigError(f"cannot create {path}: {exc.strerror}") from exc
    try:
        os.fchmod(fd, file_mode)
        return os.fstat(fd)
    finally:
        os.close(fd)


def check_existing(path: str, file_mode: int) -> os.stat_result:
    status = os.lstat(path)
    if stat.S_ISLNK(status.st_mode):
        raise ConfigError(
            f"{path} is a symlink: refusing to use it as a store (it may be another "
            f"application's database); name the file itself"
        )
    if not stat.S_ISREG(status.st_mode):
        raise ConfigError(f"{path} is not a regular file: refusing to use it as a store")
    problem = world_writable(status, is_dir=False)
    if problem:
        raise ConfigError(f"{path} {problem}: refusing to use it as a store")
    if file_mode == PRIVATE_MODE and status.st_uid not in (0, os.geteuid()):
        raise ConfigError(
            f"{path} belongs to {owner_name(status.st_uid)}, who can change every lease in "
            "it: a private store must be yours (for a store shared with a group, add "
            "?mode=0660 to the URL)"
        )
    if file_mode != PRIVATE_MODE:
        refuse_foreign_shared(path, status)
    return status


def sharing_group(directory: str) -> int:
    """The group a file made in ``directory`` gets: the directory's when it is setgid,
    else our effective group."""
    status = os.stat(directory)
    return status.st_gid if status.st_mode & stat.S_ISGID else os.getegid()


def refuse_foreign_shared(path: str, status: os.stat_result) -> None:
    """Refuse a group-shared store of the wrong group or owner.

    A group-shared store is used only when two things hold:

    - its group is the one a store made there would be shared with;
    - its owner is us, root or a member of that group.

    Anyone else's file (made in /tmp in advance) would share our leases with whom they
    chose."""
    directory = paths.parent(path)
    group = sharing_group(directory)
    if status.st_gid != group:
        raise ConfigError(
            f"{path} is of group {group_name(status.st_gid)}, not {group_name(group)}, the "
            f"group a store made in {directory} is shared with: refusing to share leases with "
            f"another group (chgrp it, or make {directory} the group's and setgid: chmod 2770)"
        )
    if status.st_uid not in (0, os.geteuid()) and not is_member(status.st_uid, group):
        raise ConfigError(
            f"{path} belongs to {owner_name(status.st_uid)}, who is not a member of its "
            f"group {group_name(group)}: refusing to use a shared store that someone outside "
            "the group controls"
        )
