"""What `pip install` of this repository puts in place: the man page under the environment's
share/man/man1, where `man` finds it (from PREFIX/bin on PATH) and pipx >= 1.5 links it; an
editable install (`pip install -e`) too, so the README's two install lines keep it in either
order. And the `tasklock` command: our own script (bin/tasklock), not the one an installer
writes for an entry point (pip before 25.0 writes `import re` into it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: What building the wheel reads: a copy, so the build leaves nothing in the checkout.
SOURCES = [
    "pyproject.toml", "MANIFEST.in", "setup_commands.py", "README.md", "man", "bin", "tasklock_cli"
]  # fmt: skip


def _copy_sources(source: Path) -> Path:
    """A copy of what the build reads, so that no build writes into the checkout."""
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            caches = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=caches)
        else:
            shutil.copy2(ROOT / name, source / name)
    return source


@pytest.mark.slow  # a wheel build, ~10 s: not in the edit-test loop (-m quick)
def test_pip_install_puts_the_man_page_under_share_man_man1(tmp_path):
    source = _copy_sources(tmp_path / "source")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "-w", str(tmp_path / "wheel"), str(source)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "wheel").glob("tasklock-*.whl")
    prefix = tmp_path / "prefix"
    # --ignore-installed: without it pip would first uninstall the tasklock under test
    installed = subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--ignore-installed",
         "--prefix", str(prefix), str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    man_page = prefix / "share" / "man" / "man1" / "tasklock.1"
    assert man_page.read_bytes() == (ROOT / "man" / "tasklock.1").read_bytes()
    assert_our_command(prefix / "bin" / "tasklock")


def assert_our_command(installed: Path) -> None:
    """``installed`` is bin/tasklock, its first line (the interpreter) set by the installer."""
    assert installed.stat().st_mode & 0o111, "not executable"
    first, _, rest = installed.read_text().partition("\n")
    assert first.startswith("#!") and "python" in first
    assert rest == (ROOT / "bin" / "tasklock").read_text().partition("\n")[2]


def _pip_into(venv: Path, *args: str) -> None:
    """pip (this one, ``--python``) installs into the venv: no copy of pip in it to wait for."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q",
         "--python", str(venv / "bin" / "python"), "install", "--no-deps", *args],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_the_readmes_two_install_lines_keep_the_man_page_in_either_order(tmp_path):
    """``pip install .`` and ``pip install -e .`` each uninstall the other first: the man page
    stays only if both install it (setuptools' editable wheels leave data files out)."""
    source = _copy_sources(tmp_path / "source")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    man_page = venv / "share" / "man" / "man1" / "tasklock.1"
    for how in (["."], ["-e", "."], ["."]):  # regular, editable over it, regular over that
        _pip_into(venv, *how[:-1], str(source))
        assert man_page.read_bytes() == (ROOT / "man" / "tasklock.1").read_bytes(), how
        assert_our_command(venv / "bin" / "tasklock")
    version = subprocess.run(
        [str(venv / "bin" / "tasklock"), "--version"], capture_output=True, text=True, timeout=30
    )
    assert version.stdout.startswith("tasklock "), version.stderr
