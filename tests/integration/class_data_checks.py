"""Which JVMs map the class-data archive of ``make setup`` (rebalance.spark.class_data).

A JVM that accepted the archive keeps it mapped for its life (``/proc/<pid>/maps`` names
the file); one that refused it (another Java build or class path) maps only the JDK's
own archive.
"""

from __future__ import annotations

from pathlib import Path

import psutil


def archive() -> Path:
    from rebalance.spark.class_data import archive_path

    path = archive_path()
    assert path.is_file(), f"no class-data archive at {path}: make setup builds it"
    return path


def maps_archive(pid: int) -> bool:
    return str(archive()) in Path(f"/proc/{pid}/maps").read_text()


def jvms(pids) -> dict[int, str]:
    """The Java processes among ``pids``: pid -> main class (the argument after the class path)."""
    found = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            cmd = proc.cmdline()
        except psutil.Error:
            continue
        if cmd and Path(cmd[0]).name == "java":
            found[pid] = next((a for a in cmd[1:] if a.startswith(("org.", "kafka."))), "?")
    return found


def unmapped(pids) -> dict[int, str]:
    """The JVMs among ``pids`` that do not map the archive (pid -> main class)."""
    return {pid: main for pid, main in jvms(pids).items() if not maps_archive(pid)}
