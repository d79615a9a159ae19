"""tasklock benchmark suite: one command, every section, side by side in one run.

    python -m bench [--quick] [--stores sqlite,redis,postgres,etcd] [--markdown bench/RESULTS.md]

A harness (``harness``: timing, interleaving, tables, processes; ``stores``: the stores and a
private etcd member) and one module per section. Only the public CLI (``tasklock``
subprocesses) and the public store API (``open_store`` and ``Store``'s methods) are used.
"""
