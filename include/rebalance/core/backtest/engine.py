"""The backtest engine: chains of plans judged on the windows after them
(:mod:`rebalance.core.backtest`)."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from rebalance.core.backtest.auto import (
    MAX_MIGRATION_RATIO,
    AutoSettings,
    _pick,
    _today,
    default_candidates,
)
from rebalance.core.backtest.history import (
    BACKTEST_TIME_LIMIT,
    BASELINES,
    HEADROOM_FRACTIONS,
    ORACLE_WINDOWS,
    BacktestError,
    Policy,
    WindowHistory,
)
from rebalance.core.defaults import theta_problem
from rebalance.core.forecast import LoadModel, forecast, scenarios
from rebalance.core.model import PlanParams, Problem, imbalance


# --------------------------------------------------------------------------- results
@dataclass
class BacktestResult:
    """``steps``: one row per (policy, step, judged window); ``summary``: one per policy
    and baseline (what they measure: ``docs/planning.md``, "Plans that hold")."""

    steps: pd.DataFrame
    summary: pd.DataFrame
    theta: float
    horizon: int
    notes: list[str] = field(default_factory=list)
    #: each chain's assignment after its last step (policies and baselines)
    final: dict[str, np.ndarray] = field(default_factory=dict)
    #: per auto policy: (chosen policy name or "stay", why) at each step
    choices: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def row(self, policy: str) -> pd.Series:
        hit = self.summary[self.summary["policy"] == policy]
        if hit.empty:
            raise KeyError(f"no policy {policy!r} in the backtest "
                           f"({', '.join(self.summary['policy'])})")
        return hit.iloc[0]


STEP_COLUMNS = ("policy", "step", "window", "window_start", "realised_imbalance", "within",
                "stay_imbalance", "predicted_imbalance", "migration_fraction", "moved_keys",
                "table_size", "plan_seconds", "applied")
SUMMARY_COLUMNS = ("policy", "kind", "theta_plan", "share_within", "mean_imbalance",
                   "p90_imbalance", "mean_stay_imbalance", "migration_per_step", "table_size",
                   "steps", "windows", "plan_seconds")


def window_instance_loads(loads: np.ndarray, assignment: np.ndarray, n: int) -> np.ndarray:
    """The N instance loads of each row of ``loads`` (R x K key loads) under ``assignment``
    (R x N); :func:`~rebalance.core.model.imbalance` of it is each window's imbalance."""
    loads = np.atleast_2d(loads)
    r = loads.shape[0]
    flat = (np.arange(r)[:, None] * n + np.asarray(assignment)[None, :]).ravel()
    return np.bincount(flat, weights=loads.ravel(), minlength=r * n).reshape(r, n)


class _Chain:
    """One chain of plans: the assignment, the rows it judged and its per-step costs."""

    def __init__(self, name: str, kind: str, start: np.ndarray, theta_plan: float | None):
        self.name, self.kind, self.a, self.theta_plan = name, kind, start.copy(), theta_plan
        self.rows: list[tuple] = []
        self.migration: list[float] = []
        self.tables: list[int] = []
        self.seconds: list[float] = []


