"""The storage module's answers from a table's log (``rebalance.spark.delta_rs``): the
files a commit added, the last checkpoint, whether a log folder exists, and the
``operationMetrics`` of a history entry. Tables written with delta-rs, no Spark."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from rebalance.spark import delta_rs


def _commit(table, version: int, *actions: dict) -> None:
    lines = [json.dumps(a) for a in actions]
    (table / "_delta_log" / f"{version:020d}.json").write_text("\n".join(lines) + "\n")


def test_the_files_a_commit_added_in_the_order_of_its_log(tmp_path):
    from rebalance.streaming.restart.checkpoint import version_files

    table = tmp_path / "events"
    (table / "_delta_log").mkdir(parents=True)
    _commit(table, 3, {"commitInfo": {"operation": "WRITE"}},
            {"add": {"path": "b.parquet", "dataChange": True}},
            {"remove": {"path": "old.parquet"}},
            {"add": {"path": "day=1/a.parquet"}},                       # dataChange absent
            {"add": {"path": "c.parquet", "dataChange": False}})         # a compaction's
    assert delta_rs.added_files(table, 3) == ["b.parquet", "day=1/a.parquet"]
    assert delta_rs.added_files(f"file://{table}", 3) == ["b.parquet", "day=1/a.parquet"]
    assert version_files(None, str(table), 3) == ["b.parquet", "a.parquet"]
    with pytest.raises(delta_rs.DeltaRsError, match="commit 4"):
        delta_rs.added_files(table, 4)                                   # removed by cleanup
    with pytest.raises(ValueError, match="not a table path delta-rs reads"):
        delta_rs.added_files("gs://bucket/events", 3)


def test_the_last_checkpoint_and_the_log_folder(tmp_path):
    table = tmp_path / "plans"
    assert delta_rs.last_checkpoint(table) is None and not delta_rs.has_log(table)
    (table / "_delta_log").mkdir(parents=True)
    assert delta_rs.has_log(table) and not delta_rs.exists(table)     # no commit yet
    assert delta_rs.last_checkpoint(table) is None
    (table / "_delta_log" / "_last_checkpoint").write_text('{"version":20,"size":7}')
    assert delta_rs.last_checkpoint(table) == 20
    assert delta_rs.last_checkpoint(f"file://{table}") == 20
    assert not delta_rs.has_log("gs://bucket/plans")
    with pytest.raises(ValueError, match="not a table path delta-rs reads"):
        delta_rs.last_checkpoint("gs://bucket/plans")


def test_history_entries_carry_their_operation_metrics(tmp_path):
    from deltalake import write_deltalake

    table = tmp_path / "results"
    write_deltalake(str(table), pa.table({"a": [1, 2]}))
    _commit(table, 1, {"commitInfo": {
        "timestamp": 1_700_000_000_000, "operation": "VACUUM END",
        "operationParameters": {"status": "COMPLETED"},
        "operationMetrics": {"numDeletedFiles": "3", "numVacuumedDirectories": "1"},
        "userMetadata": json.dumps({"kind": "maintenance", "step": "vacuum"})}})
    newest, first = delta_rs.history(table)
    assert (newest.version, newest.operation) == (1, "VACUUM END")
    assert newest.metrics == {"numDeletedFiles": "3", "numVacuumedDirectories": "1"}
    assert newest.metadata == {"kind": "maintenance", "step": "vacuum"}
    assert first.version == 0 and isinstance(first.metrics, dict)
    assert [c.version for c in delta_rs.history(table, 1)] == [1]
