"""A private etcd member for the bench: free loopback ports, data in a temporary directory,
started before the sections and killed (its directory removed) at the end."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from bench.harness import RUN_ID


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def prefix_end(prefix: bytes) -> bytes:
    """etcd's range end for every key that starts with ``prefix``."""
    chars = bytearray(prefix)
    while chars and chars[-1] == 0xFF:
        chars.pop()
    if not chars:
        return b"\0"
    chars[-1] += 1
    return bytes(chars)


def etcdctl_prefix(namespace: str = "") -> str:
    """The bench's own keys on its member (etcdctl's locks, the raw baselines), beside
    tasklock's namespaces: ``tlbench/<run id>/<namespace>/``."""
    return f"tlbench/{RUN_ID}/" + (f"{namespace}/" if namespace else "")


class Gateway:
    """One keep-alive HTTP connection to a member's JSON gateway (``/v3/...``)."""

    def __init__(self, port: int, timeout: float = 5.0) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def post(self, path: str, body: dict) -> dict:
        self.conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        reply = self.conn.getresponse()
        text = reply.read().decode()
        if reply.status != 200:
            raise OSError(f"etcd {path}: HTTP {reply.status} {text[:200]}")
        return json.loads(text) if text else {}

    def close(self) -> None:
        self.conn.close()


class EtcdMember:
    """``etcd`` on 127.0.0.1 free ports; ``url(prefix)`` is a tasklock store URL on it."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-bench-etcd-"))
        self.client_port, self.peer_port = free_port(), free_port()
        self.process: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def url(self, prefix: str) -> str:
        return f"etcd://{self.endpoint}/?prefix={prefix}"

    def start(self, timeout: float = 30.0) -> None:
        client, peer = f"http://{self.endpoint}", f"http://127.0.0.1:{self.peer_port}"
        argv = [
            self.binary, "--name", "bench", "--data-dir", str(self.dir / "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"bench={peer}",
            "--initial-cluster-token", f"tasklock-bench-{self.client_port}",
            "--log-level", "error",
        ]  # fmt: skip
        with open(self.dir / "etcd.log", "ab") as log:
            self.process = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """Until the member answers, has a leader and serves a read."""
        give_up = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.log()[-500:]}")
            with contextlib.suppress(OSError, ValueError, http.client.HTTPException):
                gateway = Gateway(self.client_port, timeout=2)
                try:
                    if gateway.post("/v3/maintenance/status", {}).get("leader", "0") != "0":
                        gateway.post("/v3/kv/range", {"key": b64(b"x")})
                        return
                finally:
                    gateway.close()
            if time.monotonic() > give_up:
                raise RuntimeError(f"etcd did not get ready: {self.log()[-500:]}")
            time.sleep(0.05)

    def version(self) -> str:
        gateway = Gateway(self.client_port)
        try:
            return str(gateway.post("/v3/maintenance/status", {}).get("version", "?"))
        finally:
            gateway.close()

    def drop_prefix(self, prefix: str) -> None:
        start = prefix.encode()
        gateway = Gateway(self.client_port, timeout=30)
        try:
            gateway.post(
                "/v3/kv/deleterange", {"key": b64(start), "range_end": b64(prefix_end(start))}
            )
        finally:
            gateway.close()

    def log(self) -> str:
        path = self.dir / "etcd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
