"""Processes the service starts and stops, through psutil: a process's identity (pid and
start time, so a recycled pid is not taken for ours), its descendants and process-group
members, and signalling a set of them until they are gone."""

from __future__ import annotations

import os
import time

import psutil


def start_time(pid: int) -> float | None:
    """When the process started (seconds since the epoch, as psutil computes it from the
    kernel's start ticks and the boot time; compare two readings with :func:`same_start`),
    or None when there is no such process."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def same_start(a: float, b: float) -> bool:
    """Whether two :func:`start_time` readings are the same process start. Each is the
    kernel's start ticks plus its boot time, which it keeps in whole seconds as the wall
    clock minus the time since boot: when the wall clock is adjusted, the boot time (and
    every start time read after it) moves by a whole second. So a difference of 0, 1 or 2
    whole seconds (within 5 ms) is the same start."""
    d = abs(a - b)
    return round(d) <= 2 and abs(d - round(d)) < 0.005


def from_ticks(ticks: int) -> float:
    """A start time recorded as kernel clock ticks since boot (records written before
    start times were recorded in seconds), as :func:`start_time` gives it."""
    return psutil.boot_time() + ticks / os.sysconf("SC_CLK_TCK")


def running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, deepest last."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def group_members(pgid: int) -> list[int]:
    """Every process whose process group is ``pgid``."""
    out = []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                out.append(pid)
        except OSError:
            continue
    return out


def send(pids: list[int], sig: int) -> None:
    """``sig`` to each of ``pids`` that still exists."""
    for pid in dict.fromkeys(pids):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Wait up to ``seconds`` for ``pids`` to end; those still running."""
    deadline = time.monotonic() + seconds
    left = list(dict.fromkeys(pids))
    while left and time.monotonic() < deadline:
        left = [p for p in left if running(p)]
        time.sleep(0.2)
    return [p for p in left if running(p)]
