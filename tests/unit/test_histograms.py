"""Histogram rows -> planning problem: validation and aggregation (pure pandas)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from rebalance.core.histogram_files import InputError, read_assignment, read_histograms
from rebalance.core.histograms import build_problem, problem_from_histograms
from rebalance.core.model import PlanningError
from rebalance.core.placement import default_instances

T0 = pd.Timestamp("2024-01-01T00:00:00Z")


def rows(*items):
    """(window index, key, count[, cost[, state]]) tuples -> a histogram frame."""
    out = []
    for it in items:
        r = {"window_start": T0 + pd.Timedelta(minutes=it[0]), "key": it[1], "count": it[2]}
        if len(it) > 3 and it[3] is not None:
            r["cost"] = it[3]
        if len(it) > 4:
            r["state_bytes"] = it[4]
        out.append(r)
    return pd.DataFrame(out)


def test_single_window_defaults_cost_and_state_to_count():
    p = problem_from_histograms(rows((0, "b", 5), (0, "a", 3)), 4)
    assert p.keys.tolist() == ["a", "b"]  # sorted
    assert p.load.tolist() == [3.0, 5.0]
    assert p.state.tolist() == [3.0, 5.0]
    assert np.array_equal(p.default, default_instances(np.array(["a", "b"], dtype=object), 4))
    assert np.array_equal(p.current, p.default)


def test_last_w_windows_mean_load_and_latest_state():
    f = rows((0, "a", 100, 100.0, 1), (1, "a", 10, 10.0, 7), (2, "a", 20, 20.0, 9),
             (1, "b", 4, 4.0, 40), (2, "c", 6, 6.0, 60))
    p, summary = build_problem(f, 2, windows=2)
    assert p.keys.tolist() == ["a", "b", "c"]
    # windows 1 and 2: a = (10 + 20) / 2, b = 4 / 2 (absent in window 2), c = 6 / 2
    assert p.load.tolist() == [15.0, 2.0, 3.0]
    assert p.state.tolist() == [9.0, 40.0, 60.0]  # latest window the key appears in
    assert p.load_series.shape == (2, 3)
    assert summary["windows_used"] == 2 and summary["windows_available"] == 3
    # more windows than exist: all of them
    p3, s3 = build_problem(f, 2, windows=10)
    assert s3["windows_used"] == 3
    assert p3.load.tolist() == pytest.approx([130 / 3, 4 / 3, 2.0])


def test_key_only_in_older_windows_is_kept_with_zero_load():
    p = problem_from_histograms(rows((0, "old", 9), (1, "new", 3)), 2, windows=1)
    assert p.keys.tolist() == ["new", "old"]
    assert p.load.tolist() == [3.0, 0.0] and p.state.tolist() == [3.0, 0.0]


def test_duplicate_rows_of_a_window_and_key_are_merged():
    f = rows((0, "a", 2, 2.5, 10), (0, "a", 3, 3.5, 30), (0, "b", 1, 1.0, 5))
    f["instance"] = [0, 1, 1]  # extra columns are ignored
    f["batch_id"] = [1, 2, 2]
    p = problem_from_histograms(f, 2)
    assert p.load.tolist() == [6.0, 1.0]  # cost summed
    assert p.state.tolist() == [30.0, 5.0]  # state: max


def test_assignment_overrides_default_and_adds_keys():
    f = rows((0, "a", 2), (0, "b", 1))
    assign = pd.DataFrame({"key": ["b", "zz"], "instance": [2, 1]})
    p, summary = build_problem(f, 3, assignment=assign)
    assert p.keys.tolist() == ["a", "b", "zz"]
    dflt = default_instances(p.keys, 3)
    assert p.current.tolist() == [dflt[0], 2, 1]
    assert p.load[2] == 0 and p.state[2] == 0
    assert summary["assignment_keys"] == 2


@pytest.mark.parametrize("frame, match", [
    (pd.DataFrame({"key": ["a"], "count": [1]}), "'window_start'"),
    (pd.DataFrame({"window_start": [T0], "cnt": [1]}), "'key', 'count'"),
    (rows((0, "a", 1)).iloc[0:0], "empty"),
    (rows((0, "a", -1)), "'count' must be finite and >= 0: key 'a'"),
    (rows((0, "a", 1, float("nan"))), "'cost' must be finite"),
    (rows((0, "a", 1, 1.0, -5)), "'state_bytes' must be finite"),
    (rows((0, "a", 1)).assign(count=["x"]), "'count' must be finite"),
    (rows((0, "a", 1)).assign(key=[None]), "without a key"),
    (rows((0, "a", 1)).assign(window_start=[None]), "without a window_start"),
])
def test_bad_histograms(frame, match):
    with pytest.raises(InputError, match=match):
        problem_from_histograms(frame, 2)


@pytest.mark.parametrize("assign, match", [
    (pd.DataFrame({"key": ["a"]}), "'instance'"),
    (pd.DataFrame({"key": ["a", "a"], "instance": [0, 1]}), "more than once.*'a'"),
    (pd.DataFrame({"key": ["a"], "instance": [2]}), r"outside the integers \[0, 2\)"),
    (pd.DataFrame({"key": ["a"], "instance": [-1]}), "outside"),
    (pd.DataFrame({"key": ["a"], "instance": [0.5]}), "outside"),
    (pd.DataFrame({"key": ["a"], "instance": [None]}), "outside"),
])
def test_bad_assignment(assign, match):
    with pytest.raises(InputError, match=match):
        problem_from_histograms(rows((0, "a", 1)), 2, assignment=assign)


def test_bad_parameters():
    with pytest.raises(PlanningError, match="instances"):
        problem_from_histograms(rows((0, "a", 1)), 0)
    with pytest.raises(PlanningError, match="windows"):
        problem_from_histograms(rows((0, "a", 1)), 2, windows=0)


def test_row_order_does_not_matter():
    f = rows(*[(w, f"k{i}", (i * 7 + w) % 11, None, i) for w in range(3) for i in range(30)])
    p1 = problem_from_histograms(f, 3, windows=2)
    p2 = problem_from_histograms(f.sample(frac=1, random_state=1), 3, windows=2)
    assert p1.keys.tolist() == p2.keys.tolist()
    assert np.array_equal(p1.load, p2.load) and np.array_equal(p1.state, p2.state)


def test_readers(tmp_path):
    f = rows((0, "a", 1))
    f.to_parquet(tmp_path / "h.parquet")
    assert len(read_histograms(tmp_path / "h.parquet")) == 1
    d = tmp_path / "dir"
    d.mkdir()
    f.to_parquet(d / "part-0.parquet")
    assert len(read_histograms(d)) == 1
    f.to_csv(tmp_path / "h.csv", index=False)
    assert problem_from_histograms(read_histograms(tmp_path / "h.csv"), 2).load.tolist() == [1.0]
    pd.DataFrame({"key": ["a"], "instance": [1]}).to_csv(tmp_path / "a.csv", index=False)
    assert read_assignment(tmp_path / "a.csv")["instance"].tolist() == [1]
    with pytest.raises(InputError, match="not found"):
        read_histograms(tmp_path / "missing")
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(InputError, match="as Parquet"):
        read_histograms(tmp_path / "junk.parquet")


# ------------------------------------------------------------- scale: columns, order, limits
import pyarrow as pa  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from rebalance.core.histogram_files import read_histogram_table  # noqa: E402
from rebalance.core.histograms import MAX_TOTAL, window_matrices  # noqa: E402
from rebalance.core.key_order import sorted_keys, string_order  # noqa: E402
from rebalance.core.model import MAX_INSTANCES  # noqa: E402

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30)


@settings(max_examples=120, deadline=None, derandomize=True)
@given(st.lists(st.one_of(TEXT, st.sampled_from(["a", "a\x00", "a\x00\x00", "ab", "abcdefgh",
                                                 "abcdefgh\x00", "abcdefghi", "é", ""])),
                max_size=80))
def test_string_order_is_code_point_order_and_groups_equal_keys(keys):
    order = string_order(pa.array(keys, pa.string()))
    assert [keys[i] for i in order] == sorted(keys)
    distinct, (pos,) = sorted_keys(pa.array(keys, pa.large_string()))
    assert distinct.to_pylist() == sorted(set(keys))
    assert [distinct[int(p)].as_py() for p in pos] == keys


def test_sorted_keys_of_two_arrays_share_one_key_order():
    hist, assign = pa.array(["b", "a", "c", "a"]), pa.array(["zz", "a", "b\x00"])
    keys, (ph, pa_) = sorted_keys(hist, assign)
    assert keys.to_pylist() == ["a", "b", "b\x00", "c", "zz"]
    assert ph.tolist() == [1, 0, 3, 0] and pa_.tolist() == [4, 0, 2]


def test_arrow_and_pandas_input_give_the_same_problem():
    f = rows(*[(w, f"k{i}", (i * 7 + w) % 11 + 1, None, 10 * i + w) for w in range(3)
               for i in range(40)])
    assign = pd.DataFrame({"key": ["k3", "new"], "instance": [1, 2]})
    p1, s1 = build_problem(f, 3, assign, windows=2)
    p2, s2 = build_problem(pa.Table.from_pandas(f, preserve_index=False), 3,
                           pa.Table.from_pandas(assign, preserve_index=False), windows=2)
    assert p1.keys.tolist() == p2.keys.tolist() and s1 == s2
    for name in ("load", "state", "current", "default", "key_group", "load_series"):
        assert np.array_equal(getattr(p1, name), getattr(p2, name)), name


def test_csv_windows_are_parsed_once_per_distinct_value(tmp_path):
    f = rows((0, "a", 1), (1, "b", 2), (1, "a", 3))
    f.to_csv(tmp_path / "h.csv", index=False)
    table = read_histogram_table(tmp_path / "h.csv")
    p, s = build_problem(table, 2, windows=2)
    assert p.keys.tolist() == ["a", "b"] and p.load.tolist() == [2.0, 1.0]
    assert s["windows"] == ["2024-01-01T00:00:00+00:00", "2024-01-01T00:01:00+00:00"]
    # ISO text, other offsets, naive times: all UTC
    text = pd.DataFrame({"window_start": ["2024-01-01T01:00:00+01:00", "2024-01-01 00:00:00"],
                         "key": ["x", "y"], "count": [1, 2]})
    assert build_problem(text, 2)[1]["windows_available"] == 1


def test_totals_above_2_to_the_53_are_refused():
    with pytest.raises(InputError, match=r"'cost' sums to .*2\^53"):
        problem_from_histograms(rows((0, "a", 1, 1e308), (0, "b", 1, 1e308)), 2)
    with pytest.raises(InputError, match=r"'count' sums to"):
        problem_from_histograms(rows((0, "a", 2 ** 62), (0, "b", 2 ** 62)), 2)
    # up to the limit: accepted
    p = problem_from_histograms(rows((0, "a", 1, MAX_TOTAL / 2), (0, "b", 1, MAX_TOTAL / 2)), 2)
    assert float(p.load.sum()) == MAX_TOTAL


def test_instances_above_the_key_groups_are_refused():
    with pytest.raises(InputError, match=f"<= {MAX_INSTANCES}"):
        problem_from_histograms(rows((0, "a", 1)), MAX_INSTANCES + 1)
    assert problem_from_histograms(rows((0, "a", 1)), MAX_INSTANCES).n_instances == MAX_INSTANCES


def test_window_matrices_equal_one_problem_per_window():
    f = rows(*[(w, f"k{i}", (i + 3 * w) % 7, None, i * (w + 1)) for w in range(3)
               for i in range(25) if (i + w) % 4])
    m = window_matrices(f, 4)
    for t, w in enumerate(sorted(f["window_start"].unique())):
        p = problem_from_histograms(f[f["window_start"] == w], 4)
        pos = np.searchsorted(m["keys"].astype(str), p.keys.astype(str))
        assert np.array_equal(m["load"][t, pos], p.load)
        assert np.array_equal(m["state"][t, pos], p.state)
        assert np.array_equal(m["default"][pos], p.default)


def test_refusals_print_no_library_warning(recwarn):
    with pytest.raises(InputError, match="not a timestamp"):
        problem_from_histograms(rows((0, "a", 1)).assign(window_start=["yesterday noon"]), 2)
    with pytest.raises(InputError, match="must be finite"):
        problem_from_histograms(rows((0, "a", 1)).assign(count=[float("inf")]), 2)
    assert not [w for w in recwarn if not issubclass(w.category, DeprecationWarning)]
