"""``doctor``'s checks of an etcd store: reachable, a cluster with a leader, the clock."""

from __future__ import annotations

import time
from typing import Any

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.doctor import clock_check
from tasklock_cli.stores.doctor import warning
from tasklock_cli.stores.etcd import http
from tasklock_cli.stores.etcd.connection import EtcdClient
from tasklock_cli.stores.etcd.connection import describe
from tasklock_cli.stores.model import StoreCheck

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.etcd.store import EtcdStore


def store_checks(store: EtcdStore) -> list[StoreCheck]:
    client, prefix = store._client, store.prefix
    members = ", ".join(f"{h}:{p}" for h, p in client.members.config.members)
    checks = [
        StoreCheck(
            "store", True, f"{client.display_url} (members {members}; key prefix {prefix!r})"
        )
    ]
    try:
        client.call(("/v3/maintenance/status", {}))
        started = time.perf_counter()
        [status] = client.call(("/v3/maintenance/status", {}))
        rtt = time.perf_counter() - started
    except TasklockError as exc:
        checks.append(StoreCheck("reachable", False, str(exc)))
        return checks
    version = status.get("version", "unknown")
    checks.append(StoreCheck("reachable", True, f"etcd {version} answered in {rtt * 1000:.1f} ms"))
    checks.append(_check_cluster(client, status))
    checks.append(_check_clock(client))
    return checks


def _check_cluster(client: EtcdClient, status: dict[str, Any]) -> StoreCheck:
    try:
        [members] = client.call(("/v3/cluster/member/list", {}))
    except TasklockError as exc:
        return StoreCheck("cluster", False, str(exc))
    listed = members.get("members", [])
    leader = status.get("leader")
    names = {str(m.get("ID")): m.get("name") or m.get("ID") for m in listed}
    if not leader or leader == "0":
        return StoreCheck("cluster", False, f"{len(listed)} members and no leader")
    detail = f"{len(listed)} member(s), leader {names.get(str(leader), leader)}"
    if len(listed) < 3:
        return warning("cluster", detail + "; fewer than 3 members cannot survive losing one")
    return StoreCheck("cluster", True, detail)


def _check_clock(client: EtcdClient) -> StoreCheck:
    try:
        sent = time.time()
        server = client.members.server_date()
        received = time.time()
    except (OSError, http.Woken) as exc:
        return StoreCheck("clock", False, f"cannot read the member's clock: {describe(exc)}")
    if server is None:
        return StoreCheck("clock", True, "the member sent no Date header", warning=True)
    offset = server + 0.5 - (sent + received) / 2  # Date has whole seconds
    decides = "expiry runs on etcd's lease timers, acquired_at on the acquirer's clock"
    return clock_check("the member's", offset, 0.5 + (received - sent) / 2, decides)
