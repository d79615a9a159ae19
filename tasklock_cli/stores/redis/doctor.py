"""The Redis store's ``doctor``: reachability, the server, the settings fencing tokens
depend on (persistence, eviction), the Lua scripts and Redis's clock."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis.exceptions as rexc

from tasklock_cli.errors import TasklockError
from tasklock_cli.stores.doctor import clock_check
from tasklock_cli.stores.model import StoreCheck
from tasklock_cli.stores.redis.connection import RedisConnection

TYPE_CHECKING = False
if TYPE_CHECKING:
    from tasklock_cli.stores.redis.store import RedisStore


def store_checks(store: RedisStore) -> list[StoreCheck]:
    return _RedisDoctor(store._conn, store.quarantine).checks()


class _RedisDoctor:
    def __init__(self, conn: RedisConnection, quarantine: Callable[[], str | None]) -> None:
        self._conn = conn
        self._quarantine = quarantine  # (``Store.quarantine``)

    def checks(self) -> list[StoreCheck]:
        checks = [
            StoreCheck(
                "store", True, f"{self._conn.display_url} (key prefix {self._conn.names.prefix!r})"
            )
        ]
        if self._conn.sentinels is not None:
            checks.append(self._check_primary())
        try:
            self._conn.call(lambda c: c.ping())  # connects (and authenticates)
            started = time.perf_counter()
            self._conn.call(lambda c: c.ping())
            rtt = time.perf_counter() - started
        except TasklockError as exc:
            checks.append(StoreCheck("reachable", False, str(exc)))
            return checks
        checks.append(StoreCheck("reachable", True, f"PING answered in {rtt * 1000:.1f} ms"))
        for check in (self._check_server, self._check_persistence, self._check_eviction):
            try:
                checks.append(check())
            except TasklockError as exc:
                checks.append(StoreCheck(check.__name__[7:], False, str(exc)))
        checks.extend(self._failover_checks())
        checks.append(self._check_scripts())
        checks.append(self._check_clock())
        return checks

    def _failover_checks(self) -> list[StoreCheck]:
        checks = []
        for check in (self._check_replication, self._check_epoch):
            try:
                checks.append(check())
            except TasklockError as exc:
                checks.append(StoreCheck(check.__name__[7:], False, str(exc)))
        return checks

    def _check_primary(self) -> StoreCheck:
        """Which primary the sentinels name, and the replicas they know (addresses only)."""
        sentinels, target = self._conn.sentinels, self._conn.sentinel_target
        assert sentinels is not None and target is not None
        try:
            host, port = sentinels.discover_master(target.service)
        except rexc.RedisError as exc:  # (MasterNotFoundError among them)
            return StoreCheck("primary", False, self._conn.scrub(exc))
        replicas = [
            f"{replica.get('ip')}:{replica.get('port')}"
            + ("" if _replica_up(replica) else " (down)")
            for replica in sentinels.replicas_of(target.service)
        ]
        known = ", ".join(replicas) if replicas else "none"
        return StoreCheck(
            "primary",
            True,
            f"the sentinels name {host}:{port} the primary of {target.service!r}; "
            f"replicas they know: {known}",
        )

    def _check_replication(self) -> StoreCheck:
        info = self._info_section("replication")
        role = info.get("role")
        if role != "master":
            return StoreCheck(
                "replication",
                False,
                f"connected to a {role}, not a primary: writes fail (READONLY); point the URL "
                "at the primary, or use a redis+sentinel:// URL",
            )
        replicas = int(info.get("connected_slaves", 0))
        wanted = self._conn.wait_replicas
        if wanted > replicas:
            return StoreCheck(
                "replication",
                False,
                f"wait_replicas={wanted} but only {replicas} replicas are connected: every "
                "acquire and renewal fails",
            )
        if replicas == 0:
            return StoreCheck(
                "replication",
                True,
                "no replica connected: the data is as durable as this server's persistence; "
                "after a failover, or a restart that may have lost writes, new leases wait "
                "out a quarantine (longest TTL + 2 s, at least 32 s)",
                warning=True,
            )
        if wanted > 0:
            return StoreCheck(
                "replication",
                True,
                f"{replicas} replica(s); each acquire and renewal waits for {wanted} to "
                "confirm (WAIT)",
            )
        return self._unconfirmed_replication(replicas, info)

    def _unconfirmed_replication(self, replicas: int, info: dict[str, Any]) -> StoreCheck:
        """Replicas without wait_replicas=: safe only while the servers refuse writes that
        no replica takes (``min-replicas-to-write``; INFO shows ``min_slaves_good_slaves``
        only when it is set, for when CONFIG is refused)."""
        setting = self._conn.config_get("min-replicas-to-write")
        at_least = _number(setting)
        if setting is None and "min_slaves_good_slaves" in info:
            at_least = 1
        max_lag = self._conn.config_get("min-replicas-max-lag") or "?"
        if at_least >= 1:
            return StoreCheck(
                "replication",
                True,
                f"{replicas} replica(s), asynchronous; min-replicas-to-write {setting or 'set'}, "
                f"min-replicas-max-lag {max_lag}s: an old primary cut off from its replicas "
                f"stops taking writes after {max_lag}s (keep that below the time a failover "
                "takes to detect the failure)",
            )
        return StoreCheck(
            "replication",
            True,
            f"{replicas} replica(s), asynchronous and unconfirmed: an old primary that comes "
            "back after a failover (paused, partitioned) still renews its holders' leases "
            "beside the new primary (split brain); set wait_replicas=N in the store URL "
            "(every replica that can be promoted), or min-replicas-to-write >= 1 with "
            "min-replicas-max-lag below the failover detection time on the servers",
            warning=True,
        )

    def _check_epoch(self) -> StoreCheck:
        """The namespace's failover epoch record (see ``epochs``)."""
        name = self._conn.names.epoch_record()
        record = self._conn.call(lambda c: c.hgetall(name))
        held_up = self._quarantine()
        if not record:
            detail = "no epoch record yet (written by the first acquire, or `tasklock init`)"
            return StoreCheck("failover", True, held_up or detail, warning=held_up is not None)
        epoch = _number(record.get(b"epoch"))
        max_ttl = _number(record.get(b"max_ttl")) / 1000
        detail = f"epoch {epoch}" + (" (no failover seen)" if epoch == 0 else "")
        detail += f"; longest TTL granted {max_ttl:g}s"
        if record.get(b"lossless") == b"1":
            detail += "; a restart loses nothing (AOF fsynced at every write, no replica)"
        if held_up:
            detail += f"; quarantine: {held_up}"
        return StoreCheck("failover", True, detail, warning=held_up is not None)

    def _check_scripts(self) -> StoreCheck:
        try:
            for script in self._conn.scripts.values():
                # (ignore: mypy cannot infer a lambda with a default, which binds the loop's
                # script)
                self._conn.call(lambda c, script=script: c.script_load(script.script))  # type: ignore[misc]
        except TasklockError as exc:
            return StoreCheck("scripts", False, f"cannot load tasklock's Lua scripts: {exc}")
        return StoreCheck("scripts", True, f"{len(self._conn.scripts)} Lua scripts loaded")

    def _info_section(self, section: str) -> dict[str, Any]:
        return self._conn.call(lambda c: c.info(section))

    def _check_server(self) -> StoreCheck:
        info = self._info_section("server")
        version = info.get("redis_version", "unknown")
        mode = info.get("redis_mode", "standalone")
        if mode == "cluster":
            return StoreCheck(
                "server",
                True,
                f"Redis {version} in cluster mode: tasklock talks to one node; keys of other "
                "slots get MOVED errors — use a standalone or primary endpoint",
                warning=True,
            )
        return StoreCheck("server", True, f"Redis {version} ({mode})")

    def _check_persistence(self) -> StoreCheck:
        appendonly = self._conn.config_get("appendonly")
        fsync = self._conn.config_get("appendfsync")
        risk = (
            "fencing tokens are only as durable as Redis: after a restart that loses "
            "everything, tokens issued before can be issued again (a namespace's first run "
            "within 32 s of the start waits that long; after that nothing shows the loss)"
        )
        if appendonly is None or fsync is None:
            try:
                aof = self._info_section("persistence").get("aof_enabled")
            except TasklockError:
                aof = None
            known = "" if aof is None else f" (INFO says aof_enabled={aof})"
            return StoreCheck(
                "persistence",
                True,
                f"could not be checked: CONFIG GET is not allowed{known}; {risk} — "
                "make sure AOF with appendfsync everysec or always is on",
                warning=True,
            )
        if appendonly == "yes" and fsync == "always":
            return StoreCheck("persistence", True, "AOF on, appendfsync always")
        if appendonly == "yes" and fsync == "everysec":
            return StoreCheck(
                "persistence",
                True,
                "AOF on, appendfsync everysec: a crash can lose the last second of writes "
                "(a --once-per success among them, which then runs again), so every restart "
                "quarantines new leases (32 s or more) and tokens jump; with appendfsync "
                "always a restart loses nothing and grants at once",
                warning=True,
            )
        return StoreCheck(
            "persistence",
            True,
            f"appendonly {appendonly}, appendfsync {fsync}: {risk}; "
            "enable appendonly yes with appendfsync everysec or always",
            warning=True,
        )

    def _check_eviction(self) -> StoreCheck:
        policy = self._conn.config_get("maxmemory-policy")
        if policy is None:
            try:
                policy = self._info_section("memory").get("maxmemory_policy")
            except TasklockError:
                policy = None
        if policy is None:
            return StoreCheck(
                "eviction",
                True,
                "maxmemory-policy could not be checked (CONFIG GET and INFO refused); it "
                "must be noeviction",
                warning=True,
            )
        if policy == "noeviction":
            return StoreCheck("eviction", True, "maxmemory-policy noeviction")
        what = (
            "volatile-* policies evict live leases (a second holder can start)"
            if str(policy).startswith("volatile")
            else "allkeys-* policies can evict leases and fencing counters"
        )
        return StoreCheck(
            "eviction", True, f"maxmemory-policy {policy}: {what}; use noeviction", warning=True
        )

    def _check_clock(self) -> StoreCheck:
        try:
            sent_wall = time.time()
            sent = time.perf_counter()
            seconds, micros = self._conn.call(lambda c: c.time())
            rtt = time.perf_counter() - sent
        except TasklockError as exc:
            return StoreCheck("clock", False, str(exc))
        offset = seconds + micros / 1_000_000 - (sent_wall + rtt / 2)
        return clock_check("Redis's", offset, rtt / 2, "expiry runs on Redis's clock")


def _number(value: str | bytes | None) -> int:
    """A number Redis holds (a setting; a field of the epoch record, which anyone may
    write): 0 when unknown (CONFIG refused), absent or not a plain decimal."""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return int(text) if text and text.isascii() and text.isdigit() and len(text) < 20 else 0


def _replica_up(replica: dict[str, Any]) -> bool:
    flags = str(replica.get("flags", ""))
    return not any(flag in flags.split(",") for flag in ("s_down", "o_down", "disconnected"))
