"""The approval path of the rebalance DAG, run for real and answered through Airflow's REST API.

``dag.test`` runs the real DAG in-process on the SQLite metadata database with
``require_approval`` and ``force``: ``approval_gate`` branches to ``approve`` (an
``ApprovalOperator``), which parks its task instance in *awaiting input*; ``dag.test`` keeps
the run alive until a response is recorded from outside. A background thread plays the
person at the *Required actions* page: it drives the api-server's own FastAPI app
(``airflow.api_fastapi.app.create_app``, the public ``/api/v2`` routes and the
SimpleAuthManager's ``/auth`` routes) with ``fastapi.testclient.TestClient`` against the
same metadata database, logs in with a user name and password, finds the waiting request
(``GET .../hitlDetails``) and answers it (``PATCH .../taskInstances/approve/-1/hitlDetails``).
Nothing of the response path is replaced: the route writes the answer and resumes the
parked task instance, and ``dag.test`` runs ``execute_complete`` and the rest of the run.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from urllib.parse import quote

import pytest
from dag_helpers import (  # noqa: F401 - dag, data are fixtures
    LIVE,
    JobStandIn,
    dag,
    data,
    live_assignment,
    run_dag,
    seed_interval,
    table_versions,
    traffic,
)

pytestmark = pytest.mark.slow

# Logical dates of their own, so these runs never share a run id (and its task instances
# and HITL rows) with the runs of test_dag.py in the same metadata database.
APPROVE_AT = LIVE + dt.timedelta(days=1)
REJECT_AT = LIVE + dt.timedelta(days=2)
CONF = {"require_approval": True, "force": True, "method": "milp"}
USER, PASSWORD = "approver", "approve-in-tests"
ANSWER_TIMEOUT = 300  # seconds for the run to reach the approval step


# ---------------------------------------------------------------- fixtures
@pytest.fixture()
def api_app(tmp_path, monkeypatch):
    """The api-server's FastAPI app (core API + auth manager routes), in this process.

    SimpleAuthManager (the configured auth manager) with one admin user whose password is
    in a file of the test's own, so logging in needs real credentials (all-admins mode off).
    """
    from airflow.api_fastapi.app import create_app, purge_cached_app

    passwords = tmp_path / "simple_auth_manager_passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    monkeypatch.setenv("AIRFLOW__CORE__AUTH_MANAGER",
                       "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS", "False")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", f"{USER}:admin")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    purge_cached_app()
    yield create_app(apps="core")
    purge_cached_app()


def run_id_for(logical_date) -> str:
    """The run id ``dag.test`` gives a manual run (known before the run exists)."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.types import DagRunType

    return DagRun.generate_run_id(run_type=DagRunType.MANUAL, logical_date=logical_date,
                                  run_after=logical_date)


def hitl_path(run_id: str) -> str:
    return f"/api/v2/dags/rebalance/dagRuns/{quote(run_id, safe='')}"


class Responder(threading.Thread):
    """A person answering the approval through the public REST API, while ``dag.test`` waits.

    Logs in (``POST /auth/token``), polls ``GET .../hitlDetails?task_id=approve`` until the
    task instance is awaiting input, then ``PATCH``es the choice. On any failure it fails the
    parked task instance, so the run ends instead of waiting forever, and the error is
    raised by ``__exit__``.
    """

    def __init__(self, app, run_id: str, choice: str):
        super().__init__(daemon=True)
        self.app, self.run_id, self.choice = app, run_id, choice
        self.detail = self.response = None
        self.unauthenticated_status = self.second_answer_status = None
        self.error: BaseException | None = None
        self.started_at = dt.datetime.now(dt.timezone.utc)

    def run(self):
        from fastapi.testclient import TestClient

        try:
            with TestClient(self.app) as client:
                self.answer(client)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
            fail_waiting_approval(self.run_id)

    def answer(self, client):
        base = hitl_path(self.run_id)
        self.unauthenticated_status = client.get(f"{base}/hitlDetails").status_code
        login = client.post("/auth/token", json={"username": USER, "password": PASSWORD})
        assert login.status_code == 201, login.text
        client.headers["Authorization"] = f"Bearer {login.json()['access_token']}"

        deadline = time.monotonic() + ANSWER_TIMEOUT
        while True:
            listing = client.get(f"{base}/hitlDetails", params={"task_id": "approve"})
            if listing.status_code == 200:
                # Only a request of this run: dag.test replaces an older run of the same
                # logical date (left waiting by an interrupted session, say) after we started.
                waiting = [d for d in listing.json()["hitl_details"]
                           if d["task_instance"]["state"] == "awaiting_input"
                           and dt.datetime.fromisoformat(d["created_at"]) >= self.started_at]
                if waiting:
                    (self.detail,) = waiting
                    break
            elif listing.status_code != 404:  # 404: the run does not exist yet
                raise AssertionError(f"GET hitlDetails: {listing.status_code} {listing.text}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no approval request of run {self.run_id} after "
                                   f"{ANSWER_TIMEOUT}s: {listing.status_code} {listing.text}")
            time.sleep(1)

        url = f"{base}/taskInstances/approve/-1/hitlDetails"
        answer = client.patch(url, json={"chosen_options": [self.choice]})
        assert answer.status_code == 200, answer.text
        self.response = answer.json()
        self.second_answer_status = client.patch(url, json={"chosen_options": ["Approve"]}).status_code

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.join(timeout=60)
        assert not self.is_alive(), "the responder is still running"
        if self.error is not None:
            raise self.error


