"""The Rebalance view's pages (rebalance.ui.pages: Jinja2 templates, autoescaped) from
fixed data: every section a person and the browser tests look for is there, every value
from the data is escaped, empty states say so. The pages served by the real api-server,
in Chromium, are in tests/integration/test_service.py."""

from __future__ import annotations

import re

from rebalance.ui import pages

W = [f"2026-11-28T12:0{i}:00+00:00" for i in range(6)]
loads = {"windows": W, "instances": [0, 1, 2, 3],
         "loads": [[10.0 + i, 5.0, 0.0, 7.5 - i] for i in range(6)],
         "imbalance": [1.8, 1.7, None, 1.6, 1.5, 1.1], "versions": [1, 1, 2, 2, 2, 3]}
realised = {"windows": W, "imbalance": [1.8, 1.7, None, 1.6, 1.5, 1.1], "versions": [1, 1, 2, 2, 2, 3],
            "theta": [0.1, 0.1, 0.15, 0.15, 0.15, 0.1], "default_theta": 0.1,
            "checks": [{"plan_id": "p<1>", "status": "verified", "realised": 1.05, "window": W[3],
                        "theta": 0.1, "limit": 1.12},
                       {"plan_id": "p2", "status": "diverged", "realised": 1.4, "window": W[5],
                        "theta": 0.1, "limit": 1.12}]}
row = {"plan_id": "abc<&>\"'", "status": "verified", "method": "mixed", "run_type": "manual",
       "dag_id": "rebalance", "run_id": "manual__2026-11-28T12:00:00+00:00", "apply_mode": "broadcast",
       "created_at": "2026-11-28T12:00:00+00:00", "updated_at": "2026-11-28T12:01:00+00:00",
       "data_interval_start": "2026-11-28T11:59:00+00:00", "data_interval_end": "2026-11-28T12:00:00+00:00",
       "imbalance_before": 1.8, "predicted_imbalance": 1.05, "backtested_imbalance": 1.07,
       "staying_imbalance": 1.7, "realised_imbalance": 1.06, "theta": 0.1, "theta_plan": 0.05,
       "load_model": "ewm:alpha=0.5", "backtest": {"planned": 1.07, "staying": 1.7, "k": "<b>"},
       "migration_fraction": 0.123, "migration_bytes": 123456.0, "moved_keys": 3, "table_size": 5,
       "lower_bound_migration_fraction": 0.05, "lower_bound_migration_bytes": 100.0,
       "base_assignment_version": 2, "assignment_version": 3, "reasons": ["forced <x>", "b & c"]}
row2 = dict(row, plan_id="p2", status="what-if", assignment_version=None, realised_imbalance=None,
            run_id="backfill__x", run_type="backfill", dag_id="rebalance-cli", theta=None,
            migration_fraction=None, load_model=None, reasons=[])
history = [row, row2]
versions = [{"version": 3, "timestamp": "2026-11-28T12:01:00+00:00", "live": True, "action": "apply",
             "plan_id": "abc<&>\"'", "run_id": "manual__1", "method": "mixed", "apply_mode": "broadcast",
             "routing_keys": 5, "n_instances": 4},
            {"version": 2, "timestamp": "2026-11-28T11:01:00+00:00", "live": False, "action": "rollback",
             "plan_id": None, "run_id": None, "method": None, "apply_mode": None,
             "routing_keys": None, "n_instances": 4}]
