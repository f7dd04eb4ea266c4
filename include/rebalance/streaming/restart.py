"""Controlled restart of the keyed job with state migration, exactly once.

A live switch (a new version of ``assignments``) moves a key's events but not its
state. When the state must follow, the keyed query runs in *generations*:

    generation = (assignment version, N instances, checkpoint directory)

A generation starts with one assignment version and then follows the latest one at
every micro-batch, as the plain keyed job does (a live switch, published by the DAG
with ``apply_mode`` broadcast or auto, is used from the next micro-batch; rows record
the version they were routed by), except versions it must not follow live: those
published for a controlled restart, or for another N. A batch routed by such a
version is refused before it writes anything (the generation holds at that
boundary), and a query started while the latest version is one of them routes by
the version in force instead (``pin_assignment`` keeps the start version for good).
A restart to a new
assignment version (or a new N: scale out or in, same path) is requested by a
``requested`` row in the Delta table ``restarts`` (:func:`request_restart`, what
the DAG calls); :class:`RestartableJob` (the running job's driver) then

1. **stops** the running generation at a micro-batch boundary: a gate in the
   ``foreachBatch`` sink lets the batch in flight finish and commit and refuses
   the next one before it writes anything, then the query is stopped; the last
   committed batch, its source offset and next watermark are read from the
   checkpoint (``stopped``);
2. **migrates the state**: the whole state of that batch is read back with the
   ``statestore`` reader (``perkey`` and ``perwindow``), every key is re-keyed to
   the label of its instance under the target assignment and N (values of keys
   that stay are copied unchanged), open windows get their instance's totals
   and a timer, and the rows are written as Parquet next to the new checkpoint
   (``state_written``);
3. **starts** the new generation on a new checkpoint with that state as the
   operator's ``initialState`` (applied in its batch 0 only) and a Delta source
   that starts exactly after the old generation's last committed offset:
   ``startingVersion`` of the version holding that offset, minus the files of
   that version already processed (by ``input_file_name()``); events older
   than the old watermark are dropped, as the old generation would have
   (``started``);
4. **acknowledges** once the new generation committed its first batch
   (``acknowledged``, with the pause).

Every step is one row written with a Delta transaction (request id, step order),
so writing it again is a no-op, and each step is re-runnable: a crash at any
point is recovered by :meth:`RestartableJob.start` in a new process, which finds
the unfinished request and completes it from its last recorded step (a crashed
generation first finishes its uncommitted batch from its own checkpoint, as any
restart does). A failure before ``started`` (the new generation cannot start)
records ``failed``, resumes the old generation from its checkpoint and records
``rolled_back``: the previous assignment stays fully in force. A request
``cancelled`` (the DAG's timeout) before ``started`` is rolled back the same way;
Delta's transaction order decides which of ``cancelled`` and ``started`` wins.

Output batches keep one order across generations: generation ``g + 1`` numbers
its batches on from the last committed batch of ``g`` (``batch_offset``), and
its idempotent writes are keyed by its own query id, as before.

>>> job = RestartableJob(spark, JobConfig(n_instances=4, trigger_seconds=2))  # doctest: +SKIP
>>> job.start()                                   # recovers an unfinished restart first
>>> job.run_forever(poll_seconds=5)               # executes restart requests as they come
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from ..placement import default_instances
from ..spark import tables
from ..spark.plan_store import utcnow
from .job import JobConfig, KeyedOutputWriter, keyed_stream
from .processor import INITIAL_STATE_DDL, PERKEY, PERWINDOW, RESULT
from .routing import follow_assignment_rows, instance_labels

log = logging.getLogger(__name__)

#: Steps of a request and their order (the Delta ``txnVersion`` of their row).
STEPS = {"requested": 10, "stopped": 20, "state_written": 30, "cancelled": 35, "started": 40,
         "acknowledged": 50, "failed": 60, "rolled_back": 70}
#: Steps after which a request is finished.
TERMINAL = ("acknowledged", "rolled_back")
BOOTSTRAP = "bootstrap"


class RestartError(RuntimeError):
    """A restart cannot proceed (with the reason)."""


class StoppedAtBoundary(RuntimeError):
    """Raised by the sink when a batch starts after the gate closed: nothing was written."""


class HeldForRestart(StoppedAtBoundary):
    """Raised by the sink when a batch was routed by a version the generation must not
    follow (published for a controlled restart, or for another N): nothing was written."""


class SimulatedCrash(RuntimeError):
    """Raised at an injected step (tests, benchmark): the driver 'dies' there."""


# --------------------------------------------------------------------- generations

@dataclass(frozen=True)
class Generation:
    """One run of the keyed query: the assignment version it starts with, N and checkpoint.

    ``batch_offset`` is the global number of its batch 0; ``source`` says where
    its Delta source starts (``starting_version``, ``exclude_files`` of that
    version already processed, ``min_event_ms``: events at or before the old
    watermark are late); ``state_path`` holds its initial state (None: empty).
    """

    number: int
    assignment_version: int
    n_instances: int
    checkpoint: str
    batch_offset: int = 0
    source: dict[str, Any] = field(default_factory=lambda: {"starting_version": 0})
    state_path: str | None = None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Generation:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class Position:
    """Where a stopped generation's checkpoint ends."""

    last_batch: int | None          # last committed batch (None: nothing committed)
    offset: dict[str, Any] | None   # its Delta source offset
    next_watermark_ms: int | None   # watermark the next batch would have used
    uncommitted: bool               # a planned batch was never committed


