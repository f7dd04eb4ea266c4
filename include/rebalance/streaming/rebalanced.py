"""Run a user's own StatefulProcessor rebalanced: the public entry point.

:func:`rebalanced` takes the processor one would give to
``df.groupBy(key).transformWithStateInPandas(...)``, routes every key by the query's
assignment version (:func:`route_keys`) to one of N instances, each running the processor
per key (:class:`~rebalance.streaming.host.InstanceHost`); :meth:`RebalancedQuery.switch`
moves keys with their state. Outputs, moves, recovery: ``docs/processors.md``::

    job = rebalanced(clicks, key="user_id", processor=Sessionize(), output_schema=SCHEMA,
                     time_mode="EventTime", event_time="click_time", job="clicks", instances=4)
    query = job.start(output="/data/sessions", checkpoint="/chk/clicks")
    query.follow()          # takes every newly published assignment, moving state
"""

from __future__ import annotations

import pickle
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming import StatefulProcessor, StreamingQuery
from pyspark.sql.types import (
    ByteType,
    DateType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from rebalance.spark import delta_rs, tables
from rebalance.spark.jobs import HANDOFF as HANDS_STATE_OVER
from rebalance.spark.jobs import LIVE as LIVE_ONLY
from rebalance.spark.jobs import record_start
from rebalance.streaming.boundary import BoundaryGate, wait_committed
from rebalance.streaming.host import (
    EXPORT,
    EXPORTED,
    HANDOFF,
    HOST_INPUT,
    HOST_OUTPUT,
    IN,
    INSTANCE_ROW,
    KEY_ROW,
    OUT,
    HostSettings,
    InstanceHost,
)
from rebalance.streaming.keyed_state import LAYOUT, USER_PREFIX, ContractError, as_struct
from rebalance.streaming.merge import Merge, merged
from rebalance.streaming.restart.checkpoint import (
    checkpoint_partitions,
    drop_uncommitted,
    log_ids,
    state_variables,
)
from rebalance.streaming.routing import instance_labels, route_keys

TIME_MODES = {"none": "None", "processingtime": "ProcessingTime", "eventtime": "EventTime"}
OUTPUT_MODES = {"append": "Append", "update": "Update"}
#: Key column types: routed by their string form, held in state with their own type.
KEY_TYPES = (StringType, IntegerType, LongType, ShortType, ByteType, DateType, TimestampType,
             TimestampNTZType)

#: The query's control table (under its checkpoint): moves in, and their record. One
#: schema: delta-rs creates the table from it, Spark writes rows of :data:`CONTROL_STRUCT`.
CONTROL_SCHEMA = pa.schema([("kind", pa.string()), ("label", pa.int32()),
                            ("version", pa.int64()), ("batch_id", pa.int64()),
                            ("payload", pa.binary()), ("routing_keys", pa.list_(pa.string())),
                            ("routing_instances", pa.list_(pa.int32()))])
CONTROL_STRUCT = from_arrow_schema(CONTROL_SCHEMA)
#: A row of the control table saying: batches after ``batch_id`` run with ``version``.
SWITCHED = "switched"

class SwitchBoundary(RuntimeError):
    """The sink refused a batch after a move's export batch (the query resumes re-routed)."""

def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ContractError(message)

@dataclass(frozen=True)
class RebalancedStream:
    """A user's processor over a stream, checked, ready to start (:func:`rebalanced`)."""

    df: DataFrame
    key: str
    processor: StatefulProcessor
    output_schema: StructType
    output_mode: str
    time_mode: str
    event_time: str | None
    cost: str | None
    job: str
    instances: int
    tables_root: str | None
    window_ms: int
    merge: Merge | None = None

    def start(self, output: str | Callable[[DataFrame, int], None], checkpoint: str,
              trigger_seconds: float | None = 1.0) -> RebalancedQuery:
        """Start the query: user rows to ``output`` (a Delta path, or a function called
        with each batch's rows and batch id), state under ``checkpoint``. ``trigger_seconds``
        None processes what is available and stops."""
        _check(isinstance(checkpoint, str) and bool(checkpoint),
               "checkpoint must be a path, got {checkpoint!r}")
        _check(callable(output) or (isinstance(output, str) and bool(output)),
               f"output must be a Delta path or a function(batch_df, batch_id), got {output!r}")
        query = RebalancedQuery(self, output, checkpoint, trigger_seconds)
        query.start()
        return query

def rebalanced(df: DataFrame, *, key: str, processor: StatefulProcessor,
               output_schema: StructType | str, time_mode: str = "None",
               output_mode: str = "Append", event_time: str | None = None,
               cost: str | None = None, job: str, instances: int,
               tables_root: str | None = None, window_seconds: float = 20.0,
               merge: Merge | None = None) -> RebalancedStream:
    """``df.groupBy(key).transformWithStateInPandas(processor, output_schema, output_mode,
    time_mode)``, rebalanced over ``instances`` instances.

    ``event_time`` (required with time_mode EventTime: the column ``df``'s watermark is on)
    places each event in a histogram window of ``window_seconds``; otherwise windows are by
    batch time. ``cost`` names a numeric column that is an event's cost (default 1).
    ``merge`` (a :class:`~rebalance.streaming.merge.Merge`) declares how the processor's
    partial results merge: only then may an assignment split a key. Refuses, in one line
    naming it, any part of Spark's contract it cannot honour."""
    _check(isinstance(processor, StatefulProcessor),
           f"processor must be a pyspark StatefulProcessor instance, got {type(processor).__name__}")
    _check(isinstance(key, str), f"key must be the name of one column, got {key!r}")
    _check(key in df.columns, f"key column {key!r} is not a column of the stream "
                              f"({', '.join(df.columns)})")
    key_type = df.schema[key].dataType
    _check(isinstance(key_type, KEY_TYPES),
           f"key column {key!r} has type {key_type.simpleString()}; rebalanced() takes keys of "
           "type string, integer, date or timestamp")
    schema = as_struct(output_schema, "output_schema")
    clash = [n for n in schema.fieldNames() + df.columns if n.startswith("rb_")]
    _check(not clash, f"column names starting with 'rb_' are the rebalancer's: {clash}")
    _check(isinstance(time_mode, str) and time_mode.lower() in TIME_MODES,
           f"time_mode must be one of None, ProcessingTime, EventTime, got {time_mode!r}")
    _check(isinstance(output_mode, str) and output_mode.lower() in OUTPUT_MODES,
           f"output_mode must be Append or Update (transformWithState has no Complete), "
           f"got {output_mode!r}")
    mode = TIME_MODES[time_mode.lower()]
    if mode == "EventTime":
        _check(event_time is not None, "time_mode EventTime needs event_time, the column "
                                       "the stream's watermark is on")
    if event_time is not None:
        _check(event_time in df.columns, f"event_time column {event_time!r} is not a column")
        _check(isinstance(df.schema[event_time].dataType, TimestampType),
               f"event_time column {event_time!r} must be a timestamp")
    if cost is not None:
        _check(cost in df.columns, f"cost column {cost!r} is not a column")
    _check(isinstance(instances, int) and instances >= 1,
           f"instances must be an integer >= 1, got {instances!r}")
    _check(isinstance(job, str) and re.fullmatch(r"[A-Za-z0-9_-]+", job or "") is not None,
           f"job must be letters, digits, '-' or '_', got {job!r}")
    _check(window_seconds > 0, f"window_seconds must be > 0, got {window_seconds!r}")
    _check(type(processor).handleInitialState is StatefulProcessor.handleInitialState,
           f"{type(processor).__name__} defines handleInitialState; rebalanced() does not take "
           "an initial state")
    if merge is not None:
        _check(isinstance(merge, Merge), f"merge must be a rebalance Merge, got {merge!r}")
        merge.check(schema, df.columns)
    return RebalancedStream(df, key, processor, schema, OUTPUT_MODES[output_mode.lower()], mode,
                            event_time, cost, job, instances, tables_root,
                            int(round(window_seconds * 1000)), merge)

# --------------------------------------------------------------------------- the stream

def _refuse_splits(assignment: tables.Assignment, stream: RebalancedStream) -> None:
    if assignment.splits and stream.merge is None:
        raise ContractError(f"assignment version {assignment.version} splits "
                            f"{len(assignment.splits)} key(s); {type(stream.processor).__name__} "
                            "does not declare how partial results merge")

def _window_col(stream: RebalancedStream) -> Column:
    if stream.event_time is None:
        return F.lit(None).cast("bigint")
    ms = F.unix_millis(F.col(stream.event_time))
    return (ms - F.pmod(ms, F.lit(stream.window_ms))).cast("bigint")

def operator_output(stream: RebalancedStream, assignment: tables.Assignment,
                    control: DataFrame) -> DataFrame:
    """The host operator over the routed events and the control rows (union output)."""
    df = stream.df
    user_columns = df.columns
    cost = F.col(stream.cost).cast("double") if stream.cost else F.lit(1.0)
    n = assignment.n_instances
    routed = route_keys(df, stream.key, assignment, n,
                        stream.merge.split_by if stream.merge else ())
    events = routed.select(
        *user_columns, "rb_label", "rb_key", _window_col(stream).alias("rb_window"),
        cost.alias("rb_cost"), "rb_version", "rb_default", "rb_group",
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in HOST_INPUT.fields
          if f.name in ("rb_control", "rb_payload", "rb_routing_keys",
                        "rb_routing_instances")])
    controls = control.where(F.col("kind").isin(EXPORT, IN)).select(
        *[F.lit(None).cast(f.dataType).alias(f.name) for f in df.schema.fields],
        F.col("label").alias("rb_label"), F.lit(None).cast("string").alias("rb_key"),
        F.lit(None).cast("bigint").alias("rb_window"), F.lit(None).cast("double").alias("rb_cost"),
        F.col("version").alias("rb_version"), F.lit(None).cast("int").alias("rb_default"),
        F.lit(None).cast("int").alias("rb_group"), F.col("kind").alias("rb_control"),
        F.col("payload").alias("rb_payload"), F.col("routing_keys").alias("rb_routing_keys"),
        F.col("routing_instances").alias("rb_routing_instances"))
    labels = instance_labels(n)
    settings = HostSettings(stream.key, df.schema[stream.key].dataType, tuple(user_columns),
                            tuple(stream.output_schema.fieldNames()), stream.time_mode,
                            n, labels, stream.window_ms,
                            moves_state=stream.merge is None)
    host_mode = "ProcessingTime" if stream.time_mode == "None" else stream.time_mode
    out_schema = StructType(list(stream.output_schema.fields) + list(HOST_OUTPUT.fields))
    return (events.unionByName(controls).groupBy("rb_label").transformWithStateInPandas(
        InstanceHost(stream.processor, settings), out_schema, stream.output_mode, host_mode))

