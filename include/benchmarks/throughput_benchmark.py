"""Throughput on a Spark standalone cluster: hash placement against a planned assignment.

    python include/benchmarks/throughput_benchmark.py                 # starts its own cluster
    python include/benchmarks/throughput_benchmark.py --master spark://127.0.0.1:7077
    python include/benchmarks/throughput_benchmark.py --instances 2 4 --batches 6

A Zipf 1.0 workload with simulated per-event work (``work_us_per_cost``: the operator's
time follows its load) is generated once into a Delta table.

**The key set is adversarial for hash, on purpose.** Zipf 1.0 over random key names
rarely gives hash a max/mean load of 1.8 at N = 2 (about 1.4 for 200 keys), so the key
names are chosen, deterministically, with the job's own routing function
(:func:`rebalance.core.placement.default_instances`, what ``routing.py`` computes in Spark):
hash places the hottest keys on instance 0 until it carries ``--hot-share`` of the load
(default 0.92: model max/mean 1.84 at N = 2, 3.68 at N = 4), the other keys spread over
the other instances. A realistic case: tenants whose ids happen to collide in the hash
(``tenant-<n>`` names, the first free ones for the wanted instance). The Zipf weights
and the events are the generator's; only the names differ. For each N in ``--instances``
the keyed job runs on the cluster (a master and two workers of one core each, started by
:mod:`rebalance.ops.cluster` unless ``--master`` is given) over that backlog, one generator
batch per micro-batch (saturation: every micro-batch has a full batch waiting):

1. under hash placement (no routing table), then
2. under the assignment planned from that run's key histograms (Mixed, theta
   ``--theta``), published to a fresh copy of the tables.

Sustained events/s = valid events / summed durations of the keyed query's micro-batches
(the first, warm-up batch excluded). The critical-path ratio is, per window, the largest
instance's operator time over the mean (median over windows). Prints a table and writes
``--out`` (JSON, and a PNG bar chart when matplotlib is there).

Wall-clock figures on whatever else the machine runs; the output records the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from simulated_work import cpu_work  # noqa: E402
from stream_benchmark import copy_events, max_over_mean_by_window, plan_routing, run_job  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--master", help="spark://HOST:PORT of a running cluster (default: start one)")
    p.add_argument("--instances", type=int, nargs="+", default=[2, 4])
    p.add_argument("--keys", type=int, default=200)
    p.add_argument("--events", type=int, default=3000, help="events per generator batch")
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--work-us-per-cost", type=float, default=2000.0)
    p.add_argument("--theta", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--hot-share", type=float, default=0.92,
                   help="share of the load hash puts on instance 0 (key names chosen for it)")
    p.add_argument("--out", type=Path, default=Path(".data/benchmarks/throughput"))
    p.add_argument("--plot", type=Path, default=REPO / "docs" / "img" / "throughput.png",
                   help="the PNG bar chart (default: docs/img/throughput.png)")
    args = p.parse_args(argv)
    if min(args.instances) < 1 or args.batches < 2 or args.events < 1 or args.keys < 2:
        p.error("--instances >= 1, --batches >= 2, --events >= 1, --keys >= 2")
    if not 0 < args.hot_share <= 1:
        p.error("--hot-share must be in (0, 1]")
    if args.work_us_per_cost < 0:
        p.error("--work-us-per-cost must be >= 0")
    return args


def measure(spark, work: Path, source: Path, n: int, args) -> dict:
    from rebalance.core.model import imbalance
    from rebalance.core.placement import default_instances
    from rebalance.spark import tables
    from rebalance.streaming.job import JobConfig

    gen = colliding_generator(_gen_config(args, n), args.hot_share)
    model = np.bincount(default_instances(gen.keys, n), weights=gen.frequencies(0), minlength=n)
    config = JobConfig(n_instances=n, window_seconds=10.0, n_windows=2, watermark_seconds=5.0,
                       work=cpu_work(args.work_us_per_cost), max_files_per_trigger=1)
    out: dict = {"instances": n, "hash_load_max_over_mean_model": imbalance(model)}
    roots = {name: work / f"n{n}-{name}" for name in ("hash", "planned")}
    for name, root in roots.items():
        copy_events(source, root)
        if name == "planned":
            routing, method = plan_routing(spark, str(roots["hash"]), n, args.theta)
            tables.publish_assignment(spark, routing, n, {"method": method}, str(root))
            out["routing_table_size"] = len(routing)
        stats = run_job(spark, replace(config, name=f"n{n}{name}", tables_root=str(root),
                                       checkpoint_root=str(root / "checkpoints")))
        spread = max_over_mean_by_window(spark, str(root), skip_first=0)
        out[name] = {"events_per_second": stats.events_per_second, "events": stats.events,
                     "seconds": stats.seconds, "wall": stats.wall,
                     "critical_path_ratio": spread["task_ms_max_over_mean_median"],
                     "load_max_over_mean": spread["load_max_over_mean_median"]}
        print(f"  N={n} {name:7}: {stats.events_per_second:8.0f} events/s, critical path "
              f"max/mean {spread['task_ms_max_over_mean_median']:.2f}, load max/mean "
              f"{spread['load_max_over_mean_median']:.2f} (load average "
              f"{os.getloadavg()[0]:.1f})", flush=True)
    out["speedup"] = out["planned"]["events_per_second"] / out["hash"]["events_per_second"]
    return out


def colliding_names(freq: np.ndarray, n: int, hot_share: float,
                    prefix: str = "tenant-") -> np.ndarray:
    """Key names such that hash (:func:`rebalance.core.placement.default_instances`) puts the
    hottest keys on instance 0 until it holds ``hot_share`` of ``freq``; the other keys
    go round-robin to instances 1..n-1. Each name is the first unused ``<prefix><j>``
    whose default instance is the wanted one (deterministic)."""
    from rebalance.core.placement import default_instances

    want = np.zeros(len(freq), dtype=int)
    held = 0.0
    rest = 0
    for i in np.argsort(-freq, kind="stable"):
        if n == 1 or held < hot_share:
            held += freq[i]
        else:
            want[i] = 1 + rest % (n - 1)
            rest += 1
    names = np.empty(len(freq), dtype=object)
    pool = np.array([f"{prefix}{j:06d}" for j in range(16 * len(freq) * n)], dtype=object)
    free = {i: list(pool[default_instances(pool, n) == i]) for i in range(n)}
    for i in range(len(freq)):
        names[i] = free[want[i]].pop(0)
    return names


def colliding_generator(config, hot_share: float):
    """The generator of ``config`` with key names from :func:`colliding_names`."""
    from rebalance.streaming.generator import EventGenerator

    gen = EventGenerator(config)
    gen.keys = colliding_names(gen.frequencies(0), config.n_instances, hot_share)
    return gen


def _gen_config(args, n: int):
    from rebalance.streaming.generator import GeneratorConfig

    return GeneratorConfig(n_keys=args.keys, zipf=1.0, events_per_batch=args.events,
                           batch_seconds=10.0, n_instances=n, seed=args.seed)


@contextmanager
def cluster_master(work: Path, master: str | None) -> Iterator[str]:
    """``master`` when given, else the URL of a standalone cluster (a master and two
    one-core workers, :mod:`rebalance.ops.cluster`) started under ``work`` for the block
    and stopped after it."""
    if master:
        yield master
        return
    import socket

    from rebalance.ops.cluster import Cluster, ClusterSettings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = Cluster(ClusterSettings(dir=work / "cluster", port=port, memory="1500m"))
    cluster.up()
    try:
        yield cluster.master_url
    finally:
        cluster.down()


def write_report(path: Path, master: str, args: argparse.Namespace, results: list) -> None:
    """The run's figures as JSON, with the machine's load average and the parameters."""
    report = {"master": master, "load_average_at_end": os.getloadavg(), "params": {
        k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))


#: The session conf of a benchmark on the two-worker cluster.
CLUSTER_CONF = {"spark.executor.memory": "1g", "spark.cores.max": "2"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rebalance.spark.session import get_spark
    from rebalance.streaming.generator import append_batches

    with tempfile.TemporaryDirectory(prefix="throughput-") as tmp, \
            cluster_master(Path(tmp), args.master) as master:
        work = Path(tmp)
        spark = get_spark("rebalance-throughput", master=master, conf=CLUSTER_CONF)
        results = []
        print(f"workload: Zipf 1.0 over {args.keys} keys whose names are chosen so that hash "
              f"puts the hottest keys on instance 0 ({args.hot_share:.0%} of the load): "
              "adversarial for hash, like tenants whose ids collide", flush=True)
        for n in args.instances:
            source = work / f"events-n{n}"
            gen = colliding_generator(_gen_config(args, n), args.hot_share)
            append_batches(spark, gen, range(args.batches), str(source))
            results.append(measure(spark, work, source, n, args))
        spark.stop()
    write_report(args.out / "throughput.json", master, args, results)
    print("\nKey names chosen so that hash puts the hottest keys on one instance "
          f"({args.hot_share:.0%} of the load; adversarial for hash).")
    print("\n| N | hash load max/mean (model) | hash events/s | planned events/s | speedup "
          "| critical path max/mean, hash | planned |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['instances']} | {r['hash_load_max_over_mean_model']:.2f} | "
              f"{r['hash']['events_per_second']:.0f} | {r['planned']['events_per_second']:.0f} | "
              f"{r['speedup']:.2f}x | {r['hash']['critical_path_ratio']:.2f} | "
              f"{r['planned']['critical_path_ratio']:.2f} |")
    _plot(results, args.plot)
    print(f"\nwritten {args.out / 'throughput.json'} and {args.plot}")
    return 0


def _plot(results: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 3.2))
    x = np.arange(len(results))
    ax.bar(x - 0.2, [r["hash"]["events_per_second"] for r in results], 0.4, label="hash")
    ax.bar(x + 0.2, [r["planned"]["events_per_second"] for r in results], 0.4, label="planned")
    ax.set_xticks(x, [f"N = {r['instances']}" for r in results])
    ax.set_ylabel("events/s (sustained)")
    for i, r in enumerate(results):
        top = max(r["hash"]["events_per_second"], r["planned"]["events_per_second"])
        ax.text(i, top * 1.02, f"{r['speedup']:.2f}x", ha="center", va="bottom")
    ax.set_ylim(0, 1.18 * max(max(r["hash"]["events_per_second"],
                                  r["planned"]["events_per_second"]) for r in results))
    ax.set_title("Keyed job, 2-worker standalone cluster\n(hot keys colliding under hash)",
                 fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
