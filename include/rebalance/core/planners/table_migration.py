"""Plans within L_max that trade routing-table size against moved state: MinTable, MinMig, Mixed.

Fang et al.'s three heuristics over one LLFD engine. A key goes by the routing table when it
has an entry, else by its hash (``problem.default``); each heuristic minimises the moved
state subject to ``max load <= L_max`` and a table of at most A_max keys, in three phases:
I. clean (send table keys back to their default instance), II. prepare (detach keys from
instances above L_max into the candidates), III. LLFD (place candidates heaviest first on
the least-loaded instance that fits, else ADJUST). MinTable cleans every table key, MinMig
none, Mixed the fewest smallest-state keys that make the table fit A_max. The phases, psi,
the fixes to the paper and the choices made: ``docs/planning.md``, "MinTable, MinMig and
Mixed: design"; the records the engine moves: :mod:`rebalance.core.planners.compact`.
"""

from __future__ import annotations

import heapq
from bisect import insort
from dataclasses import dataclass

import numpy as np

from rebalance.core.float_tolerances import LOAD_TOL
from rebalance.core.model import PlanParams, Problem
from rebalance.core.planners.base import Planner, Proposal
from rebalance.core.planners.compact import CompactKeys, Psi, resolution_bits

LOOP_CAP_PER_RECORD = 16
"""Candidates popped per record (plus a constant) before ADJUST stops."""

MIXED_MAX_TRIALS = 32
"""Mixed trials before n jumps to |A|."""

_REL_TOL = LOAD_TOL




@dataclass(frozen=True)
class LlfdOutcome:
    """Assignment of one LLFD run and what it did."""

    assignment: np.ndarray
    cleaned: int               # table keys sent back to their default instance (phase I)
    detached: int              # keys detached from instances above the bound (phase II)
    forced: int                # keys of drained/removed instances (or given) that start in C
    adjusted: int              # keys swapped out by ADJUST
    fallbacks: int             # candidate keys no instance accepted
    capped: bool               # the loop cap stopped ADJUST
    table_size: int
    moved_keys: int


