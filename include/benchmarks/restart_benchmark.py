"""Restart benchmark: the pause of a controlled restart against the keys with state.

    python include/benchmarks/restart_benchmark.py                     # K = 10^3, 10^4, 10^5
    python include/benchmarks/restart_benchmark.py --keys 1000000 --restarts 3

Each K runs in a fresh process (a fresh Spark JVM and Python workers: the first
restart of a freshly started job is measured cold, and counted). There: a fresh
events table whose batch 0 holds 4 K events over the K keys (about every key gets
state); the restartable job (generation 0, N = 4) processes it; then a feeder
appends a small batch (max(1000, K / 100) events, Zipf 0.8) every 2 s while
``--restarts`` controlled restarts run one after the other, each publishing (as the
DAG does for ``apply_mode`` restart) an assignment that moves the same 10 % of
the keys to another instance, then requesting the restart and executing it.

Reported per restart, then per K the median and the worst (first restart included):

* **pause**: no output committed: the longest gap between consecutive committed
  batches (commit files of both generations), from the last one before the request
  to the new generation's first (a normal batch takes ``batch_ms_before``);
* **request to acknowledgement** (from the request row to the job's
  acknowledgement), apart from the pause;
* its parts, seconds between the job's timing marks: **warm-up** (what the job does
  before it stops the old generation, while that one still runs: building the new
  query), **stop wait** (to the old generation stopped at a boundary; a restart that
  keeps the checkpoint counts here its ``started`` commit and the old generation's
  last batch, which exports the moved keys' state while committing its output),
  **state** (to the migrated state written; none when the state moves inside the
  stream), **start** (to the new query started) and **first commit** (to the new
  generation's first committed batch).

Figures are wall-clock on whatever else the machine runs (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

N_INSTANCES = 4
PARTS = ("warm_up", "stop_wait", "state", "start", "first_commit")


class Feeder(threading.Thread):
    """Appends one small generator batch every ``period`` seconds until stopped."""

    def __init__(self, spark, generator, root: str, first: int, period: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.spark, self.generator, self.root = spark, generator, root
        self.next, self.period = first, period
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        from rebalance.streaming.generator import append_batches

        try:
            while not self.halt.is_set():
                append_batches(self.spark, self.generator, [self.next], self.root)
                self.next += 1
                self.halt.wait(self.period)
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc


def _commits(checkpoint: str) -> dict[int, float]:
    folder = Path(checkpoint, "commits")
    if not folder.is_dir():
        return {}
    return {int(p.name): p.stat().st_mtime for p in folder.iterdir() if p.name.isdigit()}


def _wait_commits(job, n: int, timeout: float = 600.0) -> None:
    target = len(_commits(job.generation.checkpoint)) + n
    deadline = time.monotonic() + timeout
    while len(_commits(job.generation.checkpoint)) < target:
        if job.query is not None and job.query.exception() is not None:
            raise job.query.exception()
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {n} commits in {timeout} s")
        time.sleep(0.2)


def _parts(since: dict[str, float]) -> dict[str, float | None]:
    """Seconds between the job's recorded steps (None when a step was not recorded)."""
    def gap(a: str, b: str) -> float | None:
        return round(since[b] - since[a], 3) if a in since and b in since else None

    running = "running" if "running" in since else None
    warmed = "warmed" if "warmed" in since else "requested"
    written = "state_written" if "state_written" in since else "stopped"
    return {"warm_up": gap("requested", "warmed"),
            "stop_wait": gap(warmed, "stopped"),
            "state": gap("stopped", "state_written"),
            "start": gap(written, running) if running else None,
            "first_commit": gap(running or written, "acknowledged")}


