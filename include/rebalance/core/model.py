"""The load model shared by every planner: problem, parameters, plan, metrics.

A problem holds the keys' loads c(k) and states S(k) over the last W windows, the current
assignment F and N instances; a plan is a new assignment, judged by its imbalance (max
instance load / mean load over the active instances), its migration (state of the keys
whose instance changes) and its routing-table size (keys off their default instance).
The vocabulary, one name per concept in code, tables and docs: ``docs/planning.md``,
"Vocabulary and the default placement". Planning is pure numpy: no Spark or Airflow
import may appear in this package.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rebalance.core.defaults import DEFAULT_THETA, theta_problem
from rebalance.core.placement import DEFAULT_KEY_GROUPS

#: Largest N a problem may have: the key groups of the default placement
#: (:data:`rebalance.core.placement.DEFAULT_KEY_GROUPS`, 4096). Keys reach instances through
#: their key group, so more instances than groups cannot all receive keys by default,
#: and per-instance arrays of a mistyped N (10^9: 8 GB each) would exhaust memory
#: before any error.
MAX_INSTANCES = DEFAULT_KEY_GROUPS


class PlanningError(ValueError):
    """Bad planning input, with a message that names what is wrong."""


def _as_array(name: str, values, dtype) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise PlanningError(f"{name} must be one-dimensional, got shape {arr.shape}")
    try:
        return arr.astype(dtype, copy=False)
    except (TypeError, ValueError) as exc:
        raise PlanningError(f"{name} must be {np.dtype(dtype).name}: {exc}") from None


def _strictly_increasing(keys: np.ndarray) -> bool:
    """Sorted distinct keys (what ``rebalance.core.histograms`` builds) are unique for free: one
    comparison per neighbour pair, far cheaper than ``np.unique`` over objects. False for
    anything else, including keys that do not compare."""
    try:
        return bool((keys[1:] > keys[:-1]).all())
    except TypeError:
        return False


@dataclass(frozen=True, eq=False)
class Problem:
    """Everything a planner may read, as aligned numpy arrays of length K.

    ``current`` may hold instances >= ``n_instances`` (scale-in: those keys
    must move); ``drain`` names instances that must end empty; instances
    beyond the current maximum are new, empty instances (scale-out).
    ``load_series`` (W x K) is the per-window load, needed by CLB only.
    ``key_group`` is the key group of each key (the ELB/CLB paper's substreams).
    ``scenarios`` (S x K, None: the single ``load``) are load scenarios that every
    instance must keep within the bound, each against its own mean (the ELB/CLB paper's
    robust view over m windows; :mod:`rebalance.core.forecast`): planners that support them (mixed,
    greedy, milp, auto) plan for all at once, and :func:`evaluate` reports the worst
    scenario's imbalance.
    """

    keys: np.ndarray
    load: np.ndarray
    state: np.ndarray
    current: np.ndarray
    default: np.ndarray
    n_instances: int
    drain: frozenset[int] = frozenset()
    load_series: np.ndarray | None = None
    key_group: np.ndarray | None = None
    scenarios: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = self.n_instances
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise PlanningError(f"number of instances must be an integer >= 1, got {n!r}")
        if n > MAX_INSTANCES:
            raise PlanningError(f"number of instances must be <= {MAX_INSTANCES} (the key "
                                f"groups of the default placement), got {n!r}")
        object.__setattr__(self, "n_instances", int(n))
        keys = np.asarray(self.keys, dtype=object)
        if keys.ndim != 1:
            raise PlanningError("keys must be one-dimensional")
        k = len(keys)
        object.__setattr__(self, "keys", keys)
        for name, dtype in (("load", np.float64), ("state", np.float64),
                            ("current", np.int64), ("default", np.int64)):
            arr = _as_array(name, getattr(self, name), dtype)
            if len(arr) != k:
                raise PlanningError(f"{name} has {len(arr)} values for {k} keys")
            object.__setattr__(self, name, arr)
        for name in ("load", "state"):
            arr = getattr(self, name)
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(arr) | (arr < 0)
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise PlanningError(
                    f"{name} must be finite and >= 0: key {keys[i]!r} has {arr[i]!r}"
                    f" ({int(bad.sum())} bad value(s))")
            with np.errstate(over="ignore"):
                total = float(arr.sum())
            if not np.isfinite(total):
                # Every metric divides by or compares with this sum: an overflow would make
                # them NaN while the plan still looked feasible.
                raise PlanningError(f"{name} sums to {total} (float64 overflow): values this "
                                    "large cannot be planned")
        if (self.current < 0).any():
            i = int(np.flatnonzero(self.current < 0)[0])
            raise PlanningError(f"current instance of key {keys[i]!r} is negative: {self.current[i]}")
        bad = (self.default < 0) | (self.default >= n)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise PlanningError(
                f"default instance of key {keys[i]!r} is {self.default[i]}, outside [0, {n})")
        drain = frozenset(int(d) for d in self.drain)
        if any(d < 0 or d >= n for d in drain):
            raise PlanningError(f"drain instances {sorted(drain)} must be within [0, {n})")
        if len(drain) >= n:
            raise PlanningError("cannot drain every instance: at least one must stay active")
        object.__setattr__(self, "drain", drain)
        if self.load_series is not None:
            ls = np.asarray(self.load_series, dtype=np.float64)
            if ls.ndim != 2 or ls.shape[1] != k:
                raise PlanningError(f"load_series must have shape (W, {k}), got {ls.shape}")
            object.__setattr__(self, "load_series", ls)
        if self.key_group is not None:
            kg = _as_array("key_group", self.key_group, np.int64)
            if len(kg) != k:
                raise PlanningError(f"key_group has {len(kg)} values for {k} keys")
            object.__setattr__(self, "key_group", kg)
        if self.scenarios is not None:
            sc = np.asarray(self.scenarios, dtype=np.float64)
            if sc.ndim != 2 or sc.shape[1] != k or sc.shape[0] < 1:
                raise PlanningError(f"scenarios must have shape (S >= 1, {k}), got {sc.shape}")
            if (bad := first_not_finite_or_negative(sc)) is not None:
                s_i, k_i = bad
                raise PlanningError(f"scenarios must be finite and >= 0: key {keys[k_i]!r} has "
                                    f"{float(sc[s_i, k_i])!r} in scenario {s_i}")
            object.__setattr__(self, "scenarios", sc)
        if k > 1 and not _strictly_increasing(keys) and len(set(keys.tolist())) != k:
            raise PlanningError("keys must be unique")

    @property
    def n_keys(self) -> int:
        return len(self.keys)

    @property
    def active(self) -> np.ndarray:
        """Boolean mask of the instances that may receive keys."""
        mask = np.ones(self.n_instances, dtype=bool)
        mask[list(self.drain)] = False
        return mask

    def instance_loads(self, assignment: np.ndarray) -> np.ndarray:
        """Load of each instance 0..N-1 under ``assignment`` (keys outside are ignored)."""
        a = np.asarray(assignment)
        inside = (a >= 0) & (a < self.n_instances)
        return np.bincount(a[inside], weights=self.load[inside], minlength=self.n_instances)

    def scenario_loads(self, assignment: np.ndarray) -> np.ndarray:
        """Instance loads under ``assignment`` in each scenario (S x N; the load's alone, one
        row, when there are none): :func:`imbalance` of it is each scenario's imbalance."""
        a = np.asarray(assignment, dtype=np.int64)
        rows = self.scenarios if self.scenarios is not None else self.load[None, :]
        inside = (a >= 0) & (a < self.n_instances)
        flat = (np.arange(len(rows))[:, None] * self.n_instances + a[inside][None, :]).ravel()
        return np.bincount(flat, weights=rows[:, inside].ravel(),
                           minlength=len(rows) * self.n_instances).reshape(len(rows), -1)

    def mean_load(self) -> float:
        return float(self.load.sum()) / int(self.active.sum())

    def max_load(self, theta: float) -> float:
        """L_max = (1 + theta) * mean load: the bound every instance must meet."""
        return (1.0 + theta) * self.mean_load()

    def must_move(self) -> np.ndarray:
        """Keys whose current instance no longer exists or is being drained."""
        cur = self.current
        out = cur >= self.n_instances
        if self.drain:
            out |= np.isin(cur, list(self.drain))
        return out


@dataclass(frozen=True)
class PlanParams:
    """Planner parameters, validated once.

    theta: imbalance bound, every instance load <= (1 + theta) * mean.
    beta: exponent of Fang et al.'s gamma(k) = c(k)^beta / S(k).
    max_table: A_max, bound on the routing table size (None: unbounded).
    budget_bytes / budget_keys: migration budget (None: unbounded).
    time_limit: seconds for planners that search (MILP, auto).

    Options of one planner each (the others ignore them):

    clb_threshold: CLB's correlation threshold in [0, 1) (the ELB/CLB paper; not ``theta``).
    llfd_resolution_bits: mantissa bits of the compact representation of MinTable /
        MinMig / Mixed: ``"auto"`` (exact up to a size, then coarser), None (exact) or a
        number of bits.
    milp_max_keys / milp_max_returns: how many keys get a placement / return binary in
        the MILP (None: sized from the time limit).
    highs_options: HiGHS options for the MILP (e.g. ``{"mip_rel_gap": 0.01}``).
    warm_start: the MILP's start, one instance per key (None: the current assignment).
    """

    theta: float = DEFAULT_THETA
    beta: float = 1.5
    max_table: int | None = None
    budget_bytes: float | None = None
    budget_keys: int | None = None
    time_limit: float = 10.0
    seed: int = 0
    clb_threshold: float = 0.5
    llfd_resolution_bits: int | str | None = "auto"
    milp_max_keys: int | None = None
    milp_max_returns: int | None = None
    highs_options: Mapping[str, Any] | None = None
    warm_start: Any = None

    def __post_init__(self) -> None:
        if problem := theta_problem(self.theta):
            raise PlanningError(problem)
        if not (math.isfinite(self.beta) and self.beta > 0):
            raise PlanningError(f"beta must be > 0, got {self.beta!r}")
        if self.max_table is not None and self.max_table < 0:
            raise PlanningError(f"max table size must be >= 0, got {self.max_table!r}")
        if self.budget_bytes is not None and not self.budget_bytes >= 0:
            raise PlanningError(f"migration budget (bytes) must be >= 0, got {self.budget_bytes!r}")
        if self.budget_keys is not None and self.budget_keys < 0:
            raise PlanningError(f"migration budget (keys) must be >= 0, got {self.budget_keys!r}")
        if not (self.time_limit > 0):
            raise PlanningError(f"time limit must be > 0 seconds, got {self.time_limit!r}")
        if not (isinstance(self.clb_threshold, int | float) and 0 <= self.clb_threshold < 1):
            raise PlanningError(
                f"clb_threshold must be a correlation in [0, 1), got {self.clb_threshold!r}")
        bits = self.llfd_resolution_bits
        if not (bits is None or bits == "auto" or (isinstance(bits, int) and bits >= 1)):
            raise PlanningError(
                f"llfd_resolution_bits must be 'auto', None or a number of bits >= 1, got {bits!r}")
        for name in ("milp_max_keys", "milp_max_returns"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, int) and value >= 0):
                raise PlanningError(f"{name} must be a count >= 0 or None, got {value!r}")

    def to_dict(self) -> dict[str, Any]:
        """The parameters as JSON-able values (``warm_start``, an array, is left out)."""
        out = dataclasses.asdict(dataclasses.replace(self, warm_start=None))
        out.pop("warm_start")
        return out


