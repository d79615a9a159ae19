"""release KEY --force [--token T] through the real executable, on every store: the lease is
broken, the holder is told at once, and release returns when the holder has let go (exit 0),
or, when it does not answer, leaves the key broken until its lease runs out (exit 75). The
holders here are held through the Python store API."""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from datetime import datetime
from datetime import timedelta

import pytest

from tasklock_cli.commands.release import LET_GO_TIMEOUT_ENV
from tasklock_cli.stores.model import Holder
from tests.support.cli import tasklock
from tests.support.cli import wait_until

HOLDER = Holder(host="host-a", pid=4242, user="alice", command=["./job.sh"], note=None)
OTHER = Holder(host="host-b", pid=99, user="bob", command=["true"], note=None)


def _broke(key: str, fencing_token: int) -> str:
    return f"broke the lease on {key} held by host-a pid 4242 (user alice, token {fencing_token})"


def test_release_of_a_free_key(env):
    result = tasklock("release", "free", "--force", env=env)
    assert (result.returncode, result.stdout, result.stderr) == (0, "free was not held\n", "")


def test_release_with_another_token_breaks_nothing(env, store):
    lease = store.acquire("k", 30, HOLDER, uuid.uuid4().hex)
    wrong = lease.fencing_token + 1
    result = tasklock("release", "k", "--force", "--token", str(wrong), env=env)
    assert (result.returncode, result.stdout) == (0, f"k is not held with token {wrong}\n")
    assert store.renew(lease, 30).fencing_token == lease.fencing_token  # not broken


def test_a_live_holder_lets_go_at_once_and_release_says_so(env, store, store_factory):
    lease = store.acquire("k", 30, HOLDER, uuid.uuid4().hex)
    heard: list[bool] = []

    def live_holder() -> None:  # what the supervisor does: hear the break, let go
        heard.append(store.wait_for_break(lease, 30))
        store.release(lease)

    thread = threading.Thread(target=live_holder)
    thread.start()
    started = time.monotonic()
    result = tasklock("release", "k", "--force", "--token", str(lease.fencing_token), env=env)
    took = time.monotonic() - started
    thread.join(timeout=10)
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(
        re.escape(_broke("k", lease.fencing_token)) + r"; the holder let go after (\d+\.\d\d)s\n",
        result.stdout,
    )
    assert match, result.stdout
    assert float(match.group(1)) < 1.0
    assert took < 5  # the executable's start-up included; nowhere near the 10 s
    assert heard == [True]
    nxt = store_factory().acquire("k", 30, OTHER, uuid.uuid4().hex)
    assert nxt is not None and nxt.fencing_token > lease.fencing_token


@pytest.mark.slow  # (waits out a 15 s lease)
def test_a_holder_that_does_not_answer_keeps_the_key_until_its_lease_runs_out(
    env, store, store_factory
):
    # outlasts two slow starts of `release` on a busy machine (8 s did not, beside other
    # suites on 2 cores: the lease ran out before the first)
    ttl = max(15.0, store.min_ttl)
    lease = store.acquire("k", ttl, HOLDER, uuid.uuid4().hex)  # and never answers
    quick = {**env, LET_GO_TIMEOUT_ENV: "0.3"}
    result = tasklock("release", "k", "--force", "--json", env=quick)
    assert result.returncode == 75, result.stderr
    out = json.loads(result.stdout)
    assert (out["key"], out["broken"], out["freed"]) == ("k", [lease.fencing_token], False)
    free_at = datetime.fromisoformat(out["free_at"].replace("Z", "+00:00"))
    # counted from the holder's last renewal: the break did not extend the lease
    assert free_at <= lease.expires_at + timedelta(seconds=1 if store.min_ttl else 0.01)
    other = store_factory()
    assert other.acquire("k", ttl, OTHER, uuid.uuid4().hex) is None  # nobody meanwhile
    assert [info.fencing_token for info in other.holders("k")] == [lease.fencing_token]
    text = tasklock("release", "k", "--force", env=quick)  # again: the same answer, as text
    assert text.returncode == 75
    assert text.stdout.startswith(_broke("k", lease.fencing_token))
    assert "did not answer within 0.3s: k stays taken, broken, until its lease runs out at " in (
        text.stdout
    )
    wait_until(lambda: not other.holders("k"), timeout=ttl + 3 + store.expiry_lag)
    nxt = other.acquire("k", 30, OTHER, uuid.uuid4().hex)
    assert nxt is not None and nxt.fencing_token > lease.fencing_token
    assert store.release(lease) is False  # it was not ours any more


def test_release_json_when_the_holder_lets_go_and_when_free(env, store):
    free = tasklock("release", "free", "--force", "--json", env=env)
    assert (free.returncode, json.loads(free.stdout)) == (
        0,
        {"key": "free", "broken": [], "freed": True, "free_at": None},
    )
    lease = store.acquire("k", 30, HOLDER, uuid.uuid4().hex)
    thread = threading.Thread(
        target=lambda: (store.wait_for_break(lease, 30), store.release(lease))
    )
    thread.start()
    result = tasklock("release", "k", "--force", "--json", env=env)
    thread.join(timeout=10)
    assert (result.returncode, json.loads(result.stdout)) == (
        0,
        {"key": "k", "broken": [lease.fencing_token], "freed": True, "free_at": None},
    )
