"""Rendering for people: a rich table on a terminal, plain tab-separated columns when piped."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from datetime import datetime
from datetime import timezone

from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.stores.model import RunRecord
from tasklock_cli.stores.model import StoreCheck
from tasklock_cli.stores.model import WaiterInfo
from tasklock_cli.stores.traits import Capabilities
from tasklock_cli.util.display import UNREADABLE_SHOWN
from tasklock_cli.util.display import problems
from tasklock_cli.util.display import shown
from tasklock_cli.util.display import unreadable
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.sanitize import json_text
from tasklock_cli.util.sanitize import safe
from tasklock_cli.util.times import rfc3339


def relative(moment: datetime, now: datetime | None = None) -> str:
    delta = (moment - (now or datetime.now(timezone.utc))).total_seconds()
    return f"in {format_duration(delta)}" if delta >= 0 else f"{format_duration(-delta)} ago"


def _expiry(info: LeaseInfo) -> str:
    if unreadable(info.malformed, "expires_at"):
        return UNREADABLE_SHOWN
    if info.expired:
        return f"expired {relative(info.expires_at)}"
    if info.kept:  # its holder has exited: not a live run, however live the lease
        left = (info.expires_at - datetime.now(timezone.utc)).total_seconds()
        return f"ended, kept for {format_duration(max(0.0, left))}"
    return f"expires {relative(info.expires_at)}"


def _to_terminal() -> bool:
    return sys.stdout.isatty()


def _console():
    from rich.console import Console

    return Console(no_color=bool(os.environ.get("NO_COLOR")) or None, highlight=False)


def json_array(items: Iterable[object]) -> None:
    """A JSON array written item by item, so a long listing streams."""
    separator = "["
    for item in items:
        sys.stdout.write(separator + json_text(item))
        separator = ","
    sys.stdout.write("[]\n" if separator == "[" else "]\n")


def listing_json(leases: Iterable[LeaseInfo], waiting: dict[str, int]) -> Iterable[dict]:
    """``list --json``'s entries: each lease with how many wait for its key."""
    for info in leases:
        yield {**info.to_json(), "waiting": waiting.get(info.key, 0)}


def lease_table(leases: Iterable[LeaseInfo], waiting: dict[str, int]) -> None:
    """A table on a terminal (it needs every row to size its columns); streamed TSV lines
    otherwise. ``waiting``: how many wait for each key."""
    if not _to_terminal():
        for info in leases:
            h = info.holder
            fields = [
                info.key,
                h.host,
                shown(info.malformed, "holder.pid", h.pid),
                h.user,
                shown(info.malformed, "fencing_token", info.fencing_token),
                shown(info.malformed, "expires_at", rfc3339(info.expires_at)),
                _state(info),
                h.note or "",
                shown(info.malformed, "slot", info.slot),
                str(waiting.get(info.key, 0)),
            ]
            sys.stdout.write("\t".join(_one_line(f) for f in fields) + "\n")
        return
    _console().print(_rich_table(list(leases), waiting))


def _state(info: LeaseInfo) -> str:
    """A lease's state in ``list``'s TSV: ``kept`` is held only by ``--hold-at-least`` after
    its command ended, until the expiry beside it (the waiting column stays the last)."""
    if info.malformed:
        return "malformed"
    return "expired" if info.expired else "kept" if info.kept else "held"


def _rich_table(leases: list[LeaseInfo], waiting: dict[str, int]):
    from rich.table import Table

    if not leases:
        return "no locks held"
    table = Table(box=None, header_style="bold")
    slots = any(info.limit > 1 for info in leases)
    modes = any(info.shared for info in leases)
    optional = (*(("SLOT",) if slots else ()), *(("MODE",) if modes else ()))
    for column in ("KEY", *optional, "HOLDER", "TOKEN", "ACQUIRED"):
        table.add_column(column)
    for column in ("EXPIRES", "WAITING", "NOTE"):
        table.add_column(column)
    for info in leases:
        h = info.holder
        slot = (shown(info.malformed, "slot", f"{info.slot} of {info.limit}"),) if slots else ()
        mode = (info.mode,) if modes else ()
        table.add_row(
            *_cells(
                info.key,
                *slot,
                *mode,
                _holder_text(info.holder, info.malformed),
                shown(info.malformed, "fencing_token", info.fencing_token),
                shown(info.malformed, "acquired_at", relative(info.acquired_at)),
                _expiry(info),
                str(waiting.get(info.key, 0)),
                h.note or "",
            ),
            style="dim" if info.expired else None,
        )
    return table


