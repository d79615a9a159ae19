"""How the tests and the bench get a SQLite store: a file in a directory of their own, no
server (its tests are quick), nothing to clean up but the file (see ``stores.provisioning``)."""

from __future__ import annotations

from tasklock_cli.stores.provisioning import Provisioning
from tasklock_cli.stores.provisioning import unlink_files


def _url(directory: str, name: str) -> str:
    return f"sqlite:///{directory}/{name}.db"


def _cleanup(url: str) -> None:
    """The file and what SQLite keeps beside it (the wake-up directories stay: a test's
    temporary directory takes them)."""
    unlink_files(url.removeprefix("sqlite://").partition("?")[0], ("", "-wal", "-shm"))


PROVISIONING = Provisioning(
    server=None,
    namespace_url=_url,
    cleanup=_cleanup,
)
