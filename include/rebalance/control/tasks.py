"""The planning tasks of the ``rebalance`` DAG: detect -> plan -> validate -> publish.

Every function takes the small dict the previous task returned and returns a small
JSON-able dict; DataFrames and arrays never travel between tasks. Everything durable is
in Delta (:mod:`rebalance.spark.plan_store`), and every step is idempotent: the plan id
is a hash of the run and its input snapshot (:func:`rebalance.control.params.plan_id_for`),
so a retried or cleared task finds the stored plan instead of planning again, and every
Delta write carries ``txnAppId``/``txnVersion`` derived from the plan id and its status.
The steps that touch the live assignment are :mod:`rebalance.control.rollout`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..model import Problem, imbalance
from ..trigger import TriggerPolicy, mldc
from ..validation import PlanLimits, validate_plan
from .errors import ApplyRefused, InvalidParams, PlanRejected, RunSkipped
from .inputs import assignment_frame, load_problem, plan_store, spark_session
from .params import RunInfo, RunParams, plan_id_for, unpack
from .records import LIVE_STATUSES, PlanRecord, PlanStatus, utcnow

if TYPE_CHECKING:
    from ..spark.plan_store import PlanStore

log = logging.getLogger(__name__)


def trigger_policy(p: RunParams) -> TriggerPolicy:
    """Seed 004's trigger rules (:mod:`rebalance.trigger`) with the run's ``min_events``."""
    return TriggerPolicy(min_items=int(p.min_events))


def periods_since_last_plan(store: PlanStore, run: RunInfo) -> int | None:
    """Whole schedule periods between the interval of the latest plan that went live
    (another run's) and this run's interval; None when none went live before it."""
    now = run.end or utcnow()
    last = store.last_live_plan_before(now, exclude_run=run.run_id)
    if last is None:
        return None
    period = (run.end - run.start) if run.start and run.end and run.end > run.start else None
    return int((now - last) // period) if period else 0


def detect(windows: Mapping[str, Any]) -> dict[str, Any]:
    """Apply the trigger rules of seed 004 to the current assignment.

    Rebalance only when MLDC (imbalance - 1) exceeds 0.5, at least ``min_events``
    events were processed, and no plan went live in the last 3 schedule periods; the
    fourth rule (the candidate improves MLDC by more than 0.3) is checked by
    :func:`plan`. ``force`` overrides the rules. Raises :class:`RunSkipped` otherwise.
    """
    run, p = unpack(windows)
    inputs = dict(windows["inputs"])
    if "detect" in inputs:  # replay of a run that already stored its plan
        return {**windows, "inputs": inputs}
    spark = spark_session()
    problem, _ = load_problem(spark, inputs)
    imb = _current_imbalance(problem)
    since = periods_since_last_plan(plan_store(spark), run)
    # Rules 1-3 now; rule 4 needs the candidate plan and is checked by plan().
    rules_1_to_3 = dataclasses.replace(trigger_policy(p), min_improvement=0.0)
    decision = rules_1_to_3.decide(imb, int(inputs["events"]), since,
                                   predicted_imbalance=1.0, force=p.force)
    inputs["detect"] = {"imbalance": round(imb, 6), "mldc": round(mldc(imb), 6),
                        "events": inputs["events"], "periods_since_last_plan": since,
                        "decision": str(decision)}
    if not decision.trigger:
        raise RunSkipped(f"{decision} (seed 004 trigger rules; set force to plan anyway)")
    log.info("imbalance %.3f (MLDC %.3f) over %d instances: %s", imb, mldc(imb),
             problem.n_instances, decision)
    return {**windows, "inputs": inputs}


def _current_imbalance(problem: Problem) -> float:
    return imbalance(problem.instance_loads(problem.current), problem.active)


# ----------------------------------------------------------------------- plan
def plan(detected: Mapping[str, Any]) -> dict[str, Any]:
    """Compute the plan with the chosen planner and store it (status proposed).

    A retry finds the stored plan by its id and returns it. Raises
    :class:`RunSkipped` when the candidate improves MLDC by no more than 0.3 (the
    fourth trigger rule of seed 004), unless forced.
    """
    from ..planners import get_planner

    run, p = unpack(detected)
    inputs = dict(detected["inputs"])
    plan_id = plan_id_for(run, p, inputs)
    spark = spark_session()
    store = plan_store(spark)
    stored = store.get(plan_id)
    if stored is not None:
        log.info("plan %s already stored (%s)", plan_id, stored.status)
        return {**detected, "plan": stored.summary()}

    problem, _ = load_problem(spark, inputs)
    inputs.update(n_keys=problem.n_keys, total_state=float(problem.state.sum()))
    result = get_planner(p.method).plan(problem, p.planner_params(float(problem.state.sum())))
    metrics = result.metrics_dict()
    decision = trigger_policy(p).decide(
        metrics["imbalance_before"], int(inputs["events"]),
        inputs["detect"]["periods_since_last_plan"],
        predicted_imbalance=metrics["imbalance_after"], force=p.force)
    if not decision.trigger:
        raise RunSkipped(f"{p.method}: {decision} (seed 004 trigger rules)")
    record = PlanRecord(
        plan_id=plan_id, status=PlanStatus.PROPOSED.value, method=p.method,
        dag_id=run.dag_id, run_id=run.run_id, run_type=run.run_type,
        data_interval_start=run.start, data_interval_end=run.end,
        params=p.to_dict(), metrics=metrics, inputs=inputs, apply_mode=p.apply_mode,
        reasons=list(result.notes),
        base_assignment_version=int(inputs["base_assignment_version"]),
        predicted_imbalance=float(metrics["imbalance_after"]),
    )
    record = store.propose(record, assignment_frame(problem, result.assignment))
    log.info("plan %s (%s): imbalance %.3f -> %.3f, %d keys move (%.1f%% of state)",
             plan_id, p.method, metrics["imbalance_before"], metrics["imbalance_after"],
             metrics["moved_keys"], 100 * metrics["migration_fraction"])
    return {**detected, "plan": record.summary()}


# ------------------------------------------------------------------- rollback
def propose_rollback(to_version: int, dry_run: bool = False) -> dict[str, Any]:
    """The ``rebalance_rollback`` DAG's first task: store the plan restoring ``to_version``
    (:func:`rebalance.control.rollback.propose_rollback`); then validate, publish and apply
    as any plan."""
    from .rollback import propose_rollback as propose

    try:
        return propose(spark_session(), int(to_version), dry_run=dry_run)
    except (LookupError, ValueError) as exc:
        raise InvalidParams(f"cannot roll back to assignment version {to_version}: {exc}") from None


# ------------------------------------------------------------------- validate
def plan_limits(record: PlanRecord, theta: float | None = None) -> PlanLimits:
    """The bounds a stored plan must meet: its params, and the number of keys, total
    state and instances of its inputs (never the planner's own report)."""
    p = RunParams(**{k: v for k, v in record.params.items() if k in RunParams.__dataclass_fields__})
    budget = (None if p.migration_budget is None
              else p.migration_budget * float(record.inputs["total_state"]))
    return PlanLimits(
        n_instances=int(record.inputs["n_instances"]),
        theta=float(p.theta if theta is None else theta),
        expected_keys=int(record.inputs["n_keys"]),
        max_table=p.max_table,
        budget_bytes=budget,
    )


def validate(planned: Mapping[str, Any]) -> dict[str, Any]:
    """Check the stored plan with the Great Expectations gate of :mod:`rebalance.validation`.

    Every key exactly once, instances in range, no nulls, predicted imbalance <= 1 +
    theta, migration within budget, table size within bound, and every reported metric
    equal to the one recomputed from the assignment. A failing plan is stored as
    rejected with the reasons, and :class:`PlanRejected` fails the task loudly.
    """
    plan_id = planned["plan"]["plan_id"]
    store = plan_store()
    record = store.require(plan_id)
    if record.status == PlanStatus.REJECTED.value:
        raise PlanRejected(f"plan {plan_id} was rejected: " + "; ".join(record.reasons))
    if record.status != PlanStatus.PROPOSED.value:
        return {**planned, "plan": record.summary()}
    result = validate_plan(store.frame(plan_id), record.metrics, plan_limits(record))
    if not result.success:
        record = store.transition(plan_id, PlanStatus.REJECTED, action="reject",
                                  reasons=list(result.failures), validation=result.statistics)
        raise PlanRejected(f"plan {plan_id} rejected by validation, not applied: "
                           + "; ".join(result.failures))
    record = store.transition(plan_id, PlanStatus.VALIDATED, action="validate",
                              validation=result.statistics)
    log.info("plan %s: %s", plan_id, result.summary())
    return {**planned, "plan": record.summary()}


# -------------------------------------------------------------------- publish
def publish(validated: Mapping[str, Any]) -> dict[str, Any]:
    """Publish the validated plan: cleared for apply, or stored as a what-if plan.

    The plan row records the decision in one commit annotated with dag id, run id, plan
    id, method and metrics; its full assignment is already in ``plan_assignments``.
    Backfill runs and ``apply_mode="dry-run"`` store the plan as what-if: it is never
    applied and the live assignment is untouched.
    """
    run, p = unpack(validated)
    plan_id = validated["plan"]["plan_id"]
    store = plan_store()
    record = store.require(plan_id)
    if record.status == PlanStatus.VALIDATED.value:
        if run.is_backfill or p.apply_mode == "dry-run":
            why = "backfill run" if run.is_backfill else "apply_mode=dry-run"
            record = store.transition(plan_id, PlanStatus.WHAT_IF, action="what-if",
                                      reasons=[*record.reasons, f"what-if only: {why}"])
            log.info("plan %s stored as what-if (%s); the live assignment is untouched",
                     plan_id, why)
        else:
            record = store.transition(plan_id, PlanStatus.PUBLISHED, action="publish")
            log.info("plan %s published: %d keys move, imbalance %.3f -> %.3f", plan_id,
                     record.metrics["moved_keys"], record.metrics["imbalance_before"],
                     record.predicted_imbalance)
    elif record.status not in (PlanStatus.PUBLISHED.value, PlanStatus.WHAT_IF.value,
                               *LIVE_STATUSES):
        raise ApplyRefused(f"plan {plan_id} is {record.status}: only a validated plan is published")
    return {**validated, "plan": record.summary()}


def new_routing(store: PlanStore, record: PlanRecord) -> dict[str, int]:
    """Routing table of a plan's assignment: planned keys off their default instance,
    plus the base version's entries for keys the plan did not see (kept as they are)."""
    from ..spark import tables

    frame = store.frame(record.plan_id)
    base = tables.read_assignment(store.spark, version=record.base_assignment_version or 0).routing
    planned = set(frame["key"])
    routing = {k: v for k, v in base.items() if k not in planned}
    routed = frame.loc[frame["instance"] != frame["default"]]
    routing.update(zip(routed["key"].astype(str), routed["instance"].astype(int)))
    return dict(sorted(routing.items()))


def needs_approval(published: Mapping[str, Any]) -> bool:
    """True when the run asked for a person's approval of a plan that would go live."""
    _, p = unpack(published)
    return bool(p.require_approval) and published["plan"]["status"] == PlanStatus.PUBLISHED.value


