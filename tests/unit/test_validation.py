"""The Great Expectations gate accepts a sound plan and names every defect of a bad one."""

from __future__ import annotations

import pandas as pd
import pytest

from rebalance.control.validation import PlanLimits, validate_plan


@pytest.fixture()
def plan():
    frame = pd.DataFrame({
        "key": ["a", "b", "c", "d"],
        "instance": [0, 1, 1, 0],
        "current": [0, 0, 1, 0],
        "default": [0, 1, 1, 1],
        "load": [3.0, 3.0, 2.0, 2.0],
        "state": [1.0, 1.0, 1.0, 1.0],
        "moved": [False, True, False, False],
    })
    metrics = {"imbalance_after": 1.0, "migration_bytes": 1.0, "moved_keys": 1, "table_size": 1}
    return frame, metrics, PlanLimits(n_instances=2, theta=0.1, expected_keys=4)


def test_sound_plan_passes(plan):
    frame, metrics, limits = plan
    result = validate_plan(frame, metrics, limits)
    assert result.success, result.failures
    assert result.statistics["evaluated_expectations"] >= 12


def test_duplicate_key_out_of_range_instance_and_lying_metrics_are_all_reported(plan):
    frame, metrics, limits = plan
    bad = frame.copy()
    bad.loc[2, "key"] = "a"
    bad.loc[3, "instance"] = 7
    result = validate_plan(bad, {**metrics, "imbalance_after": 1.5}, limits)
    assert not result.success
    text = "\n".join(result.failures)
    assert "expect_column_values_to_be_unique" in text
    assert "'column': 'instance'" in text and "[7]" in text
    assert "imbalance_after" in text
    assert "moved" in text  # instance changed without the moved flag


def test_limits_on_table_budget_and_drain(plan):
    frame, metrics, _ = plan
    limits = PlanLimits(n_instances=2, theta=0.1, expected_keys=4, max_table=0,
                        budget_bytes=0.5, budget_keys=0, drain=(1,))
    result = validate_plan(frame, metrics, limits)
    text = "\n".join(result.failures)
    for column in ("table_size", "migration_bytes", "moved_keys"):
        assert f"'column': '{column}'" in text
    assert "expect_column_values_to_not_be_in_set" in text


def test_missing_keys_and_nulls(plan):
    frame, metrics, limits = plan
    short = frame.iloc[:3].copy()
    short.loc[0, "load"] = None
    result = validate_plan(short, metrics, limits)
    text = "\n".join(result.failures)
    assert "expect_table_row_count_to_equal" in text
    assert "expect_column_values_to_not_be_null" in text


def test_missing_columns_are_a_clear_failure(plan):
    frame, metrics, limits = plan
    result = validate_plan(frame.drop(columns=["state"]), metrics, limits)
    assert not result.success and "lacks columns ['state']" in result.failures[0]


@pytest.fixture()
def split_plan():
    """Key "a" (load 6) split over both instances: 3 + 3 each side with b, c, d."""
    frame = pd.DataFrame({
        "key": ["a", "b", "c", "d"],
        "instance": [1, 0, 1, 0],          # a split key's instance: its largest share's
        "current": [0, 0, 1, 1],
        "default": [0, 0, 1, 1],
        "load": [6.0, 2.0, 2.0, 2.0],
        "state": [4.0, 1.0, 1.0, 1.0],
        "moved": [False, False, False, True],
        "split": ['{"0": 0.25, "1": 0.75}', None, None, None],
    })
    # loads: 0 <- 1.5 + 2 + 2 = 5.5, 1 <- 4.5 + 2 = 6.5; mean 6
    metrics = {"imbalance_after": 6.5 / 6, "migration_bytes": 1.0, "moved_keys": 1,
               "table_size": 3}
    return frame, metrics, PlanLimits(n_instances=2, theta=0.1, expected_keys=4)


def test_a_split_plan_is_judged_by_its_shares(split_plan):
    from rebalance.control.validation import recompute_metrics_independently

    frame, metrics, limits = split_plan
    got = recompute_metrics_independently(frame, 2)
    assert got["imbalance_after"] == pytest.approx(6.5 / 6)
    # "a" keeps a share on its current instance 0: its state does not move
    assert (got["moved_keys"], got["migration_bytes"], got["table_size"]) == (1, 1.0, 3)
    result = validate_plan(frame, metrics, limits)
    assert result.success, result.failures
    # read as whole keys the same plan would put all of "a" on 1 and lie about its metrics
    whole = validate_plan(frame.drop(columns="split"), metrics, limits)
    assert not whole.success


@pytest.mark.parametrize("split, message", [
    ('{"0": 0.5, "1": 0.4}', "shares sum to 0.9"),
    ('{"0": 0.5, "2": 0.5}', "instance 2 is not an integer in [0, 2)"),
    ('{"1": 1.0}', "at least two instances"),
    ("not json", "is not a JSON object"),
])
def test_a_bad_split_is_rejected_with_the_reason(split_plan, split, message):
    frame, metrics, limits = split_plan
    bad = frame.copy()
    bad.loc[0, "split"] = split
    result = validate_plan(bad, metrics, limits)
    assert not result.success and message in "\n".join(result.failures)


def test_a_split_key_must_sit_on_one_of_its_shares_and_off_drained_instances(split_plan):
    frame, metrics, _ = split_plan
    bad = frame.copy()
    bad.loc[0, "split"] = '{"0": 0.25, "2": 0.75}'
    result = validate_plan(bad, metrics, PlanLimits(n_instances=3, theta=0.1, expected_keys=4,
                                                   drain=(2,)))
    text = "\n".join(result.failures)
    assert "its instance 1 is not one of its shares [0, 2]" in text
    assert "keeps shares on drained instances [2]" in text


def test_a_split_plan_is_refused_for_a_job_that_cannot_merge_split_keys(split_plan):
    import dataclasses
    import datetime as dt

    from rebalance.spark.jobs import JobStart, split_refusal

    frame, metrics, limits = split_plan
    start = JobStart("sessions", "live", "rebalanced", None,
                     dt.datetime(2026, 12, 2, 3, 0, tzinfo=dt.timezone.utc), "h", 42, False)
    refused = dataclasses.replace(limits, splits_refused=split_refusal(start))
    result = validate_plan(frame, metrics, refused)
    assert not result.success
    assert result.failures == [
        "the plan splits 1 key(s), but the job 'sessions' does not merge the partial results "
        "of a split key (started by rebalanced, pid 42 on h at 2026-12-02 03:00 UTC); plan "
        "without split keys"]
    # the same job takes a plan of whole keys: "a" alone on 0, b, c, d on 1 (b moves)
    whole = frame.assign(split=None, instance=[0, 1, 1, 1], moved=[False, True, False, False])
    ok = validate_plan(whole, {"imbalance_after": 1.0, "migration_bytes": 1.0,
                               "moved_keys": 1, "table_size": 1}, refused)
    assert ok.success, ok.failures
    # a job that merges split keys, or one that recorded nothing, takes the split plan
    for other in (dataclasses.replace(start, splits=True), None):
        assert split_refusal(other) is None
