"""A client whose wall clock is hours off never changes who holds a PostgreSQL or Redis lease:
expiry is the server's business (libfaketime moves the wrapper's wall clock)."""

from __future__ import annotations

import glob
import subprocess
import time
from datetime import datetime
from datetime import timezone

import pytest

from tests.support import report
from tests.support import services
from tests.support.cli import executable
from tests.support.cli import json_events
from tests.support.cli import peek
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder


@pytest.fixture
def network_url(network_store_url):
    if libfaketime() is None:
        if services.in_ci():
            pytest.fail("CI=true but faketime is not installed (.ci/run installs it)")
        pytest.skip("faketime is not installed (apt-get install faketime)")
    return network_store_url


def libfaketime() -> str | None:
    """The preload library itself, so the skewed process is ours to signal (not a wrapper)."""
    for path in glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1") + glob.glob(
        "/usr/lib/faketime/libfaketimeMT.so.1"
    ):
        return path
    return None


def skewed(offset: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """Run under a wall clock moved by ``offset``; monotonic clocks stay true."""
    library = libfaketime()
    assert library is not None  # the network_url fixture skips the test without it
    return [], {
        **env,
        "LD_PRELOAD": library,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def run_skewed(offset: str, env: dict[str, str], *args: str):
    prefix, env = skewed(offset, env)
    return subprocess.run(
        [*prefix, executable(), *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_skewed_clients_neither_steal_nor_extend(network_url, cli_env):
    env = {**cli_env, "TASKLOCK_STORE": network_url}
    # The tables first, with the default I/O timeout: a first run with a 2 s TTL makes them
    # within its own 0.33 s, which a loaded CI run once missed (MySQL: 69). Not this test's
    # subject: the clocks are.
    assert tasklock("init", env=env).returncode == 0
    prefix, ahead_env = skewed("+3h", env)
    holder = subprocess.Popen(
        [*prefix, executable(), "run", "k", "--ttl", "2s", "--", "sleep", "30"], env=ahead_env
    )
    try:
        info = wait_for_holder(network_url, "k")
        remaining = (info.expires_at - datetime.now(timezone.utc)).total_seconds()
        assert 0 < remaining <= 2.5  # the server's clock, not the holder's +3h
        behind = run_skewed("-3h", env, "run", "k", "--", "true")
        assert behind.returncode == 75  # a client 3 h behind does not see it as expired
        ahead = run_skewed("+3h", env, "run", "k", "--", "true")
        assert ahead.returncode == 75  # nor one 3 h ahead
    finally:
        holder.kill()
        holder.wait()
    killed_at = time.monotonic()
    late = run_skewed("+5h", env, "--log-format", "json", "run", "k", "--wait", "10s", "--", "true")
    assert late.returncode == 0, late.stderr
    assert time.monotonic() - killed_at >= 1.0  # the lease ran out on the server's schedule
    acquired = next(e for e in json_events(late.stderr) if e["event"] == "acquired")
    event_time = datetime.fromisoformat(acquired["ts"].replace("Z", "+00:00"))
    assert (event_time - datetime.now(timezone.utc)).total_seconds() > 4.5 * 3600  # skewed
    assert acquired["fencing_token"] > info.fencing_token
    assert peek(network_url, "k") is None
    report.record(
        "client wall clock -3h/+3h/+5h",
        report.store_of(network_url),
        steals=0,
        reacquired_after_s=time.monotonic() - killed_at,
    )