plan = {**row, "params": {"theta": 0.1}, "inputs": {"n_instances": 4}, "windows": W[:2],
        "metrics": {}, "instance_loads": {"instance": [0, 1, 2, 3], "before": [10.0, 5.0, 0.0, 7.5],
                                          "after": [6.0, 6.0, 5.0, 5.5]},
        "moved": [{"key": "k<1>", "from": 0, "to": 2, "load": 4.0, "state_bytes": 400.0},
                  {"key": "k2", "from": 3, "to": 2, "load": 1.0, "state_bytes": 100.0}],
        "split": [{"key": "hot&", "instances": [0, 1], "shares": [0.5, 0.5]}],
        "validation": {"evaluated_expectations": 2, "unsuccessful_expectations": 1,
                       "expectations": [{"suite": "s", "expectation": "expect_<x>", "kwargs": {"a": "<b>"},
                                         "success": True, "seen": None},
                                        {"suite": "s", "expectation": "e2", "kwargs": {},
                                         "success": False, "seen": {"v": "<i>"}}]},
        "verification": {"applied_at": "2026-11-28T12:01:00+00:00", "realised": 1.06, "note": "<n>"},
        "commits": [{"table": "plans", "version": 4, "timestamp": "2026-11-28T12:00:00+00:00",
                     "operation": "WRITE", "action": "propose",
                     "userMetadata": {"plan_id": "abc<&>", "z": 1}}]}
plan_none = {**plan, "moved": [], "split": [], "validation": None, "verification": None, "commits": [],
             "assignment_version": None, "reasons": []}

HEALTH = {"dag": "active (unpaused)", "job": "running; <newest>", "last run": "PAUSED x"}
HOSTILE = ["<x>", "<&>", "<newest>", "<i>", "<n>", "k<1>", "expect_<x>", "manual__<x>", "p<1>"]


def _ids(page: str) -> set[str]:
    return set(re.findall(r'id="([^"]+)"', page)) | set(re.findall(r"id='([^']+)'", page))


def test_the_index_has_its_sections_and_escapes_what_it_shows():
    page = pages.render_index(loads, realised, history, versions, HEALTH,
                              triggered="manual__<x>")
    assert {"health", "imbalance-chart", "loads-chart", "plans", "versions", "bound"} <= _ids(page)
    assert not [t for t in HOSTILE if t in page]
    assert "running; &lt;newest&gt;" in page and 'class="bad"><b>last run</b> PAUSED x' in page
    assert page.count("<tr>") == 1 + len(history) + 1 + len(versions)
    assert "roll back to v2" in page and "<b>live</b>" in page           # the one not live
    assert '/dags/rebalance_rollback/runs/manual__%3Cx%3E' in page        # the rollback's run
    assert "1 of 5 window(s) within 1 + theta" in page             # 1.1 <= 1 + 0.1
    assert "<b>v3</b> (4 instances, 5 keys in the routing table)" in page
    error = pages.render_index(loads, realised, history, versions, HEALTH, error="refused <x>")
    assert '<p class="bad">refused &lt;x&gt;</p>' in error


def test_an_empty_index_says_what_is_missing():
    empty_loads = {"windows": [], "instances": [], "loads": [], "imbalance": [], "versions": []}
    empty = {**realised, "windows": [], "imbalance": [], "versions": [], "theta": [], "checks": []}
    page = pages.render_index(empty_loads, empty, [], [], HEALTH)
    assert '<p id="loads-chart">no instance histograms yet</p>' in page
    assert '<p id="imbalance-chart">no instance histograms yet</p>' in page
    assert '<p id="plans">none</p>' in page and '<p id="versions">none</p>' in page
    assert "no assignment published yet" in page


def test_a_plan_page_has_its_sections_and_escapes_what_it_shows():
    page = pages.render_plan(plan)
    assert {"imbalance", "bars-chart", "moved", "split", "validation", "verification",
            "commits"} <= _ids(page)
    assert not [t for t in HOSTILE if t in page]
    assert "<h2>Moved keys (2)</h2>" in page and page.count("<tr>") > 10
    assert "forced &lt;x&gt;<br>b &amp; c" in page                      # the reasons
    assert "0: 50.0%, 1: 50.0%" in page                                  # the split shares
    assert "2 expectations, 1 failed" in page and "v2 → v3" in page
    none = pages.render_plan(plan_none)
    assert '<p id="moved">none</p>' in none and '<p id="commits">none</p>' in none
    assert "? expectations, ? failed" in none and "v2 → not published" in none
    assert "<th>reasons</th><td>–</td>" in none


