"""The `tasklock` the bench times: a regular (non-editable) install of this checkout in a
private venv, built once per bench run.

A development venv's editable install adds a finder that site imports at every start
(pathlib, importlib.util, re…: about 11 ms before any of tasklock runs), which a user's
``pip install .`` does not have; timed there, every start-up row and its Python floor would
carry it. The venv is made with the interpreter running the bench (so the floors are the same
interpreter's) and removed when the bench ends. ``--dev-install`` (or
``TASKLOCK_BENCH_DEV_INSTALL=1``) times the running venv's own `tasklock` instead.

This module is imported before the harness, which reads ``PYTHON`` and ``TASKLOCK`` from the
environment variable set here.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The bin directory of the private venv, for the harness (and forked workers).
VENV_BIN = "TASKLOCK_BENCH_VENV_BIN"
DEV_INSTALL = "TASKLOCK_BENCH_DEV_INSTALL"


def prepare(argv: list[str]) -> None:
    """Build the private install unless asked not to (or already built by a parent)."""
    if "--dev-install" in argv:
        os.environ[DEV_INSTALL] = "1"
    if os.environ.get(DEV_INSTALL) == "1" or os.environ.get(VENV_BIN):
        return
    if any(arg in ("-h", "--help") for arg in argv):
        return
    os.environ[VENV_BIN] = str(build_private_install())


def upgrade_pip(pip: list[str], cwd: str | None = None) -> None:
    """The venv's pip as users have it today. tasklock's own script (bin/tasklock) does not
    depend on it, but a baseline from before it is a console-scripts entry point, whose
    script from pip before 25.0 imports ``re`` (and ``enum``) at every start: its rows
    would time pip's script. Left as it is when no newer pip is found."""
    subprocess.run([*pip, "--disable-pip-version-check", "--upgrade", "pip"], check=False, cwd=cwd)


def build_private_install() -> Path:
    venv = Path(tempfile.mkdtemp(prefix="tasklock-bench-venv-"))
    atexit.register(shutil.rmtree, venv, ignore_errors=True)
    print(f"building a regular install of {ROOT} in {venv} …", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    upgrade_pip(pip)
    subprocess.run([*pip, "--disable-pip-version-check", str(ROOT)], check=True)
    return venv / "bin"


def interpreter_and_tasklock() -> tuple[str, str]:
    """The Python the floors use and the `tasklock` the rows time."""
    bin_dir = os.environ.get(VENV_BIN)
    if bin_dir:
        return str(Path(bin_dir) / "python"), str(Path(bin_dir) / "tasklock")
    return sys.executable, str(Path(sys.executable).parent / "tasklock")


def described() -> str:
    """For the results' header: which install was timed."""
    if os.environ.get(VENV_BIN):
        return "a regular install of this checkout (`pip install .`) in a venv built by this run"
    return "the running venv's own install (--dev-install: an editable install's finder included)"
