"""`tasklock metrics` through the real executable, read back by a strict parser of the
Prometheus text exposition format (0.0.4)."""

from __future__ import annotations

import json
import math
import re
from datetime import datetime

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.model import LEDGER_KEEP
from tasklock_cli.stores.model import Holder
from tasklock_cli.stores.model import RunRecord
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.contract import granted

HOLDER = Holder(host="cron-host", pid=7, user="cron", command=["./report.sh"])

METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
FLOAT = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?|[+-]?Inf|NaN")


class ExpositionError(ValueError):
    pass


def _unescape(text: str, allowed: str) -> str:
    out, i = [], 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            if i + 1 >= len(text) or text[i + 1] not in allowed:
                raise ExpositionError(f"bad escape in {text!r}")
            out.append({"\\": "\\", '"': '"', "n": "\n"}[text[i + 1]])
            i += 2
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _labels(text: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        name = LABEL_NAME.match(text, pos)
        if not name or text[name.end() : name.end() + 2] != '="':
            raise ExpositionError(f"bad label at {text[pos:]!r}")
        pos = name.end() + 2
        raw = re.compile(r'((?:[^"\\]|\\.)*)"').match(text, pos)
        if not raw:
            raise ExpositionError(f"unterminated label value in {text!r}")
        if name.group() in labels:
            raise ExpositionError(f"label {name.group()} twice")
        labels[name.group()] = _unescape(raw.group(1), '\\"n')
        pos = raw.end()
        if pos < len(text):
            if text[pos] != ",":
                raise ExpositionError(f"expected ',' in {text!r}")
            pos += 1
    return labels


def parse_exposition(text: str) -> tuple[dict[str, str], dict[str, str], dict]:
    """(HELP per family, TYPE per family, {(name, sorted label items): value}); raises
    ExpositionError on anything the format does not allow (or that we never write)."""
    if text and not text.endswith("\n"):
        raise ExpositionError("the last line has no line feed")
    helps: dict[str, str] = {}
    types: dict[str, str] = {}
    samples: dict[tuple, float] = {}
    finished: set[str] = set()
    current: str | None = None
    for line in text.split("\n")[:-1]:
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
                raise ExpositionError(f"bad comment line {line!r}")
            name = parts[2]
            if not METRIC_NAME.fullmatch(name):
                raise ExpositionError(f"bad metric name {name!r}")
            if parts[1] == "HELP":
                if name in helps:
                    raise ExpositionError(f"second HELP for {name}")
                helps[name] = _unescape(parts[3] if len(parts) > 3 else "", "\\n")
            else:
                if name in types or any(key[0] == name for key in samples):
                    raise ExpositionError(f"TYPE for {name} twice or after its samples")
                if len(parts) != 4 or parts[3] not in TYPES:
                    raise ExpositionError(f"bad TYPE line {line!r}")
                types[name] = parts[3]
            continue
        match = re.fullmatch(r"([^{ ]+)(?:\{(.*)\})? (\S+)( -?\d+)?", line)
        if not match or not METRIC_NAME.fullmatch(match.group(1)):
            raise ExpositionError(f"bad sample line {line!r}")
        name = match.group(1)
        if name != current:
            if name in finished:
                raise ExpositionError(f"samples of {name} are not together")
            if current is not None:
                finished.add(current)
            current = name
        if not FLOAT.fullmatch(match.group(3)):
            raise ExpositionError(f"bad value in {line!r}")
        labels = tuple(sorted(_labels(match.group(2) or "").items()))
        if (name, labels) in samples:
            raise ExpositionError(f"duplicate sample {line!r}")
        samples[(name, labels)] = float(match.group(3).replace("Inf", "inf"))
    return helps, types, samples


def test_the_parser_is_strict():
    good = '# HELP m x\n# TYPE m gauge\nm{key="a\\"b\\\\c\\nd"} 1\n'
    assert parse_exposition(good)[2] == {("m", (("key", 'a"b\\c\nd'),)): 1.0}
    for bad in (
        '# TYPE m gauge\nm{key="a\\tb"} 1\n',  # unknown escape
        '# TYPE m gauge\nm{key="a"b"} 1\n',  # raw quote
        "# TYPE m gauge\nm 1",  # no final line feed
        "# TYPE m gauge\nm 1\n# TYPE m gauge\n",
        '# TYPE m gauge\n# TYPE n gauge\nm 1\nn 1\nm{a="b"} 2\n',  # not together
        "# TYPE m gauge\nm one\n",
        '# TYPE m gauge\nm{key="a",key="b"} 1\n',
    ):
        with pytest.raises(ExpositionError):
            parse_exposition(bad)


FAMILIES = (
    "tasklock_last_start_timestamp_seconds",
    "tasklock_last_success_timestamp_seconds",
    "tasklock_last_exit_code",
    "tasklock_last_duration_seconds",
    "tasklock_held",
    "tasklock_held_shared",
    "tasklock_waiting",
    "tasklock_malformed_records",
)


def metrics(env: dict[str, str], *args: str) -> dict:
    result = tasklock("metrics", *args, env=env)
    assert result.returncode == 0, result.stderr
    helps, types, samples = parse_exposition(result.stdout)
    assert list(types) == list(FAMILIES) and set(types.values()) == {"gauge"}
    assert set(helps) == set(FAMILIES) and all(helps.values())
    return {(name, dict(labels)["key"]): value for (name, labels), value in samples.items()}


def timestamp(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def test_metrics_from_the_ledger_and_the_live_leases(env, store_url):
    odd = 'nightly "job" \\ backup'
    assert tasklock("run", odd, "--", "true", env=env).returncode == 0
    assert tasklock("run", odd, "--", "sh", "-c", "sleep 0.2; exit 3", env=env).returncode == 3
    assert tasklock("run", "other", "--", "true", env=env).returncode == 0
    holder = start("run", "held", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(store_url, "held")
        got = metrics(env)
    finally:
        holder.terminate()
        holder.wait(timeout=20)

    runs = json.loads(tasklock("history", odd, "--json", env=env).stdout)
    failed, succeeded = runs
    assert got[("tasklock_last_exit_code", odd)] == 3
    assert got[("tasklock_last_start_timestamp_seconds", odd)] == pytest.approx(
        timestamp(failed["started_at"]), abs=0.001
    )
    assert got[("tasklock_last_success_timestamp_seconds", odd)] == pytest.approx(
        timestamp(succeeded["ended_at"]), abs=0.001
    )
    took = timestamp(failed["ended_at"]) - timestamp(failed["started_at"])
    assert got[("tasklock_last_duration_seconds", odd)] == pytest.approx(took, abs=0.002)
    assert 0.2 <= took < 10
    assert got[("tasklock_held", odd)] == 0
    assert got[("tasklock_held", "held")] == 1
    assert got[("tasklock_waiting", "held")] == got[("tasklock_waiting", odd)] == 0
    assert got[("tasklock_last_exit_code", "other")] == 0
    assert {key for _, key in got} == {odd, "other", "held"}
    # a key held but never run yet has only the families of live holders and waiters
    assert [name for name, key in got if key == "held"] == [
        "tasklock_held",
        "tasklock_held_shared",
        "tasklock_waiting",
        "tasklock_malformed_records",
    ]
    assert got[("tasklock_malformed_records", "held")] == 0
    assert got[("tasklock_held_shared", "held")] == 0


def test_metrics_prefix_and_an_empty_store(env):
    assert metrics(env) == {}
    assert tasklock("run", "deploy:web", "--", "true", env=env).returncode == 0
    assert tasklock("run", "backup", "--", "sh", "-c", "exit 1", env=env).returncode == 1
    got = metrics(env, "--prefix", "deploy:")
    assert {key for _, key in got} == {"deploy:web"}
    failed_only = metrics(env, "--prefix", "backup")
    assert ("tasklock_last_success_timestamp_seconds", "backup") not in failed_only
    assert failed_only[("tasklock_last_exit_code", "backup")] == 1


def test_a_lost_run_has_no_exit_code(sqlite_url, cli_env):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    holder = start("run", "k", "--", "sleep", "30", env=env)
    try:
        wait_for_holder(sqlite_url, "k")
        assert tasklock("release", "k", "--force", env=env).returncode == 0
        assert holder.wait(timeout=20) == 70
    finally:
        holder.kill()
        holder.wait()
    got = metrics(env)
    assert math.isnan(got[("tasklock_last_exit_code", "k")])
    assert ("tasklock_last_success_timestamp_seconds", "k") not in got


def test_the_last_success_outlives_the_trim_of_many_later_runs(env, store_url):
    """A frequent --once-per cron adds a done-already record per run: the success they
    follow must stay the key's last success, past the ledger's last LEDGER_KEEP runs."""
    assert tasklock("run", "cron", "--", "true", env=env).returncode == 0
    (succeeded,) = json.loads(tasklock("history", "cron", "--json", env=env).stdout)
    with open_store(store_url) as store:
        for number in range(LEDGER_KEEP + 3):
            lease = granted(store.acquire("cron", 30, HOLDER, f"owner-{number}"))
            token, started = lease.fencing_token, lease.acquired_at
            done = RunRecord("cron", token, HOLDER, started, None, "done-already")
            assert store.release(lease, record=done) is True
    runs = json.loads(tasklock("history", "cron", "--json", env=env).stdout)
    assert len(runs) == LEDGER_KEEP and {r["outcome"] for r in runs} == {"done-already"}

    got = metrics(env)
    assert got[("tasklock_last_success_timestamp_seconds", "cron")] == pytest.approx(
        timestamp(succeeded["ended_at"]), abs=0.001
    )
