"""MILP planner: the mixed-integer program of seed 002 (Madsen et al., Sec. 3.2), fixed.

Formulation (seed 002, Table 2 and constraints (1)-(5), with the fixes of the notes)
-----------------------------------------------------------------------------------
Binary ``x[k, i]`` puts key ``k`` on instance ``i``; only active instances get
variables, so drained instances end empty (scale-in) and keys whose current instance
is drained or removed must move. New empty instances (scale-out) are ordinary
instances without keys. ``d, d_u, d_l >= 0`` (fix: as printed the model is unbounded).

* (1) every key on exactly one instance;
* (2) migration budget: state of moved keys <= ``params.budget_bytes``, number of moved
  keys <= ``params.budget_keys`` (the paper's maxMigrations variant);
* (3) every instance: load <= mean + (d - d_u);
* (4) every non-drained instance: load >= mean - (d - d_l);
* (5) mean - d >= 0, widened to d <= max(1, theta) * mean so that it never cuts off a
  plan meeting L_max, and kept only in the hard mode below: with a key heavier than
  2 * mean it makes the model infeasible (fix), so the soft mode drops it;
* the bound: every instance load <= L_max = (1 + theta) * mean.

``mean`` is the contract's mean over the active instances (``Problem.mean_load``), not
the paper's ceiling of it, so the model and :func:`rebalance.model.evaluate` agree.
Loads are scaled by the mean and migration by the total state inside the model.

Objective: why migration comes first
------------------------------------
Seed 002 minimises the load distance ``w1*d - w2*(d_u + d_l)`` (w1 = 100 > 2*w2 = 2,
so it is bounded below) and spends the migration budget on it. Our contract is seed
003's: meet ``max load <= L_max`` and move as little state as possible; a
distance-first objective would keep moving keys long after the bound is met. So the
objective is lexicographic, in one of two modes:

* hard mode (the bound looks reachable): L_max is a constraint and the objective is
  ``migrated state / total state + lambda * (w1*d - w2*(d_u + d_l)) / (w1 * mean)``
  with ``lambda = 1e-4``. Within the bound it minimises migrated state; the seed-002
  distance only breaks ties (which underloaded instance receives a key, filling new
  instances) and can buy at most ``lambda * max(1, theta)`` of the total state.
* soft mode (a key heavier than L_max, a byte budget below the migration lower bound
  of :mod:`rebalance.bounds`, or no hard solution: proven infeasible or none found in
  time): each instance gets a slack ``e_i >= 0`` above L_max and the objective is
  ``1e3 * (max_i e_i + sum_i e_i / (2 n)) / mean``, then migration, then the distance.
  The largest overload (the reported imbalance) comes first: lowering it by delta
  outweighs raising the total by up to 2 n delta. The total comes next, so with a
  giant key every other instance is still brought under L_max, where a max-only
  objective such as seed 002's ``d`` would stop once the giant key fixes the maximum.
  For keys heavier than L_max, cuts ``e_i >= (c_k - L_max) * x[k, i]`` and
  ``max_i e_i >= c_k - L_max`` keep the LP bound of this mode meaningful.

Reduction for large inputs
--------------------------
Keys heavier than ``0.1 * theta * mean`` get binaries (as many as the time limit
affords, ``3000 * time_limit / active instances``; ``params.extra["milp_max_keys"]``
overrides). The other ("light") keys of each current instance form a fluid reservoir:
continuous flows ``z[j, i]`` carry its load to other instances. Shedding load ``m``
costs at least ``F_j(m)``, the fractional knapsack over its keys by increasing state
per load; the model uses bins of consecutive keys in that order at their average cost
(the chord of ``F_j``), refined until the chord exceeds ``F_j`` by at most 1e-4 of the
total state over all reservoirs (at most 512 bins each). Disaggregation takes from each reservoir the cheapest
keys until the shed load is covered, places them heaviest first on the room the
solution left, re-routes light keys off any instance left above its limit, and undoes
the most expensive light moves if the overshoot broke the byte budget.
Reservoirs of drained or removed instances must empty completely. Under a key budget
the light keys stay where they are (a count budget is best spent on heavy keys, and
the cheapest-state keys are many small ones); only keys that must move move.

Solver bound
------------
In the hard mode ``Proposal.solver_bound`` is a lower bound, in bytes, on the state any
plan meeting L_max and the budgets must move: the HiGHS MIP dual bound minus the most
the tie-breaker and the bins' chord error can add, times the total state (bins over-
estimate the cost, so the model is a relaxation up to that error). No bound is claimed
where the model restricts the full problem: in the soft mode (its objective is
overload), with a byte budget on bins, and with light keys pinned by a key budget.

Time
----
The model size follows the time limit (above). HiGHS gets the time left after the
preparation, minus a reserve for disaggregation (0.05 s + 2 us per key + 2 %); when
no MIP start meets the bound, the hard mode gets 60 % of it so the soft mode can still
run. Fixed costs (PuLP passing the model to HiGHS) make limits below about 0.2 s
overrun for 10^4 keys.

Warm start, determinism and fallback
------------------------------------
The start is ``params.extra["warm_start"]`` (an int array, e.g. from the auto planner)
or the current assignment with the keys that must move placed largest first on the
least-loaded instance. HiGHS gets as MIP start a greedy repair of it (cheapest load
off overloaded instances, within the budgets) or else the start itself, whichever
meets the mode's constraints first. If HiGHS returns nothing the planner proposes the
start, with a note. HiGHS runs single-threaded with ``random_seed = params.seed``: a
solve that ends before its time limit is deterministic, one cut by the time limit may
differ between machines of different speed.

Routing-table bound (A_max)
---------------------------
Seed 002 has no routing table; with ``params.max_table`` the model adds
``table size <= A_max`` (:func:`_table_constraint`), table size = number of keys off
their default instance. Explicit keys count ``1 - x[k, default(k)]`` (exact). Light
keys now in the routing table get one binary each (up to :data:`MAX_RETURNS`,
cheapest state first): stay, or go back to their default instance, which is what a
full table needs to make room. Light keys that stay keep their current membership
(exact); a light key at home that a reservoir sheds counts 1, per cost bin
``fill * keys at home / load``; light table keys the reservoir sheds still count 1 (an
upper bound). The constraint is elastic with a penalty above the total state, so it
binds whenever it can be met and any warm start stays admissible. Disaggregation
rounds the bins to whole keys, which can add a few entries per reservoir: the planner
then applies :func:`rebalance.planners.auto.fit_table` (keys that move anyway go home
for free; if the table still exceeds A_max, moved keys go back, then table keys go
home by increasing state), so the plan meets A_max whenever L_max leaves room. With a
byte or key budget that last step can break the budget; the plan then says so.
With A_max, ``solver_bound`` is claimed only for the exact (unreduced) model, where it
bounds every plan meeting L_max, A_max and the budgets.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field

import highspy
import numpy as np
import pulp

from ..bounds import migration_lower_bound
from ..model import PlanningError, PlanParams, Problem
from .base import Planner, Proposal

W1, W2 = 100.0, 1.0          # seed 002 weights of d and of d_u + d_l; w1 > 2 * w2
DISTANCE_WEIGHT = 1e-4       # lambda: the seed-002 distance as a tie-breaker
OVERLOAD_WEIGHT = 1e3        # soft mode: per mean load above L_max, before migration
BINARIES_PER_SECOND = 3000   # model size the time limit affords (PuLP build + HiGHS)
MIN_BINARIES = 2000
#: Light routing-table keys that get a return binary at most (cheapest state first). On
#: seed 003's workload (A_max = 3000, full table) 1000 solve to the 1 % gap in ~0.5-0.9 s
#: with a plan as good as with all ~2800, which hit a 1.5 s limit at 3-4 % gap.
MAX_RETURNS = 1000
LIGHT_SHARE = 0.1            # keys lighter than this share of theta * mean may be fluid
HARD_SHARE = 0.6             # time for the hard mode when the soft mode may follow
MIN_SOLVE_SECONDS = 0.05
DENSE_BINS, SPARSE_BINS = 32, 8   # initial cost bins per reservoir: over [0, focus], beyond
MAX_BINS = 512               # cost bins per reservoir at most
BIN_GAP = 1e-4               # chord error of all cost bins together, share of total state
TOL = 1e-9
TABLE_WEIGHT = 10.0         # per routing-table entry above A_max (elastic; > any migration)

FORCED, FLUID, PINNED = "forced", "fluid", "pinned"


@dataclass(frozen=True)
class _Setting:
    """Numbers shared by every model of one planning run; loads in units of the mean."""

    load: np.ndarray            # key load / mean load
    cost: np.ndarray            # key migration cost, normalised to sum 1
    mean: float                 # mean load (raw units)
    l_max: float                # 1 + theta
    state_scale: float          # bytes per unit of cost (0 when no key has state)
    budget_cost: float | None   # budget_bytes in cost units
    budget_keys: int | None
    active: np.ndarray          # active instance ids
    max_table: int | None = None          # A_max (None: no table bound)
    default: np.ndarray | None = None     # default instance of every key


@dataclass(frozen=True)
class _Reservoir:
    """Light keys of one current instance, modelled as divisible load.

    ``kind`` is FORCED (the source is drained or removed: every key leaves), FLUID (its
    load may leave, at the cost of its bins) or PINNED (its keys stay: key budget).
    """

    source: int
    kind: str
    keys: np.ndarray            # FLUID: the keys with load, cheapest per load first
    load: float                 # total (normalised) load
    bin_load: np.ndarray = field(default_factory=lambda: np.empty(0))
    bin_cost: np.ndarray = field(default_factory=lambda: np.empty(0))
    chord_gap: float = 0.0      # most the bins' chord cost exceeds F(m) at any m
    bin_home: np.ndarray = field(default_factory=lambda: np.empty(0))  # keys at home per bin


@dataclass(frozen=True)
class _Units:
    explicit: np.ndarray        # keys modelled one by one
    reservoirs: tuple[_Reservoir, ...]
    returns: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    # ^ light routing-table keys with one binary each: stay, or go back to their default

    @property
    def reduced(self) -> bool:
        return bool(self.reservoirs) or len(self.returns) > 0

    @property
    def light(self) -> np.ndarray:
        return np.concatenate([r.keys for r in self.reservoirs] or [np.empty(0, np.int64)])


@dataclass
class _Model:
    lp: pulp.LpProblem
    hard: bool
    x: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    z: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    fill: dict[tuple[int, int], pulp.LpVariable] = field(default_factory=dict)
    overload: dict[int, pulp.LpVariable] = field(default_factory=dict)
    worst: pulp.LpVariable | None = None     # soft mode: largest overload
    dist: tuple[pulp.LpVariable, ...] = ()   # d, d_u, d_l
    fixed_cost: float = 0.0     # forced reservoirs: constant, not in the objective
    y: dict[int, pulp.LpVariable] = field(default_factory=dict)   # return units, by position
    table_terms: list = field(default_factory=list)   # table size = terms + table_const
    table_const: float = 0.0
    table_excess: pulp.LpVariable | None = None


@dataclass(frozen=True)
class _Outcome:
    status: str
    has_solution: bool
    infeasible: bool
    objective: float
    bound: float
    gap: float
    seconds: float


class _HighsWithStart(pulp.HiGHS):
    """``pulp.HiGHS`` (highspy API) with a MIP start and a wall-clock deadline.

    The time limit is set when HiGHS starts, so the time PuLP spends passing the
    model to HiGHS counts against the same deadline.
    """

    def __init__(self, start: dict[pulp.LpVariable, float] | None, deadline: float,
                 highs_options: dict | None = None, **options):
        super().__init__(**options)
        self._start = start
        self._deadline = deadline
        self._highs_options = dict(highs_options or {})

    def buildSolverModel(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's name)
        """PuLP's model hand-over in bulk: one ``addCols``, one ``changeColsIntegrality``
        and one ``addRows`` call instead of one call per column and row. Measured on a
        polish of 5000 keys, N = 64 (22 464 binaries): 2.3 s -> 0.5 s, most of which was
        22 464 ``changeColIntegrality`` calls (1.45 s)."""
        h = lp.solverModel
        inf = highspy.kHighsInf
        variables = lp.variables()
        n = len(variables)
        objective = lp.objective
        sign = -1.0 if lp.sense == pulp.LpMaximize else 1.0
        cost = np.fromiter((sign * objective.get(v, 0.0) for v in variables), np.float64, n)
        lower = np.fromiter((-inf if v.lowBound is None else v.lowBound for v in variables),
                            np.float64, n)
        upper = np.fromiter((inf if v.upBound is None else v.upBound for v in variables),
                            np.float64, n)
        for i, v in enumerate(variables):
            v.index = i
        none_i, none_f = np.zeros(0, dtype=np.int32), np.zeros(0)
        h.addCols(n, cost, lower, upper, 0, none_i, none_i, none_f)
        if self.mip:
            integer = np.fromiter((v.index for v in variables if v.cat == pulp.LpInteger),
                                  np.int32)
            if len(integer):
                h.changeColsIntegrality(len(integer), integer,
                                        np.full(len(integer), highspy.HighsVarType.kInteger))
        constraints = list(lp._constraints.values())
        row_lower = np.empty(len(constraints))
        row_upper = np.empty(len(constraints))
        starts = np.empty(len(constraints), dtype=np.int32)
        index: list[int] = []
        value: list[float] = []
        for i, c in enumerate(constraints):
            c.index = i
            starts[i] = len(index)
            for v, coefficient in c.items():
                if coefficient != 0:
                    index.append(v.index)
                    value.append(coefficient)
            lb, ub = c.getLb(), c.getUb()
            row_lower[i] = -inf if lb is None else lb
            row_upper[i] = inf if ub is None else ub
        if constraints:
            h.addRows(len(constraints), row_lower, row_upper, len(index), starts,
                      np.asarray(index, dtype=np.int32), np.asarray(value, dtype=np.float64))

    def callSolver(self, lp: pulp.LpProblem) -> None:  # noqa: N802 (PuLP's name)
        h = lp.solverModel
        h.setOptionValue("time_limit", max(MIN_SOLVE_SECONDS, self._deadline - time.perf_counter()))
        for name, value in self._highs_options.items():
            h.setOptionValue(name, value)
        if self._start:
            index = np.fromiter((v.index for v in self._start), dtype=np.int32)
            value = np.fromiter(self._start.values(), dtype=np.float64)
            h.setSolution(len(index), index, value)
        h.run()


class MilpPlanner(Planner):
    """Seed 002's MILP with HiGHS: least migration within the imbalance bound."""

    name = "milp"
    cover_bound = True

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        deadline = time.perf_counter() + params.time_limit
        start, start_note = _start_assignment(problem, params)
        if problem.n_keys == 0 or float(problem.load.sum()) <= 0:
            return Proposal(start, [start_note, "no load to balance: kept the start assignment"])
        setting, budget_notes = _setting(problem, params)
        units = _reduce(problem, setting, _max_explicit_keys(problem, params), params.theta,
                        _max_returns(params), start)
        notes = [start_note, *budget_notes, _describe_units(problem, units, setting, params.theta)]
        # Time kept back for disaggregation and the caller's evaluation.
        solve_end = deadline - (0.05 + 2e-6 * problem.n_keys + 0.02 * params.time_limit)
        model, outcome = _solve_modes(problem, params, setting, units,
                                      _mip_starts(problem, setting, units, start), solve_end, notes)
        if not outcome.has_solution:
            notes.append("fallback: the solver returned no plan; proposing the start assignment")
            return Proposal(start, notes)
        assignment, planned = _assignment(problem, units, setting, model)
        notes += _repair_overload(problem, units, setting, assignment, planned)
        notes += _trim_to_budget(problem, units, setting, assignment)
        notes += _fit_table(problem, params, assignment)
        bound, bound_note = _solver_bound(model, outcome, setting, units, params.theta)
        notes.append(bound_note)
        notes += _binding(problem, setting, assignment)
        return Proposal(assignment, notes, bound)


