"""pathlib's answers on plain strings, for `run`'s path.

``import pathlib`` brings in ``urllib.parse`` (and with it ``ipaddress``), ``fnmatch`` and
``ntpath``: about 4 ms of every `tasklock run`. These functions give the text ``str()`` of the
same ``PurePosixPath`` would give, and ``is_file`` the answer ``Path.is_file`` gives.
"""

from __future__ import annotations

import errno
import os
import stat

#: The errors ``Path.is_file`` answers False to; any other ``OSError`` it raises.
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)


def normal(path: str | os.PathLike) -> str:
    """``str(PurePosixPath(path))``: no empty or ``.`` parts, no trailing slash, ``..`` kept;
    two leading slashes stay two (POSIX leaves their meaning to the system), more are one."""
    text = os.fspath(path)
    root = ""
    if text.startswith("/"):
        root = "//" if text.startswith("//") and not text.startswith("///") else "/"
    parts = [part for part in text.split("/") if part and part != "."]
    return root + "/".join(parts) or "."


def joined(base: str | os.PathLike, *names: str) -> str:
    """``str(PurePosixPath(base, *names))`` for names that are single plain parts."""
    text = normal(base)
    for part in names:
        text = part if text == "." else text + part if text.endswith("/") else f"{text}/{part}"
    return text


def parent(path: str) -> str:
    """``str(PurePosixPath(path).parent)`` of a ``normal`` path."""
    head, slash, _ = path.rpartition("/")
    if not slash:
        return "."
    return head if head.strip("/") else path[: len(head) + 1]


def name(path: str) -> str:
    """``PurePosixPath(path).name`` of a ``normal`` path ('' for a root)."""
    return "" if path.strip("/") == "" or path == "." else path.rpartition("/")[2]


def with_name_suffix(path: str, suffix: str) -> str:
    """``str(p.with_name(p.name + suffix))`` for ``p = PurePosixPath(path)`` of a ``normal``
    path (``x.db`` -> ``x.db.waiters``); the same ValueError for a path without a name."""
    if not name(path):
        raise ValueError(f"PosixPath({path!r}) has an empty name")
    return path + suffix  # a normal path ends with its name


def home() -> str:
    """``str(Path.home())``."""
    found = os.path.expanduser("~")
    if found[:1] == "~":
        raise RuntimeError("Could not determine home directory.")
    return normal(found)


def xdg_home(variable: str, *fallback: str) -> str:
    """``$variable`` when it is an absolute path (the XDG spec ignores a relative one),
    else ``~/fallback``: where the config file (``XDG_CONFIG_HOME``) and the default store
    (``XDG_STATE_HOME``) are looked for."""
    value = os.environ.get(variable, "")
    return value if value.startswith("/") else joined(home(), *fallback)


def is_file(path: str) -> bool:
    """``Path(path).is_file()``: False when absent, but other errors (EACCES) raised."""
    return _is_kind(path, stat.S_ISREG)


def is_dir(path: str) -> bool:
    """``Path(path).is_dir()``."""
    return _is_kind(path, stat.S_ISDIR)


def _is_kind(path: str, kind) -> bool:
    try:
        return kind(os.stat(path).st_mode)
    except OSError as exc:
        if exc.errno not in _ABSENT:
            raise
        return False
    except ValueError:
        return False


def make_dir(path: str, parents: bool = False) -> None:
    """``Path(path).mkdir(parents=parents, exist_ok=True)`` of a ``normal`` path, step for
    step."""
    try:
        os.mkdir(path, 0o777)
    except FileNotFoundError:
        if not parents or parent(path) == path:
            raise
        make_dir(parent(path), parents=True)
        make_dir(path)
    except OSError:
        if not is_dir(path):
            raise
