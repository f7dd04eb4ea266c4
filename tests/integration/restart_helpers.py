"""Helpers shared by the controlled-restart tests (test_restart, test_kafka_restart,
test_dedup_restart): all drive a :class:`rebalance.streaming.restart.RestartableJob` in the
test process, publish plans that move a known share of the keys, and compare with a pandas
oracle computed from the generator.

* :func:`instances`: each key's instance under an assignment (routing over the default hash).
* :func:`publish_moving_plan`: publish, as the DAG does for ``apply_mode`` restart (or
  broadcast), an assignment moving a share of the keys off their current instance.
* :class:`Feeder`: a thread sending one generator batch every ``period`` seconds.
* :func:`faulty_job`: the service's restartable job with crashes or failures injected at
  its restart steps (the job itself has only the hook).
* :func:`crash_and_recover`: execute the pending restart with a crash at one step, kill the
  driver's queries, and let a new driver complete it from the ``restarts`` table.
* :func:`wait_commits`: wait until the running generation committed more batches.
* :func:`drain`: process what arrived, twice (a batch's late watermark closes windows).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
import pytest

from rebalance.core.placement import default_instances


def instances(keys: Iterable[str], routing: dict[str, int], n: int) -> np.ndarray:
    """The instance of every key: its routing entry, else the default hash over ``n``."""
    keys = list(keys)
    return np.array([routing.get(k, d) for k, d in zip(keys, default_instances(keys, n))])


def publish_moving_plan(spark, root: str, keys: Sequence[str], n: int,
                        previous: tuple[dict[str, int], int], fraction: float, test: str,
                        apply_mode: str = "restart",
                        splits: dict[str, dict[int, float]] | None = None) -> dict:
    """Publish an assignment for ``n`` instances that moves the first ``fraction`` of
    ``keys`` off their instance under ``previous`` = (routing, n), with the commit metadata
    the DAG writes for ``apply_mode``, and ``splits`` (key -> {instance: share}). Returns
    its ``version``, ``n``, ``routing`` (a split key: its largest share's instance), the
    share of keys whose instance changed (``moved``) and those keys (``moved_keys``)."""
    from rebalance.spark import tables
    from rebalance.spark.tables import primary_instance

    tables.resize_assignments(spark, n, root)
    before = instances(keys, *previous)
    default = default_instances(list(keys), n)
    routing = {}
    for k, b, d in list(zip(keys, before, default))[: int(len(keys) * fraction)]:
        routing[k] = int((b + 1) % n) if (b + 1) % n != d else int((b + 2) % n)
    version = tables.publish_assignment(spark, routing, n,
                                        {"test": test, "apply_mode": apply_mode}, root,
                                        splits=splits)
    routing.update({k: primary_instance(parts) for k, parts in (splits or {}).items()})
    after = instances(keys, routing, n)
    return {"version": version, "n": n, "routing": routing, "splits": dict(splits or {}),
            "moved": float(np.mean(after != before)),
            "moved_keys": {k for k, a, b in zip(keys, after, before) if a != b}}


class Feeder(threading.Thread):
    """Calls ``send(batch)`` for batches ``first``, ``first + 1``, ... every ``period``
    seconds until halted or ``limit`` is reached; an error is kept for the test to report."""

    def __init__(self, send: Callable[[int], object], first: int, period: float = 1.0,
                 limit: int = 60) -> None:
        super().__init__(daemon=True)
        self.send, self.next, self.period, self.limit = send, first, period, limit
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.is_set() and self.next < self.limit:
                self.send(self.next)
                self.next += 1
                self.halt.wait(self.period)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


class SimulatedCrash(BaseException):
    """The driver dies at a restart step: no ``except Exception`` of the job catches it,
    so nothing rolls back, as when the process is killed there."""


def faulty_job(spark, config, **options):
    """The service's :class:`~rebalance.streaming.restart.RestartableJob` with faults to
    inject at its restart steps (``prepare``, ``stop``, ``state``, ``start``): a step in
    ``job.crash`` kills the driver there once (:class:`SimulatedCrash`), a step in
    ``job.fail`` makes that restart fail once (``RestartError``: rolled back)."""
    from rebalance.streaming.restart import RestartableJob, RestartError

    class FaultyJob(RestartableJob):
        def reached(self, step: str) -> None:
            if step in self.crash:
                self.crash.discard(step)
                raise SimulatedCrash(f"injected crash at step {step!r}")
            if step in self.fail:
                self.fail.discard(step)
                raise RestartError(f"injected failure at step {step!r}")

    job = FaultyJob(spark, config, **options)
    job.crash, job.fail = set(), set()
    return job


def crash_and_recover(job, step: str, spark, config):
    """Execute the pending restart with a crash injected at ``step``; kill the driver's
    queries (mid-batch if need be, as a dying process does); start a new driver, which
    finds the unfinished restart in the ``restarts`` table and completes it."""
    job.crash.add(step)
    with pytest.raises(SimulatedCrash, match=step):
        job.poll()
    job.hard_stop()
    recovered = faulty_job(spark, config)
    recovered.start()
    return recovered


def wait_commits(job, n: int = 1, timeout: float = 120.0, feeder: Feeder | None = None) -> None:
    """Wait until the running generation committed ``n`` more batches (events keep coming,
    so ``processAllAvailable`` would chase the feeder); fail early if the query or the
    feeder stopped."""
    commits = Path(job.generation.checkpoint, "commits")

    def count() -> int:
        return sum(1 for p in commits.iterdir() if p.name.isdigit()) if commits.is_dir() else 0

    target, deadline = count() + n, time.monotonic() + timeout
    while count() < target:
        assert job.query.exception() is None, job.query.exception()
        assert job.query.isActive, "the query stopped"
        if feeder is not None:
            assert feeder.error is None and feeder.is_alive(), feeder.error
        assert time.monotonic() < deadline, f"no {n} batches in {timeout} s"
        time.sleep(0.2)


def drain(job) -> None:
    """Process everything available, wait a moment and again: the second pass runs the
    batch whose watermark (advanced by the first) closes the last windows."""
    job.process_all_available()
    time.sleep(1.5)
    job.process_all_available()
