"""The builds of tasklock the bench times, and the proof that each row imports its own.

A build is a regular install (``pip install``) in a venv of its own: this checkout's
(bench/install.py) and, for the baseline rows, the tree of an older commit (``git archive``).
Every row runs its build's ``tasklock`` command (its script in the venv), whose
``sys.path`` starts with the venv's bin directory, from an empty directory outside any
checkout, with no ``PYTHONPATH``.

Why: the baselines once ran as ``python -m tasklock_cli`` with the old package first on
``PYTHONPATH`` and the checkout as the working directory; ``-m`` puts the working directory
before ``PYTHONPATH``, so those rows ran today's code. Before a row is timed, ``prove`` runs
the very same argv, environment and working directory with ``PYTHONVERBOSE=1`` (the
interpreter then names every file it imports) and refuses the row unless every
``tasklock_cli`` it imported is the build's own.
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.install import VENV_BIN
from bench.install import interpreter_and_tasklock
from bench.install import upgrade_pip

ROOT = Path(__file__).resolve().parent.parent
#: The last commit before the guard process (tasklock_cli/proc/guard.py): issue 25's baseline.
BEFORE_GUARD = "b40fa3f"
#: What a baseline is, for its rows' labels.
KNOWN_BASELINES = {BEFORE_GUARD: "before the guard"}
#: How an imported package shows in a verbose interpreter's stderr: "# code object from
#: '/x/tasklock_cli/__init__.py'" or "# /cache/…/__init__.cpython-311.pyc matches
#: /x/tasklock_cli/__init__.py".
PACKAGE_INIT = re.compile(r"(/[^\s']*/tasklock_cli)/__init__\.py(?![\w.])")


class WrongBuild(RuntimeError):
    """A row would run another build's code than the one it names."""


@dataclass(frozen=True)
class Build:
    """One installed tasklock: its label, its venv's bin directory, and the directory every
    ``tasklock_cli`` its rows import must be under."""

    name: str
    bin_dir: Path
    home: Path

    @property
    def tasklock(self) -> str:
        return str(self.bin_dir / "tasklock")

    @property
    def title(self) -> str:
        what = KNOWN_BASELINES.get(self.name)
        return f"{self.name} ({what})" if what else self.name


@functools.cache
def neutral_cwd() -> str:
    """An empty private directory, outside any checkout: the working directory of every
    process the bench starts, so that nothing is imported from where the bench was run."""
    path = tempfile.mkdtemp(prefix="tasklock-bench-cwd-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def current_build() -> Build:
    """This checkout as the bench times it: the private regular install (its venv), or with
    --dev-install the running venv's editable install (the checkout's own package)."""
    _, tasklock = interpreter_and_tasklock()
    bin_dir = Path(tasklock).parent
    if os.environ.get(VENV_BIN):
        return Build("now", bin_dir, bin_dir.parent.resolve())
    return Build("now", bin_dir, (ROOT / "tasklock_cli").resolve())


def install_baseline(rev: str, workdir: Path) -> Build:
    """A regular install of commit ``rev`` (its whole tree from `git archive`) in a venv of
    its own under ``workdir``, made with the interpreter running the bench."""
    home = workdir / f"build-{rev}"
    source, venv = home / "src", home / "venv"
    source.mkdir(parents=True)
    archive = home / "src.tar"
    with archive.open("wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(source, filter="data")
    print(f"building a regular install of {rev} in {venv} …", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, cwd=neutral_cwd())
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    upgrade_pip(pip, neutral_cwd())
    subprocess.run(
        [*pip, "--disable-pip-version-check", str(source)], check=True, cwd=neutral_cwd()
    )
    return Build(rev, venv / "bin", venv.resolve())


def imported_packages(argv: list[str], env: dict[str, str], cwd: str | None = None) -> set[Path]:
    """Every ``tasklock_cli`` package directory that ``argv`` imports when run with ``env``
    in ``cwd`` (the neutral directory by default), read from ``PYTHONVERBOSE=1`` output."""
    done = subprocess.run(
        argv,
        env={**env, "PYTHONVERBOSE": "1"},
        cwd=cwd or neutral_cwd(),
        capture_output=True,
        text=True,
        timeout=120,
        start_new_session=True,
    )
    return {Path(found).resolve() for found in PACKAGE_INIT.findall(done.stderr)}


def prove(
    label: str, argv: list[str], env: dict[str, str], build: Build, cwd: str | None = None
) -> str:
    """One line naming the package ``argv`` imports, once it is shown to be ``build``'s;
    raises WrongBuild otherwise (another package, several, or none)."""
    found = imported_packages(argv, env, cwd)
    if len(found) == 1:
        (package,) = found
        if package.is_relative_to(build.home):
            return f"`{label}` imports {package}"
    shown = ", ".join(sorted(map(str, found))) or "no tasklock_cli"
    raise WrongBuild(f"refused to time `{label}`: it imports {shown}, not build {build.name}'s "
                     f"(under {build.home})")  # fmt: skip
