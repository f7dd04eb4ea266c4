"""The run's params and identity: the DAG's Params form, the schedule, the plan id.

Pure values (no Spark, no Delta): :class:`RunParams` validates the Params form once,
:class:`RunInfo` names the DAG run and its data interval, :func:`plan_id_for` hashes
both with the run's input snapshot into the deterministic plan id.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from rebalance.control.errors import InvalidParams
from rebalance.core.defaults import APPLY_MODES, DEFAULT_THETA
from rebalance.core.forecast import LOAD_MODELS, LoadModel, LoadModelError
from rebalance.core.model import PlanParams
from rebalance.core.planners import METHODS
from rebalance.core.records import as_utc, hash_id
from rebalance.core.trigger import TRIGGER_RULES

DAG_ID = "rebalance"
#: ``apply_mode=auto``: share of the job's state a plan must move (the state a live switch
#: drops) before a controlled restart is worth its pause (run param ``restart_above``;
#: the reasons: :func:`rebalance.control.rollout.resolve_mode`).
AUTO_RESTART_ABOVE = 0.05
#: Longest restart or verification wait a run may ask for (``restart_timeout_minutes``,
#: ``verify_timeout_minutes``); the DAG's sensors time out only after it, so a wait always
#: ends by the run's own deadline (rollback, "diverged"), never by Airflow's.
MAX_WAIT_MINUTES = 1440


#: JSON schema of every run param; the DAG turns each entry into an Airflow ``Param``.
#: Defaults come from :class:`RunParams` (set below it).
PARAMS_SCHEMA: dict[str, dict[str, Any]] = {
    "method": {
        "type": "string", "enum": list(METHODS),
        "title": "Planning method",
        "description": "Planner of rebalance.core.planners: mixed (few moves, small routing table), "
                       "milp (exact optimisation within the time limit), auto (the best the "
                       "time limit affords), ...",
    },
    "theta": {
        "type": "number", "exclusiveMinimum": 0, "maximum": 2,
        "title": "Imbalance bound theta",
        "description": "Every instance load must be <= (1 + theta) * mean load.",
    },
    "max_table": {
        "type": ["integer", "null"], "minimum": 0, "maximum": 10_000_000,
        "title": "Max routing-table size",
        "description": "Bound on keys routed away from their default instance (null: none).",
    },
    "migration_budget": {
        "type": ["number", "null"], "minimum": 0, "maximum": 1,
        "title": "Migration budget",
        "description": "Largest fraction of the total state a plan may move (null: none).",
    },
    "lookback_windows": {
        "type": "integer", "minimum": 1, "maximum": 1000,
        "title": "Windows to look back",
        "description": "Plan on the last N histogram windows that start in the data interval.",
    },
    "min_windows": {
        "type": "integer", "minimum": 1, "maximum": 1000,
        "title": "Minimum valid windows",
        "description": "Skip the run when fewer windows with events are stored.",
    },
    "min_events": {
        "type": "integer", "minimum": 0,
        "title": "Minimum events",
        "description": "Skip the run when the windows hold fewer events.",
    },
    "apply_mode": {
        "type": "string", "enum": list(APPLY_MODES),
        "title": "Apply mode",
        "description": "auto: live switch, or a controlled restart when the plan moves more "
                       "than restart_above of the job's state (a live switch drops it) and "
                       "the job can restart (else a live switch, and the run says so); "
                       "broadcast: live switch; restart: controlled restart with state "
                       "migration (refused at once for a job that cannot restart); dry-run: "
                       "store a what-if plan, apply nothing.",
    },
    "split_keys": {
        "type": "boolean",
        "title": "Split keys too hot for one instance",
        "description": "A key whose load alone exceeds (1 + theta) x mean load is spread over "
                       "the fewest instances that hold it within the bound, each event going "
                       "to one share; the job merges a window's partial results into "
                       "window_results. Off: every key stays whole (that key is the floor "
                       "of the imbalance).",
    },
    "restart_above": {
        "type": "number", "minimum": 0, "maximum": 1,
        "title": "Restart above (apply_mode auto)",
        "description": "apply_mode auto: controlled restart when the plan moves more than this "
                       "fraction of the job's state, else live switch.",
    },
    "require_approval": {
        "type": "boolean",
        "title": "Require approval",
        "description": "Wait for a person to approve or reject the plan in the Airflow UI.",
    },
    "force": {
        "type": "boolean",
        "title": "Force",
        "description": "Plan and apply even when the trigger says the job is within its bound "
                       "or the backtest says the plan would not hold; the plan's reasons "
                       "record what was overridden.",
    },
    "trigger_rule": {
        # A rule's former name is refused (docs/dag.md, "Former names").
        "type": "string", "enum": list(TRIGGER_RULES),
        "title": "Trigger rule",
        "description": "theta: plan when most of the latest 3 windows (2 of 3; 2 of 2; 1 of 1) "
                       "exceed 1 + theta under the live assignment. mldc (the MLDC paper's "
                       "rules): plan when the imbalance exceeds 1.5, no plan went live in the "
                       "last 3 periods and the plan lowers the imbalance by more than 0.3.",
    },
    "min_backtest_gain": {
        "type": "number", "minimum": 0, "maximum": 1,
        "title": "Minimum backtested gain",
        "description": "Apply a plan only when, planned the same way on the windows before "
                       "the most recent third and replayed on that held-out third, it lowers "
                       "the mean realised imbalance by at least this much compared with "
                       "keeping the live assignment; otherwise the run skips with both figures.",
    },
    "load_model": {
        "type": "string", "maxLength": 200,
        "pattern": r"^\s*(" + "|".join(LOAD_MODELS) + r")\s*(:.*)?$",
        "title": "Load model",
        "description": "The per-key loads a plan is made for, from the run's windows: auto "
                       "(chosen by backtest on those windows), mean, ewm:halflife=H, "
                       "quantile:q=Q, max, seasonal:period=P (windows), robust (every window "
                       "must stay within the bound); each takes windows=W.",
    },
    "headroom_target": {
        "type": "number", "exclusiveMinimum": 0, "maximum": 1,
        "title": "Headroom target",
        "description": "When theta_plan is not set: plan with the largest bound theta_plan <= "
                       "theta whose backtest keeps at least this share of windows within "
                       "1 + theta.",
    },
    "theta_plan": {
        "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 2,
        "title": "Planning bound theta_plan",
        "description": "Plan every instance load <= (1 + theta_plan) x mean of the forecast, "
                       "leaving headroom for forecast errors; at most theta. Null: chosen by "
                       "backtest (headroom_target).",
    },
    "verify_windows": {
        "type": "integer", "minimum": 1, "maximum": 100,
        "title": "Windows to verify",
        "description": "Windows processed under the new assignment to compare with the prediction.",
    },
    "verify_tolerance": {
        "type": "number", "minimum": 0, "maximum": 0.5,
        "title": "Verification noise allowance",
        "description": "verify passes when the realised imbalance of the verified windows is "
                       "at most 1 + theta + this allowance (room for one window's load noise "
                       "that no plan can foresee); above it the plan is stored as diverged "
                       "and the run fails.",
    },
    "restart_timeout_minutes": {
        "type": "number", "exclusiveMinimum": 0, "maximum": MAX_WAIT_MINUTES,
        "title": "Restart timeout (minutes)",
        "description": "apply_mode restart: roll back to the previous assignment version when "
                       "the job has not acknowledged the restart in time.",
    },
    "verify_timeout_minutes": {
        "type": "number", "exclusiveMinimum": 0, "maximum": MAX_WAIT_MINUTES,
        "title": "Verification timeout (minutes)",
        "description": "Fail verification when no window under the new assignment arrives in time.",
    },
}


DEFAULT_SCHEDULE = "*/10 * * * *"

#: Default ``verify_tolerance``: how far above ``1 + theta`` the realised imbalance of the
#: verified window(s) may be before a plan counts as diverged. Room for the noise of one
#: window that no forecast foresees (a key's count over a window varies by sqrt(count):
#: 1 % of a key with 10^4 events), not for a plan that misses: 0.02 at theta = 0.1 accepts
#: 1.12, not 1.2. The Params schema caps it at 0.5, so verification can always fail.
VERIFY_TOLERANCE = 0.02


def timetable(spec: str | None = None):
    """The DAG's schedule: ``REBALANCE_SCHEDULE`` or ``spec``, default every 10 minutes.

    A cron expression gives clock-aligned intervals (``CronDataIntervalTimetable``); a
    duration such as ``"30s"``, ``"5m"`` or ``"1h"`` gives intervals of that length
    (``DeltaDataIntervalTimetable``, used by the demo). Either way each run's data
    interval is the span of histogram windows it plans on. ``"none"``: manual runs only
    (None: no scheduled run; a manual run plans on the latest windows stored).
    """
    import os
    import re

    from airflow.sdk import CronDataIntervalTimetable, DeltaDataIntervalTimetable

    spec = (spec or os.environ.get("REBALANCE_SCHEDULE") or DEFAULT_SCHEDULE).strip()
    if spec.lower() in ("none", "manual"):
        return None
    m = re.fullmatch(r"(\d+)\s*([smh])", spec)
    if m:
        unit = {"s": "seconds", "m": "minutes", "h": "hours"}[m.group(2)]
        return DeltaDataIntervalTimetable(dt.timedelta(**{unit: int(m.group(1))}))
    return CronDataIntervalTimetable(spec, timezone="UTC")


@dataclass(frozen=True)
class RunParams:
    """The run's params, validated once (the DAG's JSON schema checks each alone first)."""

    method: str = "mixed"
    theta: float = DEFAULT_THETA
    max_table: int | None = 3000
    migration_budget: float | None = 0.5
    lookback_windows: int = 6
    min_windows: int = 2
    min_events: int = 1000
    apply_mode: str = "auto"
    restart_above: float = AUTO_RESTART_ABOVE
    split_keys: bool = False
    require_approval: bool = False
    force: bool = False
    trigger_rule: str = "theta"
    min_backtest_gain: float = 0.01
    load_model: str = "auto"
    headroom_target: float = 0.9
    theta_plan: float | None = None
    verify_windows: int = 1
    verify_tolerance: float = VERIFY_TOLERANCE
    verify_timeout_minutes: float = 30.0
    restart_timeout_minutes: float = 15.0

    def __post_init__(self) -> None:
        # Canonical types, so equal params always hash to the same plan id (30 == 30.0).
        for name in ("theta", "migration_budget", "verify_tolerance", "verify_timeout_minutes",
                     "restart_timeout_minutes", "restart_above", "min_backtest_gain",
                     "headroom_target", "theta_plan"):
            value = getattr(self, name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
        for name in ("max_table", "lookback_windows", "min_windows", "min_events", "verify_windows"):
            value = getattr(self, name)
            if isinstance(value, float) and value.is_integer():
                object.__setattr__(self, name, int(value))
        # One spelling per load model ("ewm:h=3" is "ewm:halflife=3"); a bad one is left
        # as given for check() to name.
        try:
            object.__setattr__(self, "load_model", str(self.model()))
        except LoadModelError:
            pass

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> RunParams:
        """Params from a mapping (Airflow params), with one clear error for bad input."""
        known = {k: v for k, v in dict(values).items() if k in cls.__dataclass_fields__}
        try:
            p = cls(**known)
        except TypeError as exc:
            raise InvalidParams(f"invalid params: {exc}") from None
        p.check()
        return p

    def check(self) -> None:
        problems = []
        if self.method not in METHODS:
            problems.append(f"method {self.method!r} is not one of {', '.join(METHODS)}")
        if self.apply_mode not in APPLY_MODES:
            problems.append(f"apply_mode {self.apply_mode!r} is not one of {', '.join(APPLY_MODES)}")
        if not (isinstance(self.theta, (int, float)) and 0 < self.theta <= 2):
            problems.append(f"theta must be in (0, 2], got {self.theta!r}")
        if self.min_windows > self.lookback_windows:
            problems.append(f"min_windows ({self.min_windows}) exceeds lookback_windows "
                            f"({self.lookback_windows}): no run could ever plan")
        if self.migration_budget is not None and not 0 <= self.migration_budget <= 1:
            problems.append(f"migration_budget must be a fraction in [0, 1], got {self.migration_budget!r}")
        if not (isinstance(self.restart_above, float) and 0 <= self.restart_above <= 1):
            problems.append(f"restart_above must be a fraction in [0, 1], got {self.restart_above!r}")
        if self.max_table is not None and self.max_table < 0:
            problems.append(f"max_table must be >= 0, got {self.max_table!r}")
        if self.trigger_rule not in TRIGGER_RULES:
            problems.append(f"trigger_rule {self.trigger_rule!r} is not one of "
                            f"{', '.join(TRIGGER_RULES)}")
        if not (isinstance(self.min_backtest_gain, float) and 0 <= self.min_backtest_gain <= 1):
            problems.append(f"min_backtest_gain must be in [0, 1], got {self.min_backtest_gain!r}")
        if not (isinstance(self.headroom_target, float) and 0 < self.headroom_target <= 1):
            problems.append(f"headroom_target must be a share in (0, 1], got "
                            f"{self.headroom_target!r}")
        if self.theta_plan is not None and not (
                isinstance(self.theta_plan, float) and 0 < self.theta_plan
                and isinstance(self.theta, float) and self.theta_plan <= self.theta):
            problems.append(f"theta_plan must be > 0 and at most theta ({self.theta!r}), got "
                            f"{self.theta_plan!r}")
        if not (isinstance(self.verify_tolerance, float) and 0 <= self.verify_tolerance <= 0.5):
            problems.append(f"verify_tolerance must be in [0, 0.5], got {self.verify_tolerance!r}")
        try:
            self.model()
        except LoadModelError as exc:
            problems.append(f"load_model {self.load_model!r}: {exc}")
        if problems:
            raise InvalidParams("invalid params: " + "; ".join(problems))

    def model(self) -> LoadModel:
        """The run's load model (``auto``: chosen by backtest when the plan is made)."""
        if not isinstance(self.load_model, str):
            raise LoadModelError(f"must be text like 'ewm:halflife=3', got {self.load_model!r}")
        return LoadModel.parse(self.load_model)

    def planner_params(self, total_state: float) -> PlanParams:
        budget = None if self.migration_budget is None else self.migration_budget * total_state
        return PlanParams(theta=float(self.theta), max_table=self.max_table, budget_bytes=budget)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# One set of run defaults: the Params form shows the dataclass's.
