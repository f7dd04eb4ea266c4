"""Backtest: do plans hold in the windows that follow them? (issue 19)

A plan is made from the windows before it and lives in the windows after it. The backtest
replays stored windows: at each step t a policy plans on the windows [t - W, t) from its
own current assignment (chained from its previous step; the first step starts from the
default placement or a given assignment), and the plan is judged on the next ``horizon``
windows [t, t + horizon) it has not seen:

* realised imbalance of a judged window = max instance load / mean load over the N
  instances under the plan; ``within`` = realised <= 1 + theta;
* ``stay_imbalance``: what the policy's previous assignment would have given on the same
  window (the gain of planning at this step);
* migration of a step = state of the moved keys (state summed over the planning windows,
  as :func:`rebalance.histograms.build_problem` plans it) / total state of those windows.

Baselines (:data:`BASELINES`):

* ``none``: the default placement, never a plan;
* ``stay``: one plan at the first step (mean of the last window, at theta), never again;
* ``oracle``: a plan made on the judged window itself, at theta (sees the window's noise);
* ``distribution-oracle``: a plan made on the mean of the ``oracle_windows`` windows
  *after* the judged one (it knows where the load goes, not the judged window's noise),
  at each theta_plan of a grid; rows ``distribution-oracle@<theta_plan>`` per point and
  ``distribution-oracle`` for the best (highest share within, then lowest mean). The last
  window has no window after it: there the windows before it stand in.

On top: :func:`calibrate` (the planning bound theta_plan <= theta that makes plans hold),
:func:`choose` (what the ``auto`` load model does: a load model and theta_plan chosen by
backtest, never worse than staying) and :func:`holds` (the gate of the DAG: does a plan
made on these windows beat staying on held-out windows?).

Pure numpy/pandas (no Spark, no Airflow); deterministic for the same input. Plans use the
planners' search only (:meth:`Planner.propose`), not their lower bounds, so that hundreds
of plans take seconds.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from .forecast import LoadModel, LoadModelError, forecast, history_needed, scenarios
from .model import PlanningError, PlanParams, Problem

BASELINES = ("none", "stay", "oracle", "distribution-oracle")

#: theta_plan of the distribution oracle and of calibration, as fractions of theta.
HEADROOM_FRACTIONS = (1.0, 0.75, 0.5, 0.375, 0.25, 0.125)
#: Time limit of each plan of a backtest (fast planners ignore it).
BACKTEST_TIME_LIMIT = 1.0
#: Windows after the judged one the distribution oracle plans on by default.
ORACLE_WINDOWS = 3


class BacktestError(ValueError):
    """Backtest input that cannot be used, in one line."""


# --------------------------------------------------------------------------- history
@dataclass
class WindowHistory:
    """Per-window key loads and state of a stream, oldest window first.

    ``keys`` (K,), ``window_starts`` (T,), ``loads`` and ``state`` (T x K: cost and state
    bytes created per window, 0 where a key is absent), ``default`` (K,): the default
    instance of each key, ``n_instances``: N.
    """

    keys: np.ndarray
    window_starts: np.ndarray
    loads: np.ndarray
    state: np.ndarray
    default: np.ndarray
    n_instances: int

    def __post_init__(self) -> None:
        self.keys = np.asarray(self.keys, dtype=object)
        self.window_starts = np.asarray(self.window_starts)
        self.loads = np.asarray(self.loads, dtype=np.float64)
        self.state = np.asarray(self.state, dtype=np.float64)
        self.default = np.asarray(self.default, dtype=np.int64)
        k, t = len(self.keys), len(self.window_starts)
        for name in ("loads", "state"):
            arr = getattr(self, name)
            if arr.shape != (t, k):
                raise BacktestError(f"{name} must have shape (windows {t}, keys {k}), "
                                    f"got {arr.shape}")
            with np.errstate(invalid="ignore"):
                bad = ~np.isfinite(arr) | (arr < 0)
            if bad.any():
                w, j = (int(v[0]) for v in np.nonzero(bad))
                raise BacktestError(f"{name} must be finite and >= 0: key {self.keys[j]!r} has "
                                    f"{float(arr[w, j])!r} in window {self.window_starts[w]}")
        n = self.n_instances
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise BacktestError(f"n_instances must be an integer >= 1, got {n!r}")
        self.n_instances = int(n)
        if self.default.shape != (k,) or (k and (self.default.min() < 0
                                                 or self.default.max() >= n)):
            raise BacktestError(f"default must hold one instance in [0, {n}) per key")

    @property
    def n_windows(self) -> int:
        return len(self.window_starts)

    @property
    def n_keys(self) -> int:
        return len(self.keys)

    def slice(self, start: int | None = None, stop: int | None = None) -> WindowHistory:
        """The windows [start, stop) (same keys)."""
        sl = slice(start, stop)
        return WindowHistory(self.keys, self.window_starts[sl], self.loads[sl], self.state[sl],
                             self.default, self.n_instances)

    @classmethod
    def from_histograms(cls, frame, n_instances: int) -> WindowHistory:
        """Histogram rows of ``rebalance plan`` (``window_start, key, count[, cost,
        state_bytes]``, a pandas frame or pyarrow table): every window at once."""
        from .histograms import window_matrices

        m = window_matrices(frame, n_instances)
        return cls(keys=m["keys"], window_starts=m["windows"].view("datetime64[ns]"),
                   loads=m["load"], state=m["state"], default=m["default"],
                   n_instances=n_instances)

    @classmethod
    def from_counts(cls, frame: pd.DataFrame, key: str = "key", window: str = "window",
                    count: str = "count", n_instances: int = 1,
                    state: str | None = None) -> WindowHistory:
        """A plain long table of (window, key, count[, state]) rows (real traces). Windows
        may be times, dates or integers (integers are read as ordinal window numbers);
        state defaults to the count."""
        missing = [c for c in (key, window, count, state) if c is not None and c not in frame]
        if missing:
            raise BacktestError(f"counts table lacks column(s) {missing}; it has "
                                f"{list(frame.columns)}")
        win = frame[window]
        if pd.api.types.is_integer_dtype(win.dtype):
            win = pd.to_datetime(win.astype("int64"), unit="D", origin="unix")
        rows = pd.DataFrame({"window_start": win, "key": frame[key].astype(str),
                             "count": frame[count]})
        if state is not None:
            rows["state_bytes"] = frame[state]
        return cls.from_histograms(rows, n_instances)


# --------------------------------------------------------------------------- policies
@dataclass(frozen=True)
class Policy:
    """How plans are made: planner ``method``, ``load_model`` over the last ``history``
    windows, planned at ``theta_plan`` (None: at theta)."""

    name: str = ""
    method: str = "mixed"
    load_model: LoadModel = field(default_factory=LoadModel)
    theta_plan: float | None = None
    history: int = 1

    def __post_init__(self) -> None:
        from .methods import METHODS

        if isinstance(self.load_model, str):
            object.__setattr__(self, "load_model", LoadModel.parse(self.load_model))
        if self.method not in METHODS:
            raise BacktestError(f"policy {self.name or self.load_model}: unknown method "
                                f"{self.method!r}; choose one of {', '.join(METHODS)}")
        h = self.history
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1:
            raise BacktestError(f"policy {self.name or self.load_model}: history must be an "
                                f"integer >= 1 windows, got {h!r}")
        if self.load_model.name != "auto" and h < history_needed(self.load_model):
            raise BacktestError(f"policy {self.name or self.load_model}: history {h} is shorter "
                                f"than load model {self.load_model} needs "
                                f"({history_needed(self.load_model)} windows)")
        tp = self.theta_plan
        if tp is not None and not (isinstance(tp, (int, float)) and math.isfinite(tp) and tp > 0):
            raise BacktestError(f"policy {self.name or self.load_model}: theta_plan must be a "
                                f"number > 0 or None, got {tp!r}")
        if not self.name:
            label = f"{self.load_model}/W={self.history}"
            if tp is not None:
                label += f"@{tp:g}"
            if self.method != "mixed":
                label += f"/{self.method}"
            object.__setattr__(self, "name", label)

    @classmethod
    def of(cls, model: str | LoadModel, theta_plan: float | None = None,
           method: str = "mixed", name: str = "") -> Policy:
        """A policy whose history is what the load model reads (all of its ``windows``)."""
        m = LoadModel.parse(model) if isinstance(model, str) else model
        return cls(name=name, method=method, load_model=m, theta_plan=theta_plan,
                   history=history_needed(m))


# --------------------------------------------------------------------------- results
@dataclass
class BacktestResult:
    """``steps``: one row per (policy, step, judged window); ``summary``: one per policy
    and baseline (module docstring)."""

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


def window_imbalance(loads: np.ndarray, assignment: np.ndarray, n: int) -> np.ndarray:
    """Imbalance (max / mean over N instances) of each row of ``loads`` (R x K) under
    ``assignment``; 1.0 for a row without load."""
    loads = np.atleast_2d(loads)
    r = loads.shape[0]
    flat = (np.arange(r)[:, None] * n + np.asarray(assignment)[None, :]).ravel()
    per = np.bincount(flat, weights=loads.ravel(), minlength=r * n).reshape(r, n)
    total = per.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = per.max(axis=1) / (total / n)
    return np.where(total > 0, out, 1.0)


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
        from .planners import get_planner

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
                and window_imbalance(rows, a, self.n).max() <= 1 + tp):
            # every instance is within the bound already: the planners move nothing
            return a.copy(), float(window_imbalance(rows, a, self.n).max()), 0.0, 0, 0.0
        params = dataclasses.replace(self.params, theta=tp)
        problem = Problem(keys=h.keys[sel], load=load[sel], state=state[sel], current=a[sel],
                          default=h.default[sel], n_instances=self.n,
                          scenarios=None if sc is None else sc[:, sel])
        proposal = self.planner(method).propose(problem, params)
        new = a.copy()
        new[sel] = proposal.assignment
        seconds = time.perf_counter() - t0
        predicted = float(window_imbalance(rows, new, self.n).max())
        moved = new != a
        total = float(state.sum())
        migration = float(state[moved].sum()) / total if total > 0 else 0.0
        return new, predicted, migration, int(moved.sum()), seconds

    def judge(self, chain: _Chain, step: int, windows: Sequence[int], before: np.ndarray,
              predicted: float, migration: float, moved: int, seconds: float,
              applied: bool = True) -> None:
        h = self.h
        idx = np.asarray(list(windows), dtype=np.int64)
        realised = window_imbalance(h.loads[idx], chain.a, self.n)
        stay = window_imbalance(h.loads[idx], before, self.n)
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
    mean of the ``after`` windows following it (the distribution oracle)."""
    h = eng.h
    chain = _Chain(name, "baseline", initial, theta_plan)
    mean = LoadModel("mean")
    for t in steps:
        for j in range(t, t + horizon):
            if after is None:
                lo, hi = j, j + 1
            elif j + 1 < h.n_windows:
                lo, hi = j + 1, min(h.n_windows, j + 1 + after)
            else:  # no window after the last one: the windows before it stand in
                lo, hi = max(0, j - after), j
            before = chain.a
            new, pred, mig, moved, sec = eng.plan(before, h.loads[lo:hi],
                                                  h.state[lo:hi].sum(axis=0), mean, theta_plan,
                                                  method)
            chain.a = new
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