def _solve_modes(problem: Problem, params: PlanParams, s: _Setting, units: _Units,
                 starts: dict[str, np.ndarray], solve_end: float,
                 notes: list[str]) -> tuple[_Model, _Outcome]:
    """The hard mode if the bound looks reachable; the soft mode if not or if it fails."""
    unreachable = _unreachable(problem, params, s)
    if unreachable is None:
        model = _build(problem, units, s, params.theta, hard=True)
        values, start_note = _start_values(problem, units, s, model, starts)
        now = time.perf_counter()
        share = 1.0 if values is not None else HARD_SHARE
        outcome = _solve(model, values, now + (solve_end - now) * share, params.seed,
                         params.extra.get("highs_options"))
        notes += [start_note, _describe_outcome("hard bound", outcome)]
        if outcome.has_solution:
            return model, outcome
        unreachable = ("the hard model is infeasible" if outcome.infeasible
                       else "no plan within the bound found in time")
    notes.append(f"theta unreachable ({unreachable}): minimising the load above "
                 f"L_max = {s.l_max * s.mean:.6g} first, then migration")
    model = _build(problem, units, s, params.theta, hard=False)
    values, start_note = _start_values(problem, units, s, model, starts)
    outcome = _solve(model, values, solve_end, params.seed, params.extra.get("highs_options"))
    notes += [start_note, _describe_outcome("soft bound", outcome)]
    return model, outcome


