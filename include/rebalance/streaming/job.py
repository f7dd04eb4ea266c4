"""What both keyed jobs share, and the restartable job's own operator.

Shared: :class:`JobConfig`, the validation of raw events (:func:`quarantine_rows`,
:func:`valid_events`), the sources (:func:`read_events`: the Delta table ``events`` or a
Kafka topic), :class:`IdempotentSink` and :func:`sliding_results` (``window_results``).
The built-in job on ``rebalanced()`` is :mod:`rebalance.streaming.builtin`. The
restartable job (:mod:`rebalance.streaming.restart`) routes the valid rows by a
stream-static join with ``assignments`` (:func:`keyed_stream`) to
:class:`~rebalance.streaming.processor.KeyedWindowProcessor` and writes ``results``, the
histograms and :func:`window_results` (:class:`KeyedOutputWriter`). Details:
``docs/streaming.md``; the Kafka source: ``docs/kafka.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from rebalance.spark import tables
from rebalance.spark.paths import data_dir
from rebalance.spark.tables import RAW_EVENT_DDL
from rebalance.streaming.processor import (
    HANDOFF_COLUMNS_DDL,
    INSTANCE_HISTOGRAM,
    KEY_HISTOGRAM,
    OUTPUT_DDL,
    RESULT,
    KeyedWindowProcessor,
    ProcessorSettings,
)
from rebalance.streaming.routing import route

#: Columns of a handoff row besides the operator's input columns (NULL on event rows).
HANDOFF_NAMES = [c.split()[0] for c in HANDOFF_COLUMNS_DDL.split(", ")]

#: Where the raw events come from (:func:`read_events`).
SOURCES = ("delta", "kafka")


class JobError(ValueError):
    """The job cannot start with this configuration (with the reason)."""


@dataclass(frozen=True)
class JobConfig:
    """Parameters of the keyed job (plain values, validated here).

    ``trigger_seconds=None`` processes what is available and stops
    (availableNow); a number runs micro-batches at that interval until stopped.
    ``work`` is called in the operator with the cost of each group of events (the
    benchmarks' simulated CPU work, which makes task time follow load; it must pickle
    for the executors). Tables live under
    ``tables_root`` and checkpoints under ``checkpoint_root/<name>``. ``dedup`` drops
    events whose ``event_id`` their key saw within the watermark (in the keyed operator,
    counted per instance and window); the state layout is the same either way, so it can
    be switched on or off for an existing checkpoint.
    """

    n_instances: int = 4
    window_seconds: float = 10.0
    n_windows: int = 6
    watermark_seconds: float = 10.0
    emit_histograms: bool = True
    work: Callable[[float], None] | None = None
    max_files_per_trigger: int | None = None
    trigger_seconds: float | None = None
    name: str = "keyed"
    tables_root: str | None = None
    checkpoint_root: str | None = None
    source: str = "delta"
    bootstrap_servers: str | None = None
    topic: str | None = None
    max_offsets_per_trigger: int | None = None
    dedup: bool = True
    #: merge each closed window's partials into ``window_results`` (needs the histograms)
    window_results: bool = True

    def __post_init__(self) -> None:
        checks = [
            (isinstance(self.n_instances, Integral) and self.n_instances >= 1,
             "n_instances must be an integer >= 1"),
            (self.window_ms >= 1, "window_seconds must be at least 1 ms"),
            (self.n_windows >= 1, "n_windows must be >= 1"),
            (self.watermark_seconds >= 0, "watermark_seconds must be >= 0"),
            (self.work is None or callable(self.work), "work must be callable or None"),
            (self.max_files_per_trigger is None or self.max_files_per_trigger >= 1,
             "max_files_per_trigger must be >= 1"),
            (self.trigger_seconds is None or self.trigger_seconds > 0,
             "trigger_seconds must be > 0"),
            (bool(self.name) and self.name.replace("-", "").replace("_", "").isalnum(),
             "name must be letters, digits, '-' or '_'"),
            (self.source in SOURCES, f"source must be one of {', '.join(SOURCES)}"),
            (self.source != "kafka" or bool(self.bootstrap_servers and self.topic),
             "source kafka needs bootstrap_servers (HOST:PORT) and topic"),
            (self.source == "kafka" or not (self.bootstrap_servers or self.topic),
             "bootstrap_servers and topic are for source kafka"),
            (self.max_offsets_per_trigger is None or self.max_offsets_per_trigger >= 1,
             "max_offsets_per_trigger must be >= 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise JobError(f"{message}, got {self}")

    @property
    def window_ms(self) -> int:
        return int(round(self.window_seconds * 1000)) if math.isfinite(self.window_seconds) else 0

    def checkpoint(self, query: str) -> str:
        root = Path(self.checkpoint_root) if self.checkpoint_root else data_dir() / "checkpoints"
        return str(root / self.name / query)

    def processor_settings(self) -> ProcessorSettings:
        return ProcessorSettings(self.n_instances, self.window_ms, self.n_windows,
                                 self.emit_histograms, self.work, bool(self.dedup),
                                 int(self.watermark_seconds * 1000))


# --------------------------------------------------------------------------- validation

def rejection_reason() -> Column:
    """Why a raw event is malformed: ';'-separated reasons, NULL for a valid event."""
    value, cost, event_time = _parsed("value"), _parsed("cost"), _parsed("event_time")
    checks = [
        ("missing_event_id", _blank("event_id")),
        ("missing_key", _blank("key")),
        ("missing_value", _blank("value")),
        ("non_numeric_value", ~_blank("value") & value.isNull()),
        ("negative_value", value < 0),
        ("non_finite_value", F.isnan(value) | (F.abs(value) == float("inf"))),
        ("missing_cost", _blank("cost")),
        ("non_numeric_cost", ~_blank("cost") & cost.isNull()),
        ("invalid_cost", (cost < 0) | F.isnan(cost) | (F.abs(cost) == float("inf"))),
        ("missing_event_time", _blank("event_time")),
        ("unparseable_event_time", ~_blank("event_time") & event_time.isNull()),
    ]
    reasons = F.concat_ws(";", *[F.when(test, F.lit(name)) for name, test in checks])
    return F.when(reasons != "", reasons)


def _blank(column: str) -> Column:
    return F.col(column).isNull() | (F.trim(F.col(column)) == "")


def _parsed(column: str) -> Column:
    kind = "timestamp" if column == "event_time" else "double"
    return F.trim(F.col(column)).try_cast(kind)


def quarantine_rows(raw: DataFrame) -> DataFrame:
    """Malformed raw events with their ``reason`` (the ``quarantine`` table's columns)."""
    return raw.withColumn("reason", rejection_reason()).where(F.col("reason").isNotNull())


def valid_events(raw: DataFrame) -> DataFrame:
    """Well-formed events, typed: event_id, key, value DOUBLE, cost DOUBLE, event_time TIMESTAMP."""
    return raw.where(rejection_reason().isNull()).select(
        "event_id", "key", _parsed("value").alias("value"), _parsed("cost").alias("cost"),
        _parsed("event_time").alias("event_time"))


# --------------------------------------------------------------------------- sources

@contextmanager
def kafka_admin(jvm, bootstrap_servers: str, timeout_seconds: int = 60):
    """Kafka's admin client in the driver's JVM ``jvm`` (the ``kafka-clients`` JAR Spark's
    Kafka source ships), closed on exit."""
    props = jvm.java.util.Properties()
    props.setProperty("bootstrap.servers", bootstrap_servers)
    props.setProperty("request.timeout.ms", str(timeout_seconds * 1000))
    admin = jvm.org.apache.kafka.clients.admin.AdminClient.create(props)
    try:
        yield admin
    finally:
        admin.close()


def kafka_partitions(spark: SparkSession, bootstrap_servers: str, topic: str,
                     timeout_seconds: int = 60) -> list[int] | None:
    """The partition numbers ``topic`` has now, asked of the broker (:func:`kafka_admin`).
    None without a JVM in this process (a Spark Connect client)."""
    try:
        jvm = spark.sparkContext._jvm
    except Exception:  # noqa: BLE001 - Spark Connect: no SparkContext here
        return None
    if jvm is None:
        return None
    with kafka_admin(jvm, bootstrap_servers, timeout_seconds) as admin:
        try:
            described = (admin.describeTopics(jvm.java.util.Collections.singletonList(topic))
                         .allTopicNames()
                         .get(timeout_seconds, jvm.java.util.concurrent.TimeUnit.SECONDS))
            return sorted(int(info.partition()) for info in described.get(topic).partitions())
        except Exception as exc:  # noqa: BLE001 - py4j wraps the broker's answer
            raise JobError(f"cannot list the partitions of Kafka topic {topic!r} at "
                           f"{bootstrap_servers}: {str(exc).splitlines()[0][:300]}") from None


def read_events(spark: SparkSession, config: JobConfig,
                starting_offsets: dict | None = None) -> DataFrame:
    """The raw event stream (the ``events`` table's string columns) of ``config.source``.

    Kafka: the topic from its earliest offset, or from ``starting_offsets`` (``{topic:
    {partition: offset}}``, a restart's new checkpoint; a checkpoint resumes from its own
    offsets);
    the message value is parsed as a JSON object of the ``events`` fields (numbers are
    taken as their text), the message key stands for a missing ``key`` field. A value
    that is not such an object gives NULL fields, so it is quarantined with the reasons
    of the missing fields, like any other malformed event.
    """
    if config.source == "kafka":
        import json

        if starting_offsets:
            from rebalance.streaming.restart.checkpoint import with_new_partitions

            partitions = kafka_partitions(spark, config.bootstrap_servers, config.topic)
            if partitions is not None:
                starting_offsets = with_new_partitions(starting_offsets, config.topic, partitions)
        reader = (spark.readStream.format("kafka")
                  .option("kafka.bootstrap.servers", config.bootstrap_servers)
                  .option("subscribe", config.topic)
                  .option("startingOffsets", json.dumps(starting_offsets)
                          if starting_offsets else "earliest"))
        if config.max_offsets_per_trigger:
            reader = reader.option("maxOffsetsPerTrigger", config.max_offsets_per_trigger)
        messages = reader.load()
        event = F.from_json(F.col("value").cast("string"), RAW_EVENT_DDL,
                            {"mode": "PERMISSIVE"}).alias("e")
        parsed = messages.select(event, F.col("key").cast("string").alias("message_key"))
        return parsed.select(
            *[F.coalesce("e.key", "message_key").alias(name) if name == "key"
              else F.col(f"e.{name}").alias(name)
              for name in (c.split()[0] for c in RAW_EVENT_DDL.split(", "))])
    root = config.tables_root
    if not tables.exists(spark, tables.EVENTS, root):
        raise JobError(f"no events table at {tables.EVENTS.path(root)}; generate events first")
    reader = events_reader(spark)
    if config.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.max_files_per_trigger)
    return reader.load(tables.EVENTS.path(root))