@dataclass(frozen=True)
class Metrics:
    """Predicted metrics of an assignment; always recomputable by :func:`evaluate`."""

    imbalance_before: float
    imbalance_after: float
    max_load_after: float
    mean_load: float
    migration_bytes: float
    migration_fraction: float
    moved_keys: int
    table_size: int
    n_keys: int
    n_instances: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def first_not_finite_or_negative(matrix: np.ndarray) -> tuple[int, int] | None:
    """(row, column) of the first entry of ``matrix`` that is NaN, infinite or < 0 (row
    by row); None when every entry is finite and >= 0."""
    with np.errstate(invalid="ignore"):
        bad = ~np.isfinite(matrix) | (matrix < 0)
    if not bad.any():
        return None
    row, column = (int(v[0]) for v in np.nonzero(bad))
    return row, column


def imbalance(loads: np.ndarray, active: np.ndarray | None = None):
    """max load / mean load over the active instances (1.0 when there is no load): the one
    definition of the imbalance every figure of balance uses.

    ``loads``: one load per instance (a float is returned), or a matrix with one row of
    instance loads per window or scenario (an array of one imbalance per row is returned).
    ``active``: mask of the instances the mean is over (None: all). The max is over every
    instance: load left on an instance that is being removed counts."""
    loads = np.asarray(loads, dtype=np.float64)
    if loads.ndim == 1:   # the common case, without the per-row bookkeeping (5x faster)
        act = loads if active is None else loads[active]
        total = float(act.sum())
        return float(loads.max()) / (total / len(act)) if total > 0 and len(act) else 1.0
    act = loads if active is None else loads[:, active]
    total = act.sum(axis=1)
    out = np.ones(loads.shape[0])
    has_load = (total > 0) if act.shape[1] else np.zeros(loads.shape[0], dtype=bool)
    if has_load.any():
        out[has_load] = loads[has_load].max(axis=1) / (total[has_load] / act.shape[1])
    return out


