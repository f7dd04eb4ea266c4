"""Do plans hold in the windows after them? The backtest benchmark (a script, not a test)

    python include/benchmarks/backtest_benchmark.py [--traces a,b] [--quick] [--json]
                                                    [--out DIR] [--docs-img DIR | --no-docs-img]
                                                    [--method M] [--calibration-share F]
                                                    [--sensitivity | --causal-bound | --first-measurement]

Traces (:mod:`traces`, fetched first with ``make traces``): nyc-dest, nyc-tailnum,
us-origin-hourly (real), synth-drift, synth-seasonal (the synthetic generator). Each is
replayed by the engine of :mod:`rebalance.core.backtest` at its own N and theta (traces.py):
at each step a policy plans on the windows before the step from the assignment it left
the step before, and the plan is judged on the next window it has not seen.

Policies (planner ``--method``, default mixed, for every policy and baseline):

* ``last-1`` (today's planning: mean of the last window, at theta), ``last-3``, ``last-7``
  (mean of the last 3 and 7 windows);
* ``ewm`` (halflife 2 windows over 8), ``quantile`` (each key's 0.9 quantile over 7),
  ``max`` (over 7), ``seasonal`` (the same slot one period ago, where the trace has a
  period), ``robust`` (each of the last 3 windows within the bound);
* ``headroom``: last-1 planned at theta_plan = theta / 4 (set by hand);
* ``calibrated``: last-1 at the theta_plan that :func:`rebalance.core.backtest.calibrate`
  chooses (target 90 % within) on the first ``--calibration-share`` of the windows; every
  policy and baseline is then judged only on the windows after that prefix, so the
  calibration is out of sample;
* ``auto``: the default (load model ``auto``: at every step the candidates' backtest on
  the judged windows before it chooses the load model and theta_plan, or stays).

Baselines: ``none`` (default placement), ``stay`` (one plan at the first step, then never),
``oracle`` (planned on the judged window itself), ``distribution-oracle`` (planned on the
mean of the 3 windows after the judged one, at theta_plan = theta x 1, 3/4, 1/2, 3/8, 1/4,
1/8; rows ``distribution-oracle@<theta_plan>`` and the best of them).

``--sensitivity``: only ``auto`` again under other selection settings
(:data:`SENSITIVITY`: a finer headroom grid, no share slack, a shorter or longer lookback,
a tighter mean tolerance), beside ``last-1``, judged on the same windows: how much the
figures move with them (a synthetic trace pooled over the generator seeds of :data:`SEEDS`).

Per trace: a table (share of judged windows within 1 + theta, mean and p90 realised
imbalance, migration per step as a fraction of the state, routing-table size) and the
verdicts on the targets a planning policy must meet, for the default (auto), and for
calibrated beside it:

* G1 share within >= 90 % of the distribution oracle's best share (over headroom), and
  >= 2x last-1's where last-1's is below 50 %;
* G2 mean realised imbalance <= the distribution oracle's best mean + theta / 4;
* G3 mean realised imbalance <= stay's;
* G4 migration per step <= 1.5x last-1's.

Writes to ``--out`` (default .data/bench/backtest): results.json, summary.csv (every
trace), steps-<trace>.csv (every judged window of every policy), backtest-<trace>.png
(realised imbalance over time against 1 + theta); the PNGs are copied to ``--docs-img``
(default docs/img, none with --quick). Deterministic: the figures depend only on the
traces (plan_seconds and run times excepted).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

import traces as trace_lib  # noqa: E402  (the sibling module, not a package)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".data" / "bench" / "backtest"
DEFAULT_DOCS_IMG = ROOT / "docs" / "img"
DEFAULT_TRACES = ("nyc-dest", "nyc-tailnum", "us-origin-hourly", "synth-drift", "synth-seasonal")
#: Windows a trace keeps with --quick.
QUICK_WINDOWS = {"nyc-dest": 60, "nyc-tailnum": 45, "us-origin-hourly": 96, "synth-drift": 60,
                 "synth-seasonal": 72}
CALIBRATION_TARGET = 0.9
DEFAULT = "auto"
TODAY = "last-1"
#: Policies whose rows the plot draws (when present), and their colours.
PLOTTED = {"last-1": "tab:red", "stay": "tab:gray", "calibrated": "tab:blue",
           "auto": "tab:green", "distribution-oracle": "tab:purple", "oracle": "black"}


def policies(theta: float, period: int | None, method: str, calibrated: float | None):
    """The benchmark's policies (module docstring), named as in the tables."""
    from rebalance.core.backtest import Policy

    specs = [("last-1", "mean:windows=1", None), ("last-3", "mean:windows=3", None),
             ("last-7", "mean:windows=7", None), ("ewm", "ewm:halflife=2,windows=8", None),
             ("quantile", "quantile:q=0.9,windows=7", None), ("max", "max:windows=7", None)]
    if period:
        specs.append(("seasonal", f"seasonal:period={period},windows={period}", None))
    specs += [("robust", "robust:windows=3", None), ("headroom", "mean:windows=1", theta / 4)]
    if calibrated is not None:
        specs.append(("calibrated", "mean:windows=1", calibrated))
    specs.append(("auto", "auto", None))
    return [Policy.of(model, theta_plan=tp, method=method, name=name) for name, model, tp in specs]