class _Run:
    """Phases II and III of one trial over a CompactKeys with n table keys cleaned."""

    def __init__(self, ck: CompactKeys, problem: Problem, n_clean: int, bound: float) -> None:
        self.ck, self.problem, self.n_clean, self.bound = ck, problem, n_clean, bound
        self.limit = bound * (1 + _REL_TOL)
        self.tol = bound * _REL_TOL
        self.level = ck.level.tolist()
        self.psi = ck.psi_rank.tolist()
        cleaned = np.bincount(ck.clean_records[:n_clean], minlength=ck.n_records)
        self.split = ck.start + cleaned  # keys before split went back to their default
        self.loads, self.by_level = self._initial_loads()
        n = ck.n_instances
        self.lists: list[list[list[int]] | None] = [None] * n  # ranges per instance
        self.pending: list[list[list[int]]] = [[] for _ in range(n)]  # until lists[d] exists
        for r in np.flatnonzero(cleaned > 0).tolist():
            self.pending[int(ck.default[r])].append(
                [self.psi[r], int(ck.start[r]), int(self.split[r]), r])
        self.heap: list[tuple[int, int, int, int, int]] = []  # the candidate set C
        self.log: list[tuple[int, int, int]] = []  # placements (lo, hi, instance) in order
        self.detached = self.adjusted = self.fallbacks = self.forced = 0
        self.capped = False
        for r in np.flatnonzero((ck.home < 0) & (self.split < ck.stop)).tolist():
            self._push(int(self.split[r]), int(ck.stop[r]), r)
            self.forced += int(ck.stop[r] - self.split[r])

    def _initial_loads(self) -> tuple[np.ndarray, np.ndarray]:
        """Load per instance (inf on drained ones: they get nothing) and per (instance, load
        level) after cleaning, without the keys that must move."""
        ck, n = self.ck, self.ck.n_instances
        clean_cost = ck.prefix[self.split] - ck.prefix[ck.start]
        rest_cost = ck.prefix[ck.stop] - ck.prefix[self.split]
        stays = ck.home >= 0
        loads = np.zeros(n)
        loads += np.bincount(ck.default, clean_cost, minlength=n)
        loads += np.bincount(ck.home[stays], rest_cost[stays], minlength=n)
        loads[~self.problem.active] = np.inf
        cells = np.zeros(n * ck.n_levels)
        cells += np.bincount(ck.default * ck.n_levels + ck.level, clean_cost,
                             minlength=n * ck.n_levels)
        cells += np.bincount(ck.home[stays] * ck.n_levels + ck.level[stays], rest_cost[stays],
                             minlength=n * ck.n_levels)
        return loads, cells.reshape(n, ck.n_levels)

    def _ranges(self, d: int) -> list[list[int]]:
        """Ranges on instance d in psi order, built on first use."""
        ranges = self.lists[d]
        if ranges is None:
            recs = self.ck.by_psi[self.ck.home_bounds[d]:self.ck.home_bounds[d + 1]]
            ranges = [[p, b, e, r] for p, b, e, r in zip(
                self.ck.psi_rank[recs].tolist(), self.split[recs].tolist(),
                self.ck.stop[recs].tolist(), recs.tolist()) if b < e]
            if self.pending[d]:
                ranges += self.pending[d]
                ranges.sort()
                self.pending[d] = []
            self.lists[d] = ranges
        return ranges

    def _push(self, lo: int, hi: int, rec: int) -> None:
        """Add keys to C, ordered by decreasing load level (then psi, then position)."""
        heapq.heappush(self.heap, (-self.level[rec], self.psi[rec], lo, hi, rec))

    def _place(self, d: int, lo: int, hi: int, rec: int) -> None:
        cost = float(self.ck.prefix[hi] - self.ck.prefix[lo])
        self.loads[d] += cost
        self.by_level[d, self.level[rec]] += cost
        rng = [self.psi[rec], lo, hi, rec]
        if self.lists[d] is None:
            self.pending[d].append(rng)
        else:
            insort(self.lists[d], rng)
        self.log.append((lo, hi, d))

    def _take(self, d: int, need: float, below_level: int | None) -> int:
        """Detach keys of d in psi order into C until their load reaches ``need``.

        Only keys of levels below ``below_level`` when given (ADJUST's "strictly
        lighter"), never zero-load keys; a range is cut at the shortest prefix that
        suffices. Returns the number of keys detached.
        """
        prefix = self.ck.prefix
        ranges = self._ranges(d)
        keep: list[list[int]] = []
        taken = 0
        for i, rng in enumerate(ranges):
            if need <= self.tol:
                keep += ranges[i:]
                break
            _, lo, hi, rec = rng
            cost = float(prefix[hi] - prefix[lo])
            if cost <= 0 or (below_level is not None and self.level[rec] >= below_level):
                keep.append(rng)
                continue
            cut = hi
            if cost > need:
                cut = min(hi, lo + 1 + int(np.searchsorted(prefix[lo + 1:hi + 1],
                                                           prefix[lo] + need, "left")))
            part = float(prefix[cut] - prefix[lo])
            self._push(lo, cut, rec)
            self.loads[d] -= part
            self.by_level[d, self.level[rec]] -= part
            taken += cut - lo
            need -= part
            if cut < hi:
                rng[1] = cut
                keep.append(rng)
        self.lists[d] = keep
        return taken

    def prepare(self) -> None:
        """Phase II: detach keys in psi order from every instance above the bound."""
        for d in np.flatnonzero(self.problem.active).tolist():
            excess = float(self.loads[d]) - self.bound
            if excess > self.tol:
                self.detached += self._take(d, excess, None)

    def assign(self) -> None:
        """Phase III: LLFD over the candidate heap."""
        cap = LOOP_CAP_PER_RECORD * (self.ck.n_records + len(self.heap)) + 1024
        popped = 0
        prefix = self.ck.prefix
        while self.heap:
            neg_level, _, lo, hi, rec = heapq.heappop(self.heap)
            popped += 1
            cost = float(prefix[lo + 1] - prefix[lo])
            if cost <= 0:
                self._place(self._zero_load_target(rec), lo, hi, rec)
                continue
            least = int(np.argmin(self.loads))
            if self.loads[least] + cost <= self.limit:
                if hi - lo == 1:
                    self._place(least, lo, hi, rec)
                else:
                    self._fill(lo, hi, rec)
                continue
            if popped > cap:
                self.capped = True
                self.fallbacks += 1
                target = least
            else:
                target = self._adjust(cost, -neg_level)
            self._place(target, lo, lo + 1, rec)
            if hi > lo + 1:
                self._push(lo + 1, hi, rec)

    def _adjust(self, cost: float, level: int) -> int:
        """Instance that takes a key of ``cost`` and ``level`` no instance fits directly.

        ADJUST on the instances in increasing load: the first whose strictly lighter keys
        (lower levels) weigh enough swaps them out in psi order. When there is none the
        key falls back to the least-loaded instance.
        """
        need = self.loads + cost - self.bound
        lighter = self.by_level[:, :level].sum(axis=1)
        able = lighter >= need - self.tol
        if not able.any():
            self.fallbacks += 1
            return int(np.argmin(self.loads))
        d = int(np.argmin(np.where(able, self.loads, np.inf)))
        self.adjusted += self._take(d, float(need[d]), level)
        return d

    def _fill(self, lo: int, hi: int, rec: int) -> None:
        """Water-fill keys of one record over the least-loaded instances, as key-by-key
        LLFD does with equal keys; keys that do not fit directly go back to C."""
        prefix = self.ck.prefix
        order = np.argsort(self.loads, kind="stable")
        loads = self.loads[order]
        total = float(prefix[hi] - prefix[lo])
        # Level the water reaches when poured over the j least-loaded instances.
        levels = (total + np.cumsum(loads)) / np.arange(1, len(loads) + 1)
        filled = int(np.argmax(levels <= np.r_[loads[1:], np.inf]))
        water = min(float(levels[filled]), self.bound)
        pos = lo
        for d in order[:filled + 1].tolist():
            base = float(self.loads[d])
            # A key goes on d while d is below the water before it and fits after it.
            starts_below = int(np.searchsorted(prefix[pos:hi], prefix[pos] + (water - base),
                                               "left"))
            fits = int(np.searchsorted(prefix[pos + 1:hi + 1], prefix[pos] + (self.limit - base),
                                       "right"))
            m = min(starts_below, fits)
            if m:
                self._place(d, pos, pos + m, rec)
                pos += m
                if pos == hi:
                    return
        if pos == lo:  # water at the bound already: the front key still fits the least-loaded
            self._place(int(order[0]), lo, lo + 1, rec)
            pos += 1
        self._push(pos, hi, rec)

    def _zero_load_target(self, rec: int) -> int:
        """A zero-load key balances nothing: its default instance when active."""
        default = int(self.ck.default[rec])
        return default if self.problem.active[default] else int(np.argmin(self.loads))

    def outcome(self) -> LlfdOutcome:
        ck, problem = self.ck, self.problem
        assignment = problem.current.copy()
        cleaned_keys = ck.order[ck.clean_positions[:self.n_clean]]
        assignment[cleaned_keys] = problem.default[cleaned_keys]
        for lo, hi, d in self.log:  # in order: a key's last placement wins
            assignment[ck.order[lo:hi]] = d
        return LlfdOutcome(
            assignment=assignment, cleaned=self.n_clean, detached=self.detached,
            forced=self.forced, adjusted=self.adjusted, fallbacks=self.fallbacks,
            capped=self.capped, table_size=int((assignment != problem.default).sum()),
            moved_keys=int((assignment != problem.current).sum()))


