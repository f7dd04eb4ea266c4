"""Issue 14, part 1: every input a hostile user can give is refused before any work.

Each refusal goes through the real command entry (``rebalance.cli.main`` with capsys, or
the console script in a subprocess where warnings printed by libraries or the JVM would
show), and asserts: exit code 2, exactly one line on stderr (``rebalance <cmd>: error:``),
nothing on stdout, nothing written (no output folder, no probe folder left behind). The
model's own checks (:class:`rebalance.core.model.Problem`) are tested directly too, since the
DAG builds problems without the CLI. No JVM: every case here is refused before Spark.
(tests/unit/test_cli.py holds the earlier bad-input cases of ``rebalance plan``.)
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from rebalance import cli
from rebalance.core.model import MAX_INSTANCES, PlanningError, Problem

T0 = "2026-01-01T00:00:00Z"


def _console_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("rebalance")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "rebalance.cli"]


def _csv(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.fixture()
def files(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    ok = "window_start,key,count\n" + "".join(f"{T0},k{i},{i + 1}\n" for i in range(8))
    (tmp_path / "afile").write_text("x")
    return {
        "ok": _csv(d / "ok.csv", ok),
        "cost1e308": _csv(d / "cost.csv", "window_start,key,count,cost\n"
                          + "".join(f"{T0},k{i},1,1e308\n" for i in range(3))),
        "count1e400": _csv(d / "inf.csv", f"window_start,key,count\n{T0},a,1e400\n"),
        "count_sum": _csv(d / "sum.csv", f"window_start,key,count\n{T0},a,1e300\n{T0},b,1e300\n"),
        "state_nan": _csv(d / "nan.csv", f"window_start,key,count,state_bytes\n{T0},a,1,nan\n"),
        "count_text": _csv(d / "text.csv", f"window_start,key,count\n{T0},a,abc\n"),
        "window_text": _csv(d / "wtext.csv", "window_start,key,count\nyesterday noon,a,1\n"),
        "window_null": _csv(d / "wnull.csv", f"window_start,key,count\n{T0},a,1\n,b,2\n"),
        "empty": _csv(d / "empty.csv", ""),
        "a_nan": _csv(d / "a_nan.csv", "key,instance\nk1,nan\n"),
        "a_huge": _csv(d / "a_huge.csv", "key,instance\nk1,1e30\n"),
        "a_frac": _csv(d / "a_frac.csv", "key,instance\nk1,1.5\n"),
        "a_text": _csv(d / "a_text.csv", "key,instance\nk1,x\n"),
        "afile": tmp_path / "afile",
        "dir": d,
    }


def _plan_argv(files, out, **flags) -> list[str]:
    base = {"--histograms": files["ok"], "--instances": 4, "--method": "mixed", "--out": out}
    base.update({f"--{k.replace('_', '-')}": v for k, v in flags.items()})
    return ["plan", *[str(x) for kv in base.items() for x in kv]]


def _assert_refused(code, out, err, match, cmd="plan"):
    assert code == 2, err
    assert out == "", out
    lines = err.splitlines()
    assert len(lines) == 1, err  # no warning, no traceback: one line
    assert lines[0].startswith(f"rebalance {cmd}: error: "), lines[0]
    assert re.search(match, lines[0]), lines[0]


def _written(tmp_path: Path, inputs: Path) -> list[Path]:
    """Everything under tmp_path except the inputs the test made."""
    return [p for p in tmp_path.rglob("*")
            if p != tmp_path / "afile" and inputs not in (p, *p.parents)]


PLAN_CASES = {
    # name: (flags, stderr pattern)
    "cost 1e308 (sum overflows)": ({"histograms": "cost1e308"}, r"'cost' sums to inf"),
    "count 1e400 (inf)": ({"histograms": "count1e400"}, r"'count' must be finite"),
    "count sum above 2^53": ({"histograms": "count_sum"}, r"'count' sums to 2e\+300"),
    "state NaN": ({"histograms": "state_nan"}, r"'state_bytes' must be finite"),
    "count text": ({"histograms": "count_text"}, r"'count' must be finite"),
    "window text": ({"histograms": "window_text"}, r"'window_start' is not a timestamp"),
    "window null": ({"histograms": "window_null"}, r"without a window_start"),
    "empty CSV": ({"histograms": "empty"}, r"Empty CSV file"),
    "histograms missing": ({"histograms": "nope.csv"}, r"not found"),
    "assignment NaN": ({"assignment": "a_nan"}, r"outside the integers \[0, 4\)"),
    "assignment 1e30": ({"assignment": "a_huge"}, r"outside the integers"),
    "assignment 1.5": ({"assignment": "a_frac"}, r"outside the integers"),
    "assignment text": ({"assignment": "a_text"}, r"outside the integers"),
    "instances 10^9": ({"instances": 1_000_000_000}, rf"--instances must be <= {MAX_INSTANCES}"),
    "instances 4097": ({"instances": MAX_INSTANCES + 1}, r"--instances must be <="),
    "instances 0": ({"instances": 0}, r"--instances must be >= 1"),
    "theta nan": ({"theta": "nan"}, r"--theta must be a number > 0"),
    "theta inf": ({"theta": "inf"}, r"--theta must be a number > 0"),
    "time limit inf": ({"time_limit": "inf"}, r"--time-limit must be a finite number > 0"),
    "time limit 0": ({"time_limit": 0}, r"--time-limit must be a finite number > 0"),
    "budget nan": ({"migration_budget": "nan"}, r"--migration-budget must be"),
    "budget inf": ({"migration_budget": "inf"}, r"--migration-budget must be"),
    "windows 0": ({"windows": 0}, r"--windows must be >= 1"),
    "max table -1": ({"max_table": -1}, r"--max-table must be >= 0"),
    "out /proc/foo": ({"out": "/proc/foo"}, r"--out /proc/foo cannot be created"),
    "out under a file": ({"out": "afile/x"}, r"cannot be created"),
    "out is a file": ({"out": "afile"}, r"exists and is not a directory"),
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_plan_refusals_exit_2_one_line_nothing_written(case, files, tmp_path, capsys):
    flags, match = PLAN_CASES[case]
    flags = dict(flags)
    for k in ("histograms", "assignment"):
        if k in flags:
            flags[k] = files.get(flags[k], tmp_path / flags[k])
    if flags.get("out") in ("afile/x", "afile"):
        flags["out"] = tmp_path / flags["out"]
    out = flags.pop("out", tmp_path / "fresh" / "out")
    code = cli.main(_plan_argv(files, out, **flags))
    cap = capsys.readouterr()
    _assert_refused(code, cap.out, cap.err, match)
    assert _written(tmp_path, files["dir"]) == [], _written(tmp_path, files["dir"])


@pytest.mark.parametrize("case", ["window text", "cost 1e308 (sum overflows)", "instances 10^9",
                                  "out /proc/foo", "count sum above 2^53"])
def test_console_script_prints_only_the_error_line(case, files, tmp_path):
    """As a process: no pandas/numpy warning, no traceback, before or after the one line."""
    flags, match = PLAN_CASES[case]
    flags = dict(flags)
    if "histograms" in flags:
        flags["histograms"] = files[flags["histograms"]]
    out = flags.pop("out", tmp_path / "fresh" / "out")
    done = subprocess.run([*_console_cmd(), *_plan_argv(files, out, **flags)],
                          capture_output=True, text=True, timeout=120)
    # ("instances 10^9" took 42 s, then a 29.8 GiB allocation: now refused by its message
    # before any input is read)
    _assert_refused(done.returncode, done.stdout, done.stderr, match)
    assert not Path(out).exists() and _written(tmp_path, files["dir"]) == []


def test_plan_refuses_1e308_costs_instead_of_a_feasible_nan_plan(files, tmp_path, capsys):
    """The issue's first example: exit 0 with ``feasible: true`` and NaN imbalance, before."""
    code = cli.main(_plan_argv(files, tmp_path / "o", histograms=files["cost1e308"]))
    assert code == 2 and not (tmp_path / "o").exists()
    capsys.readouterr()


