"""Figures from the fault tests (overlaps, gaps, margins), printed as one table after the run.

Each test calls ``record(scenario, store, **figures)``; ``conftest.py`` prints the table in
pytest's terminal summary and writes it to ``$TASKLOCK_FAULT_REPORT`` when that is set.
"""

from __future__ import annotations

import os

_RECORDS: list[tuple[str, str, dict[str, object]]] = []


def record(scenario: str, store: str, **figures: object) -> None:
    _RECORDS.append((scenario, store, figures))


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
