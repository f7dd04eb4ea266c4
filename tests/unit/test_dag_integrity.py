"""The DAG files and the Rebalance view plugin load, with what the UI shows (fast: no database).

Parsing the DAGs here is what the dag-processor does: no import error, tags, retries, the
Params form of each DAG; the plugin registers its FastAPI app at ``/rebalance`` and its
views as a DAG tab and a navigation entry, and every route requires a reader of the DAG.
"""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dags():
    """The DAGs of the shipped registry (``rebalance.toml``), as ``make up`` parses them."""
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as env:
        for name in ("REBALANCE_REGISTRY", "REBALANCE_JOB_NAME"):
            env.delenv(name, raising=False)
        bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.dags


def test_every_dag_parses_with_tags_retries_and_docs(dags):
    # a rebalance DAG per job of the shipped registry: the built-in job and the sessions example
    assert {"rebalance", "rebalance_sessions", "rebalance_rollback", "rebalance_healthcheck",
            "rebalance_maintenance"} <= set(dags)
    for dag_id in ("rebalance", "rebalance_sessions", "rebalance_rollback"):
        dag = dags[dag_id]
        assert "rebalance" in dag.tags and dag.doc_md and dag.max_active_runs == 1
        for t in dag.tasks:
            assert t.retries >= 1, (dag_id, t.task_id)
    assert "job:sessions" in dags["rebalance_sessions"].tags
    assert [t.task_id for t in dags["rebalance_sessions"].topological_sort()] == [
        t.task_id for t in dags["rebalance"].topological_sort()]
    job = dags["rebalance_rollback"].params.get_param("job")
    assert job.value == "keyed" and job.schema["enum"] == ["keyed", "sessions"]


def test_the_rebalance_params_form(dags):
    from airflow.sdk.exceptions import ParamValidationError

    params = dags["rebalance"].params
    assert params["method"] == "mixed" and params["apply_mode"] == "auto"
    schema = params.get_param("method").schema
    assert "milp" in schema["enum"] and "mixed" in schema["enum"]
    assert params.get_param("theta").schema["type"] == "number"
    assert params.get_param("require_approval").schema["type"] == "boolean"
    # the trigger rules on offer, and nothing else (a former name is refused)
    rule = params.get_param("trigger_rule")
    assert rule.schema["enum"] == ["theta", "mldc"]
    with pytest.raises(ParamValidationError):
        copy.deepcopy(rule).resolve("seed004")
    from rebalance.control.params import PARAMS_SCHEMA

    # Every run param of the library is on the form, with its default, and nothing else.
    assert set(params.keys()) == set(PARAMS_SCHEMA)
    assert {k: params[k] for k in PARAMS_SCHEMA} == {k: v["default"] for k, v in PARAMS_SCHEMA.items()}


def test_the_waits_end_by_the_runs_own_deadline_not_airflows(dags):
    """The longest restart or verification wait the form allows ends before the sensors'
    own timeout: the task's deadline (rollback, diverged) always fires first."""
    params = dags["rebalance"].params
    for sensor, param in (("await_restart", "restart_timeout_minutes"),
                          ("verify", "verify_timeout_minutes")):
        longest = params.get_param(param).schema["maximum"]
        timeout = dags["rebalance"].get_task(sensor).timeout
        seconds = getattr(timeout, "total_seconds", lambda: timeout)()  # a float in Airflow 3.3
        assert seconds > longest * 60, (sensor, timeout, longest)


def test_the_rollback_dag_takes_a_version(dags):
    dag = dags["rebalance_rollback"]
    assert [t.task_id for t in dag.topological_sort()] == ["propose", "validate", "publish", "apply"]
    param = dag.params.get_param("to_version")
    assert param.schema["type"] == "integer" and param.schema["minimum"] == 0
    assert param.description == "An earlier version of the assignments table."
    assert dag.schedule is None