# ------------------------------------------------------------------- the parts, one by one
CHARTS = pages.ENV.get_template("charts.html").module


def _row(**over) -> dict:
    return {**row, **over}


def test_the_charts_render_loads_and_the_plans_table_escapes_and_marks():
    data = {"windows": ["2026-11-24T00:00:00", "2026-11-24T00:00:20", "2026-11-24T00:00:40"],
            "instances": [0, 1], "loads": [[10.0, 30.0], [12.0, 28.0], [20.0, 20.0]],
            "imbalance": [1.5, 1.4, 1.0], "versions": [0, 0, 1]}
    svg = str(CHARTS.loads(pages.loads_chart(data), data))
    assert svg.count("<polyline") == 2 and ">v1</text>" in svg
    assert "imbalance of the latest window 1.000" in svg
    bars = str(CHARTS.bars(pages.bars_chart({"instance": [0, 1], "before": [30.0, 10.0],
                                              "after": [20.0, 20.0]})))
    assert bars.count("<rect") == 4 and "mean" in bars
    page = pages.render_index(loads, realised, [_row(
        plan_id="<script>", method="milp", created_at=None, imbalance_before=1.7,
        predicted_imbalance=1.05, backtested_imbalance=1.08, realised_imbalance=1.15,
        theta=0.1, theta_plan=0.05, migration_fraction=0.01, moved_keys=2, table_size=2,
        lower_bound_migration_fraction=0.005, assignment_version=3, run_id="manual__x")],
        versions, HEALTH)
    table = page.split('<table id="plans">')[1].split("</table>")[0]
    assert "<script>" not in table and "&lt;script&gt;" in table
    assert 'href="/dags/rebalance/runs/manual__x"' in table
    # realised above 1 + theta is marked; backtested, theta and theta_plan are shown
    assert '<span class="bad">1.150</span>' in table
    assert "<td>1.080</td>" in table and "<td>0.1</td><td>0.05</td>" in table


def test_the_ratio_chart_plots_each_window_against_one_plus_theta():
    data = {"windows": ["2026-11-24T00:00:00", "2026-11-24T00:00:20", "2026-11-24T00:00:40",
                        "2026-11-24T00:01:00"],
            "imbalance": [1.5, 1.4, 1.04, None], "versions": [0, 0, 1, 1],
            "theta": [0.1, 0.1, 0.05, 0.05], "default_theta": 0.1,
            "checks": [{"plan_id": "p<1>", "status": "verified", "realised": 1.04,
                        "window": "2026-11-24T00:00:40+00:00", "theta": 0.05, "limit": 1.07},
                       {"plan_id": "elsewhere", "status": "diverged", "realised": 1.3,
                        "window": "2026-11-23T00:00:00+00:00", "theta": 0.1, "limit": 1.12}]}
    svg = str(CHARTS.ratios(pages.ratio_chart(data)))
    assert svg.count('class="over"') == 2 and svg.count('class="within"') == 1  # None: no point
    assert ">v1</text>" in svg and 'id="bound"' in svg
    # the bound steps from 1.1 to 1.05 where version 1 (theta 0.05) went live
    bound = svg.split('id="bound"')[1].split('points="')[1].split('"')[0].split()
    xy = [tuple(float(v) for v in point.split(",")) for point in bound]
    assert len(xy) == 2 * 4 - 1 and len({y for _, y in xy[:4]}) == 1       # 1.1 in windows 0-1
    assert xy[3][0] == xy[4][0] and xy[4][1] > xy[3][1]  # at window 2, down (svg y grows down)
    assert xy[4][1] == xy[6][1]
    # the verify result of the plan live in these windows is drawn, escaped; the other is not
    assert svg.count('class="check verified"') == 1 and "p&lt;1&gt;" in svg
    assert "diverged: realised" not in svg
    assert "1 of 3 window(s) within 1 + theta" in svg
    empty = {**data, "windows": [], "imbalance": [], "versions": [], "theta": [], "checks": []}
    assert str(CHARTS.ratios(pages.ratio_chart(empty))).strip().startswith(
        '<p id="imbalance-chart">')