class _Engine:
    """Plans and judges on one history with one theta and base parameters."""

    def __init__(self, history: WindowHistory, theta: float, params: PlanParams | None):
        self.h = history
        self.theta = float(theta)
        base = params if params is not None else PlanParams(theta=theta,
                                                           time_limit=BACKTEST_TIME_LIMIT)
        self.params = base
        self._planners: dict[str, object] = {}
        self.n = history.n_instances

    def planner(self, method: str):
        from rebalance.core.planners import get_planner

        if method not in self._planners:
            self._planners[method] = get_planner(method)
        return self._planners[method]

    def plan(self, current: np.ndarray, series: np.ndarray, state: np.ndarray,
             model: LoadModel, theta_plan: float | None, method: str):
        """(new assignment, predicted imbalance, migration fraction, moved, seconds)."""
        h = self.h
        load = forecast(series, model)
        sc = scenarios(series, model) if model.name == "robust" else None
        a = current
        t0 = time.perf_counter()
        if load.sum() <= 0:
            return a.copy(), 1.0, 0.0, 0, 0.0
        sel = (load > 0) | (a != h.default)
        if sc is not None:
            sel |= sc.max(axis=0) > 0
        tp = float(theta_plan or self.theta)
        rows = sc if sc is not None else load[None, :]
        if (self.params.max_table is None
                and imbalance(window_instance_loads(rows, a, self.n)).max() <= 1 + tp):
            # every instance is within the bound already: the planners move nothing
            return a.copy(), float(imbalance(window_instance_loads(rows, a, self.n)).max()), 0.0, 0, 0.0
        params = dataclasses.replace(self.params, theta=tp)
        problem = Problem(keys=h.keys[sel], load=load[sel], state=state[sel], current=a[sel],
                          default=h.default[sel], n_instances=self.n,
                          scenarios=None if sc is None else sc[:, sel])
        proposal = self.planner(method).propose(problem, params)
        new = a.copy()
        new[sel] = proposal.assignment
        seconds = time.perf_counter() - t0
        predicted = float(imbalance(window_instance_loads(rows, new, self.n)).max())
        moved = new != a
        total = float(state.sum())
        migration = float(state[moved].sum()) / total if total > 0 else 0.0
        return new, predicted, migration, int(moved.sum()), seconds

    def judge(self, chain: _Chain, step: int, windows: Sequence[int], before: np.ndarray,
              predicted: float, migration: float, moved: int, seconds: float,
              applied: bool = True) -> None:
        h = self.h
        idx = np.asarray(list(windows), dtype=np.int64)
        realised = imbalance(window_instance_loads(h.loads[idx], chain.a, self.n))
        stay = imbalance(window_instance_loads(h.loads[idx], before, self.n))
        table = int((chain.a != h.default).sum())
        limit = 1.0 + self.theta
        for j, r, s in zip(idx.tolist(), realised.tolist(), stay.tolist()):
            chain.rows.append((chain.name, step, j, h.window_starts[j], r, r <= limit + 1e-12,
                               s, predicted, migration, moved, table, seconds, applied))
        chain.migration.append(migration)
        chain.tables.append(table)
        chain.seconds.append(seconds)


def _steps(history: WindowHistory, need: int, horizon: int, start: int | None,
           step: int) -> list[int]:
    if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or horizon < 1:
        raise BacktestError(f"horizon must be an integer >= 1 windows, got {horizon!r}")
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise BacktestError(f"step must be an integer >= 1 windows, got {step!r}")
    first = need if start is None else int(start)
    if first < need:
        raise BacktestError(f"start {first} leaves fewer windows before it than the policies "
                            f"need ({need})")
    last = history.n_windows - horizon
    if first > last:
        raise BacktestError(f"{history.n_windows} window(s) are too few: the policies need "
                            f"{need} window(s) to plan on and {horizon} to judge on")
    return list(range(first, last + 1, int(step)))


def _run_policy(eng: _Engine, policy: Policy, steps: list[int], horizon: int,
                initial: np.ndarray) -> _Chain:
    h = eng.h
    chain = _Chain(policy.name, "policy", initial, policy.theta_plan)
    w = policy.history
    for t in steps:
        before = chain.a
        new, pred, mig, moved, sec = eng.plan(before, h.loads[t - w:t],
                                              h.state[t - w:t].sum(axis=0), policy.load_model,
                                              policy.theta_plan, policy.method)
        chain.a = new
        eng.judge(chain, t, range(t, t + horizon), before, pred, mig, moved, sec)
    return chain


