"""Run a daemon and start it again when it exits on its own.

    python -m rebalance.cli.keepalive --name scheduler -- airflow scheduler --skip-serve-logs

The service runs Airflow's scheduler, dag-processor and triggerer under this wrapper, as
systemd's ``Restart=always`` would. SIGTERM or SIGINT is passed on to the daemon, which is
not started again; any other exit restarts it after a pause that doubles from
:data:`FIRST_PAUSE_SECONDS` up to :data:`MAX_PAUSE_SECONDS` while it keeps failing. The
daemon stays in the wrapper's process group. Why, and the exit codes:
``docs/reliability.md``, "The daemons' keepalive".
"""

from __future__ import annotations

import signal
import subprocess
import time

FIRST_PAUSE_SECONDS = 1.0
MAX_PAUSE_SECONDS = 60.0
STEADY_SECONDS = 300.0


class Keepalive:
    def __init__(self, name: str, argv: list[str], out=print) -> None:
        self.name, self.argv, self.out = name, argv, out
        self.child: subprocess.Popen | None = None
        self.stopping: int | None = None
        self.restarts = 0

    def _signal(self, signum, _frame) -> None:
        self.stopping = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        pause = FIRST_PAUSE_SECONDS
        while True:
            started = time.monotonic()
            self.child = subprocess.Popen(self.argv)
            if self.stopping is not None:           # stopped while it was starting
                self.child.send_signal(self.stopping)
            code = self.child.wait()
            if self.stopping is not None:
                return 128 - code if code < 0 else code   # the shell's code for a signal
            ran = time.monotonic() - started
            pause = FIRST_PAUSE_SECONDS if ran >= STEADY_SECONDS else pause
            self.restarts += 1
            self.out(f"keepalive: {self.name} exited with code {code} after {ran:.0f} s; "
                     f"starting it again in {pause:.0f} s (restart {self.restarts})", flush=True)
            deadline = time.monotonic() + pause
            while time.monotonic() < deadline and self.stopping is None:
                time.sleep(0.2)
            if self.stopping is not None:
                return 128 + self.stopping
            pause = min(2 * pause, MAX_PAUSE_SECONDS)
