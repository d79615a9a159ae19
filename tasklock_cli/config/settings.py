"""The settings of `tasklock run`, in one table.

The command-line options (typer's and the fast parser's), the config file's keys, their
parsing and their bounds are all derived from ``RUN_SETTINGS``; ``RunOptions`` takes its
defaults from it.
"""

from __future__ import annotations

from tasklock_cli.errors import UsageError
from tasklock_cli.util.durations import INFINITY
from tasklock_cli.util.durations import format_duration
from tasklock_cli.util.durations import parse_duration
from tasklock_cli.util.records import dataclass

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Exit codes a setting may name.
EXIT_CODES = (0, 255)
#: The most holders a semaphore (--limit) may have.
MAX_LIMIT = 1000
#: The hooks (``--on-EVENT CMD``): their events (TASKLOCK_EVENT) and when each runs.
HOOK_EVENTS = {
    "start": "once the lock is held, before the command starts",
    "success": "after the command exited 0 (the lock released)",
    "failure": "after the command failed, was signalled or lost the lock (released)",
    "conflict": "when the lock was not acquired (held, queue full, superseded)",
    "lost": "when the lease was lost, after the command's tree is ended",
}
#: --max-waiting's bound (a queue is never that long).
MAX_WAITING = 1_000_000
#: ``run --priority``: waiting runs are served highest priority first. (The stores fold a
#: priority into a queue place's order within these bounds: ``stores.model``'s bands.)
MIN_PRIORITY, MAX_PRIORITY = -100, 100


class _Configured:
    """What a run setting and a run switch share: a config key (``name``) that fills the
    RunOptions field of the same name."""

    name: str  # each subclass's own field (records.dataclass reads a class's own annotations)

    @property
    def field(self) -> str:
        """The RunOptions field it fills."""
        return self.name.replace("-", "_")


@dataclass(frozen=True)
class RunSetting(_Configured):
    name: str  # the config key; the flag is --name
    default: float | int | None
    help: str
    integer: tuple[int, int] | None = None  # an integer within these bounds; else a duration
    allow_inf: bool = False
    text: bool = False  # a shell command (a hook), taken as given

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    @property
    def metavar(self) -> str:
        return "CMD" if self.text else "N" if self.integer else "D"

    def parse_flag(self, text: str | int) -> float | int | str:
        """The value of ``--name text``, checked on its own (UsageError when bad)."""
        if self.text:
            return text  # (an empty hook is none: RunOptions.hooks)
        if self.integer:
            # (util.numbers only here: a plain run, with no integer option, does without it)
            from tasklock_cli.util.numbers import is_decimal

            if isinstance(text, str) and not is_decimal(text.strip(), signed=True):
                raise UsageError(f"invalid {self.flag} {text!r} (an integer)")
            value: float | int = int(text)
        else:
            assert isinstance(text, str)
            value = parse_duration(text, option=self.flag, allow_inf=self.allow_inf)
        problem = self.problem(value)
        if problem:
            raise UsageError(f"{self.flag} {problem}")
        return value

    def problem(self, value: float) -> str | None:
        """What is wrong with a value on its own, or None (flags and config file alike)."""
        if self.integer:
            low, high = self.integer
            return None if low <= value <= high else f"must be from {low} to {high}"
        if self.name == "ttl" and not 0 < value < INFINITY:
            return "must be a positive, finite duration"
        if self.name == "ttl" and value < 0.1:
            return "must be at least 100ms"
        if self.name in ("renew-every", "max-lifetime", "hook-timeout") and value <= 0:
            return "must be positive"
        if self.name == "once-per" and not 1 <= value < INFINITY:
            return "must be a finite duration of at least 1s"
        return None


