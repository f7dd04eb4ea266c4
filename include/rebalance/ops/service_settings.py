"""The service's settings (:class:`Settings`: where it lives, its ports, its jobs from the
registry) and what a component of it is (:class:`Component`); ``rebalance.ops.service``
starts and stops them."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

from rebalance.core import registry
from rebalance.core.registry import JobConfig, Registry
from rebalance.spark.paths import REPO_ROOT, data_dir

HOST = "127.0.0.1"
#: Seconds a component gets to stop after SIGINT/SIGTERM before its group is killed.
STOP_GRACE_SECONDS = 20.0
#: A component that is not ready after this long is reported as failed.
READY_TIMEOUT_SECONDS = 480.0
#: The service's rebalance schedule (its job's 20-s windows fill a run in 2 minutes); a
#: DAG without ``REBALANCE_SCHEDULE`` runs every 10 (``control.params.DEFAULT_SCHEDULE``).
SERVICE_SCHEDULE = "*/2 * * * *"
#: Where the first job's events come from (``make up SOURCE=...``).
SOURCES = registry.SOURCES
#: The app the first job runs (``make up JOB=...``): the built-in keyed job, or an example
#: of ``examples/`` under ``rebalanced()`` (``spark_apps/example_job.py``): sessions, page
#: views (split keys), devices.
JOBS = registry.APPS
#: The DAGs beside each job's that ``up`` makes sure are not paused: the scheduled ones run
#: unattended, and a paused DAG does not run the runs a person triggers (rollback,
#: healthcheck) either.
OPS_DAGS = ("rebalance_maintenance", "rebalance_healthcheck", "rebalance_rollback")


class ServiceError(RuntimeError):
    """A component cannot be started (port taken, not ready in time)."""


def _setting(env: str, name: str, default: int) -> int:
    """A service-wide port: its environment variable, else the registry's ``[service]``."""
    value = os.environ.get(env)
    if value:
        return int(value)
    configured = getattr(registry.load().service, name)
    return default if configured is None else configured


@dataclass(frozen=True)
class Settings:
    """Where the service lives and how it is reached (all overridable for tests)."""

    data: Path = field(default_factory=data_dir)
    airflow_home: Path = field(default_factory=lambda: Path(
        os.environ.get("AIRFLOW_HOME") or registry.load().service.airflow_home
        or REPO_ROOT / ".airflow").resolve())
    #: The jobs (``rebalance.toml``, ``REBALANCE_REGISTRY``): the first is the job ``up``
    #: runs with the generator's events (``job`` and ``source`` override its app and
    #: source); each other one runs as an example app over the same events.
    registry: Registry = field(default_factory=registry.load)
    api_port: int = field(default_factory=lambda: _setting("REBALANCE_API_PORT", "api_port",
                                                           8080))
    connect_port: int = field(default_factory=lambda: _setting(
        "REBALANCE_CONNECT_PORT", "connect_port", 15002))
    schedule: str = os.environ.get("REBALANCE_SCHEDULE", SERVICE_SCHEDULE)
    #: The first job's instances (the registry's).
    instances: int = field(default_factory=lambda: registry.load().jobs[0].instances)
    window_seconds: int = 20
    trigger_seconds: int = 10
    generator_keys: int = 200
    events_per_second: int = 200
    #: The generator appends one batch of events this often (seconds of event time each).
    batch_seconds: int = 10
    #: The generator re-skews the load (Fang et al.'s fluctuation) every this many seconds.
    fluctuation_seconds: int = 600
    #: How often the job reads the ``restarts`` table for controlled restart requests.
    restart_poll_seconds: float = 10.0
    #: How long a run's ``windows`` task waits for its interval's last windows (the job
    #: writes a window once its watermark passed it).
    windows_wait_seconds: float = 90.0
    #: How long Airflow waits before retrying a failed task of the ``rebalance`` DAG.
    retry_delay_seconds: float = 30.0
    #: ``rebalance_maintenance``'s schedule (None: the DAG's own, daily at 03:00 UTC).
    maintenance_schedule: str | None = None
    #: Airflow settings for the Airflow processes (``AIRFLOW__SECTION__KEY`` -> value),
    #: over the service's own (tests shorten Airflow's heartbeat timeouts with it).
    airflow_settings: dict[str, str] = field(default_factory=dict)
    #: Events from the Delta table or a Kafka topic (and a broker in <data>/kafka).
    source: str | None = None
    #: The first job's app (:data:`JOBS`); None: the one ``up`` recorded, else the
    #: registry's.
    job: str | None = None
    kafka_port: int = field(default_factory=lambda: _setting(
        "REBALANCE_KAFKA_PORT", "kafka_port", 9092))
    topic: str = "events"

    @property
    def state(self) -> Path:
        return self.data / "service"

    @property
    def pids(self) -> Path:
        return self.state / "pids"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def events_source(self) -> str:
        """``source``, else the one ``up`` recorded in ``<data>/service/source``, else the
        first job's."""
        path = self.state / "source"
        recorded = path.read_text().strip() if path.is_file() else ""
        return self.source or (recorded if recorded in SOURCES
                               else self.registry.jobs[0].source)

    @property
    def job_app(self) -> str:
        """``job``, else the one ``up`` recorded in ``<data>/service/job``, else the first
        job's app."""
        path = self.state / "job"
        recorded = path.read_text().strip() if path.is_file() else ""
        return self.job or (recorded if recorded in JOBS else self.registry.jobs[0].app)

    @property
    def other_jobs(self) -> tuple[JobConfig, ...]:
        """The registry's jobs after the first: each runs as ``job-<name>`` over the first
        job's events table. None with ``SOURCE=kafka``, whose generator writes no events
        table (``up`` refuses such a registry; ``status`` and ``down``, which go by the
        recorded source, then show what ``up`` ran from a one-job registry)."""
        return () if self.events_source == "kafka" else self.registry.jobs[1:]

    @property
    def job_components(self) -> dict[str, JobConfig]:
        """Each job by the name of the component that runs it: ``job`` for the first,
        ``job-<name>`` for every other one."""
        return {"job": self.registry.jobs[0]} | {f"job-{j.name}": j for j in self.other_jobs}

    @property
    def dag_ids(self) -> tuple[str, ...]:
        """Every job's DAG, then :data:`OPS_DAGS`."""
        return (*(j.dag_id for j in self.registry.jobs), *OPS_DAGS)

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.kafka_port}"

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.api_port}"

    @property
    def connect_url(self) -> str:
        return f"sc://{HOST}:{self.connect_port}"


@dataclass(frozen=True)
class Component:
    """One process of the service: how to start it and how to tell it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    port: int | None = None
    ready_url: str | None = None
    ready_line: str | None = None
    #: First signal of a graceful stop (SIGINT lets Python apps stop their queries).
    stop_signal: int = signal.SIGTERM
    #: ``up`` starts the components after it before waiting for this one to be ready.
    ready_later: bool = False
