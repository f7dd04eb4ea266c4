"""The job registry: every job one deployment rebalances, and the service's settings, in
one TOML file (``rebalance.toml`` at the repository's root; ``REBALANCE_REGISTRY`` names
another). Read with :func:`load`; a bad file is refused in one line naming the field.

Pure Python (``tomllib``): the DAG file, the CLI, the service and the triggerer all read it.
:func:`job_scope` makes one job the current one for the code that runs inside it (a task,
a trigger's check, a CLI command): its tables, its name. Fields: ``docs/registry.md``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rebalance.core.defaults import APPLY_MODES, DEFAULT_THETA, theta_problem

REGISTRY_ENV = "REBALANCE_REGISTRY"
#: The registry a checkout runs with (the built-in job and the sessions example).
DEFAULT_FILE = Path(__file__).resolve().parents[3] / "rebalance.toml"
#: The programs the service can run for a job: the built-in job and the examples.
APPS = ("keyed", "sessions", "views", "devices")
SOURCES = ("delta", "kafka")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")
#: Retention per kind of table, in days (the maintenance DAG's ``*_retention_days``).
RETENTION_KINDS = ("histograms", "results", "events")
#: DAG ids the service's own DAGs and the CLI's plans hold: no job may take one.
#: URI schemes a job's tables may use beside a local path: Hadoop's S3 connector, which
#: Spark writes through and delta-rs reads (``[service.object_store]``), and ``file``.
URI_SCHEMES = ("s3a", "file")
RESERVED_DAG_IDS = ("rebalance_rollback", "rebalance_maintenance", "rebalance_healthcheck",
                    "rebalance-cli")


class RegistryError(ValueError):
    """The registry file is missing, not TOML, or a field is wrong (one line, the field)."""


@dataclass(frozen=True)
class ObjectStore:
    """The S3-compatible store of the jobs' ``s3a://`` tables (``[service.object_store]``):
    its endpoint (None: AWS's own), region and addressing. Credentials are never in the
    file: both engines take them from the environment (``AWS_ACCESS_KEY_ID``, ...)."""

    endpoint: str | None = None
    region: str = "us-east-1"
    #: Bucket in the path (``http://host/bucket/key``), as most S3-compatible servers want.
    path_style: bool = True

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint) and self.endpoint.startswith("http://")


@dataclass(frozen=True)
class ServiceConfig:
    """Service-wide settings (``[service]``); ``None``: the service's own default."""

    api_port: int | None = None
    connect_port: int | None = None
    kafka_port: int | None = None
    airflow_home: str | None = None
    object_store: ObjectStore = ObjectStore()


@dataclass(frozen=True)
class JobConfig:
    """One job (``[jobs.<name>]``)."""

    name: str
    dag_id: str
    app: str = "keyed"
    source: str = "delta"
    topic: str = "events"
    #: Where the job's tables live: relative to the data folder, absolute, or a URI.
    tables: str = ""
    instances: int = 4
    theta: float = DEFAULT_THETA
    #: The DAG's schedule; None: the DAG's default (``REBALANCE_SCHEDULE`` overrides all).
    schedule: str | None = None
    apply_mode: str = "auto"
    require_approval: bool = False
    #: Days kept per kind of table (:data:`RETENTION_KINDS`); missing: maintenance's default.
    retention: Mapping[str, float] = field(default_factory=dict)
    #: Spark settings for the job's session (``key -> value``).
    spark: Mapping[str, str] = field(default_factory=dict)

    def tables_root(self, data_dir: Path) -> Path | str:
        """The job's tables folder (a local path), or its URI when not a local one."""
        path = _local(self.tables)
        if path is None:
            return self.tables
        return path if path.is_absolute() else data_dir / path


@dataclass(frozen=True)
class Registry:
    """The jobs, in file order, and the service's settings."""

    path: Path
    jobs: tuple[JobConfig, ...]
    service: ServiceConfig = ServiceConfig()

    def job(self, name: str | None = None) -> JobConfig:
        """The job named ``name`` (None: the first), or an error listing the names."""
        if name is None:
            return self.jobs[0]
        for job in self.jobs:
            if job.name == name:
                return job
        raise RegistryError(f"unknown job {name!r}; the registry {self.path} has: "
                            f"{', '.join(j.name for j in self.jobs)}")

    def by_dag(self, dag_id: str) -> JobConfig | None:
        return next((j for j in self.jobs if j.dag_id == dag_id), None)


def registry_path() -> Path:
    value = os.environ.get(REGISTRY_ENV)
    return Path(value).expanduser().resolve() if value else DEFAULT_FILE


def load(path: str | Path | None = None) -> Registry:
    """The registry at ``path`` (default :func:`registry_path`), checked field by field.
    ``REBALANCE_SCHEDULE`` overrides every job's schedule; ``REBALANCE_JOB_NAME`` renames
    the first job (both as before the registry)."""
    path = Path(path) if path is not None else registry_path()
    try:
        text = path.read_bytes().decode("utf-8")  # TOML is UTF-8, whatever the locale
    except OSError as exc:
        raise RegistryError(f"{path}: cannot read the job registry: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise RegistryError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"{path}: not valid TOML: {exc}") from None
    return parse(doc, path)


def parse(doc: Mapping[str, Any], path: Path) -> Registry:
    """The registry of a parsed TOML document (errors name ``path`` and the field)."""
    def fail(where: str, why: str) -> RegistryError:
        return RegistryError(f"{path}: {where}: {why}")

    unknown = sorted(set(doc) - {"service", "jobs"})
    if unknown:
        raise fail(unknown[0], "unknown section; the registry has [service] and [jobs.<name>]")
    service = _service(_table(doc.get("service", {}), "service", fail), fail)
    jobs_doc = _table(doc.get("jobs"), "jobs", fail, required=True)
    if not jobs_doc:
        raise fail("jobs", "no job; add one as [jobs.<name>]")
    jobs = [_job(name, _table(spec, f"jobs.{name}", fail), fail)
            for name, spec in jobs_doc.items()]
    env_name = os.environ.get("REBALANCE_JOB_NAME")
    if env_name:
        if not NAME.fullmatch(env_name):
            raise RegistryError(f"REBALANCE_JOB_NAME: {env_name!r} is not a job name "
                                f"(letters, digits, _ and -)")
        if any(j.name == env_name for j in jobs[1:]):
            raise RegistryError(f"REBALANCE_JOB_NAME: {env_name!r} is another job's name "
                                f"in {path}")
        jobs[0] = dataclasses.replace(jobs[0], name=env_name)
    env_schedule = os.environ.get("REBALANCE_SCHEDULE")
    if env_schedule:
        jobs = [dataclasses.replace(j, schedule=env_schedule) for j in jobs]
    for attr in ("name", "dag_id", "tables"):
        seen: dict[str, JobConfig] = {}
        for job in jobs:
            value = getattr(job, attr)
            key = _folder(value) if attr == "tables" else value
            if key in seen:
                other = seen[key]
                spelt = "" if getattr(other, attr) == value else f" ({getattr(other, attr)!r})"
                raise fail(f"jobs.{job.name}.{attr}", f"{value!r} is also job {other.name!r}'s"
                                                      f"{spelt}; each job needs its own")
            seen[key] = job
    return Registry(path=path, jobs=tuple(jobs), service=service)


def _local(tables: str) -> Path | None:
    """The folder a ``tables`` value names (a path or a ``file://`` URI, ``~`` expanded,
    relative as written), or None for another URI (``s3a://`` ...)."""
    scheme, sep, rest = tables.partition("://")
    if sep and scheme != "file":
        return None
    return Path(rest if sep else tables).expanduser()


def _folder(tables: str) -> str:
    """``tables`` as one spelling per folder: ``t``, ``./t`` and ``t/`` are one, and so are
    ``/a/t`` and ``file:///a/t`` (as :meth:`JobConfig.tables_root` reads them)."""
    path = _local(tables)
    return tables.rstrip("/") if path is None else os.path.normpath(path)


def _table(value: Any, where: str, fail, required: bool = False) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, dict):
        raise fail(where, f"must be a table ([{where}]), got {type(value).__name__}")
    return value


def _service(spec: dict[str, Any], fail) -> ServiceConfig:
    known = ServiceConfig.__dataclass_fields__
    spec = dict(spec)
    if "object_store" in spec:
        spec["object_store"] = _object_store(
            _table(spec["object_store"], "service.object_store", fail), fail)
    for key, value in spec.items():
        where = f"service.{key}"
        if key not in known:
            raise fail(where, f"unknown field; known: {', '.join(known)}")
        if key.endswith("_port") and not (_is_int(value) and 1 <= value <= 65535):
            raise fail(where, f"must be a port number in [1, 65535], got {value!r}")
        if key == "airflow_home" and not (isinstance(value, str) and value):
            raise fail(where, f"must be a non-empty path, got {value!r}")
    return ServiceConfig(**spec)


def _object_store(spec: dict[str, Any], fail) -> ObjectStore:
    known = ObjectStore.__dataclass_fields__
    for key, value in spec.items():
        where = f"service.object_store.{key}"
        if key not in known:
            raise fail(where, f"unknown field; known: {', '.join(known)} (credentials come "
                              f"from the environment, never from this file)")
        if key == "endpoint" and not (isinstance(value, str)
                                      and re.fullmatch(r"https?://[^/\s]+/?", value)):
            raise fail(where, f"must be an http:// or https:// URL of the store, without a "
                              f"path, got {value!r}")
        if key == "region" and not (isinstance(value, str) and re.fullmatch(r"[a-z0-9-]+", value)):
            raise fail(where, f"must be a region name such as \"us-east-1\", got {value!r}")
        if key == "path_style" and not isinstance(value, bool):
            raise fail(where, f"must be true or false, got {value!r}")
    if "endpoint" in spec:
        spec = {**spec, "endpoint": spec["endpoint"].rstrip("/")}
    return ObjectStore(**spec)


def _tables_problem(value: Any) -> str | None:
    """Why a ``tables`` value is refused, None when it is a folder or a URI the engines
    write (:data:`URI_SCHEMES`; an ``s3a://`` URI names a bucket)."""
    if not (isinstance(value, str) and value.strip() == value and value):
        return "must be a folder (relative to the data folder, or absolute) or a URI"
    scheme, sep, rest = value.partition("://")
    if not sep:
        return None
    if scheme not in URI_SCHEMES:
        return (f"the URI scheme {scheme!r} is not supported; use a folder, "
                f"{' or '.join(s + '://' for s in URI_SCHEMES)}")
    if scheme == "s3a" and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^/].*)?", rest):
        return f"an s3a:// URI names a bucket and a folder (s3a://bucket/folder), got {value!r}"
    return None


