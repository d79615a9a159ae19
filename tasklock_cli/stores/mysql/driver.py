"""PyMySQL, imported without Python's ``ssl`` module.

PyMySQL imports ``ssl`` when it is imported, and ``ssl`` loads OpenSSL.
That costs about 4 ms of CPU on every start, a sixth of PyMySQL's import.
A run whose URL asks for no TLS, on a server that offers none, never uses it.

- So the store imports PyMySQL through this module.
- This module hides ``ssl`` from that one import.
  PyMySQL then reads as built without it.
- ``enable_ssl`` hands PyMySQL the module once a connection needs TLS.
  A connection needs it with ``ssl_*=`` in the URL, or with a server that offers TLS
  (see ``connection._PreferredTLS``).
- Import PyMySQL's names from here, never from ``pymysql`` itself.
  Whichever module of the store is imported first must not load it with ``ssl``.

Where ``ssl`` (or PyMySQL) is already loaded, nothing is hidden: PyMySQL has it as usual.
"""

from __future__ import annotations

import sys


def _import_without_ssl() -> None:
    if "pymysql" in sys.modules or "ssl" in sys.modules:
        return
    sys.modules["ssl"] = None  # type: ignore[assignment]  # `import ssl` raises ImportError
    try:
        import pymysql.connections  # noqa: F401
    finally:
        if "ssl" in sys.modules and sys.modules["ssl"] is None:
            del sys.modules["ssl"]


_import_without_ssl()

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
