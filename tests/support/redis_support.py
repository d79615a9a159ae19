"""Redis test helpers: drop a test's namespace; private throwaway redis-server processes."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tasklock_cli.stores.redis.provision import drop_namespace  # noqa: F401 - tests name it here
from tests.support import services
from tests.support.ports import free_port

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.redis.store import RedisStore

REDIS_SERVER = os.environ.get("TASKLOCK_TEST_REDIS_SERVER", "/usr/bin/redis-server")


@pytest.fixture
def raw_redis(redis_url):
    """A plain redis-py client on the shared Redis server, for what a test reads or writes
    in ``redis_url``'s namespace itself (a fixture: its test modules import it)."""
    client, _ = _client_for(redis_url)
    yield client
    client.close()


def _client_for(url: str):
    import redis

    from tasklock_cli.stores.redis.connection import split_url

    clean, prefix, _ = split_url(url)
    return redis.Redis.from_url(clean, socket_timeout=5, socket_connect_timeout=5), prefix


@contextlib.contextmanager
def opened_redis(url: str) -> Iterator[RedisStore]:
    """``open_store(url)``, the Redis store it is (its ``prefix`` and the like), closed after."""
    from tasklock_cli.stores import open_store
    from tasklock_cli.stores.redis.store import RedisStore

    with open_store(url) as store:
        assert isinstance(store, RedisStore)
        yield store


def known_namespace(url: str) -> str:
    """``url``, its namespace's epoch record written as this server's (epoch 0, no
    quarantine): a namespace in use before the test. A server started a moment ago would
    otherwise quarantine a namespace it has no record of (a restart may have lost it: see
    tasklock_cli/stores/redis/epochs.py)."""
    client, prefix = _client_for(url)
    try:
        replid = client.info("replication")["master_replid"]
        run_id = client.info("server")["run_id"]
        record = {"replid": replid, "run_id": run_id, "epoch": 0, "quarantine_until": 0}
        client.hset(prefix.encode() + b"{}:epoch", mapping=record)
    finally:
        client.close()
    return url


def redis_server_available() -> bool:
    return os.access(REDIS_SERVER, os.X_OK) or shutil.which("redis-server") is not None


def require_redis_server() -> None:
    """The shared Redis, and a redis-server binary for private ones: else skip (fail in CI)."""
    services.require("redis")
    if not redis_server_available():
        reason = f"no redis-server binary at {REDIS_SERVER}"
        if services.in_ci():
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)


class PrivateRedis:
    """A throwaway redis-server on 127.0.0.1:<free port>, data in a temporary directory.

    ``kill()`` SIGKILLs it, ``start()`` (re)starts it on the same port and directory,
    ``pause()``/``resume()`` SIGSTOP/SIGCONT it. ``stop()`` always cleans up.
    """

    def __init__(
        self,
        *,
        password: str | None = None,
        persistence: bool = False,
        extra_args: list[str] | None = None,
    ) -> None:
        self.port = free_port()
        self.password = password
        self.persistence = persistence
        self.extra_args = list(extra_args or [])
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-redis-"))
        self.process: subprocess.Popen | None = None
        self._paused = False

    def url(self, prefix: str = "tasklock-test:", password: str | None = None) -> str:
        secret = self.password if password is None else password
        auth = f":{secret}@" if secret else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0?prefix={prefix}"

    def _args(self) -> list[str]:
        binary = REDIS_SERVER if os.access(REDIS_SERVER, os.X_OK) else "redis-server"
        args = [
            binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(self.dir),
            "--daemonize",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        if self.persistence:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--save", "", "--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        return args + self.extra_args

    def start(self, timeout: float = 10.0) -> PrivateRedis:
        if self.process is not None and self.process.poll() is None:
            return self
        self.process = subprocess.Popen(
            self._args(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=True
        )
        self._paused = False
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {log}")
            if self.ping():
                return
            time.sleep(0.02)
        raise RuntimeError(f"redis-server on port {self.port} did not answer within {timeout}s")

    def ping(self) -> bool:
        """True when the server answers PING (a NOAUTH/-ERR reply counts: it is up)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as sock:
                sock.sendall(b"PING\r\n")
                reply = sock.recv(64)
        except OSError:
            return False
        return reply.startswith((b"+PONG", b"-NOAUTH", b"-ERR", b"-WRONGPASS"))

    def kill(self) -> None:
        """SIGKILL: no shutdown save, clients see the connection reset."""
        if self.process is not None and self.process.poll() is None:
            if self._paused:
                os.kill(self.process.pid, signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=10)
        self._paused = False

    def restart(self, timeout: float = 10.0) -> PrivateRedis:
        self.kill()
        return self.start(timeout)

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing answers (a hung server)."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        if self.process is not None and self._paused:
            os.kill(self.process.pid, signal.SIGCONT)
            self._paused = False

    def client(self):
        import redis

        return redis.Redis(
            host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5
        )

    def stop(self) -> None:
        try:
            self.kill()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def private_redis(
    *,
    password: str | None = None,
    persistence: bool = False,
    extra_args: list[str] | None = None,
) -> Iterator[PrivateRedis]:
    """Start a private redis-server; always SIGKILLed and its directory removed afterwards."""
    server = PrivateRedis(password=password, persistence=persistence, extra_args=extra_args)
    try:
        server.start()
        yield server
    finally:
        server.stop()
