"""PostgreSQL helpers for tests: open a store, drop a test's table, and private throwaway
servers.

``PrivatePostgres`` runs its own ``postgres`` (initdb into a temporary directory, a free
port on 127.0.0.1) so that fault tests can stop, restart, pause or password-protect a
server without touching the shared one. As root, initdb and postgres run as the
``postgres`` OS user (they refuse to run as root); the server is the direct child of the
test process (no pg_ctl or runuser in between), so signals reach it exactly.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tasklock_cli.stores.postgres.provision import drop_namespace  # noqa: F401 - tests name it here
from tests.support.ports import free_port

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.base import Store
    from tasklock_cli.stores.postgres.store import PostgresStore

PG_BIN_ENV = "TASKLOCK_TEST_PG_BIN"


def _connect(url: str) -> tuple[Any, str]:
    import psycopg

    from tasklock_cli.stores.postgres.store import split_table

    clean, table = split_table(url)
    return psycopg.connect(clean, autocommit=True, connect_timeout=5), table


def open_pg(url: str, opened: list[Store]) -> PostgresStore:
    """A PostgreSQL store on ``url``, added to ``opened`` (which the test closes)."""
    from tasklock_cli.stores import open_store
    from tasklock_cli.stores.postgres.store import PostgresStore

    store = open_store(url)
    assert isinstance(store, PostgresStore)
    opened.append(store)
    return store


def admin_connection(url: str) -> Any:
    """A plain autocommit psycopg connection to the server and database of a store URL."""
    return _connect(url)[0]


def pg_bin_dir() -> Path | None:
    """Where initdb and postgres are: $TASKLOCK_TEST_PG_BIN, the newest Debian dir, PATH."""
    candidates: list[str] = []
    if os.environ.get(PG_BIN_ENV):
        candidates.append(os.environ[PG_BIN_ENV])

    def version(path: str) -> int:
        name = path.split("/")[-2]
        return int(name) if name.isdigit() else 0

    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=version, reverse=True)
    found = shutil.which("initdb")
    if found:
        candidates.append(str(Path(found).resolve().parent))
    for candidate in candidates:
        directory = Path(candidate)
        if (directory / "initdb").is_file() and (directory / "postgres").is_file():
            return directory
    return None


def require_private_postgres() -> None:
    """Skip (fail in CI) unless a private server can be started here."""
    import pytest

    from tests.support import services

    reason = private_postgres_unavailable()
    if reason:
        if services.in_ci():
            pytest.fail(f"CI=true but no private PostgreSQL can be started: {reason}")
        pytest.skip(reason)


def private_postgres_unavailable() -> str | None:
    """None when a private server can be started here, else why not."""
    if pg_bin_dir() is None:
        return f"no initdb/postgres binaries (set {PG_BIN_ENV})"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root but there is no 'postgres' OS user to run the server"
    return None


class PrivatePostgres:
    """A throwaway PostgreSQL on 127.0.0.1:<free port>, data in a temporary directory.

    ``stop(mode)`` shuts it down (``fast`` = SIGINT, ``immediate`` = SIGQUIT), ``start()``
    starts it again on the same port and data, ``restart()`` does both, ``pause_backend``
    / ``resume_backend`` SIGSTOP/SIGCONT one backend. ``destroy()`` always stops it and
    removes the directory.
    """

    def __init__(
        self,
        *,
        password: str | None = None,
        settings: dict[str, str] | None = None,
        template: Path | None = None,
    ) -> None:
        """``settings``: more ``-c`` settings for the server; ``template``: a data directory
        (of a stopped server) to copy instead of running initdb."""
        self.settings = dict(settings or {})
        self.template = template
        bin_dir = pg_bin_dir()
        if bin_dir is None:
            raise RuntimeError("no PostgreSQL binaries found")
        self.bin_dir = bin_dir
        self.password = password
        self.port = free_port()
        self.user = "postgres"
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-pg-"))
        self.data = self.dir / "data"
        self.sockets = self.dir / "sock"
        self.log = self.dir / "postgres.log"
        self.process: subprocess.Popen | None = None
        self._paused: set[int] = set()
        self._run_as: dict[str, Any] = {}
        try:
            if os.geteuid() == 0:
                entry = pwd.getpwnam("postgres")
                self._run_as = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
                os.chown(self.dir, entry.pw_uid, entry.pw_gid)
            os.chmod(self.dir, 0o700)
            self.sockets.mkdir()
            if self._run_as:
                os.chown(self.sockets, self._run_as["user"], self._run_as["group"])
            self._make_data()
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _env(self) -> dict[str, str]:
        return {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LC_ALL": "C",
            "LANG": "C",
            "HOME": str(self.dir),
        }

    def _make_data(self) -> None:
        if self.template is None:
            self._initdb()
            return
        shutil.copytree(self.template, self.data, symlinks=True)
        if self._run_as:
            for path in [self.data, *self.data.rglob("*")]:
                os.lchown(path, self._run_as["user"], self._run_as["group"])

    def run_as_server_user(self, args: list[str], timeout: float = 60) -> str:
        """Run a PostgreSQL tool (``initdb``, ``pg_ctl``, ``pg_basebackup``) as the server's
        OS user; its output (RuntimeError when it fails)."""
        result = subprocess.run(
            args,
            cwd=self.dir,
            env=self._env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            **self._run_as,
        )
        if result.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({result.returncode}): {result.stderr[-2000:]}")
        return result.stdout

    def _initdb(self) -> None:
        args = [
            str(self.bin_dir / "initdb"),
            "-D",
            str(self.data),
            "-U",
            self.user,
            "-E",
            "UTF8",
            "--no-sync",
            "--auth-local=trust",
        ]
        if self.password:
            pwfile = self.dir / "pwfile"
            pwfile.write_text(self.password + "\n")
            if self._run_as:
                os.chown(pwfile, self._run_as["user"], self._run_as["group"])
            args += ["--auth-host=scram-sha-256", f"--pwfile={pwfile}"]
        else:
            args += ["--auth-host=trust"]
        self.run_as_server_user(args, timeout=120)

    @property
    def url(self) -> str:
        """The server's URL (database ``postgres``, the server's own password)."""
        return self.url_for()

    def url_for(
        self, table: str | None = None, password: str | None = None, dbname: str = "postgres"
    ) -> str:
        secret = self.password if password is None else password
        auth = f"{self.user}:{secret}@" if secret else f"{self.user}@"
        query = f"?table={table}" if table else ""
        return f"postgresql://{auth}127.0.0.1:{self.port}/{dbname}{query}"

    def start(self, timeout: float = 30.0) -> PrivatePostgres:
        if self.process is not None and self.process.poll() is None:
            return self
        args = [
            str(self.bin_dir / "postgres"),
            "-D",
            str(self.data),
            "-p",
            str(self.port),
            "-k",
            str(self.sockets),
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            # fsync off is safe here: a crashed server's WAL is still in the page cache;
            # synchronous_commit stays on so an immediate stop loses no committed lease.
            "fsync=off",
            "-c",
            "full_page_writes=off",
            "-c",
            "max_connections=50",
        ]
        for name, value in self.settings.items():
            args += ["-c", f"{name}={value}"]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                args,
                cwd=self.dir,
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                close_fds=True,
                start_new_session=True,
                **self._run_as,
            )
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"postgres exited with {self.process.returncode}: {self.log_tail()}"
                )
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.Error as exc:
                last = exc
                time.sleep(0.05)
        raise RuntimeError(f"postgres on port {self.port} not ready in {timeout}s: {last}")

    def log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self, mode: str = "fast", timeout: float = 30.0) -> None:
        """Shut the server down: ``smart`` SIGTERM, ``fast`` SIGINT, ``immediate`` SIGQUIT."""
        for pid in list(self._paused):
            self.resume_backend(pid)
        process = self.process
        if process is None or process.poll() is not None:
            return
        sig = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}[mode]
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        # Anything left in the server's session (backends after an immediate stop) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)

    def restart(
        self, mode: str = "fast", timeout: float = 30.0, down_for: float = 0.0
    ) -> PrivatePostgres:
        self.stop(mode)
        time.sleep(down_for)
        return self.start(timeout)

    def kill(self) -> None:
        """SIGKILL the server and every backend at once (a crash: nothing is flushed or
        sent after it)."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)

    def pause_backend(self, pid: int) -> None:
        """SIGSTOP one backend: its client's socket stays open but nothing answers."""
        os.kill(pid, signal.SIGSTOP)
        self._paused.add(pid)

    def resume_backend(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        self._paused.discard(pid)

    def connection(self) -> Any:
        import psycopg

        return psycopg.connect(self.url, autocommit=True, connect_timeout=5)

    def close(self) -> None:
        self.destroy()

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_postgres(*, password: str | None = None) -> Iterator[PrivatePostgres]:
    """Start a private PostgreSQL; always stopped and its directory removed afterwards."""
    server = PrivatePostgres(password=password)
    try:
        server.start()
        yield server
    finally:
        server.destroy()
