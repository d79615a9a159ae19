"""PostgreSQL helpers for tests: drop a test's table; a private throwaway server."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit, urlunsplit

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def drop_namespace(url: str) -> None:
    import psycopg
    from psycopg import sql

    parts = urlsplit(url)
    table = dict(parse_qsl(parts.query)).get("table")
    if not table:
        return
    with psycopg.connect(urlunsplit(parts._replace(query="")), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(*table.split("."))))


def _binary(name: str) -> str:
    candidate = PG_BIN / name
    return str(candidate) if candidate.exists() else (shutil.which(name) or name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PrivatePostgres:
    """A throwaway server in a temp dir, run as the ``postgres`` OS user when we are root."""

    def __init__(self, password: str | None = None) -> None:
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-pg-"))
        self.data = self.dir / "data"
        self.password = password
        self._as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as_user:
            shutil.chown(self.dir, "postgres")
        auth = (
            ["--auth=scram-sha-256", f"--pwfile={self._pwfile()}"] if password else ["--auth=trust"]
        )
        subprocess.run(
            [*self._as_user, _binary("initdb"), "-D", str(self.data), "-U", "postgres", *auth],
            check=True,
            capture_output=True,
        )
        self.start()

    def _pwfile(self) -> Path:
        path = self.dir / "pw"
        path.write_text(self.password or "")
        if self._as_user:
            shutil.chown(path, "postgres")
        return path

    @property
    def url(self) -> str:
        auth = f"postgres:{self.password}@" if self.password else "postgres@"
        return f"postgresql://{auth}127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        subprocess.run(
            [
                *self._as_user,
                _binary("pg_ctl"),
                "-D",
                str(self.data),
                "-l",
                str(self.dir / "log"),
                "-w",
                "-o",
                f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1",
                "start",
            ],
            check=True,
            capture_output=True,
        )

    def stop(self, mode: str = "fast") -> None:
        subprocess.run(
            [*self._as_user, _binary("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop"],
            capture_output=True,
        )

    def restart(self, down_for: float = 0.0) -> None:
        self.stop("immediate")
        time.sleep(down_for)
        self.start()

    def close(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_postgres(password: str | None = None):
    server = PrivatePostgres(password)
    try:
        yield server
    finally:
        server.close()