for _name, _spec in PARAMS_SCHEMA.items():
    _spec["default"] = RunParams.__dataclass_fields__[_name].default


@dataclass(frozen=True)
class RunInfo:
    """Who is running: the DAG run's identity and data interval (ISO strings)."""

    dag_id: str
    run_id: str
    run_type: str
    data_interval_start: str | None
    data_interval_end: str | None

    @classmethod
    def of(cls, dag_id: str, run_id: str, run_type: Any, start: Any, end: Any) -> RunInfo:
        run_type = str(getattr(run_type, "value", run_type))
        iso = (lambda t: as_utc(t).isoformat() if t is not None else None)  # noqa: E731
        return cls(str(dag_id), str(run_id), run_type, iso(start), iso(end))

    @property
    def is_backfill(self) -> bool:
        return self.run_type == "backfill"

    @property
    def start(self) -> dt.datetime | None:
        return as_utc(self.data_interval_start)

    @property
    def end(self) -> dt.datetime | None:
        return as_utc(self.data_interval_end)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)



def unpack(payload: Mapping[str, Any]) -> tuple[RunInfo, RunParams]:
    return RunInfo(**payload["run"]), RunParams(**payload["params"])


def plan_id_for(run: RunInfo, params: RunParams, inputs: Mapping[str, Any]) -> str:
    """Deterministic plan id: hash of the run, its interval, its params and input snapshot."""
    snapshot = {k: inputs[k] for k in ("windows", "key_histograms_version",
                                       "base_assignment_version", "n_instances")}
    payload = {
        "dag_id": run.dag_id, "run_id": run.run_id,
        "data_interval": [run.data_interval_start, run.data_interval_end],
        "params": params.to_dict(), "inputs": snapshot,
    }
    return hash_id(payload)

