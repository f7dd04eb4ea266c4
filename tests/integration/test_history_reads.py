"""Reads of a table's Delta history stay bounded as the table ages (local Spark + Delta).

The service commits to ``events`` every generator batch and to ``assignments`` every
apply, for months; a read of the whole history (``DESCRIBE HISTORY`` without a limit)
costs more every day. :func:`rebalance.spark.tables.commits` pages newest first
(:func:`rebalance.spark.delta_rs.commits`), so the callers that look for a recent commit
read only the newest ones. The pages are made small here (2) so a short table has several.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture
def paged(monkeypatch):
    """``delta_rs.history`` (every history read) recording the limit of every read, on
    pages of 2."""
    from rebalance.spark import delta_rs

    limits: list[int | None] = []
    real = delta_rs.history

    def spy(path, limit=None):
        limits.append(limit)
        return real(path, limit)

    monkeypatch.setattr(delta_rs, "FIRST_PAGE", 2)
    monkeypatch.setattr(delta_rs, "history", spy)
    return limits


def test_commits_page_newest_first_and_stop_where_the_caller_stops(spark, tmp_path, paged):
    from rebalance.spark import tables

    root = tmp_path / "tables"
    versions = [tables.publish_assignment(spark, {f"k{i}": i % 2}, 2, {"plan_id": f"p{i}"},
                                          root=root) for i in range(6)]
    whole = [c.version for c in tables.history(spark, tables.ASSIGNMENTS, root)]
    paged.clear()

    # all of them, newest first, each once, over doubling pages
    assert [c.version for c in tables.commits(spark, tables.ASSIGNMENTS, root)] == whole
    assert paged == [2, 4, 8]
    paged.clear()

    # the newest publish: one page of 2
    newest = next(iter(tables.commits(spark, tables.ASSIGNMENTS, root)))
    assert newest.version == versions[-1] and paged == [2]
    paged.clear()

    # above a version: exactly the commits after it, and the pages stop there
    after = tables.assignment_history(spark, root, after=versions[3])
    assert [c.version for c in after] == [versions[5], versions[4]]
    assert paged == [2, 4]
    assert tables.assignment_history(spark, root, after=versions[-1]) == []
    paged.clear()

    # the newest n publishes: as many pages as it takes, not the whole history
    assert [c.metadata["plan_id"] for c in tables.assignment_history(spark, root, limit=3)] == [
        "p5", "p4", "p3"]
    assert paged == [2, 4]
    paged.clear()

    # a version's own metadata (read_assignment): read from the newest down to it
    assert tables.read_assignment(spark, version=versions[4], root=root).metadata["plan_id"] == "p4"
    assert None not in paged and max(paged) <= 4


def test_the_generator_asks_for_its_newest_batch_only(spark, tmp_path, paged):
    from rebalance.spark import tables
    from rebalance.streaming.generator import (
        EventGenerator,
        GeneratorConfig,
        append_batches,
        last_appended_batch,
        next_batch,
    )

    root = tmp_path / "tables"
    config = GeneratorConfig(n_keys=20, events_per_batch=10, n_instances=2, seed=3)
    gen = EventGenerator(config)
    assert last_appended_batch(spark, config, root) is None
    assert append_batches(spark, gen, range(5), root) == [0, 1, 2, 3, 4]
    paged.clear()
    # a batch at or below the newest is skipped (Delta's transaction would skip it);
    # the newest page (2 commits) tells which
    assert append_batches(spark, gen, [2, 5], root) == [5]
    assert paged[0] == 2 and None not in paged
    assert last_appended_batch(spark, config, root) == 5
    assert next_batch(spark, config, root) == 6
    batches = [c.metadata["batch"] for c in tables.history(spark, tables.EVENTS, root)
               if c.metadata.get("kind") == "generator"]
    assert sorted(batches) == [0, 1, 2, 3, 4, 5]

    # another stream's batches on top: the scan pages past them to this stream's newest
    other = GeneratorConfig(n_keys=20, events_per_batch=10, n_instances=2, seed=4)
    append_batches(spark, EventGenerator(other), range(3), root)
    paged.clear()
    assert last_appended_batch(spark, config, root) == 5
    assert paged == [2, 4]


def test_the_cooldown_reads_the_newest_live_interval_end_as_the_records_give_it(spark, tmp_path):
    """``last_live_plan_before`` (the detect task's cooldown, once per run) is computed
    from three columns of the live plans; it gives what the full records give."""
    import datetime as dt

    from rebalance.core.records import LIVE_STATUSES, PlanRecord
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PLANS, PlanStore

    utc = dt.timezone.utc
    t = lambda minute: dt.datetime(2026, 11, 28, 6, minute, tzinfo=utc)  # noqa: E731
    store = PlanStore(spark, root=str(tmp_path / "control"))
    assert store.last_live_plan_before(t(59)) is None          # no plans table yet

    def plan(pid, status, run, end=None, applied=None):
        return PlanRecord(pid, status, "auto", "rebalance", run, "scheduled",
                          data_interval_end=end,
                          verification={"applied_at": applied.isoformat()} if applied else {})

    records = [plan("a", "verified", "r1", end=t(10)),
               plan("b", "diverged", "r2", end=t(20)),
               plan("c", "proposed", "r3", end=t(40)),                # not live
               plan("d", "applied", "r4", end=t(50)),                 # after `when` below
               plan("e", "applied", "r5", applied=t(30)),             # a rollback: no interval
               plan("f", "verified", "r6", end=t(35))]
    store.ensure(PLANS)
    tables.append(spark.createDataFrame([r.to_row() for r in records], PLANS.schema), PLANS,
                  store.root)

    def by_records(when, exclude):
        times = [p.data_interval_end or p.applied_at for p in store.plans(LIVE_STATUSES)
                 if p.run_id != exclude]
        times = [x for x in times if x is not None and x <= when]
        return max(times) if times else None

    for when, exclude, want in [(t(45), "none", t(35)), (t(45), "r6", t(30)),
                                (t(32), "r6", t(30)), (t(25), "r6", t(20)),
                                (t(15), "r1", None), (t(59), "none", t(50))]:
        got = store.last_live_plan_before(when, exclude_run=exclude)
        assert got == want == by_records(when, exclude), (when, exclude, got)
