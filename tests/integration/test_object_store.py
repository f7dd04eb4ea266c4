"""Tables on an S3-compatible object store: moto's S3 server on 127.0.0.1 (started and
stopped here, by its recorded process), a registry whose job keeps its tables at
``s3a://rebalance-test/...`` and another at a ``file://`` URI. The job's DAG runs for real
in a pytest process of its own (``object_store_scenario.py``): the Spark JVM must start
with the S3A JARs, and this run's session may have started without them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from service_helpers import free_port

pytestmark = pytest.mark.slow

HERE = Path(__file__).resolve().parent
BUCKET = "rebalance-test"


@pytest.fixture()
def s3_server(tmp_path):
    """moto's S3 server on a free port of 127.0.0.1 with the bucket :data:`BUCKET`; its
    endpoint. Stopped, and its port checked closed, at the end."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "moto.log", "wb")
    proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H",
                             "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(endpoint, timeout=2).close()
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, (tmp_path / "moto.log").read_text()
                assert time.monotonic() < deadline, "moto's server did not answer in 60 s"
                time.sleep(0.3)
        made = urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{BUCKET}", method="PUT"))
        assert made.status == 200
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(endpoint, timeout=2)


def test_a_job_on_the_object_store_runs_its_dag_and_commands(s3_server, tmp_path):
    data = tmp_path / "data"
    registry = tmp_path / "rebalance.toml"
    registry.write_text(f"""
[service.object_store]
endpoint = "{s3_server}"

[jobs.keyed]
dag_id = "rebalance"
tables = "tables"

[jobs.clicks]
app = "sessions"
tables = "s3a://{BUCKET}/jobs/clicks/tables"
theta = 0.1
apply_mode = "broadcast"

[jobs.mirror]
app = "views"
tables = "file://{data}/mirror-tables"
""")
    env = {**os.environ, "REBALANCE_REGISTRY": str(registry), "REBALANCE_DATA_DIR": str(data),
           "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           # its own session id: its reaper must not take this run's processes with it
           "REBALANCE_TEST_SESSION": uuid.uuid4().hex}
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         str(HERE / "object_store_scenario.py")],
        cwd=HERE.parents[1], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
