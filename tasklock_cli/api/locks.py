"""``Locks``: the Python API's entry point, on the CLI's stores, keys, tokens and ledger.

The store is chosen as ``--store`` chooses it (``store`` > ``TASKLOCK_STORE`` > the config
file > the default SQLite file), so a program and the crontab's ``tasklock run`` lock the
same keys on the same store and exclude each other. Each ``lock()`` opens its own store
clients (a client serves one thread: the heartbeat's) and closes them when released.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Awaitable
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from typing import Generic
from typing import TypeVar

from tasklock_cli.api.context import LockContext
from tasklock_cli.api.events import Subscriber
from tasklock_cli.api.events import Subscribers
from tasklock_cli.api.hold import LeaseHold
from tasklock_cli.api.lease import Lease
from tasklock_cli.config import settings
from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import LockLost
from tasklock_cli.errors import LockNotAcquired
from tasklock_cli.errors import UsageError
from tasklock_cli.run.options import RunOptions
from tasklock_cli.stores.base import Store
from tasklock_cli.util import clock as clocks
from tasklock_cli.util.durations import parse_duration
from tasklock_cli.util.keys import validate_key

T = TypeVar("T")
Duration = str | float
#: ``lock()``'s ledger command when no function names the run.
PLAIN_COMMAND = "python"


@dataclass(frozen=True)
class Outcome(Generic[T]):
    """What ``run_exclusive`` did: ``acquired`` and the function's ``result`` (or, when
    the lock was held elsewhere, what ``on_locked`` returned; None without it)."""

    acquired: bool
    result: T | None


class Locks:
    """Locks on one store. ``store``: a URL, or None for ``--store``'s resolution;
    ``config``: a config file, as ``--config``; ``clock``: a ``ManualClock`` for tests on
    ``memory://`` (which needs ``allow_memory=True``)."""

    def __init__(
        self,
        store: str | None = None,
        *,
        config: str | None = None,
        clock: clocks.ManualClock | None = None,
        allow_memory: bool = False,
    ) -> None:
        from tasklock_cli.config.file import load_config
        from tasklock_cli.config.file import resolve_store_url
        from tasklock_cli.stores.urls import default_store_url

        if store is not None and not store.strip():
            raise ConfigError("store= is empty (give a store URL, or None for the default)")
        self.store_url = resolve_store_url(store, load_config(config), default_store_url)
        in_process = _in_process(self.store_url)
        if in_process and not allow_memory:
            raise ConfigError(
                f"{self.store_url!r} is an in-process store for tests: pass allow_memory=True"
            )
        if clock is not None and not in_process:
            raise ConfigError("clock= is for memory:// only: a real store keeps real time")
        self._allow_memory = allow_memory
        self._clock = clock
        self._events = Subscribers()

    def open_store(self) -> Store:
        """A new client of the store (the caller closes it)."""
        from tasklock_cli.stores import open_store

        store = open_store(self.store_url, allow_in_process=self._allow_memory)
        if self._clock is not None:
            store.use_clock(self._clock)  # type: ignore[attr-defined]
        return store

    def lock(
        self,
        key: str,
        *,
        ttl: Duration = "30s",
        wait: Duration = 0,
        max_lifetime: Duration = "24h",
        limit: int = 1,
        shared: bool = False,
        also: Iterable[str] = (),
        note: str | None = None,
    ) -> LockContext:
        """``with locks.lock(key) as lease:`` (or ``async with``): hold ``key`` for the
        block; LockNotAcquired when it is held elsewhere past ``wait``."""
        options = {
            "ttl": ttl,
            "wait": wait,
            "max_lifetime": max_lifetime,
            "limit": limit,
            "shared": shared,
            "also": also,
            "note": note,
        }
        return self._lock_for(key, None, options)

    def _context(self, options: RunOptions, note: str | None) -> LockContext:
        from tasklock_cli.util.records import replace

        options = replace(options, note=note)
        clock = self._clock if self._clock is not None else clocks.monotonic
        return LockContext(lambda: LeaseHold(self.open_store, options, self._events, clock))

    def _lock_for(
        self, key: str, fn: Callable[..., object] | None, opts: dict[str, Any]
    ) -> LockContext:
        """``lock(key, **opts)`` recorded in the ledger as ``fn``'s qualified name (None:
        as ``python``)."""
        note = opts.pop("note", None)
        command = PLAIN_COMMAND if fn is None else qualified_name(fn)
        return self._context(lock_options(key, command, **opts), note)

    def run_exclusive(
        self,
        key: str,
        fn: Callable[[], T],
        *,
        on_locked: Callable[[LockNotAcquired], T] | None = None,
        **lock_options: Any,
    ) -> Outcome[T]:
        """Run ``fn()`` holding ``key``: ``Outcome(True, its result)``; when ``key`` is held
        elsewhere, ``Outcome(False, on_locked(error))`` (None without ``on_locked``)."""
        try:
            with self._lock_for(key, fn, lock_options):
                return Outcome(True, fn())
        except LockNotAcquired as refused:
            return Outcome(False, on_locked(refused) if on_locked else None)

    async def run_exclusive_async(
        self,
        key: str,
        fn: Callable[[], Awaitable[T]],
        *,
        on_locked: Callable[[LockNotAcquired], T] | None = None,
        **lock_options: Any,
    ) -> Outcome[T]:
        """``run_exclusive`` for a coroutine function, under ``async with``."""
        try:
            async with self._lock_for(key, fn, lock_options):
                return Outcome(True, await fn())
        except LockNotAcquired as refused:
            return Outcome(False, on_locked(refused) if on_locked else None)

    def on_one_instance(
        self, key: str, **lock_options: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T | None]]:
        """Decorator: the function runs only where ``key`` is free; held elsewhere, the
        call is skipped and returns None (sync or async functions)."""
        return functools.partial(self._guarded, key, dict(lock_options), True)

    def without_overlapping(
        self, key: str | None = None, wait: Duration = 0, **lock_options: Any
    ) -> Callable[[Callable[..., T]], Callable[..., T]]:
        """Decorator: calls of the function never overlap, across processes and hosts; a
        call waits up to ``wait`` for the one running, then raises LockNotAcquired. ``key``
        defaults to the function's ``module.qualname``."""

        def decorate(fn: Callable[..., T]) -> Callable[..., T]:
            options = {**lock_options, "wait": wait}
            guarded: Callable[..., T] = self._guarded(key or qualified_name(fn), options, False, fn)
            return guarded

        return decorate

    def _guarded(
        self, key: str, options: dict[str, Any], skip: bool, fn: Callable[..., Any]
    ) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def run_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    async with self._lock_for(key, fn, dict(options)):
                        return await fn(*args, **kwargs)
                except LockNotAcquired:
                    if skip:
                        return None
                    raise

            return run_async

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            try:
                with self._lock_for(key, fn, dict(options)):
                    return fn(*args, **kwargs)
            except LockNotAcquired:
                if skip:
                    return None
                raise

        return run

    def leadership(self, key: str, **lock_options: Any) -> Iterator[Lease]:
        """``for lease in locks.leadership(key):`` blocks until this process leads, then
        yields once per term; the body should end when ``lease.lost`` is set, and the next
        term begins when it leads again. ``wait`` defaults to forever; breaking out of the
        loop resigns."""
        options = {"wait": math.inf, **lock_options}
        while True:
            try:
                with self._lock_for(key, None, dict(options)) as lease:
                    yield lease
            except LockLost:
                continue

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """``callback(event)`` for every event of this Locks' locks, the objects
        ``--log-format json`` prints; returns what unsubscribes."""
        return self._events.add(callback)

    def __repr__(self) -> str:
        from tasklock_cli.stores.urls import redact_url

        return f"Locks({redact_url(self.store_url)!r})"


