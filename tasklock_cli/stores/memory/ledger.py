"""memory://'s run ledger: each key's runs by fencing token, written by ``release`` and
trimmed to the last ``LEDGER_KEEP`` and the newest success, read by ``history``,
``last_success`` and ``ledger_keys``. A mixin of ``MemoryStore``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from tasklock_cli.stores.memory.connection import Space
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util.records import replace
from tasklock_cli.util.times import utc_from_timestamp


class MemoryLedger:
    """The run ledger of ``MemoryStore`` (see the module's docstring)."""

    space: Space
    _now: Callable[[], float]
    _utc: Callable[[float], datetime]

    def _record(self, record: RunRecord) -> None:
        """Write ``record`` into the ledger (once per key and token), trimmed to the last
        LEDGER_KEEP runs and the newest success."""
        runs = self.space.ledger.setdefault(record.key, {})
        ended = utc_from_timestamp(self.space.wall_at(self._now()))
        runs[record.fencing_token] = replace(record, ended_at=ended)
        newest = sorted(runs, reverse=True)
        success = self._last_success(record.key)
        for token in newest[LEDGER_KEEP:]:
            if success is None or token != success.fencing_token:
                del runs[token]

    def history(self, key: str, limit: int = LEDGER_KEEP) -> list[RunRecord]:
        with self.space.lock:
            runs = self.space.ledger.get(key, {})
            return [runs[token] for token in sorted(runs, reverse=True)[:limit]]

    def _last_success(self, key: str) -> RunRecord | None:
        runs = self.space.ledger.get(key, {})
        wins = [token for token, run in runs.items() if run.outcome == "succeeded"]
        return runs[max(wins)] if wins else None

    def last_success(self, key: str) -> tuple[RunRecord | None, datetime]:
        with self.space.lock:
            return self._last_success(key), self._utc(self._now())

    def ledger_keys(self, prefix: str = "") -> list[str]:
        with self.space.lock:
            return sorted(
                k for k, runs in self.space.ledger.items() if runs and k.startswith(prefix)
            )
