"""The Redis names of a lock key's parts (the layout is in docs/design/redis.md)."""

from __future__ import annotations

import re

from tasklock_cli.stores.redis.epochs import EPOCH_RECORD
from tasklock_cli.stores.rows import lenient_text
from tasklock_cli.util.keys import key_bytes

DEFAULT_PREFIX = "tasklock:"
_GLOB_SPECIAL = frozenset(b"*?[]\\^")
#: What follows the prefix's ``{`` in the name of slot N > 0's lease hash.
_SLOT_NAME = re.compile(rb"(.*)\}:lease:([1-9][0-9]*)", re.DOTALL)


def glob_escape(raw: bytes) -> bytes:
    """``raw`` as a literal in a Redis MATCH pattern (every metacharacter backslashed)."""
    out = bytearray()
    for byte in raw:
        if byte in _GLOB_SPECIAL:
            out.append(0x5C)
        out.append(byte)
    return bytes(out)


class RedisKeys:
    """The Redis names of a lock key's parts under the namespace ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.prefix_b = prefix.encode("utf-8")

    def name(self, key: str, role: str) -> bytes:
        """The Redis key of one of a lock key's parts: lease, fence, wake, runs, ..."""
        return self.prefix_b + b"{" + key_bytes(key) + b"}:" + role.encode()

    def epoch_record(self) -> bytes:
        """The namespace's failover epoch record (see ``epochs``): ``P{}:epoch``."""
        return self.prefix_b + EPOCH_RECORD

    def lease(self, key: str, slot: int = 0) -> bytes:
        """Slot 0's hash is the key's lease hash of old; slot N's adds ``:N`` (see
        ``scripts``)."""
        name = self.name(key, "lease")
        return name + b":%d" % slot if slot else name

    def break_channel(self, key: str, token: int | str = "") -> bytes:
        """Where a break of ``key``'s lease with fencing token ``token`` is published
        (without ``token``: the part before it, which the scripts complete)."""
        return self.name(key, "broken:") + str(token).encode()

    def pattern(self, key_prefix: str, role: bytes) -> bytes:
        """A SCAN MATCH pattern for the parts named ``role`` of keys starting with
        ``key_prefix`` (``role`` may end with a glob)."""
        return glob_escape(self.prefix_b + b"{" + key_prefix.encode("utf-8")) + b"*}:" + role

    def slot_of(self, lease_key: bytes) -> tuple[str, int] | None:
        """The lock key and slot of a lease hash's name; None for a name of another part."""
        inner = lease_key[len(self.prefix_b) + 1 :]
        if inner.endswith(b"}:lease"):
            return lenient_text(inner[: -len(b"}:lease")]), 0
        match = _SLOT_NAME.fullmatch(inner)
        if match is None:
            return None
        return lenient_text(match[1]), int(match[2])

    def key_of(self, name: bytes, role: bytes) -> str:
        """The lock key of the name of its part ``role`` (``}:runs``, ``}:waiters``): as
        text, or a ``rows.NotUtf8`` for bytes that are not UTF-8 (one key per byte string,
        read as malformed, never a UnicodeDecodeError)."""
        return lenient_text(name[len(self.prefix_b) + 1 : -len(b"}:" + role)])
