"""Stops what a test session left running when the session itself is gone.

    python tests/reaper.py PYTEST_PID SESSION_ID

Started by tests/conftest.py (one per test session, in a session of its own). Fixtures
stop what they start; but a pytest interrupted hard (``kill``, or xdist's controller
stopping its workers on Ctrl-C) runs no teardown, and what they started in sessions of
their own (the service stack, Spark drivers, the Kafka broker, the cluster) would stay.
This follows PYTEST_PID's descendants every second while it runs (a process renamed by
setproctitle, as Airflow's are, no longer shows its environment, but stays a
descendant until its parent dies); once PYTEST_PID is gone it SIGKILLs every process it
saw that is still there (the same pid and start time), and every process carrying
``REBALANCE_TEST_SESSION=SESSION_ID`` in its environment (inherited from the tests'
environment however deep), and prints what it stopped: nothing, after a clean run.
"""

from __future__ import annotations

import os
import sys
import time

import psutil

from rebalance.ops.processes import same_start

MARKER = "REBALANCE_TEST_SESSION"


def carriers(session: str) -> list[psutil.Process]:
    out = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.environ().get(MARKER) == session and proc.status() != psutil.STATUS_ZOMBIE:
                out.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def main(argv: list[str]) -> int:
    parent, session = int(argv[0]), argv[1]
    seen: dict[int, float] = {}
    try:
        watched = psutil.Process(parent)
        while watched.is_running() and watched.status() != psutil.STATUS_ZOMBIE:
            for proc in watched.children(recursive=True):
                try:
                    seen.setdefault(proc.pid, proc.create_time())
                except psutil.NoSuchProcess:
                    continue
            time.sleep(1.0)
    except psutil.NoSuchProcess:
        pass
    seen.pop(os.getpid(), None)
    for _ in range(3):      # a process may fork while the first ones are being killed
        left = {p.pid: p for p in carriers(session)}
        for pid, created in seen.items():
            try:
                proc = psutil.Process(pid)
                if (same_start(proc.create_time(), created)
                        and proc.status() != psutil.STATUS_ZOMBIE):
                    left.setdefault(pid, proc)
            except psutil.NoSuchProcess:
                continue
        left.pop(os.getpid(), None)
        if not left:
            return 0
        for proc in left.values():
            try:
                print(f"reaper: test session {session} is over; killing pid {proc.pid} "
                      f"({' '.join(proc.cmdline())[:120]})", file=sys.stderr, flush=True)
                proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        psutil.wait_procs(list(left.values()), timeout=10)
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
