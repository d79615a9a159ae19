"""Store outages on private servers: shorter than the TTL the lease survives, longer the
command is terminated before the lease could run out."""

from __future__ import annotations

import contextlib
import time

import pytest

from tests.support import report
from tests.support import services
from tests.support.cli import json_events
from tests.support.cli import json_run
from tests.support.cli import lost_by
from tests.support.cli import peek
from tests.support.cli import start
from tests.support.cli import wait_until

TTL = 4.0


@contextlib.contextmanager
def private_store(kind: str):
    """(url, take_down, bring_up) for a throwaway server of this kind."""
    services.require(kind)
    if kind == "redis":
        from tests.support.redis_support import known_namespace
        from tests.support.redis_support import private_redis

        with private_redis() as server:
            yield known_namespace(server.url(prefix="outage:")), server.pause, server.resume
    else:
        from tests.support.pg import private_postgres

        with private_postgres() as server:
            yield server.url, lambda: server.stop("immediate"), server.start


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_short_outage_lease_survives(kind, cli_env, tmp_path):
    ready = tmp_path / "ready"
    with private_store(kind) as (url, take_down, bring_up):
        wrapper = start(
            *json_run("k", "--ttl", f"{TTL}s", command=["sh", "-c", f"touch {ready}; sleep 7"]),
            env={**cli_env, "TASKLOCK_STORE": url},
        )
        wait_until(ready.exists)
        before = peek(url, "k")
        assert before is not None
        take_down()
        time.sleep(1.2)
        bring_up()
        _, stderr = wrapper.communicate(timeout=30)
        events = json_events(stderr)
        assert wrapper.returncode == 0, stderr
        assert not [e for e in events if e["event"] == "lost"]
        renewed = [e for e in events if e["event"] == "renewed"]
        assert renewed and all(e["fencing_token"] == before.fencing_token for e in renewed)
        report.record(
            f"store down 1.2s < ttl {TTL:g}s", kind, renewals=len(renewed), lost=0, exit_code=0
        )


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgres", "redis"])
def test_long_outage_terminates_before_the_lease_runs_out(kind, cli_env, tmp_path):
    ready, log = tmp_path / "ready", tmp_path / "log"
    with private_store(kind) as (url, take_down, bring_up):
        script = f"touch {ready}; while :; do date +%s.%N >> {log}; sleep 0.02; done"
        wrapper = start(
            *json_run("k", "--ttl", f"{TTL}s", "--grace", "1s", command=["sh", "-c", script]),
            env={**cli_env, "TASKLOCK_STORE": url},
        )
        wait_until(ready.exists)
        take_down()
        down_at = time.time()
        try:
            _, stderr = wrapper.communicate(timeout=TTL + 10)
            exited_at = time.time()
        finally:
            bring_up()
        assert wrapper.returncode == 70
        lost = [e for e in json_events(stderr) if e["event"] == "lost"]
        assert [e["detected_by"] for e in lost] == ["unreachable"]
        last_sign_of_life = float(log.read_text().split()[-1])
        # The store set its last expiry before that reply arrived (the event's ts), so the
        # lease runs out by ts + TTL at the latest: the command was dead before then.
        from datetime import datetime

        confirmed = [
            datetime.fromisoformat(e["ts"].replace("Z", "+00:00")).timestamp()
            for e in json_events(stderr)
            if e["event"] in ("acquired", "renewed")
        ]
        assert last_sign_of_life < max(confirmed) + TTL
        assert max(confirmed) < down_at
        assert exited_at < down_at + TTL + 2
        report.record(
            f"store down > ttl {TTL:g}s",
            kind,
            exit_code=70,
            child_dead_before_expiry_by_s=max(confirmed) + TTL - last_sign_of_life,
        )


@pytest.mark.slow
def test_a_pending_kill_never_waits_past_the_deadline(cli_env, tmp_path):
    """max-lifetime starts a long --grace, then the store goes down: the SIGKILL is brought
    forward to the local deadline instead of waiting out the grace."""
    ready, log = tmp_path / "ready", tmp_path / "log"
    with private_store("redis") as (url, take_down, bring_up):
        script = f"trap '' TERM; touch {ready}; while :; do date +%s.%N >> {log}; sleep 0.02; done"
        options = ("--ttl", "3s", "--max-lifetime", "1s", "--grace", "60s")
        wrapper = start(
            *json_run("k", *options, command=["sh", "-c", script]),
            env={**cli_env, "TASKLOCK_STORE": url},
        )
        wait_until(ready.exists)
        time.sleep(1.2)  # past --max-lifetime: SIGTERM sent (ignored), SIGKILL planned at +60s
        take_down()
        down_at = time.time()
        try:
            _, stderr = wrapper.communicate(timeout=20)
        finally:
            bring_up()
        assert wrapper.returncode == 70
        lost = lost_by(stderr)
        assert lost == ["max-lifetime"]
        last_sign_of_life = float(log.read_text().split()[-1])
        assert last_sign_of_life < down_at + 3  # dead before the lease could run out
