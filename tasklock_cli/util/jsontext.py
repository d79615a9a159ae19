"""``json.dumps`` and ``json.loads`` on the standard library's C accelerator ``_json``, without
importing the ``json`` package: that one imports ``re`` (with ``enum``, ~3 ms of a start) for
patterns the C code does not need. The output and the values read are the json module's, byte
for byte: the same C encoder and scanner, set up as ``json.dumps``/``json.loads`` set them up.
What is not covered here is handed to the json module itself: ``indent``, ``cls`` and other
keywords, bytes to read, any text that is not valid JSON (so its error is json's own), and an
interpreter without ``_json``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

try:
    import _json
except ImportError:  # an interpreter without the accelerator: json's own code, then
    ACCELERATED = False
else:
    ACCELERATED = True

#: json.loads's NaN, Infinity and -Infinity (JSONDecoder's parse_constant).
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
_WHITESPACE = " \t\n\r"  # json.decoder.WHITESPACE


def _not_serializable(o: object) -> object:
    """``JSONEncoder.default``: what json.dumps raises for an object it cannot write."""
    raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")


def dumps(
    obj: object,
    *,
    skipkeys: bool = False,
    ensure_ascii: bool = True,
    check_circular: bool = True,
    allow_nan: bool = True,
    separators: tuple[str, str] | None = None,
    default: Callable[[Any], object] | None = None,
    sort_keys: bool = False,
    **other: Any,
) -> str:
    """``json.dumps(obj, ...)``, for the keywords above; any other (``indent``, ``cls``...)
    is json's."""
    if other or not ACCELERATED:
        import json

        return json.dumps(
            obj,
            skipkeys=skipkeys,
            ensure_ascii=ensure_ascii,
            check_circular=check_circular,
            allow_nan=allow_nan,
            separators=separators,
            default=default,
            sort_keys=sort_keys,
            **other,
        )
    encode_string = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    if isinstance(obj, str):  # as JSONEncoder.encode
        return encode_string(obj)
    item_separator, key_separator = separators or (", ", ": ")
    encode = _json.make_encoder(
        {} if check_circular else None,
        default or _not_serializable,
        encode_string,
        None,  # indent
        key_separator,
        item_separator,
        sort_keys,
        skipkeys,
        allow_nan,
    )
    return "".join(encode(obj, 0))


class _Reading:
    """What ``_json.make_scanner`` reads of a ``JSONDecoder()``: its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


#: The scanner json.loads uses. (Where it meets what is not JSON, it raises before json.decoder
#: is imported: a SystemError, ``returned NULL without setting an exception``; json says why.)
_scan = _json.make_scanner(_Reading()) if ACCELERATED else None  # type: ignore[arg-type]


def loads(text: str | bytes | bytearray) -> Any:
    """``json.loads(text)``: a str that is valid JSON is read here; anything else by json
    (which raises its own error for what is not JSON)."""
    if _scan is not None and isinstance(text, str):
        at = _whitespace_end(text, 0)
        try:
            value, end = _scan(text, at)
        except Exception:  # not JSON (StopIteration, ValueError...): json says why
            pass
        else:
            if _whitespace_end(text, end) == len(text):
                return value
    import json

    return json.loads(text)


def _whitespace_end(text: str, at: int) -> int:
    while at < len(text) and text[at] in _WHITESPACE:
        at += 1
    return at
