"""Which modules a store's client loads: a fresh interpreter opens the store, makes one
call, and says which of the modules asked about it has loaded (issue 45: what a plain run
never uses stays unimported)."""

from __future__ import annotations

import os
import subprocess
import sys

#: Opens the store at argv[1], peeks once, prints those of argv[2:] that are loaded.
_ONE_CALL = """
import sys
from tasklock_cli.stores import open_store
with open_store(sys.argv[1]) as store:
    store.peek("k")
print(" ".join(name for name in sys.argv[2:] if name in sys.modules))
"""


def loaded_after_a_call(url: str, names: list[str], prelude: str = "") -> list[str]:
    """Those of ``names`` that a process running ``prelude`` and then one call on the store
    at ``url`` has loaded, in the order asked."""
    return python_output(prelude + _ONE_CALL, url, *names).split()


def python_output(code: str, *args: str) -> str:
    """What ``python -c CODE ARGS...`` prints, in a fresh interpreter whose environment has
    no PYTHON* or TASKLOCK_* variable of the test run's; it must succeed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "TASKLOCK_"))}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
