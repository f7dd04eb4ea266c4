"""The DAG files and the Rebalance view plugin load, with what the UI shows (fast: no database).

Parsing the DAGs here is what the dag-processor does: no import error, tags, retries, the
Params form of each DAG; the plugin registers its FastAPI app at ``/rebalance`` and its
views as a DAG tab and a navigation entry, and every route requires a reader of the DAG.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dags():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    assert bag.import_errors == {}
    return bag.dags


def test_every_dag_parses_with_tags_retries_and_docs(dags):
    assert {"rebalance", "rebalance_rollback", "rebalance_healthcheck"} <= set(dags)
    for dag_id in ("rebalance", "rebalance_rollback"):
        dag = dags[dag_id]
        assert "rebalance" in dag.tags and dag.doc_md and dag.max_active_runs == 1
        for t in dag.tasks:
            assert t.retries >= 1, (dag_id, t.task_id)


def test_the_rebalance_params_form(dags):
    params = dags["rebalance"].params
    assert params["method"] == "mixed" and params["apply_mode"] == "auto"
    schema = params.get_param("method").schema
    assert "milp" in schema["enum"] and "mixed" in schema["enum"]
    assert params.get_param("theta").schema["type"] == "number"
    assert params.get_param("require_approval").schema["type"] == "boolean"
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


def test_the_charts_render_loads_and_escape_text():
    module = _plugin_module()
    loads = {"windows": ["2026-11-24T00:00:00", "2026-11-24T00:00:20", "2026-11-24T00:00:40"],
             "instances": [0, 1], "loads": [[10.0, 30.0], [12.0, 28.0], [20.0, 20.0]],
             "imbalance": [1.5, 1.4, 1.0], "versions": [0, 0, 1]}
    svg = module._loads_chart(loads)
    assert svg.count("<polyline") == 2 and ">v1</text>" in svg
    assert "imbalance of the latest window 1.000" in svg
    bars = module._bars_chart({"instance": [0, 1], "before": [30.0, 10.0], "after": [20.0, 20.0]})
    assert bars.count("<rect") == 4 and "mean" in bars
    table = module._plans_table([{
        "plan_id": "<script>", "status": "verified", "method": "milp", "created_at": None,
        "imbalance_before": 1.7, "predicted_imbalance": 1.05, "backtested_imbalance": 1.08,
        "realised_imbalance": 1.15, "theta": 0.1, "theta_plan": 0.05,
        "migration_fraction": 0.01, "moved_keys": 2, "table_size": 2,
        "lower_bound_migration_fraction": 0.005, "assignment_version": 3,
        "dag_id": "rebalance", "run_id": "manual__x"}])
    assert "<script>" not in table and "&lt;script&gt;" in table
    assert 'href="/dags/rebalance/runs/manual__x"' in table
    # realised above 1 + theta is marked; backtested, theta and theta_plan are shown
    assert '<span class="bad">1.150</span>' in table
    assert "<td>1.080</td>" in table and "<td>0.1</td><td>0.05</td>" in table


def test_the_realised_imbalance_chart_plots_each_window_against_one_plus_theta():
    module = _plugin_module()
    data = {"windows": ["2026-11-24T00:00:00", "2026-11-24T00:00:20", "2026-11-24T00:00:40",
                        "2026-11-24T00:01:00"],
            "imbalance": [1.5, 1.4, 1.04, None], "versions": [0, 0, 1, 1],
            "theta": [0.1, 0.1, 0.05, 0.05], "default_theta": 0.1,
            "checks": [{"plan_id": "p<1>", "status": "verified", "realised": 1.04,
                        "window": "2026-11-24T00:00:40+00:00", "theta": 0.05, "limit": 1.07},
                       {"plan_id": "elsewhere", "status": "diverged", "realised": 1.3,
                        "window": "2026-11-23T00:00:00+00:00", "theta": 0.1, "limit": 1.12}]}
    svg = module._imbalance_chart(data)
    assert svg.count('class="over"') == 2 and svg.count('class="within"') == 1  # None: no point
    assert ">v1</text>" in svg and 'id="bound"' in svg
    # the bound steps from 1.1 to 1.05 where version 1 (theta 0.05) went live
    bound = svg.split('id="bound"')[1].split('points="')[1].split('"')[0].split()
    xy = [tuple(float(v) for v in point.split(",")) for point in bound]
    assert len(xy) == 2 * 4 - 1 and len({y for _, y in xy[:4]}) == 1       # 1.1 in windows 0-1
    assert xy[3][0] == xy[4][0] and xy[4][1] > xy[3][1]  # at window 2, down (svg y grows down)
    assert xy[4][1] == xy[6][1]
    # the verify result of the plan live in these windows is drawn, escaped; the other is not
    assert svg.count('class="check verified"') == 1 and "p&lt;1&gt;" in svg
    assert "diverged: realised" not in svg
    assert "1 of 3 window(s) within 1 + theta" in svg
    assert module._imbalance_chart({**data, "windows": [], "imbalance": [], "versions": [],
                                    "theta": [], "checks": []}).startswith(
        '<p id="imbalance-chart">')


def test_the_plan_page_shows_predicted_backtested_and_realised_beside_the_bounds():
    module = _plugin_module()
    plan = {"imbalance_before": 1.75, "predicted_imbalance": 1.04, "realised_imbalance": 1.118,
            "theta": 0.1, "theta_plan": 0.05, "load_model": "ewm:halflife=3",
            "backtest": {"planned": 1.06, "staying": 1.70, "windows": 6,
                         "held_out": ["a", "b"], "decision": "rebalance: <holds>",
                         "reasons": ["auto: chosen"]},
            "verification": {"tolerance": 0.02, "limit": 1.12, "realised": 1.118}}
    html = module._imbalance_table(plan)
    rows = html.split("<tr>")[2:]
    assert [r.split("</td>")[0].removeprefix("<td>").split(" (")[0] for r in rows] == [
        "before", "predicted", "backtested", "backtested staying", "realised"]
    assert "<td>1.040</td><td>1.050</td>" in rows[1]          # predicted vs 1 + theta_plan
    assert "<td>1.060</td><td>1.100</td>" in rows[2]          # backtested vs 1 + theta
    assert "<td>1.700</td>" in rows[3]
    assert '<span class="bad">1.118</span>' in rows[4]         # above 1 + theta ...
    assert "verify accepts up to 1.120 (verify_tolerance 0.02)" in rows[4]  # ... within noise
    assert "2 held-out window(s)" in rows[2]
    assert "&lt;holds&gt;" in html and "<holds>" not in html
    assert "theta 0.1 · theta_plan 0.05 · load model ewm:halflife=3" in html
    # a plan stored before backtests existed (or a rollback) shows dashes, not an error
    old = module._imbalance_table({"imbalance_before": 1.5, "predicted_imbalance": 1.1,
                                   "realised_imbalance": None, "theta": 0.1})
    assert old.count("<td>–</td>") >= 4 and "backtest-reasons" not in old


def test_the_moved_keys_section_lists_each_key_or_says_none_and_caps_a_long_list():
    module = _plugin_module()

    def moved(n):
        return [{"key": f"k<{i}>", "from": 0, "to": 1, "load": 1.0, "state_bytes": 10.0 * (n - i)}
                for i in range(n)]
    none = module._moved_section([], "p1")
    assert "<h2>Moved keys (0)</h2>" in none and '<p id="moved">none</p>' in none
    two = module._moved_section(moved(2), "p1")
    assert two.count("<tr>") == 3 and "k&lt;0&gt;" in two and "moved-truncated" not in two
    cap = module.MOVED_ROWS_SHOWN
    many = module._moved_section(moved(cap + 7), "p 1")
    assert f"<h2>Moved keys ({cap + 7})</h2>" in many and many.count("<tr>") == cap + 1
    assert f"k&lt;{cap - 1}&gt;" in many and f"k&lt;{cap}&gt;" not in many
    assert f"all {cap + 7} are in the" in many and 'href="/rebalance/api/plans/p%201"' in many