def events_reader(spark: SparkSession):
    """A stream reader of the Delta ``events`` table that skips change commits.

    ``events`` is append-only. The only commits that remove its files are the maintenance
    DAG's expiry of old, long-processed events (``events_retention_days``). A Delta stream
    stops at such a commit unless it skips it. Skipping never drops a new event: an append
    is not a change commit. Skipping also never re-reads an old one: the rows a DELETE
    rewrites are not delivered again. OPTIMIZE commits (``dataChange`` false) are skipped
    by any Delta stream anyway."""
    return spark.readStream.format("delta").option("skipChangeCommits", "true")


# --------------------------------------------------------------------------- keyed query

def window_start_ms(event_time: Column, window_ms: int) -> Column:
    """Start (epoch ms) of the tumbling window of ``window_ms`` holding ``event_time``."""
    ms = F.unix_millis(event_time)
    return (ms - F.pmod(ms, F.lit(window_ms))).cast("bigint")


def keyed_stream(spark: SparkSession, raw: DataFrame, config: JobConfig,
                 assignment_version: int | None = None,
                 initial_state: DataFrame | None = None,
                 assignment_rows: DataFrame | None = None,
                 handoff: DataFrame | None = None) -> DataFrame:
    """The stateful part: valid events, routed, through the keyed operator (union output).

    By default every micro-batch routes by the latest assignment version (live
    switch); ``assignment_version`` pins one version instead, and
    ``assignment_rows`` replaces the routing rows altogether (a restart
    generation, :func:`rebalance.streaming.routing.follow_assignment_rows`).
    ``initial_state`` (rows of
    :data:`~rebalance.streaming.processor.INITIAL_STATE_DDL`) seeds the operator's
    state in the first batch of a new checkpoint. ``handoff`` (a stream of
    :func:`handoff_columns` rows) hands keys' state over between labels inside the
    stream (a restart that keeps its checkpoint).
    """
    events = valid_events(raw).withWatermark(
        "event_time", f"{int(config.watermark_seconds * 1000)} milliseconds")
    if assignment_rows is None:
        assignment_rows = tables.assignment_rows(spark, config.tables_root, assignment_version)
    routed = route(events, assignment_rows, config.n_instances)
    operator_input = routed.select(
        "label", "key", "value", "cost", "event_time", "instance", "default_instance",
        "key_group", "assignment_version",
        window_start_ms(F.col("event_time"), config.window_ms).alias("window_start_ms"),
        "event_id", F.unix_millis("event_time").alias("event_time_ms"))
    if handoff is not None:
        nulls = [F.lit(None).cast(kind).alias(name) for name, kind in
                 (c.split(" ", 1) for c in HANDOFF_COLUMNS_DDL.split(", "))]
        given = set(handoff.columns)
        handed = handoff.select(
            *[F.col(f.name) if f.name in given else F.lit(None).cast(f.dataType).alias(f.name)
              for f in operator_input.schema.fields], *HANDOFF_NAMES)
        operator_input = operator_input.select("*", *nulls).unionByName(handed)
    processor = KeyedWindowProcessor(config.processor_settings())
    if initial_state is not None:
        return operator_input.groupBy("label").transformWithStateInPandas(
            processor, OUTPUT_DDL, "Append", "EventTime",
            initialState=initial_state.groupBy("label"))
    return operator_input.groupBy("label").transformWithStateInPandas(
        processor, OUTPUT_DDL, "Append", "EventTime")