def _run_oracle(eng: _Engine, name: str, steps: list[int], horizon: int, initial: np.ndarray,
                method: str, theta_plan: float | None, after: int | None) -> _Chain:
    """A chain planned per judged window: on the window itself (``after`` None) or on the
    mean of the ``after`` windows following it (the distribution oracle).

    The distribution oracle must not see the window it is judged on, not even through the
    assignment it starts from: the plan for window ``j - 1`` was made on windows ``j ..
    j + after - 1``, ``j`` among them, and a planner that keeps what is within its bound
    would carry that plan's fit to window ``j`` into window ``j``'s. So the plan for ``j``
    starts from the one made for the latest window ``j - k`` with ``k > after`` (windows up
    to ``j - 1`` only): ``after + 1`` interleaved chains, each over every ``(after + 1)``-th
    judged window. Their migration is counted against that start."""
    h = eng.h
    chain = _Chain(name, "baseline", initial, theta_plan)
    mean = LoadModel("mean")
    stride = 1 if after is None else after + 1
    latest: dict[int, np.ndarray] = {}   # chain (j mod stride) -> its newest assignment
    for t in steps:
        for j in range(t, t + horizon):
            if after is None:
                lo, hi = j, j + 1
            elif j + 1 < h.n_windows:
                lo, hi = j + 1, min(h.n_windows, j + 1 + after)
            else:  # no window after the last one: the windows before it stand in
                lo, hi = max(0, j - after), j
            before = latest.get(j % stride, initial)
            new, pred, mig, moved, sec = eng.plan(before, h.loads[lo:hi],
                                                  h.state[lo:hi].sum(axis=0), mean, theta_plan,
                                                  method)
            latest[j % stride] = chain.a = new
            eng.judge(chain, t, [j], before, pred, mig, moved, sec)
    return chain


def _summarise(chain: _Chain, theta: float) -> dict:
    rows = chain.rows
    realised = np.array([r[4] for r in rows])
    stay = np.array([r[6] for r in rows])
    steps = sorted({r[1] for r in rows})
    return {
        "policy": chain.name, "kind": chain.kind, "theta_plan": chain.theta_plan or theta,
        "share_within": float(np.mean(realised <= 1 + theta + 1e-12)) if len(rows) else math.nan,
        "mean_imbalance": float(realised.mean()) if len(rows) else math.nan,
        "p90_imbalance": float(np.quantile(realised, 0.9)) if len(rows) else math.nan,
        "mean_stay_imbalance": float(stay.mean()) if len(rows) else math.nan,
        # a per-window chain (oracle) plans several times per step: their sum is the step's
        "migration_per_step": float(np.sum(chain.migration)) / max(len(steps), 1),
        "table_size": float(np.mean(chain.tables)) if chain.tables else 0.0,
        "steps": len(steps), "windows": len(rows),
        "plan_seconds": float(np.sum(chain.seconds)),
    }


def _rank(summary: dict) -> tuple:
    """Highest share within, then lowest mean imbalance, then least migration."""
    return -summary["share_within"], summary["mean_imbalance"], summary["migration_per_step"]


def _best(summaries: list[dict]) -> dict:
    """The first of ``summaries`` by :func:`_rank`."""
    return min(summaries, key=_rank)


def headroom_grid(theta: float, grid: Sequence[float] | None = None) -> list[float]:
    """theta_plan values (largest first, each in (0, theta]): ``grid`` or
    :data:`HEADROOM_FRACTIONS` of theta."""
    values = [theta * f for f in HEADROOM_FRACTIONS] if grid is None else list(grid)
    for v in values:
        if not (isinstance(v, (int, float)) and math.isfinite(v) and 0 < v <= theta * (1 + 1e-9)):
            raise BacktestError(f"theta_plan grid value {v!r} must be in (0, theta = {theta:g}]")
    return sorted({float(round(v, 12)) for v in values}, reverse=True)


