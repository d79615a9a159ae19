"""``tasklock run``'s body once its command line is parsed (by typer or by the fast parser)."""

from __future__ import annotations

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    from tasklock_cli.config.file import Config
    from tasklock_cli.events import EventLog
    from tasklock_cli.stores.base import Store

    class Session(Protocol):
        """What a run needs of the session that started it: the command line's
        (``cli.session.Globals``) is one. Named here, so that `run`, below the command line,
        imports nothing of it (tests/test_layout.py checks the direction)."""

        events: EventLog

        @property
        def config(self) -> Config: ...

        def store_url(self) -> str: ...

        def store_config_file(self) -> str | None: ...

        def open_store(self) -> Store: ...


def run_command(
    g: Session,
    key: str,
    command: list[str] | None,
    flags: dict,
    note: str | None,
    switches: set[str] | frozenset[str] = frozenset(),
    also: list[str] | tuple[str, ...] = (),
) -> int:
    """Resolve the options, fork the command's guard, open the store and supervise the
    run; the run's exit code.

    The guard is forked before the store is opened: the store's driver (psycopg, redis-py,
    PyMySQL: 20-35 MB mapped) is not yet in the process, so the fork has fewer page tables
    to copy (0.22 ms, against 0.65 with psycopg), and the driver's pages are the wrapper's
    alone: no copy-on-write fault when the wrapper then writes them."""
    from tasklock_cli.run.options import resolve_options
    from tasklock_cli.run.supervisor import Supervisor
    from tasklock_cli.run.supervisor import fork_guard

    def in_file(name: str) -> object | None:
        return g.config.run_setting(key, name)

    options = resolve_options(
        key,
        command,
        flags,
        in_file,
        g.config.path,
        note=note,
        switches=switches,
        also=also,
        store_url=g.store_url(),
        config_file=g.store_config_file(),
    )
    guard = fork_guard(options)
    store: Store | None = None
    try:
        store = g.open_store()
        collect_garbage_again()
        supervisor = Supervisor(store, options, g.events, open_store=g.open_store, guard=guard)
    except BaseException:
        guard.cancel()  # (no run took it over)
        if store is not None:
            store.close_before_exit()
        raise
    try:
        return supervisor.run()  # (which owns the guard from now on)
    finally:
        store.close_before_exit()  # the process ends right after (cli.session.exit_now)


def collect_garbage_again() -> None:
    """Garbage collection back on (``entry.main`` turned it off for the imports), for a run
    that may last hours. What exists by now (modules, the store) is kept out of the
    collector's passes for good (``gc.freeze``): it lives as long as the process."""
    import gc

    gc.freeze()
    gc.enable()
