"""Stops what a test session left running when the session itself is gone.

    python tests/reaper.py PYTEST_PID SESSION_ID

Started by tests/conftest.py (one per test session, in a session of its own). Every
process the tests start inherits ``REBALANCE_TEST_SESSION=SESSION_ID`` from the test
process's environment, however deep and in whatever process group (the service stack,
Spark drivers, the Kafka broker, the cluster). Fixtures stop what they start; but a
pytest interrupted hard (``kill``, or xdist's controller stopping its workers on Ctrl-C)
runs no teardown, and those processes would stay. This waits until PYTEST_PID is gone,
then SIGKILLs every process still carrying the session's id and prints what it stopped
(nothing, after a clean run).
"""

from __future__ import annotations

import sys
import time

import psutil

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
    try:
        watched = psutil.Process(parent)
        watched.wait()
    except psutil.NoSuchProcess:
        pass
    for _ in range(3):      # a process may fork while the first ones are being killed
        left = carriers(session)
        if not left:
            return 0
        for proc in left:
            try:
                print(f"reaper: test session {session} is over; killing pid {proc.pid} "
                      f"({' '.join(proc.cmdline())[:120]})", file=sys.stderr, flush=True)
                proc.kill()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        psutil.wait_procs(left, timeout=10)
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
