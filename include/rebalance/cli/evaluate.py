"""``rebalance bench``: replay a workload over many intervals, every planner side by side.

The experiments are :mod:`rebalance.evaluation.experiments` (and the ``scale`` experiment of
:mod:`rebalance.evaluation.scale`); this module parses the command line, runs them and writes
the tables and plots. What the user sees is :data:`HELP`; the experiments and their
figures: ``docs/evaluation.md``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from rebalance.core.defaults import theta_problem

#: The experiments (``rebalance.evaluation.experiments.EXPERIMENTS`` and ``scale``), listed
#: here so that building the parser imports neither pandas nor the experiments (1 s of
#: every ``rebalance`` command's start); a test checks the two lists agree.
EXPERIMENTS = ("quick", "zipf-sweeps", "migration-budgets", "elb-clb", "hash-routings",
               "replay", "scale")


#: What ``rebalance bench --help`` says (for users).
HELP = """\
``rebalance bench``: replay a workload over many intervals, every planner side by side.

Experiments (``--experiment``):

  quick            one small point of each paper's workload (well under a minute)
  zipf-sweeps      Fang et al., Figs. 8-12: sweeps of N, theta, K, f, A_max (Zipf,
                   fluctuation)
  migration-budgets
                   Madsen et al., Figs. 2-4: MILP vs Flux-style moves under 10/20/30/40
                   migrations, 20/40/60 instances with 400/800/1200 key groups
  elb-clb          the ELB/CLB paper, Sec. 5.1: Gaussian vs Zipf substreams, ELB vs CLB
                   (amortised)
  hash-routings    the ELB/CLB paper, Sec. 5: its baselines UHLB (one universal hash) and
                   PKG (each tuple to the less-loaded of two hashed instances) and
                   D-Choices next to ELB, CLB, auto and hash at N = 10: imbalance, state
                   moved, and what merging the split keys costs; then the speedup over
                   N = 1..15
  replay           a histogram table the streaming job wrote (--histograms, --instances)
  scale            the whole `rebalance plan` command at K = 10^4 .. 10^7 keys (N = 64,
                   theta 0.02, Zipf 0.7, one window): wall, input and plan seconds, peak
                   RSS, imbalance, migration for mixed and auto, a log-log plot of time
                   against K (--keys, --runs; inputs cached in --workdir)

Writes DIR/results.csv (one row per experiment point, planner and interval),
DIR/summary.csv (one row per point and planner) and PNG plots into DIR, and prints the
summary table. Planner names: the registry's (hash, lpt, elb, clb, milp, mintable, minmig,
mixed, greedy, auto), flux, and the hash routings uhlb (one hash), pkg, dchoices and
wchoices (these three split hot keys over several instances); the routings are compared
here only, ``rebalance plan`` cannot apply them. ``name@m`` rebalances every m intervals
only.
"""

#: Refused above these: ``--keys`` of the scale experiment (memory grows with K: 10^7 keys
#: peak at about 3 GB RSS, so 5 x 10^7 stays within a 24 GiB host) and ``--intervals``
#: (each interval is a whole plan of every planner).
MAX_SCALE_KEYS = 50_000_000
MAX_INTERVALS = 100_000
#: Largest ``--seed``: it also seeds the solvers, whose seeds are C ints.
MAX_SEED = 2 ** 31 - 1
TABLE_COLUMNS = ("planner", "imbalance_before", "imbalance_after", "imbalance_next",
                 "migration_fraction", "migration_per_rebalance", "moved_keys", "table_size",
                 "plan_seconds", "lower_bound_fraction", "gap")


def add_subcommands(subparsers) -> None:
    """Add ``bench`` to the ``rebalance`` command's subparsers."""
    p = subparsers.add_parser(
        "bench", help="replay workloads and compare every planner (tables and PNG plots)",
        description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="quick", choices=EXPERIMENTS,
                   help="experiment to run (default quick)")
    p.add_argument("--planners", metavar="A,B,C",
                   help="comma-separated planners instead of the experiment's own")
    p.add_argument("--intervals", type=int, metavar="I",
                   help="intervals per workload (replay: the first I windows)")
    p.add_argument("--histograms", metavar="PATH",
                   help="replay: Delta table directory, Parquet file/directory or CSV with "
                        "window_start, key, count, cost, state_bytes")
    p.add_argument("--instances", type=int, metavar="N", help="replay: number of instances")
    p.add_argument("--theta", type=float, metavar="T",
                   help="imbalance bound instead of the experiment's (zipf-sweeps: swept)")
    p.add_argument("--time-limit", type=float, metavar="S",
                   help="seconds per plan for planners that search (milp, auto); default 2 "
                        "(quick: 0.5)")
    p.add_argument("--out", default="bench-out", metavar="DIR",
                   help="output directory (default ./bench-out)")
    p.add_argument("--seed", type=int, default=0, help="workload and solver seed (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--no-plots", action="store_true", help="write no PNG")
    p.add_argument("--keys", metavar="K1,K2",
                   help="scale: numbers of keys (default 10000,100000,1000000,10000000)")
    p.add_argument("--runs", type=int, default=3,
                   help="scale: runs of each point, the first one cold (default 3)")
    p.add_argument("--workdir", metavar="DIR",
                   help="scale: folder of the generated inputs, reused (default DIR/inputs)")
    p.set_defaults(func=run_bench)


