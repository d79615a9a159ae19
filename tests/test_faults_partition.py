"""Partition: the wrapper reaches its store through a TCP proxy that the test blackholes.

The old command's whole process tree must be dead before a client connected directly gets
the lock; once healed, the old wrapper exits 70 and never renews over the new holder.
"""

from __future__ import annotations

import re
import time
from urllib.parse import urlsplit

import pytest

from tests.support import procs
from tests.support import report
from tests.support.cli import json_events
from tests.support.cli import json_run
from tests.support.cli import peek
from tests.support.cli import start
from tests.support.cli import tasklock
from tests.support.cli import wait_until
from tests.support.proxy import TcpProxy


@pytest.mark.slow
def test_partitioned_holder_is_dead_before_the_next_holder_starts(
    network_store_url, cli_env, tmp_path
):
    url = network_store_url
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port
    ready = tmp_path / "ready"
    with TcpProxy(host, port) as proxy:
        script = f"sleep 300 & sleep 300 & touch {ready}; wait"
        old = start(
            *json_run("k", "--ttl", "3s", "--grace", "1s", command=["sh", "-c", script]),
            env={**cli_env, "TASKLOCK_STORE": proxy.url_for(url)},
        )
        wait_until(ready.exists)
        old_info = peek(url, "k")
        assert old_info is not None
        tree = procs.command_tree(old.pid)
        assert len(tree) >= 3  # sh and its two sleeps

        watcher, tree_dead_at = procs.death_watch(tree)
        proxy.blackhole()
        partitioned_at = time.monotonic()
        watcher.start()
        checker = (
            "date +%s.%N; for p in $OLD_TREE; do "
            "s=$(cut -d')' -f2 /proc/$p/stat 2>/dev/null | awk '{print $1}'); "
            '[ -n "$s" ] && [ "$s" != Z ] && echo "overlap $p"; done; true'
        )
        new = tasklock(
            *json_run("k", "--wait", "30s", command=["sh", "-c", checker]),
            env={**cli_env, "TASKLOCK_STORE": url, "OLD_TREE": " ".join(map(str, tree))},
        )
        acquired_after = time.monotonic() - partitioned_at
        assert new.returncode == 0, new.stderr
        assert "overlap" not in new.stdout, new.stdout
        watcher.join(timeout=5)
        new_child_started = float(new.stdout.split()[0])
        gap = new_child_started - tree_dead_at[0]
        assert gap > 0
        assert not any(procs.alive(pid) for pid in tree)
        new_token = next(e for e in json_events(new.stderr) if e["event"] == "acquired")[
            "fencing_token"
        ]
        assert new_token > old_info.fencing_token
        assert acquired_after < 3 + 5  # the lease ran out on the store, a retry later we had it

        holder = start(
            "run", "k", "--ttl", "30s", "--", "sleep", "30", env={**cli_env, "TASKLOCK_STORE": url}
        )
        newest = wait_until(lambda: peek(url, "k"))
        proxy.heal()
        _, stderr = old.communicate(timeout=30)
        assert old.returncode == 70
        lost = [e for e in json_events(stderr) if e["event"] == "lost"]
        assert [e["detected_by"] for e in lost] == ["unreachable"]
        time.sleep(1)
        still = peek(url, "k")
        assert still is not None and still.fencing_token == newest.fencing_token
        assert still.holder.pid == holder.pid
        holder.terminate()
        holder.wait()
        report.record(
            "partition (blackhole), ttl 3s",
            report.store_of(url),
            old_tree_dead_before_new_child_by_s=gap,
            new_acquired_after_partition_s=acquired_after,
            old_exit=70,
            renewed_over_new_holder=False,
        )


def test_proxy_helper_itself_forwards_and_blackholes(tmp_path):
    """The fault tests mean nothing if the proxy silently passes traffic while blackholed."""
    import socket

    server = socket.create_server(("127.0.0.1", 0))
    with TcpProxy("127.0.0.1", server.getsockname()[1]) as proxy:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=2)
        upstream, _ = server.accept()
        client.sendall(b"ping")
        assert upstream.recv(4) == b"ping"
        proxy.blackhole()
        time.sleep(0.1)
        client.sendall(b"lost?")
        upstream.settimeout(0.5)
        with pytest.raises(TimeoutError):
            upstream.recv(5)
        proxy.heal()
        upstream.settimeout(2)
        assert re.match(rb"lost\?", upstream.recv(5))
        client.close()
        upstream.close()
    server.close()
