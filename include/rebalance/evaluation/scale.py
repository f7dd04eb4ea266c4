"""``rebalance bench --experiment scale``: the whole ``rebalance plan`` command from K = 10^4
to 10^7 keys, as a user runs it (process start to files written).

Workload: one window of Fang et al.'s Zipf loads (z = 0.7, the keys ``k0 .. k{K-1}`` of
:mod:`rebalance.core.synthetic`, seed 0), N = 64, theta = 0.02, as a Parquet file with the
streaming job's columns, and an assignment file that lists **every** key
(:data:`MOVED_SHARE` of them off their default instance). Each K is planned without
(``default``) and with (``assignment``: every key's name must be matched) that file, by
``mixed`` and ``auto``, each run a fresh ``rebalance plan`` process; per run the wall and
CPU time, peak RSS, the machine's load average (the machine may be shared: wall time
follows the load) and ``plan.json``'s timings, imbalance and migration are recorded.
Inputs are cached in ``--workdir`` (``<workdir>/K<K>/``): generating 10^7 keys is not
what is measured. The experiment and its figures: ``docs/evaluation.md`` and
``docs/planning.md``, "Scale".
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

SCALE_KEYS = (10_000, 100_000, 1_000_000, 10_000_000)
SCALE_METHODS = ("mixed", "auto")
SCALE_PLACEMENTS = ("default", "assignment")
SCALE_INSTANCES = 64
SCALE_THETA = 0.02
SCALE_ZIPF = 0.7
#: Events per window per key on average: the coldest of 10^7 Zipf(0.7) keys still has a
#: few events, so ``count`` is never 0 (a histogram only lists keys that had events).
EVENTS_PER_KEY = 10.0
#: Share of the keys the assignment file puts off their default instance.
MOVED_SHARE = 0.01
#: The command's targets: (K, placement) -> (wall seconds, peak MB).
TARGETS = {
    (1_000_000, "default"): (2.0, 600.0),
    (1_000_000, "assignment"): (3.0, 600.0),
    (10_000_000, "default"): (20.0, 6144.0),
    (10_000_000, "assignment"): (20.0, 6144.0),
}
WINDOW_START = "2026-01-01T00:00:00"


def input_paths(workdir: Path, n_keys: int) -> tuple[Path, Path]:
    folder = Path(workdir) / f"K{n_keys}"
    return folder / "histograms.parquet", folder / "assignment.parquet"


def write_inputs(workdir: Path, n_keys: int, n_instances: int = SCALE_INSTANCES,
                 zipf: float = SCALE_ZIPF, seed: int = 0) -> tuple[Path, Path]:
    """The histogram and assignment files of K keys (written once, then reused)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rebalance.core.placement import default_instances
    from rebalance.core.synthetic import SyntheticConfig, SyntheticWorkload, rank_frequencies

    hist, assign = input_paths(workdir, n_keys)
    if hist.exists() and assign.exists():
        return hist, assign
    hist.parent.mkdir(parents=True, exist_ok=True)
    config = SyntheticConfig(n_keys=n_keys, n_instances=n_instances, zipf=zipf, seed=seed,
                             events_per_interval=EVENTS_PER_KEY * n_keys)
    load = rank_frequencies(n_keys, zipf, seed) * config.events_per_interval
    factor = SyntheticWorkload(config).size_factor
    keys = pa.array([f"k{i}" for i in range(n_keys)], type=pa.string())
    count = np.maximum(1, np.round(load)).astype(np.int64)
    state = np.round(config.key_overhead + config.bytes_per_event * count * factor)
    start = np.full(n_keys, np.datetime64(WINDOW_START, "us"))
    table = pa.table({"window_start": pa.array(start, type=pa.timestamp("us", tz="UTC")),
                      "key": keys, "count": count, "cost": load,
                      "state_bytes": state.astype(np.int64)})
    tmp = hist.with_suffix(".tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, hist)
    rng = np.random.default_rng([seed, 11])
    instance = default_instances(keys, n_instances)
    moved = rng.random(n_keys) < MOVED_SHARE
    instance[moved] = (instance[moved] + rng.integers(1, n_instances, int(moved.sum()))) \
        % n_instances
    tmp = assign.with_suffix(".tmp")
    pq.write_table(pa.table({"key": keys, "instance": instance.astype(np.int64)}), tmp)
    os.replace(tmp, assign)
    return hist, assign


def rebalance_command() -> list[str]:
    """The ``rebalance`` console script next to this Python, else ``python -m rebalance.cli``."""
    script = Path(sys.executable).parent / "rebalance"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rebalance.cli"]


def run_measured(argv: Sequence[str], timeout: float | None = None) -> dict[str, Any]:
    """Run ``argv``; wall seconds, peak RSS (MB) of that process, exit code, stdout, stderr.

    Output goes to temporary files (not pipes), so the child is reaped with ``os.wait4``,
    which returns its own ``ru_maxrss``.
    """
    import tempfile

    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        t0 = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=fo, stderr=fe)
        deadline = None if timeout is None else t0 + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG if deadline else 0)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                deadline = None
            time.sleep(0.005)
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        fo.seek(0)
        fe.seek(0)
        return {"wall": wall, "peak_mb": usage.ru_maxrss / 1024.0, "code": proc.returncode,
                "cpu": usage.ru_utime + usage.ru_stime, "load": os.getloadavg()[0],
                "stdout": fo.read().decode("utf-8", "replace"),
                "stderr": fe.read().decode("utf-8", "replace")}


