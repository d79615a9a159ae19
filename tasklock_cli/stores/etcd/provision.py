"""How the tests and the bench get an etcd store: a key prefix of their own on a private
member the tests start (``tests/support/etcd.py``) unless ``TASKLOCK_TEST_ETCD_URL`` names
one, its keys deleted after (see ``stores.provisioning``). A ``peek`` takes two round
trips, a new connection no set-up, and tokens are etcd's global revisions."""

from __future__ import annotations

from tasklock_cli.stores.provisioning import Provisioning
from tasklock_cli.stores.provisioning import RoundTrips
from tasklock_cli.stores.provisioning import Server
from tasklock_cli.stores.provisioning import parameter


def drop_namespace(url: str) -> None:
    """Delete every key under the URL's ``prefix=``, on its first member."""
    import json
    import urllib.request

    from tasklock_cli.stores.etcd.connection import b64
    from tasklock_cli.stores.etcd.connection import parse_url
    from tasklock_cli.stores.etcd.connection import prefix_end

    config = parse_url(url)
    if not config.prefix:
        raise ValueError("refusing to drop an empty prefix (that is the whole keyspace)")
    host, port = config.members[0]
    start = config.prefix.encode()
    body = json.dumps({"key": b64(start), "range_end": b64(prefix_end(start))}).encode()
    request = urllib.request.Request(
        f"http://{host}:{port}/v3/kv/deleterange", data=body, method="POST"
    )
    with urllib.request.urlopen(request, timeout=3) as reply:
        reply.read()


#: The tests' helper that starts the shared private member (``services`` imports it).
PRIVATE = "tests.support.etcd"

PROVISIONING = Provisioning(
    server=Server("etcd member", "TASKLOCK_TEST_ETCD_URL", private=PRIVATE, binary="etcd"),
    namespace_url=parameter("prefix", "/"),
    cleanup=drop_namespace,
    round_trips=RoundTrips(peek=2, set_up=0, consecutive_tokens=False),
)
