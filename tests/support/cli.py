"""Running the real `tasklock` executable in subprocesses."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import IO

from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import LeaseInfo
from tasklock_cli.testing.helpers import wait_until


def executable() -> str:
    beside_python = Path(sys.executable).parent / "tasklock"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("tasklock")
    assert found, "the tasklock executable is not installed (pip install -e '.[test]')"
    return found


def tasklock(
    *args: str, env: dict[str, str], timeout: float = 60, **kwargs
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [executable(), *args], env=env, capture_output=True, text=True, timeout=timeout, **kwargs
    )


def python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``code`` run by this Python in a process of its own (``python -c``), its output."""
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30
    )


def start(*args: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen([executable(), *args], env=env, text=True, **kwargs)


def json_run(key: str, *options: str, command: list[str]) -> list[str]:
    """The arguments of ``tasklock --log-format json run KEY OPTIONS -- COMMAND``, for
    ``start`` or ``tasklock``: the run's events are JSON lines on stderr (``json_events``)."""
    return ["--log-format", "json", "run", key, *options, "--", *command]


def piped(stream: IO[str] | None) -> IO[str]:
    """A process's stdout or stderr pipe (``start`` opens both): typed optional, None where
    the process was started without ``PIPE`` for it."""
    assert stream is not None, "no pipe: the process was started with its own stream"
    return stream


def peek(url: str, key: str) -> LeaseInfo | None:
    with open_store(url) as store:
        return store.peek(key)


def wait_for_holder(url: str, key: str, timeout: float = 10) -> LeaseInfo:
    return wait_until(lambda: peek(url, key), timeout)


def wait_for_command(holder: subprocess.Popen, ready: Path, timeout: float = 10) -> None:
    """Until ``ready`` exists (the holder's command is up); else fail with what the holder
    said (CI runs have waited for a PostgreSQL holder's command and said nothing more)."""
    try:
        wait_until(ready.exists, timeout=timeout)
    except AssertionError:
        if holder.poll() is None:
            holder.kill()
        _, stderr = holder.communicate(timeout=10)
        raise AssertionError(
            f"the holder's command never started (exit {holder.returncode}): {stderr[-2000:]}"
        ) from None


def json_events(stderr: str) -> list[dict]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


def lost_by(stderr: str) -> list[str]:
    """The ``detected_by`` of every ``lost`` event in a JSON-lines stderr."""
    return [event["detected_by"] for event in json_events(stderr) if event["event"] == "lost"]


def one_error_line(stderr: str) -> str:
    """The stderr of a failed command: exactly one line, the contract's error form."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("tasklock: error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]