def backtest(history: WindowHistory, policies: Sequence[Policy], theta: float, horizon: int = 1,
             start: int | None = None, step: int = 1, baselines: Sequence[str] = BASELINES,
             params: PlanParams | None = None, initial: np.ndarray | None = None,
             oracle_windows: int = ORACLE_WINDOWS, oracle_grid: Sequence[float] | None = None,
             baseline_method: str = "mixed", auto_settings: AutoSettings | None = None,
             candidate_runs: dict | None = None) -> BacktestResult:
    """Replay ``history`` for ``policies`` and ``baselines`` (:mod:`rebalance.core.backtest`).

    ``start``: first planning step (default: the most windows any policy needs);
    ``initial``: the assignment before the first step (default: the default placement);
    ``params``: planner parameters (beta, A_max, time limit; theta is set per plan);
    a policy whose load model is ``auto`` chooses at every step among backtested candidates
    (:func:`_run_auto`) as ``auto_settings`` say (default: :class:`AutoSettings`' defaults).
    ``candidate_runs``: a dict the caller keeps across backtests of the same history, theta,
    steps and initial assignment that differ only in ``auto_settings`` (a sweep over them):
    a candidate's chain does not depend on the settings, so each is run once; ``None`` (the
    default) keeps nothing.
    """
    if problem := theta_problem(theta):
        raise BacktestError(problem)
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise BacktestError(f"unknown baseline(s) {unknown}; choose from {', '.join(BASELINES)}")
    names = [p.name for p in policies]
    if len(set(names)) != len(names) or set(names) & set(BASELINES):
        raise BacktestError(f"policy names must be distinct and not a baseline's: {names}")
    if isinstance(oracle_windows, bool) or not isinstance(oracle_windows, int) or oracle_windows < 1:
        raise BacktestError(f"oracle_windows must be an integer >= 1, got {oracle_windows!r}")
    h = history
    start_a = (h.default.copy() if initial is None
               else np.asarray(initial, dtype=np.int64).copy())
    if start_a.shape != (h.n_keys,) or (h.n_keys and (start_a.min() < 0
                                                      or start_a.max() >= h.n_instances)):
        raise BacktestError(f"initial assignment must hold one instance in [0, "
                            f"{h.n_instances}) per key")
    auto = [p for p in policies if p.load_model.name == "auto"]
    need = max([p.history for p in policies if p.load_model.name != "auto"] + [1])
    steps = _steps(h, need, horizon, start, step)
    eng = _Engine(h, theta, params)
    chains: list[_Chain] = []
    for p in policies:
        if p.load_model.name == "auto":
            continue
        chains.append(_run_policy(eng, p, steps, horizon, start_a))
    if auto:
        from_choice = _run_auto(eng, auto, steps, horizon, start_a,
                                auto_settings or AutoSettings(), candidate_runs)
        chains.extend(from_choice)
    order = {p.name: i for i, p in enumerate(policies)}
    chains.sort(key=lambda c: order[c.name])
    summaries = [_summarise(c, theta) for c in chains]
    notes: list[str] = []
    if "none" in baselines:
        c = _Chain("none", "baseline", h.default, None)
        for t in steps:
            eng.judge(c, t, range(t, t + horizon), h.default, math.nan, 0.0, 0, 0.0)
        chains.append(c)
        summaries.append(_summarise(c, theta))
    if "stay" in baselines:
        c = _Chain("stay", "baseline", start_a, None)
        t = steps[0]
        new, pred, mig, moved, sec = eng.plan(start_a, h.loads[t - 1:t], h.state[t - 1:t][0],
                                              LoadModel("mean"), None, baseline_method)
        for i, t in enumerate(steps):
            before = c.a if i else start_a
            c.a = new
            eng.judge(c, t, range(t, t + horizon), before, pred if not i else math.nan,
                      mig if not i else 0.0, moved if not i else 0, sec if not i else 0.0)
        chains.append(c)
        summaries.append(_summarise(c, theta))
    if "oracle" in baselines:
        c = _run_oracle(eng, "oracle", steps, horizon, start_a, baseline_method, None, None)
        chains.append(c)
        summaries.append(_summarise(c, theta))
    if "distribution-oracle" in baselines:
        points = []
        for tp in headroom_grid(theta, oracle_grid):
            c = _run_oracle(eng, f"distribution-oracle@{tp:g}", steps, horizon, start_a,
                            baseline_method, tp, oracle_windows)
            chains.append(c)
            points.append(_summarise(c, theta))
        best = dict(_best(points))
        notes.append(f"distribution oracle: best theta_plan {best['theta_plan']:g} "
                     f"({best['policy']}) of {len(points)} over the mean of the "
                     f"{oracle_windows} window(s) after each judged window")
        best["policy"] = "distribution-oracle"
        summaries.append(best)
        summaries.extend(points)
    steps_frame = pd.DataFrame([r for c in chains for r in c.rows], columns=list(STEP_COLUMNS))
    summary = pd.DataFrame(summaries, columns=list(SUMMARY_COLUMNS))
    return BacktestResult(steps_frame, summary, float(theta), int(horizon), notes,
                          final={c.name: c.a for c in chains},
                          choices={c.name: c.choices for c in chains if hasattr(c, "choices")})


