"""When to rebalance: the trigger conditions of seed 004 (Maric et al., Sec. 3.2, Table 1).

Seed 004 measures imbalance as the maximum load distance coefficient,
``MLDC = max_i (L_i - mean) / mean = imbalance - 1``, and redistributes only when all
of these hold:

1. MLDC > ``threshold`` (0.5);
2. at least ``min_items`` items (1000) were processed in the horizon, so the loads are
   measured precisely enough;
3. no redistribution in the last ``cooldown`` periods (3 periods of D = 10 s), so at
   most one every ``cooldown * D``: allowed once ``periods_since_last >= cooldown``;
4. the candidate plan improves MLDC by more than ``min_improvement`` (0.3), so a plan is
   computed before deciding.

:meth:`TriggerPolicy.decide` is pure: it returns a :class:`Decision` with one reason
for every rule that blocks. ``force`` triggers regardless; the reasons then record what
was overridden.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np


def mldc(imbalance: float) -> float:
    """Seed 004's maximum load distance coefficient for an imbalance (max / mean)."""
    return imbalance - 1.0


@dataclass(frozen=True)
class Decision:
    """Whether to rebalance now; ``reasons`` name every rule that blocks (or was forced)."""

    trigger: bool
    reasons: list[str] = field(default_factory=list)
    forced: bool = False

    def __str__(self) -> str:
        if self.forced:
            return "rebalance (forced)" + (": overrides " + "; ".join(self.reasons)
                                           if self.reasons else "")
        if self.trigger:
            return "rebalance: every trigger condition holds"
        return "no rebalance: " + "; ".join(self.reasons)


@dataclass(frozen=True)
class TriggerPolicy:
    """Seed 004's trigger rules with the paper's defaults (Table 1)."""

    threshold: float = 0.5
    min_items: int = 1000
    cooldown: int = 3
    min_improvement: float = 0.3

    def __post_init__(self) -> None:
        for name in ("threshold", "min_improvement"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        for name in ("min_items", "cooldown"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")

    def decide(self, imbalance: float, items: int, periods_since_last: int | None,
               predicted_imbalance: float | None = None, force: bool = False) -> Decision:
        """Apply the four rules.

        imbalance: max / mean instance load now (MLDC = imbalance - 1).
        items: events processed in the planning horizon.
        periods_since_last: whole periods since the last rebalance, None if never.
        predicted_imbalance: max / mean under the candidate plan; None blocks rule 4.
        force: rebalance whatever the rules say.
        """
        reasons = []
        now = mldc(imbalance)
        if not now > self.threshold:
            reasons.append(f"MLDC {now:.3f} is not above the threshold {self.threshold:.3f}")
        if items < self.min_items:
            reasons.append(f"only {items} items processed in the horizon, need at least "
                           f"{self.min_items}")
        if periods_since_last is not None and periods_since_last < self.cooldown:
            reasons.append(f"last rebalance {periods_since_last} period(s) ago, cooldown is "
                           f"{self.cooldown} period(s)")
        if predicted_imbalance is None:
            reasons.append("no candidate plan: the MLDC improvement cannot be predicted")
        else:
            gain = now - mldc(predicted_imbalance)
            if not gain > self.min_improvement:
                reasons.append(f"the candidate plan improves MLDC by {gain:.3f} ({now:.3f} -> "
                               f"{mldc(predicted_imbalance):.3f}), not more than "
                               f"{self.min_improvement:.3f}")
        if force:
            return Decision(trigger=True, reasons=reasons, forced=True)
        return Decision(trigger=not reasons, reasons=reasons)
