"""Store URLs: the default one, and keeping their passwords out of everything shown."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote
from urllib.parse import urlsplit
from urllib.parse import urlunsplit


def default_sqlite_path() -> Path:
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "tasklock" / "locks.db"


def sqlite_url(path: Path) -> str:
    """``sqlite:///ABS/PATH.db``: the path's own leading slash is the URL's third."""
    return f"sqlite://{path}" if path.is_absolute() else f"sqlite:///{path}"


def default_store_url() -> str:
    return sqlite_url(default_sqlite_path())


_PASSWORD_IN_CONNINFO = re.compile(r"(password\s*=\s*)(\S+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (userinfo, ``?password=`` or conninfo)."""
    redacted = _PASSWORD_IN_CONNINFO.sub(r"\1***", url)
    try:
        parts = urlsplit(redacted)
    except ValueError:
        return redacted
    netloc = parts.netloc
    userinfo, at, hostinfo = netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return redacted
    user = userinfo.split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{hostinfo}"))


def url_passwords(url: str) -> set[str]:
    """The password of a URL's userinfo, as written and decoded (empty set when none)."""
    netloc = url.partition("://")[2].split("/", 1)[0].split("?", 1)[0]
    userinfo = netloc.rpartition("@")[0]
    if ":" not in userinfo:
        return set()
    raw = userinfo.split(":", 1)[1]
    return {secret for secret in (raw, unquote(raw)) if secret}


def scrub(text: object, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` (longest first) replaced by ``***``."""
    out = str(text)
    for secret in sorted(secrets, key=len, reverse=True):
        out = out.replace(secret, "***")
    return out
