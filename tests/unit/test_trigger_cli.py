"""``rebalance trigger``: run params are checked before Airflow is asked, and every refusal is
one line with exit code 2 (the run itself, through the real api-server and scheduler, is in
tests/integration/test_service.py)."""

from __future__ import annotations

import socket

import pytest

from rebalance import cli
from rebalance.cli.trigger import parse_settings
from rebalance.control.params import PARAMS_SCHEMA, RunParams


def test_settings_are_json_values_or_text():
    conf = parse_settings(["force=true", "theta=0.2", "method=greedy", "max_table=null",
                           "lookback_windows=8"], None)
    assert conf == {"force": True, "theta": 0.2, "method": "greedy", "max_table": None,
                    "lookback_windows": 8}
    RunParams.parse(conf)


def test_set_wins_over_conf():
    conf = parse_settings(["theta=0.3"], '{"theta": 0.2, "apply_mode": "dry-run"}')
    assert conf == {"theta": 0.3, "apply_mode": "dry-run"}


def test_no_params_is_the_dags_defaults():
    assert parse_settings([], None) == {}


@pytest.mark.parametrize("pairs, conf, message", [
    (["thta=0.2"], None, "unknown run param(s) 'thta'"),
    (["force"], None, "expected name=value"),
    (["=1"], None, "expected name=value"),
    (["force=yes"], None, "'force' must be boolean"),
    (["theta=abc"], None, "'theta' must be number"),
    (["theta=0"], None, "'theta' is out of range"),
    (["theta=2.5"], None, "'theta' is out of range"),
    (["lookback_windows=1.5"], None, "'lookback_windows' must be integer"),
    (["method=fastest"], None, "'method' must be one of"),
    (["apply_mode=now"], None, "'apply_mode' must be one of"),
    (["migration_budget=1.5"], None, "'migration_budget' is out of range"),
    (["min_windows=5", "lookback_windows=2"], None, "exceeds lookback_windows"),
    ([], "{not json", "--conf is not JSON"),
    ([], "[1, 2]", "--conf must be a JSON object"),
    ([], '{"verify_windows": 0}', "'verify_windows' is out of range"),
])
def test_bad_params_are_refused_with_the_reason(pairs, conf, message):
    with pytest.raises(ValueError) as err:
        parse_settings(pairs, conf)
    assert message in str(err.value)


def test_every_param_of_the_dag_can_be_set():
    defaults = RunParams()
    pairs = []
    for name in PARAMS_SCHEMA:
        value = getattr(defaults, name)
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else value
        pairs.append(f"{name}={text}")
    assert RunParams.parse(parse_settings(pairs, None)) == defaults


def _refused(capsys, argv) -> str:
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith("rebalance trigger: error: "), err
    return err


def test_a_bad_param_is_refused_before_airflow_is_asked(capsys):
    # the URL is never reached: nothing listens on port 9 of 127.0.0.1
    err = _refused(capsys, ["trigger", "--url", "http://127.0.0.1:9", "--password", "x",
                            "--set", "theta=-1"])
    assert "'theta' is out of range" in err


def test_an_airflow_that_does_not_answer_is_one_line(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    err = _refused(capsys, ["trigger", "--url", f"http://127.0.0.1:{port}", "--password", "x"])
    assert "does not answer" in err and f"127.0.0.1:{port}" in err


def test_no_password_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))  # no generated password file there
    monkeypatch.delenv("REBALANCE_AIRFLOW_PASSWORD", raising=False)
    err = _refused(capsys, ["trigger", "--url", "http://127.0.0.1:9"])
    assert "no password for Airflow user 'admin'" in err


@pytest.mark.parametrize("timeout", ["0", "-5", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(capsys, timeout):
    err = _refused(capsys, ["trigger", "--wait", "--timeout", timeout, "--password", "x"])
    assert "--timeout must be a number of seconds > 0" in err


def test_a_skip_is_logged_the_way_the_trigger_command_finds_it(caplog):
    from rebalance.control.errors import RunSkipped
    from rebalance.ops.airflow_client import SKIPPED

    with caplog.at_level("INFO", logger="rebalance.control"):
        RunSkipped("too few events: 3 in 2 windows")
    assert [r.getMessage() for r in caplog.records] == [SKIPPED + "too few events: 3 in 2 windows"]


def test_skip_reasons_come_from_the_logs_of_skipped_tasks_that_ran():
    from rebalance.ops.airflow_client import AirflowClient, AirflowError

    class Logs(AirflowClient):  # the REST layer answers from a dict; the filtering is real
        asked: list = []

        def task_log(self, dag_id, run_id, task_id, try_number):
            self.asked.append((task_id, try_number))
            if task_id == "gone":
                raise AirflowError("GET ...: HTTP 404 not found", 404)
            return [{"event": "starting"}, {"event": "skipped: no table yet (waited for)"},
                    "a plain line", {"event": f"skipped: {task_id} had nothing to do"}]

    tis = {"windows": {"state": "success", "try_number": 1},
           "detect": {"state": "skipped", "try_number": 2},
           "plan": {"state": "skipped", "try_number": 0},     # skipped downstream, never ran
           "gone": {"state": "skipped", "try_number": 1}}
    client = Logs.__new__(Logs)  # no login: nothing here reaches an api-server
    assert client.skip_reasons("rebalance", "r1", tis) == {"detect": "detect had nothing to do"}
    assert client.asked == [("detect", 2), ("gone", 1)]


def test_the_plan_line_says_in_words_what_a_plan_does_not_have():
    from rebalance.cli.trigger import plan_line

    what_if = {"plan_id": "p1", "status": "what-if", "imbalance_before": 1.5,
               "predicted_imbalance": 1.04, "realised_imbalance": None, "moved_keys": 3,
               "assignment_version": None}
    line = plan_line(what_if)
    assert line == ("plan p1: what-if, imbalance 1.500 -> 1.040 predicted, - realised; "
                    "moves 3 keys; no assignment version (not applied)")
    applied = plan_line({**what_if, "status": "verified", "realised_imbalance": 1.06,
                         "assignment_version": 4})
    assert applied.endswith("1.060 realised; moves 3 keys; assignment version 4")
    assert "None" not in plan_line({"plan_id": "p2", "status": "rejected"})
