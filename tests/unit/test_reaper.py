"""tests/reaper.py: what a test session left running is stopped once the session is gone."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

REAPER = Path(__file__).resolve().parents[1] / "reaper.py"


def _gone(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_processes_of_a_dead_session_are_killed_and_others_are_not():
    session = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "REBALANCE_TEST_SESSION"}
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    parent = subprocess.Popen(sleeper, env=env)     # stands in for pytest
    # left behind in a session of its own, as the service's processes are
    orphan = subprocess.Popen(sleeper, env={**env, "REBALANCE_TEST_SESSION": session},
                              start_new_session=True)
    other = subprocess.Popen(sleeper, env={**env, "REBALANCE_TEST_SESSION": "another"},
                             start_new_session=True)
    reaper = subprocess.Popen([sys.executable, str(REAPER), str(parent.pid), session], env=env,
                              stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.0)
        assert orphan.poll() is None and reaper.poll() is None   # the session still runs
        parent.kill()
        parent.wait()
        assert _gone(orphan, 30)
        assert reaper.wait(timeout=30) == 0
        assert f"killing pid {orphan.pid}" in reaper.stderr.read()
        assert other.poll() is None and psutil.pid_exists(other.pid)
    finally:
        for p in (parent, orphan, other, reaper):
            if p.poll() is None:
                p.kill()
                p.wait()