def _job(name: str, spec: dict[str, Any], fail) -> JobConfig:
    def where(key: str) -> str:
        return f"jobs.{name}.{key}"

    if not NAME.fullmatch(name):
        raise fail(f"jobs.{name}", "a job name is 1-63 letters, digits, _ and - "
                                   "(it names the job's DAG, checkpoints and tables)")
    known = set(JobConfig.__dataclass_fields__) - {"name"}
    for key in spec:
        if key not in known:
            raise fail(where(key), f"unknown field; known: {', '.join(sorted(known))}")
    defaults = {f.name: f.default for f in dataclasses.fields(JobConfig)
                if f.default is not dataclasses.MISSING}
    values: dict[str, Any] = {**defaults, "name": name, "dag_id": f"rebalance_{name}",
                              "tables": f"jobs/{name}/tables", **spec}
    checks = {
        "dag_id": (lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9_.-]{1,250}", v),
                   "a DAG id (letters, digits, _ . and -)"),
        "app": (lambda v: v in APPS, f"one of {', '.join(APPS)}"),
        "source": (lambda v: v in SOURCES, f"one of {', '.join(SOURCES)}"),
        "topic": (lambda v: isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,249}", v),
                  "a Kafka topic name"),
        "instances": (lambda v: _is_int(v) and 1 <= v <= 4096, "an integer in [1, 4096]"),
        "theta": (lambda v: theta_problem(v) is None and v <= 2, "a number in (0, 2]"),
        "schedule": (lambda v: v is None or (isinstance(v, str) and v.strip()),
                     "a cron expression, a duration such as \"5m\", or \"none\""),
        "apply_mode": (lambda v: v in APPLY_MODES, f"one of {', '.join(APPLY_MODES)}"),
        "require_approval": (lambda v: isinstance(v, bool), "true or false"),
    }
    for key, (ok, what) in checks.items():
        if not ok(values[key]):
            raise fail(where(key), f"must be {what}, got {values.get(key)!r}")
    problem = _tables_problem(values["tables"])
    if problem:
        raise fail(where("tables"), problem)
    if values["dag_id"] in RESERVED_DAG_IDS:
        raise fail(where("dag_id"), f"{values['dag_id']!r} is reserved (the service's own "
                                    f"DAGs, the CLI's plans); set another dag_id")
    retention = _table(values.get("retention", {}), where("retention"), fail)
    for kind, days in retention.items():
        if kind not in RETENTION_KINDS:
            raise fail(where(f"retention.{kind}"),
                       f"unknown kind; known: {', '.join(RETENTION_KINDS)}")
        if isinstance(days, bool) or not isinstance(days, (int, float)) \
                or not (math.isfinite(days) and days > 0):
            raise fail(where(f"retention.{kind}"), f"must be a number of days > 0, got {days!r}")
    spark = _table(values.get("spark", {}), where("spark"), fail)
    for key, value in spark.items():
        if not isinstance(value, (str, int, float, bool)):
            raise fail(where(f"spark.{key}"), f"must be a string or number, got {value!r}")
    values["retention"] = {k: float(v) for k, v in retention.items()}
    values["spark"] = {k: str(v).lower() if isinstance(v, bool) else str(v)
                       for k, v in spark.items()}
    if values["apply_mode"] == "restart" and values["app"] != "keyed":
        raise fail(where("apply_mode"), f"'restart' needs app 'keyed' (the restartable "
                                        f"job); app {values['app']!r} moves state live")
    values["theta"] = float(values["theta"])
    return JobConfig(**values)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ----------------------------------------------------------------------- the current job
_CURRENT: contextvars.ContextVar[JobConfig | None] = contextvars.ContextVar(
    "rebalance_job", default=None)


def current_job() -> JobConfig | None:
    """The job of the enclosing :func:`job_scope` (None outside one)."""
    return _CURRENT.get()


@contextlib.contextmanager
def job_scope(job: JobConfig | None) -> Iterator[JobConfig | None]:
    """Run the block as ``job``'s: its tables root and name (a context variable, so the
    triggerer's concurrent checks of several jobs stay apart). None: no job of its own."""
    token = _CURRENT.set(job)
    try:
        yield job
    finally:
        _CURRENT.reset(token)
