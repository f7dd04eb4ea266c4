"""``make up`` / ``make down`` / ``make status``: the rebalancing service on one machine.

``rebalance service up`` starts, in the background and on embedded defaults, every process
the service needs (Spark Connect, the generator, every job of the registry, then Airflow's
api-server, scheduler, dag-processor and triggerer under a keepalive; with ``SOURCE=kafka`` a broker
first), each in its own process group, its id recorded under ``<data>/service/pids/`` and
its output in ``<data>/service/logs/<name>.log``. ``up`` twice starts nothing new; ``down``
stops every recorded group and its descendants; ``status`` says what runs. All on
127.0.0.1. The processes, their settings and the schedule: ``docs/service.md``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from rebalance.core.registry import JobConfig
from rebalance.ops import airflow_db, processes
from rebalance.ops.service_settings import (  # noqa: F401 (part of this module's API)
    HOST,
    JOBS,
    OPS_DAGS,
    READY_TIMEOUT_SECONDS,
    SERVICE_SCHEDULE,
    SOURCES,
    STOP_GRACE_SECONDS,
    Component,
    ServiceError,
    Settings,
)
from rebalance.spark.java import ensure_java_home
from rebalance.spark.paths import REPO_ROOT, jars_dir


def _venv_bin(name: str) -> str:
    return str(Path(sys.executable).with_name(name))


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def base_env(s: Settings) -> dict[str, str]:
    """Environment shared by every component."""
    ensure_java_home()  # Java 17/21 for Spark Connect and the tasks' Spark (rebalance.spark.java)
    env = dict(os.environ)
    env.update({
        "REBALANCE_DATA_DIR": str(s.data),
        "REBALANCE_REGISTRY": str(s.registry.path),
        "REBALANCE_JARS_DIR": str(jars_dir()),
        "AIRFLOW_HOME": str(s.airflow_home),
        "PYTHONUNBUFFERED": "1",
        "SPARK_HOME": str(spark_home()),
        "PYSPARK_PYTHON": sys.executable,
        # Spark's web UI binds to SPARK_LOCAL_IP (else 0.0.0.0): loopback only.
        "SPARK_LOCAL_IP": HOST,
    })
    env.pop("REBALANCE_SPARK_REMOTE", None)
    return env


def airflow_env(s: Settings) -> dict[str, str]:
    """Airflow's settings for the service: this repository's DAGs and plugin, the
    LocalExecutor on the SQLite home, 127.0.0.1 only, the DAG unpaused at creation, and
    the control plane on the Spark Connect server."""
    env = base_env(s)
    env.update({
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO_ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO_ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "8",  # 8 forked task workers, not 32 idle (~24 MiB each)
        **airflow_db.SETTINGS,  # SQLite's write lock is waited for 30 s, not 5 s
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{s.api_url}/execution/",
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(s.api_port),
        "AIRFLOW__API__BASE_URL": s.api_url,
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        # New DAG files are picked up within seconds, not minutes.
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "20",
        "REBALANCE_SCHEDULE": s.schedule,
        "REBALANCE_SPARK_REMOTE": s.connect_url,
        # A scheduled run starts as its interval ends; the job writes the interval's last
        # windows once its watermark passed them.
        "REBALANCE_WINDOWS_WAIT_SECONDS": f"{s.windows_wait_seconds:g}",
        "REBALANCE_JOB_NAME": job_name(s),
        # The DAG's waits look again a few times per window (at most every 5 s).
        "REBALANCE_WAIT_POLL_SECONDS": f"{min(5.0, s.window_seconds / 4):g}",
        "REBALANCE_RETRY_DELAY_SECONDS": f"{s.retry_delay_seconds:g}",
    })
    if s.maintenance_schedule is not None:
        env["REBALANCE_MAINTENANCE_SCHEDULE"] = s.maintenance_schedule
    bad = [k for k in s.airflow_settings if not k.startswith("AIRFLOW__")]
    if bad:
        raise ServiceError(f"airflow_settings: {bad[0]!r} is not an AIRFLOW__SECTION__KEY name")
    env.update({k: str(v) for k, v in s.airflow_settings.items()})
    return env


def job_name(s: Settings) -> str:
    """The first job's name (checkpoints, restart requests): the registry's, or the app's
    when ``JOB`` runs another app; one per source (a checkpoint keeps its source)."""
    first = s.registry.jobs[0]
    if s.job_app != first.app:
        return s.job_app
    return f"{first.name}-kafka" if s.events_source == "kafka" else first.name


def components(s: Settings) -> list[Component]:
    """The service's processes, in start order (stopped in reverse)."""
    py = sys.executable
    airflow = _venv_bin("airflow")
    env = base_env(s)
    connect = _connect_server(s, env)
    aenv = airflow_env(s)
    genv = {**env, "REBALANCE_SPARK_REMOTE": s.connect_url}
    batch_seconds = s.batch_seconds
    kafka = s.events_source == "kafka"
    sink = ["--bootstrap-servers", s.bootstrap, "--topic", s.topic]
    first_tables = ["--tables-root", str(s.registry.jobs[0].tables_root(s.data))]
    broker = [Component("kafka", [py, "-m", "rebalance.cli", "kafka", "run",
                                  "--dir", str(s.data / "kafka"), "--port", str(s.kafka_port)],
                        env, port=s.kafka_port)] if kafka else []
    # The generator and the job first: every DAG run waits for the job's windows, and the
    # job's JVM warms up while Airflow starts (its readiness is awaited last).
    return [
        *broker,
        connect,
        Component("generator", [py, str(REPO_ROOT / "spark_apps" / "generate_events.py"),
                                "--follow", "--keys", str(s.generator_keys), "--zipf", "1.0",
                                "--events-per-batch", str(s.events_per_second * batch_seconds),
                                "--batch-seconds", str(batch_seconds), "--fluctuation", "1.0",
                                "--interval-batches", str(s.fluctuation_seconds // batch_seconds),
                                "--instances", str(s.instances), "--seed", "10",
                                *first_tables,
                                *(["--sink", "kafka", *sink] if kafka else [])],
                  genv, ready_line="following", stop_signal=signal.SIGINT),
        job_component(s, env, sink),
        *[other_job_component(s, env, name, job)
          for name, job in list(s.job_components.items())[1:]],
        Component("api-server", [airflow, "api-server", "--host", HOST, "--port", str(s.api_port)],
                  aenv, port=s.api_port, ready_url=f"{s.api_url}/api/v2/monitor/health"),
        # One machine: task logs are read from the files; no log server (it binds 0.0.0.0).
        *[Component(name, [py, "-m", "rebalance.cli.keepalive", "--name", name, "--", airflow,
                           *cmd], aenv) for name, cmd in (
            ("scheduler", ["scheduler", "--skip-serve-logs"]), ("dag-processor", ["dag-processor"]),
            ("triggerer", ["triggerer", "--skip-serve-logs"]))],
    ]


WORKER_SITE = Path(__file__).with_name("worker_site")  # a sitecustomize for the job


def quiet_python_workers(env: dict[str, str], log: Path) -> dict[str, str]:
    """``env`` for a process whose Spark runs ``transformWithStateInPandas``: the stdout of
    PySpark's driver worker (its start and UDF printed at every query start) goes to ``log``,
    its stderr and errors are kept (``worker_site/sitecustomize.py``)."""
    paths = [str(WORKER_SITE), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    return {**env, "PYTHONPATH": os.pathsep.join(paths),
            "REBALANCE_PYTHON_WORKER_LOG": str(log)}


def job_component(s: Settings, env: dict[str, str], sink: list[str]) -> Component:
    """The streaming job: the built-in restartable job, or an example; both on the
    service's instances, windows, watermark and micro-batch interval."""
    common = ["--instances", str(s.instances), "--window-seconds", str(s.window_seconds),
              "--watermark-seconds", str(s.window_seconds // 2),
              "--trigger-seconds", str(s.trigger_seconds), "--master", "local[2]",
              "--name", job_name(s),
              "--tables-root", str(s.registry.jobs[0].tables_root(s.data))]
    if s.job_app != "keyed":
        argv = [str(REPO_ROOT / "spark_apps" / "example_job.py"), "--example", s.job_app,
                *common]
    else:
        kafka = s.events_source == "kafka"
        argv = [str(REPO_ROOT / "spark_apps" / "restartable_job.py"), *common, "--windows", "3",
                "--poll-seconds", f"{s.restart_poll_seconds:g}",
                *(["--source", "kafka", *sink] if kafka else [])]
    return Component("job", [sys.executable, *argv],
                     quiet_python_workers(env, s.logs / "job-python-worker.log"),
                     ready_line="running", stop_signal=signal.SIGINT, ready_later=True)


def other_job_component(s: Settings, env: dict[str, str], name: str,
                        job: JobConfig) -> Component:
    """A registry job after the first: its example app under ``rebalanced()``, over the
    first job's events, with its own tables, checkpoint and instances."""
    first = s.registry.jobs[0]
    argv = [str(REPO_ROOT / "spark_apps" / "example_job.py"), "--example", job.app,
            "--name", job.name, "--instances", str(job.instances),
            "--window-seconds", str(s.window_seconds),
            "--watermark-seconds", str(s.window_seconds // 2),
            "--trigger-seconds", str(s.trigger_seconds), "--master", "local[2]",
            "--tables-root", str(job.tables_root(s.data)),
            "--events-root", str(first.tables_root(s.data)),
            *[arg for key, value in job.spark.items() for arg in ("--conf", f"{key}={value}")]]
    return Component(name, [sys.executable, *argv],
                     quiet_python_workers(env, s.logs / f"{name}-python-worker.log"),
                     ready_line="running", stop_signal=signal.SIGINT, ready_later=True)


def check_jobs(s: Settings) -> None:
    """Refuse, in one line, a registry the service cannot run as it stands."""
    one_job = "a one-job registry (REGISTRY=examples/one_job.toml)"
    for job in s.registry.jobs[1:]:
        if s.events_source == "kafka":
            raise ServiceError(f"{s.registry.path}: jobs.{job.name}: SOURCE=kafka runs the "
                               "first job alone (the generator writes no events table for "
                               f"the others to read); run it with {one_job}")
        if job.name == job_name(s):
            raise ServiceError(f"{s.registry.path}: jobs.{job.name}: JOB={s.job_app} runs "
                               f"the first job as {job_name(s)!r}, this job's name (its "
                               f"checkpoint and DAG); run it with {one_job}")
    for job in s.other_jobs:
        where = f"{s.registry.path}: jobs.{job.name}"
        if job.app == "keyed":
            raise ServiceError(f"{where}.app: the service runs the built-in job once (the "
                               "first job); another job runs an example app (sessions, "
                               "views, devices) over its events")
        if job.source != "delta":
            raise ServiceError(f"{where}.source: a job after the first reads the first "
                               "job's events table (source = \"delta\")")
    from rebalance.spark import object_store

    try:
        object_store.spark_settings(s.registry)  # the S3A JARs, when a job is on s3a://
    except FileNotFoundError as exc:
        job = next(j for j in s.registry.jobs if object_store.is_object_store(j.tables))
        raise ServiceError(f"{s.registry.path}: jobs.{job.name}.tables: {exc}") from None


def _connect_server(s: Settings, env: dict[str, str]) -> Component:
    from rebalance.spark import object_store, session

    store = object_store.spark_settings(s.registry)  # a job's tables on the object store
    jars = ",".join([str(j) for j in session.delta_jars()]
                    + [j for j in [store.pop("spark.jars", "")] if j])
    confs = {**session.JVM_SQL_SETTINGS, **store,
        "spark.connect.grpc.binding.address": HOST,
        "spark.connect.grpc.binding.port": str(s.connect_port),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2",
        "spark.databricks.delta.snapshotPartitions": str(session.SNAPSHOT_PARTITIONS),
        "spark.ui.enabled": "false",
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.sql.warehouse.dir": str(s.data / "warehouse"),
        "spark.driver.extraJavaOptions": (
            f"-Dlog4j2.configurationFile=file:{session.LOG4J_CONFIG} "
            f"-Drebalance.spark.log={s.logs / 'spark-connect-jvm.log'} "
            f"-Dderby.system.home={s.data / 'derby'} {session.class_data.java_options()}").strip(),
        "spark.pyspark.python": sys.executable,
        **session.parse_conf(os.environ.get("REBALANCE_SPARK_CONF")),  # as in every session
    }
    argv = [str(spark_home() / "bin" / "spark-submit"), "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
            "--name", "rebalance-control-plane", "--driver-memory", "1g"]
    if jars:
        argv += ["--jars", jars]
    for key, value in confs.items():
        argv += ["--conf", f"{key}={value}"]
    return Component("spark-connect", argv, env, port=s.connect_port)


# ------------------------------------------------------------------ process records
@dataclass
class Record:
    """What ``up`` recorded of a started process (``started``: its start time, which tells
    a recycled pid from ours)."""

    name: str
    pid: int
    started: float
    argv: list[str]
    log: str
    started_at: float

    @classmethod
    def load(cls, path: Path) -> Record | None:
        try:
            data = json.loads(path.read_text())
            if "start_ticks" in data:  # written by an earlier version
                data["started"] = processes.from_ticks(data.pop("start_ticks"))
            return cls(**data)
        except (OSError, ValueError, TypeError):
            return None


def alive(record: Record) -> bool:
    """The recorded process still runs (same pid and start time, not a zombie)."""
    started = processes.start_time(record.pid)
    return (started is not None and processes.same_start(started, record.started)
            and processes.running(record.pid))


# ------------------------------------------------------------------------ the service
class Service:
    """Start, stop and report the service's processes by their recorded ids."""

    def __init__(self, settings: Settings | None = None, out=print, parts=None) -> None:
        self.s = settings or Settings()
        self.out = out
        #: ``Settings -> list[Component]`` (tests start stand-in processes through it).
        self.parts = parts or components

    def record_path(self, name: str) -> Path:
        return self.s.pids / f"{name}.json"

    def records(self) -> dict[str, Record]:
        found = {}
        for c in self.parts(self.s):
            rec = Record.load(self.record_path(c.name))
            if rec is not None:
                found[c.name] = rec
        return found

    # ----------------------------------------------------------------------- up
    def up(self, wait: bool = True, unpause: bool = True) -> list[str]:
        """Start every component that is not running (then, with ``unpause``, make sure the
        ``rebalance`` DAG is not paused); return the names started."""
        for folder in (self.s.pids, self.s.logs, self.s.airflow_home):
            folder.mkdir(parents=True, exist_ok=True)
        if self.parts is components:
            check_jobs(self.s)
            self._record_source()
            self._migrate_airflow_db()
        started, later = [], []
        for comp in self.parts(self.s):
            rec = Record.load(self.record_path(comp.name))
            if rec is not None and alive(rec):
                self.out(f"{comp.name:14s} already running (pid {rec.pid})")
                continue
            if comp.port is not None and _port_open(comp.port):
                raise ServiceError(
                    f"port {HOST}:{comp.port} for {comp.name} is taken by a process this "
                    "service did not start; stop it or set REBALANCE_API_PORT / "
                    "REBALANCE_CONNECT_PORT")
            rec = self._spawn(comp)
            started.append(comp.name)
            self.out(f"{comp.name:14s} started (pid {rec.pid}, log {rec.log})")
            if wait and comp.ready_later:
                later.append((comp, rec))
            elif wait:
                self._await_ready(comp, rec)
            if comp.name == "spark-connect" and wait:
                self._warm_connect()
        for comp, rec in later:
            self._await_ready(comp, rec)
        if wait and unpause and self.parts is components:
            from rebalance.ops import service_dags

            service_dags.unpause(self, self.s.dag_ids)
            generator = Record.load(self.record_path("generator"))
            for name, job in self.s.job_components.items():   # not the schedule's first slot
                if name in started and generator is not None:
                    service_dags.trigger_first_run(self, generator.started_at, job.dag_id)
        return started

    def _record_source(self) -> None:
        """Record the source and the job ``down`` / ``status`` go by (another source while
        it runs, or another job over a data directory with a job's tables: refused)."""
        from rebalance.spark.delta_rs import has_log

        if self.s.job_app != "keyed" and self.s.events_source == "kafka":
            raise ServiceError(f"JOB={self.s.job_app} reads the events table; SOURCE=kafka "
                               "runs the built-in job only")
        wanted = self.s.events_source
        recorded = dataclasses.replace(self.s, source=None).events_source
        if wanted != recorded and any(alive(r) for r in Service(
                dataclasses.replace(self.s, source=recorded)).records().values()):
            raise ServiceError(f"the service runs with SOURCE={recorded}; stop it with "
                               f"`make down` before `make up SOURCE={wanted}`")
        (self.s.state / "source").write_text(wanted + "\n")
        job, held = self.s.job_app, dataclasses.replace(self.s, job=None).job_app
        if job != held and has_log(self.s.data / "tables" / "key_histograms"):
            raise ServiceError(f"{self.s.data} holds the {held} job's tables; JOB={job} needs "
                               "a data directory of its own (REBALANCE_DATA_DIR)")
        (self.s.state / "job").write_text(job + "\n")

    def _migrate_airflow_db(self) -> None:
        import subprocess

        marker = self.s.airflow_home / ".initialised"
        if marker.exists():
            return
        log = self.s.logs / "airflow-db-migrate.log"
        with log.open("ab") as fh:
            rc = subprocess.call([_venv_bin("airflow"), "db", "migrate"], stdout=fh,
                                 stderr=subprocess.STDOUT, env=airflow_env(self.s))
        if rc != 0:
            raise ServiceError(f"airflow db migrate failed (exit {rc}); see {log}")
        marker.touch()

    def _spawn(self, comp: Component) -> Record:
        import subprocess

        log = self.s.logs / f"{comp.name}.log"
        with log.open("ab") as fh:
            fh.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} start {comp.name}\n".encode())
            fh.flush()
            proc = subprocess.Popen(comp.argv, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=comp.env, cwd=str(REPO_ROOT),
                                    start_new_session=True)
        started = None
        for _ in range(50):
            started = processes.start_time(proc.pid)
            if started is not None:
                break
            time.sleep(0.02)
        rec = Record(comp.name, proc.pid, started or 0.0, comp.argv, str(log), time.time())
        tmp = self.record_path(comp.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(rec)))
        tmp.replace(self.record_path(comp.name))
        return rec

    def _await_ready(self, comp: Component, rec: Record) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if not alive(rec):
                raise ServiceError(f"{comp.name} exited while starting; see {rec.log}:\n"
                                   + _tail(Path(rec.log)))
            if self._ready(comp, rec):
                return
            time.sleep(0.5)
        raise ServiceError(f"{comp.name} not ready after {READY_TIMEOUT_SECONDS:.0f} s; see {rec.log}")

    def _ready(self, comp: Component, rec: Record) -> bool:
        if comp.ready_url:
            try:
                with urllib.request.urlopen(comp.ready_url, timeout=2) as resp:
                    return resp.status == 200
            except (urllib.error.URLError, OSError):
                return False
        if comp.port is not None:
            return _port_open(comp.port)
        if comp.ready_line:
            return comp.ready_line in _since_start(Path(rec.log))
        return True

    def _warm_connect(self) -> None:
        """Run the first queries once, so the first DAG task does not pay the server's warm-up."""
        import subprocess

        code = ("from rebalance.spark.session import remote_session; "
                f"s = remote_session({self.s.connect_url!r}); "
                "s.sql('SELECT 1').collect(); s.range(10).toPandas()")
        subprocess.call([sys.executable, "-c", code], env=base_env(self.s),
                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # --------------------------------------------------------------------- down
    def down(self, only: list[str] | None = None) -> list[str]:
        """Stop every recorded process (reverse start order), or the components named in
        ``only`` (``up`` starts them again, e.g. with other settings); the names stopped."""
        parts = self.parts(self.s)
        unknown = sorted(set(only or ()) - {c.name for c in parts})
        if unknown:
            raise ServiceError(f"no component named {unknown[0]!r}")
        stopped = []
        # a job of another registry than this one's (``up`` with REBALANCE_REGISTRY) is
        # stopped too, before the components it needs, with the jobs' own first signal
        known = {c.name for c in parts}
        extra = [Component(path.stem, [], {}, stop_signal=signal.SIGINT)
                 for path in sorted(self.s.pids.glob("job-*.json")) if path.stem not in known]
        for comp in [*extra, *reversed(parts)]:
            if only is not None and comp.name not in only:
                continue
            path = self.record_path(comp.name)
            rec = Record.load(path)
            if rec is None:
                continue
            if alive(rec):
                self._stop(rec, comp.stop_signal)
                stopped.append(comp.name)
                self.out(f"{comp.name:14s} stopped (pid {rec.pid})")
            path.unlink(missing_ok=True)
        return stopped

    def _stop(self, rec: Record, first_signal: int) -> None:
        group = processes.group_members
        tree = [rec.pid, *processes.descendants(rec.pid)]
        processes.send(tree + group(rec.pid), first_signal)
        if first_signal != signal.SIGTERM:
            processes.wait_gone([rec.pid], STOP_GRACE_SECONDS / 2)
            tree = [rec.pid, *processes.descendants(rec.pid)] if alive(rec) else tree
            processes.send(tree + group(rec.pid), signal.SIGTERM)
        left = processes.wait_gone(tree + group(rec.pid), STOP_GRACE_SECONDS)
        if left:
            processes.send(left + group(rec.pid), signal.SIGKILL)
            processes.wait_gone(left, 5.0)

    # ------------------------------------------------------------------- status
    def status(self) -> dict[str, str]:
        """Component -> "running (pid N)" / "stopped" / "dead (pid N was recorded)"."""
        out = {}
        for comp in self.parts(self.s):
            rec = Record.load(self.record_path(comp.name))
            if rec is None:
                out[comp.name] = "stopped"
            elif alive(rec):
                out[comp.name] = f"running (pid {rec.pid}, up {time.time() - rec.started_at:.0f} s)"
            else:
                out[comp.name] = f"dead (pid {rec.pid} was recorded; see {rec.log})"
        return out

    def login(self) -> tuple[str, str | None]:
        """The admin user and the password Airflow generated into its home."""
        path = self.s.airflow_home / "simple_auth_manager_passwords.json.generated"
        try:
            return "admin", json.loads(path.read_text()).get("admin")
        except (OSError, ValueError):
            return "admin", None


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((HOST, port)) == 0


def _since_start(log: Path) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    return text.rsplit("==== ", 1)[-1]


def _tail(log: Path, lines: int = 20) -> str:
    return "\n".join(_since_start(log).splitlines()[-lines:])