def lock_options(key: str, command: str, **given: Any) -> RunOptions:
    """The lock's options (``Locks.lock``'s keywords, the one place of their defaults),
    checked as the CLI checks its flags (UsageError)."""
    defaults = _lock_defaults()
    unknown = sorted(given.keys() - defaults.keys())
    if unknown:
        raise TypeError(f"lock() got an unexpected keyword argument {unknown[0]!r}")
    opts = {**defaults, **given}
    ttl, wait, max_lifetime = opts["ttl"], opts["wait"], opts["max_lifetime"]
    limit, shared = opts["limit"], opts["shared"]
    validate_key(key)
    also = tuple(opts["also"])
    for other in also:
        validate_key(other)
    if len({key, *also}) < 1 + len(also):
        raise UsageError("also= names a key twice (or the key itself)")
    if shared and limit > 1:
        raise UsageError("shared=True cannot be used with limit > 1")
    limit_problem = settings.BY_NAME["limit"].problem(limit)
    if limit_problem or isinstance(limit, bool):
        raise UsageError(f"limit {limit_problem or 'must be an integer'}")
    return RunOptions(
        key=key,
        command=[command],
        ttl=seconds("ttl", ttl),
        wait=seconds("wait", wait),
        max_lifetime=seconds("max-lifetime", max_lifetime),
        limit=limit,
        shared=shared,
        also=also,
    )


@functools.cache
def _lock_defaults() -> dict[str, Any]:
    """``Locks.lock``'s keyword options and their defaults (``note`` is not an option)."""
    parameters = inspect.signature(Locks.lock).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY and p.name != "note"}


def seconds(name: str, value: Duration) -> float:
    """A duration given as the CLI's string or a number of seconds, checked as the CLI
    checks --NAME."""
    setting = settings.BY_NAME[name]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise UsageError(f"{name.replace('-', '_')} {value!r} is not a duration")
    if isinstance(value, str):
        found = parse_duration(value, option=name.replace("-", "_"), allow_inf=setting.allow_inf)
    else:
        found = float(value)
        if not (found >= 0 and (setting.allow_inf or math.isfinite(found))):
            raise UsageError(f"{name.replace('-', '_')} {value!r} is not a duration")
    problem = setting.problem(found)
    if problem:
        raise UsageError(f"{name.replace('-', '_')} {problem}")
    return found


def qualified_name(fn: Callable[..., object]) -> str:
    """``module.qualname`` of a function: its runs' command in the ledger."""
    module = getattr(fn, "__module__", None) or "python"
    return f"{module}.{getattr(fn, '__qualname__', repr(fn))}"


def _in_process(url: str) -> bool:
    from tasklock_cli.stores.registry import package_for_scheme
    from tasklock_cli.stores.urls import url_scheme

    package = package_for_scheme(url_scheme(url) if "://" in url else "")
    return bool(getattr(package, "IN_PROCESS", False))