def _check(args) -> None:
    from rebalance.cli import UserError

    if args.intervals is not None and args.intervals < 2:
        raise UserError(f"--intervals must be >= 2, got {args.intervals}")
    if args.time_limit is not None and not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise UserError(f"--time-limit must be a finite number > 0 (seconds), "
                        f"got {args.time_limit}")
    if not 0 <= args.seed <= MAX_SEED:
        raise UserError(f"--seed must be within [0, {MAX_SEED}], got {args.seed}")
    if args.theta is not None and (problem := theta_problem(args.theta, "--theta")):
        raise UserError(problem)
    if args.intervals is not None and args.intervals > MAX_INTERVALS:
        raise UserError(f"--intervals must be <= {MAX_INTERVALS}, got {args.intervals}")
    if args.experiment == "replay":
        from rebalance.core.model import MAX_INSTANCES

        if not args.histograms or args.instances is None:
            raise UserError("--experiment replay needs --histograms PATH and --instances N")
        if not 1 <= args.instances <= MAX_INSTANCES:
            raise UserError(f"--instances must be within [1, {MAX_INSTANCES}], "
                            f"got {args.instances}")
    elif args.histograms:
        raise UserError("--histograms is only used by --experiment replay")
    if args.experiment == "scale":
        if args.runs < 1:
            raise UserError(f"--runs must be >= 1, got {args.runs}")
        try:
            keys = [int(k) for k in ("1" if args.keys is None else args.keys).split(",")]
        except ValueError:
            raise UserError(f"--keys must be comma-separated integers, got {args.keys!r}") \
                from None
        if min(keys) < 1 or max(keys) > MAX_SCALE_KEYS:
            raise UserError(f"--keys must be within [1, {MAX_SCALE_KEYS}], got {args.keys!r}")
        if args.planners is not None:
            from rebalance.core.planner_names import METHODS

            names = [m.strip() for m in args.planners.split(",")]
            unknown = [m for m in names if m not in METHODS]
            if unknown or not names:
                raise UserError(f"unknown planner {(unknown or [''])[0]!r} for --experiment "
                                f"scale (it runs `rebalance plan --method`); choose from "
                                f"{', '.join(METHODS)}")
        if args.workdir is not None:
            from rebalance.cli.plan import check_out_dir

            workdir = Path(args.workdir)
            if not args.workdir or (workdir.exists() and not workdir.is_dir()):
                raise UserError(f"--workdir {args.workdir!r} is not a directory")
            check_out_dir(workdir)
    elif args.planners is not None:
        from rebalance.core.model import PlanningError
        from rebalance.evaluation.runner import parse_planners

        try:
            parse_planners(args.planners)
        except PlanningError as exc:
            raise UserError(f"--planners: {exc}") from None
    if args.runs < 1:
        raise UserError(f"--runs must be >= 1, got {args.runs}")
    from rebalance.cli.plan import check_out_dir

    if not args.out:
        raise UserError("--out is empty: name the folder for the results")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    check_out_dir(out)


