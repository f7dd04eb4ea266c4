"""Why the last run skipped, in a user's words: the line ``make status``, the Rebalance
view's health strip and its jobs page share (``rebalance.ops.health.run_text``), and the
reason a task keeps when it raises ``RunSkipped`` (its XCom ``skip_reason``), read back
from Airflow's metadata database as the view reads it (``health.db_lines``)."""

from __future__ import annotations

import datetime as dt

import pytest

from rebalance.ops.health import run_text

ENDED = dt.datetime(2026, 11, 28, 12, 4, 5, tzinfo=dt.timezone.utc)


def test_the_last_run_line_says_what_the_run_did():
    assert run_text(None, None) == "none yet"
    assert run_text("scheduled__x", "running") == "scheduled__x: running"
    done = "scheduled__x: success, ended 2026-11-28 12:04:05 UTC"
    assert run_text("scheduled__x", "success", ENDED) == done
    assert (run_text("scheduled__x", "success", ENDED, skipped={"plan": "balanced: 1.05 <= 1.1"})
            == done + "; skipped at plan: balanced: 1.05 <= 1.1")
    # the first task that skipped with a reason (the tasks after it skip without one)
    assert run_text("r", "success", skipped={"windows": "too few events", "plan": "x"}) == (
        "r: success; skipped at windows: too few events")
    assert run_text("r", "success", applied=True, skipped={"verify": "x"}) == (
        "r: success; a plan was applied")


def test_the_rest_api_line_words_the_logged_reason_the_same_way():
    """``make status`` (health.dag_lines over the REST API) writes the same line: the
    client here answers as Airflow's REST API would."""
    from rebalance.ops.health import dag_lines

    class Api:
        def get(self, path):
            if path.endswith("/dagRuns?order_by=-run_after&limit=1"):
                return {"dag_runs": [{"dag_run_id": "scheduled__x", "state": "success",
                                      "end_date": "2026-11-28T12:04:05Z"}]}
            return {"is_paused": False}

        def task_instances(self, dag_id, run_id):
            return {"detect": {"state": "skipped", "try_number": 1},
                    "apply": {"state": "skipped", "try_number": 0}}

        def skip_reasons(self, dag_id, run_id, tis):
            return {"detect": "balanced: 1.05 <= 1.1"}

    assert dag_lines(Api(), "rebalance") == [
        ("dag", "active (unpaused)"),
        ("last run", "scheduled__x: success, ended 2026-11-28T12:04:05Z; skipped at detect: "
                     "balanced: 1.05 <= 1.1")]


def test_a_skip_outside_a_task_is_a_plain_exception():
    from rebalance.control.errors import RunSkipped

    with pytest.raises(RunSkipped, match="nothing to do"):
        raise RunSkipped("nothing to do")


@pytest.mark.slow
def test_the_reason_a_task_skipped_with_is_read_back_from_the_metadata_database(airflow_db):
    """A real run (``dag.test``, Airflow's task runner): ``look`` makes a RunSkipped and
    waits on (success: its reason does not count), ``detect`` raises one, ``apply`` is
    skipped after it without a reason; the view's read finds detect's reason alone."""
    from airflow.sdk import DAG, task

    from rebalance.control.errors import SKIP_REASON, RunSkipped
    from rebalance.ops.health import db_lines

    with DAG("test_skip_reasons", schedule=None, catchup=False) as dag:
        @task
        def look():
            try:
                raise RunSkipped("no assignments table yet")
            except RunSkipped:
                return {"windows": 3}

        @task
        def detect(windows):
            raise RunSkipped("balanced: 1.05 <= 1.1 in 2 of 3 windows (theta rule)")

        @task
        def apply(detected):
            return detected

        apply(detect(look()))
    assert db_lines("test_skip_reasons")[1:] == ("none yet", {})
    _register(dag)
    run = dag.test()
    dag_line, line, skipped = db_lines("test_skip_reasons")
    assert skipped == {"detect": "balanced: 1.05 <= 1.1 in 2 of 3 windows (theta rule)"}
    assert line.startswith(f"{run.run_id}: success, ended ")
    assert line.endswith("; skipped at detect: balanced: 1.05 <= 1.1 in 2 of 3 windows "
                         "(theta rule)")
    assert dag_line in ("active (unpaused)", "PAUSED: nothing is scheduled; unpause it in "
                                             "the UI or run `make up`")
    # the waited-out reason stays on the task that succeeded, and is not shown
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        kept = {x.task_id for x in session.query(XComModel).filter_by(
            dag_id="test_skip_reasons", run_id=run.run_id, key=SKIP_REASON)}
    assert kept == {"look", "detect"}


def _register(dag) -> None:
    """``dag`` in the metadata database, as the dag-processor records a parsed DAG of the
    DAGs folder's bundle (``dag.test`` runs only a DAG recorded there)."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    with create_session() as session:
        DagBundlesManager().sync_bundles_to_db(session=session)
        session.commit()
        update_dag_parsing_results_in_db("dags-folder", None, [LazyDeserializedDAG.from_dag(dag)],
                                         {}, None, set(), session=session)
