"""What one ``run`` was asked to do: its options, resolved from flags, config file and defaults."""

from __future__ import annotations

from tasklock_cli.config import settings
from tasklock_cli.errors import UsageError
from tasklock_cli.run.schedule import RenewalSchedule
from tasklock_cli.run.schedule import renewal_schedule
from tasklock_cli.stores.model import EXCLUSIVE
from tasklock_cli.stores.model import SHARED
from tasklock_cli.util.keys import validate_key
from tasklock_cli.util.records import dataclass

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


@dataclass(frozen=True)
class RunOptions:
    key: str
    command: list[str]
    ttl: float = settings.default("ttl")
    renew_every: float | None = settings.default("renew-every")
    wait: float = settings.default("wait")
    grace: float = settings.default("grace")
    max_lifetime: float = settings.default("max-lifetime")
    hold_at_least: float = settings.default("hold-at-least")
    conflict_exit_code: int = settings.default("conflict-exit-code")
    once_per: float | None = settings.default("once-per")
    done_exit_code: int = settings.default("done-exit-code")
    limit: int = settings.default("limit")
    priority: int = settings.default("priority")
    max_waiting: int | None = settings.default("max-waiting")
    hook_timeout: float = settings.default("hook-timeout")
    on_start: str | None = None  # the hooks (--on-EVENT CMD; see run.hooks)
    on_success: str | None = None
    on_failure: str | None = None
    on_conflict: str | None = None
    on_lost: str | None = None
    note: str | None = None
    store_url: str | None = None  # passed to the command (TASKLOCK_STORE) for `check`
    #: The config file the store URL came from: passed instead of the URL (TASKLOCK_CONFIG),
    #: so a password kept in it does not spread through the command's environment.
    config_file: str | None = None
    record_args: bool = True  # False: the store keeps only the command's first word
    shared: bool = False  # --shared
    replace: bool = False  # --replace
    supersede: bool = False  # --supersede
    also: tuple[str, ...] = ()  # --also KEY2...
    #: The store's ``failover_window`` (None: none), set once the store is open.
    failover_window: float | None = None

    @property
    def mode(self) -> str:
        return SHARED if self.shared else EXCLUSIVE

    @property
    def hooks(self) -> dict[str, str]:
        """Event -> the hook's command, for the hooks given (an empty one is none)."""
        given = {
            "start": self.on_start,
            "success": self.on_success,
            "failure": self.on_failure,
            "conflict": self.on_conflict,
            "lost": self.on_lost,
        }
        return {event: command for event, command in given.items() if command}

    @property
    def lease_window(self) -> float:
        """How long after sending a renewal the holder believes in its lease: the ttl, or
        the store's failover window where that is shorter (see ``Store.failover_window``:
        a long ttl then rides out a slow store, not an absent one)."""
        window = self.failover_window
        return self.ttl if window is None else min(self.ttl, window)

    @property
    def schedule(self) -> RenewalSchedule:
        """When the lease is renewed, and the margins that follow from it."""
        return renewal_schedule(self.lease_window, self.renew_every)

    @property
    def loss_grace(self) -> float:
        """The SIGTERM-to-SIGKILL window when renewals fail: --grace, shortened where the
        lease's window is too short for it, so that retrying renewals still gets half the
        time left."""
        schedule = self.schedule
        room = self.lease_window - schedule.safety_margin - schedule.renew_interval
        return max(0.0, min(self.grace, room / 2))


def resolve_options(
    key: str,
    command: list[str] | None,
    flags: dict,
    in_file: Callable[[str], object | None],
    config_path: object,
    *,
    note: str | None = None,
    switches: set[str] | frozenset[str] = frozenset(),
    also: list[str] | tuple[str, ...] = (),
    store_url: str | None = None,
    config_file: str | None = None,
) -> RunOptions:
    """``run``'s options: each setting from its flag, else the config file (``in_file``),
    else the built-in default, checked together; a usage error for what cannot work."""
    validate_key(key)
    for other in also:
        validate_key(other)
    if len({key, *also}) < 1 + len(also):
        raise UsageError("--also names a key twice (or KEY itself)")
    if not command:
        raise UsageError("no command given (tasklock run KEY [OPTIONS] [--] COMMAND [ARG...])")
    options = RunOptions(
        key=key,
        command=list(command),
        **settings.resolve(flags, in_file, config_path),
        **settings.resolve_switches(set(switches), in_file),
        also=tuple(also),
        note=note,
        store_url=store_url,
        config_file=config_file,
    )
    if options.shared and options.limit > 1:
        raise UsageError("--shared cannot be used with --limit (shared holders are not counted)")
    return options