def _row(summary: pd.DataFrame, name: str) -> dict:
    hit = summary[summary["policy"] == name]
    return hit.iloc[0].to_dict() if len(hit) else {}


def verdicts(summary: pd.DataFrame, theta: float, policy: str = DEFAULT) -> list[dict]:
    """The targets G1-G4 (module docstring) for ``policy`` as rows: goal, ok, figures."""
    me, today, stay = _row(summary, policy), _row(summary, TODAY), _row(summary, "stay")
    grid = summary[summary["policy"].str.startswith("distribution-oracle@")]
    if not me or not today or not stay or grid.empty:
        return []
    best_share = float(grid["share_within"].max())
    best_mean = float(grid["mean_imbalance"].min())
    share, mean = float(me["share_within"]), float(me["mean_imbalance"])
    # a goal whose reference keeps no window within 1 + theta is met by anything: n/a
    g1a = f"{share:.1%} vs 0.9 x {best_share:.1%} = {0.9 * best_share:.1%}"
    out = [dict(goal="G1a share >= 0.9 x distribution oracle's best share",
                ok=share >= 0.9 * best_share - 1e-12 if best_share > 0 else None,
                figures=g1a if best_share > 0 else f"vacuous ({g1a}): the oracle keeps none")]
    t_share = float(today["share_within"])
    if t_share < 0.5:
        g1b = f"{share:.1%} vs 2 x {t_share:.1%} = {2 * t_share:.1%}"
        out.append(dict(goal="G1b share >= 2 x last-1's (last-1 below 50 %)",
                        ok=share >= 2 * t_share - 1e-12 if share > 0 or t_share > 0 else None,
                        figures=g1b if share > 0 or t_share > 0
                        else f"vacuous ({g1b}): neither keeps any window"))
    else:
        out.append(dict(goal="G1b share >= 2 x last-1's (last-1 below 50 %)", ok=None,
                        figures=f"not applicable: last-1 keeps {t_share:.1%}"))
    out.append(dict(goal="G2 mean <= distribution oracle's best mean + theta/4",
                    ok=mean <= best_mean + theta / 4 + 1e-12,
                    figures=f"{mean:.3f} vs {best_mean:.3f} + {theta / 4:g} = "
                            f"{best_mean + theta / 4:.3f}"))
    out.append(dict(goal="G3 mean <= stay's mean", ok=mean <= float(stay["mean_imbalance"]) + 1e-12,
                    figures=f"{mean:.3f} vs {float(stay['mean_imbalance']):.3f}"))
    mig, t_mig = float(me["migration_per_step"]), float(today["migration_per_step"])
    out.append(dict(goal="G4 migration per step <= 1.5 x last-1's",
                    ok=mig <= 1.5 * t_mig + 1e-12,
                    figures=f"{mig:.2%} vs 1.5 x {t_mig:.2%} = {1.5 * t_mig:.2%}"))
    for v in out:
        v["policy"] = policy
    return out


def judged_from(n_windows: int, period: int | None, calibration_share: float) -> int:
    """The first judged window: after the calibration prefix, and after what any policy
    reads (8 windows, or one period)."""
    need = max(8, period or 0, 7)
    return max(need + 4, int(round(n_windows * calibration_share)))


