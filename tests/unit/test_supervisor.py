"""The service supervisor (``make up`` / ``down`` / ``status``) on stand-in processes.

Real processes (bash, sleep) stand in for Airflow and Spark: what is checked is the
supervisor's own contract: records of what it started, no second copy, every process of
a component's tree stopped (children that ignore SIGTERM included), a stale record seen
as dead, a taken port refused with a clear message.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

import pytest

from rebalance.ops.processes import descendants as _children
from rebalance.ops.processes import running as _running
from rebalance.ops.service import (
    Component,
    Service,
    ServiceError,
    Settings,
    airflow_env,
    alive,
    components,
)
from rebalance.spark.session import SparkSetupError


def stand_ins(script: dict[str, str]):
    def parts(settings: Settings) -> list[Component]:
        return [Component(name, ["bash", "-c", code], dict(os.environ), ready_line=None)
                for name, code in script.items()]
    return parts


@pytest.fixture()
def settings(tmp_path):
    return Settings(data=tmp_path / "data", airflow_home=tmp_path / "airflow",
                    api_port=18080, connect_port=18002)


def test_up_records_each_process_and_a_second_up_starts_nothing(settings):
    lines = []
    svc = Service(settings, out=lines.append,
                  parts=stand_ins({"a": "sleep 60", "b": "sleep 60 & sleep 60 & wait"}))
    try:
        assert svc.up() == ["a", "b"]
        records = svc.records()
        assert set(records) == {"a", "b"} and all(alive(r) for r in records.values())
        assert svc.up() == []
        assert sum("already running" in line for line in lines) == 2
        assert {r.pid for r in svc.records().values()} == {r.pid for r in records.values()}
        assert all(s.startswith("running") for s in svc.status().values())
    finally:
        svc.down()
    assert all(not _running(r.pid) for r in records.values())
    assert svc.status() == {"a": "stopped", "b": "stopped"}


def test_down_stops_the_whole_tree_even_children_that_ignore_sigterm(settings):
    # A child in its own session (not in the component's process group) that ignores
    # SIGTERM: down must still find it (descendants of the recorded pid) and kill it.
    code = "setsid bash -c 'trap \"\" TERM; sleep 120' & trap '' TERM; sleep 120 & wait"
    svc = Service(settings, out=lambda _: None, parts=stand_ins({"stubborn": code}))
    import rebalance.ops.service as service_module

    service_module.STOP_GRACE_SECONDS, grace = 1.0, service_module.STOP_GRACE_SECONDS
    try:
        svc.up()
        rec = svc.records()["stubborn"]
        # the shell, its plain ``sleep`` and the setsid one (bash runs its last command
        # in place: the setsid shell becomes its ``sleep``)
        deadline = time.monotonic() + 5
        while len(_children(rec.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = [rec.pid, *_children(rec.pid)]
        assert len(tree) >= 3, tree
        assert svc.down() == ["stubborn"]
        assert [p for p in tree if _running(p)] == []
    finally:
        service_module.STOP_GRACE_SECONDS = grace
        svc.down()


def test_a_record_of_a_process_that_died_is_reported_dead_and_replaced(settings):
    svc = Service(settings, out=lambda _: None, parts=stand_ins({"a": "sleep 60"}))
    try:
        svc.up()
        first = svc.records()["a"]
        os.kill(first.pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while alive(first) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.status()["a"].startswith("dead")
        assert svc.up() == ["a"]
        assert svc.records()["a"].pid != first.pid
    finally:
        svc.down()


def test_a_taken_port_is_refused_with_the_component_named(settings):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]

        def parts(s):
            return [Component("api-server", ["sleep", "60"], dict(os.environ), port=port)]
        svc = Service(settings, out=lambda _: None, parts=parts)
        with pytest.raises(ServiceError, match=rf"port 127.0.0.1:{port} for api-server is taken"):
            svc.up()
        assert svc.records() == {}


def test_the_service_listens_on_loopback_and_runs_the_control_plane_on_spark_connect(settings):
    env = airflow_env(settings)
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION"] == "False"
    assert env["REBALANCE_SPARK_REMOTE"] == "sc://127.0.0.1:18002"
    assert env["AIRFLOW_HOME"] == str(settings.airflow_home)
    parts = {c.name: c for c in components(settings)}
    # the shipped registry's two jobs: the built-in one and the sessions example
    assert list(parts) == ["spark-connect", "generator", "job", "job-sessions", "api-server",
                           "scheduler", "dag-processor", "triggerer"]
    connect = " ".join(parts["spark-connect"].argv)
    assert "spark.connect.grpc.binding.address=127.0.0.1" in connect
    assert "spark.connect.grpc.binding.port=18002" in connect
    assert "spark.sql.codegen.cache.maxEntries=1000" in connect  # as every session's JVM
    assert "--host 127.0.0.1 --port 18080" in " ".join(parts["api-server"].argv)
    # Airflow's log servers would listen on 0.0.0.0: not started (logs are local files).
    assert "--skip-serve-logs" in parts["scheduler"].argv
    assert "--skip-serve-logs" in parts["triggerer"].argv
    # The job is a local Spark app of its own, not a client of the control plane's server.
    assert "REBALANCE_SPARK_REMOTE" not in parts["job"].env
    assert parts["generator"].env["REBALANCE_SPARK_REMOTE"] == "sc://127.0.0.1:18002"
    assert parts["job"].stop_signal == signal.SIGINT
    assert parts["job"].argv[0] == sys.executable


def test_job_sessions_runs_the_example_under_its_own_name_and_is_refused_over_another_jobs_tables(
        settings):
    """``make up JOB=sessions``: the job component is the sessions example's entry point,
    the DAG controls the job named ``sessions``; the job is recorded for ``down``/``status``;
    a data directory with the keyed job's tables, or SOURCE=kafka, is refused in one line
    before anything starts."""
    import dataclasses

    sessions = dataclasses.replace(settings, job="sessions")
    job = next(c for c in components(sessions) if c.name == "job")
    assert job.argv[1].endswith("spark_apps/example_job.py")
    assert job.argv[job.argv.index("--example") + 1] == "sessions"
    assert job.argv[job.argv.index("--name") + 1] == "sessions"
    views = next(c for c in components(dataclasses.replace(settings, job="views"))
                 if c.name == "job")
    assert views.argv[views.argv.index("--example") + 1] == "views"
    assert views.argv[views.argv.index("--name") + 1] == "views"
    assert job.ready_line == "running"
    assert airflow_env(sessions)["REBALANCE_JOB_NAME"] == "sessions"
    assert airflow_env(settings)["REBALANCE_JOB_NAME"] == "keyed"

    def parts(s):
        return []

    settings.state.mkdir(parents=True)
    Service(sessions, out=lambda _: None, parts=parts)._record_source()
    assert (settings.state / "job").read_text() == "sessions\n"
    assert dataclasses.replace(settings, job=None).job_app == "sessions"
    (settings.data / "tables" / "key_histograms" / "_delta_log").mkdir(parents=True)
    with pytest.raises(ServiceError, match="holds the sessions job's tables; JOB=keyed needs a "
                                           "data directory of its own"):
        Service(dataclasses.replace(settings, job="keyed"), out=lambda _: None,
                parts=parts)._record_source()
    with pytest.raises(ServiceError, match="JOB=sessions reads the events table; SOURCE=kafka"):
        Service(dataclasses.replace(sessions, source="kafka"), out=lambda _: None,
                parts=parts)._record_source()


def test_the_users_spark_conf_reaches_the_spark_connect_server_and_wins(settings, monkeypatch):
    """REBALANCE_SPARK_CONF tunes the control plane's JVM as it tunes every session: a
    key the service sets is replaced, not given twice (spark-submit keeps the last)."""
    monkeypatch.setenv("REBALANCE_SPARK_CONF", "spark.sql.shuffle.partitions=3;spark.x.y=z")
    argv = next(c for c in components(settings) if c.name == "spark-connect").argv
    confs = [argv[i + 1] for i, a in enumerate(argv) if a == "--conf"]
    assert "spark.x.y=z" in confs
    assert [c for c in confs if c.startswith("spark.sql.shuffle.partitions=")] == [
        "spark.sql.shuffle.partitions=3"]
    monkeypatch.setenv("REBALANCE_SPARK_CONF", "no-equals-sign")
    with pytest.raises(SparkSetupError, match="'no-equals-sign' is not of the form key=value"):
        components(settings)


def test_no_credential_is_part_of_the_commands(settings):
    for comp in components(settings):
        # (the Kafka connector's spark-token-provider JAR is a file name, not a credential)
        text = " ".join(comp.argv).lower().replace("spark-token-provider", "")
        assert "password" not in text and "jwt" not in text and "token" not in text


def test_a_record_written_with_start_ticks_still_names_its_process(tmp_path):
    """Records of an earlier version hold the kernel's start ticks: the process they name
    is still taken for running (no second copy started), a recycled pid is not."""
    import json
    import os

    from rebalance.ops.service import Record

    ticks = int(open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19])
    path = tmp_path / "job.json"
    path.write_text(json.dumps({"name": "job", "pid": os.getpid(), "start_ticks": ticks,
                                "argv": ["x"], "log": "log", "started_at": 0.0}))
    assert alive(Record.load(path))
    # a recycled pid: another start (not a whole number of seconds off, which a move of
    # the wall clock makes of the same start: processes.same_start)
    path.write_text(json.dumps({"name": "job", "pid": os.getpid(), "start_ticks": ticks - 137,
                                "argv": ["x"], "log": "log", "started_at": 0.0}))
    assert not alive(Record.load(path))