def _window_start() -> Column:
    return F.timestamp_millis(F.col("window_start_ms")).alias("window_start")


#: What each output kind of the operator becomes: (kind, table, projection given batch id).
OUTPUTS: tuple[tuple[str, tables.Table, Callable[[int], list[Column]]], ...] = (
    (RESULT, tables.RESULTS, lambda batch_id: [
        F.lit(batch_id).cast("bigint").alias("batch_id"), "assignment_version", _window_start(),
        "key", "instance", "partition_id", "events", "count", "sum", "sliding_count",
        "sliding_sum", F.lit(None).cast("boolean").alias("final")]),
    (KEY_HISTOGRAM, tables.KEY_HISTOGRAMS, lambda batch_id: [
        _window_start(), "key", "count", "cost", "state_bytes", "instance", "default_instance",
        "key_group", "partition_id", "assignment_version",
        F.lit(batch_id).cast("bigint").alias("batch_id")]),
    (INSTANCE_HISTOGRAM, tables.INSTANCE_HISTOGRAMS, lambda batch_id: [
        _window_start(), "instance", "load", "events", "keys", "task_ms", "cpu_ms", "partition_id",
        "assignment_version", F.lit(batch_id).cast("bigint").alias("batch_id"), "duplicates"]),
)


def window_results(spark: SparkSession, key_rows: DataFrame, config: JobConfig,
                   first_window_ms: int, batch_id: int) -> DataFrame:
    """One final row per (window, key) closed in a micro-batch, from its key-histogram rows.

    Every instance closes a window in the same micro-batch (the watermark is the query's),
    so the batch holds every partial of the windows it closes: the shares of a split key,
    the two instances of a key a live switch moved mid-window. Count, sum and cost are
    their sums (:func:`sliding_results`)."""
    closed = (key_rows.groupBy("window_start_ms", "key")
              .agg(F.sum("count").alias("count"), F.sum("sum").alias("sum"),
                   F.sum("cost").alias("cost"), F.count(F.lit(1)).cast("int").alias("instances"),
                   F.max("assignment_version").alias("assignment_version")))
    return sliding_results(spark, closed, config, first_window_ms, batch_id)


