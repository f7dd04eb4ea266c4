"""The ``restarts`` control table of a restartable job, and what a generation is.

A restart request and every step the job takes to execute it are rows of the Delta
table ``restarts`` (:data:`STEPS`), each written once (Delta transaction: request
id, step order); the DAG writes the request (:func:`request_restart`) and reads
the status (:meth:`RestartControl.status`). See :mod:`rebalance.streaming.restart`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from rebalance.core.records import as_utc
from rebalance.spark import tables
from rebalance.spark.delta_rs import log_version
from rebalance.spark.plan_store import CONFLICT_BACKOFF_SECONDS, CONFLICT_RETRIES, is_conflict, utcnow

log = logging.getLogger(__name__)

#: Steps of a request and their order (the Delta ``txnVersion`` of their row).
STEPS = {"requested": 10, "stopped": 20, "state_written": 30, "cancelled": 35, "started": 40,
         "acknowledged": 50, "failed": 60, "rolled_back": 70}
#: Steps after which a request is finished.
TERMINAL = ("acknowledged", "rolled_back")
BOOTSTRAP = "bootstrap"


class RestartError(RuntimeError):
    """A restart cannot proceed (with the reason)."""


@dataclass(frozen=True)
class Generation:
    """One run of the keyed query: the assignment version it starts with, N and checkpoint.

    ``batch_offset`` is the global number of its checkpoint's batch 0; ``source``
    says where its checkpoint's Delta source starts (``starting_version``,
    ``exclude_files`` of that version already processed, ``min_event_ms``: events
    at or before the old watermark are late); ``state_path`` holds its checkpoint's
    initial state (None: empty). ``in_place``: it continues the checkpoint of the
    generation before it (same N), from its local batch ``start_batch`` on, and
    received the moved keys' state inside the stream (handoff rows).
    """

    number: int
    assignment_version: int
    n_instances: int
    checkpoint: str
    batch_offset: int = 0
    source: dict[str, Any] = field(default_factory=lambda: {"starting_version": 0})
    state_path: str | None = None
    start_batch: int = 0
    in_place: bool = False


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
        self._ready = False
        #: (log version, this job's steps at it): the job polls every few seconds, and a
        #: poll that finds the table at the version read last reads nothing again
        self._cached: tuple[int, list[Step]] | None = None

    def record(self, request_id: str, step: str, generation: Generation | None = None,
               assignment_version: int | None = None, n_instances: int | None = None,
               **detail: Any) -> None:
        """Write the step once (a second write of it, or of an earlier step, is skipped)."""
        self.record_steps(request_id, [(step, generation, dict(
            detail, assignment_version=assignment_version, n_instances=n_instances))])

    def record_steps(self, request_id: str,
                     steps: list[tuple[str, Generation | None, dict[str, Any]]]) -> None:
        """Write consecutive steps in one commit (``(step, generation, detail)``, detail
        may name ``assignment_version`` and ``n_instances``); as :meth:`record`, once."""
        if not self._ready:
            tables.ensure_table(self.spark, tables.RESTARTS, self.root)
            self._ready = True
        rows = []
        for step, generation, detail in steps:
            detail = dict(detail)
            assignment_version = detail.pop("assignment_version", None)
            n_instances = detail.pop("n_instances", None)
            if generation is not None:
                detail["generation"] = dataclasses.asdict(generation)
                assignment_version = generation.assignment_version
                n_instances = generation.n_instances
            rows.append(dict(zip(tables.RESTARTS.columns, (
                request_id, step, self.job, generation.number if generation else None,
                assignment_version, n_instances, generation.checkpoint if generation else None,
                json.dumps(detail, sort_keys=True, default=str), utcnow()))))
        names = [step for step, _, _ in steps]
        meta = {"kind": "restart", "job": self.job, "request_id": request_id,
                "step": names[-1], **({"steps": names} if len(names) > 1 else {})}
        txn = (f"restart:{self.job}:{request_id}", max(STEPS[n] for n in names))
        # The job (its steps) and the DAG (requests, cancellations) append to this table
        # concurrently. Blind appends are reconciled by Delta itself; a commit that still
        # loses the optimistic-concurrency check (e.g. against the table's creation by
        # the other side) is retried: the transaction id makes a retry write it once.
        for attempt in range(CONFLICT_RETRIES + 1):
            try:
                tables.append_rows(self.spark, rows, tables.RESTARTS, self.root,
                                   metadata=meta, txn=txn)
                break
            except Exception as exc:  # noqa: BLE001 - only Delta's concurrent-commit conflicts
                if not is_conflict(exc) or attempt == CONFLICT_RETRIES:
                    raise
                log.info("restarts: concurrent commit while recording %s of %s, retry %d",
                         names[-1], request_id, attempt + 1)
                time.sleep(CONFLICT_BACKOFF_SECONDS * 2 ** attempt)
        log.info("restart %s: %s", request_id, ", ".join(names))

    def steps(self, request_id: str | None = None) -> list[Step]:
        """Recorded steps (of one request), in commit order.

        Read again only when the table has a commit not read yet (a local table's log
        version, :func:`rebalance.spark.delta_rs.log_version`); a URI is read every time."""
        version = log_version(tables.RESTARTS.path(self.root))
        if version is not None and self._cached is not None and self._cached[0] == version:
            steps = self._cached[1]
        else:
            if not tables.exists(self.spark, tables.RESTARTS, self.root):
                return []
            # the version listed before the read: a commit in between makes the next call
            # read again (the cache is never newer than the key it is stored under claims)
            rows = tables.read_rows(self.spark, tables.RESTARTS, self.root,
                                    filters=[("job", "=", self.job)])
            rows = sorted(rows, key=lambda r: (as_utc(r["at"]), STEPS[r["step"]]))
            steps = [Step(r["request_id"], r["step"], r["generation"], r["assignment_version"],
                          r["n_instances"], r["checkpoint"], json.loads(r["detail"] or "{}"),
                          as_utc(r["at"]))
                     for r in rows]
            self._cached = None if version is None else (version, steps)
        return [s for s in steps if request_id is None or s.request_id == request_id]

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
