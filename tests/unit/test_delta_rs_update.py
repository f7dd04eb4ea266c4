"""delta_rs.update on a table delta-rs wrote itself (no JVM): every column type's
literal, the row count, the commit's userMetadata, the transaction id that makes a retry
a no-op, and a conflict between two writers of the same snapshot."""

from __future__ import annotations

import datetime as dt
import json
import math

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from rebalance.spark import delta_rs

DDL = "name STRING, holder STRING, n BIGINT, x DOUBLE, ok BOOLEAN, at TIMESTAMP"


@pytest.fixture
def path(tmp_path):
    data = pa.table({
        "name": ["apply", "other"], "holder": [None, "it's"], "n": pa.array([1, 2], pa.int64()),
        "x": [0.5, 1.5], "ok": [False, True],
        "at": pa.array([None, None], pa.timestamp("us", tz="UTC"))})
    write_deltalake(str(tmp_path / "t"), data)
    return str(tmp_path / "t")


def _row(path, name):
    rows = DeltaTable(path).to_pyarrow_table().to_pylist()
    return next(r for r in rows if r["name"] == name)


def test_each_type_round_trips_and_the_commit_is_annotated(path):
    at = dt.datetime(2026, 12, 6, 8, 30, 1, 123456, tzinfo=dt.timezone.utc)
    where = f"name = {delta_rs.sql_literal('apply', 'STRING')}"
    n = delta_rs.update(path, where, {"holder": "o'neil", "n": 7, "x": math.inf, "ok": True,
                                      "at": at}, DDL, metadata=json.dumps({"action": "t"}))
    assert n == 1
    row = _row(path, "apply")
    assert (row["holder"], row["n"], row["x"], row["ok"], row["at"]) == ("o'neil", 7, math.inf,
                                                                         True, at)
    assert _row(path, "other")["holder"] == "it's", "the predicate picked one row"
    assert delta_rs.history(path, 1)[0].metadata == {"action": "t"}
    # a quote in the predicate's literal, and a timestamp compared with the column
    later = at + dt.timedelta(seconds=1)
    assert delta_rs.update(path, f"holder = {delta_rs.sql_literal('o' + chr(39) + 'neil', 'STRING')}"
                                 f" AND at < {delta_rs.sql_literal(later, 'TIMESTAMP')}",
                           {"holder": None, "x": 2.0}, DDL) == 1
    assert _row(path, "apply")["holder"] is None


def test_no_match_writes_no_commit_and_a_retried_transaction_is_skipped(path):
    version = DeltaTable(path).version()
    assert delta_rs.update(path, "name = 'nobody'", {"n": 1}, DDL) == 0
    assert DeltaTable(path).version() == version
    assert delta_rs.update(path, "name = 'apply'", {"n": 5}, DDL, txn=("plan-1", 2)) == 1
    assert delta_rs.update(path, "name = 'apply'", {"n": 6}, DDL, txn=("plan-1", 2)) is None
    assert delta_rs.update(path, "name = 'apply'", {"n": 6}, DDL, txn=("plan-1", 1)) is None
    assert _row(path, "apply")["n"] == 5 and DeltaTable(path).version() == version + 1


def test_an_unknown_column_is_refused_and_a_stale_writer_conflicts(path):
    with pytest.raises(delta_rs.DeltaRsError, match="no column"):
        delta_rs.update(path, "name = 'apply'", {"nope": 1}, DDL)
    stale = DeltaTable(path)
    delta_rs.update(path, "name = 'apply'", {"n": 9}, DDL)
    with pytest.raises(Exception) as caught:
        stale.update(updates={"n": "10"}, predicate="name = 'apply'")
    from rebalance.spark.plan_store import is_conflict

    assert is_conflict(caught.value), caught.value
    assert _row(path, "apply")["n"] == 9


def test_create_makes_an_empty_table_of_the_schema_once_and_appends_go_to_it(tmp_path):
    from rebalance.spark.tables import JOBS

    path = str(tmp_path / "jobs")
    assert delta_rs.create(path, delta_rs.arrow_schema(JOBS.schema))
    assert not delta_rs.create(path, delta_rs.arrow_schema(JOBS.schema))   # there already
    t = DeltaTable(path)
    assert t.version() == 0 and delta_rs.columns(path) == JOBS.columns
    assert (t.protocol().min_reader_version, t.protocol().min_writer_version) == (1, 2)
    assert not t.protocol().writer_features and delta_rs.writable(path)
    fields = {f.name: f.type for f in t.schema().fields}
    assert str(fields["started_at"]) == 'PrimitiveType("timestamp")'
    assert str(fields["pid"]) == 'PrimitiveType("long")'
    row = {"job": "j", "capability": "live", "app": None, "generation": None,
           "started_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), "host": "h",
           "pid": 1, "splits": True}
    delta_rs.append(path, pa.Table.from_pylist([row], schema=delta_rs.arrow_schema(JOBS.schema)))
    assert delta_rs.rows(path) == [row]