def _log_ids(folder: Path) -> list[int]:
    return sorted(int(p.name) for p in folder.glob("[0-9]*") if p.name.isdigit())


def checkpoint_position(checkpoint: str) -> Position:
    """Last committed batch of a (stopped) checkpoint, its source offset and next watermark."""
    root = Path(checkpoint)
    commits, offsets = _log_ids(root / "commits"), _log_ids(root / "offsets")
    uncommitted = bool(offsets) and (not commits or offsets[-1] > commits[-1])
    if not commits:
        return Position(None, None, None, uncommitted)
    last = commits[-1]
    lines = (root / "offsets" / str(last)).read_text().strip().splitlines()
    commit = json.loads((root / "commits" / str(last)).read_text().strip().splitlines()[-1])
    return Position(last, json.loads(lines[-1]), int(commit.get("nextBatchWatermarkMs", 0)),
                    uncommitted)


def version_files(spark: SparkSession, table_path: str, version: int) -> list[str]:
    """File names of the data files a Delta commit added, in the order of its log."""
    log_file = f"{table_path}/_delta_log/{version:020d}.json"
    local = Path(log_file.removeprefix("file:"))
    lines = (local.read_text().splitlines() if "://" not in log_file and local.exists()
             else [row.value for row in spark.read.text(log_file).collect()])
    names = []
    for line in lines:
        if not line.strip():
            continue
        action = json.loads(line)
        add = action.get("add")
        if add and add.get("dataChange", True):
            names.append(add["path"].rsplit("/", 1)[-1])
    return names


def source_after(spark: SparkSession, table_path: str, offset: dict[str, Any]) -> dict[str, Any]:
    """Source options that start exactly after a Delta source offset.

    An offset ``(V, i)`` means every version before V and the files ``0..i`` of
    version V were processed (``i = -1``: none of V). The new source starts at
    the version holding the last processed file (so that it exists, and its batch
    0 has input and runs at once) and skips the files of it already processed.
    """
    if offset.get("isStartingVersion"):
        raise RestartError(
            f"the old generation stopped inside its initial snapshot (offset {offset}); "
            "generations read with startingVersion, let it finish the snapshot first")
    version, index = int(offset["reservoirVersion"]), int(offset["index"])
    if index < 0:
        version, index = version - 1, None
    if version < 0:
        return {"starting_version": 0, "exclude_files": []}
    files = version_files(spark, table_path, version)
    done = files if index is None else files[:index + 1]
    return {"starting_version": version, "exclude_files": done}


# --------------------------------------------------------------------- state migration