def _run_auto(eng: _Engine, policies: Sequence[Policy], steps: list[int], horizon: int,
              initial: np.ndarray, settings: AutoSettings, runs: dict | None) -> list[_Chain]:
    """The ``auto`` policies of a backtest: at every step, the candidates' own backtest on
    the judged windows before it (at most ``settings.lookback``) chooses the load model and
    theta_plan (:func:`_pick`); a step applies the chosen plan only when its candidate's
    plans beat not replanning (the candidate's ``stay_imbalance``) on those windows, so a
    history where planning does not pay keeps the assignment. With fewer than
    ``settings.min_evidence`` judged windows it does what the stay baseline does: today's
    plan (mean of the last window, at theta) at the first step, kept.
    ``runs``: :func:`backtest`'s ``candidate_runs``.
    Causal: a choice at step t reads only windows before t."""
    candidates, lookback, min_evidence = (settings.candidates, settings.lookback,
                                          settings.min_evidence)
    target, min_gain = settings.target, settings.min_gain
    h, theta = eng.h, eng.theta
    cands = list(candidates) if candidates is not None else default_candidates(
        theta, h.n_windows, h.n_keys, loads=h.loads[:steps[0]],  # causal: before the steps
        headroom=settings.headroom)
    cands = [p for p in cands if p.history <= steps[0]] or [Policy.of("mean:windows=1")]
    runs = [_candidate_run(eng, p, steps, horizon, initial, runs) for p in cands]
    # per candidate: judged window -> (realised, stay, migration of its step)
    realised = np.full((len(cands), h.n_windows), np.nan)
    stayed = np.full((len(cands), h.n_windows), np.nan)
    migr = np.full((len(cands), h.n_windows), np.nan)
    for i, run in enumerate(runs):
        for r in run.rows:
            if np.isnan(realised[i, r[2]]):
                realised[i, r[2]], stayed[i, r[2]], migr[i, r[2]] = r[4], r[6], r[8]
    limit = 1 + theta + 1e-12
    today_i = _today(cands, theta)
    out = []
    for pol in policies:
        chain = _Chain(pol.name, "policy", initial, None)
        chain.choices = []  # type: ignore[attr-defined]
        today = Policy.of("mean:windows=1")
        for t in steps:
            lo = max(0, t - lookback)
            seen = ~np.isnan(realised[0, lo:t])
            before = chain.a
            if seen.sum() < min_evidence:
                # as the stay baseline: today's plan once at the first step, then kept
                chosen = today if t == steps[0] else None
                why = ("too few judged windows: today's planning once" if chosen else
                       "too few judged windows: keep the first plan")
            else:
                cols = np.flatnonzero(seen) + lo
                r, s, m = realised[:, cols], stayed[:, cols], migr[:, cols]
                table = pd.DataFrame({
                    "policy": [p.name for p in cands],
                    "share_within": (r <= limit).mean(axis=1),
                    "mean_imbalance": r.mean(axis=1),
                    "migration_per_step": m.mean(axis=1),
                    "windows": len(cols)})
                cap = (None if today_i is None
                       else MAX_MIGRATION_RATIO * float(np.nanmean(m[today_i])))
                idx, why = _pick(table, math.inf, theta, target,
                                 share_slack=settings.share_slack,
                                 mean_tolerance=settings.mean_tolerance, migration_cap=cap,
                                 described={p.name: p.describe() for p in cands})
                # staying = not replanning: the candidate's previous assignment on the window
                if idx is not None and not r[idx].mean() < s[idx].mean() - min_gain:
                    why = (f"{cands[idx].describe()}: replanning does not pay (realised "
                           f"{r[idx].mean():.3f} vs {s[idx].mean():.3f} not replanning)")
                    idx = None
                chosen = None if idx is None else cands[idx]
            if chosen is None:
                eng.judge(chain, t, range(t, t + horizon), before, math.nan, 0.0, 0, 0.0,
                          applied=False)
                chain.choices.append(("stay", why))  # type: ignore[attr-defined]
                continue
            new, pred, mig, moved, sec = eng.plan(before, h.loads[t - chosen.history:t],
                                                  h.state[t - chosen.history:t].sum(axis=0),
                                                  chosen.load_model, chosen.theta_plan,
                                                  pol.method)
            chain.a = new
            eng.judge(chain, t, range(t, t + horizon), before, pred, mig, moved, sec)
            chain.choices.append((chosen.name, why))  # type: ignore[attr-defined]
        out.append(chain)
    return out