def evaluate(problem: Problem, assignment: np.ndarray) -> Metrics:
    """Metrics of ``assignment`` for ``problem``, computed from scratch."""
    a = np.asarray(assignment, dtype=np.int64)
    if len(a) != problem.n_keys:
        raise PlanningError(f"assignment has {len(a)} entries for {problem.n_keys} keys")
    if len(a) and (a.min() < 0 or a.max() >= problem.n_instances):
        raise PlanningError(f"assignment uses instances outside [0, {problem.n_instances})")
    active = problem.active
    # Keys on instances that no longer exist count as load on nothing "before";
    # imbalance_before is measured over the instances as they are now.
    n_cur = int(max(problem.n_instances, (problem.current.max() + 1) if problem.n_keys else 0))
    cur_loads = np.bincount(problem.current, weights=problem.load, minlength=n_cur)
    total = float(problem.load.sum())
    mean = total / int(active.sum()) if total > 0 else 0.0
    imb_before = float(cur_loads.max()) / mean if total > 0 else 1.0
    after_loads = problem.instance_loads(a)
    imb_after = imbalance(after_loads, active) if total > 0 else 1.0
    if problem.scenarios is not None:
        # robust planning: the plan is judged on its worst scenario
        cur = np.minimum(problem.current, problem.n_instances - 1)
        gone = problem.current >= problem.n_instances
        if not gone.any():
            imb_before = max(imb_before, float(imbalance(problem.scenario_loads(cur), active).max()))
        imb_after = max(imb_after, float(imbalance(problem.scenario_loads(a), active).max()))
    moved = a != problem.current
    mig = float(problem.state[moved].sum())
    total_state = float(problem.state.sum())
    return Metrics(
        imbalance_before=imb_before,
        imbalance_after=imb_after,
        max_load_after=float(after_loads.max()) if len(after_loads) else 0.0,
        mean_load=mean,
        migration_bytes=mig,
        migration_fraction=mig / total_state if total_state > 0 else 0.0,
        moved_keys=int(moved.sum()),
        table_size=int((a != problem.default).sum()),
        n_keys=problem.n_keys,
        n_instances=problem.n_instances,
    )


