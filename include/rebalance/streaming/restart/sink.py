"""The restartable job's sink: a gate that stops a generation at a micro-batch boundary,
and a guard of the assignment versions a generation follows live."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rebalance.spark import tables
from rebalance.streaming.boundary import BoundaryGate
from rebalance.streaming.job import KeyedOutputWriter
from rebalance.streaming.processor import EXPORTED, HANDOFF, HANDOFF_IN, RESULT
from rebalance.streaming.restart.state import handoff_frame
from rebalance.streaming.routing import follow_assignment_rows

log = logging.getLogger(__name__)


class StoppedAtBoundary(RuntimeError):
    """Raised by the sink when a batch starts after the gate closed: nothing was written."""


class HeldForRestart(StoppedAtBoundary):
    """Raised by the sink when a batch was routed by a version the generation must not
    follow (published for a controlled restart, or for another N): nothing was written."""


def blocks(metadata: dict[str, Any], n_instances: int) -> bool:
    """Whether a generation of ``n_instances`` must not follow a published version live:
    it was published for a controlled restart (``apply_mode`` restart) or for another N."""
    return (metadata.get("apply_mode") == "restart"
            or int(metadata.get("n_instances", n_instances)) != n_instances)


@dataclass
class VersionGuard:
    """Which assignment versions a running generation follows (live switch) and which not.

    ``in_force`` is the version the last written batch was routed by; a batch routed
    by a newer version is written only when that version may be followed
    (:func:`blocks`), and never by an older one (a pinned fallback behind a live switch).
    """

    spark: SparkSession
    root: str | None
    n_instances: int
    in_force: int
    requested: set[int] = field(default_factory=set)
    metadata: dict[int, dict[str, Any]] = field(default_factory=dict)

    def blocked_versions(self, refresh: bool = True) -> list[int]:
        """Published versions after the one in force that must not be followed (``refresh``:
        read the table's history first; without, what ``metadata`` holds)."""
        if refresh:
            self._refresh()
        return sorted(v for v in set(self.metadata) | self.requested
                      if v > self.in_force and not self.followable(v))

    def followable(self, version: int) -> bool:
        if version == self.in_force:
            return True
        if version < self.in_force or version in self.requested:
            return False
        if version not in self.metadata:
            self._refresh()
        return not blocks(self.metadata.get(version, {}), self.n_instances)

    def _refresh(self) -> None:
        """Read the publishes not read yet: only those after the version in force matter,
        and the history is read from the newest known on (its cost stays flat as the table
        ages)."""
        if tables.exists(self.spark, tables.ASSIGNMENTS, self.root):
            after = max([self.in_force, *self.metadata])
            for commit in tables.assignment_history(self.spark, self.root, after=after):
                self.metadata[int(commit.version)] = commit.metadata


@dataclass
class GatedWriter(KeyedOutputWriter):
    """The keyed sink behind a :class:`BoundaryGate`; with a :class:`VersionGuard`, a batch
    routed by a version the generation must not follow is refused (:class:`HeldForRestart`)
    and every change of the version in force is logged (:func:`routing_log`)."""

    gate: BoundaryGate = field(default_factory=BoundaryGate)
    guard: VersionGuard | None = None
    log_folder: Path | None = None
    held: int | None = None
    #: Batches that passed the gate and the guard (they may have written output).
    written: set[int] = field(default_factory=set)
    #: The checkpoint's handoff table, and the batch that exported state (if any).
    handoff_path: str | None = None
    exported: int | None = None

    def _hand_over(self, batch: DataFrame, batch_id: int) -> None:
        """Write the exported state to the handoff table as ``in`` rows for the keys' new
        labels (read by the next generation's first batch), once per batch."""
        rows = batch.where(F.col("kind") == HANDOFF).select(
            "label", "key", "key_group", "default_instance", "assignment_version",
            F.lit(HANDOFF_IN).alias("handoff"), "merge", "state_version", "windows",
            "counts", "sums", "costs", "seen_ids", "seen_times", "export_watermark_ms")
        (handoff_frame(self.spark, rows).coalesce(1).write.format("delta").mode("append")
         .option("txnAppId", f"{self.query_id()}:handoff").option("txnVersion", batch_id)
         .save(self.handoff_path))

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self.gate.lock:
            if self.gate.closed:
                raise StoppedAtBoundary(f"batch {batch_id} refused: the query is stopping")
            super().__call__(batch, batch_id)
            self.gate.last_written = batch_id

    def before_write(self, batch: DataFrame, batch_id: int,
                     versions: dict[str, int | None]) -> None:
        version = versions.get(RESULT)
        if self.guard is None or version is None or self.guard.followable(int(version)):
            self.written.add(batch_id)
            return
        self.held = int(version)
        self.gate.shut()
        raise HeldForRestart(
            f"batch {batch_id} refused: routed by assignment version {version}, which this "
            f"generation (version {self.guard.in_force} in force) does not follow live")

    def after_write(self, batch: DataFrame, batch_id: int,
                    versions: dict[str, int | None]) -> None:
        if HANDOFF in versions:
            self._hand_over(batch, batch_id)
        if EXPORTED in versions:
            # A restart's export: the state of moved keys left their labels in this batch;
            # it is the generation's last (the next batch, if any, is refused).
            self.exported = batch_id
            self.gate.shut()
        version = versions.get(RESULT)
        if self.guard is None or version is None:
            return
        target = self.log_folder / str(batch_id) if self.log_folder is not None else None
        # A replayed batch may be routed otherwise than its first attempt: rewrite its entry.
        if int(version) != self.guard.in_force or (target is not None and target.exists()):
            if int(version) != self.guard.in_force:
                log.info("live switch: batch %d routed by assignment version %s", batch_id,
                         version)
            self.guard.in_force = int(version)
            if target is not None:
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".tmp")
                tmp.write_text(json.dumps({"assignment_version": int(version)}))
                tmp.replace(target)


