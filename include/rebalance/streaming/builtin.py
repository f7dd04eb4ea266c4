"""The built-in keyed job on the public API: :class:`SlidingWindows` under ``rebalanced()``.

Two streaming queries read the raw events (the Delta table ``events`` or a Kafka topic,
:func:`~rebalance.streaming.job.read_events`): ``<name>-quarantine`` writes the rows
failing validation to ``quarantine``; ``<name>-rebalanced`` runs the valid events through
:func:`~rebalance.streaming.rebalanced.rebalanced` with the built-in processor
:class:`~rebalance.streaming.sliding.SlidingWindows` (sliding count and sum per key,
duplicates dropped), exactly as a user's own processor runs. The rebalancer writes the
histograms; this module writes the processor's rows to ``results`` and each closed
window's row, with its sliding aggregate, to ``window_results``, each append an
idempotent Delta transaction. Details: ``docs/streaming.md``.

>>> job = start_job(spark, JobConfig(n_instances=4))   # doctest: +SKIP
>>> job.process_all_available(); job.stop()             # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from rebalance.spark import tables
from rebalance.streaming.job import (
    IdempotentSink,
    JobConfig,
    JobError,
    quarantine_rows,
    read_events,
    sliding_results,
    valid_events,
)
from rebalance.streaming.keyed_state import ContractError
from rebalance.streaming.merge import Merge
from rebalance.streaming.rebalanced import RebalancedQuery, rebalanced
from rebalance.streaming.sliding import SLIDING_SCHEMA, SlidingWindows

#: A split key's rows merge by summing its parts: each part holds the key's events of the
#: window that went to its instance. Events of a split key go to a part by the hash of
#: ``event_id``, so a retried event meets the first copy's id in the same part.
SLIDING_MERGE = Merge(on=("key", "window_start", "final"),
                      sum=("events", "count", "sum", "sliding_count", "sliding_sum"),
                      split_by="event_id")


class WorkedSlidingWindows(SlidingWindows):
    """:class:`SlidingWindows` that first calls ``work`` with the cost of each key's events
    (the benchmarks' simulated CPU work, :attr:`JobConfig.work`)."""

    def __init__(self, window_ms: int, n_windows: int, dedup_ms: int | None,
                 work: Callable[[float], None]) -> None:
        super().__init__(window_ms, n_windows, dedup_ms)
        self.work = work

    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame],
                        timerValues) -> Iterator[pd.DataFrame]:
        frames = list(rows)
        self.work(float(sum(f["cost"].sum() for f in frames)))
        return super().handleInputRows(key, iter(frames), timerValues)


def processor(config: JobConfig) -> SlidingWindows:
    """The built-in processor of ``config``: its windows, duplicates dropped within the
    watermark when ``dedup``."""
    dedup = int(config.watermark_seconds * 1000) if config.dedup else None
    if config.work is None:
        return SlidingWindows(config.window_ms, config.n_windows, dedup)
    return WorkedSlidingWindows(config.window_ms, config.n_windows, dedup, config.work)


@dataclass
class ResultsWriter(IdempotentSink):
    """The output of the built-in processor under ``rebalanced()``: every row to
    ``results``; the final rows (one per key and closed window, a split key's parts
    merged) to ``window_results``, their sliding aggregate taken over the key's final rows
    of the windows before (:func:`~rebalance.streaming.job.sliding_results`), which is
    exact also for a key whose parts ran on several instances."""

    query: RebalancedQuery | None = None
    #: set once :attr:`query` is (a batch may run before ``start`` returns)
    started: threading.Event = field(default_factory=threading.Event)

    def __call__(self, rows: DataFrame, batch_id: int) -> None:
        rows.persist()
        try:
            kinds = {r.final: r for r in rows.groupBy("final").agg(
                F.count(F.lit(1)).alias("rows"),
                F.min(F.unix_millis("window_start")).alias("first")).collect()}
            self.started.wait(120)
            version = self.query.version_of(batch_id)
            if kinds:
                self.append(rows.select(
                    F.lit(batch_id).cast("bigint").alias("batch_id"),
                    F.lit(version).cast("bigint").alias("assignment_version"),
                    "window_start", "key", F.lit(None).cast("int").alias("instance"),
                    F.lit(None).cast("int").alias("partition_id"), "events", "count", "sum",
                    "sliding_count", "sliding_sum", "final"), tables.RESULTS, batch_id,
                    sum(r.rows for r in kinds.values()))
            if True in kinds and self.config.window_results:
                closed = rows.where("final").select(
                    F.unix_millis("window_start").alias("window_start_ms"), "key", "count",
                    "sum", F.lit(None).cast("double").alias("cost"),
                    F.lit(None).cast("int").alias("instances"),
                    F.lit(version).cast("bigint").alias("assignment_version"))
                self.append(sliding_results(self.spark, closed, self.config,
                                            int(kinds[True].first), batch_id),
                            tables.WINDOW_RESULTS, batch_id, kinds[True].rows)
        finally:
            rows.unpersist()


