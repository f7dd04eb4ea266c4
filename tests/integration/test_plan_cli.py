"""``rebalance plan`` on a Delta table in the streaming job's ``key_histograms`` shape."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rebalance import cli
from rebalance.core.histograms import problem_from_histograms

pytestmark = pytest.mark.slow

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def _rows(n_keys=40, windows=3):
    rng = np.random.default_rng(7)
    out = []
    for w in range(windows):
        counts = rng.zipf(1.5, n_keys).clip(max=300)
        for i in range(n_keys):
            # two partial rows per (window, key), as after a mid-window move
            first = int(counts[i]) // 2
            for part, c in enumerate((first, int(counts[i]) - first)):
                out.append({
                    "window_start": T0 + timedelta(minutes=w), "key": f"k{i}",
                    "count": c, "cost": float(c), "state_bytes": 100 * (i + 1) + part,
                    "instance": part, "default_instance": 0, "key_group": i,
                    "partition_id": part, "assignment_version": 0, "batch_id": w * 10 + part,
                })
    return pd.DataFrame(out)


def test_plan_from_delta_matches_the_pandas_path(spark, tmp_path, capsys):
    frame = _rows()
    table = tmp_path / "key_histograms"
    (spark.createDataFrame(frame).write.format("delta").mode("overwrite").save(str(table)))
    out = tmp_path / "plan"
    code = cli.main(["plan", "--histograms", str(table), "--instances", "4", "--windows", "2",
                     "--method", "mixed", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 0, err
    doc = json.loads((out / "plan.json").read_text())
    assert doc["input"]["histograms_format"] == "delta"
    assert doc["input"]["windows_used"] == 2 and doc["input"]["keys"] == 40
    assigned = pq.read_table(out / "assignment.parquet").to_pandas()
    assert sorted(assigned["key"]) == sorted(frame["key"].unique())

    # the Delta path aggregates exactly like the pandas path
    expected = problem_from_histograms(frame, 4, windows=2)
    assert doc["input"]["total_load"] == pytest.approx(float(expected.load.sum()))
    assert doc["input"]["total_state_bytes"] == pytest.approx(float(expected.state.sum()))


def test_bad_delta_input_exits_2(spark, tmp_path, capsys):
    table = tmp_path / "no_count"
    spark.createDataFrame(_rows(n_keys=3, windows=1).drop(columns=["count"])) \
        .write.format("delta").save(str(table))
    out = tmp_path / "plan"
    code = cli.main(["plan", "--histograms", str(table), "--instances", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "'count'" in err[0]
    assert not out.exists()

    negative = tmp_path / "negative"
    spark.createDataFrame(_rows(n_keys=3, windows=1).assign(cost=-1.0)) \
        .write.format("delta").save(str(negative))
    code = cli.main(["plan", "--histograms", str(negative), "--instances", "2", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    # the same check and message as for Parquet or CSV input: the column, the key, the window
    assert code == 2 and len(err) == 1 and "'cost' must be finite and >= 0" in err[0], err
    assert "key 'k0'" in err[0]
    assert not out.exists()


def test_bad_delta_input_prints_one_line_from_a_fresh_process(spark, tmp_path):
    """A new process reads the table through delta-rs (no JVM starts, so no JVM warning
    reaches the terminal; issue 14: "Spark WARN lines before errors on Delta input"): one
    line, in well under the seconds a JVM start takes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    table = tmp_path / "no_count"
    spark.createDataFrame(_rows(n_keys=3, windows=1).drop(columns=["count"])) \
        .write.format("delta").save(str(table))
    exe = Path(sys.executable).with_name("rebalance")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "rebalance.cli"]
    out = tmp_path / "plan"
    done = subprocess.run([*cmd, "plan", "--histograms", str(table), "--instances", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAVA_HOME": "/nonexistent"})  # no JVM needed
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "'count'" in lines[0], done.stderr
    assert not out.exists()
