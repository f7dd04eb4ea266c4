"""The benchmarks' simulated per-event CPU work (include/benchmarks/simulated_work.py),
given to the keyed job as ``JobConfig(work=...)``: it burns CPU in proportion to cost, and
it travels to Spark's Python workers by value (they cannot import the benchmarks' folder)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from benchmarks.simulated_work import cpu_work


def test_no_work_is_none_and_a_negative_amount_is_refused():
    assert cpu_work(0) is None
    with pytest.raises(ValueError, match="us_per_cost must be >= 0, got -1"):
        cpu_work(-1)
    from rebalance.streaming.job import JobConfig, JobError

    with pytest.raises(JobError, match="work must be callable or None"):
        JobConfig(work=5)


def test_the_work_burns_cpu_by_cost_and_unpickles_where_the_folder_is_not_importable():
    from pyspark import cloudpickle

    work = cpu_work(1000.0)                 # 1 ms of CPU per unit of cost
    start = time.thread_time()
    work(20.0)
    assert time.thread_time() - start >= 0.02
    blob = cloudpickle.dumps(work)
    # a fresh interpreter that cannot import the benchmarks' folder, as a Python worker (the
    # editable install puts include/ on every interpreter's path: the package is blocked)
    code = ("import pickle, sys, time; sys.modules['benchmarks'] = None; "
            "w = pickle.loads(sys.stdin.buffer.read()); "
            "t = time.thread_time(); w(10.0); print(time.thread_time() - t >= 0.01)")
    done = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True,
                          cwd="/", timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == b"True", done.stderr[-500:]
