"""`tasklock metrics`: the run ledger and the live leases in Prometheus's text exposition
format (version 0.0.4), for node_exporter's textfile collector.

One sample per key and metric, labelled ``key="..."``. The "last run" of a key is its
newest record that ran the command (a ``done-already`` record of ``--once-per`` did not);
a lost run has no exit code, shown as NaN (so ``!= 0`` alerts on it too). The last
success comes from the store's newest success of the key, which the ledger's trim keeps
however many runs came after it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tasklock_cli.stores.base import Store
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.util.keys import is_utf8
from tasklock_cli.util.sanitize import safe


@dataclass(frozen=True)
class Family:
    name: str
    help: str


LAST_START = Family(
    "tasklock_last_start_timestamp_seconds",
    "When the last run of the key started (Unix time, on the store's clock).",
)
LAST_SUCCESS = Family(
    "tasklock_last_success_timestamp_seconds",
    "When the last run of the key that exited 0 ended (Unix time).",
)
LAST_EXIT_CODE = Family(
    "tasklock_last_exit_code",
    "Exit code of the last run of the key (128+N when killed by signal N; NaN when lost).",
)
LAST_DURATION = Family(
    "tasklock_last_duration_seconds",
    "How long the last run of the key held the lease.",
)
HELD = Family("tasklock_held", "Live holders of the key's lease now.")
HELD_SHARED = Family("tasklock_held_shared", "Live holders of the key in shared mode now.")
WAITING = Family("tasklock_waiting", "Runs waiting for the key now (its queue's length).")
MALFORMED = Family(
    "tasklock_malformed_records",
    "Records of the key on the store that could not be read (live leases and ledger runs; "
    "release --force and sweep remove such leases).",
)
FAMILIES = (
    LAST_START,
    LAST_SUCCESS,
    LAST_EXIT_CODE,
    LAST_DURATION,
    HELD,
    HELD_SHARED,
    WAITING,
    MALFORMED,
)


def escape_label_value(value: str) -> str:
    """A label value as the exposition format writes it: backslash, double quote and line
    feed escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def key_labels(key: str) -> str:
    """The labels of a key's samples: ``key="..."``.

    - The key is as it is when the sanitiser leaves it alone.
    - Else it is escaped, and marked ``escaped="true"``.
      Its backslashes are doubled too, so two keys never share a label.
    - So a key with control or bidi characters shows none of them raw.
      Such a key was forged into the store, or has a bidi override that ``run`` accepts."""
    if safe(key) == key:
        return f'key="{escape_label_value(key)}"'
    escaped = safe(key.replace("\\", "\\\\"))
    return f'key="{escape_label_value(escaped)}",escaped="true"'


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def key_samples(
    runs: list[RunRecord],
    held: int,
    success: RunRecord | None,
    waiting: int = 0,
    shared: int = 0,
    malformed: int = 0,
) -> dict[Family, float]:
    """The samples of one key, from:

    - its runs, newest first (its malformed runs are counted here);
    - its live holders, ``shared`` of them in shared mode;
    - its newest success;
    - its waiters;
    - how many of its live leases could not be read (``malformed``)."""
    samples: dict[Family, float] = {
        HELD: float(held),
        HELD_SHARED: float(shared),
        WAITING: float(waiting),
        MALFORMED: float(malformed + sum(1 for run in runs if run.malformed)),
    }
    ran = [run for run in runs if run.outcome != "done-already"]
    if ran:
        last = ran[0]
        samples[LAST_START] = last.started_at.timestamp()
        samples[LAST_EXIT_CODE] = math.nan if last.exit_code is None else float(last.exit_code)
        if last.ended_at is not None:
            took = (last.ended_at - last.started_at).total_seconds()
            samples[LAST_DURATION] = max(0.0, took)
    if success is not None and success.ended_at is not None:
        samples[LAST_SUCCESS] = success.ended_at.timestamp()
    return samples


def collect(store: Store, prefix: str = "") -> dict[str, dict[Family, float]]:
    """Per key (starting with ``prefix``, with runs in the ledger, a live lease or
    waiters): its samples. A key that is not UTF-8 is its own key (its bytes, as lone
    surrogates: ``rows.NotUtf8``), labelled escaped, and its records count as malformed."""
    held: dict[str, int] = {}
    shared: dict[str, int] = {}
    malformed: dict[str, int] = {}
    for info in store.list(prefix=prefix):
        held[info.key] = held.get(info.key, 0) + 1
        shared[info.key] = shared.get(info.key, 0) + info.shared
        malformed[info.key] = malformed.get(info.key, 0) + bool(info.malformed)
    waiting = store.waiting_counts(prefix)
    keys = sorted(set(store.ledger_keys(prefix)) | set(held) | set(waiting))
    for key in keys:  # the places of a key that is not UTF-8 (forged) cannot be read either
        if not is_utf8(key):
            malformed[key] = malformed.get(key, 0) + waiting.get(key, 0)
    return {
        key: key_samples(
            store.history(key, LEDGER_KEEP),
            held.get(key, 0),
            store.last_success(key)[0],
            waiting.get(key, 0),
            shared.get(key, 0),
            malformed.get(key, 0),
        )
        for key in keys
    }


def exposition(per_key: dict[str, dict[Family, float]]) -> Iterable[str]:
    """The lines of the text format: each family's HELP and TYPE, then its samples."""
    for family in FAMILIES:
        yield f"# HELP {family.name} {escape_help(family.help)}"
        yield f"# TYPE {family.name} gauge"
        for key, samples in per_key.items():
            if family in samples:
                yield f"{family.name}{{{key_labels(key)}}} {format_value(samples[family])}"
