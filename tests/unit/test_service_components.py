"""What ``make up`` / ``make up SOURCE=kafka`` would start (argv only: no process runs here),
the source recorded for ``down`` / ``status``, and the restart's Kafka offsets."""

from __future__ import annotations

import json

import pytest

from rebalance.ops.service import Service, ServiceError, Settings, airflow_env, components
from rebalance.streaming.restart.checkpoint import (
    RestartError,
    kafka_source_after,
    with_new_partitions,
)


def _settings(tmp_path, **kw) -> Settings:
    return Settings(data=tmp_path / "data", airflow_home=tmp_path / "airflow", **kw)


def _argv(parts, name) -> list[str]:
    return next(c.argv for c in parts if c.name == name)


def _option(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_delta_service_has_no_broker_and_no_kafka_options(tmp_path):
    parts = components(_settings(tmp_path, source="delta"))
    # the generator and the jobs first (their windows are what every DAG run waits for);
    # the jobs' readiness is awaited after Airflow's daemons started. The shipped registry
    # (rebalance.toml): the built-in job, then the sessions example over its events.
    assert [c.name for c in parts] == ["spark-connect", "generator", "job", "job-sessions",
                                       "api-server", "scheduler", "dag-processor", "triggerer"]
    assert [c.name for c in parts if c.ready_later] == ["job", "job-sessions"]
    for name in ("generator", "job", "job-sessions"):
        argv = _argv(parts, name)
        assert not {"--sink", "--source", "--bootstrap-servers", "--topic"} & set(argv), argv
    assert _option(_argv(parts, "job"), "--name") == "keyed"
    data = tmp_path / "data"
    sessions = _argv(parts, "job-sessions")
    assert (_option(sessions, "--example"), _option(sessions, "--name"),
            _option(sessions, "--tables-root"), _option(sessions, "--events-root")) == (
        "sessions", "sessions", str(data / "jobs" / "sessions" / "tables"), str(data / "tables"))
    assert airflow_env(_settings(tmp_path, source="delta"))["REBALANCE_JOB_NAME"] == "keyed"


def test_the_one_job_registry_starts_the_built_in_job_alone(tmp_path):
    from rebalance.core import registry
    from rebalance.spark.paths import REPO_ROOT

    one = registry.load(REPO_ROOT / "examples" / "one_job.toml")
    s = _settings(tmp_path, source="delta", registry=one)
    assert [c.name for c in components(s)] == ["spark-connect", "generator", "job",
                                               "api-server", "scheduler", "dag-processor",
                                               "triggerer"]
    assert airflow_env(s)["REBALANCE_REGISTRY"] == str(one.path)
    assert s.dag_ids == ("rebalance", "rebalance_maintenance", "rebalance_healthcheck",
                         "rebalance_rollback")


@pytest.mark.parametrize("kw, message", [
    ({"source": "kafka"}, "jobs.sessions: SOURCE=kafka runs the first job alone"),
    ({"source": "delta", "job": "sessions"},
     "jobs.sessions: JOB=sessions runs the first job as 'sessions', this job's name"),
])
def test_up_refuses_kafka_or_a_job_named_as_another_on_the_shipped_registry(tmp_path, kw,
                                                                            message):
    """``make up SOURCE=kafka`` and ``make up JOB=<example>`` take examples/one_job.toml
    (Makefile); the same run with the shipped two jobs is one line, before anything starts."""
    s = _settings(tmp_path, **kw)
    with pytest.raises(ServiceError) as err:
        Service(s, out=lambda _: None).up(wait=False)
    assert str(err.value).startswith(f"{s.registry.path}: {message}")
    assert str(err.value).endswith("run it with a one-job registry "
                                   "(REGISTRY=examples/one_job.toml)")
    assert not s.pids.exists() or not any(s.pids.iterdir())
    # another example as the first job, and the sessions job beside it, is fine
    components(_settings(tmp_path, source="delta", job="views"))


def test_kafka_service_starts_a_broker_first_and_points_generator_and_job_at_it(tmp_path):
    s = _settings(tmp_path, source="kafka", kafka_port=19192, topic="ev")
    parts = components(s)
    assert [c.name for c in parts] == ["kafka", "spark-connect", "generator", "job",
                                       "api-server", "scheduler", "dag-processor", "triggerer"]
    broker = parts[0]
    assert broker.argv[1:] == ["-m", "rebalance.cli", "kafka", "run", "--dir",
                               str(tmp_path / "data" / "kafka"), "--port", "19192"]
    assert broker.port == 19192            # ready when its client port accepts connections
    gen, job = _argv(parts, "generator"), _argv(parts, "job")
    assert gen[1].endswith("spark_apps/generate_events.py") and "--follow" in gen
    assert (_option(gen, "--sink"), _option(gen, "--bootstrap-servers"),
            _option(gen, "--topic")) == ("kafka", "127.0.0.1:19192", "ev")
    assert job[1].endswith("spark_apps/restartable_job.py")
    # Its own job name (a checkpoint keeps its source), which the DAG's restarts address.
    assert _option(job, "--name") == airflow_env(s)["REBALANCE_JOB_NAME"] == "keyed-kafka"
    assert (_option(job, "--source"), _option(job, "--bootstrap-servers"),
            _option(job, "--topic")) == ("kafka", "127.0.0.1:19192", "ev")
    # The options parse as the apps parse them.
    from importlib import util

    from rebalance.spark.paths import REPO_ROOT

    for app, argv in (("restartable_job", job), ("generate_events", gen)):
        spec = util.spec_from_file_location(app, REPO_ROOT / "spark_apps" / f"{app}.py")
        module = util.module_from_spec(spec)
        spec.loader.exec_module(module)
        args = module.parse_args(argv[2:])
        assert args.bootstrap_servers == "127.0.0.1:19192" and args.topic == "ev"


def test_down_and_status_go_by_the_source_up_recorded(tmp_path):
    s = _settings(tmp_path)
    assert s.events_source == "delta"                 # nothing recorded: delta
    s.state.mkdir(parents=True)
    (s.state / "source").write_text("kafka\n")
    assert s.events_source == "kafka"
    assert "kafka" in Service(s).status()             # down / status see the broker
    # ... and not the shipped registry's sessions job, which up on Kafka does not run
    # (make up SOURCE=kafka takes examples/one_job.toml): make status shows what runs
    assert "job-sessions" not in Service(s).status()
    assert _settings(tmp_path, source="delta").events_source == "delta"
    assert "job-sessions" in Service(_settings(tmp_path, source="delta")).status()


def test_up_refuses_another_source_while_the_recorded_one_runs(tmp_path):
    import dataclasses
    import os
    import time

    from rebalance.ops.processes import start_time
    from rebalance.ops.service import Record

    s = _settings(tmp_path, source="delta")
    s.pids.mkdir(parents=True)
    (s.state / "source").write_text("kafka\n")
    # This test process stands for a running broker of the recorded (kafka) service.
    me = Record("kafka", os.getpid(), start_time(os.getpid()), ["x"], "log", time.time())
    (s.pids / "kafka.json").write_text(json.dumps(dataclasses.asdict(me)))
    with pytest.raises(ServiceError, match="SOURCE=kafka.*make down"):
        Service(s)._record_source()      # what up does first
    assert (s.state / "source").read_text() == "kafka\n"


def test_kafka_restart_starts_at_the_old_checkpoints_offsets():
    logged = {"ev": {"1": 120, "0": 95}}
    assert kafka_source_after(logged, "ev") == {"kafka_offsets": {"ev": {"1": 120, "0": 95}}}
    for bad in ({"reservoirVersion": 3, "index": 0}, {"other": {"0": 1}}, {"ev": {}},
                {"ev": {"0": -1}}, {"ev": {"0": 1}, "x": {"0": 1}}):
        with pytest.raises(RestartError, match="not one of Kafka topic"):
            kafka_source_after(bad, "ev")


def test_partitions_added_after_the_last_commit_start_at_their_earliest_offset():
    logged = {"ev": {"1": 120, "0": 95}}
    assert with_new_partitions(logged, "ev", [0, 1]) == {"ev": {"0": 95, "1": 120}}
    assert with_new_partitions(logged, "ev", [3, 2, 1, 0]) == {
        "ev": {"0": 95, "1": 120, "2": -2, "3": -2}}
    with pytest.raises(RestartError, match="no partition 1 any more.*deleted and created"):
        with_new_partitions(logged, "ev", [0])


def test_live_generator_to_kafka_continues_its_recorded_stream(tmp_path):
    import dataclasses

    from rebalance.streaming.generator import GeneratorConfig, kafka_follow_record, kafka_follow_start

    record = kafka_follow_record(tmp_path / "tables", "ev")
    assert record == tmp_path / "tables" / "_kafka_follow" / "ev.json"
    config = GeneratorConfig(batch_seconds=10.0)
    # Nothing recorded: a new stream from now, rounded down to a batch, from batch 0.
    assert kafka_follow_start(config, record, now=1_700_000_005.0) == ("2023-11-14T22:13:20Z", 0)
    record.parent.mkdir(parents=True)
    options = {k: v for k, v in config.to_dict().items() if k != "start"}
    record.write_text(json.dumps({"start": "2023-11-14T20:00:00Z", "options": options,
                                  "last_batch": 41}))
    assert kafka_follow_start(config, record, now=1_700_000_005.0) == ("2023-11-14T20:00:00Z", 42)
    # Other options: another stream (a new start, from batch 0).
    other = dataclasses.replace(config, seed=config.seed + 1)
    assert kafka_follow_start(other, record, now=1_700_000_005.0)[1] == 0


def test_follow_hands_each_due_batch_to_its_writer_after_the_recorded_one():
    import threading

    from rebalance.streaming.generator import GeneratorConfig, follow

    config = GeneratorConfig(batch_seconds=10.0, start="2023-11-14T22:13:20Z")
    start = 1_700_000_000.0
    now, written = [start + 25.0], []

    class Stop(threading.Event):     # simulated time: a wait moves the clock on at once
        def wait(self, timeout=None):
            now[0] += timeout
            return self.is_set()

    stop = Stop()

    def clock():
        return now[0]

    def write(generator, batch):     # what kafka_follower does, minus the broker
        assert len(generator.batch(batch).events) == config.events_per_batch
        written.append((batch, now[0]))
        if len(written) == 3:
            stop.set()

    # Batches 0..2 were produced by an earlier run (first=3); 3 is due at start + 40 s.
    follow(None, config, stop=stop, clock=clock, write=write, first=3)
    assert [b for b, _ in written] == [3, 4, 5]
    assert all(start + (b + 1) * 10.0 <= t < start + (b + 2) * 10.0 for b, t in written)


def test_airflow_daemons_run_under_keepalive(tmp_path):
    parts = components(_settings(tmp_path, source="delta"))
    for name, cmd in (("scheduler", "scheduler"), ("dag-processor", "dag-processor"),
                      ("triggerer", "triggerer")):
        argv = _argv(parts, name)
        assert argv[1:5] == ["-m", "rebalance.cli.keepalive", "--name", name], argv
        assert argv[5] == "--" and argv[6].endswith("/airflow") and argv[7] == cmd, argv


def test_keepalive_starts_a_daemon_again_after_it_exits_and_stops_on_sigterm(tmp_path):
    """A daemon that exits twice is started three times; SIGTERM to the wrapper stops the
    daemon and ends the wrapper with no restart."""
    import signal
    import subprocess
    import sys
    import time

    starts = tmp_path / "starts"
    daemon = ("import pathlib, sys, time\n"
              f"p = pathlib.Path({str(starts)!r})\n"
              "n = len(p.read_text()) if p.exists() else 0\n"
              "p.write_text('x' * (n + 1))\n"
              "sys.exit(3) if n < 2 else time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, "-m", "rebalance.cli.keepalive", "--name", "d",
                             "--", sys.executable, "-c", daemon],
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (starts.exists() and len(starts.read_text()) == 3):
        assert time.monotonic() < deadline and proc.poll() is None, "not started 3 times"
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM, (proc.returncode, out)
    assert len(starts.read_text()) == 3
    assert out.count("keepalive: d exited with code 3") == 2, out
    assert "starting it again in 1 s (restart 1)" in out and "in 2 s (restart 2)" in out, out


DRIVER_WORKER = "pyspark.sql.streaming.transform_with_state_driver_worker"


def test_the_jobs_python_processes_start_with_the_quiet_worker_hook(tmp_path):
    from rebalance.ops.service import WORKER_SITE

    s = _settings(tmp_path)
    job = next(c for c in components(s) if c.name == "job")
    assert job.env["PYTHONPATH"].split(":")[0] == str(WORKER_SITE)
    assert job.env["REBALANCE_PYTHON_WORKER_LOG"] == str(s.logs / "job-python-worker.log")
    sessions = next(c for c in components(s) if c.name == "job-sessions")
    assert sessions.env["REBALANCE_PYTHON_WORKER_LOG"] == str(
        s.logs / "job-sessions-python-worker.log")
    others = [c for c in components(s) if c.name not in ("job", "job-sessions")]
    assert not any("REBALANCE_PYTHON_WORKER_LOG" in c.env for c in others)


def test_the_hook_sends_only_the_driver_workers_stdout_to_its_log(tmp_path):
    """A stand-in for PySpark's driver worker (a module of that name, found first on the
    path) prints as the real one does, then fails: its prints land in the log, its stderr
    and exit status are untouched; any other module prints as usual."""
    import os
    import subprocess
    import sys

    from rebalance.ops.service import quiet_python_workers

    fake = tmp_path / "fake" / "pyspark" / "sql" / "streaming"
    fake.mkdir(parents=True)
    for folder in (fake, fake.parent, fake.parent.parent):
        (folder / "__init__.py").write_text("")
    (fake / "transform_with_state_driver_worker.py").write_text(
        "import sys\nprint('Starting Streaming TransformWithStateInPandas Python worker.')\n"
        "print('a processor error', file=sys.stderr)\nraise SystemExit(3)\n")
    (fake / "other.py").write_text("print('an executor line')\n")
    log = tmp_path / "worker.log"
    env = quiet_python_workers({**os.environ, "PYTHONPATH": str(tmp_path / "fake")}, log)
    done = subprocess.run([sys.executable, "-m", DRIVER_WORKER], env=env, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (3, "")
    assert "a processor error" in done.stderr
    assert log.read_text() == "Starting Streaming TransformWithStateInPandas Python worker.\n"
    other = subprocess.run([sys.executable, "-m", "pyspark.sql.streaming.other"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert other.stdout == "an executor line\n"


def test_the_first_run_covers_the_windows_since_the_generator_started():
    import datetime as dt

    from rebalance.ops.service_dags import first_interval

    now = dt.datetime(2026, 12, 6, 11, 56, 31, tzinfo=dt.timezone.utc)
    started = dt.datetime(2026, 12, 6, 11, 55, 33, tzinfo=dt.timezone.utc).timestamp()
    # from the start of the 20-s window the generator started in (epoch-aligned, as the
    # job's windows), so the job's first window is in, to now
    assert first_interval(started, 20, now) == ("2026-12-06T11:55:20+00:00",
                                                 "2026-12-06T11:56:31+00:00")
    # triggered 12 s after the generator started: to the end of its second window, so
    # that the interval holds the two windows a run needs by default (min_windows)
    soon = dt.datetime(2026, 12, 6, 11, 55, 45, tzinfo=dt.timezone.utc)
    assert first_interval(started, 20, soon) == ("2026-12-06T11:55:20+00:00",
                                                  "2026-12-06T11:56:00+00:00")
    assert first_interval(started, 20, soon, min_windows=3)[1] == "2026-12-06T11:56:20+00:00"


def test_a_start_time_read_after_the_wall_clock_moved_is_the_same_start():
    from rebalance.ops.processes import same_start

    t = 1_796_531_642.37
    assert same_start(t, t) and same_start(t, t + 0.004)
    assert same_start(t, t + 1.0) and same_start(t + 2.0, t)   # boot time moved by 1-2 s
    assert not same_start(t, t + 0.3)        # another process: another tick
    assert not same_start(t, t + 3.0)        # not a boot-time adjustment
    assert not same_start(t, t + 1.02)


TWO_JOBS = """
[service]
api_port = 18080
connect_port = 18002

[jobs.keyed]
dag_id = "rebalance"
tables = "tables"

[jobs.clicks]
app = "sessions"
instances = 2
[jobs.clicks.spark]
"spark.sql.shuffle.partitions" = 2
"""


def test_a_registry_of_two_jobs_starts_each_job_on_its_own_tables_and_dag(tmp_path,
                                                                         monkeypatch):
    from rebalance.core import registry

    path = tmp_path / "rebalance.toml"
    path.write_text(TWO_JOBS)
    for env in ("REBALANCE_API_PORT", "REBALANCE_CONNECT_PORT", "REBALANCE_JOB_NAME"):
        monkeypatch.delenv(env, raising=False)
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    s = _settings(tmp_path, source="delta")
    assert (s.api_port, s.connect_port, s.registry.path) == (18080, 18002, path)
    parts = components(s)
    assert [c.name for c in parts] == ["spark-connect", "generator", "job", "job-clicks",
                                       "api-server", "scheduler", "dag-processor", "triggerer"]
    assert [c.name for c in parts if c.ready_later] == ["job", "job-clicks"]
    data = tmp_path / "data"
    gen, job, clicks = (_argv(parts, n) for n in ("generator", "job", "job-clicks"))
    assert _option(gen, "--tables-root") == _option(job, "--tables-root") == str(data / "tables")
    assert clicks[1].endswith("spark_apps/example_job.py")
    assert (_option(clicks, "--example"), _option(clicks, "--name"),
            _option(clicks, "--instances"), _option(clicks, "--tables-root"),
            _option(clicks, "--events-root"), _option(clicks, "--conf")) == (
        "sessions", "clicks", "2", str(data / "jobs" / "clicks" / "tables"),
        str(data / "tables"), "spark.sql.shuffle.partitions=2")
    assert s.dag_ids == ("rebalance", "rebalance_clicks", "rebalance_maintenance",
                         "rebalance_healthcheck", "rebalance_rollback")
    assert airflow_env(s)["REBALANCE_REGISTRY"] == str(path)
    assert registry.load().job("clicks").dag_id == "rebalance_clicks"


@pytest.mark.parametrize("job, message", [
    ('app = "keyed"', "jobs.clicks.app: the service runs the built-in job once"),
    ('app = "sessions"\nsource = "kafka"', "jobs.clicks.source: a job after the first reads"),
    ('app = "sessions"\ntables = "s3a://bucket/clicks"',
     "jobs.clicks.tables: tables on the object store need the S3A JARs, and "),
])
def test_up_refuses_a_second_job_it_cannot_run_in_one_line_before_starting(
        tmp_path, monkeypatch, job, message):
    monkeypatch.setenv("REBALANCE_JARS_DIR", str(tmp_path / "no-jars"))
    path = tmp_path / "rebalance.toml"
    path.write_text(f"[jobs.keyed]\ndag_id = \"rebalance\"\ntables = \"tables\"\n"
                    f"[jobs.clicks]\n{job}\n")
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    s = _settings(tmp_path, source="delta")
    with pytest.raises(ServiceError) as err:
        Service(s, out=lambda _: None).up(wait=False)
    assert str(err.value).startswith(f"{path}: {message}")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "data" / "service" / "pids").exists() or not any(
        (tmp_path / "data" / "service" / "pids").iterdir())


def test_status_has_health_lines_for_every_job(tmp_path, monkeypatch):
    from rebalance.ops.health import service_lines

    path = tmp_path / "rebalance.toml"
    path.write_text(TWO_JOBS)
    monkeypatch.setenv("REBALANCE_REGISTRY", str(path))
    service = Service(_settings(tmp_path, source="delta"), out=lambda _: None)
    states = {"job": "stopped", "job-clicks": "running (pid 1, up 3 s)", "api-server": "stopped"}
    assert service_lines(service, states) == [
        ("dag", "unknown: the api-server is not running"),
        ("job", "NOT running; no window written yet"),
        ("clicks dag", "unknown: the api-server is not running"),
        ("clicks job", "running; no window written yet")]