def _candidate_run(eng: _Engine, policy: Policy, steps: list[int], horizon: int,
                   initial: np.ndarray, runs: dict | None) -> _Chain:
    """:func:`_run_policy`, or its chain from ``runs`` (see :func:`backtest`), checked to
    come from the same history, theta, steps, horizon and initial assignment."""
    if runs is None:
        return _run_policy(eng, policy, steps, horizon, initial)
    key = (policy, eng.theta, tuple(steps), horizon, initial.tobytes())
    hit = runs.get(key)
    if hit is None or hit[0] is not eng.h:
        hit = runs[key] = (eng.h, _run_policy(eng, policy, steps, horizon, initial))
    return hit[1]


def given_forecasts(history: WindowHistory, forecasts: np.ndarray, theta: float,
                    steps: Sequence[int], name: str, method: str = "mixed",
                    grid: Sequence[float] | None = None) -> list[dict]:
    """Chains planned at every step ``t`` on ``forecasts[t]`` (T x K loads given from
    outside the stored windows, e.g. a synthetic generator's expected counts), judged on
    the stored window ``t``, one chain per theta_plan of :func:`headroom_grid`; their
    summaries, best first (:func:`_rank`).

    What a forecast *could* reach: given the generator's own distribution of window
    ``t - 1`` (no sampling noise, nothing about ``t``), no forecast from the past can do
    better on a trace whose changes at ``t`` are independent of the past.
    """
    forecasts = np.asarray(forecasts, dtype=np.float64)
    if forecasts.shape != history.loads.shape:
        raise BacktestError(f"forecasts must have shape {history.loads.shape}, "
                            f"got {forecasts.shape}")
    eng = _Engine(history, theta, None)
    mean = LoadModel("mean")
    out = []
    for tp in headroom_grid(theta, grid):
        chain = _Chain(f"{name}@{tp:g}", "baseline", history.default.copy(), tp)
        for t in steps:
            before = chain.a
            new, pred, mig, moved, sec = eng.plan(before, forecasts[t:t + 1],
                                                  forecasts[t], mean, tp, method)
            chain.a = new
            eng.judge(chain, t, [t], before, pred, mig, moved, sec)
        out.append(_summarise(chain, theta))
    return sorted(out, key=_rank)