def format_table(summary, columns=TABLE_COLUMNS) -> str:
    """The summary as an aligned text table, one block per experiment point."""
    if summary.empty:
        return "(no results)"
    labels = [c for c in ("sweep", "distribution", "N", "G", "K", "f", "theta", "A_max",
                          "varies", "budget") if c in summary.columns]
    cols = [c for c in columns if c in summary.columns]
    lines = []
    for _, block in summary.groupby("point", sort=True):
        head = ", ".join(f"{c}={_fmt(block[c].iloc[0])}" for c in labels
                         if not _missing(block[c].iloc[0]))
        lines.append(f"[{head}]")
        rows = [[_fmt(v) for v in r] for r in block[cols].itertuples(index=False)]
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        lines.append("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
        lines.extend("  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows)
        lines.append("")
    return "\n".join(lines).rstrip()


#: hash-routings: the N = 10 table's columns (see ``format_hash_routings``).
BASELINE_COLUMNS = (("planner", "planner", 1), ("imbalance", "imbalance_next", 1),
                    ("worst", "imbalance_next_max", 1), ("var/mean^2", "load_var_next", 1),
                    ("moved %/window", "migration_fraction", 100),
                    ("moved %/rebalance", "migration_per_rebalance", 100),
                    ("split keys", "split_keys", 1), ("extra partials", "extra_partials", 1),
                    ("merged %/window", "consolidation_fraction", 100),
                    ("d", "choices", 1), ("speedup", "speedup", 1))


def format_hash_routings(summary) -> str:
    """hash-routings: one table per N = 10 stream, then speedup against N."""
    if summary.empty:
        return "(no results)"
    lines = []
    n10 = summary[summary["sweep"] == "n10"]
    for _, block in n10.groupby("point", sort=True):
        first = block.iloc[0]
        lines.append(f"[N={_fmt(first['N'])}: {first['stream']}, {first['distribution']}, "
                     f"{_fmt(first['p'])} keys, theta={_fmt(first['theta'])}, "
                     f"{_fmt(first['intervals'])} windows]")
        cols = [c for c in BASELINE_COLUMNS if c[1] in block.columns]
        rows = [[_fmt(r[c] * scale if scale != 1 else r[c]) for _, c, scale in cols]
                for _, r in block.iterrows()]
        lines.extend(_aligned([h for h, _, _ in cols], rows))
        lines.append("")
    speed = summary[summary["sweep"] == "speedup"]
    if not speed.empty:
        first = speed.iloc[0]
        lines.append(f"[speedup = sum of window loads / sum of the largest instance's load "
                     f"(1 instance = 1): {first['stream']}, {first['distribution']}, "
                     f"{_fmt(first['p'])} keys, {_fmt(first['intervals'])} windows per N]")
        table = speed.pivot_table(index="N", columns="planner", values="speedup", sort=False)
        planners = list(dict.fromkeys(speed["planner"]))
        rows = [[_fmt(n), _fmt(n)] + [f"{table.loc[n, p]:.2f}" for p in planners]
                for n in table.index]
        lines.extend(_aligned(["N", "ideal", *planners], rows))
    return "\n".join(lines).rstrip()


def _aligned(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    return ["  ".join(v.rjust(w) for v, w in zip(line, widths)) for line in [header, *rows]]


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _fmt(value) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()
                                  and abs(value) >= 1):
        return str(int(value))
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.4g}"
    return str(value)


def run_bench(args) -> int:
    _check(args)
    out = Path(args.out)
    created = not out.exists()
    try:
        if args.experiment == "scale":
            return run_scale_bench(args)
        return _run_experiment(args)
    finally:
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a run that wrote nothing leaves no empty --out behind


def _run_experiment(args) -> int:
    from tqdm import tqdm

    from rebalance.evaluation.experiments import Settings, build, run, summarise, total_steps
    from rebalance.evaluation.plots import plot_experiment

    settings = Settings(planners=args.planners, intervals=args.intervals, seed=args.seed,
                        time_limit=args.time_limit, histograms=args.histograms,
                        instances=args.instances, theta=args.theta)
    points = build(args.experiment, settings)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    disable = args.no_progress or not sys.stderr.isatty()
    t0 = time.perf_counter()
    with tqdm(total=total_steps(points), desc=f"bench {args.experiment}", unit="plan",
              disable=disable, file=sys.stderr) as bar:
        results = run(args.experiment, points, progress=bar.update)
    summary = summarise(results)
    results.to_csv(out / "results.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    pngs = [] if args.no_plots else plot_experiment(args.experiment, results, summary, out)
    print(format_hash_routings(summary) if args.experiment == "hash-routings"
          else format_table(summary))
    print(f"\n{len(results)} rows, {len(points)} point(s), {time.perf_counter() - t0:.1f} s; "
          f"wrote {out / 'results.csv'}, {out / 'summary.csv'}"
          + (f" and {len(pngs)} PNG(s)" if pngs else ""))
    return 0


def run_scale_bench(args) -> int:
    """``--experiment scale``: see :mod:`rebalance.evaluation.scale`."""
    import csv

    from rebalance.evaluation.scale import SCALE_KEYS, format_scale, plot_scale, run_scale, summarise_scale

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keys = [int(k) for k in args.keys.split(",")] if args.keys else list(SCALE_KEYS)
    workdir = Path(args.workdir) if args.workdir else out / "inputs"
    methods = args.planners.split(",") if args.planners else None
    t0 = time.perf_counter()
    rows = run_scale(workdir, keys=keys, runs=args.runs,
                     **({"methods": methods} if methods else {}),
                     progress=None if args.no_progress else
                     (lambda line: print(line, file=sys.stderr, flush=True)))
    summary = summarise_scale(rows)
    for name, data in (("results.csv", rows), ("summary.csv", summary)):
        columns = list(dict.fromkeys(c for r in data for c in r))
        with open(out / name, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=columns)
            writer.writeheader()
            writer.writerows(data)
    png = None if args.no_plots else plot_scale(summary, out / "scale.png")
    print(format_scale(summary))
    print(f"\n{len(rows)} runs, {time.perf_counter() - t0:.1f} s; wrote {out / 'results.csv'}, "
          f"{out / 'summary.csv'}" + (f" and {png}" if png else ""))
    return 0
