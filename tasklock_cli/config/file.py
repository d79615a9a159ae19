"""Settings: flag > environment > config file > built-in default.

The config file is TOML, found at ``--config FILE`` > ``$TASKLOCK_CONFIG`` > ``./tasklock.toml``
> ``$XDG_CONFIG_HOME/tasklock/config.toml`` > ``/etc/tasklock/config.toml``::

    store = "postgresql://db/locks"
    ttl = "30s"
    [keys."invoices:*"]
    ttl = "5m"
"""

from __future__ import annotations

import os
import sys

from tasklock_cli.config.settings import BY_NAME
from tasklock_cli.config.settings import SWITCHES_BY_NAME
from tasklock_cli.errors import ConfigError
from tasklock_cli.errors import UsageError
from tasklock_cli.util import paths
from tasklock_cli.util.durations import duration_examples
from tasklock_cli.util.durations import parse_duration
from tasklock_cli.util.records import dataclass
from tasklock_cli.util.records import field

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path


@dataclass
class Config:
    path: Path | None = None
    store: str | None = None
    run_defaults: dict[str, object] = field(default_factory=dict)
    key_overrides: list[tuple[str, dict[str, object]]] = field(default_factory=list)

    def run_setting(self, key: str, name: str) -> object | None:
        """The file's value of a ``run`` setting for this key: the last matching pattern wins."""
        value = self.run_defaults.get(name)
        for pattern, settings in self.key_overrides:
            if _fnmatchcase(key, pattern) and name in settings:
                value = settings[name]
        return value


def _fnmatchcase(key: str, pattern: str) -> bool:
    import fnmatch  # with its re: only for a config file with key patterns

    return fnmatch.fnmatchcase(key, pattern)


def config_candidates(explicit: str | None) -> list[tuple[str, bool]]:
    """(path, must_exist) in the order they are looked for; the paths as ``str(Path(...))``
    (pathlib is imported only for a file found: most runs have none)."""
    if explicit:
        return [(paths.normal(explicit), True)]
    if os.environ.get("TASKLOCK_CONFIG"):
        return [(paths.normal(os.environ["TASKLOCK_CONFIG"]), True)]
    config_home = paths.xdg_home("XDG_CONFIG_HOME", ".config")
    return [
        ("tasklock.toml", False),
        (paths.joined(config_home, "tasklock", "config.toml"), False),
        ("/etc/tasklock/config.toml", False),
    ]


def load_config(explicit: str | None = None) -> Config:
    for path, must_exist in config_candidates(explicit):
        try:
            found = paths.is_file(path)
        except OSError as exc:  # EACCES: a directory on the way is not ours to read
            raise ConfigError(f"cannot look for config file {path}: {exc.strerror}") from exc
        if found:
            from pathlib import Path

            if must_exist:
                return parse_config_file(Path(path))
            # Found by ourselves: someone else may have put it there.
            return parse_config_file(Path(path), read_trusted(path))
        if must_exist:
            if paths.is_dir(path):
                raise ConfigError(f"config file {path} is a directory")
            raise ConfigError(f"config file {path} does not exist")
    return Config()