def test_good_input_still_plans(files, tmp_path, capsys):
    """The control: the same fixture files pass where they should (the refusals are real)."""
    code = cli.main(_plan_argv(files, tmp_path / "o", assignment=_csv(
        tmp_path / "a.csv", "key,instance\nk1,3\n")))
    cap = capsys.readouterr()
    assert code == 0, cap.err
    assert cap.err == "" and (tmp_path / "o" / "plan.json").exists()


# ------------------------------------------------------------------ the model itself
def _problem(**kw):
    k = 4
    base = dict(keys=np.array([f"k{i}" for i in range(k)], dtype=object),
                load=np.ones(k), state=np.ones(k), current=np.zeros(k, dtype=np.int64),
                default=np.zeros(k, dtype=np.int64), n_instances=2)
    base.update(kw)
    return Problem(**base)


@pytest.mark.parametrize("kw,match", [
    ({"load": np.array([1.0, np.nan, 1.0, 1.0])}, r"load must be finite"),
    ({"load": np.array([1.0, np.inf, 1.0, 1.0])}, r"load must be finite"),
    ({"state": np.array([1.0, -1.0, 1.0, 1.0])}, r"state must be finite and >= 0"),
    ({"load": np.full(4, 1e308)}, r"load sums to inf"),
    ({"state": np.full(4, 1e308)}, r"state sums to inf"),
    ({"n_instances": MAX_INSTANCES + 1}, rf"must be <= {MAX_INSTANCES}"),
    ({"n_instances": 10 ** 9}, rf"must be <= {MAX_INSTANCES}"),
    ({"n_instances": 0}, r"integer >= 1"),
    ({"n_instances": True}, r"integer >= 1"),
    ({"n_instances": 2.0}, r"integer >= 1"),
    ({"current": np.array([0, -1, 0, 0])}, r"negative"),
    ({"default": np.array([0, 2, 0, 0])}, r"outside \[0, 2\)"),
    ({"keys": np.array(["a", "a", "b", "c"], dtype=object)}, r"unique"),
    ({"load": np.ones(3)}, r"3 values for 4 keys"),
    ({"drain": frozenset({0, 1})}, r"cannot drain every instance"),
])
def test_problem_refuses_bad_input_before_any_planning(kw, match):
    with pytest.raises(PlanningError, match=match):
        _problem(**kw)


