"""PyMySQL, imported without what a plain run never uses.

PyMySQL's import brings modules that a run without TLS, a password hash or an option file
never touches. Together they are a third of PyMySQL's import (callgrind, Python 3.11):

- ``ssl``, which loads OpenSSL (~5 M instructions);
- ``traceback`` (with linecache, tokenize, textwrap: ~11 M), for one message of a failed
  connect;
- ``hashlib`` (OpenSSL's libcrypto: ~11 M), for the password scrambles;
- ``configparser`` (~8 M), through ``pymysql.optionfile``, for ``read_default_file``;
- ``getpass`` (with termios: ~1.5 M), for the default user's name from the environment.

So the store imports PyMySQL through this module, which hides them from that one import:

- ``ssl`` is hidden (``import ssl`` fails), so PyMySQL reads as built without it, in the
  `tasklock` command's own process only (``util.own_process``): a program using the Python
  API may make TLS connections of its own with PyMySQL.
  ``enable_ssl`` hands PyMySQL the module once a connection needs TLS: with ``ssl_*=`` in
  the URL, or with a server that offers TLS (see ``connection._PreferredTLS``).
- ``traceback``, ``hashlib``, ``getpass`` and ``pymysql.optionfile`` are stand-ins
  (``util.lazy.StandIn``): whatever PyMySQL asks of one imports the real module then and hands
  over its answer.
  PyMySQL keeps the stand-in; everyone else imports the real module as usual.

Import PyMySQL's names from here, never from ``pymysql`` itself: whichever module of the
store is imported first must not load it with all of that.
Where PyMySQL is already loaded, nothing is hidden; neither is ``ssl`` where it is loaded,
nor a module loaded already. Should a PyMySQL not import with the stand-ins, it is imported
again as it is.
"""

from __future__ import annotations

import os
import sys

from tasklock_cli.util.lazy import StandIn
from tasklock_cli.util.lazy import real_module

#: What PyMySQL's import gets as a stand-in: the module, and the names the stand-in answers
#: itself (those PyMySQL reads while it is imported), set on each as functions.
_DEFERRED = ("traceback", "hashlib", "getpass", "pymysql.optionfile")


def _hash(name: str, data: bytes = b"", **kwargs: object) -> object:
    """``hashlib.new``, which PyMySQL binds when it is imported (``partial``)."""
    return real_module("hashlib").new(name, data, **kwargs)


def _user_name() -> str:
    """``getpass.getuser()``, which PyMySQL calls when it is imported, as getpass reads it:
    the environment's name, else the password database's (whose KeyError PyMySQL takes for
    no default user, as it takes getpass's KeyError or OSError)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        user = os.environ.get(name)
        if user:
            return user
    import pwd

    return pwd.getpwuid(os.getuid())[0]


def _option_file_parser(**kwargs: object) -> object:
    """``pymysql.optionfile.Parser()``, for a ``read_default_file`` (never the store's)."""
    return real_module("pymysql.optionfile").Parser(**kwargs)


def _stand_ins() -> dict[str, StandIn]:
    stand_ins = {name: StandIn(name) for name in _DEFERRED if name not in sys.modules}
    if "hashlib" in stand_ins:
        stand_ins["hashlib"].new = _hash  # type: ignore[attr-defined]
    if "getpass" in stand_ins:
        stand_ins["getpass"].getuser = _user_name  # type: ignore[attr-defined]
    if "pymysql.optionfile" in stand_ins:
        stand_ins["pymysql.optionfile"].Parser = _option_file_parser  # type: ignore[attr-defined]
    return stand_ins


def _import_lean() -> None:
    if "pymysql" in sys.modules:
        return
    import tasklock_cli.util as util

    hidden = {"ssl": None} if "ssl" not in sys.modules and util.own_process else {}
    stand_ins = _stand_ins()
    sys.modules.update(hidden)  # type: ignore[arg-type]  # None: `import ssl` raises ImportError
    sys.modules.update(stand_ins)
    try:
        import pymysql.connections  # noqa: F401
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "pymysql":
            raise  # not installed: once is enough (the store's error names the package)
        _forget_pymysql()
    except Exception:  # a PyMySQL that does not take the stand-ins: imported as it is below
        _forget_pymysql()
    finally:
        for name, module in (*hidden.items(), *stand_ins.items()):
            if sys.modules.get(name, module) is module:
                sys.modules.pop(name, None)


def _forget_pymysql() -> None:
    for name in [name for name in sys.modules if name.partition(".")[0] == "pymysql"]:
        del sys.modules[name]


_import_lean()

import pymysql  # noqa: E402
import pymysql.connections  # noqa: E402
from pymysql.charset import charset_by_name  # noqa: E402
from pymysql.constants import CLIENT  # noqa: E402
from pymysql.constants import COMMAND  # noqa: E402

__all__ = ["CLIENT", "COMMAND", "charset_by_name", "enable_ssl", "pymysql"]


def enable_ssl() -> None:
    """Give PyMySQL the ``ssl`` module, loading it (a TLS connection is about to be made)."""
    import ssl

    connections = pymysql.connections
    if not connections.SSL_ENABLED:
        connections.ssl = ssl
        connections.SSL_ENABLED = True
