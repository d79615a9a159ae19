"""A private MariaDB primary and an asynchronous replica, for failover tests.

Each server is made by ``mariadb-install-db`` in a temporary directory (root without a
password, over TCP) and runs as its own ``mariadbd`` on a free port, with its own
``server_id`` (1, 2) and a binary log. The replica replicates from the primary through a
``TcpProxy`` (its replication link, GTID positions), and is read-only until promoted, so a
test can mute that link: the primary then commits what the replica never receives, as an
async replica lags when its primary dies. ``kill_primary`` is a crash (SIGKILL),
``promote`` is ``STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = 0``.

Clients reach the pair through ``endpoint``, another proxy that a test re-points at the
promoted replica (a virtual IP or DNS name moving). A pair costs two installs and two
starts: about two seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql

from tests.support.ports import free_port
from tests.support.proxy import TcpProxy

MARIADBD = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
INSTALL_DB = shutil.which("mariadb-install-db") or "/usr/bin/mariadb-install-db"
#: Small servers: a test pair needs little memory or disk.
_SMALL = [
    "--innodb-buffer-pool-size=16M",
    "--innodb-log-file-size=4M",
    "--innodb-data-file-path=ibdata1:4M:autoextend",
]


def private_mariadb_unavailable() -> str | None:
    """Why no private MariaDB can be started here (None when it can)."""
    for path in (MARIADBD, INSTALL_DB):
        if not os.access(path, os.X_OK):
            return f"no {Path(path).name} at {path}"
    return None


def require_private_mariadb(what: str = "a private MariaDB") -> None:
    """Skip (fail in CI) unless ``what`` can be started here."""
    import pytest

    from tests.support import services

    reason = private_mariadb_unavailable()
    if reason is not None:
        if services.in_ci():
            pytest.fail(f"CI=true but {what} cannot be started: {reason}")
        pytest.skip(reason)


def _as_user() -> list[str]:
    """mariadbd refuses to run as root unless told to."""
    return ["--user=root"] if os.geteuid() == 0 else []


class PrivateMariaDB:
    """One ``mariadbd`` of our own, in ``root`` (a directory of its own)."""

    def __init__(self, root: Path, server_id: int, *, read_only: bool = False) -> None:
        self.root = root
        self.server_id = server_id
        self.port = free_port()
        self.data = root / "data"
        self.read_only = read_only
        self.process: subprocess.Popen | None = None

    def install(self) -> None:
        # Each server's own temporary directory: bootstraps sharing /tmp at once failed
        # now and then ("Could not remove temporary table '/tmp/#sql-temptable-...'").
        (self.root / "tmp").mkdir(exist_ok=True)
        done = subprocess.run(
            [
                INSTALL_DB,
                "--no-defaults",
                f"--datadir={self.data}",
                *_as_user(),
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                f"--tmpdir={self.root / 'tmp'}",
                *_SMALL,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"mariadb-install-db failed ({done.returncode}): {done.stderr[-3000:]}"
            )

    def start(self, timeout: float = 30.0) -> PrivateMariaDB:
        args = [
            MARIADBD,
            "--no-defaults",
            f"--datadir={self.data}",
            *_as_user(),
            f"--port={self.port}",
            "--bind-address=127.0.0.1",
            f"--socket={self.root / 'sock'}",
            f"--pid-file={self.root / 'pid'}",
            f"--log-error={self.root / 'error.log'}",
            f"--server-id={self.server_id}",
            "--log-bin=binlog",
            "--skip-name-resolve",
            "--skip-performance-schema",
            f"--tmpdir={self.root / 'tmp'}",
            *_SMALL,
        ]
        if self.read_only:
            args.append("--read-only")
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.connect().close()
                return self
            except pymysql.err.MySQLError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"mariadbd did not start: {self.log_tail()}") from None
                time.sleep(0.05)

    def connect(self, database: str | None = None) -> pymysql.connections.Connection:
        return pymysql.connect(
            host="127.0.0.1",
            port=self.port,
            user="root",
            password="",
            database=database,
            autocommit=True,
            connect_timeout=5,
            read_timeout=30,
        )

    def execute(self, *statements: str) -> list[tuple]:
        with contextlib.closing(self.connect()) as conn, conn.cursor() as cursor:
            rows: list[tuple] = []
            for statement in statements:
                cursor.execute(statement)
                rows = list(cursor.fetchall())
            return rows

    def url(self, port: int | None = None, table: str = "tasklock_leases") -> str:
        return f"mysql://root@127.0.0.1:{port or self.port}/test?table={table}"

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return (self.root / "error.log").read_text(errors="replace")[-2000:]
        return ""

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def destroy(self) -> None:
        self.kill()
        shutil.rmtree(self.root, ignore_errors=True)


class ReplicatedMariaDB:
    """A primary, a read-only replica replicating from it through ``link``, and the
    ``endpoint`` clients use (pointing at the primary until ``promote``)."""

    def __init__(self, root: Path) -> None:
        self.primary = PrivateMariaDB(root / "primary", 1)
        self.replica = PrivateMariaDB(root / "replica", 2, read_only=True)
        self.link = TcpProxy("127.0.0.1", self.primary.port)
        self.endpoint = TcpProxy("127.0.0.1", self.primary.port)

    def start(self) -> None:
        for server in (self.primary, self.replica):
            server.root.mkdir(parents=True)
            server.install()
            server.start()
            # (not in the binary log: each server makes its own)
            server.execute("SET sql_log_bin = 0", "CREATE DATABASE test")
        self.replica.execute(
            "CHANGE MASTER TO MASTER_HOST = '127.0.0.1', "
            f"MASTER_PORT = {self.link.port}, MASTER_USER = 'root', MASTER_PASSWORD = '', "
            "MASTER_USE_GTID = slave_pos, MASTER_CONNECT_RETRY = 1",
            "START SLAVE",
        )

    def url_for(self, table: str) -> str:
        return self.primary.url(self.endpoint.port, table)

    def wait_replicated(self, timeout: float = 30.0) -> None:
        """Until the replica has applied everything the primary has written."""
        position = self.primary.execute("SELECT @@gtid_binlog_pos")[0][0]
        if not position:
            return
        waited = self.replica.execute(f"SELECT MASTER_GTID_WAIT('{position}', {timeout})")
        if waited[0][0] != 0:
            raise RuntimeError(f"the replica did not reach {position}")

    def mute_link(self) -> None:
        """From now on the replica receives nothing (the bytes wait in the proxy's buffers;
        a reconnection waits too)."""
        self.link.blackhole()

    def kill_primary(self) -> None:
        self.primary.kill()

    def promote(self) -> None:
        """The replica becomes a writable primary; the endpoint moves to it (the clients'
        connections to the dead primary are cut)."""
        self.replica.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = 0")
        self.endpoint.retarget("127.0.0.1", self.replica.port)

    def destroy(self) -> None:
        self.endpoint.close()
        self.link.close()
        self.primary.destroy()
        self.replica.destroy()


@contextlib.contextmanager
def replicated_mariadb() -> Iterator[ReplicatedMariaDB]:
    root = Path(tempfile.mkdtemp(prefix="tasklock-mariadb-"))
    pair = ReplicatedMariaDB(root)
    try:
        pair.start()
        yield pair
    finally:
        pair.destroy()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def private_mariadb() -> Iterator[PrivateMariaDB]:
    """One private server with an empty database ``test`` (about a second to make)."""
    root = Path(tempfile.mkdtemp(prefix="tasklock-mariadb-"))
    server = PrivateMariaDB(root / "server", 1)
    try:
        server.root.mkdir(parents=True)
        server.install()
        server.start()
        server.execute("CREATE DATABASE test")
        yield server
    finally:
        server.destroy()
        shutil.rmtree(root, ignore_errors=True)