def plan_once(hist: Path, assignment: Path | None, method: str, out: Path,
              n_instances: int = SCALE_INSTANCES, theta: float = SCALE_THETA,
              time_limit: float = 10.0) -> dict[str, Any]:
    """One ``rebalance plan`` process and its figures."""
    argv = [*rebalance_command(), "plan", "--histograms", str(hist),
            "--instances", str(n_instances), "--method", method, "--theta", str(theta),
            "--time-limit", str(time_limit), "--out", str(out)]
    if assignment is not None:
        argv += ["--assignment", str(assignment)]
    run = run_measured(argv)
    row = {"wall": run["wall"], "cpu_seconds": run["cpu"], "peak_mb": run["peak_mb"],
           "code": run["code"], "load": run["load"]}
    if run["code"] != 0:
        row["error"] = (run["stderr"].strip().splitlines() or ["?"])[-1]
        return row
    doc = json.loads((Path(out) / "plan.json").read_text())
    m, timings = doc["metrics"], doc.get("timings", {})
    row.update(plan_seconds=m["plan_seconds"], imbalance=m["imbalance_after"],
               migration=m["migration_fraction"], moved_keys=m["moved_keys"],
               feasible=doc["feasible"], planner=doc["planner"],
               input_seconds=timings.get("input_seconds", float("nan")),
               write_seconds=timings.get("write_seconds", float("nan")),
               startup_seconds=timings.get("startup_seconds", float("nan")))
    return row