def read_state(spark: SparkSession, generation: Generation,
               last_batch: int | None) -> pd.DataFrame:
    """The generation's state after ``last_batch`` as :data:`INITIAL_STATE_DDL` rows
    (labels of its N); its own initial state when it committed no batch."""
    columns = [c.split()[0] for c in INITIAL_STATE_DDL.split(", ")]
    if last_batch is None:
        if generation.state_path is None:
            return pd.DataFrame(columns=columns)
        return spark.read.parquet(generation.state_path).toPandas()[columns]

    def load(name: str) -> DataFrame:
        return (spark.read.format("statestore").option("path", generation.checkpoint)
                .option("stateVarName", name).option("batchId", last_batch).load())

    perkey = load(PERKEY).select(
        F.col("key.label").cast("int").alias("label"), F.lit(PERKEY).alias("kind"),
        F.col("user_map_key.key").alias("key"), "user_map_value.*")
    perwindow = load(PERWINDOW).select(
        F.col("key.label").cast("int").alias("label"), F.lit(PERWINDOW).alias("kind"),
        F.col("user_map_key.window_start_ms").alias("window_start_ms"),
        *[F.col(f"user_map_value.{c}").alias(c if c != "version" else "window_version")
          for c in ("events", "load", "task_ns", "cpu_ns", "version")])
    perwindow = perwindow.withColumnRenamed("window_version", "version")
    both = perkey.unionByName(perwindow, allowMissingColumns=True)
    return both.select(columns).toPandas()


