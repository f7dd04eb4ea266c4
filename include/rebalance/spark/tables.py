"""The project's Delta tables: names, paths, schemas, commit metadata, assignment versions.

Every table is a folder ``<root>/<name>`` (``root=``, default :func:`tables_root`); reads and
small appends go through delta-rs (``spark`` may be None), others and :func:`read` Spark. A new
table is one more :class:`Table` in :data:`TABLES`. Columns, engines, and the
``assignments`` table's versions and split keys: ``docs/streaming.md``, "Tables".

>>> from rebalance.spark import tables
>>> version = tables.publish_assignment(spark, {"k17": 3}, n_instances=4)  # doctest: +SKIP
>>> tables.read_assignment(spark).routing                                  # doctest: +SKIP
{'k17': 3}
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from numbers import Integral
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from rebalance.core import registry
from rebalance.core.assignment import (  # noqa: F401 (part of this module's API)
    AssignmentError,
    primary_instance,
    validate_routing,
    validate_splits,
)
from rebalance.spark import delta_rs
from rebalance.spark.delta_rs import Commit  # noqa: F401 (part of this module's API)
from rebalance.spark.paths import data_dir, join


class TableError(RuntimeError):
    """A table is missing, or data does not fit its schema."""


class UnreadableTableError(TableError, ValueError):
    """A table's folder holds no readable Delta table (a corrupt ``_delta_log``, or files
    but no log): bad input for the commands, one line naming the path."""


@dataclass(frozen=True)
class Table:
    """A Delta table of the project: its name, schema (DDL) and fixed table properties."""

    name: str
    schema_ddl: str
    description: str
    properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def schema(self) -> StructType:
        """The schema as a Spark ``StructType`` (parsed without a JVM)."""
        return flat_schema(self.schema_ddl)

    @property
    def columns(self) -> list[str]:
        return self.schema.fieldNames()

    def path(self, root: str | Path | None = None) -> str:
        """Location of the table: ``<root>/<name>`` (root defaults to :func:`tables_root`)."""
        return join(root if root is not None else tables_root(), self.name)


_TYPES: dict[str, DataType] = {
    "STRING": StringType(), "BIGINT": LongType(), "INT": IntegerType(), "DOUBLE": DoubleType(),
    "TIMESTAMP": TimestampType(), "BOOLEAN": BooleanType()}


def flat_schema(ddl: str) -> StructType:
    """Parse a flat ``"name TYPE, ..."`` schema (types: STRING, BIGINT, INT, DOUBLE,
    TIMESTAMP, BOOLEAN) without a JVM."""
    fields = []
    for item in ddl.split(","):
        parts = item.split()
        if len(parts) != 2 or parts[1].upper() not in _TYPES:
            raise TableError(f"cannot parse column {item.strip()!r} of schema {ddl!r}")
        fields.append(StructField(parts[0], _TYPES[parts[1].upper()], True))
    return StructType(fields)


RAW_EVENT_DDL = "event_id STRING, key STRING, value STRING, cost STRING, event_time STRING"

EVENTS = Table(
    "events", RAW_EVENT_DDL,
    "Raw keyed events as received: every payload field is a string, so malformed events can be "
    "stored and the job parses them (value and cost as DOUBLE, event_time as an ISO-8601 "
    "TIMESTAMP). event_id is unique.")
QUARANTINE = Table(
    "quarantine", RAW_EVENT_DDL + ", reason STRING",
    "Raw events the job rejected, with the reasons (';'-separated), written exactly once.")
RESULTS = Table(
    "results",
    "batch_id BIGINT, assignment_version BIGINT, window_start TIMESTAMP, key STRING, "
    "instance INT, partition_id INT, events BIGINT, count BIGINT, sum DOUBLE, "
    "sliding_count BIGINT, sliding_sum DOUBLE, final BOOLEAN",
    "Per micro-batch, key and window updated: events of the batch, the window's running count "
    "and sum of value, the sliding count and sum over the last w windows ending at it, final "
    "on the row of a closed window (the built-in job on rebalanced(); instance NULL there).")
KEY_HISTOGRAMS = Table(
    "key_histograms",
    "window_start TIMESTAMP, key STRING, count BIGINT, cost DOUBLE, state_bytes BIGINT, "
    "instance INT, default_instance INT, key_group INT, partition_id INT, "
    "assignment_version BIGINT, batch_id BIGINT",
    "Per closed window, key and instance: events, cost and the state bytes the key holds; "
    "input of `rebalance plan --histograms`.")
INSTANCE_HISTOGRAMS = Table(
    "instance_histograms",
    "window_start TIMESTAMP, instance INT, load DOUBLE, events BIGINT, keys BIGINT, "
    "task_ms DOUBLE, cpu_ms DOUBLE, partition_id INT, assignment_version BIGINT, batch_id BIGINT, "
    "duplicates BIGINT",
    "Per closed window and instance: load (sum of cost), events, distinct keys, the time "
    "the operator spent on the window's events (wall clock and CPU), and the events it "
    "dropped as duplicates (an event_id its key saw within the watermark; under "
    "rebalanced(), the rows a processor passed to count_duplicates; NULL in rows written "
    "before the column was added).")
WINDOW_RESULTS = Table(
    "window_results", "window_start TIMESTAMP, key STRING, count BIGINT, sum DOUBLE, cost "
    "DOUBLE, sliding_count BIGINT, sliding_sum DOUBLE, instances INT, assignment_version BIGINT, "
    "batch_id BIGINT",
    "Per closed window and key, one final row: count, sum of value and cost merged over the "
    "instances that processed the key in the window (the shares of a split key, both sides "
    "of a live switch), and the sliding count and sum over the last w windows; written once, "
    "in the micro-batch whose watermark closes the window (from the built-in job on "
    "rebalanced(), cost and instances NULL: see key_histograms).")
ASSIGNMENTS = Table(
    "assignments", "key STRING, instance INT, share DOUBLE",
    "Routing table over the default placement, one Delta version per publish (see module doc).",
    properties={"delta.enableRowTracking": "true"})

RESTARTS = Table(
    "restarts",
    "request_id STRING, step STRING, job STRING, generation BIGINT, assignment_version BIGINT, "
    "n_instances INT, checkpoint STRING, detail STRING, at TIMESTAMP",
    "Controlled restarts of the keyed job (rebalance.streaming.restart): one row per step of a "
    "request (requested, stopped, state_written, cancelled, started, acknowledged, failed, "
    "rolled_back), each written once (Delta transaction: request id, step order); detail is JSON.")

JOBS = Table(
    "jobs",
    "job STRING, capability STRING, app STRING, generation BIGINT, started_at TIMESTAMP, "
    "host STRING, pid BIGINT, splits BOOLEAN",
    "Starts of the streaming job (rebalance.spark.jobs): one row per process start, with what "
    "it can do: capability 'restart' (controlled restarts: restartable_job.py) or 'live' "
    "(live switch only: keyed_job.py) or 'handoff' (a live switch that hands the moved keys' "
    "state over: rebalanced()), and splits (whether it merges the partial results of "
    "a key split over instances; NULL: not recorded). apply reads the newest row of its job, "
    "validate its splits.")

#: Every table by name.
TABLES: dict[str, Table] = {t.name: t for t in (
    EVENTS, QUARANTINE, RESULTS, KEY_HISTOGRAMS, INSTANCE_HISTOGRAMS, WINDOW_RESULTS,
    ASSIGNMENTS, RESTARTS, JOBS)}

N_INSTANCES_PROPERTY = "rebalance.n_instances"


def tables_root() -> Path | str:
    """Default location of all tables: the current job's (``registry.job_scope``; a folder,
    or an ``s3a://`` URI), else ``data_dir() / "tables"``."""
    job = registry.current_job()
    if job is None:
        return data_dir() / "tables"
    return job.tables_root(data_dir())


