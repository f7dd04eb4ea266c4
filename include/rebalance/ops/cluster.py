"""``rebalance cluster up|down|status``: a local Spark standalone cluster on 127.0.0.1.

A master (``spark-class org.apache.spark.deploy.master.Master``, from the pyspark
wheel) and ``--workers`` workers (``spark-class org.apache.spark.deploy.worker.Worker
spark://127.0.0.1:<port>``) of ``--cores`` core(s) and ``--memory`` each, every one in
its own process group, bound to 127.0.0.1 (``SPARK_LOCAL_IP``), web UIs on free ports.
Their pids and start times are recorded under ``<dir>/service/pids/`` and their output
is in ``<dir>/service/logs/`` (the records, the readiness wait and the stop are
:mod:`rebalance.ops.service`'s); workers keep their executors' files under ``<dir>/work``.
``up`` waits until every worker registered with the master; ``down`` stops them by
their recorded pids (SIGTERM, SIGKILL after a grace period).

Jobs run on it with ``--master spark://127.0.0.1:<port>`` (every ``spark_apps/`` entry
point, or ``spark-submit --master ...``). The command line (also ``python -m
rebalance.cli.cluster``) is :mod:`rebalance.cli.cluster`'s.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from rebalance.ops.service import HOST, Component, Service, ServiceError, Settings, spark_home
from rebalance.spark import class_data
from rebalance.spark.java import ensure_java_home
from rebalance.spark.paths import data_dir

DEFAULT_PORT = 7077


class ClusterError(ValueError):
    """The cluster cannot be started as asked (with the reason)."""


@dataclass(frozen=True)
class ClusterSettings:
    dir: Path = field(default_factory=lambda: data_dir() / "cluster")
    port: int = int(os.environ.get("REBALANCE_CLUSTER_PORT", str(DEFAULT_PORT)))
    workers: int = 2
    cores: int = 1
    memory: str = "2g"

    def __post_init__(self) -> None:
        if not (1024 <= self.port <= 65535):
            raise ClusterError(f"port must be in 1024..65535, got {self.port}")
        if not (1 <= self.workers <= 16):
            raise ClusterError(f"workers must be in 1..16, got {self.workers}")
        if self.cores < 1:
            raise ClusterError(f"cores must be >= 1, got {self.cores}")

    @property
    def master_url(self) -> str:
        return f"spark://{HOST}:{self.port}"


class Cluster:
    """Start, stop and report a local standalone cluster, by recorded process ids."""

    def __init__(self, settings: ClusterSettings | None = None, out=print) -> None:
        self.s = settings or ClusterSettings()
        self.service = Service(Settings(data=self.s.dir, airflow_home=self.s.dir / "service"),
                               out=out, parts=self._components)

    @property
    def master_url(self) -> str:
        return self.s.master_url

    def _components(self, _settings: Settings) -> list[Component]:
        ensure_java_home()  # the master's, the workers' and their executors' Java
        home = spark_home()
        spark_class = str(home / "bin" / "spark-class")
        env = dict(os.environ, SPARK_HOME=str(home), SPARK_LOCAL_IP=HOST,
                   PYSPARK_PYTHON=os.environ.get("PYSPARK_PYTHON", sys.executable),
                   SPARK_WORKER_DIR=str(self.s.dir / "work"),
                   # no REST submission server (it would listen on the fixed port 6066)
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                   # the class-data archive of `make setup` (rebalance.spark.class_data)
                   SPARK_DAEMON_JAVA_OPTS=class_data.java_options())
        env.pop("SPARK_CONF_DIR", None)
        parts = [Component("spark-master", [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
            "--port", str(self.s.port), "--webui-port", "0"], env, port=self.s.port)]
        for i in range(self.s.workers):
            parts.append(Component(f"spark-worker-{i}", [
                spark_class, "org.apache.spark.deploy.worker.Worker", self.master_url,
                "--host", HOST, "--cores", str(self.s.cores), "--memory", self.s.memory,
                "--webui-port", "0", "--work-dir", str(self.s.dir / "work")], env,
                ready_line="Successfully registered with master"))
        return parts

    def up(self) -> list[str]:
        """Start what does not run (master first); return the names started."""
        (self.s.dir / "work").mkdir(parents=True, exist_ok=True)
        try:
            return self.service.up()
        except ServiceError as exc:
            self.service.down()
            raise ClusterError(str(exc)) from None

    def down(self) -> list[str]:
        return self.service.down()

    def status(self) -> dict[str, str]:
        return self.service.status()

    def running(self) -> bool:
        return all(v.startswith("running") for v in self.status().values())

    def log(self, name: str = "spark-master") -> Path:
        """The output of component ``name`` (``spark-master``, ``spark-worker-<i>``)."""
        return self.service.s.logs / f"{name}.log"

    def web_ui_port(self) -> int | None:
        """The port of the master's web UI (a free one, from its log; None if not there).
        ``http://127.0.0.1:<port>/json/`` lists the workers and the applications."""
        try:
            text = self.log().read_text(errors="replace")
        except OSError:
            return None
        found = re.findall(r"Bound MasterWebUI to [^,]+, and started at https?://[^:\s]+:(\d+)",
                           text)
        return int(found[-1]) if found else None