def _best(summaries: list[dict]) -> dict:
    """Highest share within, then lowest mean imbalance, then least migration."""
    return min(summaries, key=lambda s: (-s["share_within"], s["mean_imbalance"],
                                         s["migration_per_step"]))


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
             baseline_method: str = "mixed", auto_options: dict | None = None) -> BacktestResult:
    """Replay ``history`` (module docstring) for ``policies`` and ``baselines``.

    ``start``: first planning step (default: the most windows any policy needs);
    ``initial``: the assignment before the first step (default: the default placement);
    ``params``: planner parameters (beta, A_max, time limit; theta is set per plan);
    a policy whose load model is ``auto`` chooses at every step by :func:`choose_online`
    (``auto_options`` are its keyword arguments).
    """
    if not (isinstance(theta, (int, float)) and math.isfinite(theta) and theta > 0):
        raise BacktestError(f"theta must be a number > 0, got {theta!r}")
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
        from_choice = _run_auto(eng, auto, steps, horizon, start_a, **(auto_options or {}))
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


# ------------------------------------------------------------------ calibration
@dataclass
class Calibration:
    """The planning bound chosen for a policy and the backtest behind it."""

    theta_plan: float
    share_within: float
    mean_imbalance: float
    migration_per_step: float
    table: pd.DataFrame
    reason: str


