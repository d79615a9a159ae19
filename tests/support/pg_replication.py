"""A private PostgreSQL primary and a streaming standby, for failover tests.

The standby is made with ``pg_basebackup -R`` and streams from the primary through a
``TcpProxy`` (its replication link), so a test can mute that link: the primary then
commits what the standby never receives, as an async standby lags when the primary
dies. ``kill_primary`` is a crash (SIGKILL of every server process), ``promote`` is
``pg_ctl promote``. Clients use ``url_for``: a multi-host URL (primary, then standby)
with ``target_session_attrs=read-write``, so they follow the promotion.

Building a pair costs a copy of a template data directory (one initdb per test module,
``template_data``), a base backup and two starts: about two seconds.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.pg import PrivatePostgres
from tests.support.proxy import TcpProxy

#: The standby's name, as ``synchronous_standby_names`` and ``pg_stat_replication`` see it.
STANDBY_NAME = "standby1"


class Backup(PrivatePostgres):
    """A base backup of ``primary`` (``pg_basebackup -X stream`` from ``port``), started as
    it is: crash recovery replays the WAL it holds and it runs as a primary, on the same
    system identifier and timeline (what a restored backup or disk snapshot does)."""

    #: More pg_basebackup options (a standby's ``-R``).
    extra_options: tuple[str, ...] = ()

    def __init__(
        self, primary: PrivatePostgres, port: int, settings: dict[str, str] | None = None
    ) -> None:
        self._source = (primary, port)
        super().__init__(settings=settings)

    def _make_data(self) -> None:
        primary, port = self._source
        self.run_as_server_user(
            [
                str(self.bin_dir / "pg_basebackup"),
                "-D",
                str(self.data),
                *self.extra_options,
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "-U",
                primary.user,
                "-c",
                "fast",
                "-X",
                "stream",
                "--no-sync",
            ],
            timeout=120,
        )


class Standby(Backup):
    """A standby of ``primary``, its data made by ``pg_basebackup -R`` from ``port`` (the
    replication link's proxy): ``primary_conninfo`` names that port too."""

    extra_options = ("-R",)

    def __init__(self, primary: PrivatePostgres, port: int) -> None:
        super().__init__(
            primary, port, settings={"cluster_name": STANDBY_NAME, "hot_standby": "on"}
        )

    def promote(self) -> None:
        """``pg_ctl promote``, returning once the server accepts writes."""
        self.run_as_server_user(
            [str(self.bin_dir / "pg_ctl"), "promote", "-D", str(self.data), "-w", "-t", "60"]
        )


def template_data() -> PrivatePostgres:
    """A server initdb'd once, never started: its ``data`` is the template for pairs (call
    ``destroy`` when done)."""
    return PrivatePostgres()


class ReplicatedPostgres:
    """A primary and one standby streaming from it through ``link``. With ``synchronous``
    the primary waits for the standby's flush at every commit (``synchronous_commit`` on,
    ``synchronous_standby_names`` naming it)."""

    def __init__(self, template: Path, *, synchronous: bool = False) -> None:
        settings = {"wal_level": "replica", "max_wal_senders": "5", "wal_keep_size": "64MB"}
        if synchronous:
            settings["synchronous_standby_names"] = STANDBY_NAME
            settings["synchronous_commit"] = "on"
        self.synchronous = synchronous
        self.primary = PrivatePostgres(settings=settings, template=template)
        self.link: TcpProxy | None = None
        self.standby: Standby | None = None
        try:
            self.primary.start()
            self.link = TcpProxy("127.0.0.1", self.primary.port)
            self.standby = Standby(self.primary, self.link.port)
            self.standby.start()
            self.wait_streaming()
        except BaseException:
            self.destroy()
            raise

    def url_for(self, table: str) -> str:
        assert self.standby is not None
        hosts = f"127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}"
        return (
            f"postgresql://postgres@{hosts}/postgres"
            f"?target_session_attrs=read-write&connect_timeout=2&table={table}"
        )

    def wait_streaming(self, timeout: float = 30) -> None:
        """Until the standby streams (and, synchronous, is the synchronous one)."""
        wanted = "sync" if self.synchronous else "async"
        give_up = time.monotonic() + timeout
        while True:
            with self.primary.connection() as conn:
                row = conn.execute(
                    "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
                    [STANDBY_NAME],
                ).fetchone()
            if row == ("streaming", wanted):
                return
            if time.monotonic() > give_up:
                raise RuntimeError(f"the standby does not stream ({row})")
            time.sleep(0.05)

    def wait_replayed(self, timeout: float = 30) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        assert self.standby is not None
        with self.primary.connection() as conn:
            (lsn,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
        give_up = time.monotonic() + timeout
        with self.standby.connection() as conn:
            while not conn.execute(
                "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", [lsn]
            ).fetchone()[0]:
                if time.monotonic() > give_up:
                    raise RuntimeError("the standby did not replay the primary's writes")
                time.sleep(0.02)

    def mute_link(self) -> None:
        """From now on the standby receives nothing (the bytes wait in the proxy's buffers;
        a reconnect waits too)."""
        assert self.link is not None
        self.link.blackhole()

    def kill_primary(self) -> None:
        self.primary.kill()

    def promote(self) -> None:
        assert self.standby is not None
        self.standby.promote()

    def destroy(self) -> None:
        for part in (self.standby, self.primary):
            if part is not None:
                with contextlib.suppress(Exception):
                    part.destroy()
        if self.link is not None:
            self.link.close()


@contextlib.contextmanager
def replicated_postgres(
    template: Path, *, synchronous: bool = False
) -> Iterator[ReplicatedPostgres]:
    pair = ReplicatedPostgres(template, synchronous=synchronous)
    try:
        yield pair
    finally:
        pair.destroy()
