"""Store URLs: the default one, and keeping their passwords out of everything shown."""

from __future__ import annotations

import os

from tasklock_cli.errors import ConfigError
from tasklock_cli.util import paths

# urllib.parse (with ipaddress, ~3 ms) and pathlib are not imported on `run`'s path: a plain
# sqlite:///PATH is taken apart here; other URLs import them when they need them. Nor is re
# (~2 ms with its compiles): only a URL's error message and its passwords' scrubbing use the
# patterns below, compiled then.

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re


def default_sqlite_file() -> str:
    """The default store's file: ``$XDG_STATE_HOME/tasklock/locks.db``."""
    return paths.joined(paths.xdg_home("XDG_STATE_HOME", ".local", "state"), "tasklock", "locks.db")


def sqlite_url(path: str | os.PathLike) -> str:
    """``sqlite:///ABS/PATH.db``: the path's own leading slash is the URL's third."""
    text = paths.normal(path)
    return f"sqlite://{text}" if text.startswith("/") else f"sqlite:///{text}"


def default_store_url() -> str:
    return sqlite_url(default_sqlite_file())


_PLAIN_SQLITE = "sqlite:///"
_NOT_PLAIN = frozenset("?#%\t\r\n")  # what urlsplit and unquote would take out or change


#: What a URL's scheme is made of (urllib.parse's ``scheme_chars``).
_SCHEME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+-.")


def url_scheme(url: str) -> str:
    """``urlsplit(url).scheme.lower()``."""
    if url.startswith(_PLAIN_SQLITE):
        return "sqlite"
    scheme, sep, _ = url.partition("://")
    if sep and scheme[:1].isalpha() and _SCHEME_CHARS.issuperset(scheme):
        return scheme.lower()  # what urlsplit finds there (nothing before it to strip)
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).scheme.lower()
    except ValueError:  # malformed past the scheme: the store reports it
        return url.partition(":")[0].lower()


def url_syntax_problem(url: str) -> str | None:
    """What makes ``url`` unreadable as a URL at all (an unclosed ``[``, say), or None."""
    if url.isascii() and "[" not in url and "]" not in url:
        return None  # urlsplit refuses only brackets, and a netloc that is not ASCII
    from urllib.parse import urlsplit

    try:
        urlsplit(url)
    except ValueError as exc:
        return str(exc)
    return None


def sqlite_netloc_and_path(url: str) -> tuple[str, str]:
    """``urlsplit(url).netloc`` and the ``unquote``d ``urlsplit(url).path``."""
    if url.startswith(_PLAIN_SQLITE) and not _NOT_PLAIN.intersection(url):
        return "", url[len(_PLAIN_SQLITE) - 1 :]
    from urllib.parse import unquote
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.netloc, unquote(parts.path)


def unknown_parameter(store: str, url: str, name: str, known: str) -> ConfigError:
    """The one wording, on every store, of a URL parameter the store does not take."""
    return ConfigError(
        f"{store} store URL {redact_url(url)!r}: unknown parameter {name!r} ({known})"
    )


def host_problem(host: str) -> str | None:
    """Why ``host`` is no name a look-up could take, or None (a socket path, ``/...``, is
    no host name and passes): Python's resolver encodes it with the ``idna`` codec, which
    refuses an empty label or one of 64+ characters (a UnicodeError deep inside a
    connect, else)."""
    if not host or host.startswith("/"):
        return None
    if host.isascii():  # the codec's own test of an ASCII name, without its import (~5 M
        # instructions: encodings.idna, stringprep, unicodedata)
        *labels, last = host.split(".")
        if all(0 < len(label) < 64 for label in labels) and len(last) < 64:
            return None
    try:
        host.encode("idna")
    except UnicodeError as exc:
        reason = str(exc.__cause__ or exc).removeprefix("encoding with 'idna' codec failed ")
        return (
            f"{host[:80]!r} is not a valid host name ({reason.strip('()')}; each "
            "dot-separated label is 1 to 63 characters)"
        )
    return None


def check_host(store: str, url: str, host: str) -> None:
    """ConfigError when ``host`` (from ``url``, of the ``store``) is no name a look-up
    could take (``host_problem``)."""
    problem = host_problem(host)
    if problem:
        raise ConfigError(f"{store} store URL {redact_url(url)!r}: {problem}")


def url_parameters(url: str) -> dict[str, str]:
    """The query parameters of a URL, the last of each name winning (none: ``{}``)."""
    if "?" not in url:
        return {}
    from urllib.parse import urlsplit

    return query_parameters(urlsplit(url).query)


class _Patterns:
    """The patterns of a URL's passwords, compiled on first use (``_Patterns.compiled()``)."""

    _compiled: _Patterns | None = None

    def __init__(self) -> None:
        import re

        #: A conninfo's ``password=VALUE``, the value bare or in libpq's single quotes
        #: (which may hold spaces and ``\'``; an unclosed quote runs to the end).
        self.password_in_conninfo = re.compile(
            r"(password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S+)", re.IGNORECASE
        )
        #: A URL's query parameter, ``NAME=VALUE`` after ``?`` or ``&``.
        self.parameter = re.compile(r"([?&])([^=&#]*)=([^&#]*)")
        #: Where a query parameter starts: what ends a userinfo's search for its ``@``.
        self.parameter_start = re.compile(r"[?&][\w%.+-]+=")
        #: What may cut a password that is not percent-encoded (``url_passwords``).
        self.password_cut = re.compile("[/?#]")

    @classmethod
    def compiled(cls) -> _Patterns:
        if cls._compiled is None:
            cls._compiled = cls()
        return cls._compiled