# --------------------------------------------------------------------------- control table

def control_path(checkpoint: str) -> str:
    return str(Path(checkpoint) / "_rebalance" / "control")

def ensure_control(spark: SparkSession, checkpoint: str) -> str:
    path = control_path(checkpoint)
    if delta_rs.readable(path):
        delta_rs.create(path, CONTROL_SCHEMA)
    elif not delta_rs.exists(path):
        spark.createDataFrame([], CONTROL_STRUCT).write.format("delta").mode("ignore").save(path)
    return path

def switches(spark: SparkSession, checkpoint: str) -> list[tuple[int, int]]:
    """(batch id, version) of every recorded switch, in order (read through delta-rs;
    ``spark`` is not used)."""
    rows = delta_rs.rows(control_path(checkpoint), ["batch_id", "version"],
                         filters=[("kind", "=", SWITCHED)])
    return sorted((int(r["batch_id"]), int(r["version"])) for r in rows)

def last_committed_batch(checkpoint: str) -> int | None:
    """The newest batch id in the checkpoint's commit log (None before the first)."""
    ids = log_ids(Path(checkpoint) / "commits")
    return ids[-1] if ids else None

def batch_version(spark: SparkSession, checkpoint: str, first_version: int,
                  batch_id: int) -> int:
    """The version micro-batch ``batch_id`` runs with: that of the newest switch whose
    export batch came before it, else ``first_version``."""
    version = first_version
    for exported, switched_to in switches(spark, checkpoint):
        if exported < batch_id:
            version = switched_to
    return version

