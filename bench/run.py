#!/usr/bin/env python3
"""Kept for old command lines: ``python bench/run.py ...`` is ``python -m bench ...``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.install import prepare

prepare(sys.argv[1:])  # before the harness reads which `tasklock` to time

from bench.cli import main  # noqa: E402

sys.exit(main())
