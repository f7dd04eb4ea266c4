"""The apply lease (``PlanStore.acquire`` / ``release`` / ``lease``) on a real Delta table
(created by local Spark, written through delta-rs): one conditional UPDATE of the lease
row decides who holds it, by the count of rows it updated; the holder is read back only
after a concurrent-commit conflict. The race itself (two runs at once) runs in
test_faults.py; here each outcome is provoked."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def _commits(store) -> int:
    from rebalance.spark.delta_rs import commit_versions
    from rebalance.spark.plan_store import CONTROL

    return len(commit_versions(store.path(CONTROL)))


def test_the_lease_is_taken_when_free_refused_when_held_and_given_back_by_its_holder(
        spark, tmp_path):
    from rebalance.spark.plan_store import APPLY_LEASE, CONTROL, PlanStore, PlanStoreError

    store = PlanStore(spark, root=str(tmp_path / "control"))
    store.ensure(CONTROL)
    base = _commits(store)
    assert store.acquire(APPLY_LEASE, "plan-a", 900)
    assert store.lease_holder(APPLY_LEASE) == "plan-a" and _commits(store) == base + 1
    # held by another: refused, and the UPDATE that matched no row wrote no commit
    assert not store.acquire(APPLY_LEASE, "plan-b", 900)
    assert _commits(store) == base + 1
    with pytest.raises(PlanStoreError, match="lease 'apply' is held by 'plan-a'"):
        with store.lease(APPLY_LEASE, "plan-b"):
            pytest.fail("entered a lease another run holds")
    assert store.acquire(APPLY_LEASE, "plan-a", 900)         # a retry of the holder
    store.release(APPLY_LEASE, "plan-b")                       # not the holder: nothing
    assert store.lease_holder(APPLY_LEASE) == "plan-a"
    with store.lease(APPLY_LEASE, "plan-a"):
        assert store.lease_holder(APPLY_LEASE) == "plan-a"
    assert store.lease_holder(APPLY_LEASE) is None             # released on the way out
    # an expired lease is free for the next run
    assert store.acquire(APPLY_LEASE, "plan-c", -1)
    assert store.lease_holder(APPLY_LEASE) is None              # live no longer
    assert store.acquire(APPLY_LEASE, "plan-d", 900)
    assert store.lease_holder(APPLY_LEASE) == "plan-d"


def test_an_acquirer_that_loses_the_commit_race_reads_the_winner_and_does_not_hold_it(
        spark, tmp_path, monkeypatch):
    """Another run's UPDATE lands after this one read the table and before it commits:
    this one's commit conflicts (Delta's optimistic concurrency, here delta-rs'), the
    lease is read back, and it is the winner's."""
    from deltalake import DeltaTable

    from rebalance.spark import delta_rs
    from rebalance.spark.plan_store import APPLY_LEASE, CONTROL, PlanStore

    store = PlanStore(spark, root=str(tmp_path / "control"))
    store.ensure(CONTROL)
    assert delta_rs.writable(store.path(CONTROL)), "the lease is written through delta-rs"
    real = delta_rs.update

    def winner_first(path, predicate, values, schema_ddl, metadata=None, txn=None):
        if values.get("holder") == "loser":
            stale = DeltaTable(path)                 # the loser's read, before the winner
            real(path, predicate, {**values, "holder": "winner"}, schema_ddl, metadata)
            stale.update(updates={"holder": "'loser'"}, predicate=predicate)
            pytest.fail("the stale UPDATE committed over the winner's")
        return real(path, predicate, values, schema_ddl, metadata, txn)
    monkeypatch.setattr(delta_rs, "update", winner_first)
    assert not store.acquire(APPLY_LEASE, "loser", 900)
    assert store.lease_holder(APPLY_LEASE) == "winner"
    monkeypatch.setattr(delta_rs, "update", real)
    assert not store.acquire(APPLY_LEASE, "loser", 900)      # and it stays the winner's
