"""Issue 23: every subcommand refuses bad input in one line and writes nothing, fuzzed.

Hypothesis draws command lines and input files for every subcommand (``plan``, ``apply``,
``history``, ``status``, ``rollback``, ``bench``, ``trigger``, ``backtest``), each with at
least one element that is bad (a number out of range, a malformed plan.json, a CSV with
a hostile cell, a FIFO, an unknown name ...) and the others good or bad at random, runs
``rebalance.cli.main`` in-process and asserts the contract:

* exit code 2, nothing on stdout, exactly one stderr line ``rebalance <cmd>: error: ...``;
* nothing written or changed: the example's folder (its cwd, where default outputs would
  go) and the data folder (``REBALANCE_DATA_DIR``, where tables and a JVM's logs would
  go) are the same, byte for byte, before and after;
* no JVM started (subcommands that need Spark refuse these inputs before it starts; the
  refusals that need Spark are in tests/integration/test_refusals_spark.py).

Examples are derandomized (the same cases every run): ``REBALANCE_FUZZ_EXAMPLES`` (default
40) per subcommand; :data:`CASES` counts what ran.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rebalance import cli

T0 = "2026-01-01T00:00:00Z"
EXAMPLES = int(os.environ.get("REBALANCE_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
#: Examples run per subcommand (printed at the end of the module).
CASES: dict[str, int] = {}

GOOD_CSV = "window_start,key,count\n" + "".join(f"{T0},k{i},{i + 1}\n" for i in range(8))


# ------------------------------------------------------------------ the harness
@pytest.fixture(scope="module")
def root():
    """A folder for the module: data folder, a template plan, the examples' folders."""
    with tempfile.TemporaryDirectory(prefix="fuzz-cli-") as d, pytest.MonkeyPatch.context() as mp:
        base = Path(d)
        (base / "data").mkdir()
        mp.setenv("REBALANCE_DATA_DIR", str(base / "data"))
        (base / "template").mkdir()
        hist = base / "template" / "h.csv"
        hist.write_text(GOOD_CSV)
        code = cli.main(["plan", "--histograms", str(hist), "--instances", "4", "--method",
                         "mixed", "--out", str(base / "template" / "plan")])
        assert code == 0
        yield base
    print(f"\nfuzz cases per subcommand: {CASES}, total {sum(CASES.values())}",
          file=sys.__stderr__)


def _snapshot(folder: Path) -> dict[str, object]:
    """Every entry under ``folder``: type and, for regular files, a digest (a FIFO is
    never opened)."""
    out: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            mode = os.lstat(p).st_mode
            if stat.S_ISREG(mode):
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(mode):
                out[str(p)] = ("link", os.readlink(p))
            else:
                out[str(p)] = stat.S_IFMT(mode)
    return out


def _jvm() -> object:
    module = sys.modules.get("pyspark")
    return None if module is None else module.SparkContext._gateway


class Example:
    """One example's folder (its cwd while the command runs)."""

    def __init__(self, root: Path):
        self.root = root
        self.dir = Path(tempfile.mkdtemp(dir=root, prefix="ex-"))
        (self.dir / "afile").write_text("x")

    def write(self, name: str, data: str | bytes) -> str:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
        return name

    def special(self, kind: str) -> str:
        """A path that is not a plain file: fifo, loop, dangling, dir, missing."""
        if kind == "fifo":
            os.mkfifo(self.dir / "fifo.csv")
            return "fifo.csv"
        if kind == "loop":
            os.symlink("loop-b.csv", self.dir / "loop-a.csv")
            os.symlink("loop-a.csv", self.dir / "loop-b.csv")
            return "loop-a.csv"
        if kind == "dangling":
            os.symlink("nowhere.csv", self.dir / "dangling.csv")
            return "dangling.csv"
        if kind == "dir":
            (self.dir / "emptydir").mkdir(exist_ok=True)
            return "emptydir"
        return "missing.csv"

    def refused(self, argv: list[str], cmd: str, capsys) -> str:
        """Run ``rebalance argv`` here and assert the contract; returns the error line."""
        CASES[cmd] = CASES.get(cmd, 0) + 1
        watched = (self.dir, self.root / "data")
        before = [_snapshot(f) for f in watched]
        jvm = _jvm()
        cwd = os.getcwd()
        os.chdir(self.dir)
        try:
            code = cli.main(argv)
        finally:
            os.chdir(cwd)
        cap = capsys.readouterr()
        try:
            assert code == 2, (argv, code, cap.err)
            assert cap.out == "", (argv, cap.out)
            lines = cap.err.splitlines()
            assert len(lines) == 1, (argv, cap.err)
            assert lines[0].startswith((f"rebalance {cmd}: error: ", "rebalance: error: ")), \
                (argv, lines[0])
            assert [_snapshot(f) for f in watched] == before, (argv, "something was written")
            assert _jvm() is jvm, (argv, "a JVM was started")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
        return lines[0]


