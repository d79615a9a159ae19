"""Private Redis failovers: a primary, a replica that replicates through a TCP proxy (the
link a test cuts), and optionally three sentinels watching them.

A paused replica still receives writes from its socket buffers when it resumes: a test
that wants writes lost cuts the link instead (``cut_link``), which drops what the proxy
had not passed on and keeps the replica from reconnecting.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.ports import free_port
from tests.support.proxy import TcpProxy
from tests.support.redis_support import REDIS_SERVER
from tests.support.redis_support import PrivateRedis

SERVICE = "tlprimary"


def _wait(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if condition():
                return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def replication(server: PrivateRedis) -> dict:
    client = server.client()
    try:
        return client.info("replication")
    finally:
        client.close()


class ReplicatedRedis:
    """A private primary and one replica replicating through ``link`` (a TcpProxy)."""

    def __init__(self) -> None:
        self.primary = PrivateRedis().start()
        self.link = TcpProxy("127.0.0.1", self.primary.port)
        self.replica = PrivateRedis(
            extra_args=[
                "--replicaof",
                "127.0.0.1",
                str(self.link.port),
                # Announce the replica's own port, not the proxy's view of it.
                "--replica-announce-ip",
                "127.0.0.1",
            ]
        )
        self.replica.extra_args += ["--replica-announce-port", str(self.replica.port)]
        self.replica.start()
        self.wait_synced()

    def wait_synced(self, timeout: float = 15.0) -> None:
        """Until the replica's link is up and it has every byte the primary wrote."""

        def caught_up() -> bool:
            ours = replication(self.replica)
            theirs = replication(self.primary)
            return ours.get("master_link_status") == "up" and ours.get(
                "slave_repl_offset"
            ) == theirs.get("master_repl_offset")

        _wait(caught_up, timeout, "the replica to catch up")

    def cut_link(self) -> None:
        """The replica gets nothing more from the primary (and cannot reconnect)."""
        self.link.blackhole()
        self.link.cut()

    def promote(self) -> None:
        """``REPLICAOF NO ONE`` on the replica: it becomes a primary with a new replid."""
        client = self.replica.client()
        try:
            client.execute_command("REPLICAOF", "NO", "ONE")
        finally:
            client.close()

    def stop(self) -> None:
        for step in (self.link.close, self.replica.stop, self.primary.stop):
            with contextlib.suppress(Exception):
                step()


@contextlib.contextmanager
def replicated_redis() -> Iterator[ReplicatedRedis]:
    pair = ReplicatedRedis()
    try:
        yield pair
    finally:
        pair.stop()


class Sentinels:
    """Three ``redis-server --sentinel`` processes watching ``primary_port`` as SERVICE
    (quorum 2, down after 1 s)."""

    def __init__(self, primary_port: int, count: int = 3, down_after_ms: int = 1000) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-sentinel-"))
        self.ports = [free_port() for _ in range(count)]
        self.processes: list[subprocess.Popen] = []
        binary = REDIS_SERVER if os.access(REDIS_SERVER, os.X_OK) else "redis-server"
        for port in self.ports:
            config = self.dir / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\n"
                "bind 127.0.0.1\n"
                f"dir {self.dir}\n"
                f"logfile {self.dir / f'sentinel-{port}.log'}\n"
                f"sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 2\n"
                f"sentinel down-after-milliseconds {SERVICE} {down_after_ms}\n"
                f"sentinel failover-timeout {SERVICE} 10000\n"
                f"sentinel parallel-syncs {SERVICE} 1\n"
            )
            self.processes.append(
                subprocess.Popen(
                    [binary, str(config), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    close_fds=True,
                )
            )

    def url(self, prefix: str, scheme: str = "redis+sentinel", query: str = "") -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.ports)
        extra = f"&{query}" if query else ""
        return f"{scheme}://{hosts}/{SERVICE}/0?prefix={prefix}{extra}"

    def client(self, index: int = 0):
        import redis

        return redis.Redis(
            host="127.0.0.1", port=self.ports[index], socket_timeout=2, decode_responses=True
        )

    def primary(self, index: int = 0) -> tuple[str, int]:
        client = self.client(index)
        try:
            host, port = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        finally:
            client.close()
        return host, int(port)

    def wait_ready(self, replicas: int = 1, timeout: float = 20.0) -> None:
        """Until every sentinel knows the others and ``replicas`` replicas."""

        def ready() -> bool:
            for index in range(len(self.ports)):
                client = self.client(index)
                try:
                    state = client.execute_command("SENTINEL", "MASTER", SERVICE)
                finally:
                    client.close()
                if not isinstance(state, dict):  # (redis-py parses it in most releases)
                    state = dict(zip(state[0::2], state[1::2], strict=True))
                if int(state["num-other-sentinels"]) < len(self.ports) - 1:
                    return False
                if int(state["num-slaves"]) < replicas:
                    return False
            return True

        _wait(ready, timeout, "the sentinels to know each other and the replica")

    def wait_primary(self, port: int, timeout: float = 30.0) -> None:
        """Until a majority of the sentinels name the primary on ``port``."""

        def moved() -> bool:
            named = 0
            for index in range(len(self.ports)):
                with contextlib.suppress(Exception):
                    named += self.primary(index)[1] == port
            return named > len(self.ports) // 2

        _wait(moved, timeout, f"the sentinels to name 127.0.0.1:{port} the primary")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def sentinels_for(primary_port: int) -> Iterator[Sentinels]:
    watchers = Sentinels(primary_port)
    try:
        yield watchers
    finally:
        watchers.stop()