def migrate_state(state: pd.DataFrame, old_n: int, new_n: int, routing: dict[str, int],
                  version: int) -> pd.DataFrame:
    """Re-key a generation's state for a new assignment (``routing``) and N.

    Every key goes to the label of its instance under the new assignment; the
    values of a key are copied as they are (its default instance is recomputed
    only when N changes; a key held by two labels, after an earlier live switch,
    is merged). Each open window (one the old state still tracked per instance)
    gets, per new instance, the events and load of the keys it now holds (the
    operator's invariant), the operator time its instance had, and a timer.
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
    timing = (old.groupby(["label", "window_start_ms"], as_index=False)
              .agg(task_ns=("task_ns", "sum"), cpu_ns=("cpu_ns", "sum"),
                   old_version=("version", "max")))
    windows = windows.merge(timing, on=["label", "window_start_ms"], how="left")
    windows = windows[windows.events > 0]
    windows = windows.assign(
        kind=PERWINDOW, task_ns=windows.task_ns.fillna(0).astype("int64"),
        cpu_ns=windows.cpu_ns.fillna(0).astype("int64"),
        version=np.maximum(windows.old_version.fillna(0).astype("int64"), int(version)))
    columns = [c.split()[0] for c in INITIAL_STATE_DDL.split(", ")]
    out = pd.concat([perkey, windows.drop(columns="old_version")], ignore_index=True)
    return out.reindex(columns=columns)


def _merge_duplicate_keys(perkey: pd.DataFrame) -> pd.DataFrame:
    from .processor import KeyWindows

    rows = []
    for _, group in perkey.groupby("key", sort=False):
        first = group.iloc[0].copy()
        if len(group) > 1:
            merged = KeyWindows(int(first.key_group), int(first.default_instance),
                                int(group.version.max()))
            for r in group.itertuples(index=False):
                for w, c, s, k in zip(r.windows, r.counts, r.sums, r.costs):
                    merged.add(int(w), int(c), float(s), float(k))
            first["windows"], first["counts"] = merged.windows, merged.counts
            first["sums"], first["costs"] = merged.sums, merged.costs
            first["version"] = merged.version
        rows.append(first)
    return pd.DataFrame(rows)


def write_state(spark: SparkSession, frame: pd.DataFrame, path: str) -> None:
    """Write migrated state rows as Parquet (overwrite: re-running the step is safe)."""
    schema = spark.createDataFrame([], INITIAL_STATE_DDL).schema
    parts = {PERKEY: ["label", "kind", "key", "key_group", "default_instance", "version",
                      "windows", "counts", "sums", "costs"],
             PERWINDOW: ["label", "kind", "window_start_ms", "events", "load", "task_ns",
                         "cpu_ns", "version"]}
    df = spark.createDataFrame([], schema)
    for kind, columns in parts.items():
        rows = frame.loc[frame.kind == kind, columns]
        if len(rows):
            rows = rows.astype({c: t for c, t in {
                "label": "int32", "key_group": "int32", "default_instance": "int32",
                "version": "int64", "window_start_ms": "int64", "events": "int64",
                "load": "float64", "task_ns": "int64", "cpu_ns": "int64"}.items()
                if c in columns})
            sub = spark.createDataFrame(rows, schema=_sub_schema(schema, columns))
            df = df.unionByName(sub, allowMissingColumns=True)
    df.select(schema.fieldNames()).repartition(1).write.mode("overwrite").parquet(path)


def _sub_schema(schema, columns: list[str]):
    from pyspark.sql.types import StructType

    return StructType([schema[c] for c in columns])


# --------------------------------------------------------------------- control table

@dataclass(frozen=True)
class Step:
    request_id: str
    step: str
    generation: int | None
    assignment_version: int | None
    n_instances: int | None
    checkpoint: str | None
    detail: dict[str, Any]
    at: Any


class RestartControl:
    """The ``restarts`` Delta table of one job: requests and their recorded steps."""

    def __init__(self, spark: SparkSession, job: str = "keyed",
                 root: str | Path | None = None) -> None:
        self.spark, self.job, self.root = spark, job, root

    def record(self, request_id: str, step: str, generation: Generation | None = None,
               assignment_version: int | None = None, n_instances: int | None = None,
               **detail: Any) -> None:
        """Write the step once (a second write of it, or of an earlier step, is skipped)."""
        tables.ensure_table(self.spark, tables.RESTARTS, self.root)
        if generation is not None:
            detail["generation"] = dataclasses.asdict(generation)
            assignment_version = generation.assignment_version
            n_instances = generation.n_instances
        row = (request_id, step, self.job, generation.number if generation else None,
               assignment_version, n_instances,
               generation.checkpoint if generation else None,
               json.dumps(detail, sort_keys=True, default=str), utcnow())
        df = self.spark.createDataFrame([row], tables.RESTARTS.schema)
        tables.append(df, tables.RESTARTS, self.root,
                      metadata={"kind": "restart", "job": self.job, "request_id": request_id,
                                "step": step},
                      txn=(f"restart:{self.job}:{request_id}", STEPS[step]))
        log.info("restart %s: %s", request_id, step)

    def steps(self, request_id: str | None = None) -> list[Step]:
        """Recorded steps (of one request), in commit order."""
        if not tables.exists(self.spark, tables.RESTARTS, self.root):
            return []
        df = tables.read(self.spark, tables.RESTARTS, self.root).where(F.col("job") == self.job)
        if request_id is not None:
            df = df.where(F.col("request_id") == request_id)
        rows = df.collect()
        rows = sorted(rows, key=lambda r: (r.at, STEPS[r.step]))
        return [Step(r.request_id, r.step, r.generation, r.assignment_version, r.n_instances,
                     r.checkpoint, json.loads(r.detail or "{}"), r.at) for r in rows]

    def request(self, assignment_version: int, n_instances: int,
                request_id: str | None = None, **detail: Any) -> str:
        """Ask the job to restart with this assignment version and N; return the request id."""
        request_id = request_id or uuid.uuid4().hex[:16]
        self.record(request_id, "requested", assignment_version=assignment_version,
                    n_instances=n_instances, **detail)
        return request_id

    def status(self, request_id: str) -> dict[str, Any]:
        """``{"steps": [...], "state": last step, "done": bool, "ok": bool, ...}``."""
        steps = self.steps(request_id)
        names = [s.step for s in steps]
        state = max(names, key=STEPS.__getitem__) if names else None
        cancelled = "cancelled" in names and (
            "started" not in names or names.index("cancelled") < names.index("started"))
        out = {"request_id": request_id, "steps": names, "state": state,
               "done": state in TERMINAL, "ok": state == "acknowledged",
               "cancelled": cancelled}
        for s in steps:
            if s.step in ("acknowledged", "failed"):
                out.update(s.detail)
        return out

    def live_generation(self, steps: list[Step] | None = None) -> Generation | None:
        """The generation of the latest acknowledged request (None before the first)."""
        acked = [s for s in (self.steps() if steps is None else steps)
                 if s.step == "acknowledged"]
        if not acked:
            return None
        best = max(acked, key=lambda s: s.generation)
        return Generation(**best.detail["generation"])

    def pending(self, steps: list[Step] | None = None) -> str | None:
        """The oldest request that is not finished (None when there is none)."""
        by_request: dict[str, list[str]] = {}
        order: list[str] = []
        for s in (self.steps() if steps is None else steps):
            if s.request_id not in by_request:
                order.append(s.request_id)
            by_request.setdefault(s.request_id, []).append(s.step)
        for request_id in order:
            if not any(step in TERMINAL for step in by_request[request_id]):
                return request_id
        return None


def request_restart(spark: SparkSession, assignment_version: int, n_instances: int,
                    job: str = "keyed", root: str | Path | None = None,
                    request_id: str | None = None, **detail: Any) -> str:
    """Record a restart request for the running job (the DAG's side); return its id."""
    return RestartControl(spark, job, root).request(assignment_version, n_instances,
                                                    request_id, **detail)


# --------------------------------------------------------------------- the sink gate

class BoundaryGate:
    """Lets the sink finish the batch it is writing and refuses the next one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.closed = False
        self.closed_at: float | None = None
        self.last_written: int | None = None

    def close(self) -> int | None:
        """Close (waits for a batch being written); return the last batch fully written."""
        with self._lock:
            self.shut()
            return self.last_written

    def shut(self) -> None:
        """Refuse every later batch (the caller holds the lock)."""
        if not self.closed:
            self.closed, self.closed_at = True, time.time()


# --------------------------------------------------------------------- following versions

def blocks(metadata: dict[str, Any], n_instances: int) -> bool:
    """Whether a generation of ``n_instances`` must not follow a published version live:
    it was published for a controlled restart (``apply_mode`` restart) or for another N."""
    return (metadata.get("apply_mode") == "restart"
            or int(metadata.get("n_instances", n_instances)) != n_instances)


def routing_log(checkpoint: str) -> Path:
    """Folder of a generation's routing log, next to its checkpoint: a file ``<batch>``
    (JSON ``{"assignment_version": v}``) for each batch whose routing differs from the
    batch before (the first entry: from the generation's own version)."""
    return Path(checkpoint).with_name(Path(checkpoint).name + "-routing")


def in_force_version(gen: Generation, last_batch: int | None) -> int:
    """The assignment version in force after ``last_batch`` of ``gen``: the version its
    output rows of the last logged batch up to ``last_batch`` record (its own version when
    it committed none, or never switched)."""
    folder = routing_log(gen.checkpoint)
    if last_batch is None or not folder.is_dir():
        return gen.assignment_version
    logged = [b for b in _log_ids(folder) if b <= last_batch]
    if not logged:
        return gen.assignment_version
    return int(json.loads((folder / str(logged[-1])).read_text())["assignment_version"])


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

    def blocked_versions(self) -> list[int]:
        """Published versions after the one in force that must not be followed."""
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
        if tables.exists(self.spark, tables.ASSIGNMENTS, self.root):
            for commit in tables.assignment_history(self.spark, self.root):
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

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        with self.gate._lock:
            if self.gate.closed:
                raise StoppedAtBoundary(f"batch {batch_id} refused: the query is stopping")
            super().__call__(batch, batch_id)
            self.gate.last_written = batch_id

    def before_write(self, batch_id: int, versions: dict[str, int | None]) -> None:
        version = versions.get(RESULT)
        if self.guard is None or version is None or self.guard.followable(int(version)):
            return
        self.held = int(version)
        self.gate.shut()
        raise HeldForRestart(
            f"batch {batch_id} refused: routed by assignment version {version}, which this "
            f"generation (version {self.guard.in_force} in force) does not follow live")

    def after_write(self, batch_id: int, versions: dict[str, int | None]) -> None:
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


# --------------------------------------------------------------------- the job driver

@dataclass
class RestartableJob:
    """The keyed query run as generations, restarted with state migration on request.

    ``faults`` names steps (``stop``, ``state``, ``start``) where a
    :class:`SimulatedCrash` is raised, to test recovery; ``fail`` names steps
    where a :class:`RestartError` is raised (a failed restart, rolled back).
    """

    spark: SparkSession
    config: JobConfig
    faults: set[str] = field(default_factory=set)
    fail: set[str] = field(default_factory=set)
    ack_timeout_seconds: float = 300.0
    pin_assignment: bool = False
    hold_seconds: float = 60.0
    generation: Generation | None = field(default=None, init=False)
    query: StreamingQuery | None = field(default=None, init=False)
    writer: GatedWriter | None = field(default=None, init=False)
    timings: list[dict[str, float]] = field(default_factory=list, init=False)
    stop_began: float | None = field(default=None, init=False)
    from_version: int | None = field(default=None, init=False)
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
        try:
            if cancelled:
                raise RestartError("cancelled before the new generation started")
            timing = {"requested": time.perf_counter()}
            if "stopped" not in steps:
                new = self._stop_old(old, requested)
                self.control.record(request_id, "stopped", new, from_generation=old.number,
                                    from_version=self.from_version)
            else:
                new = Generation(**steps["stopped"].detail["generation"])
                self._ensure_stopped()
            timing["stopped"] = time.perf_counter()
            self._maybe_fault("stop")
            if "state_written" not in steps:
                self._write_state(old, new)
                self._maybe_fault("state")
                self.control.record(request_id, "state_written", new)
            timing["state_written"] = time.perf_counter()
            self.control.record(request_id, "started", new)
            if self.control.status(request_id)["cancelled"]:
                raise RestartError("cancelled before the new generation started")
        except SimulatedCrash:
            raise
        except Exception as exc:
            return self._roll_back(request_id, old, exc)
        self.timings.append(timing)
        return self._finish(request_id, new, timing)

    def _stop_old(self, old: Generation, requested: Step) -> Generation:
        """Stop the old generation at a batch boundary; the new generation's definition."""
        if self.query is not None:
            self._stop_at_boundary()
        else:
            self._complete_uncommitted(old)
        position = checkpoint_position(old.checkpoint)
        self.from_version = in_force_version(old, position.last_batch)
        number = old.number + 1
        version, n = int(requested.assignment_version), int(requested.n_instances)
        if position.last_batch is None:   # nothing committed: start where it started
            source, offset = dict(old.source), old.batch_offset
        else:
            source = source_after(self.spark, tables.EVENTS.path(self.config.tables_root),
                                  position.offset)
            source["min_event_ms"] = max(position.next_watermark_ms or 0,
                                         int(old.source.get("min_event_ms") or 0))
            offset = old.batch_offset + position.last_batch + 1
        return Generation(number, version, n, self.checkpoint(number), offset, source,
                          self.state_path(number))

    def _write_state(self, old: Generation, new: Generation) -> None:
        position = checkpoint_position(old.checkpoint)
        state = read_state(self.spark, old, position.last_batch)
        routing = tables.read_assignment(self.spark, new.assignment_version,
                                         self.config.tables_root).routing
        migrated = migrate_state(state, old.n_instances, new.n_instances, routing,
                                 new.assignment_version)
        write_state(self.spark, migrated, new.state_path)

    def _finish(self, request_id: str, new: Generation,
                timing: dict[str, float] | None = None) -> dict[str, Any]:
        """Run the new generation until its first batch commits; acknowledge."""
        timing = timing if timing is not None else {}
        self._ensure_stopped()
        self._run(new)
        self._maybe_fault("start")
        first = self._await_first_commit(new)
        timing["acknowledged"] = time.perf_counter()
        pause = {k: round(timing[k] - timing["requested"], 3) for k in timing} \
            if "requested" in timing else {}
        committed = Path(new.checkpoint, "commits", str(first)).stat().st_mtime
        began = self.stop_began if "requested" in timing else None
        pause_seconds = round(committed - began, 3) if began else None
        self.control.record(request_id, "acknowledged", new, first_batch=first,
                            seconds_since_request=pause, pause_seconds=pause_seconds)
        return self.control.status(request_id)

    def _roll_back(self, request_id: str, old: Generation, exc: Exception) -> dict[str, Any]:
        log.warning("restart %s failed: %s; resuming generation %d", request_id, exc, old.number)
        self.control.record(request_id, "failed", error=f"{type(exc).__name__}: {exc}")
        self._ensure_stopped()
        self._run(old)
        self.control.record(request_id, "rolled_back", old)
        return self.control.status(request_id)

    def _maybe_fault(self, step: str) -> None:
        if step in self.faults:
            self.faults.discard(step)
            raise SimulatedCrash(f"injected crash at step {step!r}")
        if step in self.fail:
            self.fail.discard(step)
            raise RestartError(f"injected failure at step {step!r}")

    # ---------------------------------------------------------------- queries
    def _run(self, gen: Generation) -> StreamingQuery:
        """Start (or resume, from its checkpoint) a generation's keyed query."""
        config = dataclasses.replace(self.config, n_instances=gen.n_instances)
        root = config.tables_root
        tables.create_assignments(self.spark, tables.assignments_n_instances(self.spark, root),
                                  root)
        for table in (tables.RESULTS, tables.KEY_HISTOGRAMS, tables.INSTANCE_HISTOGRAMS):
            tables.ensure_table(self.spark, table, root)
        reader = (self.spark.readStream.format("delta")
                  .option("startingVersion", int(gen.source.get("starting_version", 0))))
        if config.max_files_per_trigger:
            reader = reader.option("maxFilesPerTrigger", config.max_files_per_trigger)
        raw = reader.load(tables.EVENTS.path(root))
        excluded = list(gen.source.get("exclude_files") or [])
        if excluded:
            # The Delta streaming source has no _metadata column; input_file_name() works.
            file_name = F.element_at(F.split(F.input_file_name(), "/"), -1)
            raw = raw.where(~file_name.isin(excluded))
        raw = raw.select(*tables.EVENTS.columns)
        min_ms = gen.source.get("min_event_ms")
        if min_ms:
            # Late for the old generation's watermark: dropped, as it would have dropped them.
            parsed = F.unix_millis(F.trim(F.col("event_time")).try_cast("timestamp"))
            raw = raw.where(parsed.isNull() | (parsed > F.lit(int(min_ms))))
        initial = self.spark.read.parquet(gen.state_path) if gen.state_path else None
        rows, guard = self._routing(gen)
        previous = self.spark.conf.get("spark.sql.shuffle.partitions")
        self.spark.conf.set("spark.sql.shuffle.partitions", str(gen.n_instances))
        try:
            stream = keyed_stream(self.spark, raw, config, gen.assignment_version, initial,
                                  assignment_rows=rows)
            name = f"{config.name}-keyed"
            self.writer = GatedWriter(self.spark, config, name, gen.batch_offset, guard=guard,
                                      log_folder=routing_log(gen.checkpoint))
            self._held_at = None
            writer = (stream.writeStream.queryName(name).foreachBatch(self.writer)
                      .option("checkpointLocation", gen.checkpoint))
            if config.trigger_seconds is None:
                writer = writer.trigger(availableNow=True)
            else:
                writer = writer.trigger(processingTime=f"{config.trigger_seconds} seconds")
            self.query = writer.start()
        finally:
            self.spark.conf.set("spark.sql.shuffle.partitions", previous)
        self.generation = gen
        log.info("generation %d running: assignment v%d, N=%d, %s", gen.number,
                 gen.assignment_version, gen.n_instances, gen.checkpoint)
        return self.query

    def _routing(self, gen: Generation) -> tuple[DataFrame, VersionGuard | None]:
        """The routing rows of a generation's query, and the guard of its sink.

        Pinned (``pin_assignment``): the generation's own version. Otherwise the latest
        version every micro-batch (live switch), falling back to the version in force
        (the last committed batch's) while the latest is one it must not follow.
        """
        root = self.config.tables_root
        if self.pin_assignment:
            return tables.assignment_rows(self.spark, root, gen.assignment_version), None
        last = checkpoint_position(gen.checkpoint).last_batch
        steps = self.control.steps()
        acknowledged = {s.request_id for s in steps if s.step == "acknowledged"}
        requested = {int(s.assignment_version) for s in steps if s.step == "requested"
                     and s.request_id not in acknowledged and s.assignment_version is not None}
        guard = VersionGuard(self.spark, root, gen.n_instances, in_force_version(gen, last),
                             requested)
        blocked = guard.blocked_versions()
        rows = follow_assignment_rows(tables.assignment_rows(self.spark, root),
                                      tables.assignment_rows(self.spark, root, guard.in_force),
                                      blocked, gen.n_instances)
        log.info("generation %d follows the latest assignment version (in force: %d, "
                 "not followed: %s)", gen.number, guard.in_force, blocked)
        return rows, guard

    def _stop_at_boundary(self, timeout: float = 120.0) -> None:
        """Close the sink gate, wait for the last written batch's commit, stop the query."""
        query, gate = self.query, self.writer.gate
        last = gate.close()
        self.stop_began = gate.closed_at
        commits = Path(self.generation.checkpoint, "commits")
        deadline = time.monotonic() + timeout
        while last is not None and query.isActive and not (commits / str(last)).exists():
            if time.monotonic() > deadline:
                raise RestartError(f"batch {last} was written but not committed in {timeout} s")
            time.sleep(0.05)
        query.stop()
        self.query = None

    def _ensure_stopped(self) -> None:
        if self.query is not None:
            self._stop_at_boundary()

    def _complete_uncommitted(self, gen: Generation, timeout: float = 300.0) -> None:
        """After a crash: let the generation replay its uncommitted batch, then stop it."""
        position = checkpoint_position(gen.checkpoint)
        if not position.uncommitted:
            return
        target = _log_ids(Path(gen.checkpoint, "offsets"))[-1]
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
        commits = Path(gen.checkpoint, "commits")
        deadline = time.monotonic() + self.ack_timeout_seconds
        while True:
            done = _log_ids(commits)
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
