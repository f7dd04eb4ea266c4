"""What the running streaming job can do, recorded when it starts (the Delta table ``jobs``).

``spark_apps/keyed_job.py`` (:func:`rebalance.streaming.job.start_job`) follows every new
assignment version live but cannot execute a controlled restart; ``spark_apps/
restartable_job.py`` (:class:`rebalance.streaming.restart.RestartableJob`) can. Each
records one row when its process starts (:func:`record_start`): job name, capability
(:data:`LIVE` or :data:`RESTART`), the script that started it, the generation (restartable
job), when, host and pid, and whether it merges the partial results of a split key (the
built-in jobs do; a ``rebalanced()`` query does not: ``validate`` then rejects a plan that
splits keys, :func:`split_refusal`). The control plane's ``apply`` reads the newest row of its job
(:func:`latest_start`) before it asks for a restart: ``auto`` falls back to a live switch
for a job that cannot restart, an explicit ``restart`` is refused at once
(:func:`rebalance.control.rollout.mode_for_job`). No row (a store older than this table,
or histograms written by other means): nothing is known, nothing changes.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pyspark.sql import SparkSession

from rebalance.core.records import as_utc
from rebalance.spark import tables
from rebalance.spark.plan_store import CONFLICT_BACKOFF_SECONDS, CONFLICT_RETRIES, is_conflict, utcnow

log = logging.getLogger(__name__)

#: The job follows live switches only (``keyed_job.py``).
LIVE = "live"
#: The job executes controlled restarts too (``restartable_job.py``).
RESTART = "restart"
#: The job hands each moved key's state over at every live switch (``rebalanced()``), so a
#: live switch does what a controlled restart would.
HANDOFF = "handoff"
CAPABILITIES = (LIVE, RESTART, HANDOFF)


@dataclass(frozen=True)
class JobStart:
    """One row of ``jobs``: a start of the streaming job and what it can do."""

    job: str
    capability: str
    app: str | None
    generation: int | None
    started_at: datetime | None
    host: str | None
    pid: int | None
    #: Whether the job merges the partial results of a split key (None: not recorded).
    splits: bool | None = None

    def started_by(self) -> str:
        """``keyed_job.py, pid 4242 on host-a at 2026-11-27 02:41 UTC``."""
        text = self.app or "an unknown app"
        if self.pid is not None:
            text += f", pid {self.pid}" + (f" on {self.host}" if self.host else "")
        if self.started_at is not None:
            text += f" at {self.started_at.strftime('%Y-%m-%d %H:%M UTC')}"
        return text


def current_app() -> str:
    """The script this process runs (``keyed_job.py``), from ``sys.argv[0]`` (a package
    run with ``python -m``: the package's name)."""
    path = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if path is None:
        return "python"
    return path.parent.name if path.name == "__main__.py" and path.parent.name else path.name


def record_start(spark: SparkSession, config, capability: str, generation: int | None = None,
                 app: str | None = None, splits: bool | None = None) -> JobStart:
    """Append the row of this start of the job ``config`` (a
    :class:`~rebalance.streaming.job.JobConfig`: its ``name`` and ``tables_root``) can do
    ``capability`` and, with ``splits``, whether it merges split keys: one commit; creates
    ``jobs`` if needed."""
    job, root = config.name, config.tables_root
    if capability not in CAPABILITIES:
        raise ValueError(f"capability must be one of {', '.join(CAPABILITIES)}, "
                         f"got {capability!r}")
    start = JobStart(job, capability, app or current_app(), generation, utcnow(),
                     socket.gethostname(), os.getpid(), splits)
    row = dict(job=start.job, capability=start.capability, app=start.app,
               generation=start.generation, started_at=start.started_at, host=start.host,
               pid=start.pid, splits=start.splits)
    meta = {"kind": "job-start", "job": job, "capability": capability}
    for attempt in range(CONFLICT_RETRIES + 1):
        try:  # blind appends; only the table's creation by a concurrent start can conflict
            tables.ensure_table(spark, tables.JOBS, root)
            tables.append_rows(spark, [row], tables.JOBS, root, metadata=meta)
            break
        except Exception as exc:  # noqa: BLE001 - only Delta's concurrent-commit conflicts
            if not is_conflict(exc) or attempt == CONFLICT_RETRIES:
                raise
            time.sleep(CONFLICT_BACKOFF_SECONDS * 2 ** attempt)
    log.info("job %r started by %s: capability %s", job, start.app, capability)
    return start


def latest_start(spark: SparkSession, job: str,
                 root: str | Path | None = None) -> JobStart | None:
    """The newest recorded start of ``job`` (None: no ``jobs`` table, or no row of it)."""
    rows = tables.read_rows(spark, tables.JOBS, root, filters=[("job", "=", job)])
    if not rows:
        return None
    # the newest start; a table of an earlier release has no ``splits`` yet
    r = max(rows, key=lambda r: as_utc(r["started_at"]) or datetime.min.replace(tzinfo=timezone.utc))
    return JobStart(r["job"], r["capability"], r["app"],
                    None if r["generation"] is None else int(r["generation"]),
                    as_utc(r["started_at"]), r["host"], None if r["pid"] is None else int(r["pid"]),
                    r.get("splits"))


def split_refusal(start: JobStart | None) -> str | None:
    """Why the job of ``start`` cannot take a plan that splits keys (None: it can, or
    nothing is recorded)."""
    if start is None or start.splits is not False:
        return None
    return (f"the job {start.job!r} does not merge the partial results of a split key "
            f"(started by {start.started_by()}); plan without split keys")
