"""How well simple forecasts predict a trace's per-key counts (a script, not a test).

    .venv/bin/python include/benchmarks/forecast_error.py --trace nyc-tailnum

For every window ``t`` with four weeks of windows before it and a week after, each forecast
of the window's per-key counts is compared with the counts themselves: the L1 error summed
over keys, divided by the window's total. Forecasts: the window before; the mean of the
``W`` windows before and of the ``W`` windows after (``W`` = ``ORACLE_WINDOWS``, 3: the
windows after are what the backtest's distribution oracle plans on); the mean of the
``--period`` windows before; the same slot one period before; the mean of that slot over
the four periods before. Also printed: events and active keys per window, the share of a
window's events from keys inactive in the period before, and the correlation of a key's
count with its count 1, 2, 3, ``period`` and ``2 * period`` windows before.
Traces come from :mod:`traces` (``.venv/bin/python include/benchmarks/traces.py fetch``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from rebalance.core.backtest import ORACLE_WINDOWS, WindowHistory

sys.path.insert(0, str(Path(__file__).resolve().parent))

import traces as trace_lib  # noqa: E402  (the sibling script)


def count_matrix(name: str) -> np.ndarray:
    """Windows x keys counts of a trace, windows in time order (the backtest's own
    :class:`~rebalance.core.backtest.WindowHistory` loads: a trace's load is its count)."""
    return WindowHistory.from_counts(trace_lib.load(name)).loads


def forecast_errors(counts: np.ndarray, period: int) -> dict[str, float]:
    """Mean over windows of sum_k |forecast - count| / window total, per forecast."""
    n = counts.shape[0]
    if n < 5 * period + 2:
        raise SystemExit(f"forecast_error: {n} windows, at least {5 * period + 2} needed "
                         f"for period {period}")
    totals = counts.sum(axis=1)
    w = ORACLE_WINDOWS
    forecasts = {
        "the window before": lambda t: counts[t - 1],
        f"the mean of the {w} windows before": lambda t: counts[t - w:t].mean(0),
        f"the mean of the {w} windows after (the distribution oracle's)":
            lambda t: counts[t + 1:t + 1 + w].mean(0),
        f"the mean of the {period} windows before": lambda t: counts[t - period:t].mean(0),
        "the same slot one period before": lambda t: counts[t - period],
        "the same slot, mean over the four periods before":
            lambda t: counts[[t - period * i for i in range(1, 5)]].mean(0),
    }
    judged = [t for t in range(4 * period, n - max(period, w) - 1) if totals[t] > 0]
    return {label: float(np.mean([np.abs(counts[t] - f(t)).sum() / totals[t] for t in judged]))
            for label, f in forecasts.items()}


def activity(counts: np.ndarray, period: int) -> dict[str, float]:
    totals = counts.sum(axis=1)
    active = counts > 0
    new = [counts[t][~active[t - period:t].any(axis=0)].sum() / totals[t]
           for t in range(period, counts.shape[0]) if totals[t] > 0]
    out = {"events per window": float(totals.mean()),
           "active keys per window": float(active.sum(axis=1).mean()),
           "events per active key": float(counts[active].mean()),
           "largest count": float(counts.max()),
           f"share of events from keys inactive in the {period} windows before": float(np.mean(new))}
    for lag in sorted({1, 2, 3, period, 2 * period}):
        out[f"correlation with the count {lag} window(s) before"] = float(
            np.corrcoef(counts[lag:].ravel(), counts[:-lag].ravel())[0, 1])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", default="nyc-tailnum", help=f"one of {', '.join(trace_lib.TRACES)}")
    p.add_argument("--period", type=int, default=7, help="windows per period (7 for daily windows)")
    args = p.parse_args(argv)
    if args.trace not in trace_lib.TRACES:
        print(f"forecast_error: unknown trace {args.trace!r}; known: "
              f"{', '.join(trace_lib.TRACES)}", file=sys.stderr)
        return 2
    if args.period < 1:
        print(f"forecast_error: --period must be >= 1, got {args.period}", file=sys.stderr)
        return 2
    try:
        counts = count_matrix(args.trace)
    except trace_lib.TraceError as exc:
        print(f"forecast_error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.trace}: {counts.shape[0]} windows, {counts.shape[1]} keys")
    for label, value in activity(counts, args.period).items():
        print(f"  {label}: {value:.3f}")
    print("per-key L1 error / window total, by forecast:")
    for label, value in forecast_errors(counts, args.period).items():
        print(f"  {value:.3f}  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