def _argv(cmd: str, flags: dict[str, object], positional: tuple[str, ...] = ()) -> list[str]:
    argv = [cmd, *positional]
    for flag, value in flags.items():
        if value is None:
            continue
        if isinstance(value, list):
            for v in value:
                argv += [flag, str(v)]
        elif value is True:
            argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def _bad_subset(draw, names: list[str]) -> set[str]:
    """At least one element bad, the others bad or good at random."""
    return draw(st.sets(st.sampled_from(names), min_size=1))


NOT_AN_INT = st.sampled_from(["1e9", "x", "", "1.5", "0x10", "nan", "1_0x", "--"])
NOT_POSITIVE_FLOAT = st.sampled_from(["nan", "inf", "-inf", "0", "-0.5", "abc", "", "1e400"])


# -------------------------------------------------------------- hostile files
def _hostile_csv(draw, ex: Example) -> str:
    """A histogram CSV (or other path) that ``plan``/``backtest`` must refuse."""
    kind = draw(st.sampled_from(["missing_column", "cell", "bytes", "bom_cell", "utf8",
                                 "sum_overflow", "empty", "special", "parquet_garbage"]))
    if kind == "missing_column":
        cols = draw(st.lists(st.sampled_from(["window_start", "key", "count", "cost", "x"]),
                             unique=True, max_size=4).filter(
            lambda c: not {"window_start", "key", "count"} <= set(c)))
        body = ",".join(cols) + "\n" + ",".join("1" for _ in cols) + "\n"
        return ex.write("h.csv", body)
    if kind in ("cell", "bom_cell"):
        column = draw(st.sampled_from(["count", "cost", "state_bytes", "window_start"]))
        bad = draw(st.sampled_from({
            "count": ["-5", "nan", "inf", "1e400", "abc", "", "-0.5"],
            "cost": ["-1", "nan", "inf", "x", "1e400"],
            "state_bytes": ["-1", "nan", "x", "inf"],
            "window_start": ["yesterday noon", "", "2026-13-45T00:00:00Z", "x"],
        }[column]))
        header = ["window_start", "key", "count", "cost", "state_bytes"]
        rows = [[T0, f"k{i}", str(i + 1), "1.0", "10"] for i in range(draw(st.integers(1, 6)))]
        rows[draw(st.integers(0, len(rows) - 1))][header.index(column)] = bad
        text = "\n".join(",".join(r) for r in [header, *rows]) + "\n"
        return ex.write("h.csv", ("\ufeff" if kind == "bom_cell" else "") + text)
    if kind == "bytes":
        data = draw(st.binary(min_size=0, max_size=200))
        return ex.write("h.csv", data)
    if kind == "utf8":
        bad = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80abc"]))
        return ex.write("h.csv", b"window_start,key,count\n" + T0.encode() + b",k" + bad
                        + b",1\n")
    if kind == "sum_overflow":
        return ex.write("h.csv", f"window_start,key,count\n{T0},a,1e300\n{T0},b,1e300\n")
    if kind == "empty":
        return ex.write("h.csv", draw(st.sampled_from(["", "\n", "window_start,key,count\n"])))
    if kind == "parquet_garbage":
        return ex.write("h.parquet", draw(st.binary(max_size=100)))
    return ex.special(draw(st.sampled_from(["fifo", "loop", "dangling", "dir", "missing"])))


def _hostile_assignment(draw, ex: Example) -> str:
    instance = draw(st.sampled_from(["-1", "4", "1.5", "nan", "x", "1e30", ""]))
    if draw(st.booleans()):
        return ex.write("a.csv", f"key,instance\nk1,{instance}\n")
    return ex.write("a.csv", draw(st.sampled_from(["key\nk1\n", "instance\n1\n",
                                                   "key,instance\nk1,1\nk1,2\n"])))


