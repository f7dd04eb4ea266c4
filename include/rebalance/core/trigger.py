"""When to rebalance, and whether a plan is worth applying.

Three pure decisions, each a :class:`Decision` with one reason for every rule that blocks
(``force`` decides yes regardless, and the reasons then record what was overridden):

* :class:`ThetaTrigger` (the default ``trigger_rule`` ``theta``): plan when a majority of
  the most recent windows exceed the bound the user set, ``1 + theta``, under the live
  assignment;
* :class:`TriggerPolicy` (the ``trigger_rule`` ``mldc``): the trigger rules of the MLDC
  paper (Maric et al., Sec. 3.2, Table 1);
* :class:`GainGate`: apply a plan only when, replayed on held-out recent windows, it
  beats keeping the live assignment by at least ``min_gain`` of mean realised imbalance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from rebalance.core.defaults import theta_problem


def mldc(imbalance: float) -> float:
    """The MLDC paper's maximum load distance coefficient for an imbalance (max / mean)."""
    return imbalance - 1.0


@dataclass(frozen=True)
class Decision:
    """Whether to rebalance now; ``reasons`` name every rule that blocks (or was forced);
    ``because`` says why it fires when no rule blocks (default: every condition holds)."""

    trigger: bool
    reasons: list[str] = field(default_factory=list)
    forced: bool = False
    because: str = "every trigger condition holds"

    def __str__(self) -> str:
        if self.forced:
            return "rebalance (forced)" + (": overrides " + "; ".join(self.reasons)
                                           if self.reasons else "")
        if self.trigger:
            return f"rebalance: {self.because}"
        return "no rebalance: " + "; ".join(self.reasons)


@dataclass(frozen=True)
class TriggerPolicy:
    """The MLDC paper's trigger rules, with the paper's defaults (Table 1).

    The paper measures imbalance as the maximum load distance coefficient,
    ``MLDC = max_i (L_i - mean) / mean = imbalance - 1``, and redistributes only when all
    of these hold:

    1. MLDC > ``threshold`` (0.5);
    2. at least ``min_items`` items (1000) were processed in the horizon, so the loads are
       measured precisely enough;
    3. no redistribution in the last ``cooldown`` periods (3 periods of D = 10 s), so at
       most one every ``cooldown * D``: allowed once ``periods_since_last >= cooldown``;
    4. the candidate plan improves MLDC by more than ``min_improvement`` (0.3), so a plan is
       computed before deciding.
    """

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


#: The trigger rules a run can use (run param ``trigger_rule``): ``theta``
#: (:class:`ThetaTrigger`) and ``mldc`` (:class:`TriggerPolicy`, the MLDC paper's rules).
TRIGGER_RULES = ("theta", "mldc")


def _finite_at_least(name: str, value, low: float) -> None:
    if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value)
                                       and value >= low):
        raise ValueError(f"{name} must be a finite number >= {low:g}, got {value!r}")


def _values_text(values) -> str:
    return ", ".join("nan" if v != v else f"{v:.3f}" for v in values)


@dataclass(frozen=True)
class ThetaTrigger:
    """Plan when a majority of the latest ``recent`` windows exceed ``1 + theta``.

    The imbalance of each window is measured under the *live* assignment (the one a plan
    would replace), so windows from before the last switch are judged as if it had
    been live then. A majority, not the latest window alone: one window over the bound
    is often a burst that is gone in the next (planning on it moves keys for nothing),
    while two of the last three is an imbalance that persists; and not all of them, so
    the trigger reacts within two windows. With fewer windows than ``recent`` the
    majority is of those there are (1 of 1, 2 of 2). A NaN imbalance never counts as over.
    """

    theta: float
    recent: int = 3

    def __post_init__(self) -> None:
        if problem := theta_problem(self.theta):
            raise ValueError(problem)
        if isinstance(self.recent, bool) or not isinstance(self.recent, (int, np.integer)) \
                or self.recent < 1:
            raise ValueError(f"recent must be an integer >= 1, got {self.recent!r}")

    @property
    def bound(self) -> float:
        return 1.0 + float(self.theta)

    def decide(self, window_imbalances, force: bool = False) -> Decision:
        """window_imbalances: imbalance (max / mean instance load) of each window under the
        live assignment, oldest first; only the latest ``recent`` are judged."""
        recent = [float(v) for v in list(window_imbalances)[-int(self.recent):]]
        over = sum(1 for v in recent if v > self.bound)
        need = len(recent) // 2 + 1
        seen = (f"{over} of the latest {len(recent)} window(s) exceed 1 + theta = "
                f"{self.bound:.3f} (imbalance {_values_text(recent)})")
        reasons = []
        if not recent:
            reasons.append("no window to judge the imbalance on")
        elif over < need:
            reasons.append(f"only {seen}; the trigger needs {need}")
        if force:
            return Decision(trigger=True, reasons=reasons, forced=True)
        return Decision(trigger=not reasons, reasons=reasons, because=seen)


@dataclass(frozen=True)
class GainGate:
    """Apply a plan only when its backtest beats staying by at least ``min_gain``.

    ``planned`` and ``staying`` are the mean realised imbalance over the same held-out
    windows (windows the plan was not made on) of the plan and of the live assignment.
    The gain is ``staying - planned``; the gate passes when it is at least ``min_gain``
    (so with ``min_gain > 0`` a plan that only ties staying is not applied: it would move
    state for nothing). A NaN on either side blocks.
    """

    min_gain: float = 0.01

    def __post_init__(self) -> None:
        _finite_at_least("min_gain", self.min_gain, 0.0)

    def decide(self, planned: float, staying: float, windows: int,
               force: bool = False) -> Decision:
        gain = float(staying) - float(planned)
        seen = (f"backtested realised {planned:.3f} vs {staying:.3f} staying on the "
                f"{windows} held-out window(s)")
        reasons = []
        if not gain >= self.min_gain:  # NaN blocks
            reasons.append(f"plans made on these windows do not hold: {seen} (gain "
                           f"{gain:+.3f}, at least {self.min_gain:.3f} required)")
        if force:
            return Decision(trigger=True, reasons=reasons, forced=True)
        return Decision(trigger=not reasons, reasons=reasons,
                        because=f"plans made on these windows hold: {seen} (gain {gain:+.3f})")
