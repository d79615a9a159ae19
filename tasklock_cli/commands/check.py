"""`tasklock check`: is the lease a command runs under still current?

Run inside the command, it finds its lease in the environment ``tasklock run`` gave it
(``TASKLOCK_KEY``, ``TASKLOCK_FENCING_TOKEN``; the store from ``TASKLOCK_STORE``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from tasklock_cli.errors import LeaseLost
from tasklock_cli.errors import UsageError
from tasklock_cli.stores.base import Store
from tasklock_cli.util.keys import validate_key


@dataclass(frozen=True)
class CheckResult:
    key: str
    fencing_token: int
    expires_in: float | None  # None: not current

    @property
    def current(self) -> bool:
        return self.expires_in is not None

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "fencing_token": self.fencing_token,
            "current": self.current,
            "expires_in": self.expires_in,
        }


def target(
    key: str | None, token: int | None, environ: Mapping[str, str] = os.environ
) -> tuple[str, int]:
    """The key and fencing token to check: as given, else from the environment."""
    if key is None:
        key = environ.get("TASKLOCK_KEY")
        if key is None:
            raise UsageError("no KEY given and TASKLOCK_KEY is not set (run check under tasklock)")
    validate_key(key)
    if token is None:
        raw = environ.get("TASKLOCK_FENCING_TOKEN")
        if raw is None:
            raise UsageError("no --token given and TASKLOCK_FENCING_TOKEN is not set")
        try:
            token = int(raw)
        except ValueError:
            raise UsageError(f"TASKLOCK_FENCING_TOKEN is not an integer ({raw!r})") from None
    return key, checked_token(token)


#: Fencing tokens are 64-bit signed integers on every store.
MAX_FENCING_TOKEN = 2**63 - 1


def checked_token(token: int) -> int:
    """``token`` when it can be a fencing token; else a usage error (no store has it)."""
    if not 0 <= token <= MAX_FENCING_TOKEN:
        raise UsageError(f"a fencing token is from 0 to {MAX_FENCING_TOKEN} (got {token})")
    return token


def check(store: Store, key: str, token: int) -> CheckResult:
    return CheckResult(key, token, store.time_left(key, token))


def not_current(result: CheckResult) -> LeaseLost:
    return LeaseLost(
        f"the lease on {result.key!r} with fencing token {result.fencing_token} is not "
        "current (released, expired, broken or held by someone else)"
    )