def get_table(name: str) -> Table:
    """A table by name, with the list of names when it is unknown."""
    try:
        return TABLES[name]
    except KeyError:
        raise TableError(f"unknown table {name!r}; known tables: {', '.join(TABLES)}") from None


# --------------------------------------------------------------------------- generic I/O

def sql_name(table: Table | str, root: str | Path | None = None) -> str:
    """The table as a SQL identifier, ``delta.`<path>```: one way to name a table that
    works on a classic session and on Spark Connect alike (no ``DeltaTable`` API, which
    Connect only offers with Delta's server plugin)."""
    path = table if isinstance(table, str) else table.path(root)
    return "delta.`" + str(path).replace("`", "``") + "`"


def exists(spark: SparkSession | None, table: Table, root: str | Path | None = None) -> bool:
    """Whether the table exists (as a Delta table) under ``root``: a commit in its log
    folder, one directory listing (``spark`` is not used)."""
    return delta_rs.exists(table.path(root))


def check_readable(spark: SparkSession | None, table: Table,
                   root: str | Path | None = None) -> None:
    """Refuse (:class:`UnreadableTableError`, naming the path) a table folder that is not
    a readable Delta table: files but no ``_delta_log``, or a log Delta cannot read
    (garbage commit JSON, a missing checkpoint). A table that does not exist passes.
    For commands that only read; writers create missing tables (:func:`ensure_table`).
    Read through delta-rs (``spark`` is not used)."""
    path = table.path(root)
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise UnreadableTableError(f"table {table.name!r} at {folder} is not a folder")
    if folder.is_dir() and not (folder / "_delta_log").is_dir() and any(
            not p.name.startswith((".", "_")) for p in folder.iterdir()):
        raise UnreadableTableError(f"table {table.name!r} at {folder} is not a Delta table "
                                   "(files but no _delta_log)")
    if not exists(spark, table, root):
        return
    try:
        delta_rs.history(path, 1)
        delta_rs.table(path).schema()
    except delta_rs.DeltaRsError as exc:
        raise UnreadableTableError(f"table {table.name!r} at {path} cannot be read as a "
                                   f"Delta table: {exc}") from None