# --------------------------------------------------------------------------- inputs

def _start_assignment(problem: Problem, params: PlanParams) -> tuple[np.ndarray, str]:
    """The warm start: ``extra["warm_start"]`` or the current assignment made valid."""
    given = params.extra.get("warm_start")
    if given is None:
        moved = int(problem.must_move().sum())
        return _place_forced(problem), (
            f"start: current assignment, {moved} key(s) of drained/removed instances placed "
            "largest first on the least-loaded instance")
    start = np.asarray(given, dtype=np.int64)
    if start.shape != (problem.n_keys,):
        raise PlanningError(f"warm_start has shape {start.shape}, expected ({problem.n_keys},)")
    if problem.n_keys and (start.min() < 0 or start.max() >= problem.n_instances
                           or not problem.active[start].all()):
        raise PlanningError("warm_start puts keys outside the active instances")
    return start.copy(), "start: params.extra['warm_start']"


def _place_forced(problem: Problem) -> np.ndarray:
    """Current assignment with keys that must move placed largest-first, least-loaded."""
    a = problem.current.copy()
    forced = np.flatnonzero(problem.must_move())
    if len(forced) == 0:
        return a
    a[forced] = -1
    loads = problem.instance_loads(a)
    heap = [(float(loads[i]), int(i)) for i in np.flatnonzero(problem.active)]
    heapq.heapify(heap)
    for k in forced[np.argsort(-problem.load[forced], kind="stable")]:
        load, i = heapq.heappop(heap)
        a[k] = i
        heapq.heappush(heap, (load + float(problem.load[k]), i))
    return a


def _setting(problem: Problem, params: PlanParams) -> tuple[_Setting, list[str]]:
    """Normalised loads, costs and budgets; a budget below the forced migration is raised."""
    notes = []
    total_state = float(problem.state.sum())
    if total_state > 0:
        cost, scale = problem.state / total_state, total_state
    else:
        cost, scale = np.full(problem.n_keys, 1.0 / problem.n_keys), 0.0
    forced = problem.must_move()
    budget_cost = None
    if params.budget_bytes is not None and scale > 0:
        forced_bytes = float(problem.state[forced].sum())
        budget = params.budget_bytes
        if budget < forced_bytes:
            notes.append(f"budget {budget:.0f} bytes is below the {forced_bytes:.0f} bytes that "
                         "drained/removed instances must shed: raised to that")
            budget = forced_bytes
        budget_cost = budget / scale
    budget_keys = params.budget_keys
    if budget_keys is not None and budget_keys < int(forced.sum()):
        notes.append(f"key budget {budget_keys} is below the {int(forced.sum())} keys that "
                     "drained/removed instances must shed: raised to that")
        budget_keys = int(forced.sum())
    mean = problem.mean_load()
    return _Setting(
        load=problem.load / mean, cost=cost, mean=mean, l_max=1.0 + params.theta,
        state_scale=scale, budget_cost=budget_cost, budget_keys=budget_keys,
        active=np.flatnonzero(problem.active), max_table=params.max_table,
        default=problem.default,
    ), notes