def resume_version(spark: SparkSession, checkpoint: str, first_version: int) -> int:
    """The version the query's next batch runs with: that of the newest switch whose export
    batch the checkpoint committed (an uncommitted export batch replays with the version it
    first ran with), else ``first_version``."""
    done = last_committed_batch(checkpoint)
    return first_version if done is None else batch_version(spark, checkpoint, first_version,
                                                            done + 1)

# --------------------------------------------------------------------------- the sink

@dataclass
class RebalancedSink:
    """``foreachBatch`` of a rebalanced query: user rows, histograms and moves, each batch
    written once (Delta transactions keyed by the query id and batch id)."""

    spark: SparkSession
    stream: RebalancedStream
    output: str | Callable[[DataFrame, int], None]
    checkpoint: str
    version: int
    query_id: str = ""
    #: the export batch of the move under way: later batches are refused
    switched_at: int | None = None
    switched: threading.Event = field(default_factory=threading.Event)
    #: held through each batch's call; once closed, every later batch is refused
    gate: BoundaryGate = field(default_factory=BoundaryGate)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self.gate.lock:
            if self.gate.closed:
                raise SwitchBoundary(f"batch {batch_id} refused: the query is stopping")
            if self.switched_at is not None and batch_id > self.switched_at:
                raise SwitchBoundary(f"batch {batch_id} follows the move of batch "
                                     f"{self.switched_at}; the query resumes re-routed")
            self._write(batch, batch_id)
            self.gate.last_written = batch_id

    def _write(self, batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            kinds = {r.rb_kind: r for r in batch.groupBy("rb_kind").agg(
                F.max("rb_version").alias("version")).collect()}
            meta = {"job": self.stream.job, "batch_id": batch_id, "assignment_version": self.version}
            if OUT in kinds:
                rows = batch.where(F.col("rb_kind") == OUT)
                rows = (merged(rows, self.stream.merge, self.stream.output_schema)
                        if self.stream.merge is not None
                        else rows.select(*self.stream.output_schema.fieldNames()))
                if callable(self.output):
                    self.output(rows, batch_id)
                else:
                    (rows.write.format("delta").mode("append")
                     .option("txnAppId", f"{self.query_id}:out").option("txnVersion", batch_id)
                     .save(self.output))
            if KEY_ROW in kinds or INSTANCE_ROW in kinds:
                self._histograms(batch, batch_id, meta)
            if EXPORTED in kinds:
                # after every other output of the batch: this commit is the switch
                version = int(kinds[EXPORTED].version)
                moved = batch.where(F.col("rb_kind") == HANDOFF).select(
                    F.lit(IN).alias("kind"), F.col("rb_label").alias("label"),
                    F.col("rb_version").alias("version"),
                    F.lit(batch_id).cast("bigint").alias("batch_id"),
                    F.col("rb_payload").alias("payload"))
                record = self.spark.createDataFrame(
                    [(SWITCHED, None, version, batch_id, None, None, None)], CONTROL_STRUCT)
                (moved.unionByName(record, allowMissingColumns=True).coalesce(1)
                 .write.format("delta").mode("append")
                 .option("txnAppId", f"{self.query_id}:control").option("txnVersion", batch_id)
                 .save(control_path(self.checkpoint)))
                self.switched_at = batch_id
                self.switched.set()
        finally:
            batch.unpersist()

    def _histograms(self, batch: DataFrame, batch_id: int, meta: dict[str, Any]) -> None:
        """The batch's closed windows, collected once (they are few rows: one per key and
        window) and appended to ``key_histograms`` and ``instance_histograms`` through
        delta-rs, each idempotent under the query's id and the batch id."""
        rows = batch.where(F.col("rb_kind").isin(KEY_ROW, INSTANCE_ROW)).select(
            "rb_kind", F.timestamp_millis("rb_window").alias("window_start"),
            F.col("rb_key").alias("key"), F.col("rb_events").alias("count"),
            F.col("rb_cost").alias("cost"), F.col("rb_bytes").alias("state_bytes"),
            F.col("rb_instance").alias("instance"), F.col("rb_default").alias("default_instance"),
            F.col("rb_group").alias("key_group"), F.col("rb_partition").alias("partition_id"),
            F.col("rb_version").alias("assignment_version"),
            F.lit(batch_id).cast("bigint").alias("batch_id"), F.col("rb_cost").alias("load"),
            F.col("rb_events").alias("events"), F.col("rb_keys").alias("keys"),
            F.col("rb_task_ms").alias("task_ms"), F.col("rb_cpu_ms").alias("cpu_ms"),
            F.col("rb_duplicates").alias("duplicates")).toArrow()
        for kind, table in ((KEY_ROW, tables.KEY_HISTOGRAMS),
                            (INSTANCE_ROW, tables.INSTANCE_HISTOGRAMS)):
            of_kind = rows.filter(pc.equal(rows["rb_kind"], kind))
            if of_kind.num_rows:
                path = table.path(self.stream.tables_root)
                delta_rs.append(path, of_kind, metadata=meta,
                                txn=(f"{self.query_id}:{table.name}", batch_id))

# --------------------------------------------------------------------------- the query

class RebalancedQuery:
    """A running rebalanced query: its Spark query, the version it runs with, moves."""

    def __init__(self, stream: RebalancedStream, output, checkpoint: str,
                 trigger_seconds: float | None) -> None:
        self.stream, self.output, self.checkpoint = stream, output, checkpoint
        self.trigger_seconds = trigger_seconds
        self.spark = stream.df.sparkSession
        self.query: StreamingQuery | None = None
        self.sink: RebalancedSink | None = None
        self.version = 0
        #: N of the version the query runs with (``instances`` until a move changes it)
        self.instances = stream.instances

    @property
    def name(self) -> str:
        return f"{self.stream.job}-rebalanced"

    def start(self) -> None:
        """Start (or resume) the query with the version its checkpoint records."""
        spark, stream = self.spark, self.stream
        earlier = sorted(n for n in state_variables(self.checkpoint)
                         if n.startswith(USER_PREFIX) and n not in LAYOUT)
        if earlier:
            raise ContractError(
                f"checkpoint {self.checkpoint} keeps state in the layout of an earlier version "
                f"({', '.join(earlier)}); this version keeps keys' entries in buckets and "
                "cannot resume it: start from a new checkpoint")
        if not tables.exists(spark, tables.ASSIGNMENTS, stream.tables_root):
            tables.create_assignments(spark, stream.instances, stream.tables_root)
        for table in (tables.KEY_HISTOGRAMS, tables.INSTANCE_HISTOGRAMS):
            tables.ensure_table(spark, table, stream.tables_root)
        ensure_control(spark, self.checkpoint)
        first = self._first_version(tables.latest_assignment_version(spark, stream.tables_root))
        self._run(resume_version(spark, self.checkpoint, first))

    def _first_version(self, latest: int) -> int:
        """The version the checkpoint's first batch ran with (recorded at its first start)."""
        marker = self._first_version_marker()
        if not marker.exists():
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(int(latest)))
        return int(marker.read_text())

    def _first_version_marker(self) -> Path:
        return Path(self.checkpoint) / "_rebalance" / "first_version"

    def version_of(self, batch_id: int) -> int:
        """The assignment version micro-batch ``batch_id`` runs with (the batches after a
        move's export batch run with the version it moved to)."""
        return batch_version(self.spark, self.checkpoint,
                             int(self._first_version_marker().read_text()), batch_id)

    def _run(self, version: int) -> None:
        spark, stream = self.spark, self.stream
        assignment = tables.read_assignment(spark, version, stream.tables_root)
        _refuse_splits(assignment, stream)
        self._repartition(assignment.n_instances)
        control = (spark.readStream.format("delta").option("skipChangeCommits", "true")
                   .load(control_path(self.checkpoint)))
        out = operator_output(stream, assignment, control)
        sink = RebalancedSink(spark, stream, self.output, self.checkpoint, version)
        previous = spark.conf.get("spark.sql.shuffle.partitions")
        spark.conf.set("spark.sql.shuffle.partitions", str(assignment.n_instances))
        try:
            writer = (out.writeStream.queryName(self.name).foreachBatch(sink)
                      .option("checkpointLocation", self.checkpoint))
            writer = (writer.trigger(availableNow=True) if self.trigger_seconds is None
                      else writer.trigger(processingTime=f"{self.trigger_seconds} seconds"))
            self.query = writer.start()
        finally:
            spark.conf.set("spark.sql.shuffle.partitions", previous)
        sink.query_id = self.query.id
        self.sink, self.version, self.instances = sink, version, assignment.n_instances
        # a processor with a merge leaves a moved key's state where it is (its parts merge)
        record_start(spark, _JobRecord(stream.job, stream.tables_root),
                     HANDS_STATE_OVER if stream.merge is None else LIVE_ONLY, app="rebalanced",
                     splits=stream.merge is not None)

    def _repartition(self, n_instances: int) -> None:
        """Bring the stopped query's state to ``n_instances`` partitions when its newest
        committed batch has another count (a move to a version for another N whose export
        batch committed): the batches planned after it are forgotten (the batch after the
        export, refused by the sink before it wrote anything, or the batch of a repartition
        whose driver died before committing it), then Spark rewrites the state offline,
        each instance label's state to the partition the label has under the new count."""
        held = checkpoint_partitions(self.checkpoint)
        if held is None or held == n_instances:
            return
        drop_uncommitted(self.checkpoint, set())
        _ = self.spark.streams     # the state store coordinator must exist in this session
        self.spark._streamingCheckpointManager.repartition(self.checkpoint, n_instances)

    def switch(self, version: int | None = None, timeout_seconds: float = 300.0) -> int:
        """Move to assignment ``version`` (default: the latest) with every moved key's
        state; returns the version the query runs with afterwards. A version for another
        N (scale out or in) moves every key whose instance label changes, then the query
        resumes with its state repartitioned to the new N."""
        spark, stream = self.spark, self.stream
        target = tables.read_assignment(spark, version, stream.tables_root)
        if target.version == self.version:
            return self.version
        _refuse_splits(target, stream)
        if target.n_instances != self.instances and stream.merge is not None:
            raise ContractError(f"assignment version {target.version} is for "
                                f"{target.n_instances} instances, the query runs "
                                f"{self.instances}; a change of N is not supported for a "
                                "processor with a merge (its split parts do not move)")
        keys = sorted(target.routing)
        params = pickle.dumps({"n_instances": int(target.n_instances)})
        markers = [(EXPORT, label, target.version, None, params, keys,
                    [int(target.routing[k]) for k in keys])
                   for label in instance_labels(self.instances)]
        (spark.createDataFrame(markers, CONTROL_STRUCT).coalesce(1).write.format("delta")
         .mode("append").option("txnAppId", f"{self.query.id}:export")
         .option("txnVersion", target.version).save(control_path(self.checkpoint)))
        self.resume()
        deadline = time.monotonic() + timeout_seconds
        while not self.sink.switched.wait(1.0):
            self._check_running()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no batch took the move to version {target.version} in "
                                   f"{timeout_seconds:.0f} s")
        self._finish_switch(deadline)
        return self.version

    def _check_running(self) -> None:
        if not self.query.isActive and not self.sink.switched.is_set():
            self.query.awaitTermination()   # raises the query's error

    def _finish_switch(self, deadline: float) -> None:
        """After the sink recorded a switch: once Spark committed its export batch, stop
        the query (its next batch is refused anyway) and resume it re-routed."""
        while (last_committed_batch(self.checkpoint) or -1) < self.sink.switched_at:
            if time.monotonic() > deadline:
                raise TimeoutError(f"batch {self.sink.switched_at} (a move) did not commit")
            time.sleep(0.2)
        self._stop_at_boundary()
        self._run(resume_version(self.spark, self.checkpoint, self.version))

    def _stop_at_boundary(self, timeout_seconds: float = 120.0) -> None:
        """Stop between two batches: the sink finishes the batch it writes and refuses the
        next; once Spark committed the last batch written, the query stops."""
        wait_committed(self.query, self.checkpoint, self.sink.gate.close(),
                       time.monotonic() + timeout_seconds)
        try:
            self.query.stop()
            self.query.awaitTermination()
        except Exception as exc:  # noqa: BLE001 - the refused batch after the move ends it
            if "SwitchBoundary" not in str(exc) and "follows the move" not in str(exc):
                raise

    def follow(self, poll_seconds: float = 5.0, stop: threading.Event | None = None) -> None:
        """Take every newly published assignment version until ``stop`` is set."""
        stop = stop or threading.Event()
        while not stop.is_set():
            if self.sink.switched.is_set():      # a move recovered at start completed
                self._finish_switch(time.monotonic() + 300)
            latest = tables.latest_assignment_version(self.spark, self.stream.tables_root)
            if latest != self.version:
                self.switch(latest)
            self._check_running()
            stop.wait(poll_seconds)

    def resume(self) -> None:
        """Start the query again if it ended (``trigger_seconds`` None: it stops once it
        processed what was available)."""
        if not self.query.isActive:
            self._stop_at_boundary()
            self._run(resume_version(self.spark, self.checkpoint, self.version))

    def process_all_available(self) -> None:
        """Block until everything available now is processed (moves under way finished).
        With ``trigger_seconds`` None, until the query ended."""
        while True:
            try:
                if self.trigger_seconds is None:
                    self.query.awaitTermination()
                elif self.stream.time_mode == "ProcessingTime":
                    wait_caught_up(self.query)
                else:
                    self.query.processAllAvailable()
            except Exception:  # noqa: BLE001 - the batch after a move is refused
                if not self.sink.switched.is_set():
                    raise
            if not self.sink.switched.is_set():
                return
            self._finish_switch(time.monotonic() + 300)

    def stop(self) -> None:
        if self.query is not None:
            self._stop_at_boundary()

