"""The guard's protocol: single datagrams of space-separated words on a SOCK_SEQPACKET
socket pair between the wrapper (``process.Child``) and its guard (``guard``).

- Wrapper to guard, before the command starts: ``env BYTES``..., then ``start TERMINAL_FD
  CLOCK BYTES`` (TERMINAL_FD -1 for none; CLOCK the first backstop, so the command never
  runs without one; BYTES the environment's last part). The guard starts the command with
  the environment it was forked with (``process.Child``), these variables over it.
- Wrapper to guard, while it runs: ``group SIG`` | ``tree SIG`` | ``backstop CLOCK``.
- Guard to wrapper: ``started PID`` | ``error CODE MESSAGE`` | ``stopped SIG`` |
  ``exited STATUS ORPHANS CLOCK`` | ``backstop`` | ``empty``.
- CLOCK is a time on ``util.clock.monotonic``, which both processes share.
"""

from __future__ import annotations

import _socket  # not socket: its enums and selectors cost ~2 ms per start
import os

MESSAGE_SIZE = 4096
#: Part of the command's environment: NUL-separated ``NAME=VALUE`` bytes, in as many orders
#: as it takes (an order is one datagram of at most MESSAGE_SIZE bytes). The start order
#: carries the last part.
ENV_ORDER = b"env "
START_ORDER = b"start "
#: Room kept in an order for its verb and arguments.
ORDER_ROOM = 32
#: Orders: signal the command's process group; signal the whole tree; kill the tree by
#: yourself at this clock time unless told a later one.
ORDER_GROUP = "group"
ORDER_TREE = "tree"
ORDER_BACKSTOP = "backstop"
#: Reports: the command runs; it could not start; it stopped; it exited; the backstop fired;
#: the tree is empty (the guard's last word).
REPORT_STARTED = "started"
REPORT_ERROR = "error"
REPORT_STOPPED = "stopped"
REPORT_EXITED = "exited"
REPORT_BACKSTOP = "backstop"
REPORT_EMPTY = "empty"


def encode(*words: object) -> bytes:
    """One message: the words, space-separated. A word with bytes that are not UTF-8 (a
    command's name, which Python carries as lone surrogates) keeps them: ``decode`` gives
    them back."""
    return " ".join(str(word) for word in words).encode("utf-8", "surrogateescape")


def decode(message: bytes) -> str:
    """A message as ``encode`` wrote it."""
    return message.decode("utf-8", "surrogateescape")


def environ_pieces(env: dict[str, str]) -> list[bytes]:
    """``env`` as NUL-separated ``NAME=VALUE`` bytes, cut to fit orders (at least one)."""
    environ = b"\0".join(os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items())
    room = MESSAGE_SIZE - ORDER_ROOM
    return [environ[at : at + room] for at in range(0, len(environ), room)] or [b""]


def receive(sock: _socket.socket) -> bytes | None:
    """The next message, without waiting: None when none has come, b"" when the other side
    is gone (its last messages are read first)."""
    while True:
        try:
            return sock.recv(MESSAGE_SIZE, _socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except ConnectionResetError:
            # The other side exited with a message of ours unread; its own are still
            # queued behind this error, which is reported only once.
            continue
        except OSError:
            return b""
