"""``rebalance plan`` on Parquet/CSV input: outputs, metrics, and every bad-input case."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rebalance import cli
from rebalance.core.defaults import DEFAULT_THETA
from rebalance.core.placement import default_instances

T0 = pd.Timestamp("2024-01-01T00:00:00Z")
METRICS = ("imbalance_before", "imbalance_after", "migration_fraction", "migration_bytes",
           "moved_keys", "table_size", "plan_seconds", "lower_bound_migration_fraction")


def histogram_frame(n_keys=60, windows=3, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    out = []
    for w in range(windows):
        counts = rng.zipf(1.6, n_keys).clip(max=400)
        out.append(pd.DataFrame({
            "window_start": T0 + pd.Timedelta(minutes=w),
            "key": [f"key-{i}" for i in range(n_keys)],
            "count": counts.astype(np.int64),
            "cost": counts * 1.5,
            "state_bytes": rng.integers(10, 5000, n_keys),
            "instance": 0,  # extra column, ignored
        }))
    return pd.concat(out, ignore_index=True)


@pytest.fixture()
def inputs(tmp_path):
    h = tmp_path / "hist.parquet"
    histogram_frame().to_parquet(h)
    a = tmp_path / "assign.csv"
    pd.DataFrame({"key": ["key-0", "key-1", "extra-key"], "instance": [1, 2, 3]}).to_csv(a, index=False)
    return h, a


def run(args, capsys):
    code = cli.main(["plan", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_happy_path(inputs, tmp_path, capsys):
    h, a = inputs
    out = tmp_path / "out"
    code, stdout, err = run(["--histograms", h, "--instances", 4, "--assignment", a,
                             "--windows", 2, "--method", "mixed", "--out", out], capsys)
    assert code == 0, err
    assert "plan mixed" in stdout
    doc = json.loads((out / "plan.json").read_text())
    assert doc["method"] == "mixed" and isinstance(doc["feasible"], bool)
    assert isinstance(doc["notes"], list) and doc["notes"]
    for name in METRICS:
        assert isinstance(doc["metrics"][name], (int, float)), name
        assert not isinstance(doc["metrics"][name], bool)
    assert doc["metrics"]["feasible"] == doc["feasible"]
    assert doc["parameters"]["theta"] == DEFAULT_THETA and doc["parameters"]["windows"] == 2
    assert doc["input"]["windows_used"] == 2 and doc["input"]["keys"] == 61

    table = pq.read_table(out / "assignment.parquet")
    assert table.schema.field("key").type == "string"
    assert str(table.schema.field("instance").type) in ("int32", "int64")
    assert str(table.schema.field("moved").type) == "bool"
    frame = table.to_pandas()
    assert sorted(frame["key"]) == sorted([f"key-{i}" for i in range(60)] + ["extra-key"])
    assert frame["key"].is_unique
    assert frame["instance"].between(0, 3).all()
    assert doc["assignment_file"]["rows"] == len(frame)
    # keys that did not move sit where the input said: the file, else the default placement
    listed = {"key-0": 1, "key-1": 2, "extra-key": 3}
    dflt = dict(zip(frame["key"], default_instances(frame["key"].to_numpy(dtype=object), 4)))
    current = np.array([listed.get(k, dflt[k]) for k in frame["key"]])
    assert np.array_equal(frame["moved"].to_numpy(), frame["instance"].to_numpy() != current)
    assert int(frame["moved"].sum()) == doc["metrics"]["moved_keys"]
    assert int((frame["instance"].to_numpy() != np.array([dflt[k] for k in frame["key"]])).sum()) \
        == doc["metrics"]["table_size"]
    assert not list(tmp_path.glob(".out.tmp-*"))  # no staging left behind


def test_default_method_is_auto_and_plans_are_deterministic(inputs, tmp_path, capsys):
    h, _ = inputs
    results = []
    for name in ("o1", "o2"):
        code, _, err = run(["--histograms", h, "--instances", 3, "--out", tmp_path / name,
                            "--time-limit", 2], capsys)
        assert code == 0, err
        results.append(pq.read_table(tmp_path / name / "assignment.parquet").to_pandas())
        doc = json.loads((tmp_path / name / "plan.json").read_text())
        assert doc["method"] == "auto"
    pd.testing.assert_frame_equal(results[0], results[1])
    # without an assignment file every key starts on its default placement
    frame = results[0]
    dflt = default_instances(frame["key"].to_numpy(dtype=object), 3)
    assert np.array_equal(frame["moved"].to_numpy(), frame["instance"].to_numpy() != dflt)


def test_migration_budget_fraction_and_bytes(inputs, tmp_path, capsys):
    h, _ = inputs
    for budget, name in ((0.25, "frac"), (5000, "bytes")):
        code, _, err = run(["--histograms", h, "--instances", 4, "--method", "greedy",
                            "--migration-budget", budget, "--out", tmp_path / name], capsys)
        assert code == 0, err
        doc = json.loads((tmp_path / name / "plan.json").read_text())
        total = doc["input"]["total_state_bytes"]
        expected = 0.25 * total if budget <= 1 else 5000.0
        assert doc["parameters"]["migration_budget_bytes"] == pytest.approx(expected)
        assert doc["metrics"]["migration_bytes"] <= expected + 1e-6


def test_existing_out_dir_is_replaced_atomically(inputs, tmp_path, capsys):
    h, _ = inputs
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, err = run(["--histograms", h, "--instances", 2, "--method", "hash", "--out", out],
                       capsys)
    assert code == 0, err
    code, _, err = run(["--histograms", h, "--instances", 5, "--method", "lpt", "--out", out],
                       capsys)
    assert code == 0, err
    doc = json.loads((out / "plan.json").read_text())
    assert doc["parameters"]["instances"] == 5 and doc["method"] == "lpt"
    assert (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in out.iterdir()) == ["assignment.parquet", "keep.txt", "plan.json"]


def _bad_cases(tmp_path: Path, h: Path):
    def parquet(name, frame):
        p = tmp_path / name
        frame.to_parquet(p)
        return p

    def csv(name, frame):
        p = tmp_path / name
        frame.to_csv(p, index=False)
        return p

    good = histogram_frame(n_keys=10, windows=1)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 this is not parquet")
    return {
        "missing column": (["--histograms", parquet("nocount.parquet", good.drop(columns="count"))],
                           "'count'"),
        "missing columns": (["--histograms", parquet("nokey.parquet",
                                                     good.drop(columns=["key", "window_start"]))],
                            "'window_start', 'key'"),
        "negative load": (["--histograms", parquet("neg.parquet", good.assign(cost=-1.0))],
                          "'cost' must be finite and >= 0"),
        "NaN load": (["--histograms", parquet("nan.parquet", good.assign(cost=np.nan))],
                     "'cost' must be finite"),
        "negative state": (["--histograms", parquet("negs.parquet", good.assign(state_bytes=-3))],
                           "'state_bytes' must be finite"),
        "empty input": (["--histograms", parquet("empty.parquet", good.iloc[0:0])], "empty"),
        "path not found": (["--histograms", tmp_path / "nope.parquet"], "not found"),
        "unreadable format": (["--histograms", junk], "cannot read histograms"),
        "instance out of range": (["--assignment", csv("oor.csv", pd.DataFrame(
            {"key": ["key-1"], "instance": [7]}))], r"outside the integers \[0, 4\)"),
        "duplicate keys": (["--assignment", csv("dup.csv", pd.DataFrame(
            {"key": ["key-1", "key-1"], "instance": [0, 1]}))], "more than once"),
        "assignment missing column": (["--assignment", csv("acol.csv", pd.DataFrame(
            {"key": ["key-1"]}))], "'instance'"),
        "assignment not found": (["--assignment", tmp_path / "none.csv"], "not found"),
        "theta zero": (["--theta", 0], "--theta must be"),
        "theta negative": (["--theta", -0.1], "--theta must be"),
        "no instances": (["--instances", 0], "--instances must be >= 1"),
        "no windows": (["--windows", 0], "--windows must be >= 1"),
        "unknown method": (["--method", "magic"], "unknown --method 'magic'"),
        "negative budget": (["--migration-budget", -1], "--migration-budget"),
        "negative table": (["--max-table", -1], "--max-table"),
    }


@pytest.mark.parametrize("case", [
    "missing column", "missing columns", "negative load", "NaN load", "negative state",
    "empty input", "path not found", "unreadable format", "instance out of range",
    "duplicate keys", "assignment missing column", "assignment not found", "theta zero",
    "theta negative", "no instances", "no windows", "unknown method", "negative budget",
    "negative table"])
def test_bad_input_exits_2_with_one_message_and_writes_nothing(case, inputs, tmp_path, capsys):
    h, _ = inputs
    extra, match = _bad_cases(tmp_path, h)[case]
    base = {"--histograms": h, "--instances": 4, "--method": "mixed"}
    flags = dict(base)
    for i in range(0, len(extra), 2):
        flags[extra[i]] = extra[i + 1]
    args = [x for kv in flags.items() for x in kv]
    # a fresh DIR is never created
    fresh = tmp_path / "fresh" / "out"
    code, stdout, err = run([*args, "--out", fresh], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("rebalance plan: error: ")
    import re

    assert re.search(match, lines[0]), lines[0]
    assert not fresh.exists() and not fresh.parent.exists()
    # an existing DIR keeps its earlier plan, byte for byte
    old = tmp_path / "old"
    assert run(["--histograms", h, "--instances", 4, "--method", "hash", "--out", old],
               capsys)[0] == 0
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    code, _, _ = run([*args, "--out", old], capsys)
    assert code == 2
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before


def test_out_is_a_file(inputs, tmp_path, capsys):
    h, _ = inputs
    f = tmp_path / "file"
    f.write_text("x")
    code, _, err = run(["--histograms", h, "--instances", 2, "--out", f], capsys)
    assert code == 2 and "not a directory" in err and f.read_text() == "x"


def test_console_script_runs(inputs, tmp_path):
    h, _ = inputs
    exe = Path(sys.executable).with_name("rebalance")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "rebalance.cli"]
    ok = subprocess.run([*cmd, "plan", "--histograms", str(h), "--instances", "3",
                         "--method", "mixed", "--out", str(tmp_path / "o")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    bad = subprocess.run([*cmd, "plan", "--histograms", str(h), "--instances", "3",
                          "--theta", "0", "--out", str(tmp_path / "o2")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "--theta" in bad.stderr
    assert not (tmp_path / "o2").exists()


# ------------------------------------------------ issue 14: refusals of a hostile user
def _console(args, timeout=60):
    """``rebalance plan ...`` as its own process: what a user sees on stdout and stderr."""
    exe = Path(sys.executable).with_name("rebalance")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "rebalance.cli"]
    return subprocess.run([*cmd, "plan", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def _huge(tmp_path, name, **columns):
    frame = histogram_frame(n_keys=5, windows=1)
    for col, value in columns.items():
        frame[col] = value
    path = tmp_path / name
    frame.to_parquet(path)
    return path


@pytest.mark.parametrize("case", ["cost 1e308", "count 2^62", "instances 10^9", "out /proc",
                                  "out under a file", "window text", "state inf"])
def test_hostile_inputs_exit_2_with_one_line_and_write_nothing(case, tmp_path):
    good = tmp_path / "good.parquet"
    histogram_frame(n_keys=5, windows=1).to_parquet(good)
    (tmp_path / "afile").write_text("x")
    not_parquet = tmp_path / "garbage.parquet"
    not_parquet.write_bytes(b"not a parquet file\n" * 64)
    window_text = tmp_path / "text.csv"
    histogram_frame(n_keys=5, windows=1).assign(window_start="yesterday noon") \
        .to_csv(window_text, index=False)
    out = tmp_path / "fresh" / "out"
    args, match = {
        "cost 1e308": (["--histograms", _huge(tmp_path, "c.parquet", cost=1e308)],
                       r"'cost' sums to inf"),
        "count 2^62": (["--histograms", _huge(tmp_path, "n.parquet", count=2 ** 62)],
                       r"'count' sums to"),
        # refused before reading anything: the histograms file is not even Parquet
        "instances 10^9": (["--histograms", not_parquet, "--instances", 1_000_000_000],
                           r"--instances must be <= 4096"),
        "out /proc": (["--histograms", good, "--out", "/proc/foo"], r"cannot be created"),
        "out under a file": (["--histograms", good, "--out", tmp_path / "afile" / "x"],
                             r"cannot be created"),
        "window text": (["--histograms", window_text], r"not a timestamp"),
        "state inf": (["--histograms", _huge(tmp_path, "s.parquet", state_bytes=float("inf"))],
                      r"'state_bytes' must be finite"),
    }[case]
    flags = {"--histograms": good, "--instances": 4, "--method": "mixed", "--out": out}
    for i in range(0, len(args), 2):
        flags[args[i]] = args[i + 1]
    done = _console([x for kv in flags.items() for x in kv])
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # no warning, no traceback
    assert lines[0].startswith("rebalance plan: error: ") and re.search(match, lines[0]), lines[0]
    assert not out.exists() and not out.parent.exists()
    assert not list(tmp_path.glob(".*probe*"))


def test_plan_json_records_where_the_time_went(inputs, tmp_path, capsys):
    h, _ = inputs
    started = time.perf_counter()
    code, _, err = run(["--histograms", h, "--instances", 3, "--method", "mixed",
                        "--out", tmp_path / "o"], capsys)
    took = time.perf_counter() - started
    assert code == 0, err
    timings = json.loads((tmp_path / "o" / "plan.json").read_text())["timings"]
    parts = ("input_seconds", "plan_seconds", "write_seconds")
    assert set(timings) >= set(parts)
    # each part was measured (a real duration), and they are parts of the command's time
    assert all(isinstance(timings[p], float) and timings[p] > 0 for p in parts), timings
    assert sum(timings[p] for p in parts) <= took, (timings, took)


def test_plan_reads_parquet_without_importing_pandas(tmp_path):
    """One window (a big plan's usual input) with the default load model: nothing to
    backtest, so neither the backtest nor pandas is imported."""
    h = tmp_path / "hist.parquet"
    histogram_frame(windows=1).to_parquet(h)
    code = ("import sys\nfrom rebalance import cli\n"
            f"rc = cli.main(['plan', '--histograms', {str(h)!r}, '--instances', '3', "
            f"'--method', 'mixed', '--out', {str(tmp_path / 'o')!r}])\n"
            "print('pandas' in sys.modules, rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "False 0", done.stderr


@pytest.mark.parametrize("earlier_plan", [False, True])
def test_sigterm_while_the_plan_is_written_leaves_no_staging_folder(inputs, tmp_path,
                                                                    monkeypatch, earlier_plan):
    """SIGTERM arrives (deterministically: sent by the Parquet writer to this process) while
    assignment.parquet sits in the staging folder: exit 143, the staging folder removed,
    and --out as it was (absent, or the earlier plan byte for byte). Issue 23, row 14."""
    import os
    import signal

    import pyarrow.parquet as pq

    h, _ = inputs
    out = tmp_path / "plan"
    argv = ["plan", "--histograms", str(h), "--instances", "3", "--method", "mixed",
            "--out", str(out)]
    if earlier_plan:
        assert cli.main(argv) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()} if earlier_plan else None
    real = pq.write_table

    def write_then_sigterm(table, where, *a, **k):
        real(table, where, *a, **k)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(pq, "write_table", write_then_sigterm)
    assert cli.main(argv) == 143
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    if earlier_plan:
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    else:
        assert not out.exists()


def test_every_help_text_is_written_for_users(capsys):
    """No subcommand's --help prints developer markup (Sphinx roles, reST literals)."""
    import re

    parser = cli.build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    for name, sub in action.choices.items():
        text = sub.format_help()
        assert not re.search(r":(mod|class|func|data|meth|attr):`|``", text), (name, text)