def run_scale(workdir: Path, keys: Sequence[int] = SCALE_KEYS,
              methods: Sequence[str] = SCALE_METHODS,
              placements: Sequence[str] = SCALE_PLACEMENTS, runs: int = 3,
              progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every (K, placement, method), ``runs`` times each (the first run is cold).

    Unknown methods or placements and a ``workdir`` that is a file are refused
    (``ValueError``) before any input is generated: an unknown method would otherwise
    give a row of NaN per run."""
    from rebalance.core.planner_names import METHODS

    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    if any(p not in SCALE_PLACEMENTS for p in placements):
        raise ValueError(f"placements must be among {', '.join(SCALE_PLACEMENTS)}, "
                         f"got {list(placements)}")
    if Path(workdir).exists() and not Path(workdir).is_dir():
        raise ValueError(f"workdir {workdir} is not a directory")
    rows = []
    for k in keys:
        t0 = time.perf_counter()
        hist, assign = write_inputs(workdir, k)
        if progress:
            progress(f"K={k}: inputs ready ({time.perf_counter() - t0:.1f} s)")
        for placement in placements:
            for method in methods:
                for i in range(runs):
                    out = Path(workdir) / f"K{k}" / f"plan-{placement}-{method}"
                    row = plan_once(hist, assign if placement == "assignment" else None,
                                    method, out)
                    row.update(K=k, placement=placement, method=method, run=i)
                    rows.append(row)
                    if progress:
                        progress(_run_line(row))
    return rows


def _run_line(r: dict[str, Any]) -> str:
    if r.get("code"):
        return (f"K={r['K']} {r['placement']} {r['method']} run {r['run']}: "
                f"exit {r['code']}: {r.get('error')}")
    return (f"K={r['K']} {r['placement']} {r['method']} run {r['run']}: wall {r['wall']:.2f} s, "
            f"CPU {r['cpu_seconds']:.2f} s, input {r['input_seconds']:.2f} s, plan "
            f"{r['plan_seconds']:.2f} s, peak {r['peak_mb']:.0f} MB, load {r['load']:.1f}")


def summarise_scale(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Median and worst run of each (K, placement, method), with the targets' verdicts."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["K"], r["placement"], r["method"]), []).append(r)
    out = []
    for (k, placement, method), grp in groups.items():
        ok = [r for r in grp if not r.get("code")]
        s: dict[str, Any] = {"K": k, "placement": placement, "method": method, "runs": len(grp),
                             "failed": len(grp) - len(ok)}
        for col in ("wall", "cpu_seconds", "input_seconds", "plan_seconds", "write_seconds",
                    "peak_mb", "load"):
            vals = [float(r[col]) for r in ok if col in r]
            s[col] = statistics.median(vals) if vals else float("nan")
            s[f"{col}_max"] = max(vals) if vals else float("nan")
        if ok:
            s.update(imbalance=ok[0]["imbalance"], migration=ok[0]["migration"],
                     feasible=ok[0]["feasible"])
        target = TARGETS.get((k, placement))
        if target and ok:
            s["target"] = f"<= {target[0]:g} s, <= {target[1]:g} MB"
            s["pass"] = s["wall_max"] <= target[0] and s["peak_mb_max"] <= target[1]
            s["pass_median"] = s["wall"] <= target[0] and s["peak_mb_max"] <= target[1]
        out.append(s)
    return out


def format_scale(summary: Sequence[dict[str, Any]]) -> str:
    """A Markdown table: median (worst) of each figure."""
    head = ("| K | placement | method | wall s | CPU s | input s | plan_seconds | write s | "
            "peak MB | imbalance | migration | load | target |")
    lines = [head, "|" + "---|" * 13]
    for s in summary:
        def mw(col, fmt):
            return f"{s[col]:{fmt}} ({s[col + '_max']:{fmt}})"
        verdict = ""
        if "pass" in s:
            verdict = ("PASS" if s["pass"] else "PASS (median)" if s["pass_median"] else "FAIL") \
                + f" {s['target']}"
        imb = f"{s['imbalance']:.4f}" if "imbalance" in s else "-"
        mig = f"{s['migration']:.4%}" if "migration" in s else "-"
        lines.append(f"| {s['K']:.0e} | {s['placement']} | {s['method']} | {mw('wall', '.2f')} | "
                     f"{mw('cpu_seconds', '.2f')} | {mw('input_seconds', '.2f')} | "
                     f"{mw('plan_seconds', '.2f')} | {mw('write_seconds', '.2f')} | "
                     f"{mw('peak_mb', '.0f')} | {imb} | {mig} | {s['load']:.1f} | {verdict} |")
    return "\n".join(lines)


def plot_scale(summary: Sequence[dict[str, Any]], path: Path) -> Path:
    """Log-log plot of median wall, input and plan time against K (one panel per placement)."""
    from rebalance.evaluation.plots import _pyplot, _save

    plt = _pyplot()
    placements = [p for p in SCALE_PLACEMENTS if any(s["placement"] == p for s in summary)]
    fig, axes = plt.subplots(1, len(placements), figsize=(6 * len(placements), 4.2),
                             squeeze=False, sharey=True)
    for ax, placement in zip(axes[0], placements):
        for method, style in zip(SCALE_METHODS, ("-", "--")):
            pts = sorted((s for s in summary if s["placement"] == placement
                          and s["method"] == method), key=lambda s: s["K"])
            if not pts:
                continue
            ks = [s["K"] for s in pts]
            for col, marker, label in (("wall", "o", "wall (whole command)"),
                                       ("cpu_seconds", "x", "CPU, user + system"),
                                       ("input_seconds", "s", "input (read + aggregate)"),
                                       ("plan_seconds", "^", "plan_seconds (planner)")):
                ax.plot(ks, [s[col] for s in pts], marker=marker, linestyle=style,
                        markersize=4, label=f"{method}: {label}")
        ref = [k for k in SCALE_KEYS]
        ax.plot(ref, [k / 1e6 for k in ref], ":", color="grey", label="slope 1 (1 s at 10^6)")
        for (k, p), (wall, _) in TARGETS.items():
            if p == placement:
                ax.plot([k], [wall], "r_", markersize=14)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("keys K")
        where = "explicit assignment" if placement == "assignment" else "default placement"
        ax.set_title(f"rebalance plan, N = {SCALE_INSTANCES}, theta = {SCALE_THETA}, {where}",
                     fontsize=9)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("seconds (median of runs; red: target)")
    axes[0][0].legend(fontsize=7)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return _save(fig, path)
