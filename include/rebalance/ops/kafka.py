"""``make kafka-up`` / ``make kafka-down``: a single-node Kafka broker (KRaft) on 127.0.0.1.

``rebalance kafka up`` writes ``server.properties`` into the broker's folder (default
``<data>/kafka``), formats its storage once and starts one controller-and-broker process
listening on ``127.0.0.1:<port>`` and ``<port + 1>`` only, recorded and stopped as a
:mod:`rebalance.ops.service` component; its JARs (``<jars>/kafka-broker/``) are never on
Spark's classpath. The command line is :mod:`rebalance.cli.kafka`'s. The properties, the
storage, the records and the JARs: ``docs/kafka.md``, "The broker".

>>> broker = Broker(BrokerSettings(dir=Path("/tmp/k"), port=19092))  # doctest: +SKIP
>>> broker.up(); broker.bootstrap; broker.down()                     # doctest: +SKIP
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from rebalance.ops.service import HOST, Component, Service, ServiceError, Settings
from rebalance.spark.java import ensure_java_home
from rebalance.spark.paths import data_dir, jars_dir

NAME = "kafka"
DEFAULT_PORT = 9092
#: JVM heap of the broker (a test broker holds little).
HEAP = "-Xmx512m"


class KafkaError(ValueError):
    """The broker cannot be started as asked (with the reason)."""


@dataclass(frozen=True)
class BrokerSettings:
    """Where the broker lives and listens."""

    dir: Path = field(default_factory=lambda: data_dir() / "kafka")
    port: int = int(os.environ.get("REBALANCE_KAFKA_PORT", str(DEFAULT_PORT)))
    partitions: int = 2
    jars: Path = field(default_factory=lambda: jars_dir() / "kafka-broker")

    def __post_init__(self) -> None:
        if not (1024 <= self.port <= 65534):
            raise KafkaError(f"port must be in 1024..65534 (the controller takes port + 1), "
                             f"got {self.port}")
        if self.partitions < 1:
            raise KafkaError(f"partitions must be >= 1, got {self.partitions}")

    @property
    def controller_port(self) -> int:
        return self.port + 1

    @property
    def bootstrap(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def properties(self) -> Path:
        return self.dir / "server.properties"

    @property
    def log_dir(self) -> Path:
        return self.dir / "data"


def server_properties(s: BrokerSettings) -> str:
    """The broker's configuration: combined broker + controller, loopback only, one replica."""
    lines = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{HOST}:{s.controller_port}",
        "listeners": f"PLAINTEXT://{HOST}:{s.port},CONTROLLER://{HOST}:{s.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{s.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(s.log_dir),
        "num.partitions": str(s.partitions),
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.hours": "168",
    }
    return "".join(f"{k}={v}\n" for k, v in lines.items())


def _java() -> str:
    home = ensure_java_home() or os.environ.get("JAVA_HOME")  # Java 17/21 (rebalance.spark.java)
    java = Path(home) / "bin" / "java" if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise KafkaError("no java found: run `make setup` (it installs one when the machine "
                         "has no Java 17 or 21), or set JAVA_HOME")
    return str(java)


class Broker:
    """Start, stop and report one local broker, by its recorded process id."""

    def __init__(self, settings: BrokerSettings | None = None, out=print) -> None:
        self.s = settings or BrokerSettings()
        self.service = Service(Settings(data=self.s.dir, airflow_home=self.s.dir / "service"),
                               out=out, parts=self._components)

    @property
    def bootstrap(self) -> str:
        return self.s.bootstrap

    def _classpath(self) -> str:
        if not list(self.s.jars.glob("kafka_2.13-*.jar")):
            raise KafkaError(f"Kafka broker JARs not found in {self.s.jars}: run `make setup`")
        return str(self.s.jars / "*")

    def _components(self, _settings: Settings) -> list[Component]:
        argv = [_java(), HEAP, "-Djava.awt.headless=true", "-cp", self._classpath(),
                "kafka.Kafka", str(self.s.properties)]
        return [Component(NAME, argv, dict(os.environ), port=self.s.port)]

    def format(self) -> None:
        """Write the configuration and format the storage (once; the cluster id is kept)."""
        self.s.dir.mkdir(parents=True, exist_ok=True)
        self.s.properties.write_text(server_properties(self.s))
        if (self.s.log_dir / "meta.properties").exists():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        (self.s.dir / "cluster.id").write_text(cluster_id + "\n")
        proc = subprocess.run(
            [_java(), "-cp", self._classpath(), "kafka.tools.StorageTool", "format",
             "-t", cluster_id, "-c", str(self.s.properties)],
            capture_output=True, text=True)
        if proc.returncode != 0:
            lines = (proc.stderr + proc.stdout).strip().splitlines() or ["no output"]
            raise KafkaError(f"formatting the broker's storage failed: {lines[-1]}")

    def up(self) -> bool:
        """Start the broker unless it runs; return whether it was started. Waits until the
        client port accepts connections."""
        if self.running():
            return False
        self.format()
        try:
            return bool(self.service.up())
        except ServiceError as exc:
            raise KafkaError(str(exc)) from None

    def run(self) -> None:
        """Format the storage if need be, then become the broker (exec: same process id,
        in the foreground): how ``make up SOURCE=kafka`` runs it as a service component."""
        self.format()
        argv = self._components(self.service.s)[0].argv
        sys.stdout.flush()
        os.execv(argv[0], argv)

    def down(self) -> bool:
        """Stop the broker by its recorded pid; return whether it was running."""
        return bool(self.service.down())

    def running(self) -> bool:
        return self.service.status().get(NAME, "").startswith("running")

    def status(self) -> str:
        return self.service.status()[NAME]
