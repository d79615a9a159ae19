"""The Python API (contract v4, "Python API") on every store, against the real `tasklock`
executable and other Python processes: one set of keys, tokens and ledger for both."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from datetime import timezone
from pathlib import Path

import pytest

from tasklock_cli import Lease
from tasklock_cli import LockLost
from tasklock_cli import LockNotAcquired
from tasklock_cli import Locks
from tasklock_cli import ManualClock
from tasklock_cli import current_lease
from tasklock_cli.commands.release import LET_GO_TIMEOUT_ENV
from tasklock_cli.errors import ConfigError
from tasklock_cli.stores.memory.connection import drop_space
from tests.support.cli import peek
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_for_holder
from tests.support.cli import wait_until

ROOT = Path(__file__).resolve().parent.parent
#: A forced release's notification reaches an API holder within this (the contract's "at
#: once", on a loaded machine).
HEARD_WITHIN_S = 5.0


@pytest.fixture
def locks(store_url, monkeypatch) -> Locks:
    monkeypatch.delenv("TASKLOCK_STORE", raising=False)
    return Locks(store_url)


def python(code: str, env: dict[str, str], **kwargs) -> subprocess.Popen:
    """A Python process running ``code`` (dedented) with this checkout importable."""
    env = {**env, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def history(env: dict[str, str], key: str) -> list[dict]:
    result = tasklock("history", key, "--json", env=env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- the CLI and the API on one key --------------------------------------------------------


def test_a_cli_run_and_an_api_lock_exclude_each_other_and_share_one_token_sequence(
    locks, env, store_url
):
    with locks.lock("k", note="from python") as lease:
        assert current_lease() == lease
        shown = peek(store_url, "k")
        assert shown is not None and shown.fencing_token == lease.fencing_token
        assert shown.holder.command == ["python"] and shown.holder.note == "from python"
        refused = tasklock("run", "k", "--", "true", env=env)
        assert refused.returncode == 75, refused.stderr
        first = lease.fencing_token
    assert current_lease() is None
    cli = start("run", "k", "--", "sleep", "30", env=env)
    try:
        cli_token = wait_for_holder(store_url, "k").fencing_token
        with pytest.raises(LockNotAcquired) as caught, locks.lock("k"):
            pass
        assert caught.value.holder is not None
        assert caught.value.holder.fencing_token == cli_token
    finally:
        cli.send_signal(signal.SIGTERM)
        cli.wait(timeout=30)
    with locks.lock("k") as again:
        assert first < cli_token < again.fencing_token
    tokens = [run["fencing_token"] for run in history(env, "k")]
    assert tokens == [again.fencing_token, cli_token, first]


def test_wait_waits_for_a_cli_run_and_wait_0_raises(locks, env, store_url):
    cli = start("run", "k", "--", "sleep", "1.5", env=env)
    try:
        wait_for_holder(store_url, "k")
        with pytest.raises(LockNotAcquired), locks.lock("k", wait=0):
            pass
        started = time.monotonic()
        with locks.lock("k", wait="20s") as lease:
            assert lease.fencing_token > 0
        assert time.monotonic() - started < 15
    finally:
        cli.wait(timeout=30)
    assert cli.returncode == 0


def test_history_and_peek_show_api_runs_by_function_name(locks, env):
    def export() -> int:
        return 7

    outcome = locks.run_exclusive("jobs:export", export)
    assert outcome.acquired and outcome.result == 7
    with pytest.raises(ValueError), locks.lock("jobs:export"):
        raise ValueError("the block's own error propagates unchanged")
    runs = history(env, "jobs:export")
    assert [run["outcome"] for run in runs] == ["failed", "succeeded"]
    assert runs[1]["command"] == [f"{__name__}.{export.__qualname__}"]
    assert runs[0]["command"] == ["python"]
    metrics = tasklock("metrics", "--prefix", "jobs:", env=env)
    assert metrics.returncode == 0, metrics.stderr
    assert 'tasklock_last_exit_code{key="jobs:export"} 1' in metrics.stdout


# -- losing the lease ----------------------------------------------------------------------


def test_a_forced_release_sets_lost_and_leaving_the_block_raises(locks, env):
    env = {**env, LET_GO_TIMEOUT_ENV: "10"}
    with pytest.raises(LockLost) as caught, locks.lock("k", ttl="30s") as lease:
        releasing = start("release", "k", "--force", env=env)
        assert lease.lost.wait(HEARD_WITHIN_S), "the forced release was not heard"
        assert lease.detected_by == "rejected"
    assert caught.value.detected_by == "rejected"
    assert caught.value.key == "k" and caught.value.fencing_token == lease.fencing_token
    assert releasing.wait(timeout=30) == 0, releasing.stderr
    (run,) = history(env, "k")
    assert run["outcome"] == "lost" and run["detected_by"] == "rejected"
    assert run["broken_by"] is not None


def test_a_cli_run_with_replace_takes_the_key_from_an_api_holder(locks, env):
    with pytest.raises(LockLost) as caught, locks.lock("k", ttl="30s") as lease:
        replacing = start("run", "k", "--replace", "--wait", "30s", "--", "true", env=env)
        assert lease.lost.wait(HEARD_WITHIN_S), "the --replace was not heard"
    assert caught.value.detected_by == "replaced"
    assert replacing.wait(timeout=30) == 0, replacing.stderr
    runs = history(env, "k")
    assert [run["outcome"] for run in runs] == ["succeeded", "lost"]
    assert runs[1]["detected_by"] == "replaced" and runs[1]["broken_by"] is not None


def test_an_async_block_is_cancelled_on_loss(locks, env):
    env = {**env, LET_GO_TIMEOUT_ENV: "10"}

    async def hold() -> float:
        started = time.monotonic()
        async with locks.lock("k", ttl="30s") as lease:
            assert current_lease() is lease
            start("release", "k", "--force", env=env)
            await asyncio.sleep(60)
        return started

    started = time.monotonic()
    with pytest.raises(LockLost) as caught:
        asyncio.run(hold())
    assert caught.value.detected_by == "rejected"
    assert time.monotonic() - started < HEARD_WITHIN_S + 2
    wait_until(lambda: history(env, "k"), timeout=10)


def test_check_answers_from_the_store(locks, store_url):
    with pytest.raises(LockLost), locks.lock("k", ttl="30s") as lease:
        assert 25 < lease.check() <= 30
        with Locks(store_url).open_store() as ops:
            ops.force_release("k")
        with pytest.raises(LockLost):
            lease.check()
        assert lease.lost.is_set()


# -- across processes ----------------------------------------------------------------------

ONE_INSTANCE = """
    import sys, time
    from tasklock_cli import Locks
    locks = Locks()

    @locks.on_one_instance("report")
    def report():
        print("ran", flush=True)
        time.sleep(3)
        return 1

    print("result", report(), flush=True)
