"""The stores under test, from the registry: URLs of private namespaces (each store
package's provisioning), the bench's own server where a store's tests start a private one,
and cleaning up. The drivers' raw baselines beside them are in ``bench.baselines``."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path

from bench import baselines
from bench.etcd_member import EtcdMember
from bench.harness import RUN_ID
from tasklock_cli.stores import open_store
from tasklock_cli.stores.provisioning import Provisioning
from tasklock_cli.stores.registry import STORE_PACKAGES
from tasklock_cli.stores.registry import provisioning

#: The stores the bench runs, in the registry's order.
ALL_STORES = STORE_PACKAGES


@dataclass
class StoreKind:
    """One store of the registry: the URL of a private namespace on it (its package's
    provisioning), the bench's own server for a store whose tests start one, cleaning up."""

    name: str
    workdir: Path
    reason: str | None = None
    #: The bench's own server, for a store whose provisioning names a private one.
    server: EtcdMember | None = None
    #: Every namespace URL handed out: dropped when the run ends.
    handed_out: list[str] = field(default_factory=list)

    @property
    def provision(self) -> Provisioning:
        if self.name not in STORE_PACKAGES:
            raise ValueError(f"{self.name} is not a store package ({', '.join(STORE_PACKAGES)})")
        return provisioning(self.name)

    def url(self, namespace: str) -> str:
        """A namespace of its own on the store: in the run's own directory for a store
        without a server, else ``tlbench_<run id>_<namespace>`` on the bench's server."""
        provision = self.provision
        if provision.server is None:
            url = provision.namespace_url(str(self.workdir), namespace)
        else:
            url = provision.namespace_url(self.base_url(), f"tlbench_{RUN_ID}_{namespace}")
        if url not in self.handed_out:
            self.handed_out.append(url)
        return url

    def base_url(self) -> str:
        """The server's URL: the bench's own member, or the tests' server (its ``url_env``,
        else its default)."""
        if self.provision.private_server is not None:
            return self.member().url("").partition("?")[0]
        return self.provision.base_url()

    def member(self) -> EtcdMember:
        if self.server is None:
            raise RuntimeError(f"no private server for {self.name}")
        return self.server

    def raw_ping(self, namespace: str) -> tuple[Callable[[], object], Callable[[], None]]:
        """The driver's own cheapest round trip against the same server/file, and a closer."""
        return baselines.raw_ping(self, namespace)

    def raw_write(
        self, namespace: str, options: str = ""
    ) -> tuple[Callable[[], object], Callable[[], None], str] | None:
        """The cheapest durable write beside the store (``baselines.raw_write``)."""
        return baselines.raw_write(self, namespace, options)

    def cleanup(self) -> None:
        """Drop every namespace handed out; stop the bench's own server."""
        for url in self.handed_out:
            with contextlib.suppress(Exception):
                self.provision.cleanup(url)
        if self.server is not None:
            self.server.stop()


def floor_imports(kind: StoreKind) -> str:
    """The modules a `tasklock run` on this store needs, as one import statement: the store
    module of its registry package (``tasklock_cli.stores.registry.STORE_PACKAGES``), the
    run machinery and the fast parser (``cli.entry`` itself imports nothing at its top)."""
    if kind.name not in STORE_PACKAGES:
        raise ValueError(f"{kind.name} is not a store package ({', '.join(STORE_PACKAGES)})")
    store = f"tasklock_cli.stores.{kind.name}.store"  # (its package is lazy)
    return f"import tasklock_cli.cli.fastrun, tasklock_cli.run.supervisor, {store}"


def probe_store(kind: StoreKind) -> str | None:
    """None when the store can be benchmarked here, else why not."""
    try:
        ping, close = kind.raw_ping("probe")
        ping()
        close()
        with open_store(kind.url("probe")) as store:
            store.peek("probe")
    except Exception as exc:
        return f"{kind.name} not usable ({type(exc).__name__}: {exc})"
    return None


def start_private_server(kind: StoreKind) -> str | None:
    """Start the bench's own server for ``kind`` (a store whose provisioning names a
    private one; ``EtcdMember`` is the one kind the bench starts); None, or why there is none."""
    server = kind.provision.server
    assert server is not None and server.binary is not None, kind.name
    program = server.binary
    binary = shutil.which(program)
    if binary is None:
        return f"no {program} binary on PATH"
    member = EtcdMember(binary)
    try:
        member.start()
    except (OSError, RuntimeError) as exc:
        member.stop()
        return f"the private {server.what} did not start ({exc})"
    kind.server = member
    return None


def make_stores(names: Sequence[str], workdir: Path) -> list[StoreKind]:
    kinds = [StoreKind(name, workdir) for name in names]
    for kind in kinds:
        kind.reason = start_private_server(kind) if kind.provision.private_server else None
        kind.reason = kind.reason or probe_store(kind)
    return kinds


def drop_namespace(kind: StoreKind, namespace: str) -> None:
    """Remove one namespace's leases now (the run-wide cleanup would get them only at exit)."""
    kind.provision.cleanup(kind.url(namespace))
