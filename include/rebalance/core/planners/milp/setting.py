"""The numbers one MILP planning run shares: constants, the normalised setting, the
model's units (explicit keys, reservoirs, return units) and the containers of a model
and a solve. Budgets below the forced migration are raised here.

Part of :mod:`rebalance.core.planners.milp` (design: ``docs/planning.md``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pulp

from rebalance.core.bounds import migration_lower_bound
from rebalance.core.float_tolerances import CHECK_TOL
from rebalance.core.model import PlanParams, Problem

W1, W2 = 100.0, 1.0          # Madsen et al.'s weights of d and of d_u + d_l; w1 > 2 * w2
DISTANCE_WEIGHT = 1e-4       # lambda: the paper's load distance as a tie-breaker
OVERLOAD_WEIGHT = 1e3        # soft mode: per mean load above L_max, before migration
BINARIES_PER_SECOND = 3000   # model size the time limit affords (PuLP build + HiGHS)
MIN_BINARIES = 2000
#: Light routing-table keys that get a return binary at most (cheapest state first): on a
#: full table, more return binaries slow the solve without a better plan.
MAX_RETURNS = 1000
LIGHT_SHARE = 0.1            # keys lighter than this share of theta * mean may be fluid
HARD_SHARE = 0.6             # time for the hard mode when the soft mode may follow
MIN_SOLVE_SECONDS = 0.05
DENSE_BINS, SPARSE_BINS = 32, 8   # initial cost bins per reservoir: over [0, focus], beyond
MAX_BINS = 512               # cost bins per reservoir at most
BIN_GAP = 1e-4               # chord error of all cost bins together, share of total state
TOL = CHECK_TOL   # budgets and L_max of the model's answers: HiGHS is no more exact
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
    given = params.milp_max_keys
    if given is not None:
        return max(1, int(given))
    n_active = int(problem.active.sum())
    affordable = max(MIN_BINARIES, int(BINARIES_PER_SECOND * params.time_limit)) // n_active
    wanted = int((problem.load > LIGHT_SHARE * params.theta * problem.mean_load()).sum())
    if params.budget_keys is not None:
        wanted = max(wanted, 2 * params.budget_keys)
    return max(1, min(wanted, affordable))


def _max_returns(params: PlanParams) -> int:
    """How many light routing-table keys get a return binary (one each, see :func:`_reduce`)."""
    given = params.milp_max_returns
    if given is not None:
        return max(0, int(given))
    return min(MAX_RETURNS, max(MIN_BINARIES, int(BINARIES_PER_SECOND * params.time_limit)))
