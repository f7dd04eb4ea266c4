"""The default planner: Fang et al.'s Mixed, then as much more search as can pay off.

Mixed is fast at any size and keeps the routing table within A_max, but moves more state
than the migration lower bound needs; the MILP of Madsen et al. (warm-started) gets close
to the bound but needs seconds, and most of what it finds the integer knapsack covers of
:mod:`rebalance.core.bounds` already give. So auto climbs a ladder and stops at the first
rung that is good enough: (1) Mixed, kept when within :data:`GOOD_ENOUGH` of its lower
bound or too large to search; (2) the cover plan (:func:`cover_plan`: every instance above
the least reachable max load sheds a minimum knapsack cover of its excess), kept when
within GOOD_ENOUGH of the integer bound; (3) a short MILP polish warm-started from the
better plan. It keeps the better plan (feasible first, then less migration), and the
notes say which rung was kept and why. Every rule, the time budgets and the measurements
behind them: ``docs/planning.md``, "The default planner: auto".
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from rebalance.core.bounds import knapsack_covers
from rebalance.core.float_tolerances import CHECK_TOL, LOAD_TOL
from rebalance.core.model import Plan, PlanParams, Problem
from rebalance.core.planners.base import Planner, Proposal, finish_plan
from rebalance.core.planners.table_fit import fit_table

#: Mixed or the cover plan within this fraction above the integer lower bound: stop.
GOOD_ENOUGH = 0.02
#: Above this many keys the MILP's disaggregation and model building alone exceed the
#: one-second planning target of the benchmark; auto returns Mixed's plan.
MILP_MAX_KEYS = 200_000
#: The MILP needs at least this much time left to be worth starting: building its PuLP
#: model, handing it over and disaggregating take a few tenths of a second at 10^4 keys,
#: so a shorter polish would only overrun its budget (and the time limit).
MIN_MILP_SECONDS = 0.5
#: Relative MIP gap at which the polish stops.
MILP_GAP = 0.01
#: Share of the time left after the cover plan that the MILP may get (it overruns its
#: limit a little: model hand-over, disaggregation, evaluation).
MILP_SHARE = 0.75
#: Above this many keys on the instances to relieve, no cover plan: the covers (one HiGHS
#: knapsack per instance) would run out of their time share and the greedy rest would be
#: worse than a MILP polish, which auto then runs from Mixed with MILP_SHARE of the time
#: left.
COVER_PLAN_MAX_KEYS = 10_000
#: Share of the time left that the knapsack covers may take (twice at most: the covers,
#: then the covers restricted to keys that fit).
COVER_SHARE = 0.4
#: Rounds of repair of the cover plan (instances still above the bound shed more keys).
REPAIR_ROUNDS = 3
#: Instances (those with the most room) a key that fits nowhere may evict lighter keys from.
EVICT_CANDIDATES = 8
#: Seconds HiGHS may spend on one repair cover.
REPAIR_COVER_SECONDS = 0.1
#: Seconds of search the MILP polish gets at most, whatever the time limit: after the
#: cover plan the MILP rarely improves by more than GOOD_ENOUGH (a longer search goes
#: mostly into root cuts), and this keeps the median plan under 2 s.
POLISH_SECONDS = 1.2
#: Seconds the whole ladder aims at (Mixed, covers, polish): the polish gets what is left
#: of it, so the median plan stays under 2 s also when the covers take long.
SEARCH_SECONDS = 1.6


class AutoPlanner(Planner):
    """Mixed, then the knapsack-cover plan, then a short MILP polish, while they can pay."""

    name = "auto"
    cover_bound = True

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        from rebalance.core.planners.table_migration import MixedPlanner

        t0 = time.perf_counter()
        if problem.scenarios is not None:
            from rebalance.core.planners.robust import robust_proposal

            return robust_proposal(problem, params, "llfd")
        if problem.n_keys > MILP_MAX_KEYS:
            # No polish possible: skip evaluating Mixed's plan here (its lower bound alone is
            # costly at this size); finish_plan evaluates auto's plan once.
            proposal = MixedPlanner().propose(problem, params)
            return Proposal(proposal.assignment, [
                f"kept Mixed's plan: {problem.n_keys} keys exceed the MILP polish limit of "
                f"{MILP_MAX_KEYS}", *_prefixed("mixed", proposal.notes)])
        mixed = MixedPlanner().plan(problem, params)
        notes = [f"mixed: {_summary(mixed)}"]
        skip = self._skip_reason(problem, params, mixed)
        if skip:
            notes.append(f"kept Mixed's plan: {skip}")
            return Proposal(mixed.assignment, notes + _prefixed("mixed", mixed.notes))

        # Rung 2: the integer bound at the best reachable max load, and the plan of its covers.
        target = max(problem.max_load(params.theta), float(problem.load.max()))
        best, bound = mixed, None
        crowded = _keys_above(problem, target)
        if crowded > COVER_PLAN_MAX_KEYS:
            # The covers would need more than the search budget (a HiGHS knapsack per
            # instance): the MILP polish straight from Mixed, with MILP_SHARE of the time left.
            seconds = MILP_SHARE * (params.time_limit - (time.perf_counter() - t0))
            milp = self._polish(problem, params, mixed, seconds, mixed.lower_bound_bytes,
                                size_seconds=MILP_SHARE * params.time_limit)
            chosen = milp if _better(milp, mixed) else mixed
            notes += [f"no cover plan: {crowded} keys on instances above {target:.6g} "
                      f"(more than {COVER_PLAN_MAX_KEYS})",
                      f"milp polish ({seconds:.2f} s, warm start = Mixed): {_summary(milp)}",
                      f"chose {'the MILP polish' if chosen is milp else 'Mixed'}"]
            return Proposal(chosen.assignment, notes + _prefixed(chosen.method, chosen.notes),
                            solver_bound=milp.solver_bound)
        t1 = time.perf_counter()
        deadline = t0 + params.time_limit
        covers = knapsack_covers(problem, target, total_seconds=_cover_seconds(deadline))
        if covers is not None and np.isfinite(covers[0]):
            bound = covers[0]
            for attempt in ("", "restricted to keys that fit, "):
                if attempt and best.method == "cover":
                    break  # the covers were placed: restricting them only costs more moves
                if attempt:
                    # Keys heavier than the most room any instance has cannot leave.
                    fits = problem.load <= _largest_room(problem, target)
                    covers = knapsack_covers(problem, target, movable=fits,
                                             total_seconds=_cover_seconds(deadline))
                placed = cover_plan(problem, covers[1], target,
                                    deadline=t0 + COVER_SHARE * 2 * params.time_limit)
                if placed is None:
                    notes.append(f"cover plan ({attempt}covers): no placement under "
                                 f"{target:.6g}")
                    continue
                cover = finish_plan("cover", problem, params, Proposal(placed),
                                    time.perf_counter() - t1)
                notes.append(f"cover plan ({attempt}{'exact' if covers[2] else 'partly greedy'}"
                             f" covers): {_summary(cover)}")
                if _better(cover, best):
                    best = cover
                if cover.metrics.migration_bytes <= (1 + GOOD_ENOUGH) * bound:
                    break
            m = best.metrics
            if (m.max_load_after <= target * (1 + CHECK_TOL)
                    and m.migration_bytes <= (1 + GOOD_ENOUGH) * bound):
                notes.append(f"kept {_name(best)}: within {GOOD_ENOUGH:.0%} of the integer "
                             f"lower bound ({bound:.0f} bytes) at the best reachable max load")
                return Proposal(best.assignment, notes + _prefixed(_name(best), best.notes),
                                cover_bound=(target, bound))
        heaviest = float(problem.load.max())
        if (heaviest > problem.max_load(params.theta)
                and best.metrics.max_load_after <= target * (1 + CHECK_TOL)):
            notes.append(f"kept {_name(best)}: theta is unreachable (a key alone carries "
                         f"{heaviest:.6g}) and this plan already has the least max load any "
                         "plan can have; the MILP could only trade migration, and measured it "
                         "never did (docs/planning.md)")
            return Proposal(best.assignment, notes + _prefixed(_name(best), best.notes),
                            cover_bound=None if bound is None else (target, bound))
        spent = time.perf_counter() - t0
        left = min(MILP_SHARE * (params.time_limit - spent), POLISH_SECONDS,
                   SEARCH_SECONDS - spent)
        if left < MIN_MILP_SECONDS:
            notes.append(f"kept {_name(best)}: less than {MIN_MILP_SECONDS} s of the time limit "
                         f"or of the {SEARCH_SECONDS} s search budget left for a MILP polish")
            return Proposal(best.assignment, notes + _prefixed(_name(best), best.notes),
                            cover_bound=None if bound is None else (target, bound))

        # Rung 3: a short MILP polish from the better plan.
        milp = self._polish(problem, params, best, left, bound, size_seconds=left)
        notes.append(f"milp polish ({left:.2f} s, warm start = "
                     f"{_name(best)}): {_summary(milp)}")
        # The MILP models A_max (and fits its own rounding); this is only a fallback.
        over = params.max_table is not None and milp.metrics.table_size > params.max_table
        fitted, moved_back = fit_table(problem, params, milp.assignment) if over else (None, 0)
        if moved_back:
            milp = finish_plan("milp", problem, params, Proposal(fitted), milp.plan_seconds)
            notes.append(f"table fit (A_max = {params.max_table}): {moved_back} key(s) sent back "
                         f"to their default instance: {_summary(milp)}")
        chosen = milp if _better(milp, best) else best
        notes.append(f"chose {'the MILP polish' if chosen is milp else _name(best)}")
        return Proposal(chosen.assignment, notes + _prefixed(chosen.method, chosen.notes),
                        solver_bound=milp.solver_bound,
                        cover_bound=None if bound is None else (target, bound))

    @staticmethod
    def _polish(problem: Problem, params: PlanParams, start: Plan, seconds: float,
                bound: float | None, size_seconds: float | None = None) -> Plan:
        from rebalance.core.planners.milp import MilpPlanner
        from rebalance.core.planners.milp.setting import _max_explicit_keys, _max_returns

        # Determinism: the model size follows the polish budget (not the time left, which
        # varies), and HiGHS stops at the target or the gap, usually before the deadline.
        if size_seconds is None:
            size_seconds = min(POLISH_SECONDS, MILP_SHARE * params.time_limit)
        sized = dataclasses.replace(params, time_limit=size_seconds)
        highs = {"mip_rel_gap": MILP_GAP}
        total_state = float(problem.state.sum())
        if bound is not None and total_state > 0:
            # the MILP's objective is the migrated share of the state (plus tie-breakers)
            highs["objective_target"] = (1 + GOOD_ENOUGH) * bound / total_state
        milp_params = dataclasses.replace(
            params, time_limit=seconds, warm_start=start.assignment,
            milp_max_keys=(params.milp_max_keys if params.milp_max_keys is not None
                           else _max_explicit_keys(problem, sized)),
            milp_max_returns=(params.milp_max_returns if params.milp_max_returns is not None
                              else _max_returns(sized)),
            highs_options={**highs, **(params.highs_options or {})})
        # auto's own finish_plan computes the integer cover bound for the plan it keeps.
        return MilpPlanner().plan(problem, milp_params, cover_bound=False)

    @staticmethod
    def _skip_reason(problem: Problem, params: PlanParams, mixed: Plan) -> str | None:
        m = mixed.metrics
        if mixed.feasible and m.migration_bytes <= (1 + GOOD_ENOUGH) * mixed.lower_bound_bytes:
            return (f"it is within {GOOD_ENOUGH:.0%} of the migration lower bound "
                    f"({mixed.lower_bound_fraction:.4%})")
        if float(problem.load.sum()) <= 0:
            return "no load to balance"
        return None


def cover_plan(problem: Problem, moving: np.ndarray, max_load: float,
               rounds: int = REPAIR_ROUNDS, deadline: float | None = None) -> np.ndarray | None:
    """The current assignment with the keys ``moving`` (e.g. knapsack covers) placed where
    they fit under ``max_load``, then repaired; None when some instance stays above.

    Placement: heaviest first, on the key's default instance when it is active, not its
    current one and has room (this keeps the routing table small), else on the active
    instance with the least room that still fits (best fit). A key that fits nowhere
    makes room, as Fang et al.'s ADJUST does: among the :data:`EVICT_CANDIDATES` instances
    with the most room, the one that can free enough room most cheaply sheds lighter keys
    (by increasing state per load), which are placed in turn; if they do not all fit, the
    key stays where it is. Repair, for up to ``rounds`` rounds: every instance still
    above ``max_load`` sheds the cheapest set of its other keys that carries its excess
    among those that fit in the largest room left (a knapsack cover again; after
    ``deadline`` the greedy cover by state per load), placed the same way.
    """
    from rebalance.core.bounds import _greedy_cover, min_knapsack_cover

    a = problem.current.copy()
    moving = np.asarray(moving, dtype=np.int64)
    a[moving] = -1
    loads = problem.instance_loads(a)
    room = np.where(problem.active, max_load * (1 + LOAD_TOL) - loads, -np.inf)
    load, state = problem.load, problem.state
    stuck = np.zeros(problem.n_keys, dtype=bool)

    def fit(k: int, exclude: int = -1) -> int:
        """Where key k goes without evicting anything (-1: nowhere)."""
        c, own, home = float(load[k]), int(problem.current[k]), int(problem.default[k])
        if home != own and home != exclude and room[home] >= c:
            return home
        fits = room >= c
        if 0 <= own < problem.n_instances:
            fits[own] = False
        if exclude >= 0:
            fits[exclude] = False
        candidates = np.flatnonzero(fits)
        return int(candidates[np.argmin(room[candidates])]) if len(candidates) else -1

    def evict(k: int) -> bool:
        """Make room for key k on the instance that frees it most cheaply (ADJUST)."""
        c, own = float(load[k]), int(problem.current[k])
        best = None
        for i in np.argsort(-room)[:EVICT_CANDIDATES]:
            if i == own or not problem.active[i] or room[i] >= c:
                continue
            keys = np.flatnonzero((a == i) & ~stuck & (load > 0) & (load < c))
            need = c - float(room[i])
            if float(load[keys].sum()) < need:
                continue
            chosen = keys[_greedy_cover(load[keys], state[keys], need)]
            cost = float(state[chosen].sum())
            if best is None or cost < best[2]:
                best = (int(i), chosen, cost)
        if best is None:
            return False
        i, chosen, _ = best
        saved_a, saved_room = a[chosen].copy(), room.copy()
        room[i] += float(load[chosen].sum()) - c
        a[k] = i
        for e in chosen[np.argsort(-load[chosen], kind="stable")]:
            target = fit(int(e), exclude=i)
            if target < 0:  # undo: k stays where it is
                a[chosen], room[:] = saved_a, saved_room
                a[k] = -1
                return False
            a[e] = target
            room[target] -= float(load[e])
        return True

    def place(keys: np.ndarray) -> bool:
        """Place ``keys`` (off every instance); False if one must move and fits nowhere."""
        for k in keys[np.argsort(-load[keys], kind="stable")]:
            target = fit(int(k))
            if target < 0:
                if evict(int(k)):
                    continue
                own = int(problem.current[k])
                if not (0 <= own < problem.n_instances and problem.active[own]):
                    return False  # a key that must move fits nowhere
                target = own
                stuck[k] = True
            a[k] = target
            room[target] -= float(load[k])
        return True

    if not place(moving):
        return None
    for _ in range(rounds):
        over = np.flatnonzero(room < 0)
        if len(over) == 0:
            return a
        for d in over:
            keys = np.flatnonzero((a == d) & ~stuck & (load > 0))
            keys = keys[load[keys] <= room.max()]
            if len(keys) == 0:
                continue
            late = deadline is not None and time.perf_counter() > deadline
            excess = float(-room[d])
            chosen = keys[_greedy_cover(load[keys], state[keys], excess) if late else
                          min_knapsack_cover(load[keys], state[keys], excess,
                                             REPAIR_COVER_SECONDS)]
            room[d] += float(load[chosen].sum())
            a[chosen] = -1
            if not place(chosen):
                return None
    return a if (room >= 0).all() else None


def _keys_above(problem: Problem, max_load: float) -> int:
    """Keys on the instances loaded above ``max_load`` (what the covers would look at)."""
    stay = ~problem.must_move()
    loads = np.bincount(problem.current[stay], weights=problem.load[stay],
                        minlength=problem.n_instances)
    above = np.flatnonzero(loads > max_load * (1 + LOAD_TOL))
    return int(np.isin(problem.current[stay], above).sum()) if len(above) else 0


def _cover_seconds(deadline: float) -> float:
    """Seconds the knapsack covers may take now: COVER_SHARE of the time left, at most
    the bound's own cap, so that the time limit stays a hard cap of the whole ladder."""
    from rebalance.core.bounds import COVER_TOTAL_SECONDS

    return max(0.0, min(COVER_TOTAL_SECONDS, COVER_SHARE * (deadline - time.perf_counter())))


