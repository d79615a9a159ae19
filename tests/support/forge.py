"""Writing what no tasklock writes straight into a store: malformed lease rows, ledger
records and waiter places, and fencing counters at their end -- as anyone who can write
to the store could (SQL UPDATE/INSERT, Redis HSET, etcd put).

A corruption is named once (``CORRUPTIONS``) and written in each store's own terms; a
store whose types cannot hold it (PostgreSQL's bigint cannot hold ``'abc'``) gets the
nearest thing it can hold, or None (the case does not exist there). MySQL's DATETIME
cannot hold the year 1e300: it gets the zero date, which a session without strict
``sql_mode`` writes (and a driver cannot read as a time).
"""

from __future__ import annotations

import json
import sqlite3
import time
from typing import Any

_KINDS = ("sqlite", "postgres", "redis", "etcd", "mysql")
#: name -> (field, value) per store kind; field is "holder", "fencing_token" or
#: "acquired_at"; a kind missing from a case cannot hold it.
CORRUPTIONS: dict[str, dict[str, tuple[str, Any]]] = {
    "holder-not-json": {
        "sqlite": ("holder", "{not json"),
        "postgres": ("holder", '"{not json"'),  # jsonb holds only JSON: a string, not an object
        "redis": ("holder", "{not json"),
        "etcd": ("holder", "{not json"),
        "mysql": ("holder", "{not json"),
    },
    "holder-null": {kind: ("holder", "null") for kind in _KINDS},
    "pid-not-a-number": {
        kind: ("holder", '{"host": "h", "pid": "abc", "user": "u"}') for kind in _KINDS
    },
    "token-not-a-number": {
        "sqlite": ("fencing_token", "abc"),
        "redis": ("fencing_token", "abc"),
        "mysql": ("fencing_token", -5),  # (a BIGINT: a token that no acquire issues)
    },
    "acquired-in-year-1e300": {
        "sqlite": ("acquired_at", 1e300),
        "postgres": ("acquired_at", "infinity"),
        "redis": ("acquired_at", "1e300"),
        "etcd": ("acquired_at", 1e300),
        "mysql": ("acquired_at", "0000-00-00 00:00:00"),
    },
}


def kind_of(url: str) -> str:
    """The store kind of ``url``."""
    scheme = url.partition(":")[0]
    kinds = {"postgresql": "postgres", "mariadb": "mysql"}
    return kinds.get(scheme, scheme)


def corrupt_lease(url: str, key: str, case: str) -> bool:
    """Write corruption ``case`` into the live lease of ``key`` (slot 0); False when the
    store cannot hold it."""
    kind = kind_of(url)
    if kind not in CORRUPTIONS[case]:
        return False
    field, value = CORRUPTIONS[case][kind]
    writers = {
        "sqlite": _sqlite_lease,
        "postgres": _pg_lease,
        "redis": _redis_lease,
        "etcd": _etcd_lease,
        "mysql": _mysql_lease,
    }
    writers[kind](url, key, field, value)
    return True


def _sqlite_path(url: str) -> str:
    return url.removeprefix("sqlite://").partition("?")[0]


def _sqlite(url: str, statement: str, params: tuple) -> None:
    conn = sqlite3.connect(_sqlite_path(url))
    try:
        with conn:
            conn.execute(statement, params)
    finally:
        conn.close()


def _sqlite_lease(url: str, key: str, field: str, value: Any) -> None:
    _sqlite(url, f"UPDATE tasklock_leases SET {field} = ? WHERE key = ? AND slot = 0", (value, key))


def _pg(url: str, template: str, params: tuple, suffix: str = "") -> None:
    from psycopg import sql

    from tests.support.pg import _connect

    conn, table = _connect(url)
    try:
        name = sql.Identifier(table + suffix)
        conn.execute(sql.SQL(template).format(table=name), params)
    finally:
        conn.close()


def _pg_lease(url: str, key: str, field: str, value: Any) -> None:
    cast = {"holder": "jsonb", "acquired_at": "timestamptz"}.get(field, "bigint")
    _pg(url, f"UPDATE {{table}} SET {field} = %s::{cast} WHERE key = %s AND slot = 0", (value, key))