def fail_waiting_approval(run_id: str) -> None:
    """Fail the ``approve`` task instance if it is still waiting, so ``dag.test`` returns."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from airflow.utils.state import TaskInstanceState

    with create_session() as session:
        for ti in session.query(TaskInstance).filter_by(dag_id="rebalance", run_id=run_id,
                                                        task_id="approve"):
            if ti.state in (TaskInstanceState.AWAITING_INPUT, TaskInstanceState.DEFERRED,
                            None, TaskInstanceState.SCHEDULED, TaskInstanceState.QUEUED):
                ti.state = TaskInstanceState.FAILED


def stored_detail(app, run_id: str) -> dict:
    """The HITL detail of ``approve`` as the API shows it after the run."""
    from fastapi.testclient import TestClient

    with TestClient(app) as client:
        login = client.post("/auth/token", json={"username": USER, "password": PASSWORD})
        headers = {"Authorization": f"Bearer {login.json()['access_token']}"}
        got = client.get(f"{hitl_path(run_id)}/taskInstances/approve/-1/hitlDetails",
                         headers=headers)
        assert got.status_code == 200, got.text
        return got.json()


def assert_request_names_the_plan(responder: Responder, plan_id: str):
    detail = responder.detail
    assert detail["subject"] == f"Apply rebalance plan {plan_id}?"
    # The body is Markdown for a person: the plan, its figures and a link to its page.
    assert f"`{plan_id}`" in detail["body"] and f"(/rebalance/plans/{plan_id})" in detail["body"]
    assert "imbalance" in detail["body"] and "key(s) move" in detail["body"]
    assert detail["options"] == ["Approve", "Reject"] and detail["defaults"] == ["Reject"]
    assert detail["multiple"] is False and detail["response_received"] is False
    assert responder.unauthenticated_status == 401  # the API refuses an anonymous caller
    assert responder.second_answer_status == 409    # and a second answer


# -------------------------------------------------------------------- tests
def test_approved_plan_is_applied_and_verified(dag, data, spark, api_app):
    from rebalance.spark import tables
    from rebalance.spark.plan_store import PLANS, PlanStore

    run_id = run_id_for(APPROVE_AT)
    di = seed_interval(spark, dag, APPROVE_AT, traffic(skewed=True))
    with JobStandIn(spark, di.end, traffic(skewed=True)):
        with Responder(api_app, run_id, "Approve") as responder:
            dr, states = run_dag(dag, APPROVE_AT, CONF)

    assert dr.run_id == run_id and dr.state == "success", states
    assert states["approval_gate"] == "success" and states["no_approval_needed"] == "skipped"
    assert states["approve"] == "success"
    assert all(states[t] == "success" for t in ("windows", "detect", "plan", "validate",
                                               "publish", "apply", "verify"))
    store = PlanStore(spark)
    (plan,) = store.plans()
    assert_request_names_the_plan(responder, plan.plan_id)
    assert responder.response["chosen_options"] == ["Approve"]
    assert responder.response["responded_by"]["name"] == USER

    assert plan.status == "verified" and plan.run_id == run_id
    assert plan.params["require_approval"] is True
    assert plan.assignment_version == 1
    assert plan.realised_imbalance == pytest.approx(plan.predicted_imbalance, rel=1e-6)
    live = live_assignment(spark)
    assert live.version == 1 and live.metadata["plan_id"] == plan.plan_id
    commits = [c.metadata for c in store.history(PLANS)[1:]]
    assert [c["action"] for c in commits] == ["propose", "validate", "publish", "apply", "verify"]
    (published,) = tables.assignment_history(spark)
    assert published.version == 1 and published.metadata["plan_id"] == plan.plan_id

    stored = stored_detail(api_app, run_id)
    assert stored["response_received"] is True and stored["chosen_options"] == ["Approve"]
    assert stored["responded_by_user"]["name"] == USER


def test_rejected_plan_is_not_applied(dag, data, spark, api_app):
    from rebalance.spark.plan_store import PLANS, PlanStore

    run_id = run_id_for(REJECT_AT)
    seed_interval(spark, dag, REJECT_AT, traffic(skewed=True))
    before = live_assignment(spark)
    with Responder(api_app, run_id, "Reject") as responder:
        dr, states = run_dag(dag, REJECT_AT, CONF)

    assert dr.run_id == run_id and dr.state == "success", states
    assert states["publish"] == "success" and states["approval_gate"] == "success"
    assert states["approve"] == "success" and states["no_approval_needed"] == "skipped"
    assert states["apply"] == "skipped" and states["verify"] == "skipped"
    store = PlanStore(spark)
    (plan,) = store.plans()
    assert_request_names_the_plan(responder, plan.plan_id)
    assert responder.response["chosen_options"] == ["Reject"]

    assert plan.status == "published" and plan.assignment_version is None
    commits = [c.metadata for c in store.history(PLANS)[1:]]
    assert [c["action"] for c in commits] == ["propose", "validate", "publish"]
    live = live_assignment(spark)
    assert before.version == live.version == 0 and live.routing == {}
    assert table_versions(spark)["assignments"] == 1  # created empty, never published

    stored = stored_detail(api_app, run_id)
    assert stored["response_received"] is True and stored["chosen_options"] == ["Reject"]
