"""The command's environment: what tasklock adds to its own for the command it runs (and
for the ``--on-*`` hooks, which get the same variables).

``command_env`` is known before any lease is taken (the guard process that will run the
command is started with it while the run may still wait); ``lease_env`` adds the held
lease's variables when the command starts. The variables are the contract's
(``TASKLOCK_KEY``, ``TASKLOCK_FENCING_TOKEN``, ...): see the README and the man page.
"""

from __future__ import annotations

import os

from tasklock_cli.util.times import rfc3339

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.run.holding import Holding
    from tasklock_cli.run.keeper import LeaseKeeper
    from tasklock_cli.run.options import RunOptions


def command_env(options: RunOptions) -> dict[str, str]:
    """The command's environment but the lease's variables (``lease_env``): ours, its key,
    and where `tasklock check` in the command finds the store (the config file it came
    from, else its URL)."""
    env = dict(os.environ)
    env["TASKLOCK_KEY"] = options.key
    if options.config_file is not None:
        env["TASKLOCK_CONFIG"] = options.config_file
    elif options.store_url is not None:
        env["TASKLOCK_STORE"] = options.store_url
    return env


def lease_env(keeper: LeaseKeeper, holding: Holding | None = None) -> dict[str, str]:
    """The held lease's variables, over ``command_env``: its token (with --also, every
    key's), expiry and slot."""
    lease = keeper.lease
    assert lease is not None, "the command starts only once the lease is taken"
    env: dict[str, str] = {}
    if holding is not None and holding.several:
        from tasklock_cli.util import jsontext as json

        env["TASKLOCK_FENCING_TOKENS"] = json.dumps(holding.tokens(), ensure_ascii=False)
    env["TASKLOCK_FENCING_TOKEN"] = str(lease.fencing_token)
    env["TASKLOCK_LEASE_EXPIRES_AT"] = rfc3339(lease.expires_at)
    env["TASKLOCK_SLOT"] = str(lease.slot)
    return env
