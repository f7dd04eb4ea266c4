"""The Rebalance view's results kept under their tables' log versions
(rebalance.ui.views.by_tables): answered from memory while no table read gained a
commit, read again after one, never kept for a table that cannot be listed. The view
functions themselves run against real Delta tables in the integration tests."""

from __future__ import annotations

import os

import pytest

from rebalance.ui import views


@pytest.fixture(autouse=True)
def data_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("REBALANCE_DATA_DIR", str(tmp_path))
    views._CACHE.clear()
    yield tmp_path
    views._CACHE.clear()


def _commit(root, table: str, version: int) -> None:
    log = root / "tables" / table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    (log / f"{version:020d}.json").write_text("{}")


def _counted(*tables):
    calls = []

    @views.by_tables(*tables)
    def page(spark, limit=10):
        calls.append(limit)
        return {"rows": list(range(limit))}
    return page, calls


def test_a_result_is_read_again_only_after_a_commit_to_a_table_it_reads(data_dir):
    _commit(data_dir, "plans", 0)
    _commit(data_dir, "assignments", 0)
    page, calls = _counted("plans", "assignments")
    first = page(None, limit=3)
    assert page(None, limit=3) == first == {"rows": [0, 1, 2]} and calls == [3]
    page(None, limit=4)                       # other arguments: a result of their own
    assert calls == [3, 4]
    _commit(data_dir, "assignments", 1)       # a commit to one of its tables
    page(None, limit=3)
    page(None, limit=3)
    assert calls == [3, 4, 3]
    _commit(data_dir, "key_histograms", 0)    # a table it does not read
    page(None, limit=3)
    assert calls == [3, 4, 3]


def test_a_caller_gets_a_copy_and_a_table_made_again_is_read_again(data_dir):
    _commit(data_dir, "plans", 0)
    page, calls = _counted("plans")
    page(None)["rows"].append("changed by the caller")
    assert page(None) == {"rows": list(range(10))} and calls == [10]
    # the table removed and created again at the same version: its commit file is new
    log = data_dir / "tables" / "plans" / "_delta_log" / f"{0:020d}.json"
    stamp = log.stat().st_mtime_ns
    log.unlink()
    _commit(data_dir, "plans", 0)
    os.utime(log, ns=(stamp + 10**9, stamp + 10**9))
    page(None)
    assert calls == [10, 10]


def test_a_table_that_cannot_be_listed_is_read_every_time_and_the_cache_is_bounded(
        data_dir, monkeypatch):
    page, calls = _counted("plans")           # no plans table yet
    page(None)
    page(None)
    assert calls == [10, 10] and not views._CACHE
    _commit(data_dir, "plans", 0)
    monkeypatch.setattr(views, "CACHE_SIZE", 3)
    for limit in range(5):
        page(None, limit=limit)
    assert len(views._CACHE) == 3
    page(None, limit=0)                       # dropped first: read again
    page(None, limit=4)                       # kept
    assert calls[-1] == 0 and calls.count(4) == 1


def test_plan_records_are_read_once_per_version_of_plans(data_dir, monkeypatch):
    reads = []

    def plans(store):
        reads.append(1)
        return [f"record-{len(reads)}"]
    monkeypatch.setattr(views.PlanStore, "plans", plans)
    monkeypatch.setattr(views.tables, "exists", lambda spark, table: True)
    _commit(data_dir, "plans", 0)
    assert views._plan_records(None) == views._plan_records(None) == ("record-1",)
    assert len(reads) == 1
    _commit(data_dir, "plans", 1)             # a new version: read again
    assert views._plan_records(None) == ("record-2",) and len(reads) == 2