def _mysql(url: str, template: str, params: tuple, suffix: str = "") -> None:
    """Run ``template`` with ``{table}`` (plus ``suffix``), in a session without strict
    ``sql_mode`` (so that it can write what tasklock's sessions refuse, as any client)."""
    from tasklock_cli.stores.mysql.connection import parse_url
    from tests.support.mysql_support import admin_connection

    _, table = parse_url(url, url)
    with admin_connection(url) as conn, conn.cursor() as cursor:
        cursor.execute("SET SESSION sql_mode = '', SESSION time_zone = '+00:00'")
        cursor.execute(template.replace("{table}", f"`{table}{suffix}`"), params)


def _mysql_lease(url: str, key: str, field: str, value: Any) -> None:
    _mysql(url, f"UPDATE {{table}} SET {field} = %s WHERE `key` = %s AND slot = 0", (value, key))


def _redis(url: str):
    from tasklock_cli.stores.redis.keys import RedisKeys
    from tests.support.redis_support import _client_for

    client, prefix = _client_for(url)
    return client, RedisKeys(prefix)


def _redis_lease(url: str, key: str, field: str, value: Any) -> None:
    client, names = _redis(url)
    try:
        client.hset(names.lease(key), field, value)
    finally:
        client.close()


def _etcd_post(url: str, path: str, body: dict) -> dict:
    from tasklock_cli.stores.etcd.connection import parse_url
    from tests.support.etcd import post

    host, port = parse_url(url).members[0]
    return post(f"http://{host}:{port}", path, body)


def _etcd_keys(url: str):
    from tasklock_cli.stores.etcd.connection import parse_url
    from tasklock_cli.stores.etcd.keys import EtcdKeys

    return EtcdKeys(parse_url(url).prefix, url)


def _etcd_rewrite(url: str, name: bytes, change) -> None:
    """Put ``change(value)`` as the value of ``name``, keeping its lease."""
    from tasklock_cli.stores.etcd.connection import b64
    from tasklock_cli.stores.etcd.connection import unb64

    [kv] = _etcd_post(url, "/v3/kv/range", {"key": b64(name)})["kvs"]
    value = change(unb64(kv.get("value")))
    body = {"key": b64(name), "value": b64(value), "ignore_lease": True}
    _etcd_post(url, "/v3/kv/put", body)


def _etcd_lease(url: str, key: str, field: str, value: Any) -> None:
    def change(old: bytes) -> bytes:
        record = json.loads(old)
        record[field] = value
        return json.dumps(record).encode()

    _etcd_rewrite(url, _etcd_keys(url).lock_key(key), change)


# -- lease expiries ------------------------------------------------------------------

#: name -> what each store kind gets: an expiry that is not a time, or none at all.
EXPIRY_CORRUPTIONS = ("expiry-not-a-time", "expiry-none")


def keeps_ttl(url: str, case: str) -> bool:
    """Whether ``corrupt_expiry`` leaves the store's own TTL in place (Redis's PX, when only
    ``expires_at`` is made text): the lease then still runs out at its time."""
    return kind_of(url) == "redis" and case == "expiry-not-a-time"


def corrupt_expiry(url: str, key: str, case: str) -> bool:
    """Make the expiry of ``key``'s live lease (slot 0) unreadable: SQLite's boot-clock
    expiry as text or NULL; PostgreSQL's as ``infinity`` or NULL; Redis's ``expires_at``
    as text (its PX kept), or no ``expires_at`` and no PX. False on etcd (a lease's expiry
    is its etcd lease's TTL)."""
    kind = kind_of(url)
    missing = case == "expiry-none"
    if kind == "sqlite":
        value = None if missing else "abc"
        statement = "UPDATE tasklock_leases SET expires_boot = ? WHERE key = ? AND slot = 0"
        _sqlite(url, statement, (value, key))
    elif kind == "postgres":
        value = None if missing else "infinity"
        statement = "UPDATE {table} SET expires_at = %s::timestamptz WHERE key = %s AND slot = 0"
        _pg(url, statement, (value, key))
    elif kind == "redis":
        client, names = _redis(url)
        try:
            if missing:
                client.hdel(names.lease(key), "expires_at")
                client.persist(names.lease(key))
            else:
                client.hset(names.lease(key), "expires_at", "abc")
        finally:
            client.close()
    else:
        return False
    return True