def _largest_room(problem: Problem, max_load: float) -> float:
    """The most load an active instance can take under ``max_load`` as things are now."""
    stay = ~problem.must_move()
    loads = np.bincount(problem.current[stay], weights=problem.load[stay],
                        minlength=problem.n_instances)[:problem.n_instances]
    room = (max_load - loads)[problem.active]
    return float(room.max()) if len(room) else 0.0


def _name(plan: Plan) -> str:
    return {"mixed": "Mixed", "cover": "the cover plan"}.get(plan.method, plan.method)


def _better(a: Plan, b: Plan) -> bool:
    """Is plan ``a`` strictly better than plan ``b`` (ties keep ``b``)?"""
    if a.feasible != b.feasible:
        return a.feasible
    ma, mb = a.metrics, b.metrics
    if a.feasible:
        key_a = (ma.migration_bytes, ma.table_size)
        key_b = (mb.migration_bytes, mb.table_size)
    else:
        key_a = (round(ma.imbalance_after, 9), ma.migration_bytes)
        key_b = (round(mb.imbalance_after, 9), mb.migration_bytes)
    return key_a < key_b


def _summary(plan: Plan) -> str:
    m = plan.metrics
    return (f"feasible={plan.feasible}, imbalance {m.imbalance_after:.4f}, migration "
            f"{m.migration_fraction:.4%} (lower bound {plan.lower_bound_fraction:.4%}), "
            f"table {m.table_size}, {plan.plan_seconds:.3f} s")


def _prefixed(method: str, notes: list[str]) -> list[str]:
    return [f"{method}: {n}" for n in notes]