def spark_message(exc: BaseException, limit: int = 300) -> str:
    """The first informative line of a Spark/Delta/py4j error (not "An error occurred
    while calling o42.sql"), at most ``limit`` characters."""
    text = ""
    getter = getattr(exc, "getMessage", None)
    if callable(getter):
        try:
            text = str(getter() or "")
        except Exception:  # noqa: BLE001 - the JVM may be gone
            text = ""
    if not text and getattr(exc, "java_exception", None) is not None:
        try:
            text = str(exc.java_exception.getMessage() or "")
        except Exception:  # noqa: BLE001
            text = ""
    lines = [ln.strip() for ln in (text or str(exc)).splitlines() if ln.strip()]
    lines = [ln for ln in lines if not ln.startswith("An error occurred while calling")] or lines
    first = lines[0].lstrip(": ") if lines else type(exc).__name__
    return first if len(first) <= limit else first[:limit - 3] + "..."


def ensure_table(spark: SparkSession, table: Table, root: str | Path | None = None,
                 properties: Mapping[str, str] | None = None) -> str:
    """Create the table if it does not exist (version 0, no rows); return its path.

    A table created by an earlier release gets the columns added to its schema since
    (``ALTER TABLE ADD COLUMNS``, NULL in the rows it holds); a column is never dropped
    or changed.
    """
    path = table.path(root)
    if exists(spark, table, root):
        have = set(delta_rs.columns(path))
        missing = [f for f in table.schema.fields if f.name not in have]
        if missing:
            spark.sql(f"ALTER TABLE {sql_name(path)} ADD COLUMNS (" + ", ".join(
                f"`{f.name}` {f.dataType.simpleString().upper()}" for f in missing) + ")")
        return path
    props = {**table.properties, **(properties or {})}
    if not props and delta_rs.readable(path):    # nothing Spark must set
        delta_rs.create(path, delta_rs.arrow_schema(table.schema))
        return path
    ddl = f"CREATE TABLE IF NOT EXISTS {sql_name(path)} ({table.schema_ddl}) USING delta"
    if props:
        ddl += " TBLPROPERTIES (" + ", ".join(
            f"{sql_literal(k)} = {sql_literal(str(v))}" for k, v in props.items()) + ")"
    spark.sql(ddl)
    return path