def load_judged(name: str, directory: Path, calibration_share: float, quick: bool = False):
    """A trace's windows as the benchmark judges them: (trace, counts, history, the first
    judged window)."""
    from rebalance.core.backtest import WindowHistory

    trace = trace_lib.TRACES[name]
    frame = trace_lib.load(name, directory,
                           windows=QUICK_WINDOWS[name] if quick else trace.bench_windows)
    history = WindowHistory.from_counts(frame, key="key", window="window", count="count",
                                        n_instances=trace.n_instances)
    return trace, frame, history, judged_from(history.n_windows, trace.period, calibration_share)


def run_trace(name: str, quick: bool, method: str, calibration_share: float, directory: Path,
              log) -> dict:
    """Load, calibrate and backtest one trace; the summary, steps, verdicts and notes."""
    from rebalance.core.backtest import Policy, backtest, calibrate

    t0 = time.perf_counter()
    trace, frame, history, cut = load_judged(name, directory, calibration_share, quick)
    theta = trace.theta
    load_s = time.perf_counter() - t0
    if cut >= history.n_windows - 2:
        raise SystemExit(f"backtest_benchmark: trace {name} has {history.n_windows} windows, "
                         f"too few for a calibration prefix of {cut}")
    t1 = time.perf_counter()
    cal = calibrate(history.slice(0, cut), Policy.of("mean:windows=1", method=method), theta,
                    target=CALIBRATION_TARGET)
    cal_s = time.perf_counter() - t1
    log(f"[{name}] {history.n_windows} windows x {history.n_keys} keys, N = {trace.n_instances}, "
        f"theta = {theta:g}; calibrated on windows [0, {cut}): theta_plan {cal.theta_plan:g} "
        f"({cal_s:.1f} s): {cal.reason}")
    pols = policies(theta, trace.period, method, cal.theta_plan)
    t2 = time.perf_counter()
    result = backtest(history, pols, theta, start=cut, baseline_method=method)
    run_s = time.perf_counter() - t2
    summary = result.summary.copy()
    steps = result.steps.copy()
    steps.insert(0, "trace", name)
    summary.insert(0, "trace", name)
    v = verdicts(summary, theta, DEFAULT) + verdicts(summary, theta, "calibrated")
    stats = trace_lib.describe(frame)
    return dict(trace=name, description=trace.description, source=trace.source,
                licence=trace.licence, n_instances=trace.n_instances, theta=theta,
                period=trace.period, synthetic=trace.archive is None, quick=quick, method=method,
                stats=stats,
                calibration=dict(prefix_windows=cut, theta_plan=cal.theta_plan,
                                 share_within=cal.share_within, reason=cal.reason,
                                 table=cal.table.to_dict("records")),
                judged_from=(cut if trace.archive is None else str(history.window_starts[cut])),
                judged_windows=int(summary["windows"].max()),
                notes=list(result.notes), verdicts=v, summary=summary, steps=steps,
                seconds=dict(load=round(load_s, 1), calibration=round(cal_s, 1),
                             backtest=round(run_s, 1)))


#: The figures first measured on nyc-dest, before plans were backtested (N = 16,
#: theta = 0.08, the CLI's default planner auto): share within and mean realised imbalance
#: of plans on the last 1, 3, 7 windows, and the mean imbalance of no plans.
FIRST_FIGURES = {"last-1": (0.17, 1.143), "last-3": (0.20, None), "last-7": (0.00, 1.158),
                 "none": (None, 2.64)}
FIRST_JUDGED = 30


def first_measurement(directory: Path, method: str = "auto") -> list[dict]:
    """The first measurement again on nyc-dest: plans on the last W = 1, 3, 7 windows,
    chained from the default placement, each judged on the next window, over the first
    ``FIRST_JUDGED`` judged windows of 2013 (windows W .. W + 29), planner ``method``."""
    from rebalance.core.backtest import Policy, WindowHistory, backtest

    trace = trace_lib.TRACES["nyc-dest"]
    frame = trace_lib.load("nyc-dest", directory)
    history = WindowHistory.from_counts(frame, n_instances=trace.n_instances)
    rows = []
    for w in (1, 3, 7):
        pol = Policy.of(f"mean:windows={w}", method=method, name=f"last-{w}")
        res = backtest(history.slice(0, w + FIRST_JUDGED), [pol], trace.theta, start=w,
                       baselines=("none",), baseline_method=method)
        for name in (pol.name, "none"):
            r = _row(res.summary, name)
            rows.append(dict(policy=name, judged=f"windows {w}..{w + FIRST_JUDGED - 1}",
                             share_within=float(r["share_within"]),
                             mean_imbalance=float(r["mean_imbalance"]),
                             p90_imbalance=float(r["p90_imbalance"]),
                             first=FIRST_FIGURES.get(name)))
    return rows


