#!/usr/bin/env python3
"""Kept for old command lines: ``python bench/run.py ...`` is ``python -m bench ...``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cli import main

sys.exit(main())
