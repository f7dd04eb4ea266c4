"""Reads through delta-rs while Spark writes the same table (local Spark + Delta).

The control plane reads every table through delta-rs in its own process
(:mod:`rebalance.spark.delta_rs`) while the streaming job and the DAG's writes commit
through Spark. A read must see one committed snapshot: all of a commit or none of it,
never a part; a read pinned to a version must give that version's rows however many
commits came since; and an assignment version read back must be the one Spark's row
tracking names.
"""

from __future__ import annotations

import threading

import pytest

pytestmark = pytest.mark.slow

ROWS_PER_COMMIT = 50


def _batch_rows(spark, batch: int):
    return spark.createDataFrame(
        [(f"b{batch}-{i}", batch, float(i)) for i in range(ROWS_PER_COMMIT)],
        "id STRING, batch INT, value DOUBLE")


def test_reads_during_spark_commits_see_whole_commits_and_pinned_versions(spark, tmp_path):
    from rebalance.spark import delta_rs

    path = str(tmp_path / "interleaved")
    _batch_rows(spark, 0).write.format("delta").save(path)
    commits = 12
    seen: list[tuple[int, dict[int, int]]] = []   # (version read, rows per batch)
    failures: list[BaseException] = []
    done = threading.Event()

    def read_while_writing():
        try:
            while not done.is_set():
                t = delta_rs.table(path)
                rows = delta_rs.read_arrow_of(t, ["batch"]).column("batch").to_pylist()
                counts: dict[int, int] = {}
                for b in rows:
                    counts[b] = counts.get(b, 0) + 1
                seen.append((int(t.version()), counts))
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failures.append(exc)

    reader = threading.Thread(target=read_while_writing)
    reader.start()
    try:
        for batch in range(1, commits + 1):
            _batch_rows(spark, batch).write.format("delta").mode("append").save(path)
            if batch % 4 == 0:   # a rewrite of every file, as an UPDATE or OPTIMIZE does
                spark.sql(f"UPDATE delta.`{path}` SET value = value + 1 WHERE batch = 0")
    finally:
        done.set()
        reader.join(timeout=60)
    assert not failures, failures
    versions = sorted({v for v, _ in seen})
    assert len(versions) >= 3, f"the reader saw only versions {versions}"
    for version, counts in seen:
        # whole commits only: every batch with all its rows, batches 0..k without a gap
        assert set(counts.values()) == {ROWS_PER_COMMIT}, (version, counts)
        assert sorted(counts) == list(range(len(counts))), (version, counts)

    # a pinned version gives its rows after every later commit, as Spark's time travel does
    for version, counts in seen[:: max(1, len(seen) // 8)]:
        pinned = delta_rs.read(path, ["id", "batch", "value"], version=version)
        spark_rows = (spark.read.format("delta").option("versionAsOf", version).load(path)
                      .toPandas())
        assert pinned.groupby("batch").size().to_dict() == counts
        key = ["id", "batch", "value"]
        assert (pinned.sort_values("id")[key].reset_index(drop=True)
                .equals(spark_rows.sort_values("id")[key].reset_index(drop=True)))
    newest = delta_rs.read(path, ["batch"])
    assert sorted(newest["batch"].unique()) == list(range(commits + 1))
    # the newest value from the files' statistics, as Spark's max (files removed by a
    # DELETE no longer count)
    spark.sql(f"DELETE FROM delta.`{path}` WHERE batch >= {commits - 1}")
    top = spark.read.format("delta").load(path).agg({"batch": "max"}).first()[0]
    assert delta_rs.max_value(path, "batch") == top == commits - 2


def test_an_assignment_version_read_back_is_the_one_spark_row_tracking_names(spark, tmp_path):
    """Every version of ``assignments`` read by number (a plan's base version, a rollback's
    target, an audit line) through delta-rs: the routing table, the split keys and the
    publish's version and metadata Spark reads as ``_metadata.row_commit_version``, also
    at a version that only changed the table's properties (a resize)."""
    from rebalance.spark import tables

    root = tmp_path / "tables"
    published = [tables.publish_assignment(spark, {"k1": 1}, 2, {"plan_id": "p1"}, root=root),
                 tables.publish_assignment(spark, {"k1": 0, "k2": 1}, 2, {"plan_id": "p2"},
                                           root=root, splits={"k3": {0: 0.5, 1: 0.5}})]
    tables.resize_assignments(spark, 3, root)                       # a metadata-only commit
    published.append(tables.publish_assignment(spark, {"k4": 2}, 3, {"plan_id": "p3"},
                                               root=root))
    newest = tables.history(spark, tables.ASSIGNMENTS, root, limit=1)[0].version
    for version in range(newest + 1):
        rows = tables.assignment_rows(spark, root, version).collect()
        by_spark = max((r.assignment_version or 0 for r in rows), default=0)
        if version != by_spark:   # not a publish: refused, naming the publish Spark names
            with pytest.raises(tables.AssignmentError, match=f"published in version {by_spark}"):
                tables.read_assignment(spark, version=version, root=root)
            continue
        a = tables.read_assignment(spark, version=version, root=root)
        whole = {r.key: r.instance for r in rows if r.key is not None and r.share is None}
        split = {}
        for r in rows:
            if r.share is not None:
                split.setdefault(r.key, {})[r.instance] = r.share
        assert a.version == by_spark
        assert {k: v for k, v in a.routing.items() if k not in split} == whole
        assert a.splits == split
        if version in published:
            assert a.metadata["plan_id"] == f"p{published.index(version) + 1}"
    assert tables.latest_assignment_version(spark, root) == published[-1]
    assert tables.read_assignment(spark, root=root).n_instances == 3


def test_an_append_carries_the_commit_metadata_and_transaction_of_a_spark_append(spark, tmp_path):
    """The generator's appends through delta-rs: Spark reads the rows, the commit's
    userMetadata and its transaction (a second append of the same batch is skipped, by
    delta-rs here and by Spark's own check); a table with writer features is refused."""
    import pyarrow as pa

    from rebalance.spark import delta_rs, tables

    path = str(tmp_path / "appended")
    spark.sql(f"CREATE TABLE delta.`{path}` (id STRING, batch INT) USING delta")
    rows = pa.table({"id": ["a", "b"], "batch": pa.array([7, 7], pa.int32())})
    assert delta_rs.append(path, rows, metadata={"kind": "test", "batch": 7}, txn=("app-1", 7))
    assert not delta_rs.append(path, rows, metadata={"kind": "test", "batch": 7}, txn=("app-1", 7))
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").orderBy("version").collect()
    assert [h.version for h in history] == [0, 1]
    assert '"batch": 7' in history[1].userMetadata
    assert spark.read.format("delta").load(path).count() == 2
    # Spark skips an append of the same transaction the delta-rs commit recorded
    (spark.createDataFrame([("c", 7)], "id STRING, batch INT").write.format("delta")
     .mode("append").option("txnAppId", "app-1").option("txnVersion", 7).save(path))
    assert spark.read.format("delta").load(path).count() == 2
    assert delta_rs.history(path, 1)[0].metadata == {"kind": "test", "batch": 7}
    # every tenth version gets a checkpoint, which Spark reads the table from
    for batch in range(8, 17):
        assert delta_rs.append(path, rows.set_column(1, "batch", pa.array([batch] * 2, pa.int32())),
                               txn=("app-1", batch))
    assert (tmp_path / "appended" / "_delta_log" / "00000000000000000010.checkpoint.parquet").exists()
    assert not (tmp_path / "appended" / "_delta_log" / "00000000000000000009.checkpoint.parquet").exists()
    spark._jvm.org.apache.spark.sql.delta.DeltaLog.clearCache()   # read from the checkpoint
    seen = spark.read.format("delta").load(path).groupBy().agg({"batch": "sum"}).collect()[0][0]
    assert seen == 7 * 2 + sum(range(8, 17)) * 2
    assert delta_rs.version(path) == 10
    # rows in another column order, with a column the table lacks: the table's columns go in
    assert delta_rs.append(path, pa.table({"extra": [1], "batch": pa.array([99], pa.int32()),
                                           "id": ["z"]}))
    assert spark.read.format("delta").load(path).where("batch = 99").collect()[0].id == "z"
    with pytest.raises(delta_rs.DeltaRsError, match=r"lack the table's columns \['batch'\]"):
        delta_rs.append(path, pa.table({"id": ["y"]}))
    assert delta_rs.version(path) == 11                      # the refused append wrote nothing

    root = tmp_path / "tables"
    tables.publish_assignment(spark, {"k1": 1}, 2, root=root)
    with pytest.raises(delta_rs.DeltaRsError, match="writer protocol 7"):
        delta_rs.append(tables.ASSIGNMENTS.path(root),
                        pa.table({"key": ["k2"], "instance": pa.array([0], pa.int32()),
                                  "share": pa.array([None], pa.float64())}))


def _engine(table_path, version: int) -> str:
    """Who wrote a commit: ``spark`` (commitInfo.engineInfo) or ``delta-rs``."""
    import json
    from pathlib import Path

    log = Path(table_path, "_delta_log", f"{version:020d}.json").read_text().splitlines()
    info = next(json.loads(line)["commitInfo"] for line in log if '"commitInfo"' in line)
    return "spark" if "Apache-Spark" in info.get("engineInfo", "") else (
        "delta-rs" if "delta-rs" in json.dumps(info) else json.dumps(info))


def test_tables_append_of_few_known_rows_commits_through_delta_rs_with_the_same_transaction(
        spark, tmp_path, monkeypatch):
    """``tables.append(rows=n)``, as the job's sink writes a micro-batch: up to
    DRIVER_APPEND_ROWS rows through delta-rs, otherwise (or n unknown) through Spark; a
    transaction either engine recorded is skipped by the other, so a replay writes once."""
    from rebalance.spark import delta_rs, tables

    root = tmp_path / "tables"
    path = tables.ensure_table(spark, tables.QUARANTINE, root)
    meta = {"job": "t", "batch_id": 3}

    def rows(*ids: str):
        return spark.createDataFrame([(i, "k", "1", "1", "x", "bad") for i in ids],
                                     tables.QUARANTINE.schema)

    tables.append(rows("a", "b"), tables.QUARANTINE, root, metadata=meta, txn=("q:t", 3),
                  rows=2)
    assert _engine(path, 1) == "delta-rs"
    assert delta_rs.history(path, 1)[0].metadata == meta
    tables.append(rows("a", "b"), tables.QUARANTINE, root, txn=("q:t", 3))   # a replay, Spark
    assert delta_rs.version(path) == 1
    tables.append(rows("c"), tables.QUARANTINE, root, txn=("q:t", 4))        # count unknown
    assert _engine(path, 2) == "spark"
    tables.append(rows("c"), tables.QUARANTINE, root, txn=("q:t", 4), rows=1)  # the replay
    assert delta_rs.version(path) == 2
    monkeypatch.setattr(tables, "DRIVER_APPEND_ROWS", 1)
    tables.append(rows("d", "e"), tables.QUARANTINE, root, txn=("q:t", 5), rows=2)
    assert _engine(path, 3) == "spark"                                       # above the limit
    got = sorted(r.event_id for r in tables.read(spark, tables.QUARANTINE, root).collect())
    assert got == ["a", "b", "c", "d", "e"]
    # a table with writer features (row tracking) stays on Spark whatever the count
    tables.publish_assignment(spark, {"k1": 1}, 2, root=root)
    before = delta_rs.version(tables.ASSIGNMENTS.path(root))
    tables.append(spark.createDataFrame([("k2", 0, None)], tables.ASSIGNMENTS.schema),
                  tables.ASSIGNMENTS, root, rows=1)
    assert _engine(tables.ASSIGNMENTS.path(root), before + 1) == "spark"