def test_the_plan_page_shows_predicted_backtested_and_realised_beside_the_bounds():
    p = {**plan, "imbalance_before": 1.75, "predicted_imbalance": 1.04,
         "realised_imbalance": 1.118, "theta": 0.1, "theta_plan": 0.05,
         "load_model": "ewm:halflife=3",
         "backtest": {"planned": 1.06, "staying": 1.70, "windows": 6,
                      "held_out": ["a", "b"], "decision": "rebalance: <holds>",
                      "reasons": ["auto: chosen"]},
         "verification": {"tolerance": 0.02, "limit": 1.12, "realised": 1.118}}
    page = pages.render_plan(p)
    table = page.split('<table id="imbalance">')[1].split("</table>")[0]
    rows = table.split("<tr>")[2:]
    assert [r.split("</td>")[0].removeprefix("<td>").split(" (")[0] for r in rows] == [
        "before", "predicted", "backtested", "backtested staying", "realised"]
    assert "<td>1.040</td><td>1.050</td>" in rows[1]          # predicted vs 1 + theta_plan
    assert "<td>1.060</td><td>1.100</td>" in rows[2]          # backtested vs 1 + theta
    assert "<td>1.700</td>" in rows[3]
    assert '<span class="bad">1.118</span>' in rows[4]         # above 1 + theta ...
    assert "verify accepts up to 1.120 (verify_tolerance 0.02)" in rows[4]  # ... within noise
    assert "2 held-out window(s)" in rows[2]
    assert "&lt;holds&gt;" in page and "<holds>" not in page
    assert "theta 0.1 · theta_plan 0.05 · load model ewm:halflife=3" in page
    # a plan stored before backtests existed (or a rollback) shows dashes, not an error
    old = pages.render_plan({**plan, "imbalance_before": 1.5, "predicted_imbalance": 1.1,
                             "realised_imbalance": None, "theta": 0.1, "theta_plan": None,
                             "load_model": None, "backtest": {}, "verification": None})
    table = old.split('<table id="imbalance">')[1].split("</table>")[0]
    assert table.count("<td>–</td>") >= 4 and "backtest-reasons" not in old


def test_the_moved_keys_section_lists_each_key_or_says_none_and_caps_a_long_list():
    def moved(n):
        return [{"key": f"k<{i}>", "from": 0, "to": 1, "load": 1.0, "state_bytes": 10.0 * (n - i)}
                for i in range(n)]

    def section(page):
        return page.split("<h2>Moved keys")[1].split("<h2>")[0]
    none = pages.render_plan({**plan, "moved": []})
    assert "<h2>Moved keys (0)</h2>" in none and '<p id="moved">none</p>' in none
    two = section(pages.render_plan({**plan, "moved": moved(2)}))
    assert two.count("<tr>") == 3 and "k&lt;0&gt;" in two and "moved-truncated" not in two
    cap = pages.MOVED_ROWS_SHOWN
    page = pages.render_plan({**plan, "plan_id": "p 1", "moved": moved(cap + 7)})
    many = section(page)
    assert f"<h2>Moved keys ({cap + 7})</h2>" in page and many.count("<tr>") == cap + 1
    assert f"k&lt;{cap - 1}&gt;" in many and f"k&lt;{cap}&gt;" not in many
    assert f"all {cap + 7} are in the" in many and 'href="/rebalance/api/plans/p%201"' in many


# ------------------------------------------------------------ axes a person can read
def _texts(svg: str, css: str) -> list[str]:
    return re.findall(rf'<text class="{css}"[^>]*>([^<]*)</text>', svg)