def test_problem_cap_allocates_nothing_per_instance():
    """N = 10^9 is refused in the constructor, before any per-instance array (8 GB each)."""
    import tracemalloc

    tracemalloc.start()
    with pytest.raises(PlanningError):
        _problem(n_instances=10 ** 9)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 1_000_000


# --------------------------------------------------------------- the other commands
BENCH_CASES = {
    "out /proc/x": (["--out", "/proc/x"], r"--out /proc/x cannot be created"),
    "out is a file": (["--out", "afile"], r"exists and is not a directory"),
    "scale 10^9 keys": (["--experiment", "scale", "--keys", "1000000000"],
                        r"--keys must be within \[1, 50000000\]"),
    "scale keys text": (["--experiment", "scale", "--keys", "1e6"], r"comma-separated integers"),
    # an empty --keys ran the default 10^4 .. 10^7 keys (found by the fuzz test)
    "scale keys empty": (["--experiment", "scale", "--keys", ""], r"comma-separated integers"),
    "intervals 10^10": (["--intervals", "10000000000"], r"--intervals must be <= 100000"),
    "intervals 1": (["--intervals", "1"], r"--intervals must be >= 2"),
    "runs 0": (["--runs", "0"], r"--runs must be >= 1"),
    "theta nan": (["--theta", "nan"], r"--theta must be a number > 0"),
    "time limit inf": (["--time-limit", "inf"], r"--time-limit must be a finite number > 0"),
    "replay N 10^6": (["--experiment", "replay", "--histograms", "in/ok.csv", "--instances",
                       "1000000"], r"--instances must be within \[1, 4096\]"),
    "replay without N": (["--experiment", "replay", "--histograms", "in/ok.csv"],
                         r"needs --histograms PATH and --instances N"),
}


@pytest.mark.parametrize("case", list(BENCH_CASES))
def test_bench_refusals(case, files, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv, match = BENCH_CASES[case]
    code = cli.main(["bench", "--no-progress", *argv])
    cap = capsys.readouterr()
    _assert_refused(code, cap.out, cap.err, match, cmd="bench")
    assert _written(tmp_path, files["dir"]) == []  # not even ./bench-out


@pytest.mark.parametrize("argv,match", [
    (["history", "--limit", "-1"], r"--limit must be >= 0"),
    (["rollback", "--to-version", "-1"], r"--to-version must be within \[0, "),
    (["rollback", "--to-version", "1", "--theta", "nan"], r"--theta must be a number > 0"),
    (["rollback", "--to-version", "1", "--lookback-windows", "0"],
     r"--lookback-windows must be within \[1, "),
])
def test_audit_refusals_before_spark_starts(argv, match, capsys, monkeypatch):
    from rebalance.cli import apply as apply_cli
    def no_spark():
        raise AssertionError("the command asked for a Spark session before refusing")
    monkeypatch.setattr(apply_cli, "cli_spark_session", no_spark)  # no JVM may start
    code = cli.main(argv)
    cap = capsys.readouterr()
    _assert_refused(code, cap.out, cap.err, match, cmd=argv[0])


@pytest.mark.parametrize("which", ["histograms", "assignment"])
def test_parquet_keys_not_utf8_name_the_file_and_column(which, files, tmp_path, capsys):
    """Issue 23 (row 17): Parquet keys stored as bytes that are not UTF-8 gave a bare
    "'utf-8' codec can't decode byte 0xff" naming no file or column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = files["dir"] / f"{which}.parquet"
    keys = pa.array([b"k1", b"k\xff\xfe"], pa.binary())
    if which == "histograms":
        start = pa.array(np.array([T0[:-1]] * 2, dtype="datetime64[us]"), pa.timestamp("us", "UTC"))
        pq.write_table(pa.table({"window_start": start, "key": keys,
                                 "count": pa.array([1, 2], pa.int64())}), bad)
    else:
        pq.write_table(pa.table({"key": keys, "instance": pa.array([0, 1], pa.int64())}), bad)
    code = cli.main(_plan_argv(files, tmp_path / "o", **{which: bad}))
    cap = capsys.readouterr()
    _assert_refused(code, cap.out, cap.err, rf"{which} {re.escape(str(bad))} as Parquet: "
                    r"column 'key' holds bytes that are not UTF-8 text \(row index 1: ")
    assert _written(tmp_path, files["dir"]) == []