"""


def test_on_one_instance_runs_the_function_once_across_two_processes(env):
    procs = [python(ONE_INSTANCE, env) for _ in range(2)]
    outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), [p.stderr for p in procs]
    assert sum(out.count("ran") for out in outputs) == 1, outputs
    assert sorted(out.splitlines()[-1] for out in outputs) == ["result 1", "result None"]


LEADER = """
    import time
    from tasklock_cli import Locks
    for lease in Locks().leadership("leader", ttl="3s"):
        print("leading", lease.fencing_token, flush=True)
        lease.lost.wait()
"""


def test_a_leader_killed_with_sigkill_is_followed_within_its_ttl(env, store_url):
    first = python(LEADER, env)
    leading = first.stdout.readline() if first.stdout else ""
    assert leading.startswith("leading"), first.stderr.read() if first.stderr else ""
    second = python(LEADER, env)
    try:
        time.sleep(1.0)  # the second is waiting now
        killed = time.monotonic()
        first.send_signal(signal.SIGKILL)
        line = second.stdout.readline() if second.stdout else ""
        assert line.startswith("leading"), second.stderr.read() if second.stderr else ""
        assert int(line.split()[1]) > int(leading.split()[1])
        assert time.monotonic() - killed < 3 + 5
    finally:
        for proc in (first, second):
            proc.kill()
            proc.wait(timeout=10)


# -- configuration --------------------------------------------------------------------------


def test_the_store_is_chosen_as_the_cli_chooses_it(env, store_url, monkeypatch):
    monkeypatch.setenv("TASKLOCK_STORE", store_url)
    locks = Locks()
    assert locks.store_url == store_url
    with locks.lock("k"):
        assert tasklock("peek", "k", env=env).returncode == 0


def test_a_config_file_chooses_the_store_as_config_does(tmp_path, monkeypatch):
    monkeypatch.delenv("TASKLOCK_STORE", raising=False)
    url = f"sqlite:///{tmp_path}/from-config.db"
    config = tmp_path / "tasklock.toml"
    config.write_text(f'store = "{url}"\n')
    assert Locks(config=str(config)).store_url == url
    with pytest.raises(ConfigError):
        Locks("")


def test_lease_is_typed_and_exported():
    import tasklock_cli

    assert tasklock_cli.Lease is Lease
    assert (Path(tasklock_cli.__file__).parent / "py.typed").is_file()
    assert "Locks" in dir(tasklock_cli)
    with pytest.raises(AttributeError):
        _ = tasklock_cli.NoSuchName


def test_importing_the_package_does_not_import_the_api():
    code = "import sys, tasklock_cli; print('tasklock_cli.api' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30
    )
    assert result.stdout.strip() == "False", result.stderr


def test_bad_options_are_usage_errors(tmp_path):
    from tasklock_cli.errors import UsageError

    locks = Locks(f"sqlite:///{tmp_path}/l.db")
    for options in ({"ttl": "soon"}, {"ttl": 0}, {"wait": -1}, {"limit": 0}, {"also": ["k"]}):
        with pytest.raises(UsageError):
            locks.lock("k", **options)
    with pytest.raises(UsageError):
        locks.lock("")


# -- memory:// and ManualClock ---------------------------------------------------------------


@pytest.fixture
def memory() -> Iterator[tuple[Locks, Locks, ManualClock]]:
    """Two Locks on one fresh memory:// space (two instances of a service in a test), on
    one ManualClock."""
    name = f"api-{uuid.uuid4().hex[:8]}"
    clock = ManualClock()
    yield (
        Locks(f"memory://{name}", allow_memory=True, clock=clock),
        Locks(f"memory://{name}", allow_memory=True, clock=clock),
        clock,
    )
    drop_space(name)


def test_a_manual_clock_step_past_the_ttl_expires_the_lease(memory):
    first, second, clock = memory
    with pytest.raises(LockLost) as caught, first.lock("k", ttl="30s") as lease:
        with pytest.raises(LockNotAcquired):
            second.lock("k").__enter__()
        clock.advance("31s")
        assert lease.lost.wait(HEARD_WITHIN_S)
        with second.lock("k") as taken:  # the store expired it in the step
            assert taken.fencing_token > lease.fencing_token
    assert caught.value.detected_by == "resumed-late"


def test_a_manual_clock_step_within_the_renewals_keeps_the_lease(memory):
    first, _, clock = memory
    with first.lock("k", ttl="30s") as lease:
        clock.advance("5s")
        time.sleep(0.2)
        assert not lease.lost.is_set()
        assert 20 < lease.check() <= 25


def test_memory_is_refused_without_allow_memory_and_by_the_cli(cli_env):
    with pytest.raises(ConfigError):
        Locks("memory://")
    with pytest.raises(ConfigError):
        Locks(f"sqlite:///{cli_env['XDG_STATE_HOME']}/l.db", clock=ManualClock())
    result = tasklock("run", "k", "--", "true", env={**cli_env, "TASKLOCK_STORE": "memory://"})
    assert result.returncode == 78, result.stderr
    assert "in-process" in result.stderr


def test_without_overlapping_waits_then_raises_and_on_one_instance_skips(memory):
    first, second, _ = memory

    @first.without_overlapping()
    def tidy() -> str:
        return "tidied"

    @second.on_one_instance("nightly")
    async def nightly() -> str:
        return "ran"

    assert tidy() == "tidied"
    with second.lock(f"{__name__}.{tidy.__qualname__}"), pytest.raises(LockNotAcquired):
        tidy()
    with first.lock("nightly"):
        assert asyncio.run(nightly()) is None
    assert asyncio.run(nightly()) == "ran"


def test_leadership_begins_a_new_term_after_a_loss(memory):
    first, second, _ = memory
    terms = []
    for lease in first.leadership("lead", ttl="30s"):
        terms.append(lease.fencing_token)
        if len(terms) == 2:
            break
        with second.open_store() as ops:
            ops.force_release("lead")
        assert lease.lost.wait(HEARD_WITHIN_S)
    assert terms[0] < terms[1]
    with second.lock("lead", wait=0):  # breaking out of the loop resigned
        pass


def test_subscribers_get_the_cli_events(memory):
    first, _, _ = memory
    seen: list[dict] = []
    unsubscribe = first.subscribe(seen.append)
    with first.lock("k") as lease:
        pass
    unsubscribe()
    with first.lock("k"):
        pass
    assert [event["event"] for event in seen] == ["acquired", "released"]
    assert seen[0]["key"] == "k" and seen[0]["fencing_token"] == lease.fencing_token


def test_a_task_cancelled_while_waiting_holds_nothing(memory):
    first, second, _ = memory

    async def wait_then_cancel() -> None:
        waiting = asyncio.ensure_future(_hold_briefly(second))
        await asyncio.sleep(0.3)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    with first.lock("k"):
        asyncio.run(wait_then_cancel())
        with second.open_store() as ops:
            assert ops.waiters("k") == []
    with second.lock("k", wait=0):
        pass


async def _hold_briefly(locks: Locks) -> None:
    async with locks.lock("k", wait="30s"):
        await asyncio.sleep(0)


def test_nested_leases_are_current_innermost_first(memory):
    first, _, _ = memory
    with first.lock("a") as outer:
        with first.lock("b") as inner:
            assert current_lease() is inner
        assert current_lease() is outer
    with first.lock("a", also=["b", "c"]) as both:
        assert set(both.tokens) == {"a", "b", "c"}


def test_max_lifetime_loses_the_lease_but_keeps_it_held_until_the_block_ends(memory):
    first, second, clock = memory
    with pytest.raises(LockLost) as caught, first.lock("k", ttl="2m", max_lifetime="1m") as lease:
        clock.advance("61s")
        assert lease.lost.wait(HEARD_WITHIN_S)
        with pytest.raises(LockNotAcquired):  # still held: the block still runs
            second.lock("k").__enter__()
    assert caught.value.detected_by == "max-lifetime"
    with second.lock("k"):
        pass


# -- a store cut off ---------------------------------------------------------------------------


def test_a_holder_cut_off_from_its_store_learns_it_before_the_lease_can_run_out(
    network_store_url,
):
    """The watcher's part (``loss_by_now``): with renewals failing, ``lost`` is set before the
    store could free the key, and leaving the block raises LockLost(unreachable)."""
    from urllib.parse import urlsplit

    from tests.support.proxy import TcpProxy

    parts = urlsplit(network_store_url)
    with TcpProxy(parts.hostname or "127.0.0.1", parts.port or 0) as proxy:
        locks = Locks(proxy.url_for(network_store_url))
        with pytest.raises(LockLost) as caught, locks.lock("k", ttl="3s") as lease:
            time.sleep(0.5)
            proxy.blackhole()
            assert lease.lost.wait(5), "a holder cut off never learnt it"
            lost_at = datetime.now(timezone.utc)
            runs_out_at = lease.expires_at  # on the store, as of the last renewal that got through
            proxy.heal()  # (so that the release can go through, or not: either is safe)
        assert lost_at < runs_out_at
        assert caught.value.detected_by == "unreachable"