class QuarantineWriter(IdempotentSink):
    """``foreachBatch`` of the quarantine query (most batches have nothing to quarantine)."""

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        batch.persist()
        try:
            count = batch.count()
            if count:
                self.append(batch, tables.QUARANTINE, batch_id, count)
        finally:
            batch.unpersist()


@dataclass
class KeyedJob:
    """The job's two running queries: the rebalanced one and the quarantine."""

    rebalanced: RebalancedQuery
    quarantine: StreamingQuery
    _follower: threading.Thread | None = field(default=None, init=False, repr=False)
    _following: threading.Event = field(default_factory=threading.Event, init=False,
                                        repr=False)

    @property
    def keyed(self) -> StreamingQuery:
        """The Spark query the rebalanced query runs now (a move starts a new one)."""
        return self.rebalanced.query

    @property
    def queries(self) -> tuple[StreamingQuery, StreamingQuery]:
        return self.keyed, self.quarantine

    def process_all_available(self) -> None:
        """Take the latest published assignment (moving what it moves), then block until
        both queries processed everything available now."""
        if self.rebalanced.trigger_seconds is not None:
            self.rebalanced.switch()
        self.rebalanced.process_all_available()
        if self.rebalanced.trigger_seconds is None:
            self.quarantine.awaitTermination()
        else:
            self.quarantine.processAllAvailable()

    def await_termination(self, poll_seconds: float = 2.0) -> None:
        """Run until stopped, taking each newly published assignment; when a query fails,
        stop the other and raise its error. A job started with ``trigger_seconds`` None
        ends once both queries processed what was available."""
        try:
            if self.rebalanced.trigger_seconds is None:
                self.rebalanced.process_all_available()
                self.quarantine.awaitTermination()
                return
            stop = threading.Event()
            watch = threading.Thread(target=self._watch_quarantine, args=(stop, poll_seconds),
                                     daemon=True)
            watch.start()
            try:
                self.rebalanced.follow(poll_seconds, stop)
            finally:
                stop.set()
            self.quarantine.awaitTermination()     # raises its error, if it failed
        except BaseException:
            self.stop()
            raise

    def _watch_quarantine(self, stop: threading.Event, poll_seconds: float) -> None:
        while not stop.wait(poll_seconds):
            if not self.quarantine.isActive:
                stop.set()

    def follow_in_background(self, poll_seconds: float = 2.0) -> None:
        """Take each newly published assignment from a thread of its own, until
        :meth:`stop` (for a caller that runs something else meanwhile, as ``make demo``
        runs the DAG)."""
        self._following = threading.Event()
        self._follower = threading.Thread(
            target=self.rebalanced.follow, args=(poll_seconds, self._following),
            name=f"{self.rebalanced.name}-follow", daemon=True)
        self._follower.start()

    def stop(self) -> None:
        if self._follower is not None:
            self._following.set()
            self._follower.join(timeout=600)
        self.rebalanced.stop()
        self.quarantine.stop()


def start_job(spark: SparkSession, config: JobConfig) -> KeyedJob:
    """Start the quarantine query and the rebalanced query; return them running.

    The rebalanced query records its start in the ``jobs`` table (capability ``live``: its
    processor merges, so a moved key's state stays where it is; splits allowed): ``apply``
    publishes each plan for a live switch, which the query takes at its next
    ``process_all_available`` or while it runs :meth:`KeyedJob.await_termination`.
    Checkpoints: ``<checkpoint_root>/<name>/keyed`` and ``.../quarantine``."""
    if not config.emit_histograms:
        raise JobError("the keyed job always writes its histograms (rebalanced() measures "
                       "every key); --no-histograms is for restartable_job.py")
    raw = read_events(spark, config)
    for table in (tables.QUARANTINE, tables.RESULTS, tables.WINDOW_RESULTS):
        tables.ensure_table(spark, table, config.tables_root)
    events = valid_events(raw).withWatermark(
        "event_time", f"{int(config.watermark_seconds * 1000)} milliseconds")
    try:
        stream = rebalanced(events, key="key", processor=processor(config),
                            output_schema=SLIDING_SCHEMA, time_mode="EventTime",
                            event_time="event_time", cost="cost", job=config.name,
                            instances=config.n_instances, tables_root=config.tables_root,
                            window_seconds=config.window_seconds, merge=SLIDING_MERGE)
    except ContractError as exc:
        raise JobError(str(exc)) from None
    writer = ResultsWriter(spark, config, f"{config.name}-rebalanced")
    quarantine = _start_quarantine(quarantine_rows(raw), config)
    query = stream.start(writer, config.checkpoint("keyed"), config.trigger_seconds)
    writer.query = query
    writer.started.set()
    return KeyedJob(query, quarantine)


def _start_quarantine(rows: DataFrame, config: JobConfig) -> StreamingQuery:
    name = f"{config.name}-quarantine"
    writer = (rows.writeStream.queryName(name)
              .foreachBatch(QuarantineWriter(rows.sparkSession, config, name))
              .option("checkpointLocation", config.checkpoint("quarantine")))
    if config.trigger_seconds is None:
        return writer.trigger(availableNow=True).start()
    return writer.trigger(processingTime=f"{config.trigger_seconds} seconds").start()
