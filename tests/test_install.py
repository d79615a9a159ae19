"""What `pip install` of this repository puts in place: the man page under the environment's
share/man/man1, where `man` finds it (from PREFIX/bin on PATH) and pipx >= 1.5 links it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What building the wheel reads: a copy, so the build leaves nothing in the checkout.
SOURCES = ["pyproject.toml", "README.md", "man", "tasklock_cli"]


def test_pip_install_puts_the_man_page_under_share_man_man1(tmp_path):
    source = tmp_path / "source"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            caches = shutil.ignore_patterns("__pycache__")
            shutil.copytree(ROOT / name, source / name, ignore=caches)
        else:
            shutil.copy2(ROOT / name, source / name)
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
