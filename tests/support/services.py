"""Where each store's test server is, whether it is up, and how to clean up after a test: all
read from the store packages' provisioning (``tasklock_cli/stores/<name>/provision.py``,
``registry.provisioning``). A store whose tests start a private server of their own (its
``server.private``) asks that helper module, which also reads the server's ``url_env``.

On a machine without a server the store's tests skip with the reason; in CI (``CI=true``)
a missing service is a failure, never a skip.
"""

from __future__ import annotations

import functools
import os
import uuid
from importlib import import_module
from urllib.parse import urlsplit

import pytest

from tasklock_cli.stores.provisioning import Provisioning
from tasklock_cli.stores.registry import package_for_scheme
from tasklock_cli.stores.registry import provisioning
from tasklock_cli.stores.registry import store_package
from tasklock_cli.stores.traits import Capabilities


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def base_url(kind: str) -> str:
    """The URL of the server ``kind``'s tests use (its namespaces are parameters of it)."""
    provision = provisioning(kind)
    if provision.private_server:
        return import_module(provision.private_server).base_url()
    return provision.base_url()


def fresh_url(kind: str, tmp_path, name: str | None = None) -> str:
    """A URL naming a fresh, empty namespace of ``kind``: ``name``, or a unique one. A store
    without a server keeps its files in ``tmp_path``."""
    name = name or f"tasklock_test_{uuid.uuid4().hex[:12]}"
    provision = provisioning(kind)
    place = str(tmp_path) if provision.server is None else base_url(kind)
    return provision.namespace_url(place, name)


def needs_server(kind: str) -> bool:
    """Whether ``kind``'s tests need a server (so that they are not ``quick``)."""
    return provisioning(kind).server is not None


def kind_of(url: str) -> str:
    """The registry name of the store that opens ``url``."""
    package = package_for_scheme(urlsplit(url).scheme)
    if package is None:
        raise LookupError(f"no store opens {url!r}")
    return package.__name__.rpartition(".")[2]


def capabilities_for(url: str) -> Capabilities:
    """What the store of ``url`` declares it can do (its package's ``CAPABILITIES``)."""
    return store_package(kind_of(url)).CAPABILITIES


def provisioning_for(url: str) -> Provisioning:
    """How the tests get the store of ``url`` (its package's ``PROVISIONING``)."""
    return provisioning(kind_of(url))


@functools.cache
def unavailable_reason(kind: str) -> str | None:
    """None when the store kind can be tested here, else why not."""
    provision = provisioning(kind)
    if provision.server is None:  # in this process or a file: always here
        return None
    if provision.private_server:
        return import_module(provision.private_server).unavailable_reason()
    return _server_unavailable(kind, provision)


def _server_unavailable(kind: str, provision: Provisioning) -> str | None:
    """Why the server beside the tests cannot be used: its driver, the server, the store."""
    driver = store_package(kind).DRIVER
    if driver is not None:
        try:
            __import__(driver.package)
        except ImportError:
            return f"{driver.package} is not installed (pip install '.[test]')"
    problem = provision.unreachable(base_url(kind))
    if problem is not None:
        return problem
    try:
        __import__(f"tasklock_cli.stores.{kind}")
    except ImportError as exc:
        return f"tasklock's {kind} store is not available ({exc})"
    return None


def require(kind: str) -> None:
    reason = unavailable_reason(kind)
    if reason is None:
        return
    if in_ci():
        pytest.fail(f"CI=true but the {kind} store cannot be tested: {reason}")
    pytest.skip(reason)


def cleanup(kind: str, url: str) -> None:
    """Drop what a test's namespace left behind on a shared server."""
    provisioning(kind).cleanup(url)
