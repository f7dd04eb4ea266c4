"""PNG plots of a ``rebalance bench`` run (matplotlib, Agg backend, no display)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

STYLES = ("o-", "s-", "^-", "D-", "v-", "x-", "*-", "P-")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    _pyplot().close(fig)
    return path


def _lines(ax, frame: pd.DataFrame, x: str, y: str, by: str = "planner", logx: bool = False,
           label_suffix: str = "", style_offset: int = 0) -> None:
    for i, (name, grp) in enumerate(frame.groupby(by, sort=False)):
        grp = grp.sort_values(x)
        ax.plot(grp[x], grp[y], STYLES[(i + style_offset) % len(STYLES)],
                label=f"{name}{label_suffix}", markersize=4)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(x)
    ax.grid(alpha=0.3)


def plot_sweeps(summary: pd.DataFrame, out: Path, prefix: str = "zipf_sweeps") -> list[Path]:
    """One figure per swept parameter: imbalance, migration and plan time vs the parameter."""
    plt = _pyplot()
    paths = []
    for sweep, grp in summary.groupby("sweep", sort=False):
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
        logx = sweep == "K"
        for ax, y, title in zip(axes, ("imbalance_after", "migration_fraction", "plan_seconds"),
                                ("imbalance after plan (max/mean)", "migration (fraction of state)",
                                 "plan time (s)")):
            _lines(ax, grp, sweep, y, logx=logx)
            ax.set_title(title)
        axes[2].set_yscale("log")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"Zipf workload: sweep of {sweep} (other parameters at their defaults)")
        paths.append(_save(fig, out / f"{prefix}_{sweep}.png"))
    return paths


def plot_budgets(summary: pd.DataFrame, out: Path,
                 prefix: str = "migration_budgets") -> list[Path]:
    """Load distance after the plan vs the migration budget, one panel per cluster."""
    plt = _pyplot()
    clusters = summary[["N", "G"]].drop_duplicates().sort_values("N").to_numpy().tolist()
    fig, axes = plt.subplots(2, len(clusters), figsize=(4.3 * len(clusters), 6.4),
                             squeeze=False)
    for j, (n, g) in enumerate(clusters):
        sub = summary[(summary["N"] == n) & (summary["G"] == g)]
        for row, y, title in ((0, "imbalance_after", "max/mean - 1"),
                              (1, "load_distance_after", "max |L - mean| / mean")):
            ax = axes[row][j]
            for k, (var, vgrp) in enumerate(sub.groupby("varies", sort=True)):
                vgrp = vgrp.assign(_y=vgrp[y] - (1.0 if y == "imbalance_after" else 0.0))
                _lines(ax, vgrp, "budget", "_y", label_suffix=f" varies={var:g}",
                       style_offset=3 * k)
            ax.set_title(f"N={int(n)}, {int(g)} key groups: {title}", fontsize=9)
            ax.set_xlabel("migration budget (key groups)")
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Load distance after one plan under a migration budget")
    return [_save(fig, out / f"{prefix}.png")]


def plot_elb_clb(results: pd.DataFrame, summary: pd.DataFrame, out: Path,
                 prefix: str = "elb_clb", n_show: int | None = None) -> list[Path]:
    """Realised load variance over time (Gaussian vs Zipf) and state movement per planner."""
    plt = _pyplot()
    paths = []
    ns = sorted(results["N"].unique())
    n_show = n_show if n_show in ns else ns[len(ns) // 2]
    thetas = sorted(results["theta"].unique())
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), sharey=True)
    for ax, dist in zip(axes, ("gaussian", "zipf")):
        sub = results[(results["distribution"] == dist) & (results["N"] == n_show)
                      & (results["theta"] == thetas[0])]
        for i, (name, grp) in enumerate(sub.groupby("planner", sort=False)):
            ax.plot(grp["interval"], grp["load_var_next"], STYLES[i % len(STYLES)][1:],
                    label=name, linewidth=1)
        ax.set_yscale("log")
        ax.set_title(f"{dist}, N={n_show}, theta={thetas[0]:g}: var(L_t)/mean^2", fontsize=9)
        ax.set_xlabel("window t")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    paths.append(_save(fig, out / f"{prefix}_variance.png"))

    fig, axes = plt.subplots(len(thetas), 2, figsize=(12, 3.4 * len(thetas)), squeeze=False)
    width = 0.38
    for r, theta in enumerate(thetas):
        sub = summary[(summary["N"] == n_show) & (summary["theta"] == theta)]
        planners = list(dict.fromkeys(sub["planner"]))
        for ax, dist in zip(axes[r], ("gaussian", "zipf")):
            d = sub[sub["distribution"] == dist].set_index("planner").reindex(planners)
            x = np.arange(len(planners))
            ax.bar(x - width / 2, 100 * d["migration_per_rebalance"], width,
                   label="per rebalance")
            ax.bar(x + width / 2, 100 * d["migration_fraction"], width,
                   label="amortised per window")
            ax.set_xticks(x, planners)
            ax.set_ylabel("state moved (%)")
            ax.set_title(f"{dist}, N={n_show}, theta={theta:g}", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
    axes[0][0].legend(fontsize=7)
    paths.append(_save(fig, out / f"{prefix}_movement.png"))
    return paths


def plot_hash_routings(summary: pd.DataFrame, out: Path,
                       prefix: str = "hash_routings") -> list[Path]:
    """N = 10: realised imbalance and state moved / merged per planner and stream; then
    the speedup against N with the ideal line."""
    plt = _pyplot()
    paths = []
    n10 = summary[summary["sweep"] == "n10"]
    if not n10.empty:
        points = list(dict.fromkeys(n10["point"]))
        fig, axes = plt.subplots(2, len(points), figsize=(4.6 * len(points), 6.4),
                                 squeeze=False)
        for j, point in enumerate(points):
            s = n10[n10["point"] == point]
            title = f"{s['stream'].iloc[0]}, {s['distribution'].iloc[0]}, N={s['N'].iloc[0]}"
            x = np.arange(len(s))
            axes[0][j].bar(x, s["imbalance_next"])
            axes[0][j].set_title(f"{title}: imbalance (max/mean)", fontsize=9)
            ax = axes[1][j]
            ax.bar(x - 0.2, 100 * s["migration_fraction"], 0.4, label="moved per window")
            ax.bar(x + 0.2, 100 * s.get("consolidation_fraction", 0 * x), 0.4,
                   label="merged per window (split keys)")
            ax.set_title(f"{title}: state (%)", fontsize=9)
            for ax in (axes[0][j], axes[1][j]):
                ax.set_xticks(x, s["planner"], rotation=30, fontsize=7)
                ax.grid(alpha=0.3, axis="y")
        axes[1][0].legend(fontsize=7, loc="upper left")
        paths.append(_save(fig, out / f"{prefix}_n10.png"))
    speed = summary[summary["sweep"] == "speedup"]
    if not speed.empty:
        fig, ax = plt.subplots(figsize=(6.4, 4.4))
        ns = sorted(set(speed["N"]))
        ax.plot(ns, ns, "k--", label="ideal")
        _lines(ax, speed, "N", "speedup")
        ax.set_ylabel("speedup (total load / largest instance load)")
        ax.legend(fontsize=7)
        paths.append(_save(fig, out / f"{prefix}_speedup.png"))
    return paths


def plot_generic(results: pd.DataFrame, summary: pd.DataFrame, out: Path,
                 prefix: str) -> list[Path]:
    """Per point: imbalance on the next window over time, and mean migration per planner."""
    plt = _pyplot()
    points = list(dict.fromkeys(results["point"]))
    fig, axes = plt.subplots(2, len(points), figsize=(4.5 * len(points), 6.4), squeeze=False)
    for j, p in enumerate(points):
        sub = results[results["point"] == p]
        label = str(sub["sweep"].iloc[0]) if "sweep" in sub else f"point {p}"
        ax = axes[0][j]
        for i, (name, grp) in enumerate(sub.groupby("planner", sort=False)):
            ax.plot(grp["interval"], grp["imbalance_next"], STYLES[i % len(STYLES)],
                    label=name, markersize=3)
        ax.set_title(f"{label}: imbalance on the next window", fontsize=9)
        ax.set_xlabel("interval")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
        s = summary[summary["point"] == p]
        ax = axes[1][j]
        ax.bar(s["planner"], 100 * s["migration_fraction"])
        ax.set_title(f"{label}: state moved per interval (%)", fontsize=9)
        ax.tick_params(axis="x", labelsize=7, rotation=30)
        ax.grid(alpha=0.3, axis="y")
    return [_save(fig, out / f"{prefix}_overview.png")]


def plot_experiment(experiment: str, results: pd.DataFrame, summary: pd.DataFrame,
                    out: str | Path) -> list[Path]:
    """Every PNG of ``experiment`` into ``out``; returns their paths, named after the
    experiment (``zipf_sweeps_N.png``, ...)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if results.empty:
        return []
    if experiment == "zipf-sweeps":
        return plot_sweeps(summary, out)
    if experiment == "migration-budgets":
        return plot_budgets(summary, out)
    if experiment == "elb-clb":
        return plot_elb_clb(results, summary, out)
    if experiment == "hash-routings":
        return plot_hash_routings(summary, out)
    return plot_generic(results, summary, out, experiment.replace("-", "_"))
