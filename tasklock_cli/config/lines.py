"""A problem with a setting read from a config file, named by the file and the setting's line."""

from __future__ import annotations

from tasklock_cli.errors import ConfigError

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path


def setting_error(path: Path, setting: str, problem: str) -> ConfigError:
    """A problem with a setting read from the file at ``path``, naming its line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        text = ""
    return bad_setting(path, text, setting, problem)


def bad_setting(path: Path, text: str, setting: str, problem: str) -> ConfigError:
    line = _line_of(text, setting)
    where = f"{path}:{line}" if line else str(path)
    return ConfigError(f"{where}: setting {setting!r} {problem}")


def _line_of(text: str, setting: str) -> int | None:
    import re

    pattern = re.compile(rf"^\s*(\[[^\]]*)?[\"']?{re.escape(setting)}[\"']?\s*[=\].]")
    for number, line in enumerate(text.splitlines(), start=1):
        if pattern.search(line):
            return number
    return None