#: Generator seeds a synthetic trace is pooled over (``--sensitivity``, backtest_seeds.py).
SEEDS = (19, 20, 21, 22)
#: ``--sensitivity``: auto's selection settings tried beside its defaults (the candidates'
#: fractions of theta, the share slack and mean tolerance of its choice, the judged windows
#: it looks back on).
SENSITIVITY = {
    "defaults": {},
    "headroom 1, 3/4, 1/2": {"headroom": (1.0, 0.75, 0.5)},
    "headroom 1, 7/8, 3/4, 1/2": {"headroom": (1.0, 0.875, 0.75, 0.5)},
    "slack 0": {"share_slack": 0.0},
    "headroom 1, 3/4, 1/2, slack 0": {"headroom": (1.0, 0.75, 0.5), "share_slack": 0.0},
    "the same, lookback 28": {"headroom": (1.0, 0.75, 0.5), "share_slack": 0.0, "lookback": 28},
    "the same, lookback 112": {"headroom": (1.0, 0.75, 0.5), "share_slack": 0.0,
                               "lookback": 112},
    "the same, mean within theta / 32": {"headroom": (1.0, 0.75, 0.5), "share_slack": 0.0,
                                         "mean_tolerance": 1 / 32},
    "the same, mean within theta / 64": {"headroom": (1.0, 0.75, 0.5), "share_slack": 0.0,
                                         "mean_tolerance": 1 / 64},
}


def sensitivity(name: str, calibration_share: float, method: str, directory: Path) -> list[dict]:
    """``auto`` on one trace under each of :data:`SENSITIVITY`'s settings, judged on the same
    windows as the benchmark's tables, beside ``last-1`` (the goal: at least twice its share
    where it is below 50 %). A synthetic trace is pooled over the generator seeds of
    :data:`SEEDS` (one seed's share moves by several points: backtest_seeds.py). The
    candidates' chains do not depend on the settings: each is run once per history."""
    from rebalance.core.backtest import AutoSettings, Policy, backtest

    trace = trace_lib.TRACES[name]
    if trace.archive is None:
        histories = []
        for seed in SEEDS:
            _, history = synthetic_history(name, seed)
            histories.append((history, judged_from(history.n_windows, trace.period,
                                                   calibration_share)))
    else:
        _, _, history, cut = load_judged(name, directory, calibration_share)
        histories = [(history, cut)]
    pols = [Policy.of("mean:windows=1", method=method, name=TODAY),
            Policy.of("auto", method=method, name=DEFAULT)]
    per_run = []
    for history, cut in histories:
        runs: dict = {}   # each candidate's chain, run once for every setting
        out = []
        for label, options in SENSITIVITY.items():
            res = backtest(history, pols[1:] if out else pols, trace.theta, start=cut,
                           baselines=(), baseline_method=method,
                           auto_settings=AutoSettings(**options), candidate_runs=runs)
            if not out:
                out.append(dict(setting=TODAY, **_figures(_row(res.summary, TODAY)),
                                **_halves(res.steps, TODAY)))
            out.append(dict(setting=label, **_figures(_row(res.summary, DEFAULT)),
                            **_halves(res.steps, DEFAULT)))
        per_run.append(out)
    rows = []
    for j, first in enumerate(per_run[0]):
        pooled = {k: sum(run[j][k] for run in per_run) / len(per_run)
                  for k in first if k != "setting"}
        rows.append(dict(trace=name, setting=first["setting"], seeds=len(per_run), **pooled))
    return rows


def _figures(r: dict) -> dict:
    return {k: float(r[k]) for k in ("share_within", "mean_imbalance", "migration_per_step")}