def calibrate(history: WindowHistory, policy: Policy, theta: float, target: float = 0.9,
              grid: Sequence[float] | None = None, horizon: int = 1, start: int | None = None,
              params: PlanParams | None = None,
              initial: np.ndarray | None = None) -> Calibration:
    """Choose theta_plan <= theta for ``policy`` from its backtest on ``history``: the
    largest realised share within 1 + theta reaching ``target`` at the least migration,
    else the best share (ties: lower mean imbalance, then less migration)."""
    if not (isinstance(target, (int, float)) and 0 < target <= 1):
        raise BacktestError(f"target share must be in (0, 1], got {target!r}")
    points = [dataclasses.replace(policy, name=f"theta_plan={tp:g}", theta_plan=tp)
              for tp in headroom_grid(theta, grid)]
    result = backtest(history, points, theta, horizon=horizon, start=start, baselines=(),
                      params=params, initial=initial)
    table = result.summary.copy()
    reach = table[table["share_within"] >= target - 1e-12]
    if len(reach):
        row = reach.sort_values(["migration_per_step", "theta_plan"],
                                ascending=[True, False], kind="stable").iloc[0]
        reason = (f"theta_plan {row.theta_plan:g} keeps {row.share_within:.0%} of "
                  f"{int(row.windows)} backtested windows within 1 + theta = {1 + theta:g} "
                  f"(target {target:.0%}) at the least migration of the "
                  f"{len(reach)} point(s) that reach it ({row.migration_per_step:.2%} per step)")
    else:
        best = _best(table.to_dict("records"))
        row = table[table["policy"] == best["policy"]].iloc[0]
        reason = (f"no theta_plan reaches the target {target:.0%}: theta_plan "
                  f"{row.theta_plan:g} keeps the most, {row.share_within:.0%} of "
                  f"{int(row.windows)} backtested windows within 1 + theta = {1 + theta:g} "
                  f"(mean realised {row.mean_imbalance:.3f})")
    return Calibration(float(row.theta_plan), float(row.share_within), float(row.mean_imbalance),
                       float(row.migration_per_step), table, reason)


