"""`tasklock check` through the real executable: inside the command, from the environment
`run` gives it, and from outside with a stale or broken token."""

from __future__ import annotations

import json
import shlex
import uuid

from tasklock_cli.stores.model import Holder
from tests.support.cli import executable
from tests.support.cli import one_error_line
from tests.support.cli import tasklock

HOLDER = Holder(host="host-a", pid=4242, user="alice", command=["./job.sh"], note=None)


def test_the_command_gets_the_store_and_slot_and_its_check_says_current(env, store_url):
    exe = shlex.quote(executable())
    script = (
        'printf "%s|%s|%s|%s\\n" "$TASKLOCK_STORE" "$TASKLOCK_SLOT" "$TASKLOCK_KEY" '
        '"$TASKLOCK_FENCING_TOKEN"; '
        f"{exe} check && {exe} check --json"
    )
    # the store comes from the environment of `run` here, and from TASKLOCK_STORE in the child
    result = tasklock("run", "k", "--ttl", "20s", "--", "sh", "-c", script, env=env)
    assert result.returncode == 0, result.stderr
    first, seconds, as_json = result.stdout.splitlines()
    url, slot, key, token = first.split("|")
    assert (url, slot, key) == (store_url, "0", "k")
    # (Left of the 20 s lease: renewed every 6.7 s, so above 13 s unless the machine stalls
    # the check for seconds; a wrong unit or a lease seen as expired is far outside.)
    assert 5 < float(seconds) <= 20
    assert seconds == f"{float(seconds):.3f}"
    reply = json.loads(as_json)
    assert set(reply) == {"key", "fencing_token", "current", "expires_in"}
    assert (reply["key"], reply["fencing_token"], reply["current"]) == ("k", int(token), True)
    assert 5 < reply["expires_in"] <= 20


def test_the_store_given_by_flag_is_passed_to_the_command(cli_env, sqlite_url):
    result = tasklock(
        "--store", sqlite_url, "run", "k", "--", "sh", "-c", 'echo "$TASKLOCK_STORE"', env=cli_env
    )
    assert (result.returncode, result.stdout) == (0, sqlite_url + "\n")


def test_a_stale_token_is_not_current(env):
    result = tasklock("run", "k", "--", "sh", "-c", 'echo "$TASKLOCK_FENCING_TOKEN"', env=env)
    stale = result.stdout.strip()
    checked = tasklock("check", "k", "--token", stale, env=env)
    assert checked.returncode == 70 and checked.stdout == ""
    assert "not current" in one_error_line(checked.stderr)
    as_json = tasklock("check", "k", "--token", stale, "--json", env=env)
    assert as_json.returncode == 70
    assert json.loads(as_json.stdout) == {
        "key": "k",
        "fencing_token": int(stale),
        "current": False,
        "expires_in": None,
    }


def test_a_broken_lease_is_not_current_though_still_held(env, store, store_factory):
    lease = store.acquire("k", 30, HOLDER, uuid.uuid4().hex)
    token = str(lease.fencing_token)
    env_of_child = {**env, "TASKLOCK_KEY": "k", "TASKLOCK_FENCING_TOKEN": token}
    assert tasklock("check", env=env_of_child).returncode == 0
    assert tasklock("check", "k", "--token", str(lease.fencing_token + 1), env=env).returncode == 70
    store_factory().break_lease("k")
    assert tasklock("peek", "k", env=env).returncode == 0  # held until its owner lets go
    assert tasklock("check", env=env_of_child).returncode == 70


def test_check_without_a_lease_to_check_is_a_usage_error(cli_env, sqlite_url):
    env = {**cli_env, "TASKLOCK_STORE": sqlite_url}
    assert tasklock("check", env=env).returncode == 2
    assert tasklock("check", "k", env=env).returncode == 2
    bad = {**env, "TASKLOCK_KEY": "k", "TASKLOCK_FENCING_TOKEN": "x"}
    result = tasklock("check", env=bad)
    assert result.returncode == 2 and "TASKLOCK_FENCING_TOKEN" in one_error_line(result.stderr)


def test_check_against_an_unreachable_store_is_69(cli_env):
    env = {**cli_env, "TASKLOCK_STORE": "redis://127.0.0.1:1/0"}
    result = tasklock("check", "k", "--token", "1", env=env)
    assert result.returncode == 69, result.stderr