@dataclass(frozen=True)
class _JobRecord:
    name: str
    tables_root: str | None

def wait_caught_up(query: StreamingQuery, timeout_seconds: float = 600.0) -> None:
    """Block until ``query`` processed every row its sources held when called.

    For a query whose operator runs a batch at every trigger (``transformWithState`` in
    ProcessingTime mode: processing-time timers and TTL), where Spark's
    ``processAllAvailable`` never returns. Every batch with an id above the newest one
    reported at the call was planned after the call; one of them that read no row (each
    source's start offset is its end offset) proves that the batches before it, which
    committed first, read everything."""
    last = query.lastProgress
    after = (last.batchId if last is not None else -1) + 2
    deadline = time.monotonic() + timeout_seconds
    while True:
        for p in query.recentProgress:
            if (p.batchId >= after and p.numInputRows == 0
                    and all(s.startOffset == s.endOffset for s in p.sources)):
                return
        if not query.isActive:
            query.awaitTermination()        # raises the query's error, if any
            raise RuntimeError(f"query {query.name} stopped before it caught up")
        if time.monotonic() > deadline:
            raise TimeoutError(f"query {query.name} did not catch up in {timeout_seconds:.0f} s")
        time.sleep(0.5)


def payload_of(row: Any) -> dict[str, Any]:
    """A control row's moved state, unpickled (for inspection and tests)."""
    return pickle.loads(row.payload)