def sliding_results(spark: SparkSession, closed: DataFrame, config: JobConfig,
                    first_window_ms: int, batch_id: int) -> DataFrame:
    """``window_results`` rows of the windows a micro-batch closes (``closed``: one row per
    window and key with ``window_start_ms``, ``key``, ``count``, ``sum``, ``cost``,
    ``instances``, ``assignment_version``; the earliest window ``first_window_ms``).

    The sliding count and sum add the rows of the ``w - 1`` windows before, read back from
    ``window_results`` (closed in earlier batches) or from this batch. A replay computes
    the same rows: the earlier windows it reads are committed and never change."""
    closed = closed.withColumn("_closed", F.lit(True))
    span = (config.n_windows - 1) * config.window_ms
    rows = closed
    if span > 0:
        since = F.timestamp_millis(F.lit(first_window_ms - span))
        before = F.timestamp_millis(F.lit(first_window_ms))
        earlier = (tables.read(spark, tables.WINDOW_RESULTS, config.tables_root)
                   .where((F.col("window_start") >= since) & (F.col("window_start") < before))
                   .select(F.unix_millis("window_start").alias("window_start_ms"), "key",
                           "count", "sum")
                   .join(closed.select("key").distinct(), "key", "left_semi")
                   .withColumn("_closed", F.lit(False)))
        rows = closed.unionByName(earlier, allowMissingColumns=True)
    sliding = Window.partitionBy("key").orderBy("window_start_ms").rangeBetween(-span, 0)
    return (rows.withColumn("sliding_count", F.sum("count").over(sliding))
            .withColumn("sliding_sum", F.sum("sum").over(sliding))
            .where(F.col("_closed"))
            .select(_window_start(), "key", "count", "sum", "cost", "sliding_count",
                    "sliding_sum", "instances", "assignment_version",
                    F.lit(batch_id).cast("bigint").alias("batch_id")))


