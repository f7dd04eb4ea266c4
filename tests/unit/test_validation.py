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
