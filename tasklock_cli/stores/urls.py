"""Store URLs: the default one, and keeping their passwords out of everything shown."""

from __future__ import annotations

import os
import re

from tasklock_cli.errors import ConfigError
from tasklock_cli.util import paths

# urllib.parse (with ipaddress, ~3 ms) and pathlib are not imported on `run`'s path: a plain
# sqlite:///PATH is taken apart here; other URLs import them when they need them.


def xdg_home(variable: str, *fallback: str) -> str:
    """``$variable`` when it is an absolute path (the XDG spec ignores a relative one),
    else ``~/fallback``."""
    value = os.environ.get(variable, "")
    return value if value.startswith("/") else paths.joined(paths.home(), *fallback)


def default_sqlite_file() -> str:
    """The default store's file: ``$XDG_STATE_HOME/tasklock/locks.db``."""
    return paths.joined(xdg_home("XDG_STATE_HOME", ".local", "state"), "tasklock", "locks.db")


def sqlite_url(path: str | os.PathLike) -> str:
    """``sqlite:///ABS/PATH.db``: the path's own leading slash is the URL's third."""
    text = paths.normal(path)
    return f"sqlite://{text}" if text.startswith("/") else f"sqlite:///{text}"


def default_store_url() -> str:
    return sqlite_url(default_sqlite_file())


_PLAIN_SQLITE = "sqlite:///"
_NOT_PLAIN = frozenset("?#%\t\r\n")  # what urlsplit and unquote would take out or change


def url_scheme(url: str) -> str:
    """``urlsplit(url).scheme.lower()``."""
    if url.startswith(_PLAIN_SQLITE):
        return "sqlite"
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).scheme.lower()
    except ValueError:  # malformed past the scheme: the store reports it
        return url.partition(":")[0].lower()


def url_syntax_problem(url: str) -> str | None:
    """What makes ``url`` unreadable as a URL at all (an unclosed ``[``, say), or None."""
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


def check_host(store: str, url: str, host: str) -> None:
    """ConfigError when ``host`` (from ``url``, of the ``store``) is no name a look-up
    could take: Python's resolver encodes it with the ``idna`` codec, which refuses an empty
    label or one of 64+ characters (a UnicodeError deep inside a connect, else).
    A socket path (``/...``) is no host name and passes."""
    if not host or host.startswith("/"):
        return
    try:
        host.encode("idna")
    except UnicodeError as exc:
        reason = str(exc.__cause__ or exc).removeprefix("encoding with 'idna' codec failed ")
        raise ConfigError(
            f"{store} store URL {redact_url(url)!r}: {host[:80]!r} is not a valid host name "
            f"({reason.strip('()')}; each dot-separated label is 1 to 63 characters)"
        ) from None


def url_parameters(url: str) -> dict[str, str]:
    """The query parameters of a URL, the last of each name winning (none: ``{}``)."""
    if "?" not in url:
        return {}
    from urllib.parse import parse_qsl
    from urllib.parse import urlsplit

    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


_PASSWORD_IN_CONNINFO = re.compile(r"(password\s*=\s*)(\S+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (userinfo, ``?password=`` or conninfo).
    Split by hand, not by urlsplit: a URL that urlsplit refuses (an unclosed ``[``) is
    still shown in the error that says so, and must not show its password there."""
    redacted = _PASSWORD_IN_CONNINFO.sub(r"\1***", url)
    scheme, netloc, rest = _scheme_netloc_rest(redacted, _USERINFO_ENDS)
    userinfo, at, hostinfo = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return redacted
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hostinfo}{rest}"


def split_url(url: str) -> tuple[str, str, str, str]:
    """The scheme (lower case), netloc, path and query of ``url``, as urlsplit gives them.

    urlsplit's checks of the netloc are left out.
    Some Python versions' urlsplit refuse a list of hosts with a bracketed IPv6 address
    after the first: Debian 12's 3.11.2 does."""
    scheme, netloc, rest = _scheme_netloc_rest(url, "/?#")
    rest = rest.partition("#")[0]
    path, _, query = rest.partition("?")
    return scheme.lower(), netloc, path, query


#: Where a netloc ends when it is read for its password: not at a ``#``, which a password
#: written unencoded may hold (urlsplit would cut there, and show the rest).
_USERINFO_ENDS = "/?"


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
    """The password of a URL's userinfo, as written and decoded (empty set when none)."""
    userinfo = _scheme_netloc_rest(url, _USERINFO_ENDS)[1].rpartition("@")[0]
    if ":" not in userinfo:
        return set()
    raw = userinfo.split(":", 1)[1]
    from urllib.parse import unquote

    return {secret for secret in (raw, unquote(raw)) if secret}


def scrub(text: object, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` (longest first) replaced by ``***``."""
    out = str(text)
    for secret in sorted(secrets, key=len, reverse=True):
        out = out.replace(secret, "***")
    return out
