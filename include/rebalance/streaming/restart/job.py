"""The restartable job's driver: runs the keyed query as generations and executes restarts.

A generation is (assignment version, N, checkpoint directory). :class:`RestartableJob`
polls the ``restarts`` table for requests (:func:`~.control.request_restart`) and
executes each: same N, the checkpoint stays and the moved keys' state is handed over
inside the stream; another N (or ``full_restart``), the generation stops at a
micro-batch boundary, its state is re-keyed and the new generation starts on a new
checkpoint. Every step is one ``restarts`` row, so a crash is completed (or rolled back)
by the next driver. The steps, their rows and the limits: docs/restart.md.

>>> job = RestartableJob(spark, JobConfig(n_instances=4, trigger_seconds=2))  # doctest: +SKIP
>>> job.start()                                   # recovers an unfinished restart first
>>> job.run_forever(poll_seconds=5)               # executes restart requests as they come
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from rebalance.spark import tables
from rebalance.spark.jobs import RESTART, record_start
from rebalance.streaming.boundary import wait_committed
from rebalance.streaming.job import JobConfig
from rebalance.streaming.restart.checkpoint import (
    checkpoint_position,
    covering_batch,
    drop_uncommitted,
    in_force_version,
    log_ids,
    next_source,
    routing_log,
)
from rebalance.streaming.restart.control import (
    BOOTSTRAP,
    TERMINAL,
    Generation,
    RestartControl,
    RestartError,
    Step,
)
from rebalance.streaming.restart.query import Background, generation_query
from rebalance.streaming.restart.sink import GatedWriter, VersionGuard, follow_routing
from rebalance.streaming.restart.state import append_export, migrate_state, read_state, write_state

__all__ = ["RestartableJob"]

log = logging.getLogger(__name__)


# --------------------------------------------------------------------- the job driver

@dataclass
class RestartableJob:
    """The keyed query run as generations, restarted with state migration on request.

    A restart passes its steps (``prepare``: same N, before ``started``; ``stop``: after
    the old generation stopped; ``state``: another N, after the state was written;
    ``start``: after the new query started) through :meth:`reached`: a
    :class:`RestartError` raised there is a failed restart, rolled back; an exception
    that is not an ``Exception`` (a dying driver) propagates with no rollback, and the
    next driver completes the restart from the ``restarts`` table.
    """

    spark: SparkSession
    config: JobConfig
    ack_timeout_seconds: float = 300.0
    pin_assignment: bool = False
    hold_seconds: float = 60.0
    full_restart: bool = False
    generation: Generation | None = field(default=None, init=False)
    query: StreamingQuery | None = field(default=None, init=False)
    writer: GatedWriter | None = field(default=None, init=False)
    timings: list[dict[str, float]] = field(default_factory=list, init=False)
    stop_began: float | None = field(default=None, init=False)
    from_version: int | None = field(default=None, init=False)
    replay_batch: int | None = field(default=None, init=False)
    last_commit_at: float | None = field(default=None, init=False)
    _tables_ready: bool = field(default=False, init=False, repr=False)
    _hint: tuple | None = field(default=None, init=False, repr=False)
    _prepared: tuple | None = field(default=None, init=False, repr=False)
    _held_at: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.control = RestartControl(self.spark, self.config.name, self.config.tables_root)

    # ---------------------------------------------------------------- paths
    def checkpoint(self, number: int) -> str:
        return self.config.checkpoint(f"keyed-g{number}")

    def state_path(self, number: int) -> str:
        return self.config.checkpoint(f"state-g{number}")

    # ---------------------------------------------------------------- life cycle
    def start(self) -> Generation:
        """Run the live generation; first complete (or roll back) an unfinished restart."""
        tables.ensure_table(self.spark, tables.RESTARTS, self.config.tables_root)
        steps = self.control.steps()
        if self.control.live_generation(steps) is None:
            self._bootstrap()
            steps = self.control.steps()
        pending = self.control.pending(steps)
        if pending is not None:
            self.execute(pending, steps)
        else:
            self._run(self.control.live_generation(steps))
        record_start(self.spark, self.config, RESTART, self.generation.number,  # for apply
                     splits=True)
        return self.generation

    def _bootstrap(self) -> None:
        root = self.config.tables_root
        version = tables.latest_assignment_version(self.spark, root) if tables.exists(
            self.spark, tables.ASSIGNMENTS, root) else 0
        tables.create_assignments(self.spark, self.config.n_instances, root)
        gen = Generation(0, version, self.config.n_instances, self.checkpoint(0))
        self.control.record(BOOTSTRAP, "started", gen)
        self.control.record(BOOTSTRAP, "acknowledged", gen)

    def stop(self) -> None:
        """Stop the running generation at a micro-batch boundary."""
        if self.query is not None:
            self._stop_at_boundary()

    def hard_stop(self) -> None:
        """Stop the query at once, mid-batch if need be (what a crash does)."""
        if self.query is not None:
            try:
                self.query.stop()
            finally:
                self.query = None

    def poll(self) -> str | None:
        """Execute the pending request, if any; return its id.

        A generation that refused a batch routed by a version it must not follow
        (:class:`HeldForRestart`: published for a restart, or for another N) stopped at
        that boundary and waits for the restart request; without one within
        ``hold_seconds`` it resumes, routing by the version in force.
        """
        held = False
        if self.query is not None and self.query.exception() is not None:
            if self.writer is None or self.writer.held is None:
                raise self.query.exception()
            held = True
        steps = self.control.steps()
        pending = self.control.pending(steps)
        if pending is not None:
            self.execute(pending, steps)
        elif held and time.monotonic() - self.held_since() > self.hold_seconds:
            log.warning("generation %d: no restart request for assignment version %d in %s s; "
                        "resuming with version %d", self.generation.number, self.writer.held,
                        self.hold_seconds, self.writer.guard.in_force)
            self.query = None
            self._run(self.generation)
        return pending

    def held_since(self) -> float:
        if self._held_at is None:
            self._held_at = time.monotonic()
        return self._held_at

    def run_forever(self, poll_seconds: float = 5.0) -> None:
        """Poll for restart requests until the query fails or the process is stopped."""
        while True:
            self.poll()
            time.sleep(poll_seconds)

    def process_all_available(self) -> None:
        if self.query is not None:
            self.query.processAllAvailable()

    # ---------------------------------------------------------------- one restart
    def execute(self, request_id: str, all_steps: list[Step] | None = None) -> dict[str, Any]:
        """Run a request to the end from its last recorded step; return its status."""
        all_steps = self.control.steps() if all_steps is None else all_steps
        steps = {s.step: s for s in all_steps if s.request_id == request_id}
        if any(step in steps for step in TERMINAL):
            return self.control.status(request_id)
        if "requested" not in steps:
            raise RestartError(f"no restart request {request_id!r}")
        old = self.control.live_generation(all_steps)
        requested = steps["requested"]
        cancelled = self.control.status(request_id)["cancelled"] if "cancelled" in steps else False
        if "started" in steps and not cancelled:   # past the point of no return: finish it
            return self._finish(request_id, Generation(**steps["started"].detail["generation"]))
        timing = {"requested": time.perf_counter()}
        try:
            if cancelled:
                raise RestartError("cancelled before the new generation started")
            if "stopped" not in steps and self._in_place(old, requested):
                new = self._start_in_place(request_id, old, requested, timing)
            else:
                new = self._start_new_checkpoint(request_id, old, requested, steps, timing)
            if self.control.status(request_id)["cancelled"]:
                raise RestartError("cancelled before the new generation started")
        except Exception as exc:  # a driver's death is no Exception: no rollback then
            return self._roll_back(request_id, old, exc)
        self.timings.append(timing)
        return self._finish(request_id, new, timing)

    def _in_place(self, old: Generation, requested: Step) -> bool:
        """Whether the restart keeps the checkpoint: same N, a running query (or one that
        committed batches), and not ``full_restart``."""
        return (int(requested.n_instances) == old.n_instances and not self.full_restart
                and checkpoint_position(old.checkpoint).last_batch is not None)

    def _start_in_place(self, request_id: str, old: Generation, requested: Step,
                        timing: dict[str, float]) -> Generation:
        """Same N: nothing stops yet. Build the new query while the old one runs, then
        record ``started``: from here on the restart only goes forward (:meth:`_finish`
        asks the old generation to export the moved keys' state in its next batch)."""
        version = int(requested.assignment_version)
        self._warm_up(old, version)
        timing["warmed"] = time.perf_counter()
        self.reached("prepare")
        last = checkpoint_position(old.checkpoint).last_batch
        new = dataclasses.replace(old, number=old.number + 1, assignment_version=version,
                                  start_batch=-1, in_place=True)
        self.control.record(request_id, "started", new, from_generation=old.number,
                            from_version=in_force_version(old, last))
        return new

    def _start_new_checkpoint(self, request_id: str, old: Generation, requested: Step,
                              steps: dict[str, Step], timing: dict[str, float]) -> Generation:
        """Another N: stop the old generation, write the re-keyed state for a new checkpoint,
        record ``stopped``, ``state_written`` and ``started``."""
        recording = None
        if "stopped" not in steps:
            new = self._stop_old(old, requested)
            timing["stopped"] = time.perf_counter()
            # Recorded while the state is written (a crash before the record only repeats
            # the stop, which finds the checkpoint as it left it).
            recording = Background(lambda: self.control.record(
                request_id, "stopped", new, from_generation=old.number,
                from_version=self.from_version))
        else:
            new = Generation(**steps["stopped"].detail["generation"])
            self._ensure_stopped()
            timing["stopped"] = time.perf_counter()
        try:
            written = "state_written" not in steps
            if written:
                self._write_state(old, new)
        finally:
            if recording is not None:
                recording.join()
        self.reached("stop")
        timing["state_written"] = time.perf_counter()
        if written:
            self.reached("state")
            # One commit: the state is written, the new generation starts.
            self.control.record_steps(request_id, [("state_written", new, {}),
                                                   ("started", new, {})])
        else:
            self.control.record(request_id, "started", new)
        return new

    def _warm_up(self, old: Generation, version: int) -> None:
        """While the old generation still runs: read what the new generation's query needs
        (restart steps, the assignments' history) and build it. Best effort."""
        try:
            guard = VersionGuard(self.spark, self.config.tables_root, old.n_instances, 0)
            guard.blocked_versions()
            self._hint = (self.control.steps(), guard.metadata)
            # It keeps the checkpoint; its routing log has no entry of it yet, whatever
            # its first batch (hence a start_batch beyond any).
            upcoming = dataclasses.replace(old, number=old.number + 1,
                                           assignment_version=version, start_batch=2 ** 62,
                                           in_place=True)
            hint = self._hint
            self._prepared = self._prepare(upcoming)
            self._hint = hint      # _prepare used it; the rollback path may need it too
        except Exception as exc:  # noqa: BLE001 - a warm-up failure only costs time
            log.info("restart warm-up skipped: %s", exc)

    def _stop_old(self, old: Generation, requested: Step) -> Generation:
        """Stop the old generation at a batch boundary; the new generation (another N: a new
        checkpoint, seeded with the re-keyed state as ``initialState``, its source
        starting after the old offset)."""
        if self.query is not None:
            self._stop_at_boundary()
        else:
            self._complete_uncommitted(old)
        drop_uncommitted(old.checkpoint, self.writer.written if self.writer else set())
        position = checkpoint_position(old.checkpoint)
        self.from_version = in_force_version(old, position.last_batch)
        number = old.number + 1
        version, n = int(requested.assignment_version), int(requested.n_instances)
        if position.last_batch is None:   # nothing committed: start where it started
            source, offset = dict(old.source), old.batch_offset
        else:
            source = next_source(self.spark, self.config, position.offset)
            source["min_event_ms"] = max(position.next_watermark_ms or 0,
                                         int(old.source.get("min_event_ms") or 0))
            offset = old.batch_offset + position.last_batch + 1
        return Generation(number, version, n, self.checkpoint(number), offset, source,
                          self.state_path(number))

    def _write_state(self, old: Generation, new: Generation) -> None:
        """Write the old state, re-keyed for the new assignment and N, as initial state."""
        position = checkpoint_position(old.checkpoint)
        state = read_state(self.spark, old, position.last_batch)
        routing = tables.read_assignment(self.spark, new.assignment_version,
                                         self.config.tables_root).routing
        migrated = migrate_state(state, old.n_instances, new.n_instances, routing,
                                 new.assignment_version)
        write_state(self.spark, migrated, new.state_path)

    def _export(self, request_id: str, new: Generation) -> Generation:
        """Same N, after ``started``: the old generation's next batch gives the moved keys'
        state away (its sink writes it to the handoff table, then refuses the batch
        after); stop it there. Returns the new generation with its first batch.

        Re-runnable: the export rows are appended once, the batch that processed them is
        found in the checkpoint, and the old generation is run again only if it has not
        committed that batch (a crash before it)."""
        old = self.control.live_generation()
        target = tables.read_assignment(self.spark, new.assignment_version, self.config.tables_root)
        routing, last = target.routing, checkpoint_position(new.checkpoint).last_batch
        log_folder = routing_log(new.checkpoint)
        # a label may hold a key it takes over (moved by a live switch, or split): it merges
        switched = bool(target.splits) or bool(log_folder.is_dir() and any(
            old.start_batch <= b <= (last if last is not None else -1)
            for b in log_ids(log_folder))) or bool(tables.read_assignment(
                self.spark, old.assignment_version, self.config.tables_root).splits)
        marker = append_export(self.spark, new.checkpoint, routing, new.n_instances,
                               new.assignment_version, switched, request_id)
        exported = covering_batch(new.checkpoint, marker)
        if exported is None:
            if self.query is None or not self.query.isActive:
                # A new driver, or a query that held at a version it must not follow
                # (then it routes by the version in force again): it exports now.
                self._ensure_stopped()
                self._run(old)
            deadline = time.monotonic() + self.ack_timeout_seconds
            while self.writer.exported is None:
                if self.query.exception() is not None:
                    if self.writer.held is None:
                        raise self.query.exception()
                    # It held at the new version (seen before the request): it routes by
                    # the version in force again, and exports.
                    self._ensure_stopped()
                    self._run(old)
                if time.monotonic() > deadline:
                    raise RestartError(f"the old generation exported nothing in "
                                       f"{self.ack_timeout_seconds} s")
                time.sleep(0.02)
            self._stop_at_boundary()
            exported = covering_batch(new.checkpoint, marker)
        else:
            self._ensure_stopped()
        if exported is None:
            raise RestartError(f"no committed batch of {new.checkpoint} took the export")
        # A batch the old generation planned after the export (and the sink refused) holds
        # the handed-over state: the new generation replays it, routed by the new version.
        return dataclasses.replace(new, start_batch=exported + 1)

    def _finish(self, request_id: str, new: Generation,
                timing: dict[str, float] | None = None) -> dict[str, Any]:
        """Run the new generation until its first batch commits; acknowledge."""
        timing = timing if timing is not None else {}
        if new.in_place:
            new = self._export(request_id, new)
            timing["stopped"] = time.perf_counter()
            self.reached("stop")
        self._ensure_stopped()
        self._run(new)
        self._hint = None
        timing["running"] = time.perf_counter()
        self.reached("start")
        first = self._await_first_commit(new)
        timing["acknowledged"] = time.perf_counter()
        since = {k: round(timing[k] - timing["requested"], 3) for k in timing} \
            if "requested" in timing else {}
        pause_seconds = None
        if "requested" in timing and self.stop_began is not None:
            # No output committed: from the old generation's last commit (or the gate's
            # closing, if later) to the new generation's first commit.
            committed = Path(new.checkpoint, "commits", str(first)).stat().st_mtime
            pause_seconds = round(committed - max(self.stop_began, self.last_commit_at or 0), 3)
        progress = None
        for _ in range(20):      # the progress of a batch is posted just after its commit
            progress = next((p for p in self.query.recentProgress if p.batchId == first), None)
            if progress is not None:
                break
            time.sleep(0.1)
        self.control.record(request_id, "acknowledged", new, first_batch=first,
                            seconds_since_request=since, pause_seconds=pause_seconds,
                            first_batch_ms=dict(progress.durationMs) if progress else None)
        return self.control.status(request_id)

    def _roll_back(self, request_id: str, old: Generation, exc: Exception) -> dict[str, Any]:
        log.warning("restart %s failed: %s; resuming generation %d", request_id, exc, old.number)
        self.control.record(request_id, "failed", error=f"{type(exc).__name__}: {exc}")
        self._ensure_stopped()
        self._run(old)
        self.control.record(request_id, "rolled_back", old)
        return self.control.status(request_id)

    def reached(self, step: str) -> None:
        """Called as a restart reaches ``step`` (see the class): nothing happens here; the
        tests' subclass makes a restart fail or its driver die at a step."""

    # ---------------------------------------------------------------- queries
    def _run(self, gen: Generation) -> StreamingQuery:
        """Start (or resume, from its checkpoint) a generation's keyed query."""
        prepared = self._prepared
        if prepared is not None and prepared[0] == (gen.number, gen.assignment_version,
                                                    gen.checkpoint):
            self._prepared = None
        else:
            prepared = self._prepare(gen)
        _, stream, sink = prepared
        position = checkpoint_position(gen.checkpoint)
        previous = self.spark.conf.get("spark.sql.shuffle.partitions")
        self.spark.conf.set("spark.sql.shuffle.partitions", str(gen.n_instances))
        try:
            self.writer, self._held_at = sink, None
            writer = (stream.writeStream.queryName(sink.query_name).foreachBatch(sink)
                      .option("checkpointLocation", gen.checkpoint))
            if self.config.trigger_seconds is None:
                writer = writer.trigger(availableNow=True)
            else:
                writer = writer.trigger(processingTime=f"{self.config.trigger_seconds} seconds")
            self.query = writer.start()
        finally:
            self.spark.conf.set("spark.sql.shuffle.partitions", previous)
        # A batch planned by an earlier run and not committed is replayed first.
        self.replay_batch = log_ids(Path(gen.checkpoint, "offsets"))[-1] \
            if position.uncommitted else None
        self.generation = gen
        log.info("generation %d running: assignment v%d, N=%d, %s", gen.number,
                 gen.assignment_version, gen.n_instances, gen.checkpoint)
        return self.query

    def _prepare(self, gen: Generation) -> tuple[tuple, DataFrame, GatedWriter]:
        """A generation's streaming DataFrame and sink, ready to start (no side effect on
        its checkpoint: a restart builds them while the old generation still runs)."""
        root = self.config.tables_root
        if not self._tables_ready:
            tables.create_assignments(
                self.spark, tables.assignments_n_instances(self.spark, root), root)
            for table in (tables.RESULTS, tables.KEY_HISTOGRAMS, tables.INSTANCE_HISTOGRAMS,
                          tables.WINDOW_RESULTS):
                tables.ensure_table(self.spark, table, root)
            self._tables_ready = True
        rows, guard = self._routing(gen)
        stream, sink = generation_query(self.spark, self.config, gen, rows, guard)
        return (gen.number, gen.assignment_version, gen.checkpoint), stream, sink

    def _routing(self, gen: Generation) -> tuple[DataFrame, VersionGuard | None]:
        """The routing rows of a generation's query and the guard of its sink
        (:func:`~.sink.follow_routing`). A restart passes what it read while the
        old generation still ran (steps, the assignments' history)."""
        root = self.config.tables_root
        if self.pin_assignment:
            return tables.assignment_rows(self.spark, root, gen.assignment_version), None
        hint, self._hint = self._hint, None
        in_force = in_force_version(gen, checkpoint_position(gen.checkpoint).last_batch)
        tables.ensure_table(self.spark, tables.RESTARTS, root)
        return follow_routing(self.spark, root, gen.n_instances, in_force,
                              hint[0] if hint else self.control.steps(),
                              hint[1] if hint else None, job=self.config.name)

    def _stop_at_boundary(self, timeout: float = 120.0) -> None:
        """Close the sink gate, wait for the last written batch's commit, stop the query.

        A batch replayed from an earlier run (it may have written part of its output
        then) is let commit first, so that whatever is left uncommitted at the stop
        wrote nothing.
        """
        query, gate, checkpoint = self.query, self.writer.gate, self.generation.checkpoint
        deadline = time.monotonic() + timeout
        commits = Path(checkpoint, "commits")
        replay = self.replay_batch
        if not wait_committed(query, checkpoint, replay, deadline):
            raise RestartError(f"replayed batch {replay} did not commit in {timeout} s")
        last = gate.close()
        self.stop_began = gate.closed_at
        if not wait_committed(query, checkpoint, last, deadline):
            raise RestartError(f"batch {last} was written but not committed in {timeout} s")
        query.stop()
        self.query = None
        self.last_commit_at = max((p.stat().st_mtime for p in commits.iterdir()
                                   if p.name.isdigit()), default=None) if commits.is_dir() else None

    def _ensure_stopped(self) -> None:
        if self.query is not None:
            self._stop_at_boundary()

    def _complete_uncommitted(self, gen: Generation, timeout: float = 300.0) -> None:
        """After a crash: let the generation replay its uncommitted batch, then stop it."""
        position = checkpoint_position(gen.checkpoint)
        if not position.uncommitted:
            return
        target = log_ids(Path(gen.checkpoint, "offsets"))[-1]
        self._run(gen)
        deadline = time.monotonic() + timeout
        while not (Path(gen.checkpoint, "commits") / str(target)).exists():
            if self.query.exception() is not None:
                raise self.query.exception()
            if time.monotonic() > deadline:
                raise RestartError(f"replay of batch {target} did not commit in {timeout} s")
            time.sleep(0.1)
        self._stop_at_boundary()

    def _await_first_commit(self, gen: Generation) -> int:
        """Wait for the generation's first committed batch (local id >= its start batch)."""
        commits = Path(gen.checkpoint, "commits")
        deadline = time.monotonic() + self.ack_timeout_seconds
        while True:
            done = [b for b in log_ids(commits) if b >= gen.start_batch]
            if done:
                return done[0]
            if self.query.exception() is not None:
                raise self.query.exception()
            if not self.query.isActive:
                raise RestartError(f"generation {gen.number} stopped before its first batch")
            if time.monotonic() > deadline:
                raise RestartError(f"generation {gen.number}: no batch committed in "
                                   f"{self.ack_timeout_seconds} s")
            time.sleep(0.05)