def _plugin_module():
    spec = importlib.util.spec_from_file_location("rebalance_view", REPO / "plugins" / "rebalance_view.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plugin_mounts_its_app_and_views_behind_airflow_auth():
    module = _plugin_module()
    plugin = module.RebalancePlugin
    assert plugin.fastapi_apps[0]["url_prefix"] == "/rebalance"
    assert {(v["destination"], v["url_route"]) for v in plugin.external_views} == {
        ("dag", "rebalance-dag"), ("nav", "rebalance")}
    paths = {r.path for r in module.app.routes}
    assert {"/", "/plans/{plan_id}", "/api/plans", "/api/plans/{plan_id}", "/api/assignments",
            "/api/loads", "/api/imbalance", "/rollback"} <= paths
    # Authentication is an app-wide dependency: no route can forget it.
    assert module.can_read in module.app.router.dependencies


def test_a_dag_per_job_of_the_registry_with_the_jobs_defaults(tmp_path, monkeypatch):
    """Adding a job to the registry is all it takes: its DAG, on its schedule, with its
    theta, apply mode and approval as the form's defaults; rollback offers every job."""
    from airflow.dag_processing.dagbag import DagBag

    path = tmp_path / "rebalance.toml"
    path.write_text('[jobs.keyed]\ndag_id = "rebalance"\ntables = "tables"\n'
                    '[jobs.clicks]\napp = "sessions"\ntheta = 0.25\nschedule = "5m"\n'
                    'apply_mode = "broadcast"\nrequire_approval = true\n')
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    for name in ("REBALANCE_SCHEDULE", "REBALANCE_JOB_NAME"):
        monkeypatch.delenv(name, raising=False)
    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    assert {"rebalance", "rebalance_clicks"} <= set(bag.dags)
    clicks, keyed = bag.dags["rebalance_clicks"], bag.dags["rebalance"]
    assert (clicks.params["theta"], clicks.params["apply_mode"],
            clicks.params["require_approval"]) == (0.25, "broadcast", True)
    assert (keyed.params["theta"], keyed.params["apply_mode"]) == (0.1, "auto")
    assert (type(clicks.timetable).__name__, clicks.timetable.delta.total_seconds()) == (
        "DeltaDataIntervalTimetable", 300)
    assert type(keyed.timetable).__name__ == "CronDataIntervalTimetable"
    assert {"job:clicks", "rebalance"} <= set(clicks.tags)
    assert [t.task_id for t in clicks.topological_sort()] == [
        t.task_id for t in keyed.topological_sort()]
    job = bag.dags["rebalance_rollback"].params.get_param("job")
    assert job.value == "keyed" and job.schema["enum"] == ["keyed", "clicks"]
    # a bad registry: every DAG file that reads it shows the one-line reason
    path.write_text("[jobs.clicks]\ntheta = -1\n")
    errors = DagBag(dag_folder=str(REPO / "dags")).import_errors
    assert {Path(f).name for f in errors} == {"rebalance.py", "rebalance_rollback.py"}
    assert all(f"{path}: jobs.clicks.theta: must be a number in (0, 2], got -1" in e
               for e in errors.values())


def test_each_jobs_dag_tab_opens_on_that_jobs_page(tmp_path, monkeypatch):
    """The DAG tab's link names its DAG ({DAG_ID}, filled in by Airflow's UI); the view
    reads that DAG's job, a ``?job=`` names one directly, anything else is the first job."""
    from fastapi import HTTPException

    from rebalance.core import registry

    path = tmp_path / "rebalance.toml"
    path.write_text('[jobs.keyed]\ndag_id = "rebalance"\ntables = "tables"\n[jobs.clicks]\n')
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    monkeypatch.delenv("REBALANCE_JOB_NAME", raising=False)
    module = _plugin_module()
    hrefs = {v["destination"]: v["href"] for v in module.RebalancePlugin.external_views}
    assert hrefs == {"dag": "/rebalance/?dag={DAG_ID}", "nav": "/rebalance/jobs"}
    for name, dag, expected, page in ((None, "rebalance_clicks", "clicks", "clicks"),
                                      (None, "rebalance", "keyed", None),
                                      (None, "rebalance_maintenance", "keyed", None),
                                      ("clicks", None, "clicks", "clicks"),
                                      ("keyed", "rebalance_clicks", "keyed", None)):
        with module._job(name, dag) as (job, page_job):
            assert (job.name, registry.current_job()) == (expected, job)
            assert page_job == page
    assert registry.current_job() is None
    with pytest.raises(HTTPException) as err, module._job("nope"):
        pass
    assert err.value.status_code == 404
    assert err.value.detail == f"unknown job 'nope'; the registry {path} has: keyed, clicks"