def test_both_charts_have_time_ticks_units_and_the_same_time_range():
    twenty = [f"2026-12-06T10:{m:02d}:{s:02d}+00:00" for m in range(40, 60) for s in (0, 20, 40)]
    data = {"windows": twenty, "instances": [0, 1], "loads": [[100.0 + i, 50.0] for i in range(60)],
            "imbalance": [1.3] * 60, "versions": [1] * 60}
    ratios = {"windows": twenty[30:], "imbalance": [1.2] * 30, "versions": [1] * 30,
              "theta": [0.1] * 30, "default_theta": 0.1, "checks": []}
    page = pages.render_index(data, ratios, [], [], HEALTH)
    loads_svg = page.split('<svg id="loads-chart"')[1].split("</svg>")[0]
    ratio_svg = page.split('<svg id="imbalance-chart"')[1].split("</svg>")[0]
    for svg in (loads_svg, ratio_svg):       # several round HH:MM ticks, the date once
        assert _texts(svg, "xtick") == ["10:40", "10:45", "10:50", "10:55"]
        assert _texts(svg, "xtitle") == ["window start, UTC, 2026-12-06"]
        assert len(_texts(svg, "ytick")) >= 3
    assert _texts(loads_svg, "ytitle") == ["load per 20-s window"]
    assert _texts(ratio_svg, "ytitle") == ["imbalance (max / mean load)"]
    assert _texts(ratio_svg, "ytick")[0] == "1.00"
    # the ratio chart has the later half of the windows only: it starts mid-axis, at the
    # x where the loads chart has the same window
    ticks = re.findall(r'<text class="xtick" x="([0-9.]+)"', loads_svg)
    assert ticks == re.findall(r'<text class="xtick" x="([0-9.]+)"', ratio_svg)
    first_ratio_x = float(ratio_svg.split('<circle class="over" cx="')[1].split('"')[0])
    loads_points = loads_svg.split('points="')[1].split('"')[0].split()
    assert first_ratio_x == float(loads_points[30].split(",")[0])


def test_the_time_axis_names_a_new_day_and_uses_seconds_below_a_minute():
    start = pages._when("2026-12-06T23:50:00")
    axis = pages.time_axis((start, pages._when("2026-12-07T00:20:00+00:00")), 0, 600)
    labels = [t["label"] for t in axis["ticks"]]
    assert labels == ["23:50", "23:55", "12-07 00:00", "00:05", "00:10", "00:15", "00:20"]
    assert axis["title"] == "window start, UTC, 2026-12-06 to 2026-12-07"
    short = pages.time_axis((start, pages._when("2026-12-06T23:51:00")), 0, 600)
    assert [t["label"] for t in short["ticks"]][:2] == ["23:50:00", "23:50:10"]
    one = pages.time_axis((start, start), 0, 600)       # one window: in the middle
    assert one["x"](start) == 300 and [t["label"] for t in one["ticks"]] == ["23:50"]


def test_every_column_of_every_table_has_a_header():
    for page in (pages.render_index(loads, realised, history, versions, HEALTH),
                 pages.render_plan(plan)):
        for table in re.findall(r"<table[^>]*>(.*?)</table>", page, re.S):
            rows = re.findall(r"<tr>(.*?)</tr>", table, re.S)
            header = re.findall(r"<th>(.*?)</th>", rows[0], re.S)
            if "class='kv'" in table or not header:      # the key/value table: th per row
                continue
            assert all(h.strip() for h in header), header
            for r in rows[1:]:
                assert r.count("<td") == len(header), (header, r[:200])


