"""Lock keys are stored exactly as given; only what no store or terminal can carry is refused."""

from __future__ import annotations

from tasklock_cli.errors import UsageError

MAX_KEY_BYTES = 512


def validate_key(key: str, forged: bool = False) -> str:
    """``key`` when tasklock may use it; UsageError naming why not.

    ``forged``: a key that is not UTF-8 is taken too (its bytes are carried as lone
    surrogates, as Python reads them from the command line). No run makes one, but a
    writer of the store can: ``peek``, ``history`` and ``release --force`` reach it."""
    if not key.strip():
        raise UsageError("the lock key is empty" if not key else "the lock key is blank")
    try:
        encoded = key.encode("utf-8", "surrogateescape" if forged else "strict")
    except UnicodeEncodeError:
        raise UsageError("the lock key is not valid UTF-8") from None
    if len(encoded) > MAX_KEY_BYTES:
        raise UsageError(f"the lock key is {len(encoded)} bytes long; the limit is {MAX_KEY_BYTES}")
    if key.isprintable():  # no control character (Cc) is printable: most keys end here
        return key
    import unicodedata  # ~0.3 ms of a start: only for keys that need it

    for char in key:
        if unicodedata.category(char) == "Cc":
            raise UsageError(f"the lock key contains a control character ({ord(char):#04x})")
    return key


def is_utf8(key: str) -> bool:
    """Whether ``key`` is text, not bytes that are not UTF-8 (carried as lone surrogates:
    a key forged into the store, read back with ``surrogateescape``)."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def key_bytes(key: str) -> bytes:
    """The bytes of ``key`` as a store keeps them (those that are not UTF-8 included)."""
    return key.encode("utf-8", "surrogateescape")


def stored_key(key: str) -> str | bytes:
    """``key`` as a driver binds it: the text, or the bytes of a key that is not UTF-8
    (which the driver could not encode)."""
    return key if is_utf8(key) else key_bytes(key)
