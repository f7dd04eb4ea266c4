"""The steps of the ``rebalance`` DAG that touch the live assignment: apply -> await_restart -> verify.

The streaming job routes every micro-batch by the latest version of the ``assignments``
table (:mod:`rebalance.spark.tables`), so writing a version there *is* the live switch:
:func:`apply` writes a published plan as the next assignment version under the apply
lease and refuses a stale plan (one computed against an assignment version that is no
longer the latest). A controlled restart (``apply_mode`` restart) asks the restartable
job to migrate the moved keys' state; :func:`await_restart` waits for it and restores
the previous version on failure. :func:`verify` checks the realised imbalance of the
next window(s) against the bound the user set, ``1 + theta`` (plus a noise allowance).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from rebalance.control.errors import ApplyRefused, RestartFailed, RunSkipped, VerificationFailed
from rebalance.control.inputs import env_seconds, job_name, plan_store, spark_session
from rebalance.control.params import AUTO_RESTART_ABOVE, unpack
from rebalance.control.tasks import new_routing, publish, validate
from rebalance.core.model import imbalance
from rebalance.core.records import (
    APPLY_LEASE,
    LIVE_STATUSES,
    PlanRecord,
    PlanStatus,
    PlanStoreError,
    as_utc,
    utcnow,
)

if TYPE_CHECKING:
    from rebalance.spark.loads import WindowLoads

log = logging.getLogger(__name__)

APPLY_LEASE_SECONDS = 600

#: The job is taken for down when its ``results`` table has no commit for this long
#: (``REBALANCE_JOB_STALE_SECONDS``). The job commits ``results`` on every micro-batch
#: with events (every 10 s under ``make up``; the gaps seen under load are in
#: ``docs/reliability.md``), so 5 minutes without one means it stopped, or no event
#: arrives: either way a new routing would not be used or checked.
JOB_STALE_SECONDS = 300.0


def resolve_mode(apply_mode: str, migration_fraction: float | None = None,
                 restart_above: float = AUTO_RESTART_ABOVE) -> str:
    """The apply mode used: ``auto`` is a live switch unless the plan moves more than
    ``restart_above`` of the job's state, then a controlled restart.

    The job re-reads the assignments table every micro-batch, so a new version is a
    live switch (``broadcast``); a moved key then restarts its sliding-window state on
    its new instance: the state a live switch drops is exactly the plan's migration
    (``migration_fraction`` of the job's state). ``restart`` asks a restartable job
    (:class:`rebalance.streaming.restart.RestartableJob`, which pins its assignment
    version) to stop, migrate the state of the moved keys and restart with the new
    version; :func:`await_restart` waits for its acknowledgement. ``auto`` weighs the
    two: a restart pauses the whole job (seconds: ``docs/restart.md``, "Pause per
    restart") to keep the moved keys' state; below :data:`AUTO_RESTART_ABOVE` the state dropped
    is too small to be worth that pause (the plans of ``make demo`` and of the DAG
    tests move 1-2 % of the state).
    """
    if apply_mode != "auto":
        return apply_mode
    moved = float(migration_fraction or 0.0)
    return "restart" if moved > restart_above else "broadcast"


def mode_for_job(apply_mode: str, migration_fraction: float | None = None,
                 restart_above: float = AUTO_RESTART_ABOVE, job: str = "keyed",
                 capability: str | None = None,
                 started_by: str | None = None) -> tuple[str, str | None]:
    """The apply mode used for a job that records ``capability`` (``jobs`` table,
    :mod:`rebalance.spark.jobs`): ``(mode, note)``, the note saying why it differs from
    :func:`resolve_mode`'s (None when it does not).

    A job that can only follow live switches (capability ``live``: ``keyed_job.py``) would
    never execute a controlled restart, and ``await_restart`` would wait for it until the
    restart timeout. So ``auto`` switches such a job live (and says so), and an explicit
    ``restart`` is refused at once (:class:`ApplyRefused`). A job that hands each moved
    key's state over at its live switch (capability ``handoff``: ``rebalanced()``) gets a
    live switch for ``restart`` too, with a note. An unknown capability (no record: an
    older store, the DAG tests' stand-ins) changes nothing.
    """
    mode = resolve_mode(apply_mode, migration_fraction, restart_above)
    if mode == "restart" and capability == "handoff":
        return "broadcast", (f"apply_mode {apply_mode} chose a controlled restart, but the job "
                             f"{job!r} hands the moved keys' state over at every live switch "
                             f"(started by {started_by or 'an unknown app'}): published for "
                             "its live switch, which moves the state")
    if mode != "restart" or capability != "live":
        return mode, None
    who = f"the job {job!r} cannot restart (started by {started_by or 'an unknown app'})"
    if apply_mode == "restart":
        raise ApplyRefused(f"apply_mode restart refused: {who}; run spark_apps/"
                           "restartable_job.py for controlled restarts, or choose apply_mode "
                           "broadcast")
    moved = float(migration_fraction or 0.0)
    return "broadcast", (f"apply_mode auto chose a controlled restart (the plan moves "
                         f"{moved:.1%} of the state, restart_above {restart_above:g}), but "
                         f"{who}: live switch instead; the moved keys restart their window "
                         "state on their new instance")


def job_stale_seconds() -> float:
    try:
        return env_seconds("REBALANCE_JOB_STALE_SECONDS", JOB_STALE_SECONDS, lambda v: v > 0,
                           "a number of seconds > 0")
    except ValueError as exc:
        raise ApplyRefused(str(exc)) from None


#: Commits of table maintenance, which say nothing of the job: ``rebalance_maintenance``'s
#: (its ``userMetadata`` kind) and Delta's own operations of that kind.
MAINTENANCE_OPERATIONS = ("DELETE", "OPTIMIZE", "VACUUM START", "VACUUM END")
#: How many of ``results``' newest commits are looked through for the job's newest.
LIVENESS_COMMITS = 50


def job_down_reason(spark) -> str | None:
    """Why the streaming job looks down: its newest ``results`` commit is older than
    :func:`job_stale_seconds` (None when it is recent). Maintenance commits (expiry,
    OPTIMIZE, VACUUM) are not the job's: a dead job does not look alive for
    ``job_stale_seconds`` after the maintenance DAG touched ``results``. A store without a
    ``results`` table (histograms written by other means, as in the DAG tests) is not
    checked."""
    from rebalance.spark import tables

    if not tables.exists(spark, tables.RESULTS):
        return None
    # the newest commit is the job's except after a maintenance run: one read, usually
    mine = _not_maintenance(tables.history(spark, tables.RESULTS, limit=1))
    if not mine:
        mine = _not_maintenance(tables.history(spark, tables.RESULTS, limit=LIVENESS_COMMITS))
    if not mine:
        return (f"the streaming job looks down: the newest commits of results (up to "
                f"{LIVENESS_COMMITS}) are all table maintenance; nothing is applied")
    newest = mine[0].timestamp
    # both naive UTC: the commit's own timestamp, and this machine's clock
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    age = (now - newest).total_seconds()
    limit = job_stale_seconds()
    if age <= limit:
        return None
    return (f"the streaming job looks down: its last results commit is {age:.0f} s old "
            f"(> {limit:.0f} s, REBALANCE_JOB_STALE_SECONDS); nothing is applied")


def _not_maintenance(commits: list) -> list:
    """The commits that are not table maintenance (``MAINTENANCE_OPERATIONS``, or
    ``rebalance_maintenance``'s ``userMetadata``), newest first."""
    return [c for c in commits if c.metadata.get("kind") != "maintenance"
            and c.operation not in MAINTENANCE_OPERATIONS]


def apply(published: Mapping[str, Any]) -> dict[str, Any]:
    """Make the published plan live: write its routing table as the next assignment version.

    One Delta commit on ``assignments`` (annotated with dag id, run id, plan id, method
    and metrics); the streaming job uses it from its next micro-batch on. Holds the
    apply lease, refuses a stale plan (another version was published since it was
    computed), and finds its own earlier publish on a retry instead of writing again.
    Backfill and what-if plans are never applied. Before asking for a controlled restart
    it reads what the running job can do (its newest row of ``jobs``,
    :mod:`rebalance.spark.jobs`): for a job that cannot restart, ``auto`` switches live
    (the reason is logged and added to the plan's reasons) and ``restart`` is refused at
    once (:func:`mode_for_job`).
    """
    from rebalance.spark import tables

    run, p = unpack(published)
    plan_id = published["plan"]["plan_id"]
    spark = spark_session()
    store = plan_store(spark)
    record = store.require(plan_id)
    if record.status in LIVE_STATUSES:
        return {**published, "plan": record.summary()}
    if run.is_backfill or record.status == PlanStatus.WHAT_IF.value:
        raise RunSkipped(f"plan {plan_id} is a what-if plan ({run.run_type} run, apply_mode "
                         f"{p.apply_mode}): backfill and dry-run never apply")
    if record.status != PlanStatus.PUBLISHED.value:
        raise ApplyRefused(f"plan {plan_id} is {record.status}: only a published plan is applied")
    mode, note = resolve_mode(p.apply_mode, record.metrics.get("migration_fraction"),
                              p.restart_above), None
    if mode == "restart":  # can the running job restart? (its newest ``jobs`` row)
        from rebalance.spark.jobs import latest_start

        start = latest_start(spark, job_name())
        try:
            mode, note = mode_for_job(
                p.apply_mode, record.metrics.get("migration_fraction"), p.restart_above,
                job_name(), start.capability if start else None,
                start.started_by() if start else None)
        except ApplyRefused as exc:
            raise ApplyRefused(f"plan {plan_id}: {exc}") from None
        if note:
            log.warning("plan %s: %s", plan_id, note)
    after = record.base_assignment_version   # a plan is published after its base version
    if published_version(spark, plan_id, after)[0] is None:  # not a retry of a done publish
        down = job_down_reason(spark)
        if down:
            raise RunSkipped(f"plan {plan_id}: {down}")
    try:
        with store.lease(APPLY_LEASE, plan_id, APPLY_LEASE_SECONDS):
            version, applied_at = published_version(spark, plan_id, after)
            if version is None:
                latest = tables.latest_assignment_version(spark)
                if latest != record.base_assignment_version:
                    raise ApplyRefused(
                        f"stale plan {plan_id}: computed against assignment version "
                        f"{record.base_assignment_version}, but version {latest} was published "
                        "since; the next run plans again")
                routing, splits = new_routing(store, record)
                version = tables.publish_assignment(
                    spark, routing, int(record.inputs["n_instances"]),
                    metadata={"action": "apply", **record.commit_values(), "apply_mode": mode},
                    splits=splits)
                applied_at = utcnow()
            if mode == "restart":
                from rebalance.streaming.restart import request_restart

                # Idempotent: the request id is the plan id (one Delta transaction).
                request_restart(spark, version, int(record.inputs["n_instances"]),
                                job=job_name(), request_id=plan_id,
                                previous_version=record.base_assignment_version)
            changes = {"reasons": [*record.reasons, note]} if note else {}
            record = store.transition(
                plan_id, PlanStatus.APPLIED, action="apply", apply_mode=mode,
                assignment_version=version, **changes,
                verification={"applied_at": applied_at, "mode": mode,
                              **({"requested_mode": p.apply_mode, "mode_note": note}
                                 if note else {})})
    except PlanStoreError as exc:
        raise ApplyRefused(str(exc)) from None
    log.info("plan %s applied (%s): assignment version %d is live", plan_id, mode, version)
    return {**published, "plan": record.summary()}


def gate_and_apply(stored: Mapping[str, Any], dry_run: bool = False) -> dict[str, Any]:
    """A stored plan through the DAG's path: :func:`~rebalance.control.tasks.validate` ->
    :func:`~rebalance.control.tasks.publish` -> :func:`apply` (not for a dry run). What the
    command line runs (``rebalance apply``, ``rebalance rollback``); raises what they raise."""
    published = publish(validate(stored))
    return published if dry_run else apply(published)


def published_version(spark, plan_id: str, after: int | None = None,
                      ) -> tuple[int | None, dt.datetime | None]:
    """The assignment version a plan was published as, from the Delta history (or None).
    ``after``: the plan's base assignment version; only the commits since are read, so
    the cost does not grow with the table's age."""
    from rebalance.spark import tables

    for commit in tables.assignment_history(spark, after=after or None):
        if commit.metadata.get("plan_id") == plan_id:
            return int(commit.version), as_utc(commit.timestamp)
    return None, None


def await_restart(applied: Mapping[str, Any]) -> dict[str, Any]:
    """Wait for the streaming job to acknowledge a controlled restart (``apply_mode`` restart).

    Returns ``{"is_done": True}`` at once for a live switch, and when the job recorded
    ``acknowledged`` for the plan's restart request (table ``restarts``); ``is_done``
    False while it is under way (the DAG's sensor pokes again). When the job recorded
    that the restart failed and was rolled back, or after ``restart_timeout_minutes``
    (the request is then cancelled, unless the new generation already started), the
    previous assignment version is restored as a new version (action ``rollback``),
    the plan is stored as diverged with the reason, and :class:`RestartFailed` fails
    the task.
    """
    from rebalance.streaming.restart import RestartControl

    _, p = unpack(applied)
    plan_id = applied["plan"]["plan_id"]
    if applied["plan"].get("apply_mode") != "restart":
        return {"is_done": True, "xcom_value": applied}
    spark = spark_session()
    store = plan_store(spark)
    record = store.require(plan_id)
    if record.status == PlanStatus.DIVERGED.value:
        raise RestartFailed(f"plan {plan_id}: " + "; ".join(record.reasons))
    control = RestartControl(spark, job_name())
    status = control.status(plan_id)
    if status["ok"]:
        log.info("restart %s acknowledged: assignment version %d live, pause %s s", plan_id,
                 record.assignment_version, status.get("pause_seconds"))
        return {"is_done": True, "xcom_value": applied}
    waited = utcnow() - (record.applied_at or utcnow())
    if not status["done"] and waited > dt.timedelta(minutes=p.restart_timeout_minutes):
        control.record(plan_id, "cancelled", reason=f"no acknowledgement after {waited}")
        status = control.status(plan_id)
        if not status["cancelled"]:
            log.info("restart %s timed out but its new generation started: waiting", plan_id)
            return {"is_done": False, "xcom_value": None}
        status = {**status, "error": status.get("error") or f"timed out after {waited}"}
    elif not status["done"]:
        log.info("waiting for the job to restart with assignment version %d (%s)",
                 record.assignment_version, status["state"])
        return {"is_done": False, "xcom_value": None,
                "recheck_at": _deadline(record, p.restart_timeout_minutes)}
    restored = roll_back_assignment(spark, record)
    reason = (f"controlled restart failed ({status.get('error') or status['state']}); "
              f"assignment version {record.base_assignment_version} restored as version "
              f"{restored}")
    store.transition(plan_id, PlanStatus.DIVERGED, action="restart-rollback",
                     reasons=[*record.reasons, reason],
                     verification={**record.verification, "restart": status["state"],
                                   "rollback_version": restored})
    raise RestartFailed(f"plan {plan_id}: {reason}")


def roll_back_assignment(spark, record: PlanRecord) -> int:
    """Publish the plan's base assignment again as the newest version (once per plan)."""
    from rebalance.spark import tables

    # the rollback comes after the plan's own version, itself after its base version
    for commit in tables.assignment_history(spark, after=record.base_assignment_version or None):
        if commit.metadata.get("rollback_of") == record.plan_id:
            return int(commit.version)
    base = tables.read_assignment(spark, version=record.base_assignment_version or 0)
    return tables.publish_assignment(
        spark, base.routing, int(record.inputs["n_instances"]),
        metadata={"action": "rollback", "rollback_of": record.plan_id,
                  "restores_version": base.version, "dag_id": record.dag_id,
                  "run_id": record.run_id}, splits=base.splits)


# --------------------------------------------------------------------- verify
def verify(applied: Mapping[str, Any]) -> dict[str, Any]:
    """Check the realised imbalance of the next window(s) against ``1 + theta``.

    Looks for ``verify_windows`` windows processed entirely under the new assignment
    version (rows of ``key_histograms`` tagged with it). Returns
    ``{"is_done": False, ...}`` while they have not arrived (the DAG's sensor pokes
    again) and fails after ``verify_timeout_minutes``. Records the realised imbalance
    on the plan: status verified when it is at most ``1 + theta + verify_tolerance``
    (:func:`verify_limit`), otherwise diverged, and the task fails.
    """
    _, p = unpack(applied)
    plan_id = applied["plan"]["plan_id"]
    spark = spark_session()
    store = plan_store(spark)
    record = store.require(plan_id)
    if record.status in (PlanStatus.VERIFIED.value, PlanStatus.DIVERGED.value):
        return _verified(record)
    if record.status != PlanStatus.APPLIED.value:
        raise RunSkipped(f"plan {plan_id} is {record.status}: nothing was applied to verify")
    loads, windows = loads_under_version(spark, record.assignment_version,
                                         int(record.inputs["n_instances"]), p.verify_windows)
    if loads is None:
        waited = utcnow() - (record.applied_at or utcnow())
        if waited > dt.timedelta(minutes=p.verify_timeout_minutes):
            raise VerificationFailed(
                f"plan {plan_id}: no complete window under assignment version "
                f"{record.assignment_version} after {waited}; is the streaming job running?")
        log.info("waiting for %d window(s) under assignment version %d (%d so far)",
                 p.verify_windows, record.assignment_version, len(windows))
        return {"is_done": False, "xcom_value": None,
                "recheck_at": _deadline(record, p.verify_timeout_minutes)}
    # the windows' loads summed, over the N instances (1.0 when there is no load)
    realised = float(imbalance(loads.loads.sum(axis=0), loads.active))
    predicted = float(record.predicted_imbalance)
    limit = verify_limit(p.theta, p.verify_tolerance)
    ok = bool(realised <= limit)
    status = PlanStatus.VERIFIED if ok else PlanStatus.DIVERGED
    record = store.transition(
        plan_id, status, action="verify", realised_imbalance=realised,
        verification={**record.verification, "windows": windows, "predicted": predicted,
                      "realised": realised, "theta": p.theta, "tolerance": p.verify_tolerance,
                      "limit": limit, "within_bound": ok})
    return _verified(record)


def _deadline(record: PlanRecord, minutes: float) -> float | None:
    """Epoch seconds at which a wait on the applied plan times out (None: not applied)."""
    if record.applied_at is None:
        return None
    return (record.applied_at + dt.timedelta(minutes=minutes)).timestamp()


def verify_limit(theta: float, tolerance: float) -> float:
    """The largest realised imbalance ``verify`` accepts: ``1 + theta + tolerance``.

    What the user is promised is ``imbalance <= 1 + theta`` in the windows after the plan
    went live, so that is what is checked, not the plan's own prediction (a plan predicted
    at 1.05 that lands at 1.09 with theta 0.1 kept its promise; one that lands at 1.2
    did not, however close to a prediction of 1.15 it came). ``tolerance`` (run param
    ``verify_tolerance``, default :data:`~rebalance.control.params.VERIFY_TOLERANCE`,
    at most 0.5) is the allowance for one window's noise."""
    return 1.0 + float(theta) + float(tolerance)


def _verified(record: PlanRecord) -> dict[str, Any]:
    v = record.verification
    if record.status == PlanStatus.DIVERGED.value:
        if "limit" not in v:  # no limit recorded: a restart that failed, or an older record
            raise VerificationFailed(f"plan {record.plan_id} diverged: "
                                     + "; ".join(record.reasons[-1:]))
        raise VerificationFailed(
            f"plan {record.plan_id}: realised imbalance {record.realised_imbalance:.3f} exceeds "
            f"1 + theta + verify_tolerance = 1 + {v['theta']:g} + {v['tolerance']:g} "
            f"(predicted {record.predicted_imbalance:.3f}) over window(s) "
            f"{', '.join(v.get('windows') or [])}")
    log.info("plan %s verified: realised imbalance %.3f <= %.3f (1 + theta + "
             "verify_tolerance), predicted %.3f", record.plan_id, record.realised_imbalance,
             v.get("limit", float("nan")), record.predicted_imbalance)
    return {"is_done": True, "xcom_value": record.summary()}


def loads_under_version(spark, version: int, n_instances: int,
                        n_windows: int) -> tuple[WindowLoads | None, list[str]]:
    """The instance loads of the first ``n_windows`` complete windows run under ``version``
    and those windows' starts.

    A window counts when every one of its rows carries ``version`` (the switch did not
    happen inside it). Returns (None, windows found) while there are not enough.
    """
    from rebalance.spark import tables
    from rebalance.spark.loads import window_loads

    # Only windows with a row under ``version`` can qualify: found first, with the files
    # written before the version skipped by their statistics, so a check does not group
    # the whole table by window (its cost would grow with the service's age).
    mine = tables.read_pandas(spark, tables.KEY_HISTOGRAMS, columns=["window_start"],
                              filters=[("assignment_version", "=", int(version))])
    candidates = sorted(set(mine["window_start"])) if mine is not None else []
    if not candidates:
        return None, []
    rows = tables.read_pandas(spark, tables.KEY_HISTOGRAMS,
                              columns=["window_start", "assignment_version"],
                              filters=[("window_start", "in", candidates)])
    span = rows.groupby("window_start")["assignment_version"].agg(["min", "max"])
    per_window = span[(span["min"] == version) & (span["max"] == version)].sort_index()
    per_window = per_window.head(n_windows).reset_index()
    windows = [as_utc(w) for w in per_window["window_start"]]
    if len(windows) < n_windows:
        return None, [w.isoformat() for w in windows]
    loads = window_loads(spark, n_instances, starts=windows, source=tables.KEY_HISTOGRAMS)
    return loads, [w.isoformat() for w in windows]