@dataclass
class Plan:
    """A planner's answer: the new assignment, its metrics, and why it is what it is.

    ``feasible`` is True when the predicted imbalance is within 1 + theta and
    every hard limit (table size, migration budget, drained instances) holds.
    ``notes`` explain binding limits, fallbacks and infeasibility.
    ``lower_bound_fraction`` is a lower bound on the migration fraction any
    assignment needs to reach max(1 + theta, this plan's imbalance).
    """

    method: str
    assignment: np.ndarray
    moved: np.ndarray
    metrics: Metrics
    params: PlanParams
    feasible: bool
    lower_bound_bytes: float
    lower_bound_fraction: float
    plan_seconds: float
    notes: list[str] = field(default_factory=list)
    solver_bound: float | None = None
    #: Keys spread over several instances (:class:`rebalance.core.planners.split.SplitKeys`),
    #: None for a plan of whole keys; ``assignment`` then gives a split key its largest
    #: share's instance.
    split: Any = None

    def metrics_dict(self) -> dict[str, Any]:
        out = self.metrics.to_dict()
        out.update(
            plan_seconds=self.plan_seconds,
            lower_bound_migration_bytes=self.lower_bound_bytes,
            lower_bound_migration_fraction=self.lower_bound_fraction,
            feasible=self.feasible,
        )
        if self.solver_bound is not None:
            out["solver_bound"] = self.solver_bound
        if self.split is not None and len(self.split):
            out.update(split_keys=len(self.split), split_shares=self.split.entries,
                       merge_rows_per_window=self.split.merge_rows)
        return out