def sql_literal(value: Any, sql_type: str | None = None) -> str:
    """``value`` as a SQL literal (of ``sql_type`` when given, e.g. ``"TIMESTAMP"``)."""
    if value is None or (isinstance(value, float) and value != value and sql_type is None):
        return f"CAST(NULL AS {sql_type})" if sql_type else "NULL"
    if isinstance(value, bool):
        text = "TRUE" if value else "FALSE"
    elif isinstance(value, datetime):
        stamp = (value.astimezone(timezone.utc).replace(tzinfo=None)
                 if value.tzinfo is not None else value)
        text = f"TIMESTAMP '{stamp.isoformat(sep=' ')}'"
    elif isinstance(value, float):
        text = f"CAST('{value!r}' AS DOUBLE)" if value != value or value in (
            float("inf"), float("-inf")) else repr(value)
    elif isinstance(value, Integral):
        text = str(int(value))
    else:
        text = "'" + str(value).replace("\\", "\\\\").replace("'", "\\'") + "'"
    return f"CAST({text} AS {sql_type})" if sql_type else text


def update(spark: SparkSession, table: Table, condition: str, values: Mapping[str, Any],
           root: str | Path | None = None) -> int | None:
    """``UPDATE`` the rows matching ``condition`` (SQL) with ``values`` (column -> Python
    value, typed by the table's schema); one Delta commit (none when no row matches),
    annotated by the caller's session settings (``plan_store.delta_txn``). Returns the
    number of rows updated, as Delta reports it (None if it does not)."""
    types = {f.name: f.dataType.simpleString().upper() for f in table.schema.fields}
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise TableError(f"table {table.name!r} has no column(s) {unknown}")
    assignments = ", ".join(f"`{c}` = {sql_literal(v, types[c])}" for c, v in values.items())
    # the command runs here; its one result row is read back, the UPDATE is not run again
    result = spark.sql(f"UPDATE {sql_name(table, root)} SET {assignments} WHERE {condition}")
    rows = result.collect()
    count = rows[0].asDict().get("num_affected_rows") if rows else None
    return None if count is None else int(count)


def conform(df: DataFrame, table: Table) -> DataFrame:
    """``df`` with exactly the table's columns, in order and cast to its types."""
    have = set(df.columns)
    missing = [c for c in table.columns if c not in have]
    extra = sorted(have - set(table.columns))
    if missing or extra:
        raise TableError(f"data for table {table.name!r} does not match its schema: "
                         f"missing columns {missing}, unexpected columns {extra}")
    return df.select([F.col(f.name).cast(f.dataType).alias(f.name) for f in table.schema.fields])


#: Up to this many rows, an append whose caller knows the count goes through delta-rs:
#: Spark spends about 0.5 s per commit on a micro-batch's few rows (docs/benchmarks.md).
DRIVER_APPEND_ROWS = 200_000


def append(df: DataFrame, table: Table, root: str | Path | None = None,
           metadata: Mapping[str, Any] | None = None,
           txn: tuple[str, int] | None = None, rows: int | None = None) -> None:
    """Append ``df`` as one commit, ``metadata`` as its userMetadata JSON; ``txn = (app_id,
    version)`` makes it idempotent (skipped when the app id recorded a version >= this one:
    micro-batches written exactly once; both engines honour the same ids). Known ``rows``
    (or a bound) up to :data:`DRIVER_APPEND_ROWS`, on a table delta-rs writes (no writer
    features): collected as Arrow and committed through delta-rs; otherwise Spark writes."""
    path = table.path(root)
    if rows is not None and rows <= DRIVER_APPEND_ROWS and delta_rs.writable(path):
        delta_rs.append(path, conform(df, table).toArrow(),
                        metadata=dict(metadata) if metadata else None, txn=txn)
        return
    writer = conform(df, table).write.format("delta").mode("append")
    if metadata:
        writer = writer.option("userMetadata", json.dumps(dict(metadata), sort_keys=True))
    if txn is not None:
        writer = writer.option("txnAppId", txn[0]).option("txnVersion", int(txn[1]))
    writer.save(path)