def _unreachable(problem: Problem, params: PlanParams, s: _Setting) -> str | None:
    """Why no plan can meet L_max (None when the hard mode is worth trying)."""
    heaviest = int(np.argmax(problem.load))
    if s.load[heaviest] > s.l_max * (1 + TOL):
        return f"key {problem.keys[heaviest]!r} alone has {s.load[heaviest]:.4f} x the mean load"
    if s.budget_cost is not None:
        need = migration_lower_bound(problem, s.l_max * s.mean)
        budget = s.budget_cost * s.state_scale
        if need > budget * (1 + TOL):
            return f"reaching L_max needs at least {need:.0f} bytes, budget {budget:.0f}"
    return None


def _max_explicit_keys(problem: Problem, params: PlanParams) -> int:
    """How many of the heaviest keys get binaries.

    Keys heavier than ``LIGHT_SHARE * theta * mean`` do (under a key budget also at
    least twice the budget), as many as the time limit affords; lighter keys are
    fine-grained enough for the fluid reservoirs.
    """
    given = params.extra.get("milp_max_keys")
    if given is not None:
        return max(1, int(given))
    n_active = int(problem.active.sum())
    affordable = max(MIN_BINARIES, int(BINARIES_PER_SECOND * params.time_limit)) // n_active
    wanted = int((problem.load > LIGHT_SHARE * params.theta * problem.mean_load()).sum())
    if params.budget_keys is not None:
        wanted = max(wanted, 2 * params.budget_keys)
    return max(1, min(wanted, affordable))


# ----------------------------------------------------------------------- MIP start

def _mip_starts(problem: Problem, s: _Setting, units: _Units,
                start: np.ndarray) -> dict[str, np.ndarray]:
    """Candidate MIP starts, best first: a greedy repair of the start, then the start."""
    return {"greedy repair of the start": _greedy_repair(problem, s, start, _movable(units, s)),
            "the start": start}


def _movable(units: _Units, s: _Setting) -> np.ndarray:
    """Keys whose move the model can express: explicit, fluid (with load) and forced keys."""
    movable = np.zeros(len(s.load), dtype=bool)
    movable[units.explicit] = True
    for res in units.reservoirs:
        movable[res.keys] = res.kind != PINNED
    return movable  # return units (stay or go home) are not: checked apart


def _greedy_repair(problem: Problem, s: _Setting, start: np.ndarray,
                   movable: np.ndarray) -> np.ndarray:
    """A MIP start that usually meets L_max: shed cheap load, place it largest first.

    From each instance above L_max (most loaded first), ``movable`` keys that fit in the
    largest room left on another instance are taken, those lighter than the excess
    first, each group by increasing state per load, until the excess is gone; as many as
    the budgets allow then go, heaviest first, to the instance with the most room.
    """
    a = start.copy()
    room = np.full(problem.n_instances, -np.inf)
    room[s.active] = s.l_max - np.bincount(a, weights=s.load, minlength=problem.n_instances)[
        s.active]
    shed = []
    for i in s.active[np.argsort(room[s.active], kind="stable")]:
        if room[i] >= 0:
            break
        keys = _shed_cheapest(a, s, int(i), -room[i], float(np.delete(room, i).max()),
                              movable)
        room[i] += float(s.load[keys].sum())
        shed.append(keys)
    if not shed:
        return a
    keys = _within_budgets(problem, s, a, np.concatenate(shed))
    a[keys] = -1
    room[s.active] = s.l_max - np.bincount(a[a >= 0], weights=s.load[a >= 0],
                                           minlength=problem.n_instances)[s.active]
    heap = [(-float(room[i]), int(i)) for i in s.active]
    heapq.heapify(heap)
    for k in keys[np.argsort(-s.load[keys], kind="stable")]:
        neg_room, i = heapq.heappop(heap)
        a[k] = i
        heapq.heappush(heap, (neg_room + float(s.load[k]), i))
    return a


def _shed_cheapest(a: np.ndarray, s: _Setting, i: int, excess: float, largest_room: float,
                   movable: np.ndarray) -> np.ndarray:
    """Movable keys of instance ``i`` that fit elsewhere and carry ``excess``, cheap first."""
    keys = np.flatnonzero(movable & (a == i) & (s.load > 0) & (s.load <= largest_room))
    keys = keys[np.lexsort((s.cost[keys] / s.load[keys], s.load[keys] > excess))]
    n = int(np.searchsorted(np.cumsum(s.load[keys]), excess, side="left")) + 1
    return keys[:n]


def _within_budgets(problem: Problem, s: _Setting, a: np.ndarray,
                    keys: np.ndarray) -> np.ndarray:
    """The longest prefix of ``keys`` whose moves, added to ``a``'s, fit the budgets."""
    moved = a != problem.current
    fits = np.ones(len(keys), dtype=bool)
    if s.budget_cost is not None:
        fits &= s.cost[moved].sum() + np.cumsum(s.cost[keys]) <= s.budget_cost * (1 + TOL)
    if s.budget_keys is not None:
        fits &= int(moved.sum()) + np.arange(1, len(keys) + 1) <= s.budget_keys
    return keys[:int(np.argmin(fits)) if not fits.all() else len(keys)]


# ------------------------------------------------------------------------ reduction

def _max_returns(params: PlanParams) -> int:
    """How many light routing-table keys get a return binary (one each, see :func:`_reduce`)."""
    given = params.extra.get("milp_max_returns")
    if given is not None:
        return max(0, int(given))
    return min(MAX_RETURNS, max(MIN_BINARIES, int(BINARIES_PER_SECOND * params.time_limit)))