def watch_table(fetch, interval: float) -> int:
    """``list --watch``: a live view on a terminal, a fresh listing per interval otherwise.
    Returns the exit status: 0 when interrupted (Ctrl-C), 128+N when signal N (SIGTERM,
    SIGHUP) ended the live view, which restores the cursor it hid first."""
    import time

    if not _to_terminal():
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                lease_table(*fetch())
                sys.stdout.write("\n")
                sys.stdout.flush()
                time.sleep(interval)
        return 0
    from rich.live import Live

    stopped: list[int] = []
    with (
        _stopping_signals(stopped),
        contextlib.suppress(KeyboardInterrupt, _Stopped),
        Live(_rich_table(*fetch()), console=_console(), auto_refresh=False) as live,
    ):
        while True:
            time.sleep(interval)
            live.update(_rich_table(*fetch()), refresh=True)
    # The view has ended: another Ctrl-C while its last output drains ends nothing more,
    # and must not print a traceback.
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return 128 + stopped[0] if stopped else 0


class _Stopped(Exception):
    """A signal that ends ``list --watch``: raised in the main thread, so the live view
    unwinds as on Ctrl-C (by default SIGTERM would end the process with the cursor hidden)."""


@contextlib.contextmanager
def _stopping_signals(stopped: list[int]):
    """While inside: SIGTERM and SIGHUP raise _Stopped, their number appended to
    ``stopped``; the earlier handlers are put back after."""
    import signal

    def stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        raise _Stopped

    earlier = {signum: signal.signal(signum, stop) for signum in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in earlier.items():
            signal.signal(signum, handler)


def history_table(key: str, runs: list[RunRecord]) -> None:
    """``history``: a table on a terminal, TSV lines otherwise (newest first)."""
    if not _to_terminal():
        for run in runs:
            h = run.holder
            fields = [
                rfc3339(run.started_at),
                rfc3339(run.ended_at) if run.ended_at else "",
                shown(run.malformed, "fencing_token", run.fencing_token),
                str(run.slot),
                "malformed" if run.malformed else run.outcome,
                "" if run.exit_code is None else str(run.exit_code),
                run.detected_by or "",
                h.host,
                shown(run.malformed, "holder.pid", h.pid),
                h.user,
                h.note or "",
                " ".join(h.command),
            ]
            sys.stdout.write("\t".join(_one_line(f) for f in fields) + "\n")
        return
    _console().print(_history_rich_table(key, runs))


def _history_rich_table(key: str, runs: list[RunRecord]):
    from rich.table import Table

    if not runs:
        return _text(f"no runs of {key} recorded")
    table = Table(box=None, header_style="bold")
    modes = ("MODE",) if any(run.shared for run in runs) else ()
    for column in ("STARTED", "TOOK", "TOKEN", *modes, "OUTCOME", "EXIT", "HOLDER"):
        table.add_column(column)
    for column in ("NOTE", "COMMAND"):
        table.add_column(column)
    for run in runs:
        h = run.holder
        took = (run.ended_at - run.started_at).total_seconds() if run.ended_at else None
        outcome = f"{run.outcome} ({run.detected_by})" if run.detected_by else run.outcome
        table.add_row(
            *_cells(
                f"{rfc3339(run.started_at)} ({relative(run.started_at)})",
                format_duration(max(0.0, took)) if took is not None else "-",
                shown(run.malformed, "fencing_token", run.fencing_token),
                *((run.mode,) if modes else ()),
                outcome,
                "-" if run.exit_code is None else str(run.exit_code),
                _holder_text(h, run.malformed),
                h.note or "",
                " ".join(h.command),
            ),
            style=None if run.outcome in ("succeeded", "done-already") else "red",
        )
    return table


def peek_json(key: str, holders: list[LeaseInfo], waiters: list[WaiterInfo]) -> dict:
    """``peek --json``: the holder with the lowest token; a semaphore's every slot too; the
    waiters in the order they will be served."""
    queue = [waiter.to_json() for waiter in waiters]
    if not holders:
        return {"key": key, "held": False, "waiters": queue}
    first = min(holders, key=lambda info: info.fencing_token)
    shown = {**first.to_json(), "held": True}
    if first.limit > 1 or len(holders) > 1:
        shown["holders"] = [info.to_json() for info in holders]
    shown["waiters"] = queue
    return shown


def waiters_block(key: str, waiters: list[WaiterInfo], held: bool) -> None:
    """``peek``: who waits for the key, in the order they will be served."""
    if not held:
        sys.stdout.write(safe(f"{key} is free") + "\n")
    if not waiters:
        return
    sys.stdout.write(f"\nwaiting   {len(waiters)}, served in this order:\n")
    for place, waiter in enumerate(waiters, 1):
        h = waiter.holder
        since = f"since {rfc3339(waiter.since)} ({relative(waiter.since)})"
        note = f", note {h.note}" if h.note else ""
        pid = shown(waiter.malformed, "holder.pid", h.pid)
        # (a priority only where one was given: most queues have none)
        priority = f", priority {waiter.priority}" if waiter.priority else ""
        line = f"{h.host} pid {pid} (user {h.user}), {waiter.mode}{priority}, {since}{note}"
        if waiter.malformed:
            line += f" (malformed: {problems(waiter.malformed)})"
        sys.stdout.write(f"{place:>9} {_one_line(line)}\n")


def lease_details(holders: list[LeaseInfo]) -> None:
    """``peek``: the lease on a key; for a semaphore, one block per held slot."""
    first = holders[0]
    if first.limit > 1:
        sys.stdout.write(safe(f"{first.key}: {len(holders)} of {first.limit} slots held") + "\n")
    elif first.shared:
        count = len(holders)
        sys.stdout.write(safe(f"{first.key}: {count} shared holder{'s' * (count > 1)}") + "\n")
    for index, info in enumerate(holders):
        if index:
            sys.stdout.write("\n")
        _lease_block(info)


def _lease_block(info: LeaseInfo) -> None:
    h = info.holder
    slot = [("slot", f"{info.slot} of {info.limit}")] if info.limit > 1 else []
    pid = shown(info.malformed, "holder.pid", h.pid)
    ended = ", its command has ended" if info.kept else ""
    rows = [
        ("key", info.key),
        *slot,
        *([("mode", info.mode)] if info.shared else []),
        ("holder", f"{h.host} pid {pid} (user {h.user}){ended}"),
        *_kept_row(info),
        ("command", " ".join(h.command)),
        ("note", h.note or "-"),
        ("token", shown(info.malformed, "fencing_token", info.fencing_token)),
        *([("malformed", problems(info.malformed))] if info.malformed else []),
        ("acquired", _moment(info, "acquired_at", info.acquired_at)),
        ("expires", _moment(info, "expires_at", info.expires_at)),
    ]
    for name, value in rows:
        sys.stdout.write(f"{name:<9} {_one_line(value)}\n")


def _moment(info: LeaseInfo, field: str, moment: datetime) -> str:
    """``peek``'s time and how long ago or ahead, ``?`` where it could not be read."""
    return shown(info.malformed, field, f"{rfc3339(moment)} ({relative(moment)})")


def _kept_row(info: LeaseInfo) -> list[tuple[str, str]]:
    """``peek``'s line for a lease kept after its command ended (``--hold-at-least``):
    nothing runs under it, and the key frees at its expiry."""
    if not info.kept:
        return []
    until = f"{rfc3339(info.expires_at)} ({relative(info.expires_at)})"
    return [("kept", f"until {until} by --hold-at-least; nothing runs under it")]


def doctor_json(
    config_file: str, checks: list[StoreCheck], capabilities: Capabilities
) -> list[dict[str, object]]:
    """`doctor --json`: the checks of the text report, config first, then the store's
    capabilities, an entry of the same shape (always ok) whose ``capabilities`` object
    holds the record (``stores.traits.Capabilities``), for scripts and tests."""
    rows: list[dict[str, object]] = [{"check": "config", "ok": True, "detail": config_file}]
    rows += [{"check": check.name, "ok": check.ok, "detail": check.detail} for check in checks]
    record = capabilities.as_json()
    detail = _capabilities_detail(capabilities)
    rows.append({"check": "capabilities", "ok": True, "detail": detail, "capabilities": record})
    return rows


def _capabilities_detail(capabilities: Capabilities) -> str:
    """The record on one line, as ``name=value`` (values as JSON writes them)."""
    return ", ".join(f"{name}={json_text(value)}" for name, value in capabilities.as_json().items())


def doctor_report(config_file: str, checks: list[StoreCheck], capabilities: Capabilities) -> None:
    """`doctor`: a line per check (config first), then the store's capabilities, as
    ``doctor --json`` has them."""
    lines = [("ok", "config", config_file)]
    for check in checks:
        status = "fail" if not check.ok else "warn" if check.warning else "ok"
        lines.append((status, check.name, check.detail))
    lines.append(("ok", "capabilities", _capabilities_detail(capabilities)))
    for status, name, detail in lines:
        sys.stdout.write(f"{status:<5} {name:<12} {safe(detail)}\n")


def _one_line(text: str) -> str:
    """A field of a TSV line or a line of text: tabs and newlines escaped with the rest."""
    return safe(text)


def _text(text: str):
    """A rich table cell: escaped by the sanitiser, and never read as markup."""
    from rich.text import Text

    return Text(safe(text))


def _holder_text(holder, malformed: tuple) -> str:
    """Who holds (or held) a lease, in a table's cell; what was malformed about its row."""
    text = f"{holder.user}@{holder.host} pid {shown(malformed, 'holder.pid', holder.pid)}"
    return f"{text} (malformed: {problems(malformed)})" if malformed else text


def _cells(*texts: str) -> list:
    """A rich table row: every cell escaped and taken as text (a str would be markup)."""
    return [_text(text) for text in texts]


def break_outcome(key: str, token: int | None, outcome, timeout: float) -> str:
    """``release --force``'s one line: what was broken and whether its holders let go."""
    if not outcome.broken:
        return safe(
            f"{key} was not held" if token is None else f"{key} is not held with token {token}"
        )
    from tasklock_cli.run.conflict import describe_holder

    if len(outcome.broken) == 1:
        broke = f"broke the lease on {key} held by {describe_holder(outcome.broken[0])}"
        holders, leases = "the holder", "its lease runs"
    else:
        slots = ", ".join(str(info.slot) for info in outcome.broken)
        broke = f"broke the {len(outcome.broken)} leases on {key} (slots {slots})"
        holders, leases = "the holders", "their leases run"
    if outcome.let_go_after is not None:
        after = f"{outcome.let_go_after:.2f}s"
        if outcome.how == "ended":  # (kept by --hold-at-least: nobody was under it)
            return safe(f"{broke}; its command had ended: freed after {after}")
        if outcome.how == "ran out":
            ran = "the lease ran" if len(outcome.broken) == 1 else "the leases ran"
            return safe(f"{broke}; nobody let go: {ran} out after {after}")
        return safe(f"{broke}; {holders} let go after {after}")
    from tasklock_cli.util.times import rfc3339

    return safe(
        f"{broke}; {holders} did not answer within {timeout:g}s: {key} stays taken, broken, "
        f"until {leases} out at {rfc3339(outcome.free_at)}"
    )


def break_outcome_json(key: str, outcome) -> dict:
    """``release --force --json``: the tokens broken, whether the key is free now, and
    when it frees when not."""
    from tasklock_cli.util.times import rfc3339

    return {
        "key": key,
        "broken": [info.fencing_token for info in outcome.broken],
        "freed": outcome.freed,
        "free_at": rfc3339(outcome.free_at) if outcome.free_at is not None else None,
    }