# ------------------------------------------------------------------ auto
#: Load models auto tries (with W = what each reads); seasonal ones are added when the
#: history holds two periods (see :func:`default_candidates`).
AUTO_MODELS = ("mean:windows=1", "ewm:halflife=2,windows=8", "robust:windows=3",
               "robust:windows=7", "robust:windows=14")
#: theta_plan values auto tries, as fractions of theta.
AUTO_HEADROOM = (1.0, 0.5)
#: Seasonal periods (windows) auto tries when the history holds two of them.
AUTO_PERIODS = (7, 24)


def default_candidates(theta: float, n_windows: int, n_keys: int | None = None,
                       method: str = "mixed") -> list[Policy]:
    """The policies auto compares: :data:`AUTO_MODELS` whose history leaves at least half
    of ``n_windows`` to judge on (and a seasonal model per period of
    :data:`AUTO_PERIODS` the windows cover twice), each at :data:`AUTO_HEADROOM`."""
    models = [LoadModel.parse(m) for m in AUTO_MODELS]
    for p in AUTO_PERIODS:
        if n_windows >= 2 * p + 2:
            models.append(LoadModel("seasonal", windows=p, period=p))
    out = []
    for m in models:
        need = history_needed(m)
        if need > 1 and need > n_windows // 2:
            continue
        for f in AUTO_HEADROOM:
            out.append(Policy.of(m, theta_plan=None if f == 1.0 else theta * f, method=method))
    return out


@dataclass
class Choice:
    """What ``auto`` chose and why: ``policy`` (None: stay, plan nothing), ``theta_plan``,
    ``reason`` and the candidates' backtest ``table``."""

    policy: Policy | None
    theta_plan: float
    reason: str
    table: pd.DataFrame
    stay_imbalance: float = math.nan

    @property
    def stay(self) -> bool:
        return self.policy is None


#: auto's migration per step at most this multiple of today's planning (mean of the last
#: window at theta) over the same windows, when today's planning is among the candidates.
MAX_MIGRATION_RATIO = 1.5


def _today(policies: Sequence[Policy], theta: float) -> int | None:
    """Index of today's planning (mean of the last window, at theta) among ``policies``."""
    for i, p in enumerate(policies):
        m = p.load_model
        if (m.name == "mean" and m.windows == 1 and p.method == "mixed"
                and (p.theta_plan is None or abs(p.theta_plan - theta) <= 1e-12)):
            return i
    return None


