"""Table maintenance without Spark: retention arithmetic, the windows plans protect, the SQL
of an expiry, the params and their refusals, and the maintenance DAG's shape."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from rebalance.spark import maintenance as m

REPO = Path(__file__).resolve().parents[2]
UTC = dt.timezone.utc


def at(day: int, hour: int = 0) -> dt.datetime:
    return dt.datetime(2026, 1, day, hour, tzinfo=UTC)


# ------------------------------------------------------------------ retention arithmetic
def test_the_cutoff_counts_back_from_the_newest_window_not_from_the_clock():
    # a replayed trace from the past keeps its latest days
    assert m.retention_cutoff(at(20), dt.timedelta(days=14), now=at(31)) == at(6)
    # naive timestamps (what Spark returns) are UTC; ISO strings are parsed
    assert m.retention_cutoff(dt.datetime(2026, 1, 20), dt.timedelta(days=1), now=at(31)) == at(19)
    assert m.retention_cutoff("2026-01-20T00:00:00+00:00", dt.timedelta(hours=6),
                              now=at(31)) == at(19, 18)


def test_a_window_in_the_future_does_not_move_the_cutoff_past_now():
    far = dt.datetime(9999, 1, 1, tzinfo=UTC)  # a bogus event time must not expire everything
    assert m.retention_cutoff(far, dt.timedelta(days=7), now=at(31)) == at(24)


def test_nothing_is_expired_from_an_empty_table_or_without_a_retention():
    assert m.retention_cutoff(None, dt.timedelta(days=7), now=at(31)) is None
    assert m.retention_cutoff(at(20), None, now=at(31)) is None
    params = m.MaintenanceParams()
    assert params.retention(m.POLICIES["key_histograms"]) == dt.timedelta(days=14)
    assert params.retention(m.POLICIES["results"]) == dt.timedelta(days=7)
    assert params.retention(m.POLICIES["events"]) is None  # 0: kept (off by default)
    for never in ("plans", "plan_assignments", "assignments", "restarts", "jobs", "control",
                  "quarantine"):
        assert params.retention(m.POLICIES[never]) is None, never


# ------------------------------------------------------------------- protected windows
def test_every_window_a_plan_names_is_protected_inputs_and_verification():
    plans = [
        {"inputs": {"windows": ["2026-01-02T00:00:00+00:00", "2026-01-02T00:00:20+00:00"]},
         "verification": {"windows": ["2026-01-02T00:01:00+00:00"]}},
        # as read from the plans table: JSON text, and a rollback without windows
        {"inputs": json.dumps({"windows": ["2026-01-02T00:00:20+00:00"]}), "verification": "{}"},
        {"inputs": json.dumps({"rollback_to": 3}), "verification": None},
    ]
    assert m.protected_windows(plans) == {
        at(2), at(2) + dt.timedelta(seconds=20), at(2) + dt.timedelta(minutes=1)}
    assert m.protected_windows([]) == set()


def test_the_expiry_keeps_protected_windows_older_than_the_cutoff_only():
    cutoff = at(10)
    sql = m.expiry_condition("window_start", cutoff, [at(3), at(12)])
    assert sql == ("`window_start` < TIMESTAMP '2026-01-10 00:00:00' AND `window_start` "
                   "NOT IN (TIMESTAMP '2026-01-03 00:00:00')")
    assert m.expiry_condition("window_start", cutoff) == "`window_start` < TIMESTAMP '2026-01-10 00:00:00'"
    # events: the text event time, parsed as the job parses it (unparsable rows are kept)
    assert m.expiry_condition("event_time", cutoff).startswith(
        "try_cast(trim(event_time) AS TIMESTAMP) < TIMESTAMP '2026-01-10")


def test_delta_interval_properties_read_as_hours():
    assert m.interval_hours("interval 1 weeks") == 168
    assert m.interval_hours("interval 36 hours") == 36
    assert m.interval_hours("7 days") == 168
    assert m.interval_hours(None) == m.interval_hours("garbage") == 168


# -------------------------------------------------------------------------------- params
def test_params_defaults_and_a_run_s_values():
    p = m.MaintenanceParams.parse(None)
    assert (p.histograms_retention_days, p.results_retention_days, p.events_retention_days,
            p.vacuum_retention_hours, p.vacuum_below_safety_check) == (14, 7, 0, 168, False)
    assert p.tables == tuple(m.POLICIES)
    p = m.MaintenanceParams.parse({"histograms_retention_days": 0.5, "tables": "plans, events",
                                   "vacuum_retention_hours": 240})
    assert p.histograms_retention_days == 0.5 and p.tables == ("plans", "events")
    # the DAG's Params form and the library agree on every default
    assert {k: v["default"] for k, v in m.PARAMS_SCHEMA.items()} == {
        **{k: getattr(m.MaintenanceParams(), k) for k in m.PARAMS_SCHEMA if k != "tables"},
        "tables": list(m.POLICIES)}


@pytest.mark.parametrize("values, message", [
    ({"histograms_retention_days": -1}, r"histograms_retention_days must be within \[0, 3650\] days, got -1"),
    ({"results_retention_days": float("nan")}, "must be a number of days"),
    ({"events_retention_days": True}, "must be a number of days"),
    ({"histograms_retention_days": "14"}, "must be a number of days"),
    ({"histograms_retention_days": 0.01}, "0 \\(keep every row\\) or at least 1 hour"),
    ({"histograms_retention_days": 4000}, r"within \[0, 3650\]"),
    ({"vacuum_retention_hours": 24}, "below Delta's safety check .168 h.: set vacuum_below_safety_check"),
    ({"vacuum_retention_hours": 0, "vacuum_below_safety_check": True}, "whole number of hours >= 1"),
    ({"vacuum_retention_hours": 170.5}, "whole number of hours"),
    ({"vacuum_below_safety_check": "yes"}, "true or false"),
    ({"tables": ["key_histograms", "nope"]}, "unknown table 'nope'; maintained tables: events, "),
    ({"tables": []}, "non-empty list"),
    ({"histogram_retention_days": 3}, "unknown maintenance param.s. histogram_retention_days"),
])
def test_bad_params_are_refused_in_one_line(values, message):
    with pytest.raises(m.MaintenanceParamError, match=message) as info:
        m.MaintenanceParams.parse(values)
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_below_the_safety_check_only_when_asked():
    p = m.MaintenanceParams.parse({"vacuum_retention_hours": 24, "vacuum_below_safety_check": True})
    assert p.vacuum_retention_hours == 24


def test_unknown_steps_and_tables_are_refused_before_any_spark_work():
    with pytest.raises(m.MaintenanceParamError, match="unknown step 'compact'"):
        m.run_step(None, "compact")
    with pytest.raises(m.MaintenanceParamError, match="unknown table 'histograms'"):
        m.optimize(None, "histograms")
    with pytest.raises(m.MaintenanceParamError, match="must be within"):
        m.run_step(None, "expire", {"results_retention_days": -2})


def test_what_each_table_gets():
    assert [n for n, p in m.POLICIES.items() if p.zorder] == [
        "results", "window_results", "key_histograms", "instance_histograms"]
    assert [n for n, p in m.POLICIES.items() if p.protect_plan_windows] == [
        "key_histograms", "instance_histograms"]
    assert [n for n, p in m.POLICIES.items() if p.retention] == [
        "events", "results", "window_results", "key_histograms", "instance_histograms"]
    assert m.POLICIES["assignments"].no_vacuum and m.POLICIES["assignments"].no_optimize
    assert m.POLICIES["control"].no_optimize and not m.POLICIES["control"].no_vacuum


def test_the_schedule_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(m.SCHEDULE_ENV, raising=False)
    assert m.schedule() == "0 3 * * *"  # daily, beside the running job
    monkeypatch.setenv(m.SCHEDULE_ENV, "@daily")
    assert m.schedule() == "@daily"
    monkeypatch.setenv(m.SCHEDULE_ENV, "30 1 * * *")
    assert m.schedule() == "30 1 * * *"
    monkeypatch.setenv(m.SCHEDULE_ENV, "none")
    assert m.schedule() is None


def test_the_service_passes_its_maintenance_schedule_to_airflow(monkeypatch, tmp_path):
    from rebalance.ops.service import Settings, airflow_env

    monkeypatch.delenv(m.SCHEDULE_ENV, raising=False)
    where = {"data": tmp_path / "data", "airflow_home": tmp_path / "airflow"}
    assert m.SCHEDULE_ENV not in airflow_env(Settings(**where))  # the DAG's default: daily
    assert airflow_env(Settings(**where, maintenance_schedule="none"))[m.SCHEDULE_ENV] == "none"


# -------------------------------------------------------------------------------- the DAG
def test_the_maintenance_dag_parses_with_tags_retries_docs_and_its_params_form():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "maintenance.py"))
    assert bag.import_errors == {}
    dag = bag.dags[m.DAG_ID]
    assert "rebalance" in dag.tags and dag.doc_md and dag.max_active_runs == 1
    assert [t.task_id for t in dag.topological_sort()] == ["expire", "optimize", "vacuum",
                                                           "checkpoint"]
    assert all(t.retries >= 1 for t in dag.tasks)
    assert set(dag.params.keys()) == set(m.PARAMS_SCHEMA)
    schema = dag.params.get_param("histograms_retention_days").schema
    assert schema["type"] == "number" and schema["minimum"] == 0 and schema["maximum"] == 3650
    assert schema["title"] == "Keep histogram windows for (days)"
    assert dag.params.get_param("vacuum_retention_hours").schema["type"] == "integer"
    assert dag.params["tables"] == list(m.POLICIES)


def test_the_dag_fails_bad_params_at_once_without_a_retry_and_without_spark(monkeypatch):
    import importlib.util

    from rebalance.control import inputs
    from rebalance.control.errors import InvalidParams

    spec = importlib.util.spec_from_file_location("maintenance_dag", REPO / "dags" / "maintenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(inputs, "spark_session", lambda: pytest.fail("Spark was started"))
    with pytest.raises(InvalidParams, match="invalid maintenance params: vacuum_retention_hours 24"):
        module.run("expire", {"vacuum_retention_hours": 24})



# ------------------------------------------------------------------ a table's log version
def test_the_log_version_is_the_newest_commit_file_and_none_without_one(tmp_path):
    from rebalance.spark.delta_rs import log_version
    from rebalance.spark.paths import local_path

    table = tmp_path / "restarts"
    assert log_version(table) is None                      # no folder
    (table / "_delta_log").mkdir(parents=True)
    assert log_version(table) is None                      # no commit yet
    for name in ("00000000000000000000.json", "00000000000000000010.json",
                 "00000000000000000010.checkpoint.parquet", "00000000000000000011.crc",
                 "_last_checkpoint", "00000000000000000009.json.tmp"):
        (table / "_delta_log" / name).write_text("{}")
    assert log_version(table) == 10 and log_version(f"file://{table}") == 10
    (table / "_delta_log" / "00000000000000000011.json").write_text("{}")
    assert log_version(str(table)) == 11
    assert local_path("s3a://b/t") is None and local_path(f"file://{table}") == table


def test_commit_versions_are_the_commit_files_only(tmp_path):
    from rebalance.spark.delta_rs import commit_versions
    from rebalance.spark.maintenance import _log_entries

    table = tmp_path / "plans"
    assert commit_versions(table) == [] and _log_entries(str(table)) == 0   # no log yet
    (table / "_delta_log").mkdir(parents=True)
    for name in ("00000000000000000000.json", "00000000000000000001.json",
                 "00000000000000000000.00000000000000000001.compacted.json",
                 "00000000000000000001.checkpoint.parquet", "00000000000000000001.crc",
                 "00000000000000000002.json.tmp", "_last_checkpoint"):
        (table / "_delta_log" / name).write_text("{}")
    assert sorted(commit_versions(table)) == [0, 1] and _log_entries(str(table)) == 2
    with pytest.raises(ValueError, match="not a table path delta-rs reads"):
        commit_versions("gs://bucket/tables/plans")