def run_one_k(n_keys: int, restarts: int, seed: int, master: str, work: Path,
              full_restart: bool = False) -> list[dict]:
    """All restarts of one K, in this process (a fresh Spark session)."""
    from rebalance.core.placement import default_instances
    from rebalance.spark import tables
    from rebalance.spark.session import get_spark
    from rebalance.streaming.generator import EventGenerator, GeneratorConfig, append_batches
    from rebalance.streaming.job import JobConfig
    from rebalance.streaming.restart import RestartableJob, request_restart

    spark = get_spark("rebalance-restart-benchmark", master=master, conf={
        "spark.ui.enabled": "false", "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.shuffle.partitions": str(N_INSTANCES)})
    root = str(work / "tables")
    config = JobConfig(n_instances=N_INSTANCES, window_seconds=60, n_windows=2,
                       watermark_seconds=5, max_files_per_trigger=1, trigger_seconds=1,
                       emit_histograms=False, name="bench", tables_root=root,
                       checkpoint_root=str(work / "checkpoints"))
    everyone = EventGenerator(GeneratorConfig(n_keys=n_keys, zipf=0.0,
                                              events_per_batch=4 * n_keys,
                                              n_instances=N_INSTANCES, seed=seed))
    trickle = EventGenerator(GeneratorConfig(n_keys=n_keys, zipf=0.8,
                                             events_per_batch=max(1000, n_keys // 100),
                                             n_instances=N_INSTANCES, seed=seed + 1))
    append_batches(spark, everyone, [0], root)
    job = RestartableJob(spark, config, full_restart=full_restart)
    started = time.perf_counter()
    job.start()
    job.process_all_available()
    print(f"  K = {n_keys}: generation 0 processed batch 0 in "
          f"{time.perf_counter() - started:.1f} s", flush=True)
    keys = list(everyone.keys)
    default = default_instances(keys, N_INSTANCES)
    share = max(1, n_keys // 10)
    feeder = Feeder(spark, trickle, root, first=1)
    feeder.start()
    figures = []
    try:
        _wait_commits(job, 2)
        for r in range(restarts):
            routing = {k: int((d + 1 + r) % N_INSTANCES)
                       for k, d in zip(keys[:share], default[:share])}
            version = tables.publish_assignment(
                spark, routing, N_INSTANCES,
                {"benchmark": True, "apply_mode": "restart"}, root)
            old = job.generation
            recent = [p.durationMs.get("triggerExecution") for p in
                      (job.query.recentProgress if job.query is not None else [])[-5:]]
            batch_ms = statistics.median(recent) if recent else None
            requested = time.time()
            request = request_restart(spark, version, N_INSTANCES, job=config.name, root=root)
            job.poll()
            acknowledged = time.time()
            status = job.control.status(request)
            new = job.generation
            # A generation that keeps its checkpoint (same N) numbers on from start_batch.
            start = getattr(new, "start_batch", 0)
            old_commits = sorted(t for b, t in _commits(old.checkpoint).items()
                                 if new.checkpoint != old.checkpoint or b < start)
            new_commits = {b: t for b, t in _commits(new.checkpoint).items() if b >= start}
            first_new = new_commits[min(new_commits)] if new_commits else None
            # No output committed: the longest gap between consecutive commits, from the
            # last one before the request to the new generation's first.
            before = [t for t in old_commits if t <= requested]
            window = (([before[-1]] if before else []) + [t for t in old_commits
                                                          if t > requested]
                      + ([first_new] if first_new is not None else []))
            pause = max(b - a for a, b in zip(window, window[1:])) if len(window) > 1 \
                else None
            keys_with_state = (spark.read.format("statestore").option("path", new.checkpoint)
                               .option("stateVarName", "perkey").load().count())
            figure = {
                "keys": n_keys, "restart": r + 1, "ok": status["ok"],
                "keys_with_state": keys_with_state, "moved_keys": share,
                "pause": round(pause, 3) if pause is not None else None,
                "request_to_ack": round(acknowledged - requested, 3),
                "recorded_pause": status.get("pause_seconds"),
                "since_request": status.get("seconds_since_request"),
                "first_batch_ms": status.get("first_batch_ms"),
                "batch_ms_before": batch_ms,   # a batch of the old generation (median of 5)
                **_parts(status.get("seconds_since_request") or {}),
            }
            figures.append(figure)
            print(f"  restart {r + 1}: pause {figure['pause']} s, request to ack "
                  f"{figure['request_to_ack']} s, parts "
                  f"{ {p: figure[p] for p in PARTS} }, ok={figure['ok']}", flush=True)
            _wait_commits(job, 2)
    finally:
        feeder.halt.set()
        feeder.join()
        job.stop()
        spark.stop()
    if feeder.error is not None:
        raise feeder.error
    return figures


def _summary(rows: list[dict]) -> dict:
    def stats(name: str) -> tuple[float | None, float | None]:
        values = [r[name] for r in rows if r.get(name) is not None]
        return (round(statistics.median(values), 1), round(max(values), 1)) if values \
            else (None, None)

    out = {"keys": rows[0]["keys"], "restarts": len(rows),
           "keys_with_state": max((r["keys_with_state"] or 0) for r in rows),
           "first_pause": rows[0]["pause"]}
    for name in ("pause", "request_to_ack", *PARTS):
        out[name] = stats(name)
    return out


def _fmt(pair) -> str:
    median, worst = pair
    return "-" if median is None else f"{median} / {worst}"


def print_table(summaries: list[dict]) -> None:
    print("\n| K | keys with state | pause median / worst (first) | request to ack | "
          "warm-up | stop wait | state | start | first commit |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in summaries:
        print(f"| {s['keys']:,} | {s['keys_with_state']:,} | {_fmt(s['pause'])} "
              f"({s['first_pause']}) | {_fmt(s['request_to_ack'])} | "
              + " | ".join(_fmt(s[p]) for p in PARTS) + " |")
    print("(seconds, median / worst of the restarts of each K, the first restart of a fresh "
          "job included; in brackets the first restart's pause)")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--keys", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    p.add_argument("--restarts", type=int, default=3, help="restarts per K (>= 3 for the table)")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--json", help="also write every figure to this file")
    p.add_argument("--full-restart", action="store_true",
                   help="every restart on a new checkpoint (stop, read the state back, re-key)")
    p.add_argument("--table", help="print the table of a --json file again, and stop")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)        # child: one K
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        rows = json.loads(Path(args.table).read_text())["restarts"]
        for row in rows:
            row.update(_parts(row.get("since_request") or {}))
        print_table([_summary([r for r in rows if r["keys"] == k])
                     for k in dict.fromkeys(r["keys"] for r in rows)])
        return 0
    if args.one is not None:
        work = Path(tempfile.mkdtemp(prefix=f"restart-benchmark-k{args.one}-"))
        try:
            rows = run_one_k(args.one, args.restarts, args.seed, args.master, work,
                             args.full_restart)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        Path(args.out).write_text(json.dumps(rows))
        return 0
    all_rows, summaries = [], []
    for n_keys in args.keys:
        print(f"K = {n_keys}: fresh process, generation 0 with N = {N_INSTANCES}, then "
              f"{args.restarts} restarts each moving 10 % of the keys", flush=True)
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            done = subprocess.run([sys.executable, __file__, "--one", str(n_keys),
                                   "--restarts", str(args.restarts), "--seed", str(args.seed),
                                   "--master", args.master, "--out", out.name]
                                  + (["--full-restart"] if args.full_restart else []))
            if done.returncode != 0:
                print(f"K = {n_keys}: failed (exit {done.returncode})", flush=True)
                continue
            rows = json.loads(Path(out.name).read_text())
        all_rows.extend(rows)
        summaries.append(_summary(rows))
    print_table(summaries)
    print(f"machine load average at the end: {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores")
    if args.json:
        Path(args.json).write_text(json.dumps({"restarts": all_rows, "summary": summaries},
                                              indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