RUN_SETTINGS: tuple[RunSetting, ...] = (
    RunSetting(
        "ttl",
        30.0,
        "Lease length; freed D after the last renewal. On PostgreSQL, MySQL and Redis "
        "(without wait_replicas=) a holder that cannot renew for 30s loses its lease "
        "whatever D.  [default: 30s]",
    ),
    RunSetting(
        "renew-every",
        None,
        "Heartbeat interval, less than --ttl.  [default: ttl/3, at most 10s on stores that "
        "fail over]",
    ),
    RunSetting(
        "wait",
        0.0,
        "Wait up to D for a held lock; 0 = fail at once, inf = forever.  [default: 0]",
        allow_inf=True,
    ),
    RunSetting(
        "grace",
        5.0,
        "On loss: SIGTERM the command's process tree, SIGKILL after D.  [default: 5s]",
    ),
    RunSetting(
        "max-lifetime",
        86400.0,
        "Terminate the command when it has run this long.  [default: 24h]",
        allow_inf=True,
    ),
    RunSetting(
        "hold-at-least",
        0.0,
        "Keep the lease until D after acquisition even if the command ends sooner.",
    ),
    RunSetting(
        "once-per",
        None,
        "Run at most once per window of D (aligned to the Unix epoch on the store's clock): "
        "a run that succeeded in this window means the command is not run.",
    ),
    RunSetting(
        "done-exit-code",
        0,
        "Exit code when --once-per finds the window already done.  [default: 0]",
        integer=EXIT_CODES,
    ),
    RunSetting(
        "conflict-exit-code",
        75,
        "Exit code when the lock is held by someone else.  [default: 75]",
        integer=EXIT_CODES,
    ),
    RunSetting(
        "priority",
        0,
        "While waiting: runs of KEY are served highest priority first (-100 to 100), in "
        "arrival order among equals.  [default: 0]",
        integer=(MIN_PRIORITY, MAX_PRIORITY),
    ),
    RunSetting(
        "max-waiting",
        None,
        "If N runs already wait for KEY, do not join them: exit with the conflict exit "
        "code at once (reason queue-full); 0 = never wait.",
        integer=(0, MAX_WAITING),
    ),
    RunSetting(
        "hook-timeout",
        10.0,
        "Each --on-* hook is killed (its process group) after D; inf is not allowed.  "
        "[default: 10s]",
    ),
    *(
        RunSetting(f"on-{event}", None, f"Hook: run CMD with sh -c {when}.", text=True)
        for event, when in HOOK_EVENTS.items()
    ),
    RunSetting(
        "limit",
        1,
        "Semaphore: up to N holders at once, each in its own slot 0..N-1 (TASKLOCK_SLOT); "
        "every holder of KEY must use the same N.  [default: 1]",
        integer=(1, MAX_LIMIT),
    ),
)
BY_NAME = {setting.name: setting for setting in RUN_SETTINGS}
BY_FLAG = {setting.flag: setting for setting in RUN_SETTINGS}


@dataclass(frozen=True)
class RunSwitch(_Configured):
    """A ``run`` setting that is on or off: ``name = true|false`` in a config file, or its
    flag, which turns it from its default (``--name`` for one that is off by default,
    ``--no-<name>`` for one that is on)."""

    name: str
    help: str
    default: bool = False

    @property
    def flag(self) -> str:
        return f"--no-{self.name}" if self.default else f"--{self.name}"

    @property
    def parameter(self) -> str:
        """The flag as a Python parameter name (typer's)."""
        return self.flag[2:].replace("-", "_")


RUN_SWITCHES: tuple[RunSwitch, ...] = (
    RunSwitch(
        "shared",
        "Shared (reader) mode: any number of --shared runs hold KEY together; a run "
        "without it holds KEY alone, and later --shared runs wait behind a waiting one.",
    ),
    RunSwitch(
        "replace",
        "When KEY is held, break the holder as release --force does (it exits 70) and take "
        "the lock as soon as it lets go, ahead of every waiting run.",
    ),
    RunSwitch(
        "supersede",
        "While waiting: a newer --supersede run of KEY makes this one give up (the conflict "
        "exit code), so only the newest waits.",
    ),
    RunSwitch(
        "record-args",
        "Keep only the command's first word in the ledger and the holder record (for "
        "commands that carry secrets in their arguments).",
        default=True,
    ),
)
SWITCHES_BY_NAME = {switch.name: switch for switch in RUN_SWITCHES}
SWITCHES_BY_FLAG = {switch.flag: switch for switch in RUN_SWITCHES}


def resolve_switches(flagged: set[str], in_file) -> dict[str, Any]:
    """Each switch: turned from its default when its flag was given (``flagged``: switch
    names), else what the config file (``in_file(name)``) says, else its default. Returns
    RunOptions field names."""
    values = {}
    for switch in RUN_SWITCHES:
        found = in_file(switch.name)
        if switch.name in flagged:
            values[switch.field] = not switch.default
        else:
            values[switch.field] = found if isinstance(found, bool) else switch.default
    return values


# Any below: the table's values differ in type by setting (a duration's float, an integer's
# int, None for "derived"), which RunOptions' fields state; the checks here are per setting.


def default(name: str) -> Any:
    return BY_NAME[name].default


def resolve(flags: dict[str, str | int | None], in_file, config_path) -> dict[str, Any]:
    """Each setting's value: flag > config file (``in_file(name)``) > built-in, checked
    together. A bad flag is a usage error; a bad value from the file a config error naming
    its line. Returns RunOptions field names."""
    values: dict[str, Any] = {}
    from_file: set[str] = set()
    given = {name for name, text in flags.items() if text is not None}
    for setting in RUN_SETTINGS:
        text = flags.get(setting.name)
        if text is not None:
            values[setting.name] = setting.parse_flag(text)
            continue
        found = in_file(setting.name)
        if found is not None:
            from_file.add(setting.name)
        values[setting.name] = found if found is not None else setting.default
    ttl, renew = values["ttl"], values["renew-every"]
    if renew is not None and not renew < ttl:
        problem = f"must be shorter than ttl ({format_duration(ttl)})"
        pair = {"ttl", "renew-every"}
        if pair & from_file and not pair & given:
            from tasklock_cli.config.lines import setting_error

            raise setting_error(config_path, "renew-every", problem)
        raise UsageError(f"--renew-every {problem}")
    return {BY_NAME[name].field: value for name, value in values.items()}
