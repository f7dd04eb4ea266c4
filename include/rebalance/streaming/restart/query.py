"""The keyed query of one generation: its sources, routing, operator and sink."""

from __future__ import annotations

import dataclasses
import threading

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalance.spark import tables
from rebalance.streaming.job import JobConfig, events_reader, keyed_stream, read_events
from rebalance.streaming.restart.checkpoint import routing_log
from rebalance.streaming.restart.control import Generation
from rebalance.streaming.restart.sink import GatedWriter, VersionGuard
from rebalance.streaming.restart.state import ensure_handoff_table


def generation_query(spark: SparkSession, config: JobConfig, gen: Generation,
                     assignment_rows: DataFrame, guard: VersionGuard | None,
                     ) -> tuple[DataFrame, GatedWriter]:
    """The streaming DataFrame of a generation and its sink (nothing starts here).

    Events: the Delta table ``events`` from where the generation's checkpoint started
    (``startingVersion``, minus files already processed), or the Kafka topic from the
    generation's ``kafka_offsets`` (the old checkpoint's last committed offsets), minus
    events late for the old watermark; a resumed checkpoint goes on from its own
    offsets; unioned with the
    checkpoint's handoff table; routed by ``assignment_rows``; the keyed operator,
    seeded with the checkpoint's initial state, if any.
    """
    config = dataclasses.replace(config, n_instances=gen.n_instances)
    if config.source == "kafka":
        # From the old checkpoint's last committed offsets (a new checkpoint of a restart),
        # else the earliest; a checkpoint that exists resumes from its own offsets.
        raw = read_events(spark, config, starting_offsets=gen.source.get("kafka_offsets"))
    else:
        raw = delta_events(spark, config, gen)
    raw = raw.select(*tables.EVENTS.columns)
    min_ms = gen.source.get("min_event_ms")
    if min_ms:
        # Late for the old generation's watermark: dropped, as it would have dropped them.
        parsed = F.unix_millis(F.trim(F.col("event_time")).try_cast("timestamp"))
        raw = raw.where(parsed.isNull() | (parsed > F.lit(int(min_ms))))
    handoff = spark.readStream.format("delta").load(ensure_handoff_table(spark, gen.checkpoint))
    initial = spark.read.parquet(gen.state_path) if gen.state_path else None
    stream = keyed_stream(spark, raw, config, gen.assignment_version, initial,
                          assignment_rows=assignment_rows, handoff=handoff)
    sink = GatedWriter(spark, config, f"{config.name}-keyed", gen.batch_offset, guard=guard,
                       log_folder=routing_log(gen.checkpoint),
                       handoff_path=ensure_handoff_table(spark, gen.checkpoint))
    return stream, sink


def delta_events(spark: SparkSession, config: JobConfig, gen: Generation) -> DataFrame:
    """The Delta table ``events`` from the generation's ``startingVersion``, minus the
    files of that version the old checkpoint already processed."""
    reader = events_reader(spark).option("startingVersion",
                                         int(gen.source.get("starting_version", 0)))
    if config.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", config.max_files_per_trigger)
    raw = reader.load(tables.EVENTS.path(config.tables_root))
    excluded = list(gen.source.get("exclude_files") or [])
    if excluded:
        # The Delta streaming source has no _metadata column; input_file_name() works.
        file_name = F.element_at(F.split(F.input_file_name(), "/"), -1)
        raw = raw.where(~file_name.isin(excluded))
    return raw


class Background(threading.Thread):
    """Runs one call in a thread; :meth:`join` re-raises its error."""

    def __init__(self, call) -> None:
        super().__init__(daemon=True)
        self.call, self.error = call, None
        self.start()

    def run(self) -> None:
        try:
            self.call()
        except BaseException as exc:  # noqa: BLE001 - re-raised by join()
            self.error = exc

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error
