"""How the tests and the bench get a store: the record every store package declares as
``PROVISIONING`` in its ``provision`` module (``registry.provisioning(name)`` reads it).

``tests/conftest.py``, ``tests/support/services.py``, ``tests/test_round_trips.py`` and
``bench/stores.py`` read these records instead of naming stores, so a new store's tests and
bench come with its package. Never imported on ``run``'s path: only tests and the bench
need it (``tests/test_fastrun.py``).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit


@dataclass(frozen=True)
class RoundTrips:
    """The round trips each lease operation takes on the store's connection, counted at a
    TCP proxy once the connection is warm (``tests/test_round_trips.py``)."""

    #: acquire, renew, a refused acquire, release (and a woken waiter's acquire).
    each: int = 1
    #: ``peek`` (etcd: 2, a key does not carry its lease's remaining time).
    peek: int = 1
    #: ``stop_waiting`` after one refused acquire and one wait: 0 where that keeps no
    #: place on the store to give up (Redis, MySQL), 1 where it does (PostgreSQL's turn
    #: and LISTEN, etcd's place).
    stop_waiting: int = 1
    #: A new connection's set-up after the driver's handshake (session settings).
    set_up: int = 1
    #: True where a key's next token is the last one + 1 (etcd's are global revisions).
    consecutive_tokens: bool = True


#: (base, name) -> URL. ``base`` is the server's URL, or for a store without a server the
#: directory the URL's files may go in; ``name`` is unique to the test or bench namespace.
UrlMaker = Callable[[str, str], str]


@dataclass(frozen=True)
class Server:
    """The server a store's tests and bench use: what it is ("PostgreSQL server"), the
    environment variable naming its URL, and the URL without it (None where the tests
    start a private one: ``private``)."""

    what: str
    url_env: str
    default_url: str | None = None
    #: Its port when the URL has none.
    default_port: int = 0
    #: The tests' module (``tests/support/<name>.py``) with ``base_url()`` and
    #: ``unavailable_reason()``, where the tests start a private server of their own
    #: unless ``url_env`` names one (etcd); the program it runs, which the bench starts too.
    private: str | None = None
    binary: str | None = None


@dataclass(frozen=True)
class Provisioning:
    """A store as tests and the bench get it: its server, a URL naming a fresh namespace
    on it, why its tests cannot run here, the cleanup, the round trips. The bench's URL is
    ``namespace_url`` on the same server (``base_url()``; for a store with a private
    server, one the bench starts)."""

    #: What must run for its tests; None for a store in a file or in this process: its
    #: tests are ``quick`` unless marked otherwise.
    server: Server | None
    #: A fresh namespace (a table, a key prefix, a file) named ``name``: a test's, or the
    #: bench's (``name`` then starts with ``tlbench_`` and the bench run's id).
    namespace_url: UrlMaker
    #: Drop what a namespace's URL left behind.
    cleanup: Callable[[str], object]
    #: The driver's handshake alone on a URL (connect and close), where it has one: the
    #: round trips a new connection costs before tasklock's set-up.
    handshake: Callable[[str], None] | None = None
    round_trips: RoundTrips = RoundTrips()

    @property
    def private_server(self) -> str | None:
        return self.server.private if self.server else None

    def base_url(self) -> str:
        """The test server's URL, ``url_env`` first (for a store with a private server, the
        tests ask its module instead)."""
        if self.server is None or self.server.default_url is None:
            raise ValueError("this store has no server of its own beside the tests")
        return os.environ.get(self.server.url_env, self.server.default_url)

    def unreachable(self, url: str) -> str | None:
        """Why the server of ``url`` cannot be reached over TCP, or None."""
        assert self.server is not None
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or self.server.default_port
        try:
            socket.create_connection((host, port), timeout=2).close()
        except OSError as exc:
            return f"no {self.server.what} at {host}:{port} ({exc.strerror or exc})"
        return None


def parameter(name: str, suffix: str = "") -> UrlMaker:
    """A namespace as one URL parameter: ``table=NAME``, ``prefix=NAME:``."""
    return lambda base, namespace: with_query(base, **{name: namespace + suffix})


def with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` added to its query."""
    separator = "&" if "?" in url else "?"
    return url + separator + "&".join(f"{k}={v}" for k, v in params.items())


def unlink_files(path: str, suffixes: tuple[str, ...]) -> None:
    """Remove ``path`` + each suffix that exists (a store file and what sits beside it)."""
    for suffix in suffixes:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)
