"""The control plane without Spark: importing the DAG files and the planning core leaves
pyspark out, and the pure helpers (params, plan ids, records) are tested here, fast."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_IMPORT_ALL = """
import importlib, importlib.util, json, sys
for name in ("rebalance", "rebalance_rollback"):
    spec = importlib.util.spec_from_file_location(name + "_dag", {dags!r} + "/" + name + ".py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
for name in ("rebalance.core.model", "rebalance.core.bounds", "rebalance.core.placement",
             "rebalance.core.histograms",
             "rebalance.control.validation", "rebalance.core.trigger", "rebalance.core.planners",
             "rebalance.core.records", "rebalance.control.params", "rebalance.control.inputs",
             "rebalance.control.tasks", "rebalance.control.rollout", "rebalance.control.rollback",
             "rebalance.core.planner_names", "rebalance.cli.apply", "rebalance.cli"):
    importlib.import_module(name)
from rebalance.core.planners import METHODS, get_planner
for method in METHODS:
    get_planner(method)
print(json.dumps(sorted(m for m in sys.modules if m == "pyspark" or m.startswith("pyspark."))))
"""


def test_the_dag_files_and_the_planning_core_import_without_pyspark():
    done = subprocess.run([sys.executable, "-c", _IMPORT_ALL.format(dags=str(REPO / "dags"))],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_plan_id_is_a_hash_of_run_params_and_snapshot():
    from rebalance.control.params import RunInfo, RunParams, plan_id_for

    run = RunInfo("rebalance", "scheduled__x", "scheduled", "2026-01-01T00:00:00+00:00",
                  "2026-01-01T00:10:00+00:00")
    inputs = {"windows": ["a"], "key_histograms_version": 3, "base_assignment_version": 0,
              "n_instances": 4, "events": 1}
    pid = plan_id_for(run, RunParams(), inputs)
    assert pid == plan_id_for(run, RunParams(), {**inputs, "events": 2})  # not part of the id
    assert pid != plan_id_for(run, RunParams(theta=0.2), inputs)
    assert pid != plan_id_for(run, RunParams(), {**inputs, "key_histograms_version": 4})
    assert re.fullmatch(r"[0-9a-f]{20}", pid), pid


def test_a_trigger_rule_s_former_name_is_refused_and_a_stored_plan_still_reads():
    """The trigger rules are theta and mldc; the former name seed004 (docs/dag.md, "Former
    names") is refused with the names that are accepted, while a plan record stored with
    it still gives the gate its limits (the gate does not judge the rule)."""
    from rebalance.control.errors import InvalidParams
    from rebalance.control.params import RunInfo, RunParams, plan_id_for
    from rebalance.control.tasks import plan_limits
    from rebalance.core.records import PlanRecord, PlanStatus, hash_id
    from rebalance.core.trigger import TRIGGER_RULES

    assert TRIGGER_RULES == ("theta", "mldc")
    with pytest.raises(InvalidParams, match="trigger_rule 'seed004' is not one of theta, mldc"):
        RunParams.parse({"trigger_rule": "seed004"})
    stored = PlanRecord(plan_id="p", status=PlanStatus.PROPOSED.value, method="mixed",
                        dag_id="rebalance", run_id="r", run_type="manual",
                        params={**RunParams(theta=0.2).to_dict(), "trigger_rule": "seed004"},
                        inputs={"n_instances": 4, "n_keys": 10, "total_state": 100.0})
    limits = plan_limits(stored)
    assert (limits.theta, limits.n_instances, limits.expected_keys) == (0.2, 4, 10)
    # a run's plan id hashes its params as they are, the rule by its name
    run = RunInfo("rebalance", "manual__x", "manual", "2026-01-01T00:00:00+00:00",
                  "2026-01-01T00:10:00+00:00")
    inputs = {"windows": ["a"], "key_histograms_version": 3, "base_assignment_version": 0,
              "n_instances": 4}
    p = RunParams(trigger_rule="mldc")
    assert plan_id_for(run, p, inputs) == hash_id({
        "dag_id": run.dag_id, "run_id": run.run_id,
        "data_interval": [run.data_interval_start, run.data_interval_end],
        "params": p.to_dict(), "inputs": inputs})
    assert plan_id_for(run, p, inputs) != plan_id_for(run, RunParams(), inputs)


def test_the_params_form_offers_the_trigger_rules_and_refuses_anything_else():
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    from rebalance.control.params import PARAMS_SCHEMA

    spec = PARAMS_SCHEMA["trigger_rule"]
    assert spec["enum"] == ["theta", "mldc"]        # a dropdown of the rules
    param = Param(**spec)
    for value in ("theta", "mldc"):
        assert param.resolve(value) == value
    for bad in ("always", "", 4, None, "seed004"):
        with pytest.raises(ParamValidationError):
            param.resolve(bad)


def test_run_params_are_canonical_and_checked_once():
    from rebalance.control.errors import InvalidParams
    from rebalance.control.params import PARAMS_SCHEMA, RunParams

    assert RunParams.parse({"theta": 1, "max_table": 30.0}) == RunParams(theta=1.0, max_table=30)
    # The Params form and the dataclass agree on every default.
    assert {k: v["default"] for k, v in PARAMS_SCHEMA.items()} == RunParams().to_dict()
    for bad, word in (({"theta": 0}, "theta"), ({"method": "fastest"}, "method"),
                      ({"apply_mode": "yolo"}, "apply_mode"),
                      ({"min_windows": 9, "lookback_windows": 3}, "min_windows"),
                      ({"migration_budget": 1.5}, "migration_budget"),
                      ({"restart_above": 2}, "restart_above"),
                      ({"nonsense_type": 1, "theta": "x"}, "theta")):
        with pytest.raises(InvalidParams, match=word):
            RunParams.parse(bad)


def test_a_plan_record_round_trips_through_its_row():
    import datetime as dt

    from rebalance.core.records import PlanRecord, PlanStatus, as_utc, to_json

    t = dt.datetime(2026, 1, 1, 0, 10, tzinfo=dt.timezone.utc)
    record = PlanRecord(plan_id="p", status=PlanStatus.PROPOSED.value, method="mixed",
                        dag_id="rebalance", run_id="r", run_type="manual", data_interval_end=t,
                        metrics={"moved_keys": 2}, reasons=["why"], base_assignment_version=3)
    row = record.to_row()
    assert json.loads(row["metrics"]) == {"moved_keys": 2} and row["reasons"] == '["why"]'
    assert PlanRecord.from_row(row) == record
    assert as_utc("2026-01-01T00:10:00Z") == t and as_utc(None) is None
    assert to_json({"b": 1, "a": t}) == '{"a":"2026-01-01T00:10:00+00:00","b":1}'


def test_apply_mode_auto_restarts_only_when_the_plan_moves_enough_state():
    from rebalance.control.params import AUTO_RESTART_ABOVE, RunParams
    from rebalance.control.rollout import resolve_mode

    assert RunParams().apply_mode == "auto" and RunParams().restart_above == AUTO_RESTART_ABOVE
    # The plans of the demo and of the DAG tests move 1-2 % of the state: live switch.
    assert resolve_mode("auto", 0.016) == "broadcast"
    assert resolve_mode("auto", None) == "broadcast" and resolve_mode("auto", 0.0) == "broadcast"
    assert resolve_mode("auto", AUTO_RESTART_ABOVE) == "broadcast"
    # A plan that moves more of the state than the threshold: controlled restart.
    assert resolve_mode("auto", AUTO_RESTART_ABOVE + 1e-6) == "restart"
    assert resolve_mode("auto", 0.3, restart_above=0.5) == "broadcast"
    assert resolve_mode("auto", 0.3, restart_above=0.0) == "restart"
    # Explicit modes are what they say, whatever the plan moves.
    for mode in ("broadcast", "restart", "dry-run"):
        assert resolve_mode(mode, 0.9) == mode and resolve_mode(mode, 0.0) == mode


@pytest.mark.parametrize("requested, moved, capability, used", [
    # A job that can restart, or one that recorded nothing (older stores, stand-ins):
    # what resolve_mode says.
    ("auto", 0.2, "restart", "restart"), ("auto", 0.2, None, "restart"),
    ("restart", 0.0, "restart", "restart"), ("restart", 0.0, None, "restart"),
    ("auto", 0.01, "live", "broadcast"), ("broadcast", 0.9, "live", "broadcast"),
    ("dry-run", 0.9, "live", "dry-run"),
    # A live-only job and auto above restart_above: a live switch, with the reason.
    ("auto", 0.2, "live", "broadcast"),
    # A job whose live switch hands the state over: a live switch for a restart too.
    ("auto", 0.2, "handoff", "broadcast"), ("restart", 0.0, "handoff", "broadcast"),
    ("broadcast", 0.9, "handoff", "broadcast"), ("auto", 0.01, "handoff", "broadcast"),
])
def test_the_apply_mode_follows_what_the_job_can_do(requested, moved, capability, used):
    from rebalance.control.rollout import mode_for_job

    mode, note = mode_for_job(requested, moved, 0.05, "keyed", capability,
                              "keyed_job.py, pid 7 on h at 2026-11-27 02:41 UTC")
    assert mode == used
    if (requested, capability) == ("auto", "live") and moved > 0.05:
        assert note == (
            "apply_mode auto chose a controlled restart (the plan moves 20.0% of the state, "
            "restart_above 0.05), but the job 'keyed' cannot restart (started by keyed_job.py, "
            "pid 7 on h at 2026-11-27 02:41 UTC): live switch instead; the moved keys restart "
            "their window state on their new instance")
    elif capability == "handoff" and (requested == "restart"
                                      or (requested == "auto" and moved > 0.05)):
        assert note == (
            f"apply_mode {requested} chose a controlled restart, but the job 'keyed' hands the "
            "moved keys' state over at every live switch (started by keyed_job.py, pid 7 on h "
            "at 2026-11-27 02:41 UTC): published for its live switch, which moves the state")
    else:
        assert note is None


def test_an_explicit_restart_of_a_job_that_cannot_restart_is_refused_in_one_line():
    from rebalance.control.errors import ApplyRefused
    from rebalance.control.rollout import mode_for_job

    with pytest.raises(ApplyRefused) as refused:
        mode_for_job("restart", 0.2, 0.05, "keyed", "live", "keyed_job.py")
    text = str(refused.value)
    assert "\n" not in text
    assert text == ("apply_mode restart refused: the job 'keyed' cannot restart (started by "
                    "keyed_job.py); run spark_apps/restartable_job.py for controlled restarts, "
                    "or choose apply_mode broadcast")


@pytest.mark.parametrize("start, end, text", [
    (None, None, "the latest 6 windows stored"),
    ("2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00+00:00",
     "the 6 windows before 2026-01-01T00:00:00+00:00"),
    ("2026-01-01T00:00:00+00:00", "2026-01-01T00:02:00+00:00",
     "[2026-01-01T00:00:00+00:00, 2026-01-01T00:02:00+00:00)"),
])
def test_a_skip_names_the_windows_the_run_looked_at(start, end, text):
    from rebalance.control.inputs import _windows_text
    from rebalance.control.params import RunInfo

    assert _windows_text(RunInfo("rebalance", "manual__x", "manual", start, end), 6) == text


def test_the_backtest_params_are_checked_with_one_line_each():
    from rebalance.control.errors import InvalidParams
    from rebalance.control.params import PARAMS_SCHEMA, VERIFY_TOLERANCE, RunParams

    p = RunParams()
    assert (p.trigger_rule, p.load_model, p.headroom_target, p.theta_plan) == (
        "theta", "auto", 0.9, None)
    assert 0 < p.min_backtest_gain <= 0.05 and p.verify_tolerance == VERIFY_TOLERANCE == 0.02
    # verification can fail: the form caps the noise allowance well below any plan's miss
    assert PARAMS_SCHEMA["verify_tolerance"]["maximum"] == 0.5
    # one spelling per load model, so equal runs hash to the same plan id
    assert RunParams.parse({"load_model": "ewm:h=3"}).load_model == "ewm:halflife=3"
    assert RunParams.parse({"theta": 0.2, "theta_plan": 0.05}).theta_plan == 0.05
    for bad, words in (
        ({"trigger_rule": "always"}, "trigger_rule 'always' is not one of theta, mldc"),
        ({"load_model": "ewma"}, "load_model 'ewma': load model 'ewma'"),
        ({"load_model": "ewm:span=3"}, "option 'span=3'"),
        ({"load_model": "seasonal"}, "seasonal needs a period"),
        ({"load_model": 3}, "load_model 3"),
        ({"theta_plan": 0.2}, "theta_plan must be > 0 and at most theta (0.1), got 0.2"),
        ({"theta_plan": 0}, "theta_plan must be > 0"),
        ({"headroom_target": 0}, "headroom_target must be a share in (0, 1]"),
        ({"headroom_target": 1.5}, "headroom_target"),
        ({"min_backtest_gain": -0.1}, "min_backtest_gain must be in [0, 1]"),
        ({"verify_tolerance": 5}, "verify_tolerance must be in [0, 0.5], got 5.0"),
    ):
        with pytest.raises(InvalidParams) as err:
            RunParams.parse(bad)
        assert words in str(err.value) and "\n" not in str(err.value)
    # the form refuses a misspelt model before a run exists (the pattern of the schema)
    import re

    pattern = re.compile(PARAMS_SCHEMA["load_model"]["pattern"])
    assert all(pattern.match(t) for t in ("auto", "ewm:halflife=3", " robust:windows=3"))
    assert not any(pattern.match(t) for t in ("ewma", "", "mean;windows=3"))


def test_verify_checks_the_bound_the_user_set_not_the_prediction():
    from rebalance.control.rollout import verify_limit

    assert verify_limit(0.1, 0.02) == pytest.approx(1.12)
    # the case: theta 0.1, a plan landing at 1.2 is not verified, whatever it predicted
    assert not 1.2 <= verify_limit(0.1, 0.02)
    assert 1.119 <= verify_limit(0.1, 0.02) and not 1.121 <= verify_limit(0.1, 0.02)
    assert verify_limit(0.05, 0.0) == pytest.approx(1.05)


def test_the_schedule_none_means_manual_runs_only(monkeypatch):
    """REBALANCE_SCHEDULE=none: no timetable (no scheduled run; a manual run's data interval
    is the instant it was triggered, so it plans on the latest windows stored)."""
    from rebalance.control.params import timetable

    monkeypatch.setenv("REBALANCE_SCHEDULE", "none")
    assert timetable() is None
    assert timetable("Manual") is None
    assert timetable("30s") is not None
