"""Failover tests' runs under the real `tasklock` (PostgreSQL, MySQL, Redis): each run's
command writes a marker file (its token, its start, then a line every 20 ms, its end), so
overlaps are measured, not assumed."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.support.cli import json_events
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_until

KEY = "nightly"
TTL = "6s"
#: The TTL of ``Runs.run``, a run to its end whose timing no test looks at. With TTL's 6 s
#: its I/O timeout was 1 s, and a first connection or acquire on a server just started from
#: a backup or promoted, beside the suite's other workers on two cores, took longer now and
#: then (69: "connection timeout expired", "no answer within 1 s"). 20 s: 3.3 s. At most
#: 30 s, so that a quarantine stays 32 s.
RUN_TTL = "20s"
#: What a run may exit with across a failover: done, store unavailable, lease lost, conflict.
EXIT_CODES = {0, 69, 70, 75}
MARKER = """\
import os, sys, time
path, seconds = sys.argv[1], float(sys.argv[2])
token = os.environ["TASKLOCK_FENCING_TOKEN"]
def note(what):
    with open(path, "a") as out:
        out.write(f"{what} {token} {time.time():.6f}\\n")
note("start")
end = time.monotonic() + seconds
while time.monotonic() < end:
    note("alive")
    time.sleep(0.02)