@dataclass
class IdempotentSink:
    """Appends of one query's micro-batches, each exactly once.

    Every append is the Delta transaction ``(<query id>:<table>, batch id)``: a
    batch replayed after a failure or restart re-writes nothing that was
    already committed. The query id lives in the checkpoint, so a new
    checkpoint never collides with an old one's transactions. Empty outputs
    are not written (a replay makes the same decision).

    ``batch_offset`` numbers the query's batches on from an earlier query: the
    ``batch_id`` written (column and commit metadata) is ``batch_offset + batch
    id``, so the batches of successive restart generations keep one order. The
    transaction stays (query id, batch id of this query).
    """

    spark: SparkSession
    config: JobConfig
    query_name: str
    batch_offset: int = 0
    _query_id: str | None = field(default=None, init=False)

    def append(self, rows: DataFrame, table: tables.Table, batch_id: int,
               count: int | None = None) -> None:
        """``count``: at most this many rows (few go through delta-rs, :func:`tables.append`)."""
        meta = {"job": self.config.name, "query": self.query_name,
                "batch_id": self.batch_offset + batch_id,
                "n_instances": self.config.n_instances,
                "window_seconds": self.config.window_seconds}
        tables.append(rows.coalesce(1), table, self.config.tables_root, metadata=meta,
                      txn=(f"{self.query_id()}:{table.name}", batch_id), rows=count)

    def query_id(self) -> str:
        if self._query_id is None:
            active = [q for q in self.spark.streams.active if q.name == self.query_name]
            if not active:
                raise JobError(f"query {self.query_name!r} is not active")
            self._query_id = active[0].id
        return self._query_id


class KeyedOutputWriter(IdempotentSink):
    """``foreachBatch`` of the keyed query: results and histograms, appended in parallel."""

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            kinds = batch.groupBy("kind").agg(F.max("assignment_version").alias("version"),
                                              F.min("window_start_ms").alias("first"),
                                              F.count(F.lit(1)).alias("rows")).collect()
            versions = {row.kind: row.version for row in kinds}
            counts = {row.kind: row.rows for row in kinds}
            self.before_write(batch, batch_id, versions)
            global_id = self.batch_offset + batch_id
            writes = [(batch.where(F.col("kind") == kind).select(projection(global_id)), table,
                       counts[kind]) for kind, table, projection in OUTPUTS if kind in counts]
            if KEY_HISTOGRAM in counts and self.config.window_results:
                first = next(row.first for row in kinds if row.kind == KEY_HISTOGRAM)
                # at most one row per key-histogram row
                writes.append((window_results(
                    self.spark, batch.where(F.col("kind") == KEY_HISTOGRAM), self.config,
                    int(first), global_id), tables.WINDOW_RESULTS, counts[KEY_HISTOGRAM]))
            if writes:
                with ThreadPoolExecutor(max_workers=len(writes)) as pool:
                    list(pool.map(lambda w: self.append(*w[:2], batch_id, w[2]), writes))
            self.after_write(batch, batch_id, versions)
        finally:
            batch.unpersist()

    def before_write(self, batch: DataFrame, batch_id: int,
                     versions: dict[str, int | None]) -> None:
        """Hook before anything of the batch is written (``versions``: output kind -> the
        largest assignment version its rows record); raising refuses the batch."""

    def after_write(self, batch: DataFrame, batch_id: int,
                    versions: dict[str, int | None]) -> None:
        """Hook after every output of the batch was written (before Spark commits it)."""
