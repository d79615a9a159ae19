"""etcd test helpers: private throwaway etcd members (one shared per test session for the
contract suite, clusters of three for fault tests), and why there is none (``etcd``'s
provisioning names this module as its ``private_server``)."""

from __future__ import annotations

import atexit
import base64
import contextlib
import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from tests.support.ports import free_port


def etcd_binary() -> str | None:
    configured = os.environ.get("TASKLOCK_TEST_ETCD")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    return shutil.which("etcd")


def post(client_url: str, path: str, body: dict, timeout: float = 3) -> dict:
    request = urllib.request.Request(
        client_url + path, data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        text = reply.read().decode()
    return json.loads(text.splitlines()[0]) if text else {}


def memory_dir() -> str | None:
    """/dev/shm where it is writable: the members' write-ahead logs there do not wait on a disk
    the rest of the suite keeps busy (a raft election then takes its election timeout, not
    that plus seconds of fsync under load). None: the temporary directory."""
    shm = "/dev/shm"
    return shm if os.path.isdir(shm) and os.access(shm, os.W_OK | os.X_OK) else None


class EtcdCluster:
    """``size`` etcd members on 127.0.0.1 free ports, data in a temporary directory.

    ``kill(i)`` SIGKILLs member i, ``start(i)`` (re)starts it on the same ports and data,
    ``leader()`` is the index of the current leader. ``stop()`` always cleans up.
    """

    def __init__(self, size: int = 1, heartbeat_ms: int = 100, election_ms: int = 1000) -> None:
        binary = etcd_binary()
        assert binary, "no etcd binary"
        self.binary = binary
        self.size = size
        self.heartbeat_ms = heartbeat_ms
        self.election_ms = election_ms
        self.dir = Path(tempfile.mkdtemp(prefix="tasklock-etcd-", dir=memory_dir()))
        self.client_ports = [free_port() for _ in range(size)]
        self.peer_ports = [free_port() for _ in range(size)]
        self.processes: list[subprocess.Popen | None] = [None] * size
        self._token = f"tasklock-test-{os.getpid()}-{self.client_ports[0]}"

    # -- addresses -----------------------------------------------------------------

    def client_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.client_ports[index]}"

    def url(self, prefix: str = "tasklock/", members: list[int] | None = None) -> str:
        chosen = range(self.size) if members is None else members
        hosts = ",".join(f"127.0.0.1:{self.client_ports[i]}" for i in chosen)
        return f"etcd://{hosts}/?prefix={prefix}"

    # -- processes -------------------------------------------------------------------

    def _args(self, index: int) -> list[str]:
        name = f"m{index}"
        peers = ",".join(f"m{i}=http://127.0.0.1:{self.peer_ports[i]}" for i in range(self.size))
        return [
            self.binary,
            "--name", name,
            "--data-dir", str(self.dir / name),
            "--listen-client-urls", self.client_url(index),
            "--advertise-client-urls", self.client_url(index),
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_ports[index]}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_ports[index]}",
            "--initial-cluster", peers,
            "--initial-cluster-token", self._token,
            "--heartbeat-interval", str(self.heartbeat_ms),
            "--election-timeout", str(self.election_ms),
            "--log-level", "error",
        ]  # fmt: skip

    def start(self, index: int | None = None) -> None:
        indexes = range(self.size) if index is None else [index]
        for i in indexes:
            log = open(self.dir / f"m{i}.log", "ab")  # noqa: SIM115 - the process keeps it
            self.processes[i] = subprocess.Popen(
                self._args(i), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            log.close()
        self.wait_ready(list(indexes))

    def wait_ready(self, indexes: list[int], timeout: float = 30) -> None:
        """Until each member answers and the cluster has a leader."""
        give_up = time.monotonic() + timeout
        for i in indexes:
            while True:
                process = self.processes[i]
                if process is not None and process.poll() is not None:
                    raise RuntimeError(f"etcd member {i} exited: {self.log(i)[-2000:]}")
                with contextlib.suppress(OSError, ValueError):
                    status = post(self.client_url(i), "/v3/maintenance/status", {})
                    if status.get("leader", "0") != "0":
                        # a write proves the member is part of a working quorum
                        post(self.client_url(i), "/v3/kv/range", {"key": "eA=="})
                        break
                if time.monotonic() > give_up:
                    raise RuntimeError(f"etcd member {i} did not get ready: {self.log(i)[-2000:]}")
                time.sleep(0.05)

    def log(self, index: int) -> str:
        path = self.dir / f"m{index}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, index: int) -> None:
        process = self.processes[index]
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGKILL)
            process.wait()

    def leader(self) -> int:
        """Index of the member that is the leader (asked of a live member)."""
        ids: dict[str, int] = {}
        leader_id = None
        for i in range(self.size):
            process = self.processes[i]
            if process is None or process.poll() is not None:
                continue
            with contextlib.suppress(OSError, ValueError):
                status = post(self.client_url(i), "/v3/maintenance/status", {})
                ids[status["header"]["member_id"]] = i
                leader_id = status.get("leader") or leader_id
        assert leader_id in ids, (leader_id, ids)
        return ids[leader_id]

    def stop(self) -> None:
        for i in range(self.size):
            self.kill(i)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> EtcdCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@functools.cache
def shared_member() -> EtcdCluster:
    """One member for the whole test session (the contract suite and CLI tests)."""
    member = EtcdCluster(1, heartbeat_ms=50, election_ms=500)
    atexit.register(member.stop)
    member.start()
    return member


def base_url() -> str:
    """``TASKLOCK_TEST_ETCD_URL`` (an etcd already running), else the shared private member."""
    configured = os.environ.get("TASKLOCK_TEST_ETCD_URL")
    if configured:
        return configured.split("?")[0].rstrip("/") + "/"
    return shared_member().url().split("?")[0]


def unavailable_reason() -> str | None:
    """Why the etcd tests cannot run here (no binary, a member that did not start), or None
    (``services.unavailable_reason``: etcd's provisioning names this module)."""
    if not os.environ.get("TASKLOCK_TEST_ETCD_URL") and etcd_binary() is None:
        return (
            "the etcd binary is not installed (Debian: apt-get install etcd-server; "
            "or set TASKLOCK_TEST_ETCD_URL)"
        )
    try:
        base_url()
    except (OSError, RuntimeError) as exc:
        return f"could not start a private etcd member ({exc})"
    return None


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()
