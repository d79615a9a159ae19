"""Figures from the fault tests (overlaps, gaps, margins), printed as one table after the run.

Each test calls ``record(scenario, store, **figures)``; ``conftest.py`` moves a test's
figures into its report (so they reach the main process from pytest-xdist's workers), keeps
those of passed tests, prints the table in pytest's terminal summary and writes it to
``$TASKLOCK_FAULT_REPORT`` when that is set.
"""

from __future__ import annotations

import os

#: What the test running in this process has recorded so far.
_PENDING: list[tuple[str, str, dict[str, object]]] = []
#: The figures of passed tests, in the process that prints the table.
_RECORDS: list[tuple[str, str, dict[str, object]]] = []
#: The name under which figures travel in a test report's ``user_properties``.
PROPERTY = "tasklock_figures"


def record(scenario: str, store: str, **figures: object) -> None:
    _PENDING.append((scenario, store, figures))


def take_pending() -> list[tuple[str, str, dict[str, object]]]:
    taken = list(_PENDING)
    _PENDING.clear()
    return taken


def keep(scenario: str, store: str, figures: dict[str, object]) -> None:
    _RECORDS.append((scenario, store, dict(figures)))


def store_of(url: str) -> str:
    return url.split(":", 1)[0].replace("postgresql", "postgres")


def table() -> list[str]:
    if not _RECORDS:
        return []
    lines = ["| scenario | store | result | figures |", "|---|---|---|---|"]
    for scenario, store, figures in sorted(_RECORDS, key=lambda r: (r[0], r[1])):
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in figures.items())
        lines.append(f"| {scenario} | {store} | passed | {shown} |")
    return lines


def write_if_asked(lines: list[str]) -> None:
    path = os.environ.get("TASKLOCK_FAULT_REPORT")
    if path and lines:
        with open(path, "w") as out:
            out.write("\n".join(lines) + "\n")


def _fmt(value: object) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)