def append_rows(spark: SparkSession | None, rows: list[Mapping[str, Any]], table: Table,
                root: str | Path | None = None, metadata: Mapping[str, Any] | None = None,
                txn: tuple[str, int] | None = None) -> None:
    """Append rows held in this process (mappings of the table's columns) as :func:`append`
    does: through delta-rs when it writes the table (no Spark job), else through Spark."""
    path = table.path(root)
    if not delta_rs.writable(path):
        return append(spark.createDataFrame([tuple(r[c] for c in table.columns) for r in rows],
                                            table.schema), table, root, metadata, txn)
    data = pa.Table.from_pylist([dict(r) for r in rows], schema=delta_rs.arrow_schema(table.schema))
    delta_rs.append(path, data, metadata=dict(metadata) if metadata else None, txn=txn)


def read_pandas(spark: SparkSession | None, table: Table, root: str | Path | None = None,
                version: int | None = None, columns: list[str] | None = None,
                filters: list[tuple] | None = None):
    """The table's rows as pandas (``toPandas()`` shapes), those matching ``filters``
    (DNF tuples, ``[("plan_id", "=", "p1")]``), at ``version`` if given; None when the
    table does not exist. Read through delta-rs in this process, no Spark job
    (:mod:`rebalance.spark.delta_rs`; ``spark`` is not used)."""
    return delta_rs.read(table.path(root), columns, version, filters)


def read_rows(spark: SparkSession | None, table: Table, root: str | Path | None = None,
              version: int | None = None, columns: list[str] | None = None,
              filters: list[tuple] | None = None) -> list[dict[str, Any]]:
    """The rows matching ``filters`` as dicts (NULL as None, TIMESTAMP values as aware
    UTC datetimes); empty when the table does not exist. As :func:`read_pandas`."""
    return delta_rs.rows(table.path(root), columns, version, filters)


def read(spark: SparkSession, table: Table, root: str | Path | None = None,
         version: int | None = None) -> DataFrame:
    """The table (at ``version`` if given), with a clear error when it does not exist."""
    path = table.path(root)
    if not exists(spark, table, root):
        raise TableError(f"table {table.name!r} does not exist at {path}")
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", int(version))
    return reader.load(path)


def history(spark: SparkSession | None, table: Table, root: str | Path | None = None,
            limit: int | None = None) -> list[Commit]:
    """The table's commits, newest first, with userMetadata parsed as JSON (``{}`` if none),
    read from its log through delta-rs (no Spark job; ``spark`` is not used)."""
    if not exists(spark, table, root):
        raise TableError(f"table {table.name!r} does not exist at {table.path(root)}")
    return delta_rs.history(table.path(root), limit)


def commits(spark: SparkSession | None, table: Table, root: str | Path | None = None,
            after: int | None = None) -> Iterator[Commit]:
    """The table's commits newest first (those with a version above ``after`` when given),
    read in pages that double in size (:func:`rebalance.spark.delta_rs.commits`): a
    caller that stops at the commit it looks for reads about twice the commits newer than
    it, however old the table is. A commit made while it pages is not yielded."""
    path = table.path(root)
    if not exists(spark, table, root):
        raise TableError(f"table {table.name!r} does not exist at {path}")
    for commit in delta_rs.commits(path):
        if after is not None and commit.version <= after:
            return
        yield commit


def table_property(spark: SparkSession, table: Table, name: str,
                   root: str | Path | None = None) -> str | None:
    """A table property (``TBLPROPERTIES``), or None when it is not set (delta-rs)."""
    return delta_rs.properties(table.path(root)).get(name)


# --------------------------------------------------------------------------- assignments

