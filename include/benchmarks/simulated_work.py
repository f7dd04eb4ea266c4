"""Simulated per-event CPU work for the streaming benchmarks.

``cpu_work(us_per_cost)`` is the keyed job's ``work`` hook (:class:`JobConfig.work
<rebalance.streaming.job.JobConfig>`): the operator calls it with the cost of each group of
events it processes, and it busy-works ``us_per_cost`` microseconds of the thread's CPU per
unit of cost, so an instance's task time follows its load, as a real operator's does. The
job runs it in Spark's Python workers, which cannot import this folder: the module is
pickled by value (cloudpickle) with the operator.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable


def burn_cpu(seconds: float) -> None:
    """Busy-work for ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _work(us_per_cost: float, cost: float) -> None:
    burn_cpu(cost * us_per_cost / 1e6)


def cpu_work(us_per_cost: float) -> Callable[[float], None] | None:
    """The job's ``work`` hook for ``us_per_cost`` (None for no work); ValueError below 0."""
    if not us_per_cost >= 0:
        raise ValueError(f"us_per_cost must be >= 0, got {us_per_cost}")
    if us_per_cost == 0:
        return None
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return functools.partial(_work, float(us_per_cost))
