"""The store contract's cases, one module per part: ``basics`` (acquire, renew, release,
the ledger, listing), ``breaks`` (breaking and forcing), ``modes`` (shared and exclusive),
``queue`` (first come, first served), ``slots`` (semaphores) and ``waiting`` (waiting for a
release). Each case is a pytest test taking the ``store`` and ``store_factory`` fixtures:
tasklock's suite collects them on every store (``tests/test_store_contract*.py``), and
``tasklock_cli.testing.store_contract`` on a user's."""