def run_llfd(ck: CompactKeys, problem: Problem, n_clean: int, bound: float) -> LlfdOutcome:
    """Fang et al.'s three phases on ``ck``: clean the first ``n_clean`` cleanable keys, detach
    from instances above ``bound`` in psi order, then LLFD accepting ``L + c <= bound``."""
    run = _Run(ck, problem, n_clean, bound)
    run.prepare()
    run.assign()
    return run.outcome()


# ------------------------------------------------------------------------ planners


def packing_bound(problem: Problem, theta: float) -> tuple[float, list[str]]:
    """The load a plan aims at: L_max, or the heaviest key's load when that is above it."""
    l_max = problem.max_load(theta)
    if problem.n_keys == 0 or float(problem.load.max()) <= l_max:
        return l_max, []
    heaviest = int(np.argmax(problem.load))
    load = float(problem.load[heaviest])
    return load, [
        f"key {problem.keys[heaviest]!r} alone has load {load:.6g} > L_max = {l_max:.6g} "
        f"(theta = {theta:g} is unreachable): the plan aims at {load:.6g} instead, the least "
        "maximum load any assignment can reach"]


def describe_compact(ck: CompactKeys, n_keys: int) -> str:
    """How the keys were represented (Fang et al., Sec. IV)."""
    grid = ("exact levels" if ck.bits is None
            else f"levels with R = {1 << ck.bits} steps per power-of-two octave")
    return f"compact representation: {n_keys} keys in {ck.n_records} records ({grid}; loads exact)"


