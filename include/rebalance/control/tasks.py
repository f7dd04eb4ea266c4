"""The planning tasks of the ``rebalance`` DAG: detect -> plan -> validate -> publish.

What detect and plan decide from the windows (trigger, load model, theta_plan, the
backtest gate) is :mod:`rebalance.control.decide`, without Spark; these functions read
and store.

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

from rebalance.control import decide
from rebalance.control.errors import ApplyRefused, InvalidParams, PlanRejected, RunSkipped
from rebalance.control.inputs import (
    assignment_frame,
    base_assignment,
    job_name,
    load_problem,
    load_rows,
    plan_store,
    spark_session,
    window_history,
)
from rebalance.control.params import RunInfo, RunParams, plan_id_for, unpack
from rebalance.control.validation import PlanLimits, validate_plan
from rebalance.core.records import (
    LIVE_STATUSES,
    SPLIT_COLUMN,
    PlanRecord,
    PlanStatus,
    frame_splits,
    utcnow,
)
from rebalance.core.trigger import TriggerPolicy

if TYPE_CHECKING:
    from rebalance.spark.plan_store import PlanStore

log = logging.getLogger(__name__)


def trigger_policy(p: RunParams) -> TriggerPolicy:
    """The MLDC paper's trigger rules (:mod:`rebalance.core.trigger`) with the run's
    ``min_events``."""
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
    """Decide whether the job needs a plan, by the run's ``trigger_rule``.

    ``theta`` (default): a majority of the latest 3 windows (2 of 3, 2 of 2, 1 of 1)
    exceed ``1 + theta`` under the live assignment. ``mldc``: imbalance above 1.5, at
    least ``min_events`` events and no plan live in the last 3 schedule periods (its
    fourth rule, the plan lowers the imbalance by more than 0.3, is checked by
    :func:`plan`). ``force`` overrides either. Raises :class:`RunSkipped` otherwise.
    """
    run, p = unpack(windows)
    inputs = dict(windows["inputs"])
    if "detect" in inputs:  # replay of a run that already stored its plan
        return {**windows, "inputs": inputs}
    spark = spark_session()
    base = base_assignment(spark, inputs)
    history, current = window_history(load_rows(spark, inputs), int(inputs["n_instances"]),
                                      base.routing, base.splits)
    since = (periods_since_last_plan(plan_store(spark), run) if p.trigger_rule == "mldc"
             else None)
    decision, facts = decide.detect(history, current, p, int(inputs["events"]), since)
    inputs["detect"] = facts
    if not decision.trigger:
        raise RunSkipped(f"{decision} ({decide.rule_text(p.trigger_rule)})")
    log.info("imbalance per window %s (bound %.3f) over %d instances: %s",
             facts["window_imbalance"], 1 + p.theta, history.n_instances, decision)
    return {**windows, "inputs": inputs}


# ----------------------------------------------------------------------- plan
def plan(detected: Mapping[str, Any]) -> dict[str, Any]:
    """Choose how to plan by backtest, check that such plans hold, plan, and store the plan
    (status proposed).

    The run's windows become a :class:`~rebalance.core.backtest.WindowHistory`;
    :func:`rebalance.control.decide.plan_policy` holds out the latest third of them,
    chooses the load model and ``theta_plan`` on the rest (``load_model`` auto: by
    backtest, within the planner's time limit) and replays a plan made that way on the
    held-out windows against keeping the live assignment. Raises :class:`RunSkipped`
    with both figures when it does not lower the mean realised imbalance by at least
    ``min_backtest_gain`` (and, for ``trigger_rule`` mldc, when the plan improves MLDC
    by no more than 0.3), unless forced. Otherwise the chosen planner plans on the load
    model's forecast over all the run's windows with ``theta_plan``, and the plan is
    stored with its load model, theta_plan, backtested imbalance and the reasons
    (``inputs["backtest"]``). A retry finds the stored plan by its id and returns it.
    """
    from rebalance.core.model import evaluate
    from rebalance.core.planners import get_planner
    from rebalance.core.planners.split import evaluate_split, plan_split

    run, p = unpack(detected)
    inputs = dict(detected["inputs"])
    plan_id = plan_id_for(run, p, inputs)
    spark = spark_session()
    store = plan_store(spark)
    stored = store.get(plan_id)
    if stored is not None:
        log.info("plan %s already stored (%s)", plan_id, stored.status)
        return {**detected, "plan": stored.summary()}

    rows = load_rows(spark, inputs)
    base = base_assignment(spark, inputs)
    history, current = window_history(rows, int(inputs["n_instances"]), base.routing,
                                      base.splits)
    problem, _ = load_problem(spark, inputs, rows=rows, table=base.routing)
    total_state = float(problem.state.sum())
    inputs.update(n_keys=problem.n_keys, total_state=total_state)
    params = p.planner_params(total_state)
    planning = decide.plan_policy(history, current, p, time_limit=params.time_limit)
    if planning.skip:
        raise RunSkipped(f"{p.method}: " + "; ".join(planning.decision.reasons)
                         + " (set force to plan anyway)")
    model, theta_plan = planning.load_model, planning.theta_plan
    if base.splits:    # the forecast is per key: a split key's shares summed back
        history, _ = window_history(rows, int(inputs["n_instances"]), base.routing)
    forecast = decide.forecast_problem(problem, history, model)
    planned_with = dataclasses.replace(params, theta=theta_plan)
    result = (plan_split(forecast, planned_with, base=p.method) if p.split_keys
              else get_planner(p.method).plan(forecast, planned_with))
    split = result.split if result.split is not None and len(result.split) else None
    metrics = result.metrics_dict()
    if forecast.scenarios is not None:
        # robust: the plan kept every scenario within the bound; the stored frame holds
        # the forecast (their mean), so its metrics are reported on it (the gate
        # recomputes them from the frame) and the worst scenario is kept beside them.
        worst = metrics["imbalance_after"]
        flat = dataclasses.replace(forecast, scenarios=None)
        metrics.update((evaluate_split(flat, result.assignment, split) if split is not None
                        else evaluate(flat, result.assignment)).to_dict())
        planning.facts["worst_scenario_imbalance"] = worst
    reasons = [decide.plan_summary(metrics, theta_plan)]
    inputs["planner_notes"] = list(result.notes)   # how the planner got there, its terms
    if p.trigger_rule == "mldc":
        decision = trigger_policy(p).decide(
            metrics["imbalance_before"], int(inputs["events"]),
            inputs["detect"]["periods_since_last_plan"],
            predicted_imbalance=metrics["imbalance_after"], force=p.force)
        if not decision.trigger:
            raise RunSkipped(f"{p.method}: {decision} (MLDC trigger rules)")
    inputs["backtest"] = {
        "load_model": str(model), "theta": p.theta, "theta_plan": theta_plan,
        "decision": str(planning.decision), "reasons": planning.reasons,
        "forced": planning.decision.forced, **planning.facts,
    }
    reasons += planning.reasons
    record = PlanRecord(
        plan_id=plan_id, status=PlanStatus.PROPOSED.value, method=p.method,
        dag_id=run.dag_id, run_id=run.run_id, run_type=run.run_type,
        data_interval_start=run.start, data_interval_end=run.end,
        params=p.to_dict(), metrics=metrics, inputs=inputs, apply_mode=p.apply_mode,
        reasons=reasons,
        base_assignment_version=int(inputs["base_assignment_version"]),
        predicted_imbalance=float(metrics["imbalance_after"]),
    )
    record = store.propose(record, assignment_frame(
        forecast, result.assignment, split.mapping(forecast.keys) if split is not None else None))
    log.info("plan %s (%s, load model %s, theta_plan %g): imbalance %.3f -> %.3f predicted, "
             "%s backtested vs %s staying; %d keys move (%.1f%% of state)", plan_id, p.method,
             model, theta_plan, metrics["imbalance_before"], metrics["imbalance_after"],
             _f3(planning.facts.get("planned")), _f3(planning.facts.get("staying")),
             metrics["moved_keys"], 100 * metrics["migration_fraction"])
    return {**detected, "plan": record.summary()}


def _f3(value) -> str:
    return "-" if value is None else f"{float(value):.3f}"


# ------------------------------------------------------------------- rollback
def propose_rollback(to_version: int, dry_run: bool = False) -> dict[str, Any]:
    """The ``rebalance_rollback`` DAG's first task: store the plan restoring ``to_version``
    (:func:`rebalance.control.rollback.propose_rollback`); then validate, publish and apply
    as any plan."""
    from rebalance.control.rollback import propose_rollback as propose

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
    """Check the stored plan with the Great Expectations gate of :mod:`rebalance.control.validation`.

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
    frame, limits = store.frame(plan_id), plan_limits(record)
    if SPLIT_COLUMN in frame.columns and frame[SPLIT_COLUMN].notna().any():
        from rebalance.spark.jobs import latest_start, split_refusal

        limits = dataclasses.replace(limits, splits_refused=split_refusal(
            latest_start(spark_session(), job_name())))
    result = validate_plan(frame, record.metrics, limits)
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


def new_routing(store: PlanStore, record: PlanRecord,
                ) -> tuple[dict[str, int], dict[str, dict[int, float]]]:
    """Routing table of a plan's assignment: planned keys off their default instance and
    the plan's split keys (key -> {instance: share}), plus the base version's entries
    for keys the plan did not see (kept as they are, split or whole)."""
    from rebalance.spark import tables

    frame = store.frame(record.plan_id)
    base = tables.read_assignment(store.spark, version=record.base_assignment_version or 0)
    planned = set(frame["key"].astype(str))
    splits = {k: v for k, v in base.splits.items() if k not in planned}
    splits.update(frame_splits(frame))
    routing = {k: v for k, v in base.routing.items() if k not in planned and k not in splits}
    routed = frame.loc[frame["instance"] != frame["default"]]
    routing.update((k, int(i)) for k, i in zip(routed["key"].astype(str), routed["instance"])
                   if k not in splits)
    return dict(sorted(routing.items())), dict(sorted(splits.items()))


def needs_approval(published: Mapping[str, Any]) -> bool:
    """True when the run asked for a person's approval of a plan that would go live."""
    _, p = unpack(published)
    return bool(p.require_approval) and published["plan"]["status"] == PlanStatus.PUBLISHED.value


