"""The store contract: breaking leases, on every store of the registry and ``memory://``.

The cases live in ``tasklock_cli.testing.contract.breaks``, shipped with the package, so that
``tasklock_cli.testing.store_contract`` runs the same ones on a user's own store."""

from __future__ import annotations

import os

from tasklock_cli.testing.contract.breaks import *  # noqa: F403 - the cases, collected here
from tasklock_cli.testing.contract.breaks import BREAKER
from tasklock_cli.testing.helpers import HOLDER
from tasklock_cli.testing.helpers import OTHER
from tasklock_cli.testing.helpers import granted
from tasklock_cli.testing.helpers import token
from tests.support.contract import store_kind  # noqa: F401 - every store, memory:// too

# -- a local holder whose processes are gone (SQLite) -----------------------------------


def _gone_pid() -> int:
    """A pid that ran and has ended (reaped)."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def test_a_local_holder_whose_processes_are_gone_is_freed_at_once(sqlite_url):
    from tasklock_cli.stores import open_store

    with open_store(sqlite_url) as holder_store, open_store(sqlite_url) as ops:
        lease = granted(holder_store.acquire("k", 30, HOLDER, token()))
        holder_store.note_processes(lease, os.getpid())  # this process: alive
        ops.break_lease("k", None, BREAKER)
        assert ops.free_if_holder_gone("k", lease.fencing_token) is False

        dead = granted(holder_store.acquire("d", 30, HOLDER, token()))
        pid = os.fork()
        if pid == 0:  # a holder that records itself and a guard, then ends
            with open_store(sqlite_url) as store:
                store.note_processes(dead, os.getpid())
            os._exit(0)
        os.waitpid(pid, 0)
        ops.break_lease("d", None, BREAKER)
        assert ops.free_if_holder_gone("d", dead.fencing_token) is True
        assert ops.holders("d") == []
        assert [info.fencing_token for info in ops.holders("k")] == [lease.fencing_token]
        nxt = ops.acquire("d", 30, OTHER, token())
        assert nxt is not None and nxt.fencing_token > dead.fencing_token


def test_processes_of_another_boot_are_never_taken_for_gone():
    from tasklock_cli.stores.sqlite.processes import all_gone
    from tasklock_cli.stores.sqlite.processes import pid_namespace

    gone = [[_gone_pid(), 1], [_gone_pid(), 1]]
    here = {"boot": "this-boot", "pidns": pid_namespace(), "pids": gone}
    assert all_gone(here, "this-boot") is True
    assert all_gone({**here, "boot": "another-boot"}, "this-boot") is False
    assert all_gone({**here, "pidns": pid_namespace() + 1}, "this-boot") is False
    # The holder alone, recorded with its acquire: its command cannot start before its guard
    # is recorded too, so none of them running means nothing runs.
    assert all_gone({**here, "pids": gone[:1]}, "this-boot") is True
    assert all_gone({**here, "pids": []}, "this-boot") is False  # nothing to tell by
    assert all_gone({**here, "pids": "junk"}, "this-boot") is False