note("end")
"""

#: (first mark, last mark, token, name) of a run whose command ran.
Span = tuple[float, float, int, str]


class Runs:
    """`tasklock run` processes on ``key``, each running MARKER into a marker file named
    after the run; ``options`` go on every `run` that ``start`` starts."""

    def __init__(
        self,
        url: str,
        env: dict[str, str],
        tmp_path: Path,
        *,
        key: str = KEY,
        options: tuple[str, ...] = ("--grace", "1s"),
    ) -> None:
        self.env = {**env, "TASKLOCK_STORE": url}
        self.key = key
        self.options = options
        self.dir = tmp_path / "marks"
        self.dir.mkdir()
        self.script = tmp_path / "marker.py"
        self.script.write_text(MARKER)
        self.started: dict[str, subprocess.Popen] = {}

    def command(self, name: str, seconds: float) -> list[str]:
        return [sys.executable, str(self.script), str(self.dir / f"{name}.marks"), str(seconds)]

    def start(
        self, name: str, seconds: float, *options: str, url: str | None = None
    ) -> subprocess.Popen:
        """A run in the background, with JSON events on its stderr (``url``: its own store
        URL instead of the runs' one)."""
        args = ["--log-format", "json", "run", self.key, "--ttl", TTL, *self.options, *options]
        command = self.command(name, seconds)
        env = self.env if url is None else {**self.env, "TASKLOCK_STORE": url}
        process = start(*args, "--", *command, env=env, stdout=subprocess.DEVNULL)
        self.started[name] = process
        return process

    def run(self, name: str, seconds: float, *options: str) -> subprocess.CompletedProcess:
        """A run to its end, in text mode (its conflict message is on stderr), with
        RUN_TTL: its outcome and token are the test's, not its timing."""
        args = ["run", self.key, "--ttl", RUN_TTL, *options]
        return tasklock(*args, "--", *self.command(name, seconds), env=self.env, timeout=120)

    def doctor(self, check: str) -> str:
        """``doctor``'s line about ``check``, as printed (``ok``/``warn``/``fail`` first)."""
        result = tasklock("doctor", env=self.env, timeout=60)
        lines = [line for line in result.stdout.splitlines() if line.split()[1:2] == [check]]
        assert len(lines) == 1, result.stdout + result.stderr
        return lines[0]

    def marks(self, name: str) -> list[tuple[str, int, float]]:
        path = self.dir / f"{name}.marks"
        if not path.exists():
            return []
        rows = [line.split() for line in path.read_text().splitlines()]
        return [(what, int(token), float(at)) for what, token, at in rows]

    def started_file(self, name: str) -> bool:
        return bool(self.marks(name))

    def waiting(self) -> list[dict]:
        """The runs waiting for the key, as `peek --json` lists them."""
        peeked = tasklock("peek", self.key, "--json", env=self.env, timeout=60)
        return json.loads(peeked.stdout).get("waiters", []) if peeked.stdout else []

    def spans(self) -> list[Span]:
        """Every run whose command ran, by start."""
        found = []
        for path in self.dir.glob("*.marks"):
            marks = self.marks(path.stem)
            if marks:
                found.append((marks[0][2], marks[-1][2], marks[0][1], path.stem))
        return sorted(found)

    def finish(self, timeout: float = 120) -> dict[str, tuple[int, str]]:
        """name -> (exit code, stderr) of every started run."""
        finished = {}
        for name, process in self.started.items():
            _, stderr = process.communicate(timeout=timeout)
            finished[name] = (process.returncode, stderr)
        return finished


def assert_one_at_a_time(runs: Runs) -> list[Span]:
    """No two commands ran at once; tokens strictly increase in start order."""
    spans = runs.spans()
    for before, after in itertools.pairwise(spans):
        (_, earlier_end, earlier_token, earlier), (later_start, _, later_token, later) = (
            before,
            after,
        )
        assert later_start > earlier_end, f"{later} started while {earlier} still ran: {spans}"
        assert later_token > earlier_token, f"{later} got token {later_token}: {spans}"
    return spans


def assert_lost_holder_fenced(
    runs: Runs,
    finished: dict[str, tuple[int, str]],
    refused: subprocess.CompletedProcess,
    epoch: int,
    quarantine: float,
    moments: tuple[float, float],
    others: dict[str, tuple[int, int]] | None = None,
) -> dict[str, object]:
    """The asynchronous failover's outcome: the promoted server never heard of the holder's
    lease (token 2, after the warm-up's 1); the holder lost it (70); ``refused``, run after
    the promotion, was kept out by the quarantine (75), and the waiter and the late waiter
    ran one at a time after it with tokens of the new ``epoch``. ``moments``: when the
    primary was killed and when the other server was promoted; ``others``: more runs,
    name -> (exit code, the one expected). Returns the figures for the report."""
    codes = {name: code for name, (code, _) in finished.items()}
    codes["refused"] = refused.returncode
    codes.update({name: code for name, (code, _) in (others or {}).items()})
    expected = {"holder": 70, "waiter": 0, "late-waiter": 0, "refused": 75}
    expected.update({name: code for name, (_, code) in (others or {}).items()})
    assert set(codes.values()) <= EXIT_CODES, codes
    assert codes == expected, finished
    assert "primary changed" in refused.stderr, refused.stderr
    waiting = [e for e in json_events(finished["late-waiter"][1]) if e["event"] == "waiting"]
    assert "primary changed" in waiting[0]["reason"], waiting
    lost = [e for e in json_events(finished["holder"][1]) if e["event"] == "lost"]
    assert [e["detected_by"] for e in lost] in (["rejected"], ["unreachable"]), lost
    spans = assert_one_at_a_time(runs)
    tokens = {name: token for _, _, token, name in spans}
    assert tokens["warm-up"] == 1 and tokens["holder"] == 2  # the promoted one never saw 2
    assert epoch > 0 and tokens["waiter"] >= epoch << 30 and tokens["late-waiter"] >= epoch << 30
    assert "refused" not in tokens  # its command never ran
    assert 32.0 <= quarantine < 33.0  # max(longest TTL 6 s, 30 s) + 2 s
    killed_at, promoted_at = moments
    holder_end = runs.marks("holder")[-1][2]
    first_after = min(spans[2][0], spans[3][0])
    return {
        "quarantine_s": quarantine,
        "tokens_before": [tokens["warm-up"], tokens["holder"]],
        "tokens_after": sorted([tokens["waiter"], tokens["late-waiter"]]),
        "kill_to_next_run_s": first_after - killed_at,
        "holder_ran_after_promotion_s": holder_end - promoted_at,
        "exit_codes": sorted(codes.values()),
    }


#: A TTL longer than any the namespace granted before (issue 46): the new primary's
#: quarantine (32 s) is shorter than it.
LONG_TTL = "2m"


def long_ttl_holder_fenced(
    runs: Runs, holder_url: str, fail_over: Callable[[], object]
) -> dict[str, object]:
    """A holder with ``--ttl 2m``, a TTL the namespace never granted, whose lease the new
    primary never receives (the caller cut the replication link, after a warm-up run with
    the default test TTL), at ``holder_url``: through the clients' endpoint (it reaches the
    new primary, which rejects its renewals), or the old primary's own address (cut off).
    ``fail_over()`` kills the primary and promotes the replica; a successor then waits.
    Without a window on long TTLs, the holder would learn of the loss at a renewal 40 s
    apart, or run to its own 2 minute deadline, beside the successor granted after 32 s.
    Checks: no overlap, the successor's token above the holder's; returns the figures."""
    holder = runs.start("holder", 150, "--ttl", LONG_TTL, url=holder_url)
    wait_until(lambda: runs.started_file("holder"), timeout=20)
    failed_over_at = time.time()
    fail_over()
    runs.start("successor", 1, "--wait", "200s")
    finished = runs.finish(timeout=240)
    assert finished["holder"][0] == 70, finished["holder"]
    assert finished["successor"][0] == 0, finished["successor"]
    lost = [e for e in json_events(finished["holder"][1]) if e["event"] == "lost"]
    assert len(lost) == 1, lost
    spans = {name: (first, last, token) for first, last, token, name in assert_one_at_a_time(runs)}
    assert spans["successor"][2] > 2**60 > spans["holder"][2]
    assert holder.returncode == 70
    return {
        "detected_by": lost[0]["detected_by"],
        "holder_ran_after_failover_s": round(spans["holder"][1] - failed_over_at, 2),
        "failover_to_next_run_s": round(spans["successor"][0] - failed_over_at, 2),
    }


#: The inspections that warn of a quarantine: on a free key ``a``, and ``list``.
INSPECTIONS = (("peek", "a"), ("peek", "a", "--json"), ("list",), ("release", "a", "--force"))


def assert_inspections_warn(env: dict[str, str], change: str, scope: str) -> None:
    """A quarantine under way in the store of ``env`` (whose key ``held`` is held): the real
    ``peek``, ``list`` and ``release --force`` say on stderr that ``change`` keeps the
    ``scope`` from new holders; their stdout is as ever; ``-q`` silences the warning."""
    free = tasklock("peek", "a", env=env)
    assert free.returncode == 1 and "a is free" in free.stdout
    assert f"tasklock: warning: {change}" in free.stderr, free.stderr
    assert f"no new lease in this {scope} for" in free.stderr
    as_json = tasklock("peek", "a", "--json", env=env)
    assert json.loads(as_json.stdout) == {"key": "a", "held": False, "waiters": []}
    assert change in as_json.stderr
    listed = tasklock("list", env=env)
    assert listed.stdout.startswith("held\t") and change in listed.stderr
    released = tasklock("release", "a", "--force", env=env)
    assert released.returncode == 0 and change in released.stderr
    assert tasklock("-q", "peek", "a", env=env).stderr == ""


def assert_inspections_quiet(env: dict[str, str], change: str) -> None:
    """No quarantine under way: no inspection names ``change``."""
    for command in INSPECTIONS:
        done = tasklock(*command, env=env)
        assert change not in done.stderr, (command, done.stderr)
