"""Many wrappers racing on one key with --wait: never two children at once, tokens in order."""

from __future__ import annotations

import subprocess

import pytest

from tests.support import report
from tests.support.cli import executable

#: 8 contenders (16 before): every release still has 7 runs racing for it. 16 made these
#: four tests half the suite's CPU: each run is a new interpreter that imports its store's
#: driver (0.1-0.3 s of CPU), 320 runs per store.
WORKERS = 8
ITERATIONS = 20

CHILD = """
mkdir "$MARKER" 2>/dev/null || { echo "overlap: $TASKLOCK_FENCING_TOKEN" >> "$ERRORS"; exit 99; }
echo "$TASKLOCK_FENCING_TOKEN" >> "$LOG"
sleep 0.002
rmdir "$MARKER"
"""


@pytest.mark.slow
@pytest.mark.stress
def test_no_overlap_and_strictly_increasing_tokens(store_url, cli_env, tmp_path):
    env = {
        **cli_env,
        "TASKLOCK_STORE": store_url,
        "MARKER": str(tmp_path / "marker"),
        "LOG": str(tmp_path / "log"),
        "ERRORS": str(tmp_path / "errors"),
    }
    worker = (
        f"for i in $(seq {ITERATIONS}); do "
        f"\"{executable()}\" -q run hot --wait inf --ttl 10s -- sh -c '{CHILD}' "
        '|| echo "exit $?" >> "$ERRORS"; done'
    )
    workers = [subprocess.Popen(["sh", "-c", worker], env=env) for _ in range(WORKERS)]
    for process in workers:
        assert process.wait(timeout=600) == 0
    errors = tmp_path / "errors"
    assert not errors.exists(), errors.read_text()
    tokens = [int(line) for line in (tmp_path / "log").read_text().split()]
    assert len(tokens) == WORKERS * ITERATIONS
    assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens)
    report.record(
        f"mutual exclusion {WORKERS}x{ITERATIONS} --wait inf",
        report.store_of(store_url),
        acquisitions=len(tokens),
        overlaps=0,
        tokens_strictly_increasing=True,
    )
