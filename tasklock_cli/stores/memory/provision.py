"""How the tests get a memory store: a space of this process, named for the test, dropped
after it (see ``stores.provisioning``). The bench does not run it (the CLI refuses it)."""

from __future__ import annotations

from tasklock_cli.stores.provisioning import Provisioning


def _url(_place: str, name: str) -> str:
    return f"memory://{name}"


def _cleanup(url: str) -> None:
    from tasklock_cli.stores.memory.connection import drop_space

    drop_space(url.removeprefix("memory://"))


PROVISIONING = Provisioning(server=None, namespace_url=_url, cleanup=_cleanup)