def far_expiry(url: str, key: str) -> bool:
    """Make ``key``'s live lease (slot 0) run out in the year 9999 (SQLite: in 30 years), a
    forged expiry, readable but further ahead than any lease the store granted: False on
    etcd, whose leases are its own TTLs."""
    kind = kind_of(url)
    if kind == "sqlite":  # (30 years ahead: nearer than a clock nobody's boot reaches)
        statement = "UPDATE tasklock_leases SET expires_boot = expires_boot + 1e9, "
        _sqlite(url, statement + "expires_at = expires_at + 1e9 WHERE key = ? AND slot = 0", (key,))
    elif kind == "postgres":
        statement = "UPDATE {table} SET expires_at = '9999-12-31' WHERE key = %s AND slot = 0"
        _pg(url, statement, (key,))
    elif kind == "mysql":
        statement = "UPDATE {table} SET expires_at = '9999-12-31' WHERE `key` = %s AND slot = 0"
        _mysql(url, statement, (key,))
    elif kind == "redis":
        client, names = _redis(url)
        try:
            client.pexpireat(names.lease(key), 253402300000000)
            client.hset(names.lease(key), "expires_at", "253402300000000")
        finally:
            client.close()
    else:
        return False
    return True


# -- the run ledger -------------------------------------------------------------------


def corrupt_runs(url: str, key: str, data: str) -> None:
    """Replace what the ledger keeps of every run of ``key`` with ``data`` (raw text)."""
    kind = kind_of(url)
    if kind == "sqlite":
        _sqlite(url, "UPDATE tasklock_runs SET data = ? WHERE key = ?", (data, key))
    elif kind == "postgres":
        try:
            json.loads(data)
        except ValueError:
            data = json.dumps(data)  # jsonb holds only JSON: a string, not an object
        _pg(url, "UPDATE {table} SET data = %s::jsonb WHERE key = %s", (data, key), "_runs")
    elif kind == "mysql":
        _mysql(url, "UPDATE {table} SET data = %s WHERE `key` = %s", (data, key), "_runs")
    elif kind == "redis":
        client, names = _redis(url)
        try:
            runs = names.name(key, "runs")
            for index, (member, score) in enumerate(client.zrange(runs, 0, -1, withscores=True)):
                client.zrem(runs, member)
                client.zadd(runs, {data + " " * index: score})  # (members are unique)
        finally:
            client.close()
    else:
        from tasklock_cli.stores.etcd.connection import b64
        from tasklock_cli.stores.etcd.connection import prefix_end

        start = _etcd_keys(url).runs_prefix(key)
        body = {"key": b64(start), "range_end": b64(prefix_end(start)), "keys_only": True}
        for kv in _etcd_post(url, "/v3/kv/range", body).get("kvs", []):
            _etcd_post(url, "/v3/kv/put", {"key": kv["key"], "value": b64(data.encode())})


# -- keys that are not UTF-8 ----------------------------------------------------------

#: Where a key is kept, per part: the SQL stores' tables, Redis's names.
_KEY_TABLES = {"lease": "tasklock_leases", "runs": "tasklock_runs", "waiters": "tasklock_waiters"}
_MYSQL_SUFFIXES = {"lease": "", "runs": "_runs", "waiters": "_waiters"}
_REDIS_PARTS = {
    "lease": (b"lease",),
    "runs": (b"runs", b"success"),
    "waiters": (b"waiters", b"queue"),
}


def rename_key(url: str, key: str, raw: bytes, part: str) -> bool:
    """Make ``key``'s ``part`` (``lease``, ``runs`` or ``waiters``) the key ``raw`` (bytes
    that need not be UTF-8), as a writer of the store could; False where the store cannot
    hold such a key (PostgreSQL's text, etcd's JSON gateway here)."""
    kind = kind_of(url)
    if kind == "sqlite":
        sql = f"UPDATE {_KEY_TABLES[part]} SET key = CAST(? AS TEXT) WHERE key = ?"
        _sqlite(url, sql, (raw, key))
    elif kind == "mysql":
        _mysql(
            url, "UPDATE {table} SET `key` = %s WHERE `key` = %s", (raw, key), _MYSQL_SUFFIXES[part]
        )
    elif kind == "redis":
        client, names = _redis(url)
        try:
            for role in _REDIS_PARTS[part]:
                old = names.name(key, role.decode())
                if client.exists(old):
                    client.rename(old, names.prefix_b + b"{" + raw + b"}:" + role)
        finally:
            client.close()
    else:
        return False
    return True


# -- fencing counters -----------------------------------------------------------------


