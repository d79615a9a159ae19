"""What the store tests share: the contract's helpers (``tasklock_cli.testing.helpers``,
shipped so that ``store_contract`` can run them on a user's store), and the store kinds
the contract suite runs on here."""

from __future__ import annotations

import pytest

from tasklock_cli.stores.registry import IN_PROCESS_PACKAGES
from tasklock_cli.stores.registry import STORE_PACKAGES
from tasklock_cli.testing.helpers import HOLDER  # noqa: F401 - the tests' names for them
from tasklock_cli.testing.helpers import OTHER  # noqa: F401
from tasklock_cli.testing.helpers import PAST_SHORT_TTL  # noqa: F401
from tasklock_cli.testing.helpers import SHORT_TTL  # noqa: F401
from tasklock_cli.testing.helpers import granted  # noqa: F401
from tasklock_cli.testing.helpers import in_threads  # noqa: F401
from tasklock_cli.testing.helpers import on_the_store  # noqa: F401
from tasklock_cli.testing.helpers import run_record  # noqa: F401
from tasklock_cli.testing.helpers import short_ttl  # noqa: F401
from tasklock_cli.testing.helpers import token  # noqa: F401
from tasklock_cli.testing.helpers import waiting_thread  # noqa: F401
from tests.support import services

#: The stores the contract suite runs on: every store of the registry, the in-process
#: ``memory://`` too (the CLI's tests run on the others only: the CLI refuses it).
CONTRACT_STORE_KINDS = [*STORE_PACKAGES, *IN_PROCESS_PACKAGES]


@pytest.fixture(params=CONTRACT_STORE_KINDS)
def store_kind(request) -> str:
    """The contract modules' store kinds (``conftest.store_kind``'s, and memory)."""
    services.require(request.param)
    return request.param
