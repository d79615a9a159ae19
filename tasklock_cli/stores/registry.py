"""The store registry: the one list of store packages, and what each package declares.

Every store is a package ``tasklock_cli/stores/<name>/`` whose ``__init__`` declares, without
importing its driver:

- ``TITLE``: the store as users name it (``postgresql``), in errors and help.
- ``SCHEMES``: the URL schemes it opens (the first is the one help shows).
- ``URL_FORM``: the URL's shape, for help (``redis://...``).
- ``DRIVER``: the third-party package its store module imports (``Driver``), or None.
- ``__all__``: the store class's name alone; the class itself is imported on first use
  (``util.lazy.import_on_first_use``), so that reading these names costs no driver.
- ``CAPABILITIES``: what the store can do (``traits.Capabilities``), which its store class
  takes as its traits, ``doctor --json`` shows and the tests read.
- optionally ``url_problem(url)``: what makes the URL unreadable (default: what
  ``urllib.parse.urlsplit`` refuses), for stores that read their URLs in their own way.

and its module ``provision`` declares ``PROVISIONING`` (``provisioning.Provisioning``): how
the tests and the bench get the store (``provisioning(name)``; never on ``run``'s path).
``package_problems(name)`` says what a package lacks (``tests/test_layout.py`` asks).

``open_store`` (in ``tasklock_cli.stores``), the command line's help, the tests' store
kinds, the bench and the layout test all read ``STORE_PACKAGES``: adding a store is adding
its name here.

``IN_PROCESS_PACKAGES`` are stores that live in one process (``memory://``, for tests of
programs that use the Python API): their package declares ``IN_PROCESS = True``, the CLI
refuses them (78) and the API opens them only when asked to (``allow_memory``).
"""

from __future__ import annotations

from tasklock_cli.util.lazy import import_module
from tasklock_cli.util.records import dataclass

#: typing costs ~2 ms per start: its names are for the type checker only.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType

    from tasklock_cli.stores.provisioning import Provisioning

#: The store packages, in the order users meet them (the default store first).
STORE_PACKAGES = ("sqlite", "postgres", "redis", "etcd", "mysql")
#: Stores in this process only, after the others: never the CLI's.
IN_PROCESS_PACKAGES = ("memory",)


@dataclass(frozen=True)
class Driver:
    """The third-party package a store module imports, and how to install it."""

    package: str  # the top-level import name
    install: str  # the pip requirement


def store_package(name: str) -> ModuleType:
    """The package of the store ``name`` (one of ``STORE_PACKAGES``): its declarations."""
    return import_module(f"tasklock_cli.stores.{name}")


def package_for_scheme(scheme: str) -> ModuleType | None:
    """The package of the store that opens URLs of ``scheme``; None for an unknown one.
    Looks in registry order, so the default store's URL reads only its own package."""
    for name in (*STORE_PACKAGES, *IN_PROCESS_PACKAGES):
        package = store_package(name)
        if scheme in package.SCHEMES:
            return package
    return None


def known_schemes() -> list[str]:
    return [scheme for name in STORE_PACKAGES for scheme in store_package(name).SCHEMES]


def url_forms() -> list[str]:
    """Each store's URL shape, for help."""
    return [store_package(name).URL_FORM for name in STORE_PACKAGES]


def all_packages() -> tuple[str, ...]:
    """Every store package: the CLI's, then the in-process ones."""
    return (*STORE_PACKAGES, *IN_PROCESS_PACKAGES)


def _known(name: str) -> str:
    if name not in all_packages():
        raise LookupError(
            f"no store package {name!r} (the registry has {', '.join(all_packages())})"
        )
    return name


def provisioning(name: str) -> Provisioning:
    """How tests and the bench get the store ``name`` (its ``provision.PROVISIONING``); a
    LookupError naming what is missing for a name or a module the registry does not know."""
    try:
        module = import_module(f"tasklock_cli.stores.{_known(name)}.provision")
    except ModuleNotFoundError as exc:
        raise LookupError(f"store package {name!r} has no provision module ({exc})") from exc
    found = getattr(module, "PROVISIONING", None)
    if found is None:
        raise LookupError(f"tasklock_cli.stores.{name}.provision declares no PROVISIONING")
    return found


def package_problems(name: str) -> list[str]:
    """What the store package ``name`` lacks of what every store declares, each a sentence
    naming it: empty for a complete package."""
    from tasklock_cli.stores.provisioning import Provisioning
    from tasklock_cli.stores.traits import Capabilities

    package = store_package(_known(name))
    problems = [
        f"tasklock_cli.stores.{name} declares no {attribute}"
        for attribute in ("TITLE", "SCHEMES", "URL_FORM", "DRIVER", "CAPABILITIES")
        if not hasattr(package, attribute)
    ]
    capabilities = getattr(package, "CAPABILITIES", None)
    if capabilities is not None and not isinstance(capabilities, Capabilities):
        problems.append(f"tasklock_cli.stores.{name}.CAPABILITIES is not a Capabilities record")
    try:
        if not isinstance(provisioning(name), Provisioning):
            problems.append(
                f"tasklock_cli.stores.{name}.provision.PROVISIONING is not a Provisioning"
            )
    except LookupError as exc:
        problems.append(str(exc))
    return problems
