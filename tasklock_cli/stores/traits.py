"""What a store declares about itself, as class attributes of its class: the loops of
``Store`` and the run engine read them. Each store package declares the ones that describe
it in one ``Capabilities`` record (``CAPABILITIES`` in its ``__init__``), which its store
class takes (``class XStore(Store, capabilities=CAPABILITIES)``), ``doctor --json`` shows
and the tests read. Kept apart from ``Store``'s methods, the interface itself."""

from __future__ import annotations

from tasklock_cli.stores.model import WAITER_TTL_S
from tasklock_cli.util.records import dataclass


@dataclass(frozen=True)
class Capabilities:
    """What a store can do and how its leases behave: eight of ``StoreTraits`` (see each
    there), declared by every store package as ``CAPABILITIES``, with no default, so that a
    new store says each. Left out: ``break_poll_s``, ``release_poll_s`` and
    ``release_look_s``, how often the base class's polling defaults and a signalled waiter
    look (tuning of a loop, not a property of the store), and ``display_url``.
    ``failover_window`` is the store's with its default URL: a store may set its own per
    URL (Redis's ``wait_replicas``); ``of(store)`` reads the store's."""

    signals_release: bool
    concurrent_release: bool
    waits_keep_places: bool
    byte_keys: bool
    min_ttl: float
    expiry_lag: float
    waiter_ttl: float
    failover_window: float | None

    @classmethod
    def of(cls, store: object) -> Capabilities:
        """The capabilities of a store (or store class) as it is: its own attributes."""
        return cls(**{name: getattr(store, name) for name in cls.__match_args__})

    def as_json(self) -> dict[str, object]:
        """The record as ``doctor --json`` shows it (seconds as numbers, None as null)."""
        return {name: getattr(self, name) for name in self.__match_args__}


class StoreTraits:
    """A store's declared traits, with the defaults of a store that only polls."""

    def __init_subclass__(cls, capabilities: Capabilities | None = None, **kwargs: object):
        """``class XStore(Store, capabilities=CAPABILITIES)``: the package's record becomes
        the class's traits, so that the record is their one source."""
        super().__init_subclass__(**kwargs)
        if capabilities is not None:
            for name, value in capabilities.as_json().items():
                setattr(cls, name, value)

    #: Shown by ``doctor`` and in errors, password redacted.
    display_url: str = ""
    #: True where ``wait_for_release`` wakes on a release (so waiters can poll rarely).
    signals_release: bool = False
    #: Where ``signals_release``: how often a waiter also looks again by itself, woken or
    #: not (MySQL's waits sleep on the server that long at most, the look where a wake-up
    #: cannot be sent); None where only a release or a lease's expiry ends a wait.
    release_look_s: float | None = None
    #: True where ``release`` may run while the holder's heartbeat thread is still in
    #: ``wait_for_break`` or a renewal. Such a store serialises its calls, and releasing
    #: closes nothing that waiting uses. The wrapper then releases without waiting for that
    #: thread to end first.
    concurrent_release: bool = False
    #: True where a waiter's place is kept alive by its wait itself, not by its acquires,
    #: and a release cannot go unheard (etcd: a watch from a revision): a plain waiter
    #: then looks again only every ``run.waiter.QUIET_LOOK_CEILING_S``.
    waits_keep_places: bool = False
    #: The shortest lease the store can keep: a shorter TTL is kept this long on the store.
    #: The holder's own deadline still counts the TTL asked, so this is safe, only slower to
    #: free the key after a crash. 0 where expiry has millisecond resolution.
    min_ttl: float = 0.0
    #: How late after its expiry the store may still show a lease and refuse the key.
    expiry_lag: float = 0.0
    #: True where a key may be bytes that are not UTF-8 (a writer of the store made it:
    #: SQLite's text, MySQL's VARBINARY, Redis's names), which ``peek``, ``history`` and
    #: ``release --force`` then reach as such bytes (``util.keys.stored_key``). Elsewhere
    #: no such key can exist (PostgreSQL's text, etcd's keys as tasklock writes them).
    byte_keys: bool = False
    #: How long a waiter's place in a queue lives without a renewal (see ``acquire``);
    #: a store may round it up to its own minimum.
    waiter_ttl: float = WAITER_TTL_S
    #: How often ``wait_for_break``'s polling default looks at a held lease (stores that
    #: hear of a break on a line of their own override ``wait_for_break``). Each look is a
    #: round trip: 4 a second per holder on a network store; an in-process store sets less.
    break_poll_s: float = 0.25
    #: How often ``_await_wakeup``'s polling default looks at a full key (stores that hear
    #: of a release override ``_await_wakeup``): a release is seen this late at most.
    release_poll_s: float = 0.25
    #: The longest a holder may believe in its lease after sending its last renewal (or
    #: acquire), whatever its TTL: where a failover can lose a lease the new primary never
    #: received, the shortest quarantine that protects it (``failover.DEFAULT_TTL_S``), so
    #: that a holder cut off from the store ends its tree before a new lease is granted, and
    #: one that reaches it renews often enough to learn of the loss in time. None where a
    #: lease the store confirmed survives any failover (one file; Raft; replicas that
    #: confirm every write). The lease's TTL on the store stays the one asked.
    failover_window: float | None = None