def _reduce(problem: Problem, s: _Setting, max_keys: int, theta: float,
            max_returns: int = 0, start: np.ndarray | None = None) -> _Units:
    """Heaviest keys one by one, the rest in one reservoir per current instance.

    With a table bound, light keys now in the routing table (current instance active,
    not draining, default instance active, off their default) get one binary each, up
    to ``max_returns`` of them, cheapest state first: stay, or go back to their default
    instance (which shrinks the table). Only they are taken out of the reservoirs. Keys
    that ``start`` moves elsewhere stay fluid, so the start remains a valid MIP start.
    """
    order = np.argsort(-problem.load, kind="stable")
    explicit, light = np.sort(order[:max_keys]), order[max_keys:]
    if len(light) == 0:
        return _Units(explicit, ())
    loads = np.bincount(problem.current, weights=s.load)
    must = problem.must_move()
    returns = np.empty(0, np.int64)
    if s.max_table is not None and s.budget_keys is None and max_returns > 0:
        active = np.zeros(problem.n_instances + 1, dtype=bool)
        active[s.active] = True
        cand = light[(problem.current[light] != problem.default[light]) & ~must[light]
                     & active[problem.default[light]]]
        if start is not None:
            cand = cand[(start[cand] == problem.current[cand])
                        | (start[cand] == problem.default[cand])]
        cand = cand[np.lexsort((cand, s.cost[cand]))][:max_returns]
        returns = np.sort(cand)
        light = np.setdiff1d(light, returns, assume_unique=True)
        if len(light) == 0:
            return _Units(explicit, (), returns)
    light = light[np.argsort(problem.current[light], kind="stable")]
    sources, starts = np.unique(problem.current[light], return_index=True)
    reservoirs = []
    for j, keys in zip(sources, np.split(light, starts[1:]), strict=True):
        total = float(s.load[keys].sum())
        if must[keys[0]]:
            reservoirs.append(_Reservoir(int(j), FORCED, keys, total))
        elif s.budget_keys is not None:
            reservoirs.append(_Reservoir(int(j), PINNED, keys, total))
        elif total > 0:
            focus = max(float(loads[j]) - s.l_max, 0.0) + theta
            reservoirs.append(_fluid(s, int(j), keys, focus, BIN_GAP / len(sources)))
    return _Units(explicit, tuple(reservoirs), returns)


def _fluid(s: _Setting, source: int, keys: np.ndarray, focus: float,
           max_gap: float) -> _Reservoir:
    """Reservoir of the keys with load on ``source``: bins dense over [0, focus], refined
    until no bin's chord cost exceeds the cheapest-first cost by more than ``max_gap``."""
    keys = keys[s.load[keys] > 0]
    keys = keys[np.lexsort((-s.load[keys], s.cost[keys] / s.load[keys]))]
    load, cost = s.load[keys], s.cost[keys]
    total = float(load.sum())
    points = np.concatenate([np.linspace(0.0, min(total, focus), DENSE_BINS + 1)[1:],
                             total * 0.5 ** np.arange(SPARSE_BINS)])
    ends = np.searchsorted(np.cumsum(load), points * (1 - 1e-12)) + 1
    starts = np.unique(np.concatenate([[0], ends[ends < len(keys)]]))
    starts, gaps = _refine_bins(load, cost, starts, max_gap)
    home = (s.default[keys] == source).astype(np.float64) if s.default is not None \
        else np.zeros(len(keys))
    return _Reservoir(
        source=source, kind=FLUID, keys=keys, load=total,
        bin_load=np.add.reduceat(load, starts), bin_cost=np.add.reduceat(cost, starts),
        chord_gap=float(gaps.max()), bin_home=np.add.reduceat(home, starts),
    )


