"""Fencing counters that someone else wrote (issue 40): a counter below 0, or one that is no
integer, is refused with a configuration error (78) rather than counted on from (token -4
or 0) or restarted at 1, which would hand out a token again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import store_url_for
from tests.support import services
from tests.support.cli import tasklock
from tests.support.forge import set_counter


@pytest.fixture(params=["sqlite", "postgres", "redis", "mysql"])
def url(request, tmp_path) -> Iterator[str]:
    services.require(request.param)
    fresh = store_url_for(request.param, tmp_path)
    yield fresh
    services.cleanup(request.param, fresh)


@pytest.mark.parametrize("forged", [-5, 9.3e18])
def test_a_forged_counter_is_refused_not_counted_on(url, cli_env, forged):
    if isinstance(forged, float) and not url.startswith("sqlite"):
        forged = -1  # (a BIGINT column, a Redis INCR: only SQLite keeps a real number)
    env = {**cli_env, "TASKLOCK_STORE": url}
    assert tasklock("run", "k", "--", "true", env=env).returncode == 0
    assert set_counter(url, "k", forged)
    done = tasklock("run", "k", "--", "sh", "-c", "echo $TASKLOCK_FENCING_TOKEN", env=env)
    assert done.returncode == 78, (done.returncode, done.stdout, done.stderr)
    refusal = (
        "{k}:fence' holds a string, not an integer counter from 0 to 2**63-1"
        if "redis" in url
        else "fencing counter of 'k'"
    )
    assert done.stdout == "" and refusal in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert tasklock("run", "other", "--", "true", env=env).returncode == 0  # no other key