# ------------------------------------------------------------------------ plan
@st.composite
def plan_cases(draw, root: Path):
    ex = Example(root)
    good = {"--histograms": ex.write("ok.csv", GOOD_CSV), "--instances": 4,
            "--method": "mixed", "--out": "out"}
    bad = _bad_subset(draw, ["histograms", "instances", "theta", "windows", "time_limit",
                             "budget", "max_table", "method", "out", "assignment",
                             "load_model", "unknown_flag"])
    flags = dict(good)
    if "histograms" in bad:
        flags["--histograms"] = _hostile_csv(draw, ex)
    if "instances" in bad:
        flags["--instances"] = draw(st.one_of(
            st.sampled_from(["0", "-1", "4097", str(10 ** 9), str(10 ** 30)]), NOT_AN_INT))
    if "theta" in bad:
        flags["--theta"] = draw(NOT_POSITIVE_FLOAT)
    if "windows" in bad:
        flags["--windows"] = draw(st.one_of(st.sampled_from(["0", "-3"]), NOT_AN_INT))
    if "time_limit" in bad:
        flags["--time-limit"] = draw(NOT_POSITIVE_FLOAT)
    if "budget" in bad:
        flags["--migration-budget"] = draw(st.sampled_from(["-1", "nan", "inf", "x"]))
    if "max_table" in bad:
        flags["--max-table"] = draw(st.one_of(st.just("-1"), NOT_AN_INT))
    if "method" in bad:
        flags["--method"] = draw(st.sampled_from(["bogus", "", "MIXED", "flux"]))
    if "out" in bad:
        kind = draw(st.sampled_from(["empty", "file", "under_file", "proc", "cwd",
                                     "plan_json_dir"]))
        if kind == "plan_json_dir":
            (ex.dir / "old" / "plan.json").mkdir(parents=True)
            ex.write("old/assignment.parquet", b"earlier bytes")
        flags["--out"] = {"empty": "", "file": "afile", "under_file": "afile/x",
                          "proc": "/proc/fuzz", "cwd": ".", "plan_json_dir": "old"}[kind]
    if "assignment" in bad:
        flags["--assignment"] = _hostile_assignment(draw, ex)
    if "load_model" in bad:
        flags["--load-model"] = draw(st.sampled_from(["bogus", "", "ewm:x"]))
    if "unknown_flag" in bad:
        flags["--bogus-flag"] = "1"
    return ex, _argv("plan", flags)


@FUZZ
@given(data=st.data())
def test_plan_fuzz(root, capsys, data):
    ex, argv = data.draw(plan_cases(root))
    ex.refused(argv, "plan", capsys)


# ----------------------------------------------------------------------- apply
PLAN_FIELD_BAD = {
    ("format_version",): [2, "1", None, True, 1.0, []],
    ("method",): [None, 3, []],
    ("assignment_file",): ["assignment.parquet", [], 1, None],
    ("assignment_file", "sha256"): [None, 1, "abc", "0" * 64],
    ("assignment_file", "rows"): [-1, 1.5, "8", True, None, 7, 9],
    ("parameters",): [None, [], "x", 0],
    ("parameters", "histograms"): [None, "", 1, []],
    ("parameters", "instances"): [0, -1, 4097, 1.5, "4", True, None, 10 ** 30],
    ("parameters", "windows"): [0, -1, 1.5, "1", True, None],
    ("parameters", "method"): ["bogus", None, 1],
    ("parameters", "theta"): [0, -1, "0.08", None, True, []],
    ("parameters", "max_table"): [-1, 1.5, "x", True],
    ("parameters", "migration_budget_bytes"): [-1, "x", True, []],
    ("metrics",): [None, [], 1],
    ("metrics", "imbalance_after"): [None, "x", -1, True],
}
REQUIRED_FIELDS = [k for k in PLAN_FIELD_BAD
                   if k[-1] not in ("max_table", "migration_budget_bytes")]

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                 max_size=4),
    max_leaves=12)


