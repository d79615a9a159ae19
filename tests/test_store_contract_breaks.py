"""The store contract: breaking leases, on every store of the registry and ``memory://``.

The cases live in ``tasklock_cli.testing.contract.breaks``, shipped with the package, so that
``tasklock_cli.testing.store_contract`` runs the same ones on a user's own store."""

from __future__ import annotations

from tasklock_cli.testing.contract.breaks import *  # noqa: F403 - the cases, collected here
from tests.support.contract import store_kind  # noqa: F401 - every store, memory:// too