def _pick(table: pd.DataFrame, stay_mean: float, theta: float, target: float,
          share_slack: float = 0.05, min_gain: float = 0.0,
          migration_cap: float | None = None) -> tuple[int | None, str]:
    """Index of the chosen candidate row (None: stay) and why.

    Candidates whose share within 1 + theta reaches ``target`` are near-best, else
    those within ``share_slack`` of the best share and within theta / 8 of the lowest
    mean imbalance among them; of those the least migration wins (ties: lower mean
    imbalance). The choice stands only if its mean realised imbalance beats staying's by
    ``min_gain``. Candidates migrating more than ``migration_cap`` per step are left out
    (unless that leaves none)."""
    if table.empty:
        return None, "no candidate could be backtested"
    capped = ""
    if migration_cap is not None:
        cheap = table[table["migration_per_step"] <= migration_cap + 1e-12]
        if len(cheap) < len(table):
            capped = (f"; {len(table) - len(cheap)} candidate(s) migrating more than "
                      f"{migration_cap:.2%} per step ({MAX_MIGRATION_RATIO:g}x today's "
                      "planning) left out")
        table = cheap if len(cheap) else table
    best_share = float(table["share_within"].max())
    reach = table[table["share_within"] >= target - 1e-12]
    if len(reach):
        near = reach
    else:
        near = table[table["share_within"] >= best_share - share_slack - 1e-12]
        near = near[near["mean_imbalance"] <= float(near["mean_imbalance"].min()) + theta / 8]
    row = near.sort_values(["migration_per_step", "mean_imbalance"], kind="stable").iloc[0]
    idx = int(row.name)
    if math.isfinite(stay_mean) and not row.mean_imbalance < stay_mean - min_gain:
        return None, (f"plans made on these windows do not hold: backtested realised "
                      f"{row.mean_imbalance:.3f} ({row.policy}) vs {stay_mean:.3f} staying")
    versus = f" vs {stay_mean:.3f} staying" if math.isfinite(stay_mean) else ""
    return idx, (f"{row.policy}: {row.share_within:.0%} of {int(row.windows)} backtested windows "
                 f"within 1 + theta = {1 + theta:g} (best candidate {best_share:.0%}), mean "
                 f"realised {row.mean_imbalance:.3f}{versus}, migration "
                 f"{row.migration_per_step:.2%} per step{capped}")


def choose(history: WindowHistory, theta: float, time_limit: float = 30.0, target: float = 0.9,
           candidates: Sequence[Policy] | None = None, params: PlanParams | None = None,
           initial: np.ndarray | None = None, min_gain: float = 0.0) -> Choice:
    """What the ``auto`` load model does: backtest ``candidates`` (default
    :func:`default_candidates`) over ``history`` from ``initial``, within ``time_limit``
    seconds (candidates left when it runs out are not tried, and the reason says so), and
    pick one (:func:`_pick`); stay (``policy`` None) when none beats keeping ``initial``
    over the same windows by ``min_gain``."""
    h = history
    cands = list(candidates) if candidates is not None else default_candidates(
        theta, h.n_windows, h.n_keys)
    if h.n_windows < 2 or not cands:
        return Choice(None if h.n_windows < 2 else None, theta,
                      f"{h.n_windows} window(s) given: too few to backtest a plan on windows "
                      "it has not seen", pd.DataFrame(columns=list(SUMMARY_COLUMNS)))
    start_a = h.default.copy() if initial is None else np.asarray(initial, dtype=np.int64)
    need = max(p.history for p in cands)
    start = min(need, h.n_windows - 1)
    cands = [p for p in cands if p.history <= start]
    t0 = time.perf_counter()
    rows, skipped = [], 0
    for p in cands:
        if time.perf_counter() - t0 > time_limit:
            skipped += 1
            continue
        r = backtest(h, [p], theta, start=start, baselines=(), params=params, initial=start_a)
        rows.append(r.summary.iloc[0].to_dict())
    table = pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))
    judged = h.loads[start:]
    stay_mean = float(window_imbalance(judged, start_a, h.n_instances).mean())
    today = _today([p for p in cands if p.name in set(table["policy"])], theta)
    cap = None
    if today is not None:
        tried = [p for p in cands if p.name in set(table["policy"])]
        cap = MAX_MIGRATION_RATIO * float(
            table.loc[table["policy"] == tried[today].name, "migration_per_step"].iloc[0])
    idx, reason = _pick(table, stay_mean, theta, target, min_gain=min_gain, migration_cap=cap)
    if skipped:
        reason += f" ({skipped} candidate(s) not tried: time limit {time_limit:g} s)"
    chosen = None if idx is None else next(p for p in cands if p.name == table.loc[idx, "policy"])
    tp = theta if chosen is None else float(chosen.theta_plan or theta)
    return Choice(chosen, tp, reason, table, stay_mean)