def _halves(steps, policy: str) -> dict:
    """Share within and mean realised imbalance of a policy over the first and the second
    half of its judged windows: does a setting lead in both, or only over the whole?"""
    d = steps[steps["policy"] == policy]
    windows = sorted(d["window"].unique())
    middle = windows[len(windows) // 2]
    out = {}
    for half, part in (("first", d[d["window"] < middle]), ("second", d[d["window"] >= middle])):
        out[f"share_within_{half}_half"] = float(part["within"].mean())
        out[f"mean_imbalance_{half}_half"] = float(part["realised_imbalance"].mean())
    return out


def synthetic_history(name: str, seed: int | None = None):
    """(generator spec, :class:`WindowHistory`) of synthetic trace ``name``, drawn with its
    own seed or ``seed``."""
    from rebalance.core.backtest import WindowHistory

    trace = trace_lib.TRACES[name]
    spec = dict(trace.synthetic, n_instances=trace.n_instances)
    if seed is not None:
        spec["seed"] = seed
    history = WindowHistory.from_counts(trace_lib.synthetic_counts(**spec), key="key",
                                        window="window", count="count",
                                        n_instances=trace.n_instances)
    return spec, history


def expected_loads(spec: dict, history, expected: str) -> np.ndarray:
    """The generator's expected counts (:func:`traces.synthetic_counts` ``expected``) of a
    synthetic trace as a windows x keys matrix aligned with ``history`` (made from the same
    ``spec``)."""
    frame = trace_lib.synthetic_counts(**spec, expected=expected)
    # windows are 0 .. T - 1 in both (the history holds them as dates from the epoch)
    out = (frame.pivot(index="window", columns="key", values="count").sort_index()
           .reindex(columns=history.keys).fillna(0.0).to_numpy())
    assert out.shape == history.loads.shape and out.sum() > 0, out.shape
    return out


def causal_bound(name: str, calibration_share: float, method: str, log) -> list[dict]:
    """On a synthetic trace: what any forecast from the past could reach, beside the
    distribution oracle. Chains planned on the generator's own distribution (its expected
    counts, no sampling noise): ``known-past``, all that can be known of the judged window
    before it (the frequencies of the window before, as the hot keys' swaps at a window are
    random, with the judged window's sine, which is deterministic): no forecast from the
    past can know more; and ``truth-now``, the judged window's own distribution (what the
    distribution oracle approximates). Best over the headroom grid; judged on the same
    windows as :func:`run_trace`."""
    from rebalance.core.backtest import backtest, given_forecasts

    trace = trace_lib.TRACES[name]
    if trace.archive is not None:
        raise SystemExit(f"backtest_benchmark: --causal-bound needs a synthetic trace, "
                         f"{name} is real")
    spec, history = synthetic_history(name)

    def given(expected: str) -> np.ndarray:
        return expected_loads(spec, history, expected)

    cut = judged_from(history.n_windows, trace.period, calibration_share)
    steps = list(range(cut, history.n_windows))
    theta = trace.theta
    rows = []
    oracle = backtest(history, [], theta, start=cut, baselines=("distribution-oracle",),
                      baseline_method=method).summary
    rows.append(dict(oracle[oracle["policy"] == "distribution-oracle"].iloc[0]))
    for label, expected in (("known-past", "known-past"), ("truth-now", "now")):
        best = given_forecasts(history, given(expected), theta, steps, label, method=method)
        log(f"[{name}] {label}: " + ", ".join(
            f"{b['theta_plan']:g}: {b['share_within']:.1%}/{b['mean_imbalance']:.3f}"
            for b in sorted(best, key=lambda b: -b["theta_plan"])))
        rows.append(dict(best[0], policy=label))
    return rows


def format_table(res: dict) -> str:
    s = res["summary"]
    lines = [f"{'policy':28} {'theta_plan':>10} {'within':>7} {'mean':>7} {'p90':>7} "
             f"{'migration':>10} {'table':>7}"]
    for r in s.itertuples():
        tp = "per step" if r.policy == DEFAULT else f"{r.theta_plan:.4g}"
        lines.append(f"{r.policy:28} {tp:>10} {r.share_within:>7.1%} "
                     f"{r.mean_imbalance:>7.3f} {r.p90_imbalance:>7.3f} "
                     f"{r.migration_per_step:>10.2%} {r.table_size:>7.1f}")
    return "\n".join(lines)


def format_verdicts(res: dict) -> str:
    out = []
    for v in res["verdicts"]:
        mark = "n/a " if v["ok"] is None else ("PASS" if v["ok"] else "FAIL")
        out.append(f"  {mark} {v['policy']:10} {v['goal']}: {v['figures']}")
    return "\n".join(out)


def plot(res: dict, path: Path) -> Path:
    """Realised imbalance over the judged windows against 1 + theta (rolling mean), and the
    rolling share within 1 + theta, for the policies of :data:`PLOTTED`."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    steps, theta = res["steps"], res["theta"]
    best = _row(res["summary"], "distribution-oracle")
    best_name = f"distribution-oracle@{best['theta_plan']:g}" if best else None
    n = int(steps["window"].nunique())
    smooth = max(1, n // 60)
    share_w = max(smooth, n // 12)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 6.4), sharex=True,
                                  gridspec_kw={"height_ratios": [3, 2]})
    top = 1 + theta
    for name, colour in PLOTTED.items():
        key = best_name if name == "distribution-oracle" else name
        grp = steps[steps["policy"] == key].sort_values("window")
        if grp.empty:
            continue
        x = grp["window"] if res["synthetic"] else pd.to_datetime(grp["window_start"])
        r = grp["realised_imbalance"].rolling(smooth, min_periods=1).mean()
        w = grp["within"].astype(float).rolling(share_w, min_periods=1).mean()
        label = name if name != "distribution-oracle" else f"distribution oracle @{best['theta_plan']:g}"
        ax.plot(x, r, color=colour, lw=1.1, label=label)
        ax2.plot(x, w, color=colour, lw=1.1)
        top = max(top, float(np.nanquantile(r, 0.98)))
    ax.axhline(1 + theta, color="tab:orange", ls="--", lw=1.2, label=f"1 + theta = {1 + theta:g}")
    ax.set_ylim(1.0, top + 0.02)
    none = _row(res["summary"], "none")
    ax.set_ylabel(f"realised imbalance\n(rolling mean of {smooth} window(s))")
    ax.set_title(f"{res['trace']}: N = {res['n_instances']}, theta = {theta:g}, "
                 f"{res['judged_windows']} judged windows (none, off the scale: mean "
                 f"{none.get('mean_imbalance', math.nan):.2f})", fontsize=10)
    ax.legend(fontsize=7.5, ncol=4, loc="upper right")
    ax.grid(alpha=0.3)
    ax2.set_ylabel(f"share within 1 + theta\n(rolling, {share_w} windows)")
    ax2.set_ylim(-0.02, 1.02)
    ax2.grid(alpha=0.3)
    ax2.set_xlabel("judged window (number)" if res["synthetic"] else "judged window (start)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _jsonable(res: dict) -> dict:
    out = {k: v for k, v in res.items() if k not in ("summary", "steps")}
    out["summary"] = json.loads(res["summary"].to_json(orient="records"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", default=",".join(DEFAULT_TRACES),
                   help=f"comma-separated, of {', '.join(trace_lib.TRACES)}")
    p.add_argument("--quick", action="store_true", help="the first few windows of each trace")
    p.add_argument("--json", action="store_true", help="print the results as JSON only")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--docs-img", type=Path, default=None,
                   help="copy the plots here (default docs/img, none with --quick)")
    p.add_argument("--no-docs-img", action="store_true")
    p.add_argument("--method", default="mixed", help="planner of every policy and baseline")
    p.add_argument("--calibration-share", type=float, default=0.25,
                   help="share of the windows calibration sees; judging starts after them")
    p.add_argument("--dir", type=Path, default=trace_lib.DEFAULT_DIR, help="archives folder")
    p.add_argument("--causal-bound", action="store_true",
                   help="on the synthetic traces only: what a forecast from the past could "
                        "reach (plans on the generator's own distribution of the window "
                        "before), beside the distribution oracle")
    p.add_argument("--sensitivity", action="store_true",
                   help="only auto under other selection settings (headroom grid, share slack, "
                        "lookback, mean tolerance), beside last-1, on the traces given")
    p.add_argument("--first-measurement", action="store_true",
                   help="only reproduce the figures first measured on nyc-dest, before plans "
                        "were backtested (planner auto)")
    args = p.parse_args(argv)
    if args.first_measurement:
        try:
            rows = first_measurement(args.dir)
        except trace_lib.TraceError as exc:
            print(f"backtest_benchmark: {exc}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        print(f"the first measurement again: nyc-dest, N = 16, theta = 0.08, planner auto, "
              f"{FIRST_JUDGED} judged windows per policy")
        for r in rows:
            first = r["first"] or (None, None)
            said = ", ".join(x for x in (
                f"{first[0]:.0%} within" if first[0] is not None else "",
                f"mean {first[1]:.3f}" if first[1] is not None else "") if x) or "-"
            print(f"  {r['policy']:7} {r['judged']:15} within {r['share_within']:6.1%}  mean "
                  f"{r['mean_imbalance']:.3f}  p90 {r['p90_imbalance']:.3f}   first measured: {said}")
        return 0
    names = [t.strip() for t in args.traces.split(",") if t.strip()]
    unknown = [t for t in names if t not in trace_lib.TRACES]
    if unknown or not names:
        print(f"backtest_benchmark: unknown trace(s) {unknown or names}; known: "
              f"{', '.join(trace_lib.TRACES)}", file=sys.stderr)
        return 2
    if args.sensitivity:
        rows = [r for n in names for r in sensitivity(n, args.calibration_share, args.method,
                                                        args.dir)]
        if args.json:
            print(json.dumps(rows, indent=1))
            return 0
        print("| trace | auto's setting | within 1 + theta | mean | migration / step | "
              "within, 1st / 2nd half | mean, 1st / 2nd half |\n|---|---|---|---|---|---|---|")
        for r in rows:
            seeds = f" ({r['seeds']} seeds)" if r["seeds"] > 1 else ""
            print(f"| {r['trace']}{seeds} | {r['setting']} | {r['share_within']:.1%} | "
                  f"{r['mean_imbalance']:.3f} | {r['migration_per_step']:.2%} | "
                  f"{r['share_within_first_half']:.1%} / {r['share_within_second_half']:.1%} | "
                  f"{r['mean_imbalance_first_half']:.3f} / {r['mean_imbalance_second_half']:.3f} |")
        return 0
    if args.causal_bound:
        synthetic = [n for n in names if trace_lib.TRACES[n].archive is None]
        out = {}
        for name in synthetic:
            out[name] = causal_bound(name, args.calibration_share, args.method,
                                     lambda *a: print(*a, file=sys.stderr, flush=True))
        if args.json:
            print(json.dumps(out, indent=1, default=str))
            return 0
        for name, rows in out.items():
            print(f"\n== {name}: best over headroom of each (share within 1 + theta, mean, "
                  f"theta_plan)")
            for r in rows:
                print(f"  {r['policy']:20} {r['share_within']:6.1%}  mean "
                      f"{r['mean_imbalance']:.3f}  p90 {r['p90_imbalance']:.3f}  theta_plan "
                      f"{r['theta_plan']:g}  migration/step {r['migration_per_step']:.2%}")
        return 0
    if not 0 < args.calibration_share < 1:
        print(f"backtest_benchmark: --calibration-share must be in (0, 1), got "
              f"{args.calibration_share}", file=sys.stderr)
        return 2
    docs_img = None if args.no_docs_img else (args.docs_img or (None if args.quick
                                                                  else DEFAULT_DOCS_IMG))
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else \
        (lambda *a: print(*a, flush=True))
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results = []
    for name in names:
        try:
            res = run_trace(name, args.quick, args.method, args.calibration_share, args.dir, log)
        except trace_lib.TraceError as exc:
            print(f"backtest_benchmark: {exc}", file=sys.stderr)
            return 1
        results.append(res)
        res["steps"].to_csv(args.out / f"steps-{name}.csv", index=False)
        png = plot(res, args.out / f"backtest-{name}.png")
        if docs_img is not None:
            docs_img.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(png, docs_img / png.name)
        if not args.json:
            sec = res["seconds"]
            print(f"\n== {name}: {res['description']} ({res['stats']['windows']} windows, "
                  f"{res['stats']['keys']} keys, median {res['stats']['active_keys_median']:.0f} "
                  f"active), N = {res['n_instances']}, theta = {res['theta']:g}; judged "
                  f"{res['judged_windows']} windows from {res['judged_from']}; "
                  f"{sec['backtest']:.0f} s backtest, {sec['calibration']:.0f} s calibration")
            print(format_table(res))
            for note in res["notes"]:
                print(f"  note: {note}")
            print(format_verdicts(res))
    total = time.perf_counter() - t0
    pd.concat([r["summary"] for r in results]).to_csv(args.out / "summary.csv", index=False)
    doc = dict(command=" ".join(["python", "include/benchmarks/backtest_benchmark.py"]
                                + (argv if argv is not None else sys.argv[1:])),
               seconds=round(total, 1), traces=[_jsonable(r) for r in results])
    (args.out / "results.json").write_text(json.dumps(doc, indent=1, default=str))
    if args.json:
        print(json.dumps(doc, indent=1, default=str))
    else:
        print(f"\nwrote {args.out}/results.json, summary.csv, steps-*.csv, backtest-*.png"
              + (f"; plots copied to {docs_img}" if docs_img else "") + f"; {total:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
