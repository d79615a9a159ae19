"""The one sanitiser for text that came from the store or another user: keys, notes, users,
hosts, commands. Every renderer and message uses it.

- ``safe``: control characters (C0, DEL, C1), line and paragraph separators, bidi controls
  and lone surrogates (bytes that were not UTF-8) are shown as Python escapes (``\\x1b``,
  ``\\u202e``, ``\\udcff``). Another holder's note cannot move the cursor, set the terminal's
  title or reorder what is shown.
- Markup is the renderer's business: rich output takes these strings as ``Text``, never as
  markup.
- ``recordable``: arguments that are not UTF-8, recorded losslessly as valid UTF-8.
- ``json_text``: JSON with the same characters as ``\\u`` escapes, so it stays valid JSON
  (a raw ``\\x7f`` is not) and shows nothing raw.
"""

from __future__ import annotations

#: Bidi embeddings, overrides, isolates and marks (Unicode's Bidi_Control), and the
#: line and paragraph separators.
_ESCAPED_FORMAT = frozenset(
    (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
)
_SHORT = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escaped(code: int) -> bool:
    return (
        code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF or code in _ESCAPED_FORMAT
    )


def _escape(code: int) -> str:
    if code in _SHORT:
        return _SHORT[code]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """``text`` as it may be shown on a terminal or in a log line."""
    out = str(text)
    if out.isascii() and out.isprintable():  # the common case, in one pass of C
        return out
    return "".join(_escape(ord(char)) if _escaped(ord(char)) else char for char in out)


def safe_lines(text: str) -> str:
    """``text`` (a traceback) with each line escaped as ``safe`` escapes one, the line
    breaks kept: a server's error text inside it reaches the terminal as escapes, never
    raw, as everything else tasklock prints."""
    return "".join(safe(line) + "\n" for line in text.splitlines())


def recordable(arg: str) -> str:
    """A command-line argument as the store keeps it.

    - It is unchanged when it is UTF-8.
    - Else Python carries the bytes that are not UTF-8 as lone surrogates.
      Then its backslashes are doubled, and each such byte becomes ``\\xNN``.
      So it is valid UTF-8 and loses nothing."""
    try:
        arg.encode("utf-8")
    except UnicodeEncodeError:
        raw = arg.encode("utf-8", "surrogateescape").replace(b"\\", b"\\\\")
        return raw.decode("utf-8", "backslashreplace")
    return arg


#: What ``json.dumps(..., ensure_ascii=False)`` leaves raw but no terminal or log may see:
#: DEL, C1, the bidi controls, the line and paragraph separators and lone surrogates.
_JSON_ESCAPED = None


def _json_escaped():
    global _JSON_ESCAPED
    if _JSON_ESCAPED is None:
        import re

        formats = "".join(chr(code) for code in sorted(_ESCAPED_FORMAT))
        _JSON_ESCAPED = re.compile(f"[\x7f-\x9f\ud800-\udfff{formats}]")
    return _JSON_ESCAPED


def json_text(value: object, **options) -> str:
    """``json.dumps(value, ensure_ascii=False)`` with what ``safe`` escapes written as
    ``\\uXXXX`` escapes too (json escapes C0 itself): valid JSON, valid UTF-8, and nothing
    raw that could reach a terminal. (These characters only ever occur inside strings.)"""
    from tasklock_cli.util import jsontext

    text = jsontext.dumps(value, ensure_ascii=False, **options)
    if text.isascii():
        return text
    return _json_escaped().sub(lambda match: f"\\u{ord(match.group()):04x}", text)