@st.composite
def apply_cases(draw, root: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    ex = Example(root)
    shutil.copytree(root / "template" / "plan", ex.dir / "p")
    doc = json.loads((ex.dir / "p" / "plan.json").read_text())
    doc["parameters"]["histograms"] = str(root / "template" / "h.csv")
    kind = draw(st.sampled_from(["field", "drop", "any_json", "deep", "not_json", "digest",
                                 "table", "missing_file", "dir", "mode"]))
    plan_dir = "p"
    text = None
    if kind == "field":
        path = draw(st.sampled_from(sorted(PLAN_FIELD_BAD)))
        node = doc
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = draw(st.sampled_from(PLAN_FIELD_BAD[path]))
    elif kind == "drop":
        path = draw(st.sampled_from(REQUIRED_FIELDS))
        node = doc
        for part in path[:-1]:
            node = node[part]
        del node[path[-1]]
    elif kind == "any_json":
        text = json.dumps(draw(JSON_VALUES))
    elif kind == "deep":
        depth = draw(st.sampled_from([2_000, 50_000, 200_000]))
        text = draw(st.sampled_from(["[", '{"a":'])) * depth
    elif kind == "not_json":
        text = draw(st.sampled_from(["", "{", "plan", "{'a': 1}", "\x00"]))
    elif kind == "digest":
        (ex.dir / "p" / "assignment.parquet").write_bytes(draw(st.binary(max_size=64)))
    elif kind == "table":
        table = pq.read_table(ex.dir / "p" / "assignment.parquet")
        change = draw(st.sampled_from(["drop_key", "drop_instance", "drop_moved",
                                       "instance_text", "instance_out", "key_int",
                                       "null_key", "rows"]))
        n = table.num_rows
        if change.startswith("drop_"):
            table = table.drop([change[5:]])
        elif change == "instance_text":
            table = table.set_column(1, "instance", pa.array(["x"] * n))
        elif change == "instance_out":
            table = table.set_column(1, "instance", pa.array([4] * n, pa.int64()))
        elif change == "key_int":
            table = table.set_column(0, "key", pa.array(list(range(n)), pa.int64()))
        elif change == "null_key":
            table = table.set_column(0, "key", pa.array([None] * n, pa.string()))
        else:
            table = table.slice(0, n - 1)
        pq.write_table(table, ex.dir / "p" / "assignment.parquet")
        doc["assignment_file"]["sha256"] = hashlib.sha256(
            (ex.dir / "p" / "assignment.parquet").read_bytes()).hexdigest()
    elif kind == "missing_file":
        (ex.dir / "p" / draw(st.sampled_from(["plan.json", "assignment.parquet"]))).unlink()
    elif kind == "dir":
        plan_dir = draw(st.sampled_from(["", "afile", "nowhere"]))
    if text is None and (ex.dir / "p" / "plan.json").exists():
        text = json.dumps(doc)
    if text is not None:
        (ex.dir / "p" / "plan.json").write_text(text)
    flags = {"--plan": plan_dir, "--dry-run": draw(st.booleans()) or None}
    if kind == "mode":
        flags["--apply-mode"] = draw(st.sampled_from(["bogus", "", "live"]))
    return ex, _argv("apply", flags)


@FUZZ
@given(data=st.data())
def test_apply_fuzz(root, capsys, data):
    ex, argv = data.draw(apply_cases(root))
    ex.refused(argv, "apply", capsys)


# --------------------------------------------- history, status, rollback, trigger
@st.composite
def audit_cases(draw, root: Path):
    ex = Example(root)
    cmd = draw(st.sampled_from(["history", "status", "rollback"]))
    if cmd == "history":
        flags = {"--limit": draw(st.one_of(st.sampled_from(["-1", "-100"]), NOT_AN_INT))}
    elif cmd == "status":
        flags = {"--windows": draw(st.one_of(
            st.sampled_from(["0", "-1", "100001", "3000000000", str(2 ** 70)]), NOT_AN_INT))}
    else:
        bad = _bad_subset(draw, ["to_version", "theta", "lookback", "missing"])
        flags = {"--to-version": 1}
        if "to_version" in bad:
            flags["--to-version"] = draw(st.one_of(
                st.sampled_from(["-1", str(2 ** 63), str(10 ** 30)]), NOT_AN_INT))
        if "theta" in bad:
            flags["--theta"] = draw(NOT_POSITIVE_FLOAT)
        if "lookback" in bad:
            flags["--lookback-windows"] = draw(st.one_of(
                st.sampled_from(["0", "-2", "100001", "3000000000"]), NOT_AN_INT))
        if "missing" in bad:
            flags["--to-version"] = None
    if draw(st.booleans()):
        flags["--json" if cmd == "history" else "--dry-run"] = (
            True if cmd != "status" else None)
    return ex, cmd, _argv(cmd, flags)


@FUZZ
@given(data=st.data())
def test_history_status_rollback_fuzz(root, capsys, data):
    ex, cmd, argv = data.draw(audit_cases(root))
    ex.refused(argv, cmd, capsys)


@st.composite
def trigger_cases(draw, root: Path):
    ex = Example(root)
    bad = _bad_subset(draw, ["conf", "set", "timeout"])
    flags: dict[str, object] = {"--url": "http://127.0.0.1:9"}  # nothing listens there
    if "conf" in bad:
        flags["--conf"] = draw(st.one_of(
            st.sampled_from(["[]", "42", "not json", '{"bogus": 1}', '{"theta": "x"}',
                             '{"theta": -1}', '{"theta": null, "method": "bogus"}', "{"]),
            st.builds(lambda d, c: c * d, st.sampled_from([1_000, 50_000]),
                      st.sampled_from(["[", '{"a":'])),
            JSON_VALUES.filter(lambda v: not isinstance(v, dict)).map(json.dumps),
            st.dictionaries(st.text(min_size=1, max_size=6).filter(
                lambda k: k not in _params()), JSON_VALUES, min_size=1).map(json.dumps)))
    if "set" in bad:
        flags["--set"] = [draw(st.sampled_from(["noequals", "=1", "bogus=1", "theta=abc",
                                                "theta=-1", "theta=" + "[" * 50_000]))]
    if "timeout" in bad:
        flags["--timeout"] = draw(NOT_POSITIVE_FLOAT)
    return ex, _argv("trigger", flags)


def _params() -> set[str]:
    from rebalance.control.params import PARAMS_SCHEMA

    return set(PARAMS_SCHEMA)


@FUZZ
@given(data=st.data())
def test_trigger_fuzz(root, capsys, data):
    ex, argv = data.draw(trigger_cases(root))
    ex.refused(argv, "trigger", capsys)


# ----------------------------------------------------------------------- bench
@st.composite
def bench_cases(draw, root: Path):
    ex = Example(root)
    experiment = draw(st.sampled_from(["quick", "zipf-sweeps", "migration-budgets",
                                       "elb-clb", "replay", "scale"]))
    names = ["seed", "intervals", "runs", "theta", "time_limit", "planners", "out",
             "experiment"]
    if experiment == "scale":
        names += ["keys", "workdir"]
    if experiment == "replay":
        names += ["replay_inputs"]
    bad = _bad_subset(draw, names)
    flags: dict[str, object] = {"--experiment": experiment, "--no-progress": True,
                                "--out": "bench"}
    if experiment == "replay":
        flags.update({"--histograms": ex.write("ok.csv", GOOD_CSV), "--instances": 4})
    if experiment == "scale":
        flags["--keys"] = "100"
    if "seed" in bad:
        flags["--seed"] = draw(st.one_of(st.sampled_from(["-1", str(2 ** 31), "-99"]),
                                         NOT_AN_INT))
    if "intervals" in bad:
        flags["--intervals"] = draw(st.sampled_from(["1", "0", "-1", "100001", "x"]))
    if "runs" in bad:
        flags["--runs"] = draw(st.sampled_from(["0", "-1", "x"]))
    if "theta" in bad:
        flags["--theta"] = draw(NOT_POSITIVE_FLOAT)
    if "time_limit" in bad:
        flags["--time-limit"] = draw(NOT_POSITIVE_FLOAT)
    if "planners" in bad:
        flags["--planners"] = draw(st.sampled_from(
            ["bogus", "mixed,nope", ",", "", "clb@0", "clb@x"]
            + (["flux", "mixed@2"] if experiment == "scale" else [])))
    if "out" in bad:
        flags["--out"] = draw(st.sampled_from(["", "afile", "afile/x", "/proc/fuzz"]))
    if "experiment" in bad:
        flags["--experiment"] = draw(st.sampled_from(["nope", "", "QUICK"]))
    if "keys" in bad:
        flags["--keys"] = draw(st.sampled_from(["0", "1e6", "x", "", "100,-1",
                                                str(10 ** 9)]))
    if "workdir" in bad:
        flags["--workdir"] = draw(st.sampled_from(["afile", "afile/x", "/proc/fuzz", ""]))
    if "replay_inputs" in bad:
        which = draw(st.sampled_from(["no_histograms", "no_instances", "instances"]))
        if which == "no_histograms":
            flags["--histograms"] = None
        elif which == "no_instances":
            flags["--instances"] = None
        else:
            flags["--instances"] = draw(st.sampled_from(["0", "4097", "x"]))
    return ex, _argv("bench", flags)


@FUZZ
@given(data=st.data())
def test_bench_fuzz(root, capsys, data):
    ex, argv = data.draw(bench_cases(root))
    ex.refused(argv, "bench", capsys)


# -------------------------------------------------------------------- backtest
@st.composite
def backtest_cases(draw, root: Path):
    ex = Example(root)
    bad = _bad_subset(draw, ["histograms", "instances", "theta", "history", "horizon",
                             "step", "start", "oracle", "out", "policies", "assignment"])
    hist = ex.write("ok.csv", GOOD_CSV)
    flags: dict[str, object] = {"--instances": 4, "--theta": 0.1}
    if "histograms" in bad:
        hist = _hostile_csv(draw, ex)
    if "instances" in bad:
        flags["--instances"] = draw(st.one_of(st.sampled_from(["0", "4097", "-1"]),
                                              NOT_AN_INT))
    if "theta" in bad:
        flags["--theta"] = draw(NOT_POSITIVE_FLOAT)
    for name in ("history", "horizon", "step", "start"):
        if name in bad:
            flags[f"--{name}"] = draw(st.one_of(st.sampled_from(["0", "-1"]), NOT_AN_INT))
    if "oracle" in bad:
        flags["--oracle-windows"] = draw(st.sampled_from(["0", "-1", "x"]))
    if "out" in bad:
        flags["--out"] = draw(st.sampled_from(["afile", "afile/x", "/proc/fuzz"]))
    if "policies" in bad:
        flags["--policies"] = draw(st.sampled_from(["bogus", "mixed:x", "mixed:-1"]))
    if "assignment" in bad:
        flags["--assignment"] = _hostile_assignment(draw, ex)
    return ex, _argv("backtest", flags, (hist,))


@FUZZ
@given(data=st.data())
def test_backtest_fuzz(root, capsys, data):
    ex, argv = data.draw(backtest_cases(root))
    ex.refused(argv, "backtest", capsys)


# ----------------------------------------------------------- the command itself
@FUZZ
@given(data=st.data())
def test_command_line_fuzz(root, capsys, data):
    """Unknown subcommands and options, options without values: argparse's refusals
    are one line too (no usage block)."""
    ex = Example(root)
    cmd = data.draw(st.sampled_from(["plan", "apply", "history", "status", "rollback",
                                     "bench", "trigger", "backtest", "service", "kafka",
                                     "cluster"]))
    kind = data.draw(st.sampled_from(["unknown_command", "unknown_option", "no_value",
                                      "no_command"]))
    if kind == "unknown_command":
        argv = [data.draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz-_", min_size=1,
                                  max_size=12).filter(lambda c: c not in _commands()
                                                      and not c.startswith("-")))]
        ex.refused(argv, "?", capsys)
    elif kind == "unknown_option":
        ex.refused([cmd, "--" + data.draw(st.text(alphabet="xyzq", min_size=3, max_size=8))],
                   cmd, capsys)
    elif kind == "no_value":
        option = {"plan": "--instances", "apply": "--plan", "history": "--limit",
                  "status": "--windows", "rollback": "--to-version", "bench": "--seed",
                  "trigger": "--conf", "backtest": "--theta", "service": "--bogus",
                  "kafka": "--bogus", "cluster": "--bogus"}[cmd]
        ex.refused([cmd, option], cmd, capsys)
    else:
        ex.refused(data.draw(st.sampled_from([[], ["-v"]])), "?", capsys)


def _commands() -> set[str]:
    parser = cli.build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return set(action.choices)