def _run_auto(eng: _Engine, policies: Sequence[Policy], steps: list[int], horizon: int,
              initial: np.ndarray, candidates: Sequence[Policy] | None = None,
              lookback: int = 56, min_evidence: int = 7, target: float = 0.9,
              min_gain: float = 0.0) -> list[_Chain]:
    """The ``auto`` policies of a backtest: at every step, the candidates' own backtest on
    the judged windows before it (at most ``lookback``) chooses the load model and
    theta_plan (:func:`_pick`); a step applies the chosen plan only when its candidate's
    plans beat not replanning (the candidate's ``stay_imbalance``) on those windows, so a
    history where planning does not pay keeps the assignment. With fewer than
    ``min_evidence`` judged windows it does what the stay baseline does: today's plan
    (mean of the last window, at theta) at the first step, kept.
    Causal: a choice at step t reads only windows before t."""
    h, theta = eng.h, eng.theta
    cands = list(candidates) if candidates is not None else default_candidates(
        theta, h.n_windows, h.n_keys)
    cands = [p for p in cands if p.history <= steps[0]] or [Policy.of("mean:windows=1")]
    runs = [_run_policy(eng, p, steps, horizon, initial) for p in cands]
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
                idx, why = _pick(table, math.inf, theta, target, migration_cap=cap)
                # staying = not replanning: the candidate's previous assignment on the window
                if idx is not None and not r[idx].mean() < s[idx].mean() - min_gain:
                    why = (f"{cands[idx].name}: replanning does not pay (realised "
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


# ------------------------------------------------------------------ the DAG gate
@dataclass
class Holdout:
    """A plan made before the held-out windows, judged on them against staying."""

    plan_imbalance: float
    stay_imbalance: float
    windows: int
    holds: bool
    reason: str
    min_gain: float = 0.0
    rows: pd.DataFrame | None = None


def holds(history: WindowHistory, policy: Policy, theta: float, holdout: int = 1,
          current: np.ndarray | None = None, min_gain: float = 0.0,
          params: PlanParams | None = None) -> Holdout:
    """Plan with ``policy`` on the windows before the last ``holdout`` windows (from
    ``current``, default: the default placement) and judge that plan and ``current`` on
    the held-out windows: the plan holds when its mean realised imbalance beats staying's
    by more than ``min_gain``."""
    h = history
    if isinstance(holdout, bool) or not isinstance(holdout, (int, np.integer)) or holdout < 1:
        raise BacktestError(f"holdout must be an integer >= 1 windows, got {holdout!r}")
    if policy.load_model.name == "auto":
        raise BacktestError("holds needs a concrete load model, not auto (choose one first)")
    cut = h.n_windows - int(holdout)
    if cut < policy.history:
        raise BacktestError(f"{h.n_windows} window(s) are too few: policy {policy.name} plans "
                            f"on {policy.history} and {holdout} are held out")
    cur = h.default.copy() if current is None else np.asarray(current, dtype=np.int64)
    eng = _Engine(h, theta, params)
    w = policy.history
    new, pred, mig, moved, _ = eng.plan(cur, h.loads[cut - w:cut], h.state[cut - w:cut].sum(0),
                                        policy.load_model, policy.theta_plan, policy.method)
    judged = h.loads[cut:]
    plan_r = window_imbalance(judged, new, h.n_instances)
    stay_r = window_imbalance(judged, cur, h.n_instances)
    p, s = float(plan_r.mean()), float(stay_r.mean())
    ok = p < s - min_gain
    verdict = "hold" if ok else "do not hold"
    reason = (f"plans made on these windows {verdict}: backtested realised {p:.2f} vs "
              f"{s:.2f} staying over {holdout} held-out window(s)")
    if abs(p - s) < 0.005:
        reason = reason.replace(f"{p:.2f} vs {s:.2f}", f"{p:.4f} vs {s:.4f}")
    rows = pd.DataFrame({"window_start": h.window_starts[cut:], "plan_imbalance": plan_r,
                         "stay_imbalance": stay_r})
    return Holdout(p, s, int(holdout), bool(ok), reason, float(min_gain), rows)


__all__ = ["BASELINES", "BacktestError", "BacktestResult", "Calibration", "Choice", "Holdout",
           "LoadModelError", "Policy", "PlanningError", "WindowHistory", "backtest", "calibrate",
           "choose", "default_candidates", "headroom_grid", "holds", "window_imbalance"]
