"""The REST client's run creation against a real HTTP server on 127.0.0.1 that answers as a
busy api-server does (HTTP 500 "database is locked", then the run, or HTTP 409 when an
earlier attempt had created it), and the service's SQLite settings Airflow imports."""

from __future__ import annotations

import importlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from rebalance.ops import airflow_db
from rebalance.ops.airflow_client import AirflowClient, AirflowError
from rebalance.ops.service import Settings, airflow_env

RUNS = "/api/v2/dags/rebalance/dagRuns"


class Api:
    """An api-server that answers the run POSTs with ``statuses`` in turn (200: create)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.posted: list[dict] = []
        self.runs: dict[str, dict] = {}
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/auth/token":
                    return self._answer(201, {"access_token": "t"})
                api.posted.append(body)
                status = api.statuses.pop(0)
                run_id = body["dag_run_id"]
                if status == 200:
                    api.runs[run_id] = {"dag_run_id": run_id, "state": "queued",
                                        "conf": body["conf"]}
                    return self._answer(200, api.runs[run_id])
                return self._answer(status, {"detail": f"answer {status}"})

            def do_GET(self) -> None:
                run_id = self.path.rsplit("/", 1)[1]
                if run_id in api.runs:
                    return self._answer(200, api.runs[run_id])
                return self._answer(404, {"detail": "no such run"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> AirflowClient:
        self.thread.start()
        return AirflowClient(f"http://127.0.0.1:{self.server.server_port}", "admin", "admin")

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_run_refused_by_a_busy_api_server_is_asked_again_with_the_same_run_id():
    api = Api([500, 503, 200])
    with api as client:
        run = client.trigger("rebalance", {"theta": 0.2}, backoff=(0, 0, 0))
    assert run["state"] == "queued" and run["conf"] == {"theta": 0.2}
    ids = {b["dag_run_id"] for b in api.posted}
    assert len(api.posted) == 3 and len(ids) == 1 and run["dag_run_id"] in ids
    # named as Airflow names a manual run, within its default allowed_run_id_pattern
    assert re.fullmatch(r"manual__[A-Za-z0-9_.~:+-]+", run["dag_run_id"]), run["dag_run_id"]


def test_a_retry_that_finds_the_run_created_returns_it_once():
    api = Api([500, 409])  # the first attempt created the run, then failed to answer
    api.runs["r1"] = {"dag_run_id": "r1", "state": "running", "conf": {}}
    with api as client:
        run = client.trigger("rebalance", {}, run_id="r1", backoff=(0,))
    assert run == {"dag_run_id": "r1", "state": "running", "conf": {}}
    assert len(api.posted) == 2


@pytest.mark.parametrize("statuses, status, posts", [
    ([409], 409, 1),            # the user's run id is taken: not ours to return
    ([400], 400, 1),            # a bad request is refused at once
    ([500, 500, 500], 500, 3),  # still failing after every retry: the last answer
])
def test_what_a_retry_cannot_mend_is_raised_with_its_status(statuses, status, posts):
    api = Api(statuses)
    with api as client, pytest.raises(AirflowError) as err:
        client.trigger("rebalance", {}, run_id="r1", backoff=(0, 0))
    assert err.value.status == status and len(api.posted) == posts
    assert f"HTTP {status}: answer {status}" in str(err.value)


def test_the_service_makes_airflow_wait_for_sqlites_write_lock_longer(tmp_path):
    env = airflow_env(Settings(data=tmp_path / "data", airflow_home=tmp_path / "airflow"))
    for key in ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONNECT_ARGS_ASYNC"):
        module, name = env[key].rsplit(".", 1)  # as Airflow's conf.getimport resolves it
        args = getattr(importlib.import_module(module), name)
        assert args == {"timeout": airflow_db.BUSY_TIMEOUT_SECONDS} and args["timeout"] > 5
