"""Refusals that need Spark, as a user meets them: the ``rebalance`` console script in its
own process (the JVM's own stderr is only visible there), on a real Delta data folder.

A table whose first ``_delta_log`` JSON is garbage: ``status`` refuses it in one stderr
line naming the table and its path (it printed ~370 lines of Java and Python traceback),
exit 2, nothing on stdout (no py4j chatter), no table changed. The refusal comes after
the JVM started, so the line stands alone only if the JVM's own "Using incubator modules"
warning does not reach the terminal either. (``history`` reads the table through the same
check, ``tables.check_readable``; one JVM start here is enough.)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dag_helpers import data  # noqa: F401 - fixture

pytestmark = pytest.mark.slow


def _rebalance(args: list[str], root: Path) -> subprocess.CompletedProcess:
    exe = str(Path(sys.executable).with_name("rebalance"))
    env = {**os.environ, "REBALANCE_DATA_DIR": str(root)}
    return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=600)


def _tables(root: Path) -> dict[str, str]:
    """Every file of the data folder's tables, with its digest."""
    out = {}
    for p in sorted((root / "tables").rglob("*")):
        if p.is_file():
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _one_line(done: subprocess.CompletedProcess, command: str) -> str:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stdout == "", done.stdout[-2000:]
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith(f"rebalance {command}: error: "), lines[0]
    return lines[0]


def test_a_corrupt_table_is_refused_in_one_line_after_the_jvm_started(data):
    from rebalance.spark import tables

    log = Path(tables.ASSIGNMENTS.path()) / "_delta_log"
    first = sorted(log.glob("*.json"))[0]
    first.write_text("this is not a Delta commit\n")
    before = _tables(data)
    line = _one_line(_rebalance(["status"], data), "status")
    assert "'assignments'" in line and tables.ASSIGNMENTS.path() in line, line
    assert "cannot be read as a Delta table" in line, line
    assert _tables(data) == before