#: The shortest piece of a password that is scrubbed on its own (see ``url_passwords``).
MIN_PIECE = 3


def is_password_parameter(name: str) -> bool:
    """Whether a query parameter's name (as written: ``pass%77ord`` is libpq's and
    redis-py's ``password``) names a password: ``password``, ``sentinel_password``,
    ``sslpassword``."""
    return unquote_plus(name).strip().lower().endswith("password")


def query_parameters(query: str) -> dict[str, str]:
    """``dict(urllib.parse.parse_qsl(query, keep_blank_values=True))``, without importing
    urllib.parse where nothing is percent-encoded (``unquote``)."""
    pairs = (part.partition("=") for part in query.split("&") if part)
    return {unquote_plus(name): unquote_plus(value) for name, _, value in pairs}


def unquote(text: str) -> str:
    """``urllib.parse.unquote(text)``, imported only for a text that has a ``%`` to decode
    (urllib.parse brings ipaddress: ~10 M instructions of a start)."""
    if "%" not in text:
        return text
    from urllib.parse import unquote as decoded

    return decoded(text)


def unquote_plus(text: str) -> str:
    """``urllib.parse.unquote_plus(text)``, imported only for a ``%`` to decode."""
    return unquote(text.replace("+", " "))


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***``: the userinfo's, a ``?...password=``
    parameter's (its name percent-encoded or not), a conninfo's ``password=``.

    Split by hand, not by urlsplit: a URL that urlsplit refuses (an unclosed ``[``) is
    still shown in the error that says so, and must not show its password there. The
    userinfo ends where ``_userinfo_end`` says, so a password with an unencoded ``/``,
    ``?`` or ``#`` is hidden whole."""
    patterns = _Patterns.compiled()
    redacted = patterns.password_in_conninfo.sub(r"\1***", url)
    redacted = patterns.parameter.sub(_redacted_parameter, redacted)
    scheme, sep, after = redacted.partition("://")
    at = _userinfo_end(after) if sep else -1
    if at < 0 or ":" not in after[:at]:
        return redacted
    user = after[:at].split(":", 1)[0]
    return f"{scheme}://{user}:***@{after[at + 1 :]}"


def _redacted_parameter(match: re.Match[str]) -> str:
    mark, name, value = match.groups()
    return f"{mark}{name}=***" if value and is_password_parameter(name) else match.group()


def _userinfo_end(after: str) -> int:
    """The index of the ``@`` that ends the userinfo of ``after`` (a URL past its
    ``://``), or -1 when it has none.

    It is the last ``@`` before the query's first ``NAME=`` (a parameter's value may hold
    an ``@``), not only before the first ``/``, ``?`` or ``#``: a password may hold those
    unencoded (libpq takes ``?`` and ``#`` there), and urlsplit would cut it short and
    show the rest. A "user" holding ``/``, ``?`` or ``#`` is a path (``sqlite:///a:b@c``):
    then only the netloc's own ``@`` counts."""
    end = min((at for at in (after.find(mark) for mark in "/?#") if at >= 0), default=len(after))
    parameter = _Patterns.compiled().parameter_start.search(after, end)
    at = after.rfind("@", 0, parameter.start() if parameter else len(after))
    if at >= 0 and not any(mark in after[:at].partition(":")[0] for mark in "/?#"):
        return at
    return after.rfind("@", 0, end)


def split_url(url: str) -> tuple[str, str, str, str]:
    """The scheme (lower case), netloc, path and query of ``url``, as urlsplit gives them.

    urlsplit's checks of the netloc are left out.
    Some Python versions' urlsplit refuse a list of hosts with a bracketed IPv6 address
    after the first: Debian 12's 3.11.2 does."""
    scheme, netloc, rest = _scheme_netloc_rest(url, "/?#")
    rest = rest.partition("#")[0]
    path, _, query = rest.partition("?")
    return scheme.lower(), netloc, path, query


def _scheme_netloc_rest(url: str, ends: str) -> tuple[str, str, str]:
    """``url`` cut after its scheme and after its netloc (which ends at the first of
    ``ends``); the netloc is empty where there is no ``://``."""
    scheme, sep, after = url.partition("://")
    if not sep:
        return "", "", url
    found = [at for at in (after.find(mark) for mark in ends) if at >= 0]
    end = min(found, default=len(after))
    return scheme, after[:end], after[end:]


def url_passwords(url: str) -> set[str]:
    """Every password in ``url``, as written and decoded, for ``scrub`` (empty set when
    none): the userinfo's, password parameters' (``is_password_parameter``), a conninfo's.

    A password with an unencoded ``/``, ``?`` or ``#`` also gives its pieces between
    them (of ``MIN_PIECE`` characters or more): a driver that split the URL there quotes
    a piece in its error (``invalid port 'PW1a'``)."""
    patterns = _Patterns.compiled()
    found: set[str] = set()
    pieces: list[str] = []
    _, sep, after = url.partition("://")
    at = _userinfo_end(after) if sep else -1
    if at >= 0 and ":" in after[:at]:
        raw = after[:at].split(":", 1)[1]
        found |= {raw, unquote(raw)}
        pieces = patterns.password_cut.split(raw)
    for _, name, value in patterns.parameter.findall(url):
        if is_password_parameter(name):
            found |= {value, unquote_plus(value)}
    for _, value in patterns.password_in_conninfo.findall(url):
        found |= {value, value.strip("'").replace("\\'", "'")}
    found |= {piece for piece in pieces if len(piece) >= MIN_PIECE}
    return found - {""}


def scrub(text: object, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` (longest first) replaced by ``***``."""
    out = str(text)
    for secret in sorted(secrets, key=len, reverse=True):
        out = out.replace(secret, "***")
    return out
