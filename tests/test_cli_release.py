"""release KEY --force [--token T] through the real executable, on every store: the lease is
broken, the holder is told at once, and release returns when the holder has let go (or
frees the lease itself after 10 s). The holders here are held through the Python store API."""

from __future__ import annotations

import re
import threading
import time
import uuid

import pytest

from tasklock_cli.stores import open_store
from tasklock_cli.stores.base import Holder
from tests.support.cli import tasklock

HOLDER = Holder(host="host-a", pid=4242, user="alice", command=["./job.sh"], note=None)
OTHER = Holder(host="host-b", pid=99, user="bob", command=["true"], note=None)


@pytest.fixture
def env(cli_env, store_url):
    return {**cli_env, "TASKLOCK_STORE": store_url}


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


@pytest.mark.slow
def test_a_holder_that_does_not_answer_is_freed_after_10s(cli_env, sqlite_url):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    with open_store(sqlite_url) as store:
        lease = store.acquire("k", 60, HOLDER, uuid.uuid4().hex)  # and never lets go
        started = time.monotonic()
        result = tasklock("release", "k", "--force", env=env)
        took = time.monotonic() - started
        assert result.returncode == 0, result.stderr
        assert result.stdout == (
            _broke("k", lease.fencing_token)
            + "; the holder did not answer within 10s, so the lease was freed anyway\n"
        )
        assert 10 <= took < 15
        assert store.peek("k") is None
        assert store.release(lease) is False
        nxt = store.acquire("k", 30, OTHER, uuid.uuid4().hex)
        assert nxt is not None and nxt.fencing_token == lease.fencing_token + 1