@dataclass(frozen=True)
class Assignment:
    """One published assignment version: the routing table over the default placement."""

    version: int
    n_instances: int
    #: key -> instance; a split key maps to the instance of its largest share
    routing: dict[str, int]
    metadata: dict[str, Any]
    #: split key -> {instance: share}, instances increasing
    splits: dict[str, dict[int, float]] = field(default_factory=dict)


def create_assignments(spark: SparkSession, n_instances: int,
                       root: str | Path | None = None) -> str:
    """Create the assignments table for ``n_instances`` (version 0: empty routing table).

    Idempotent for the same instance count; a different count raises.
    """
    validate_routing({}, n_instances)
    path = ensure_table(spark, ASSIGNMENTS, root,
                        properties={N_INSTANCES_PROPERTY: str(n_instances)})
    actual = assignments_n_instances(spark, root)
    if actual != n_instances:
        raise AssignmentError(
            f"assignments table at {path} is for {actual} instances, not {n_instances}; "
            "changing the instance count needs a new table (and a new job checkpoint)")
    return path


def resize_assignments(spark: SparkSession, n_instances: int,
                       root: str | Path | None = None) -> None:
    """Set the table-level instance count of the assignments table (scale out or in).

    Only for the controlled restart (:mod:`rebalance.streaming.restart`), whose
    generations pin their assignment version and instance count: a job that
    routes by the latest version (live switch) refuses a table for another count.
    """
    validate_routing({}, n_instances)
    if assignments_n_instances(spark, root) == n_instances:
        return
    spark.sql(f"ALTER TABLE delta.`{ASSIGNMENTS.path(root)}` SET TBLPROPERTIES "
              f"('{N_INSTANCES_PROPERTY}' = '{int(n_instances)}')")


def assignments_n_instances(spark: SparkSession, root: str | Path | None = None) -> int:
    """The table-level instance count of the assignments table."""
    if not exists(spark, ASSIGNMENTS, root):
        raise TableError(f"assignments table does not exist at {ASSIGNMENTS.path(root)}; "
                         "create it with create_assignments() or publish_assignment()")
    value = table_property(spark, ASSIGNMENTS, N_INSTANCES_PROPERTY, root)
    if value is None:
        raise AssignmentError(f"assignments table at {ASSIGNMENTS.path(root)} has no "
                              f"{N_INSTANCES_PROPERTY} property")
    return int(value)


def publish_assignment(spark: SparkSession, routing: Mapping[str, int], n_instances: int,
                       metadata: Mapping[str, Any] | None = None,
                       root: str | Path | None = None,
                       splits: Mapping[str, Mapping[int, float]] | None = None) -> int:
    """Publish ``routing`` as a new assignment version (one Delta commit); return the version.

    Creates the table for ``n_instances`` if needed. ``splits`` (key -> {instance:
    share}) spreads keys over several instances (:func:`validate_splits`); a split key's
    entry in ``routing``, if any, must be one of its instances. ``metadata`` (e.g. plan
    id, method, metrics) goes into the commit's userMetadata with ``n_instances``,
    ``table_size`` (routing-table entries: one per whole key, one per share), the number
    of ``split_keys`` and a ``publish_id``.
    """
    routing = validate_routing(routing, n_instances)
    splits = validate_splits(splits, n_instances)
    for key, parts in splits.items():
        if key in routing and routing[key] not in parts:
            raise AssignmentError(f"key {key!r} is routed to instance {routing[key]}, which is "
                                  f"not one of its split instances {sorted(parts)}")
    path = create_assignments(spark, n_instances, root)
    publish_id = uuid.uuid4().hex
    rows = ([(key, instance, None) for key, instance in routing.items() if key not in splits]
            + [(key, instance, share) for key, parts in splits.items()
               for instance, share in parts.items()])
    meta = {**(metadata or {}), "kind": "assignment", "publish_id": publish_id,
            "n_instances": n_instances, "table_size": len(rows), "split_keys": len(splits)}
    rows.append((None, None, None))
    (spark.createDataFrame(rows, ASSIGNMENTS.schema).write.format("delta").mode("overwrite")
     .option("userMetadata", json.dumps(meta, sort_keys=True)).save(path))
    for commit in history(spark, ASSIGNMENTS, root, limit=50):
        if commit.metadata.get("publish_id") == publish_id:
            return commit.version
    raise AssignmentError(f"published assignment {publish_id} not found in the table history")


