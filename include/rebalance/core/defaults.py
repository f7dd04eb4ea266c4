"""Defaults and checks of the settings every layer shares, defined once (no numpy, so the
CLI's argument parser can import them cheaply)."""

from __future__ import annotations

import math
from typing import Any

#: The default imbalance bound: every instance load <= (1 + theta) x mean load. The
#: planner, the CLI and the DAG's Params all take it from here.
DEFAULT_THETA = 0.1

#: How the DAG makes a plan live (run param ``apply_mode``; the reasons:
#: :func:`rebalance.control.rollout.resolve_mode`).
APPLY_MODES = ("auto", "broadcast", "restart", "dry-run")


def theta_problem(value: Any, what: str = "theta") -> str | None:
    """Why ``value`` is not a valid theta (a finite number > 0), or None when it is."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or not (math.isfinite(value) and value > 0):
        return f"{what} must be a number > 0, got {value!r}"
    return None