def read_trusted(path: str) -> str:
    """The text of the config file at ``path``, opened once and checked through that fd
    (``refuse_untrusted``): what is read is what was checked, whatever is renamed meanwhile."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # (a FIFO swapped in must not block)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as file:
        refuse_untrusted(path, os.fstat(fd))
        data = file.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc


def refuse_untrusted(path: str, opened: os.stat_result) -> None:
    """ConfigError unless the config file ``opened`` from ``path`` is trusted.

    - The file must belong to us or root, and no one else may write to it.
    - The same holds for its name, and for the directory holding it, which could swap it.
    - This is git's CVE-2022-24765: a ./tasklock.toml in a shared directory must not choose
      our store or TTL.
    - A directory others may write to is fine when it is sticky (/tmp).
      They cannot rename or remove our file there."""
    import stat

    trusted = (0, os.geteuid())
    link = os.lstat(path)
    directory = os.stat(os.path.dirname(os.path.abspath(path)))
    directory_mode = stat.S_IMODE(directory.st_mode)
    why = None
    if not stat.S_ISREG(opened.st_mode):
        why = "it is not a regular file"
    elif link.st_uid not in trusted or opened.st_uid not in trusted:
        owner = link.st_uid if link.st_uid not in trusted else opened.st_uid
        why = f"it belongs to {_user(owner)}, not to you or root"
    elif opened.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        why = f"group or others may write to it (mode {stat.S_IMODE(opened.st_mode):04o})"
    elif directory.st_uid not in trusted:
        why = f"its directory belongs to {_user(directory.st_uid)}, not to you or root"
    elif directory_mode & (stat.S_IWGRP | stat.S_IWOTH) and not directory_mode & stat.S_ISVTX:
        why = (
            f"its directory is writable by group or others and not sticky (mode "
            f"{directory_mode:04o}): they could swap the file"
        )
    if why:
        raise ConfigError(
            f"config file {path} is not used: {why} (fix its owner or mode, or name it "
            "with --config or TASKLOCK_CONFIG)"
        )


def _user(uid: int) -> str:
    import pwd

    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def parse_config_file(path: Path, text: str | None = None) -> Config:
    """The config file at ``path`` (``text``: its contents, when read already)."""
    if text is None:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if sys.version_info >= (3, 11):  # imported here: most runs have no config file
        import tomllib
    else:  # pragma: no cover - exercised on 3.10 only
        import tomli as tomllib
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    config = Config(path=path)
    for name, value in data.items():
        if name == "store":
            if not isinstance(value, str):
                raise bad_setting(path, text, name, "must be a store URL string")
            if not value.strip():
                raise bad_setting(path, text, name, f"is empty {_EMPTY_STORE_HINT}")
            config.store = value
        elif name == "keys":
            if not isinstance(value, dict):
                raise bad_setting(
                    path, text, name, 'must be a table of key patterns ([keys."job:*"])'
                )
            for pattern, settings in value.items():
                if not isinstance(settings, dict):
                    raise bad_setting(path, text, pattern, "must be a table of run settings")
                config.key_overrides.append((pattern, _run_settings(path, text, settings)))
        elif name in BY_NAME or name in SWITCHES_BY_NAME:
            config.run_defaults.update(_run_settings(path, text, {name: value}))
        else:
            known = ["store", "keys", *BY_NAME, *SWITCHES_BY_NAME]
            raise bad_setting(
                path, text, name, f"is not a tasklock setting{did_you_mean(name, known)}"
            )
    return config


def _run_settings(path: Path, text: str, settings: dict) -> dict[str, object]:
    checked: dict[str, object] = {}
    for name, value in settings.items():
        if name in SWITCHES_BY_NAME:
            if not isinstance(value, bool):
                raise bad_setting(path, text, name, "must be true or false")
            checked[name] = value
            continue
        setting = BY_NAME.get(name)
        if setting is None:
            known = [*BY_NAME, *SWITCHES_BY_NAME]
            raise bad_setting(path, text, name, f"is not a run setting{did_you_mean(name, known)}")
        if setting.text:
            if not isinstance(value, str):
                raise bad_setting(path, text, name, "must be a shell command (a string)")
            checked[name] = value
            continue
        if setting.integer:
            if not isinstance(value, int) or isinstance(value, bool) or setting.problem(value):
                low, high = setting.integer
                raise bad_setting(path, text, name, f"must be an integer from {low} to {high}")
            checked[name] = value
            continue
        try:
            seconds = parse_duration(str(value), option=name, allow_inf=setting.allow_inf)
        except UsageError:
            examples = duration_examples(setting.allow_inf)
            raise bad_setting(
                path, text, name, f"is not a duration: {value!r} ({examples})"
            ) from None
        problem = setting.problem(seconds)
        if problem:
            raise bad_setting(path, text, name, f"{problem} (got {value!r})")
        checked[name] = seconds
    return checked


_EMPTY_STORE_HINT = "(give a store URL, or leave the setting out for the default store)"


def resolve_store_url(flag: str | None, config: Config, default: Callable[[], str]) -> str:
    """--store > $TASKLOCK_STORE > the config file > ``default()`` (the caller's:
    ``stores.default_store_url``, which config, below the stores, does not import). A
    setting that is given but empty is an error, never "use the next one": a missing CI
    secret expands to empty."""
    for where, value in (("--store", flag), ("TASKLOCK_STORE", os.environ.get("TASKLOCK_STORE"))):
        if value is not None:
            if not value.strip():
                raise ConfigError(f"{where} is empty {_EMPTY_STORE_HINT}")
            return value
    return config.store or default()


def store_from_file(flag: str | None, config: Config) -> bool:
    """Whether the store URL in use came from the config file."""
    return flag is None and "TASKLOCK_STORE" not in os.environ and config.store is not None


def bad_setting(path: Path, text: str, setting: str, problem: str) -> ConfigError:
    """``config.lines.bad_setting``, imported when a file has a bad setting (not at every
    start: it names the setting's line with ``re``)."""
    from tasklock_cli.config.lines import bad_setting as at_its_line

    return at_its_line(path, text, setting, problem)


def store_setting_error(config: Config, problem: str) -> ConfigError:
    """A problem with the config file's ``store`` URL, naming the file and line."""
    assert config.path is not None
    from tasklock_cli.config.lines import setting_error

    return setting_error(config.path, "store", problem)


def store_url_source(flag: str | None, config: Config) -> str | None:
    """The config file (absolute) when ``resolve_store_url`` takes the URL from it."""
    if not store_from_file(flag, config) or config.path is None:
        return None
    return os.path.abspath(config.path)


def did_you_mean(name: str, known: list[str]) -> str:
    """``util.suggest``'s suggestion, imported only for a mistyped setting (a plain run's
    config file has none, and its start-up does without the module)."""
    from tasklock_cli.util.suggest import did_you_mean as suggestion

    return suggestion(name, known)