def assignment_rows(spark: SparkSession, root: str | Path | None = None,
                    version: int | None = None) -> DataFrame:
    """The assignments data with ``assignment_version`` per row (including the version row).

    ``assignment_version`` is the version of the publish that wrote the row, so
    ``max(assignment_version)`` over one read is the version that read saw
    (NULL before the first publish: version 0, the empty table).
    """
    df = read(spark, ASSIGNMENTS, root, version)
    share = F.col("share") if "share" in df.columns else F.lit(None).cast("double")
    return df.select(
        "key", "instance", share.alias("share"),
        F.col("_metadata.row_commit_version").cast("bigint").alias("assignment_version"))


def read_assignment(spark: SparkSession, version: int | None = None,
                    root: str | Path | None = None) -> Assignment:
    """The assignment at ``version`` (default: the latest), read from one snapshot."""
    rows, resolved, meta, n_instances = _snapshot_assignment(ASSIGNMENTS.path(root), version)
    if version is not None and rows and resolved != version:
        raise AssignmentError(f"version {version} of the assignments table is not a publish "
                              f"(its data was published in version {resolved})")
    routing = {r.key: int(r.instance) for r in rows if r.key is not None and r.share is None}
    splits: dict[str, dict[int, float]] = {}
    for r in rows:
        if r.key is not None and r.share is not None:
            splits.setdefault(r.key, {})[int(r.instance)] = float(r.share)
    splits = {k: dict(sorted(parts.items())) for k, parts in sorted(splits.items())}
    routing.update({k: primary_instance(parts) for k, parts in splits.items()})
    return Assignment(resolved, n_instances, dict(sorted(routing.items())), meta, splits)


def _snapshot_assignment(path: str, version: int | None):
    """(rows, publish version, its commit metadata, n_instances) of the assignments table
    at ``version`` (newest if None), through delta-rs. The publish that wrote the
    snapshot's rows is its newest commit of kind ``assignment`` (every publish is an
    overwrite, and nothing else writes data): the version Spark reads as the rows'
    ``_metadata.row_commit_version``."""
    t = delta_rs.table(path, version)
    if t is None:
        raise TableError(f"table 'assignments' does not exist at {path}")
    value = dict(t.metadata().configuration).get(N_INSTANCES_PROPERTY)
    if value is None:
        raise AssignmentError(f"assignments table at {path} has no "
                              f"{N_INSTANCES_PROPERTY} property")
    frame = delta_rs.read_arrow_of(t, ["key", "instance", "share"]).to_pylist()
    rows = [SimpleNamespace(key=r.get("key"), instance=r.get("instance"), share=r.get("share"))
            for r in frame]
    publish = next((c for c in delta_rs.commits(path, int(t.version()))
                    if c.metadata.get("kind") == "assignment"), None)
    if publish is None:
        return rows, 0, {}, int(value)
    return rows, publish.version, publish.metadata, int(value)


def latest_assignment_version(spark: SparkSession, root: str | Path | None = None) -> int:
    """Version of the latest publish (0 when nothing was published yet)."""
    return next((c.version for c in commits(spark, ASSIGNMENTS, root)
                 if c.metadata.get("kind") == "assignment"), 0)


def assignment_history(spark: SparkSession, root: str | Path | None = None,
                       after: int | None = None, limit: int | None = None) -> list[Commit]:
    """Publishes of the assignments table, newest first (the audit trail): those above
    version ``after``, at most ``limit`` (the newest); all of them when neither is given."""
    out: list[Commit] = []
    if limit is not None and limit <= 0:
        return out
    for commit in commits(spark, ASSIGNMENTS, root, after=after):
        if commit.metadata.get("kind") == "assignment":
            out.append(commit)
            if limit is not None and len(out) >= limit:
                break   # not one commit (or page) more than the limit needs
    return out