def describe_outcome(out: LlfdOutcome, ck: CompactKeys, bound: float,
                     params: PlanParams) -> list[str]:
    """Why an LLFD run's assignment is what it is."""
    notes = [
        f"{out.cleaned} of the {ck.n_cleanable} routed key(s) sent back to their default "
        f"instance; {out.detached} key(s) taken off instances loaded above {bound:.6g}; "
        f"{out.forced} key(s) moved off drained or removed instances; {out.adjusted} lighter "
        "key(s) moved aside to make room for heavier ones"]
    if out.fallbacks:
        notes.append(f"{out.fallbacks} key(s) fit no instance even after moving lighter keys "
                     "aside: placed on the least-loaded instance")
    if out.capped:
        notes.append("the placement loop reached its step limit: the remaining keys went to "
                     "the least-loaded instance")
    table = f"routing table {out.table_size} entries"
    if params.max_table is not None:
        table += f" (at most {params.max_table})"
    notes.append(f"result: {out.moved_keys} key(s) move, {table}")
    if params.budget_bytes is not None or params.budget_keys is not None:
        notes.append("this planner keeps migration low but has no migration budget: the "
                     "budget is checked on the plan, not enforced while planning")
    return notes


class _LlfdPlanner(Planner):
    """Shared set-up of Fang et al.'s three heuristics."""

    def _compact(self, problem: Problem, params: PlanParams, psi: Psi) -> CompactKeys:
        return CompactKeys.build(problem, psi, params.beta, resolution_bits(problem, params),
                                 problem.max_load(params.theta))


class MinTablePlanner(_LlfdPlanner):
    """Fang et al.'s Algorithm 2: clean the whole table, psi = highest load first."""

    name = "mintable"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        bound, notes = packing_bound(problem, params.theta)
        ck = self._compact(problem, params, Psi.LOAD)
        out = run_llfd(ck, problem, ck.n_cleanable, bound)
        return Proposal(out.assignment, [
            "MinTable: every routed key goes back to its default instance, then keys are "
            "taken off overloaded instances and placed highest load first, so few keys leave "
            "their default instance", describe_compact(ck, problem.n_keys), *notes,
            *describe_outcome(out, ck, bound, params)])


class MinMigPlanner(_LlfdPlanner):
    """Fang et al.'s Algorithm 3: no cleaning, psi = highest gamma first."""

    name = "minmig"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        bound, notes = packing_bound(problem, params.theta)
        ck = self._compact(problem, params, Psi.GAMMA)
        out = run_llfd(ck, problem, 0, bound)
        return Proposal(out.assignment, [
            "MinMig: the routing table is kept, and the keys moved are those with the most "
            f"load for their state first (gamma = c^{params.beta:g} / S), so little state "
            "moves (the table may grow)", describe_compact(ck, problem.n_keys), *notes,
            *describe_outcome(out, ck, bound, params)])


class MixedPlanner(_LlfdPlanner):
    """Fang et al.'s Algorithm 4: MinMig after cleaning the n smallest-state table keys, n grown
    monotonically until the table fits A_max."""

    name = "mixed"

    def propose(self, problem: Problem, params: PlanParams) -> Proposal:
        if problem.scenarios is not None:
            from rebalance.core.planners.robust import robust_proposal

            return robust_proposal(problem, params, "llfd")
        bound, notes = packing_bound(problem, params.theta)
        ck = self._compact(problem, params, Psi.GAMMA)
        a_max = params.max_table
        out = run_llfd(ck, problem, 0, bound)
        trials = [out]
        while a_max is not None and out.table_size > a_max and out.cleaned < ck.n_cleanable:
            n = (ck.n_cleanable if len(trials) >= MIXED_MAX_TRIALS
                 else min(ck.n_cleanable, out.cleaned + out.table_size - a_max))
            out = run_llfd(ck, problem, n, bound)
            trials.append(out)
        notes.insert(0, describe_compact(ck, problem.n_keys))
        sizes = ", ".join(f"{t.cleaned} sent back: {t.table_size}" for t in trials)
        if a_max is None:
            head = ("Mixed without a routing-table bound: no routed key sent back first (the "
                    "MinMig plan)")
        elif out.table_size <= a_max:
            head = (f"Mixed sent {out.cleaned} of the {ck.n_cleanable} routed key(s) back to "
                    f"their default instance first (smallest state first) so the routing "
                    f"table fits its bound of {a_max}; table entries per attempt: {sizes}")
        else:
            head = (f"Mixed: even with all {ck.n_cleanable} routed key(s) sent back, the routing "
                    f"table stays above its bound of {a_max} (table entries per attempt: "
                    f"{sizes})")
            fallback = MinTablePlanner().propose(problem, params)
            table = int((fallback.assignment != problem.default).sum())
            if table < out.table_size:
                return Proposal(fallback.assignment, [
                    head + f"; the MinTable plan has the smaller table ({table}) and is "
                    "returned", *fallback.notes])
            head += f"; the MinTable plan's table ({table}) is not smaller"
        return Proposal(out.assignment, [
            head, *notes, *describe_outcome(out, ck, bound, params)])