def test_tables_scroll_in_their_own_box_and_commits_are_one_line_each():
    page = pages.render_index(loads, realised, history, versions, HEALTH)
    assert '<div class="scroll"><table id="plans">' in page
    assert '<div class="scroll"><table id="versions">' in page
    meta = {"action": "apply", "plan_id": "abc", "status": "applied", "method": "mixed",
            "apply_mode": "broadcast", "run_id": "scheduled__x", "dag_id": "rebalance",
            "base_assignment_version": 2, "assignment_version": 3,
            "metrics": {"imbalance_before": 1.6, "imbalance_after": 1.05, "moved_keys": 12}}
    assert pages.commit_summary(meta) == ("applied · mixed · broadcast · v2 → v3 · imbalance "
                                          "1.600 → 1.050 · 12 keys moved · run scheduled__x")
    p = pages.render_plan({**plan, "commits": [{**plan["commits"][0], "userMetadata": meta}]})
    commits = p.split('<table id="commits">')[1].split("</table>")[0]
    summary = commits.split("<summary>")[1].split("</summary>")[0]
    assert summary == pages.commit_summary(meta) and "{" not in summary
    assert '<details class="meta">' in commits and "&#34;moved_keys&#34;: 12" in commits


def test_an_unreachable_theta_shows_the_theta_that_holds_beside_it():
    out = {**row, "theta": 0.05, "attainable_theta": 0.7,
           "backtest": {"planned": 1.4, "staying": 1.5, "attainable_theta": 0.7}}
    index = pages.render_index(loads, realised, [out, dict(row, attainable_theta=0.1)],
                               versions, HEALTH)
    table = index.split('<table id="plans">')[1].split("</table>")[0]
    assert table.count("holds 0.7") == 1 and "holds 0.1" not in table
    plan_page = pages.render_plan({**plan, **out})
    assert ("theta 0.05 is out of reach on the run's windows: the smallest theta plans "
            "keep there is 0.7") in plan_page
    kept = pages.render_plan({**plan, "backtest": {"attainable_theta": 0.1}, "theta": 0.1})
    assert "plans keep theta on the run" in kept and "out of reach" not in kept
    assert 'id="attainable"' not in pages.render_plan({**plan, "backtest": {}})


def test_a_jobs_page_row_per_job_and_each_jobs_page_links_within_its_job():
    rows = [{"job": "keyed", "dag_id": "rebalance", "theta": 0.1, "dag": "active (unpaused)",
             "window": "newest window ...",
             "last_run": "scheduled__x: success; skipped at plan: balanced: 1.05 <= 1.1",
             "skipped": {"plan": "balanced: 1.05 <= 1.1"},
             "imbalance": 1.25, "plan": {"plan_id": "abc123", "status": "verified"}},
            {"job": "click<s>", "dag_id": "rebalance_clicks", "theta": 0.2,
             "dag": "PAUSED: nothing is scheduled", "window": "no window written yet",
             "last_run": "none yet", "skipped": {}, "imbalance": None, "plan": None}]
    page = pages.render_jobs(rows)
    # the last run says why it skipped, in the run's cell (escaped)
    assert '<td class="run">scheduled__x: success; skipped at plan: balanced: 1.05 &lt;= 1.1</td>' in page
    assert 'href="/rebalance/?job=keyed"' in page and 'href="/rebalance/?job=click%3Cs%3E"' in page
    assert "click&lt;s&gt;" in page and "click<s>" not in page
    assert 'href="/rebalance/plans/abc123?job=keyed"' in page and "none yet" in page
    assert '<span class="bad">1.250</span>' in page          # above 1 + theta = 1.1
    assert '<td class="bad">PAUSED' in page and ">1.200<" in page
    # a job's own page: its DAG, and every link of it keeps the job
    index = pages.render_index(loads, realised, history, versions, HEALTH, job="clicks",
                               dag_id="rebalance_clicks")
    assert "<h1>Rebalance: job clicks</h1>" in index and 'href="/dags/rebalance_clicks"' in index
    plan_links = re.findall(r'href="/rebalance/plans/[^"]*"', index)
    assert plan_links and all(link.endswith('?job=clicks"') for link in plan_links)
    assert '<input type="hidden" name="job" value="clicks">' in index
    assert 'href="/rebalance/?job=clicks"' in pages.render_plan(plan, job="clicks")
    # asked without a job (the first job's page): links as before
    plain = pages.render_index(loads, realised, history, versions, HEALTH)
    assert "?job=" not in plain and 'name="job"' not in plain
