"""Planner registry: one name per planner, one module each.

>>> from rebalance.core.planners import get_planner
>>> get_planner("mixed").plan(problem, PlanParams(theta=0.08))  # doctest: +SKIP
"""

from __future__ import annotations

from importlib import import_module

from rebalance.core.model import PlanningError
from rebalance.core.planner_names import _REGISTRY, METHODS
from rebalance.core.planners.base import Planner, Proposal, finish_plan


def get_planner(name: str) -> Planner:
    """A new planner instance by method name (see ``METHODS``)."""
    try:
        target = _REGISTRY[name]
    except KeyError:
        raise PlanningError(
            f"unknown method {name!r}; choose one of {', '.join(METHODS)}") from None
    module, cls = target.split(":")
    return getattr(import_module(f"{__name__}.{module}"), cls)()


__all__ = ["METHODS", "Planner", "Proposal", "finish_plan", "get_planner"]
