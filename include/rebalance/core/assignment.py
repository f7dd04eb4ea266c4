"""A routing table's entries, checked: whole keys (key -> instance) and split keys
(key -> {instance: share}). Pure Python: :mod:`rebalance.spark.tables` publishes what
these functions accept, and the planning side can check a plan the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral


class AssignmentError(ValueError):
    """An assignment cannot be published or read (bad routing, wrong instance count)."""


#: How far a split key's shares may sum from 1 (they are then scaled to sum to 1).
SHARE_SUM_TOLERANCE = 1e-6


def validate_routing(routing: Mapping[str, int], n_instances: int) -> dict[str, int]:
    """Check a routing table (key -> instance) and return it as a plain sorted dict."""
    if isinstance(n_instances, bool) or not isinstance(n_instances, Integral) or n_instances < 1:
        raise AssignmentError(f"n_instances must be an integer >= 1, got {n_instances!r}")
    out: dict[str, int] = {}
    for key, instance in routing.items():
        if not isinstance(key, str) or not key:
            raise AssignmentError(f"routing keys must be non-empty strings, got {key!r}")
        if isinstance(instance, bool) or int(instance) != instance:
            raise AssignmentError(f"instance of key {key!r} must be an integer, got {instance!r}")
        if not 0 <= int(instance) < n_instances:
            raise AssignmentError(
                f"instance of key {key!r} is {instance}, outside [0, {n_instances})")
        out[key] = int(instance)
    return dict(sorted(out.items()))


def validate_splits(splits: Mapping[str, Mapping[int, float]] | None,
                    n_instances: int) -> dict[str, dict[int, float]]:
    """Check split keys (key -> {instance: share}) and return them as plain sorted dicts:
    at least two distinct instances in ``[0, N)``, every share > 0, summing to 1."""
    out: dict[str, dict[int, float]] = {}
    for key, parts in (splits or {}).items():
        if not isinstance(key, str) or not key:
            raise AssignmentError(f"split keys must be non-empty strings, got {key!r}")
        if not isinstance(parts, Mapping) or len(parts) < 2:
            raise AssignmentError(f"split key {key!r} needs at least two instances with "
                                  f"shares, got {parts!r}")
        clean: dict[int, float] = {}
        for instance, share in parts.items():
            if isinstance(instance, bool) or not isinstance(instance, Integral) \
                    or not 0 <= int(instance) < n_instances:
                raise AssignmentError(f"split key {key!r}: instance {instance!r} is not an "
                                      f"integer in [0, {n_instances})")
            try:
                share = float(share)
            except (TypeError, ValueError):
                share = float("nan")
            if not share > 0 or share != share or share == float("inf"):
                raise AssignmentError(f"split key {key!r}: the share of instance {instance} "
                                      f"must be > 0, got {share!r}")
            clean[int(instance)] = share
        total = sum(clean.values())
        if abs(total - 1.0) > SHARE_SUM_TOLERANCE:
            raise AssignmentError(f"split key {key!r}: shares sum to {total:.6g}, not 1")
        out[key] = {i: clean[i] / total for i in sorted(clean)}
    return dict(sorted(out.items()))


def primary_instance(parts: Mapping[int, float]) -> int:
    """The instance of a split key's largest share (the lowest instance among equals)."""
    return min(parts, key=lambda i: (-parts[i], i))
