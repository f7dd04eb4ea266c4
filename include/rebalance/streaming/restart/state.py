"""Migrating a stopped generation's operator state to a new assignment and N.

:func:`read_state` reads the state back (``statestore`` reader), :func:`migrate_state`
re-keys it, :func:`write_state` writes it as a new generation's ``initialState``.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalance.core.placement import default_instances
from rebalance.spark import delta_rs, tables
from rebalance.streaming.processor import (
    HANDOFF_COLUMNS_DDL,
    HANDOFF_EXPORT,
    INITIAL_STATE_DDL,
    PERKEY,
    PERWINDOW,
)
from rebalance.streaming.restart.control import Generation
from rebalance.streaming.routing import instance_labels


def read_state(spark: SparkSession, generation: Generation,
               last_batch: int | None) -> pd.DataFrame:
    """The generation's state after ``last_batch`` as :data:`INITIAL_STATE_DDL` rows
    (labels of its N); its own initial state when it committed no batch."""
    columns = [c.split()[0] for c in INITIAL_STATE_DDL.split(", ")]
    if last_batch is None:
        if generation.state_path is None:
            return pd.DataFrame(columns=columns)
        return spark.read.parquet(generation.state_path).toPandas().reindex(columns=columns)

    def load(name: str) -> DataFrame:
        return (spark.read.format("statestore").option("path", generation.checkpoint)
                .option("stateVarName", name).option("batchId", last_batch).load())

    perkey = load(PERKEY).select(
        F.col("key.label").cast("int").alias("label"), F.lit(PERKEY).alias("kind"),
        F.col("user_map_key.key").alias("key"), "user_map_value.*")
    perwindow = load(PERWINDOW)
    # A checkpoint of an earlier layout has no duplicates (nor seen ids: NULL, read as empty).
    held = set(perwindow.select("user_map_value.*").columns)
    perwindow = perwindow.select(
        F.col("key.label").cast("int").alias("label"), F.lit(PERWINDOW).alias("kind"),
        F.col("user_map_key.window_start_ms").alias("window_start_ms"),
        *[F.col(f"user_map_value.{c}").alias(c if c != "version" else "window_version")
          for c in ("events", "load", "task_ns", "cpu_ns", "version")],
        (F.col("user_map_value.duplicates") if "duplicates" in held
         else F.lit(0).cast("bigint")).alias("duplicates"))
    perwindow = perwindow.withColumnRenamed("window_version", "version")
    both = perkey.unionByName(perwindow, allowMissingColumns=True)
    return both.select([c if c in both.columns else F.lit(None).alias(c)
                        for c in columns]).toPandas()


def migrate_state(state: pd.DataFrame, old_n: int, new_n: int, routing: dict[str, int],
                  version: int) -> pd.DataFrame:
    """Re-key a generation's state for a new assignment (``routing``) and N.

    Every key goes to the label of its instance under the new assignment; the
    values of a key are copied as they are (its default instance is recomputed
    only when N changes; a key held by two labels, after an earlier live switch,
    is merged, its seen event ids too). Each open window (one the old state still
    tracked per instance) gets, per new instance, the events and load of the keys it
    now holds (the operator's invariant), the operator time and the duplicates its
    instance had (instance ``i`` of the old N goes to ``i mod`` new N), and a timer.
    """
    old_instance = {label: i for i, label in enumerate(instance_labels(old_n))}
    new_labels = np.array(instance_labels(new_n))
    perkey = state[state.kind == PERKEY].copy()
    perwindow = state[state.kind == PERWINDOW].copy()
    if perkey["key"].duplicated().any():
        perkey = _merge_duplicate_keys(perkey)
    keys = perkey["key"].astype(str).to_numpy()
    defaults = default_instances(keys, new_n) if len(keys) else np.zeros(0, dtype=int)
    instances = np.array([routing.get(k, d) for k, d in zip(keys, defaults)], dtype=int)
    perkey["label"] = new_labels[instances] if len(keys) else []
    if new_n != old_n:
        perkey["default_instance"] = defaults
    # Open windows: the events of the keys each new instance holds.
    open_windows = set(perwindow["window_start_ms"].astype("int64"))
    exploded = pd.DataFrame({
        "label": np.repeat(perkey["label"].to_numpy(), perkey["windows"].map(len).to_numpy()),
        "window_start_ms": np.concatenate([np.asarray(w, dtype=np.int64)
                                           for w in perkey["windows"]] or [np.zeros(0)]),
        "events": np.concatenate([np.asarray(c, dtype=np.int64)
                                  for c in perkey["counts"]] or [np.zeros(0)]),
        "load": np.concatenate([np.asarray(c, dtype=np.float64)
                                for c in perkey["costs"]] or [np.zeros(0)]),
    })
    exploded = exploded[exploded.window_start_ms.isin(open_windows)]
    windows = (exploded.groupby(["label", "window_start_ms"], as_index=False)
               .agg(events=("events", "sum"), load=("load", "sum")))
    old = perwindow.assign(
        instance=perwindow["label"].map(old_instance).astype(int) % new_n)
    old["label"] = new_labels[old["instance"].to_numpy()] if len(old) else []
    if "duplicates" not in old:
        old["duplicates"] = 0
    old["duplicates"] = old["duplicates"].fillna(0).astype("int64")
    timing = (old.groupby(["label", "window_start_ms"], as_index=False)
              .agg(task_ns=("task_ns", "sum"), cpu_ns=("cpu_ns", "sum"),
                   old_version=("version", "max"), duplicates=("duplicates", "sum")))
    windows = windows.merge(timing, on=["label", "window_start_ms"], how="outer")
    windows = windows.assign(events=windows.events.fillna(0).astype("int64"),
                             load=windows.load.fillna(0.0).astype("float64"),
                             duplicates=windows.duplicates.fillna(0).astype("int64"))
    windows = windows[(windows.events > 0) | (windows.duplicates > 0)]
    windows = windows.assign(
        kind=PERWINDOW, task_ns=windows.task_ns.fillna(0).astype("int64"),
        cpu_ns=windows.cpu_ns.fillna(0).astype("int64"),
        version=np.maximum(windows.old_version.fillna(0).astype("int64"), int(version)))
    columns = [c.split()[0] for c in INITIAL_STATE_DDL.split(", ")]
    out = pd.concat([perkey, windows.drop(columns="old_version")], ignore_index=True)
    return out.reindex(columns=columns)


def _merge_duplicate_keys(perkey: pd.DataFrame) -> pd.DataFrame:
    from rebalance.streaming.key_state import KeyWindows

    rows = []
    for _, group in perkey.groupby("key", sort=False):
        first = group.iloc[0].copy()
        if len(group) > 1:
            merged = KeyWindows(int(first.key_group), int(first.default_instance),
                                int(group.version.max()))
            for r in group.itertuples(index=False):
                for w, c, s, k in zip(r.windows, r.counts, r.sums, r.costs):
                    merged.add(int(w), int(c), float(s), float(k))
                seen = getattr(r, "seen_ids", None)
                if isinstance(seen, (list, tuple, np.ndarray)):
                    merged.merge_seen([str(i) for i in seen], [int(t) for t in r.seen_times])
            first["windows"], first["counts"] = merged.windows, merged.counts
            first["sums"], first["costs"] = merged.sums, merged.costs
            first["seen_ids"], first["seen_times"] = merged.seen_ids, merged.seen_times
            first["version"] = merged.version
        rows.append(first)
    return pd.DataFrame(rows)


def write_state(spark: SparkSession, frame: pd.DataFrame, path: str) -> None:
    """Write migrated state rows as Parquet (overwrite: re-running the step is safe)."""
    schema = spark.createDataFrame([], INITIAL_STATE_DDL).schema
    parts = {PERKEY: ["label", "kind", "key", "key_group", "default_instance", "version",
                      "windows", "counts", "sums", "costs", "seen_ids", "seen_times"],
             PERWINDOW: ["label", "kind", "window_start_ms", "events", "load", "task_ns",
                         "cpu_ns", "version", "duplicates"]}
    df = spark.createDataFrame([], schema)
    for kind, columns in parts.items():
        rows = frame.loc[frame.kind == kind].reindex(columns=columns)
        if kind == PERKEY:      # state of an earlier layout: no seen ids
            for c in ("seen_ids", "seen_times"):
                rows[c] = [v if isinstance(v, (list, tuple, np.ndarray)) else []
                           for v in rows[c]]
        else:
            rows["duplicates"] = rows["duplicates"].fillna(0)
        if len(rows):
            rows = rows.astype({c: t for c, t in {
                "label": "int32", "key_group": "int32", "default_instance": "int32",
                "version": "int64", "window_start_ms": "int64", "events": "int64",
                "load": "float64", "task_ns": "int64", "cpu_ns": "int64",
                "duplicates": "int64"}.items()
                if c in columns})
            sub = spark.createDataFrame(rows, schema=_sub_schema(schema, columns))
            df = df.unionByName(sub, allowMissingColumns=True)
    df.select(schema.fieldNames()).repartition(1).write.mode("overwrite").parquet(path)


def _sub_schema(schema, columns: list[str]):
    from pyspark.sql.types import StructType

    return StructType([schema[c] for c in columns])


# --------------------------------------------------------------------- handoff in the stream

#: A row of a checkpoint's handoff table: the operator's input besides events
#: (:data:`~rebalance.streaming.processor.HANDOFF_COLUMNS_DDL`), with its label and key.
HANDOFF_DDL = ("label INT, key STRING, key_group INT, default_instance INT, "
               "assignment_version BIGINT, " + HANDOFF_COLUMNS_DDL)
HANDOFF_TYPES = {name: kind for name, kind in (c.split(" ", 1) for c in HANDOFF_DDL.split(", "))}


def handoff_table(checkpoint: str) -> str:
    """The Delta table a checkpoint's query reads handoff rows from (one per checkpoint)."""
    return str(checkpoint).rstrip("/") + "-handoff"


def ensure_handoff_table(spark: SparkSession, checkpoint: str) -> str:
    """Create the (empty) handoff table of a checkpoint if needed; return its path."""
    path = handoff_table(checkpoint)
    if not delta_rs.exists(path):
        spark.sql(f"CREATE TABLE IF NOT EXISTS {tables.sql_name(path)} ({HANDOFF_DDL}) "
                  "USING delta")
    return path


def handoff_frame(spark: SparkSession, rows: DataFrame | list[dict]) -> DataFrame:
    """Rows (dicts, or a DataFrame with some of the columns) as handoff-table rows."""
    if isinstance(rows, list):
        rows = spark.createDataFrame(rows, ", ".join(
            f"{c} {t}" for c, t in HANDOFF_TYPES.items()))
    given = set(rows.columns)
    return rows.select(*[(F.col(c) if c in given else F.lit(None)).cast(t).alias(c)
                         for c, t in HANDOFF_TYPES.items()])


def append_export(spark: SparkSession, checkpoint: str, routing: dict[str, int],
                  n_instances: int, version: int, merge: bool, request_id: str) -> int:
    """Ask every label of a checkpoint to give away the keys ``routing`` (over the default
    placement) puts elsewhere: one ``export`` row per label, appended once per request
    (Delta transaction) to its handoff table. Returns the table version holding them."""
    path = ensure_handoff_table(spark, checkpoint)
    keys = sorted(routing)
    rows = [{"label": label, "handoff": HANDOFF_EXPORT, "assignment_version": int(version),
             "merge": bool(merge), "routing_keys": keys,
             "routing_instances": [int(routing[k]) for k in keys]}
            for label in instance_labels(n_instances)]
    (handoff_frame(spark, rows).coalesce(1).write.format("delta").mode("append")
     .option("txnAppId", f"export:{request_id}").option("txnVersion", 1)
     .option("userMetadata", json.dumps({"export": request_id})).save(path))
    for commit in delta_rs.commits(path):  # newest first, in pages (delta-rs)
        if commit.metadata.get("export") == request_id:
            return commit.version
    raise RuntimeError(f"the export of request {request_id} is not in {path}")
