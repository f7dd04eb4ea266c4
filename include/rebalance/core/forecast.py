"""Load models: the per-key loads a plan is made for, from the per-window loads before it.

A plan is judged on the windows *after* it (``rebalance backtest``), so what it is planned
on is a forecast of those windows. Every model (:class:`LoadModel`: mean, ewm, quantile,
max, seasonal, robust) reads ``series``, a W x K array of per-window key loads (oldest
window first, a key absent from a window has load 0), and returns the K planning loads
(:func:`forecast`) or S x K load scenarios (:func:`scenarios`) that every plan must keep
within its bound. The models side by side: ``docs/planning.md``, "Plans that hold".

Pure numpy: no pandas, Spark or Airflow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

LOAD_MODELS = ("auto", "mean", "ewm", "quantile", "max", "seasonal", "robust")

#: Options each model reads (``windows`` applies to every model).
_OPTIONS = {
    "auto": (),
    "mean": ("windows",),
    "ewm": ("windows", "halflife"),
    "quantile": ("windows", "quantile"),
    "max": ("windows",),
    "seasonal": ("windows", "period"),
    "robust": ("windows", "period"),
}
#: Short spellings accepted by :meth:`LoadModel.parse`.
_ALIASES = {"q": "quantile", "w": "windows", "h": "halflife", "p": "period"}


class LoadModelError(ValueError):
    """A load model that cannot be used, with one line naming the field and value."""


@dataclass(frozen=True)
class LoadModel:
    """How the planning loads are made from the windows before a plan.

    * ``mean`` (today's planning): the mean of the last ``windows`` windows;
    * ``ewm``: exponentially weighted mean, weight 2^(-age / halflife) with age 0 for the
      latest window (``halflife`` in windows);
    * ``quantile``: each key's ``quantile`` (linear interpolation) over the last windows;
    * ``max``: each key's maximum over the last windows;
    * ``seasonal``: the mean of the same slot in earlier periods: the windows ``period``,
      ``2 * period``, ... before the planned one, as far back as ``windows`` reaches (at
      least one period back; with ``windows`` None every period in the series);
    * ``robust``: the ELB/CLB paper's robust view (its m windows): every one of the last
      ``windows`` windows is a scenario and the plan must keep each within the bound,
      against that window's own mean; :func:`forecast` gives their mean (what the plan is
      reported on). With a ``period``, the scenarios are the same slot in earlier periods
      (the windows ``seasonal`` averages): every one of them within the bound;
    * ``auto``: not a model but the choice of one by backtest
      (:func:`rebalance.core.backtest.choose`); :func:`forecast` refuses it.
    """

    name: str = "mean"
    windows: int | None = None
    halflife: float = 2.0
    quantile: float = 0.9
    period: int | None = None

    def __post_init__(self) -> None:
        if self.name not in LOAD_MODELS:
            raise LoadModelError(f"load model {self.name!r} is unknown; choose one of "
                                 f"{', '.join(LOAD_MODELS)}")
        w = self.windows
        if w is not None and (isinstance(w, bool) or not isinstance(w, (int, np.integer))
                              or w < 1):
            raise LoadModelError(f"load model {self.name}: windows must be an integer >= 1 "
                                 f"(or None for all), got {w!r}")
        h = self.halflife
        if isinstance(h, bool) or not isinstance(h, (int, float)) or not (math.isfinite(h)
                                                                         and h > 0):
            raise LoadModelError(f"load model {self.name}: halflife must be a number of "
                                 f"windows > 0, got {h!r}")
        q = self.quantile
        if isinstance(q, bool) or not isinstance(q, (int, float)) or not (0 <= q <= 1):
            raise LoadModelError(f"load model {self.name}: quantile must be in [0, 1], "
                                 f"got {q!r}")
        p = self.period
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, np.integer))
                              or p < 1):
            raise LoadModelError(f"load model {self.name}: period must be an integer >= 1 "
                                 f"(windows), got {p!r}")
        if self.name == "seasonal" and p is None:
            raise LoadModelError("load model seasonal needs a period in windows, e.g. "
                                 "'seasonal:period=7' for daily windows and a weekly pattern")
        if self.by_slot and w is not None and w < p:
            raise LoadModelError(f"load model {self.name}: windows ({w}) must reach at least "
                                 f"one period ({p}) back")

    # ------------------------------------------------------------------ text form
    @classmethod
    def parse(cls, text: str) -> LoadModel:
        """``name[:option=value,...]``, e.g. ``ewm:halflife=3``, ``quantile:q=0.9``,
        ``seasonal:period=7``, ``robust``, ``mean:windows=3``."""
        if isinstance(text, LoadModel):
            return text
        if not isinstance(text, str) or not text.strip():
            raise LoadModelError(f"load model must be text like 'ewm:halflife=3', got {text!r}")
        name, _, rest = text.strip().partition(":")
        name = name.strip().lower()
        if name not in LOAD_MODELS:
            raise LoadModelError(f"load model {name!r} (in {text!r}) is unknown; choose one of "
                                 f"{', '.join(LOAD_MODELS)}")
        values: dict[str, object] = {}
        for part in filter(None, (p.strip() for p in rest.split(","))):
            option, eq, raw = part.partition("=")
            option = _ALIASES.get(option.strip().lower(), option.strip().lower())
            if not eq or option not in _OPTIONS[name]:
                allowed = ", ".join(_OPTIONS[name]) or "none"
                raise LoadModelError(f"load model {name}: option {part!r} (in {text!r}) is not "
                                     f"one of its options ({allowed}), written option=value")
            raw = raw.strip()
            try:
                if option in ("windows", "period"):
                    value: object = None if raw.lower() in ("all", "none") else int(raw)
                else:
                    value = float(raw)
            except ValueError:
                raise LoadModelError(f"load model {name}: {option}={raw!r} (in {text!r}) is "
                                     "not a number") from None
            values[option] = value
        return cls(name=name, **values)

    def __str__(self) -> str:
        defaults = {f.name: f.default for f in fields(self)}
        parts = []
        for option in _OPTIONS[self.name]:
            value = getattr(self, option)
            if value != defaults[option] or (option == "period" and value is not None):
                parts.append(f"{option}={_number(value)}")
        return self.name + (":" + ",".join(parts) if parts else "")

    def describe(self) -> str:
        """The model in words, for the reasons a user reads (``str()`` is the run param's
        spelling): ``mean:windows=3`` is "the mean of the last 3 windows"."""
        w = self.windows
        last = ("every window" if w is None else "the last window" if w == 1
                else f"the last {w} windows")
        if self.name == "mean":
            return f"the mean of {last}"
        if self.name == "ewm":
            return (f"a mean of {last} weighted toward the latest (half-life "
                    f"{_number(self.halflife)} windows)")
        if self.name == "quantile":
            return f"each key's {self.quantile:.0%} quantile over {last}"
        if self.name == "max":
            return f"each key's peak over {last}"
        slots = (f"the same window in each earlier period of {self.period} windows"
                 + ("" if w is None else f" (within {last})"))
        if self.name == "seasonal":
            return f"the mean of {slots}"
        if self.name == "robust":
            return (f"{slots}, each within the bound" if self.by_slot
                    else f"each of {last} within the bound")
        return "the load model chosen by backtest"

    # ------------------------------------------------------------------ use
    @property
    def by_slot(self) -> bool:
        """Whether the model reads the same slot of earlier periods (``seasonal``, and
        ``robust`` with a period) rather than the last windows."""
        return self.period is not None and self.name in ("seasonal", "robust")

    @property
    def needs(self) -> int:
        """Windows of history the model needs at least (1, or one period when it reads
        slots of earlier periods: :attr:`by_slot`)."""
        return int(self.period) if self.by_slot else 1

    def with_windows(self, windows: int | None) -> LoadModel:
        from dataclasses import replace

        return replace(self, windows=windows)


def _number(value) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value)) if abs(value) < 1e15 else repr(value)
    return str(value)


def _series(series) -> np.ndarray:
    arr = np.asarray(series, dtype=np.float64)
    if arr.ndim == 1:
        arr = arr[None, :]
    if arr.ndim != 2:
        raise LoadModelError(f"series must be windows x keys (2-D), got shape {arr.shape}")
    if arr.shape[0] == 0:
        raise LoadModelError("series has no window: nothing to forecast from")
    return arr


def _last(arr: np.ndarray, model: LoadModel) -> np.ndarray:
    return arr if model.windows is None else arr[-int(model.windows):]


def forecast(series, model: LoadModel | str) -> np.ndarray:
    """The K planning loads of ``model`` from ``series`` (W x K, oldest window first)."""
    model = LoadModel.parse(model) if isinstance(model, str) else model
    arr = _series(series)
    name = model.name
    if name == "auto":
        raise LoadModelError("load model auto is a choice by backtest "
                             "(rebalance.core.backtest.choose), not a forecast")
    if model.by_slot:
        return _slots(arr, model).mean(axis=0)
    last = _last(arr, model)
    if name in ("mean", "robust"):
        return last.mean(axis=0)
    if name == "max":
        return last.max(axis=0)
    if name == "quantile":
        return np.quantile(last, float(model.quantile), axis=0)
    if name == "ewm":
        age = np.arange(last.shape[0] - 1, -1, -1, dtype=np.float64)
        weight = np.exp2(-age / float(model.halflife))
        return weight @ last / weight.sum()
    raise AssertionError(name)  # pragma: no cover - LOAD_MODELS is exhaustive


def _slots(arr: np.ndarray, model: LoadModel) -> np.ndarray:
    """The windows of ``arr`` in the planned window's slot of earlier periods (newest
    first), as far back as ``model.windows`` reaches."""
    p = int(model.period)
    depth = arr.shape[0] if model.windows is None else min(int(model.windows), arr.shape[0])
    if depth < p:
        raise LoadModelError(f"load model {model}: needs at least {p} windows (one period), "
                             f"got {depth}")
    # the planned window is arr.shape[0]; its slot one, two, ... periods back
    return arr[np.arange(arr.shape[0] - p, arr.shape[0] - depth - 1, -p)]


def scenarios(series, model: LoadModel | str) -> np.ndarray:
    """S x K load scenarios every plan of ``model`` must keep within its bound: the last
    ``windows`` windows for ``robust`` (with a ``period``, the same slot of earlier periods
    within them, newest first), the single forecast row for the other models."""
    model = LoadModel.parse(model) if isinstance(model, str) else model
    if model.name == "robust":
        arr = _series(series)
        return _slots(arr, model).copy() if model.by_slot else _last(arr, model).copy()
    return forecast(series, model)[None, :]


def history_needed(model: LoadModel) -> int:
    """How many windows before a plan ``model`` reads (its ``windows``, at least what it
    needs; None means every window given, counted here as its minimum)."""
    if model.windows is not None:
        return max(int(model.windows), model.needs)
    return model.needs


def detect_period(series, max_period: int = 200, cycles: int = 2) -> int | None:
    """The seasonal period of a W x K series in windows, or None when it has none.

    Windows ``p`` apart are compared by the cosine similarity of their per-key load
    vectors, averaged over the series. The period is the smallest lag ``p >= 2`` that is a
    local peak of that similarity, clearly more alike than neighbouring windows (it closes
    at least a tenth of the gap between lag 1's similarity and 1), and within 1 % of the
    best such peak (its multiples are nearly as alike). Lags up to
    ``max_period`` are tried while the series holds ``cycles`` periods and one window more.
    Used by ``auto`` to add a seasonal candidate the backtest then accepts or not."""
    x = _series(series)
    top = min(int(max_period), (x.shape[0] - 1) // max(1, int(cycles)))
    if top < 2:
        return None
    norm = np.linalg.norm(x, axis=1)
    u = x / np.where(norm > 0, norm, 1.0)[:, None]
    sim = np.full(top + 2, -np.inf)
    for p in range(1, min(top + 1, x.shape[0] - 1) + 1):
        sim[p] = float(np.einsum("ij,ij->i", u[p:], u[:-p]).mean())
    if 1.0 - sim[1] <= 1e-9:  # neighbouring windows alike already: nothing to gain
        return None
    clear = sim[1] + 0.1 * (1.0 - sim[1])
    peaks = [p for p in range(2, top + 1)
             if sim[p] > clear and sim[p] >= sim[p - 1] and sim[p] >= sim[p + 1]]
    if not peaks:
        return None
    best = max(sim[p] for p in peaks)
    return next(p for p in peaks if sim[p] >= best - 0.01 * abs(best))