def set_counter(url: str, key: str, token: int) -> bool:
    """Set ``key``'s fencing counter (the key must have been acquired once); False on
    etcd, whose tokens are etcd's own revisions (nobody can set them)."""
    kind = kind_of(url)
    if kind == "sqlite":
        _sqlite(url, "UPDATE tasklock_leases SET fencing_token = ? WHERE key = ?", (token, key))
    elif kind == "postgres":
        _pg(url, "UPDATE {table} SET fencing_token = %s WHERE key = %s", (token, key))
    elif kind == "mysql":
        _mysql(url, "UPDATE {table} SET fencing_token = %s WHERE `key` = %s", (token, key))
    elif kind == "redis":
        client, names = _redis(url)
        try:
            client.set(names.name(key, "fence"), token)
        finally:
            client.close()
    else:
        return False
    return True


# -- waiters --------------------------------------------------------------------------


def forge_waiter(
    url: str, key: str, expires_in: float, holder: str | None = None, on_lease: bool = True
) -> bool:
    """A place in ``key``'s queue that no waiter keeps, running out ``expires_in`` seconds
    from now; ``holder``: its holder as raw text (a good one by default). On etcd the place
    is on an etcd lease of that TTL, named as a waiter's place on it is (or, without
    ``on_lease``, on none: it never runs out)."""
    holder = holder or json.dumps({"host": "forged", "pid": 1, "user": "x", "command": []})
    kind = kind_of(url)
    owner = "f0" * 16
    if kind == "sqlite":
        from tasklock_cli.stores.sqlite.store import boot_clock
        from tasklock_cli.stores.sqlite.store import current_boot_id

        _sqlite(
            url,
            "INSERT INTO tasklock_waiters (key, owner_token, boot_id, expires_boot, since, holder)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (key, owner, current_boot_id(), boot_clock() + expires_in, time.time(), holder),
        )
    elif kind == "postgres":
        _pg(
            url,
            "INSERT INTO {table} (key, owner_token, holder, since, expires_at)"
            " VALUES (%s, %s, %s::jsonb, clock_timestamp(),"
            " clock_timestamp() + make_interval(secs => %s))",
            (key, owner, _pg_json(holder), expires_in),
            "_waiters",
        )
    elif kind == "mysql":
        _mysql(
            url,
            "INSERT INTO {table} (`key`, owner_token, holder, since, expires_at)"
            " VALUES (%s, %s, %s, SYSDATE(6), SYSDATE(6) + INTERVAL %s SECOND)",
            (key, owner, holder, expires_in),
            "_waiters",
        )
        _mysql(url, "UPDATE {table} SET ord = seq WHERE owner_token = %s", (owner,), "_waiters")
    elif kind == "redis":
        client, names = _redis(url)
        now_ms = int(time.time() * 1000)
        place = f"{now_ms + int(expires_in * 1000)} {now_ms} {holder}"
        try:
            wake = names.name(key, "wake")
            base = wake[: -len(b"wake")]
            client.zadd(base + b"queue", {owner: 0})
            client.hset(base + b"waiters", owner, place)
        finally:
            client.close()
    else:
        _etcd_waiter(url, key, expires_in, holder, on_lease)
    return True


def _etcd_waiter(url: str, key: str, expires_in: float, holder: str, on_lease: bool) -> None:
    from tasklock_cli.stores.etcd.connection import b64
    from tasklock_cli.stores.etcd.connection import new_lease_id
    from tasklock_cli.stores.etcd.keys import place_class

    lease = new_lease_id()
    entry = _etcd_keys(url).queue_entry(key, lease, place_class(False, "exclusive", False))
    value = f'{{"holder": {holder}, "since": {int(time.time() * 1000)}}}'.encode()
    body: dict = {"key": b64(entry), "value": b64(value)}
    if on_lease:
        grant = {"ID": str(lease), "TTL": str(max(1, round(expires_in)))}
        _etcd_post(url, "/v3/lease/grant", grant)
        body["lease"] = str(lease)
    _etcd_post(url, "/v3/kv/put", body)


def _pg_json(text: str) -> str:
    try:
        json.loads(text)
    except ValueError:
        return json.dumps(text)
    return text


def etcd_queue_names(url: str) -> list[bytes]:
    """Every place in every queue of the etcd store at ``url``."""
    from tasklock_cli.stores.etcd.connection import b64
    from tasklock_cli.stores.etcd.connection import prefix_end
    from tasklock_cli.stores.etcd.connection import unb64

    everything = _etcd_keys(url).queue_prefix("")[: -len(b"0:/")]
    body = {"key": b64(everything), "range_end": b64(prefix_end(everything)), "keys_only": True}
    return [unb64(kv["key"]) for kv in _etcd_post(url, "/v3/kv/range", body).get("kvs", [])]
