"""tests/reaper.py: what a test session left running is stopped once the session is gone."""

import contextlib
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
    # stands in for pytest: it starts a child in a session of its own, without the id
    # (as a process renamed by setproctitle shows none), and prints its pid
    parent = subprocess.Popen([sys.executable, "-c", (
        "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(120)'], start_new_session=True); print(c.pid, flush=True); "
        "time.sleep(120)")], env=env, stdout=subprocess.PIPE, text=True)
    descendant = int(parent.stdout.readline())
    # left behind in a session of its own, as the service's processes are
    orphan = subprocess.Popen(sleeper, env={**env, "REBALANCE_TEST_SESSION": session},
                              start_new_session=True)
    other = subprocess.Popen(sleeper, env={**env, "REBALANCE_TEST_SESSION": "another"},
                             start_new_session=True)
    reaper = subprocess.Popen([sys.executable, str(REAPER), str(parent.pid), session], env=env,
                              stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.5)     # the reaper looks at the descendants every second
        assert orphan.poll() is None and reaper.poll() is None   # the session still runs
        parent.kill()
        parent.wait()
        assert _gone(orphan, 30)
        assert reaper.wait(timeout=30) == 0
        said = reaper.stderr.read()
        assert f"killing pid {orphan.pid}" in said and f"killing pid {descendant}" in said
        assert not psutil.pid_exists(descendant) or \
            psutil.Process(descendant).status() == psutil.STATUS_ZOMBIE
        assert other.poll() is None and psutil.pid_exists(other.pid)
    finally:
        with contextlib.suppress(psutil.NoSuchProcess, NameError):
            psutil.Process(descendant).kill()
        for p in (parent, orphan, other, reaper):
            if p.poll() is None:
                p.kill()
                p.wait()