def pending_versions(spark: SparkSession, root: str | None, job: str) -> DataFrame:
    """Versions named by restart requests of ``job`` not yet acknowledged nor rolled back
    (a static read of the ``restarts`` table: re-read every micro-batch)."""
    steps = tables.read(spark, tables.RESTARTS, root).where(F.col("job") == job)
    done = steps.where(F.col("step").isin("acknowledged", "rolled_back")).select("request_id")
    return (steps.where(F.col("step") == "requested")
            .join(done, "request_id", "left_anti").select("assignment_version"))


def follow_routing(spark: SparkSession, root: str | None, n_instances: int, in_force: int,
                   steps: list, metadata: dict[int, dict[str, Any]] | None = None,
                   job: str | None = None) -> tuple[DataFrame, VersionGuard]:
    """Routing rows that follow the latest assignment version every micro-batch (live
    switch), falling back to ``in_force`` (the last committed batch's version) while the
    latest is one the generation must not follow: published for a restart or another N,
    or named by a restart request not yet acknowledged (``steps``; with ``job``, also
    requests written after the query started, read every micro-batch); and the sink's
    guard.
    ``metadata`` (version -> commit metadata, read a moment ago) spares a history read:
    a version published since still meets the guard in the sink."""
    acknowledged = {s.request_id for s in steps if s.step == "acknowledged"}
    requested = {int(s.assignment_version) for s in steps if s.step == "requested"
                 and s.request_id not in acknowledged and s.assignment_version is not None}
    guard = VersionGuard(spark, root, n_instances, in_force, requested,
                         metadata=dict(metadata or {}))
    blocked = guard.blocked_versions(refresh=metadata is None)
    rows = follow_assignment_rows(tables.assignment_rows(spark, root),
                                  tables.assignment_rows(spark, root, in_force),
                                  blocked, n_instances,
                                  pending_versions(spark, root, job) if job else None, in_force)
    log.info("following the latest assignment version (in force: %d, not followed: %s)",
             in_force, blocked)
    return rows, guard
