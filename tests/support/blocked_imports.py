"""Run the real executable with some packages unimportable, as if they were not installed.

A ``sitecustomize.py`` on ``PYTHONPATH`` puts a finder first on ``sys.meta_path`` that raises
ModuleNotFoundError for the blocked packages (and their submodules), exactly as a missing
package does, and appends each refused name to a log file: a run that never tries to import
a blocked package leaves the log empty.
"""

from __future__ import annotations

import os
from pathlib import Path

SITECUSTOMIZE = """\
import os
import sys

_BLOCKED = set(os.environ["TASKLOCK_TEST_BLOCKED_IMPORTS"].split(","))
_LOG = os.environ["TASKLOCK_TEST_BLOCKED_LOG"]


class _Refuse:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.partition(".")[0] in _BLOCKED:
            with open(_LOG, "a") as log:
                log.write(name + "\\n")
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
"""


def env_without(packages: list[str], env: dict[str, str], directory: Path) -> dict[str, str]:
    """``env`` for a process in which ``packages`` cannot be imported; see ``attempts``."""
    site = directory / "blocked-imports"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = site / "attempts.log"
    log.write_text("")
    path = [str(site), *filter(None, [env.get("PYTHONPATH")])]
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(path),
        "TASKLOCK_TEST_BLOCKED_IMPORTS": ",".join(packages),
        "TASKLOCK_TEST_BLOCKED_LOG": str(log),
    }


def attempts(env: dict[str, str]) -> list[str]:
    """The blocked module names the processes run with ``env`` tried to import."""
    return Path(env["TASKLOCK_TEST_BLOCKED_LOG"]).read_text().splitlines()