def _refine_bins(load: np.ndarray, cost: np.ndarray, starts: np.ndarray,
                 max_gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Split bins (by load, at their middle) until every chord gap is <= ``max_gap``.

    A bin's chord gap is the largest excess of its average-cost line over the
    cheapest-first cost curve inside it; splitting a bin roughly quarters it.
    """
    cum_load, cum_cost = np.cumsum(load), np.cumsum(cost)
    while True:
        gaps = _chord_gaps(load, cost, cum_load, cum_cost, starts)
        ends = np.append(starts[1:], len(load))
        wide = np.flatnonzero((gaps > max_gap) & (ends - starts > 1))
        if len(wide) == 0 or len(starts) >= MAX_BINS:
            return starts, gaps
        before = np.where(starts[wide] > 0, cum_load[starts[wide] - 1], 0.0)
        middle = np.searchsorted(cum_load, (before + cum_load[ends[wide] - 1]) / 2)
        starts = np.union1d(starts, np.clip(middle, starts[wide] + 1, ends[wide] - 1))


def _chord_gaps(load: np.ndarray, cost: np.ndarray, cum_load: np.ndarray,
                cum_cost: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Chord gap of each bin (see :func:`_refine_bins`)."""
    size = np.diff(np.append(starts, len(load)))
    base_load = np.repeat(np.where(starts > 0, cum_load[starts - 1], 0.0), size)
    base_cost = np.repeat(np.where(starts > 0, cum_cost[starts - 1], 0.0), size)
    slope = np.repeat(np.add.reduceat(cost, starts) / np.add.reduceat(load, starts), size)
    gap = slope * (cum_load - base_load) - (cum_cost - base_cost)
    return np.maximum(np.maximum.reduceat(gap, starts), 0.0)


# ---------------------------------------------------------------------------- model

def _build(problem: Problem, units: _Units, s: _Setting, theta: float, hard: bool) -> _Model:
    """The fixed seed-002 model over ``units`` (see the module docstring)."""
    m = _Model(pulp.LpProblem("rebalance_milp", pulp.LpMinimize), hard)
    load_terms: dict[int, list] = {int(i): [] for i in s.active}
    load_const = dict.fromkeys(load_terms, 0.0)
    moved_cost: list = []
    moved_count: list = []
    for p, k in enumerate(units.explicit):
        row = []
        for i in load_terms:
            v = m.x[p, i] = m.lp.add_variable(f"x_{p}_{i}", cat=pulp.LpBinary)
            row.append((v, 1.0))
            load_terms[i].append((v, float(s.load[k])))
            if i != problem.current[k]:
                moved_cost.append((v, float(s.cost[k])))
                moved_count.append((v, 1.0))
        m.lp += pulp.LpAffineExpression(row) == 1, f"one_instance_{p}"
    fixed_count = 0
    for r, res in enumerate(units.reservoirs):
        if res.kind == PINNED:
            load_const[res.source] += res.load
            continue
        flows = []
        for i in load_terms:
            if i != res.source:
                v = m.z[r, i] = m.lp.add_variable(f"z_{r}_{i}", lowBound=0)
                flows.append((v, 1.0))
                load_terms[i].append((v, 1.0))
        if res.kind == FORCED:
            m.lp += pulp.LpAffineExpression(flows) == res.load, f"empty_{r}"
            m.fixed_cost += float(s.cost[res.keys].sum())
            fixed_count += len(res.keys)
            continue
        fills = []
        for b, (bin_load, bin_cost) in enumerate(zip(res.bin_load, res.bin_cost, strict=True)):
            v = m.fill[r, b] = m.lp.add_variable(f"a_{r}_{b}", 0, float(bin_load))
            fills.append((v, -1.0))
            moved_cost.append((v, float(bin_cost / bin_load)))
        m.lp += pulp.LpAffineExpression(flows + fills) == 0, f"shed_{r}"
        load_const[res.source] += res.load
        load_terms[res.source] += [(v, -1.0) for v, _ in flows]
    for q, k in enumerate(units.returns):
        j, h = int(problem.current[k]), int(problem.default[k])
        v = m.y[q] = m.lp.add_variable(f"y_{q}", cat=pulp.LpBinary)
        load_const[j] += float(s.load[k])
        load_terms[j].append((v, -float(s.load[k])))
        load_terms[h].append((v, float(s.load[k])))
        moved_cost.append((v, float(s.cost[k])))
        moved_count.append((v, 1.0))
    table_objective = _table_constraint(m, problem, units, s)
    if s.budget_cost is not None:
        m.lp += (pulp.LpAffineExpression(moved_cost) <= s.budget_cost - m.fixed_cost,
                 "budget_bytes")
    if s.budget_keys is not None:
        m.lp += pulp.LpAffineExpression(moved_count) <= s.budget_keys - fixed_count, "budget_keys"
    objective = _load_constraints(m, load_terms, load_const, s, theta)
    if not hard:
        _giant_key_cuts(m, units, s)
    m.lp += pulp.LpAffineExpression(moved_cost + objective + table_objective)
    return m


def _table_constraint(m: _Model, problem: Problem, units: _Units, s: _Setting) -> list:
    """Routing-table size <= A_max, elastic: ``table - excess <= A_max``, excess penalised.

    Table size = keys whose planned instance differs from their default:

    * explicit key: ``1 - x[k, h(k)]`` (1 when h(k) is drained);
    * return unit: ``1 - y[k]`` (it is off its default unless it goes back);
    * light keys the model cannot route home count what they count now: keys that stay
      keep their membership; a fluid key already in the table stays in it wherever it
      goes (or leaves it, so 1 is an upper bound); keys of drained or removed instances
      count 1 (upper bound);
    * light keys at home that a fluid reservoir sheds: +1 each, modelled per cost bin as
      ``fill * (keys at home in the bin) / (load of the bin)``. Disaggregation takes a
      prefix of the bins, which can overshoot this count by a few keys per reservoir;
      the planner then sends keys home (:func:`fit_table`) to fit A_max.

    The penalty (:data:`TABLE_WEIGHT` per entry, above the total state) makes the
    elastic model choose the same plans as the strict one whenever the strict one is
    feasible, and keeps every warm start admissible.
    """
    if s.max_table is None:
        return []
    must = problem.must_move()
    other = np.ones(problem.n_keys, dtype=bool)
    other[units.explicit] = False
    other[units.returns] = False
    off = (problem.current != problem.default) | must
    const = float(off[other].sum())
    terms = []
    active = set(int(i) for i in s.active)
    for p, k in enumerate(units.explicit):
        const += 1.0
        h = int(problem.default[k])
        if h in active:
            terms.append((m.x[p, h], -1.0))
    for q, _k in enumerate(units.returns):
        const += 1.0
        terms.append((m.y[q], -1.0))
    for r, res in enumerate(units.reservoirs):
        if res.kind != FLUID:
            continue
        for b, (bin_load, home) in enumerate(zip(res.bin_load, res.bin_home, strict=True)):
            if home > 0:
                terms.append((m.fill[r, b], float(home / bin_load)))
    m.table_terms, m.table_const = terms, const
    m.table_excess = m.lp.add_variable("table_excess", lowBound=0)
    m.lp += (pulp.LpAffineExpression([*terms, (m.table_excess, -1.0)], const)
             <= float(s.max_table), "max_table")
    return [(m.table_excess, TABLE_WEIGHT)]


def _load_constraints(m: _Model, load_terms: dict[int, list], load_const: dict[int, float],
                      s: _Setting, theta: float) -> list:
    """Constraints (3), (4), (5) and the L_max bound; returns their objective terms."""
    d = m.lp.add_variable("d", lowBound=0, upBound=max(1.0, theta) if m.hard else None)
    d_u = m.lp.add_variable("d_u", lowBound=0)
    d_l = m.lp.add_variable("d_l", lowBound=0)
    m.dist = (d, d_u, d_l)
    objective = [(d, DISTANCE_WEIGHT), (d_u, -DISTANCE_WEIGHT * W2 / W1),
                 (d_l, -DISTANCE_WEIGHT * W2 / W1)]
    if not m.hard:
        # Some instance holds the heaviest key: its excess over L_max bounds e_max below.
        unavoidable = max(0.0, float(s.load.max()) - s.l_max)
        m.worst = m.lp.add_variable("e_max", lowBound=unavoidable)
        objective.append((m.worst, OVERLOAD_WEIGHT))
    for i, terms in load_terms.items():
        const = load_const[i]
        m.lp += pulp.LpAffineExpression([*terms, (d, -1.0), (d_u, 1.0)], const) <= 1.0, f"up_{i}"
        m.lp += pulp.LpAffineExpression([*terms, (d, 1.0), (d_l, -1.0)], const) >= 1.0, f"low_{i}"
        if m.hard:
            m.lp += pulp.LpAffineExpression(terms, const) <= s.l_max, f"lmax_{i}"
        else:
            e = m.overload[i] = m.lp.add_variable(f"e_{i}", lowBound=0)
            m.lp += pulp.LpAffineExpression([*terms, (e, -1.0)], const) <= s.l_max, f"lmax_{i}"
            m.lp += pulp.LpAffineExpression([(m.worst, 1.0), (e, -1.0)]) >= 0, f"worst_{i}"
            objective.append((e, OVERLOAD_WEIGHT / (2 * len(load_terms))))
    return objective


def _giant_key_cuts(m: _Model, units: _Units, s: _Setting) -> None:
    """``e_i >= (c_k - L_max) * x[k, i]`` for every key heavier than L_max.

    Valid (such a key overloads its instance by at least that much) and it stops the
    LP relaxation from spreading a giant key over several instances, which would
    leave the soft mode's bound near zero.
    """
    for p, k in enumerate(units.explicit):
        excess = float(s.load[k]) - s.l_max
        if excess > 0:
            for i, e in m.overload.items():
                m.lp += (pulp.LpAffineExpression([(e, 1.0), (m.x[p, i], -excess)]) >= 0,
                         f"giant_{p}_{i}")


def _start_values(problem: Problem, units: _Units, s: _Setting, m: _Model,
                  starts: dict[str, np.ndarray]) -> tuple[dict | None, str]:
    """Model values of the first start that meets the model's hard constraints."""
    fixed = ~_movable(units, s)
    fixed[units.returns] = False   # checked below: they may only go home
    for name, start in starts.items():
        loads = np.bincount(start, weights=s.load, minlength=problem.n_instances)
        moved = start != problem.current
        if m.hard and loads.max() > s.l_max * (1 + TOL):
            continue
        if s.budget_cost is not None and s.cost[moved].sum() > s.budget_cost * (1 + TOL):
            continue
        if s.budget_keys is not None and int(moved.sum()) > s.budget_keys:
            continue
        if moved[fixed].any():
            continue  # moves the model cannot express
        ret = units.returns
        if len(ret) and (moved[ret] & (start[ret] != problem.default[ret])).any():
            continue  # a return unit can only stay or go back to its default
        return _values(problem, units, s, m, start, loads), (
            f"MIP start: {name} (max load {loads.max():.4f} x mean, "
            f"{s.cost[moved].sum():.4%} of the state moved)")
    return None, "MIP start: none (no start meets the bound and the budgets)"


def _values(problem: Problem, units: _Units, s: _Setting, m: _Model, start: np.ndarray,
            loads: np.ndarray) -> dict[pulp.LpVariable, float]:
    """Values of every model variable for the key assignment ``start``."""
    values = {v: float(start[units.explicit[p]] == i) for (p, i), v in m.x.items()}
    for q, k in enumerate(units.returns):
        values[m.y[q]] = float(start[k] != problem.current[k])
    for r, res in enumerate(units.reservoirs):
        if res.kind == PINNED:
            continue
        out = np.bincount(start[res.keys], weights=s.load[res.keys],
                          minlength=problem.n_instances)
        for i in s.active:
            if i != res.source:
                values[m.z[r, int(i)]] = float(out[i])
        if res.kind == FLUID:
            shed = float(out.sum() - out[res.source])
            before = np.cumsum(res.bin_load) - res.bin_load
            for b, fill in enumerate(np.clip(shed - before, 0.0, res.bin_load)):
                values[m.fill[r, b]] = float(fill)
    for i, e in m.overload.items():
        values[e] = max(0.0, float(loads[i]) - s.l_max)
    if m.worst is not None:
        values[m.worst] = max(0.0, float(loads.max()) - s.l_max)
    if m.table_excess is not None:
        size = m.table_const + sum(c * values.get(v, 0.0) for v, c in m.table_terms)
        values[m.table_excess] = max(0.0, size - float(s.max_table))
    up = float(loads[s.active].max()) - 1.0
    low = 1.0 - float(loads[s.active].min())
    d = max(up, low, 0.0)
    values.update(zip(m.dist, (d, d - up, d - low), strict=True))
    return values


def _solve(m: _Model, start: dict | None, deadline: float, seed: int,
           highs_options: dict | None = None) -> _Outcome:
    """Run HiGHS single-threaded until ``deadline`` and read back status and bound.

    ``highs_options`` (``params.extra["highs_options"]``, e.g. ``{"mip_rel_gap": 0.01}``)
    are set on HiGHS as they are; a gap or node limit that stops the search before the
    deadline makes the result independent of the machine's speed."""
    solver = _HighsWithStart(start, deadline, highs_options, msg=False, threads=1,
                             random_seed=int(seed))
    t = time.perf_counter()
    try:
        m.lp.solve(solver)
    except pulp.PulpSolverError as exc:
        nan = float("nan")
        return _Outcome(f"solver error: {exc}", False, False, nan, nan, nan,
                        time.perf_counter() - t)
    h = m.lp.solverModel
    info = h.getInfo()
    status = h.getModelStatus()
    return _Outcome(
        status=h.modelStatusToString(status),
        has_solution=info.primal_solution_status == highspy.SolutionStatus.kSolutionStatusFeasible,
        infeasible=status == highspy.HighsModelStatus.kInfeasible,
        objective=float(info.objective_function_value),
        bound=float(info.mip_dual_bound),
        gap=float(info.mip_gap),
        seconds=time.perf_counter() - t,
    )


# ------------------------------------------------------------------ disaggregation

def _assignment(problem: Problem, units: _Units, s: _Setting,
                m: _Model) -> tuple[np.ndarray, np.ndarray]:
    """Key assignment of the solution and the instance loads the model planned (raw)."""
    a = problem.current.copy()
    active = [int(i) for i in s.active]
    for p, k in enumerate(units.explicit):
        a[k] = max(active, key=lambda i: m.x[p, i].varValue or 0.0)
    for q, k in enumerate(units.returns):
        if (m.y[q].varValue or 0.0) > 0.5:
            a[k] = problem.default[k]
    modelled = np.concatenate([units.explicit, units.returns]).astype(np.int64)
    planned = np.bincount(a[modelled], weights=problem.load[modelled],
                          minlength=problem.n_instances)
    picked = []
    for r, res in enumerate(units.reservoirs):
        if res.kind == PINNED:
            planned[res.source] += res.load * s.mean
            continue
        flows = {i: max(0.0, m.z[r, i].varValue or 0.0) for i in active if i != res.source}
        for i, flow in flows.items():
            planned[i] += flow * s.mean
        if res.kind == FORCED:
            picked.append(res.keys)
            continue
        shed = sum(flows.values())
        planned[res.source] += (res.load - shed) * s.mean
        picked.append(_cheapest(res, s, shed))
    if picked:
        _place_worst_fit(problem, a, np.concatenate(picked), planned, s.active)
    return a, planned


def _cheapest(res: _Reservoir, s: _Setting, shed: float) -> np.ndarray:
    """Prefix of the reservoir (cheapest state per load first) carrying ``shed`` load."""
    if shed <= TOL:
        return res.keys[:0]
    cum = np.cumsum(s.load[res.keys])
    n = int(np.searchsorted(cum, shed * (1 - 1e-9), side="left")) + 1
    return res.keys[:min(n, len(res.keys))]


def _place_worst_fit(problem: Problem, a: np.ndarray, picked: np.ndarray, planned: np.ndarray,
                     active: np.ndarray) -> None:
    """Place ``picked`` keys, heaviest first, on the instance with most room left by the plan."""
    a[picked] = -1
    loads = problem.instance_loads(a)
    heap = [(-(float(planned[i]) - float(loads[i])), int(i)) for i in active]
    heapq.heapify(heap)
    for k in picked[np.argsort(-problem.load[picked], kind="stable")]:
        neg_room, i = heapq.heappop(heap)
        a[k] = i
        heapq.heappush(heap, (neg_room + float(problem.load[k]), i))


def _repair_overload(problem: Problem, units: _Units, s: _Setting, a: np.ndarray,
                     planned: np.ndarray) -> list[str]:
    """Re-route light keys off instances the disaggregation left above their limit.

    The limit is L_max, or the planned load where the (soft) plan itself exceeds it.
    Light keys that already move are re-routed first (it costs nothing), then, unless
    a key budget pins them, the cheapest per unit of load; each goes to the active
    instance with the most room.
    """
    if not units.reduced:
        return []
    limit = np.full(problem.n_instances, -np.inf)
    limit[s.active] = np.maximum(s.l_max * s.mean, planned[s.active]) * (1 + 1e-12)
    loads = problem.instance_loads(a)
    movable = np.zeros(problem.n_keys, dtype=bool)
    movable[units.light] = True
    if s.budget_keys is not None:
        movable &= a != problem.current
    over = s.active[loads[s.active] > limit[s.active]]
    rerouted = sum(_shed(problem, s, a, loads, limit, int(i), movable) for i in over)
    notes = [f"disaggregation: re-routed {rerouted} light key(s) to keep instances under "
             "their limit"] if rerouted else []
    excess = (loads - limit)[s.active]
    if (excess > 0).any():
        notes.append(f"disaggregation: {int((excess > 0).sum())} instance(s) stay above their "
                     f"limit by up to {excess.max() / s.mean:.3%} of the mean load "
                     "(light keys too coarse)")
    return notes


def _shed(problem: Problem, s: _Setting, a: np.ndarray, loads: np.ndarray, limit: np.ndarray,
          i: int, movable: np.ndarray) -> int:
    """Move keys off instance ``i`` until it is under its limit; returns the count."""
    keys = np.flatnonzero(movable & (a == i) & (problem.load > 0))
    moving = problem.current[keys] != i
    keys = keys[np.lexsort((s.cost[keys] / s.load[keys], ~moving))]
    moves = 0
    for k in keys:
        if loads[i] <= limit[i]:
            break
        room = limit - loads
        room[i] = -np.inf
        j = int(np.argmax(room))
        if problem.load[k] <= room[j]:
            a[k] = j
            loads[i] -= problem.load[k]
            loads[j] += problem.load[k]
            moves += 1
    return moves


def _trim_to_budget(problem: Problem, units: _Units, s: _Setting, a: np.ndarray) -> list[str]:
    """Send moved light keys home, most expensive first, while the byte budget is exceeded.

    Only the disaggregation's overshoot (at most about one light key per reservoir) can
    break the budget the model respected.
    """
    if s.budget_cost is None or not units.reduced:
        return []
    moved = a != problem.current
    excess = float(s.cost[moved].sum()) - s.budget_cost * (1 + TOL)
    if excess <= 0:
        return []
    light = units.light
    back = light[moved[light] & ~problem.must_move()[light]]
    back = back[np.argsort(-s.cost[back], kind="stable")]
    n = int(np.searchsorted(np.cumsum(s.cost[back]), excess, side="left")) + 1
    a[back[:n]] = problem.current[back[:n]]
    return [f"disaggregation: sent {min(n, len(back))} light key(s) back to stay within the "
            "byte budget"]


def _fit_table(problem: Problem, params: PlanParams, a: np.ndarray) -> list[str]:
    """With A_max: send keys that move anyway to their default (free), then, only if the
    disaggregation's rounding left the table above A_max, send keys home to fit it
    (:func:`rebalance.planners.auto.fit_table`)."""
    if params.max_table is None:
        return []
    from .auto import fit_table

    before = int((a != problem.default).sum())
    fitted, back = fit_table(problem, params, a)
    a[:] = fitted
    after = int((a != problem.default).sum())
    if not back:
        return []
    return [f"table fit: {back} key(s) sent to their default instance, table {before} -> "
            f"{after} (A_max {params.max_table})"]


# -------------------------------------------------------------------------- reports

def _solver_bound(m: _Model, outcome: _Outcome, s: _Setting, units: _Units,
                  theta: float) -> tuple[float | None, str]:
    """Migration lower bound (bytes) from the HiGHS dual bound, with what it means.

    Any plan meeting L_max and the budgets has an image in the model whose objective
    exceeds the plan's migrated share by at most the tie-breaker (lambda * max(1, theta))
    plus, per reservoir, the chord error of its bins; so the dual bound minus both is a
    lower bound for the full problem, unless the model restricts it.
    """
    if not m.hard:
        return None, (f"solver_bound: none (soft mode optimises overload first); HiGHS bound "
                      f"{outcome.bound:.6g} on the weighted overload + migrated share")
    if not np.isfinite(outcome.bound):
        return None, "solver_bound: none (HiGHS reported no finite dual bound)"
    if any(r.kind == PINNED for r in units.reservoirs):
        return None, "solver_bound: none (light keys pinned by the key budget)"
    if any(r.kind == FLUID for r in units.reservoirs) and s.budget_cost is not None:
        return None, ("solver_bound: none (a byte budget on the reduced model's cost bins "
                      "does not relax the full problem)")
    if s.max_table is not None and units.reduced:
        return None, ("solver_bound: none (with A_max the reduced model counts light keys' "
                      "table entries conservatively and restricts light table keys to "
                      "staying or going home, so it does not relax the full problem)")
    slack = DISTANCE_WEIGHT * max(1.0, theta) + sum(r.chord_gap for r in units.reservoirs)
    bound = s.state_scale * max(0.0, outcome.bound + m.fixed_cost - slack)
    return bound, (f"solver_bound: {bound:.0f} bytes, least state any plan meeting L_max, "
                   f"{'A_max and ' if s.max_table is not None else ''}"
                   f"the budgets must move (HiGHS dual bound of the "
                   f"{'reduced' if units.reduced else 'exact'} model minus {slack:.3g}, the "
                   "most the tie-breaker and the cost bins can add)")


def _describe_units(problem: Problem, units: _Units, s: _Setting, theta: float) -> str:
    n = int(len(s.active))
    if not units.reduced:
        return f"model: exact, {problem.n_keys} keys x {n} instances as binaries"
    kinds = {kind: sum(len(r.keys) for r in units.reservoirs if r.kind == kind)
             for kind in (FLUID, FORCED, PINNED)}
    light = np.concatenate([units.light, units.returns]).astype(np.int64)
    biggest = float(s.load[light].max()) if len(light) else 0.0
    return (f"model: reduced, {len(units.explicit)} heaviest keys x {n} instances as binaries; "
            f"light keys: {kinds[FLUID]} fluid, {kinds[FORCED]} forced to leave, "
            f"{kinds[PINNED]} pinned, {len(units.returns)} table keys that may go home "
            f"(largest {biggest:.4f} x mean = {biggest / theta:.2f} x theta * mean)")


def _describe_outcome(mode: str, o: _Outcome) -> str:
    return (f"{mode}: HiGHS '{o.status}' in {o.seconds:.2f} s, objective {o.objective:.6g}, "
            f"dual bound {o.bound:.6g}, gap {o.gap:.2%}")


def _binding(problem: Problem, s: _Setting, a: np.ndarray) -> list[str]:
    """Which limits the plan presses against."""
    loads = problem.instance_loads(a) / s.mean
    moved = a != problem.current
    unit = "state" if s.state_scale > 0 else "keys"
    notes = [f"plan: max load {loads.max():.4f} x mean (limit {s.l_max:.4f}), "
             f"{int(moved.sum())} key(s) moved, {s.cost[moved].sum():.4%} of the {unit}"]
    if s.budget_cost is not None and s.cost[moved].sum() >= 0.999 * s.budget_cost:
        notes.append("binding: the byte budget is used up")
    if s.budget_keys is not None and int(moved.sum()) >= s.budget_keys:
        notes.append("binding: the key budget is used up")
    return notes
