"""The service as its users run it: ``make up``'s processes, the real scheduler, the UI.

The session's service stack (:func:`service_helpers.service`, shared with
``test_service_faults.py``): ``rebalance.ops.service.Service``, exactly what ``make up
REGISTRY=examples/one_job.toml`` starts (Spark Connect, Airflow's api-server, scheduler,
dag-processor and triggerer on LocalExecutor/SQLite, the keyed job and the live
generator; the shipped registry's second job is ``test_service_sessions.py``'s) on a
temporary Airflow home, data folder and free ports, with test-sized time constants (5-s
windows, a 30-s schedule).
The tests then use it as a person does:

* the real scheduler runs ``rebalance`` on its schedule and a plan is applied and
  verified with no one touching anything;
* anonymous requests to the Rebalance view are refused; every process listens on
  127.0.0.1 only;
* a scheduler that dies is started again by its keepalive;
* ``rebalance trigger`` runs a what-if plan through the REST API and says why a run
  skipped;
* in a real headless Chromium (Debian's package, driven by Playwright): start a backfill
  from the UI and see its what-if plans; log in, trigger ``rebalance`` from the Trigger
  form with non-default params, approve on the Required actions page, see the run succeed
  and the plan on the Rebalance tab with its chart and moved keys.

Each test puts the stack in the state it needs (:func:`service_helpers.scheduled` or
:func:`service_helpers.quiet`, the default placement) and triggers its own runs, so any
one runs alone with ``-k``. The stack starts with no schedule; the tests on the schedule
come first (the schedule starts once the job keeps up with its input), then those with
none: in a whole run the stack switches twice (each switch re-parses the DAG, about
25 s). At the session's end ``down`` must leave no process of the service behind.
Screenshots are saved under ``$REBALANCE_TEST_SHOTS`` (default ``.data/test-shots``).
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from service_helpers import quiet, scheduled, service  # noqa: F401 - fixtures
from ui_flows import CHROMIUM_ARGS, UI, chromium_path

from rebalance.ops.airflow_client import AirflowClient

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("REBALANCE_TEST_SHOTS", REPO / ".data" / "test-shots"))
#: From the stack being up on the 30-s schedule (or the switch to it) to a scheduled plan
#: applied and verified: about a minute on a quiet machine. (The schedule starts once the
#: job keeps up with its input: on a machine twice as slow, 2026-12-02, a job warming up
#: beside the Connect server and the skipping runs lagged by minutes, and the first plan
#: came 11.5 min after the stack's start.)
SCHEDULED_PLAN_TIMEOUT = 10 * 60


class Api(AirflowClient):
    """Airflow's REST API and the Rebalance JSON, as the admin user."""

    def __init__(self, svc) -> None:
        self.user, self.password = svc.login()
        super().__init__(svc.s.api_url, self.user, self.password)

    def failure_report(self, dag_id: str, run_id: str) -> str:
        """States of the run's tasks and the last lines of each failed task's log."""
        lines = []
        for task_id, ti in self.task_instances(dag_id, run_id).items():
            lines.append(f"{task_id}: {ti['state']}")
            if ti["state"] in ("failed", "up_for_retry"):
                log = self.task_log(dag_id, run_id, task_id, max(ti["try_number"], 1))
                events = [str(e.get("event")) + " "
                          + str([d.get("exc_value") for d in e.get("error_detail") or []])
                          for e in log or [] if isinstance(e, dict)]
                lines += ["    " + e[:300] for e in events[-12:]]
        return "\n".join(lines)

    def wait_for(self, what: str, check, timeout: float, every: float = 5.0):
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            last = check()
            if last:
                return last
            time.sleep(every)
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last}")


@pytest.fixture(scope="module")
def api(service):
    return Api(service)


def _status(url: str, headers: dict | None = None) -> tuple[int, str]:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=30) as resp:
            return resp.status, ""
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("location", "")


def test_anonymous_requests_to_the_rebalance_view_are_refused(service):
    base = service.s.api_url
    for path in ("/rebalance/api/plans", "/rebalance/api/plans/x", "/rebalance/api/loads"):
        assert _status(base + path)[0] == 401, path
    code, location = _status(base + "/rebalance/", {"Accept": "text/html"})
    assert code in (302, 307) and "login" in location
    forged = {"Authorization": "Bearer not-a-token"}
    assert _status(base + "/rebalance/api/plans", forged)[0] in (401, 403)


def _listening(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every TCP socket in LISTEN state held by ``pids``."""
    inodes: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:
                out.append((inodes[fields[9]], fields[1]))
    return out


def test_every_process_of_the_service_listens_on_loopback_only(service):
    from rebalance.ops.processes import descendants as _children

    pids = set()
    for rec in service.records().values():
        pids |= {rec.pid, *_children(rec.pid)}
    loopback = ("0100007F:", "00000000000000000000000001000000:",
                "0000000000000000FFFF00000100007F:")
    sockets = _listening(pids)
    assert sockets, "no listening socket found: the check would prove nothing"
    exposed = [(pid, addr) for pid, addr in sockets if not addr.startswith(loopback)]
    assert not exposed, f"listening beyond 127.0.0.1: {exposed}"


def test_every_spark_jvm_of_the_service_maps_the_class_data_archive(service):
    from class_data_checks import jvms, unmapped

    from rebalance.ops.processes import descendants as _children

    pids = set()
    for rec in service.records().values():
        pids |= {rec.pid, *_children(rec.pid)}
    mains = list(jvms(pids).values())
    # The Spark Connect server, and the keyed job's driver (its Python starts it).
    assert mains.count("org.apache.spark.deploy.SparkSubmit") >= 2, mains
    assert unmapped(pids) == {}


def test_the_scheduler_applies_and_verifies_a_plan_on_its_own(scheduled, api):
    """No trigger: the real scheduler runs the DAG every 30 s on the live stream, finds the
    default placement imbalanced, and a plan is applied and verified with the default
    verification tolerance."""
    since = scheduled.scheduled_since

    def verified():
        done = [p for p in api.plans()
                if p["run_type"] == "scheduled" and p["status"] in ("verified", "diverged")
                and dt.datetime.fromisoformat(p["created_at"]).timestamp() >= since - 1]
        return done[-1] if done else None  # the first one (the list is newest first)

    plan = api.wait_for("a scheduled plan applied and verified", verified,
                        SCHEDULED_PLAN_TIMEOUT - (time.time() - since))
    took = time.time() - since
    scheduled.figures["first_scheduled_plan_seconds"] = round(took, 1)
    print(f"scheduled plan {plan['plan_id']} {plan['status']} {took:.0f} s after the schedule "
          f"began: imbalance {plan['imbalance_before']:.3f} -> predicted "
          f"{plan['predicted_imbalance']:.3f} -> realised {plan['realised_imbalance']:.3f}")
    assert plan["status"] == "verified", plan
    assert plan["assignment_version"] is not None and plan["moved_keys"] > 0
    assert plan["realised_imbalance"] < plan["imbalance_before"]
    # `make status`: the newest run, its state, and what it did or why it skipped
    from rebalance.ops.health import service_lines

    health = dict(service_lines(scheduled, scheduled.status(), "rebalance"))
    print("make status, health strip:", health, flush=True)
    assert re.match(r"(scheduled|manual)__\S+: (success|running|queued|failed)",
                    health["last run"]), health
    if health["last run"].split(": ")[1].startswith("success"):
        assert ("a plan was applied" in health["last run"]
                or "; skipped at " in health["last run"]), health


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        pytest.skip("no Chromium on this machine (apt-get install chromium): browser tests skipped")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture()
def ui(browser, service, api):
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.set_default_timeout(60_000)
    ui = UI(page, service.s.api_url, SHOTS)
    ui.login(api.user, api.password)
    yield ui
    page.close()


def test_a_backfill_started_in_the_ui_stores_what_if_plans(scheduled, ui, api):
    """Replan the 30-s intervals from two minutes to one minute ago (each already ran on
    schedule: the backfill reprocesses them, with force), as what-if plans that change
    nothing live (the scheduled runs may publish meanwhile, as they do when this test runs
    alone on a fresh stack). Backfill runs have their own limit of active runs: they run
    beside the scheduled ones. The form takes minutes and its range is inclusive: it ends a minute
    before the current one, so that no backfill run takes the interval that starts at the
    current minute while the scheduler creates its run (a run of one interval claimed by
    both lost its task instances once, and Airflow answered the backfill's creation 503)."""
    def two_minutes_of_windows():
        windows = scheduled.windows_stored()
        now = dt.datetime.now(dt.timezone.utc).replace(second=0, microsecond=0)
        end = now - dt.timedelta(minutes=1)
        return windows and windows[0] <= end - dt.timedelta(minutes=1) and end
    end = api.wait_for("two whole minutes of histogram windows", two_minutes_of_windows, 240,
                       every=5)
    start = end - dt.timedelta(minutes=1)
    scheduled.wait_windows_until(end + dt.timedelta(seconds=30))
    dialog = ui.open_backfill("rebalance")
    try:
        ui.set_backfill_range(dialog, start, end)
    except Exception as exc:
        ui.shot("05-backfill-form-failed")  # what the dialog said, for the report
        raise AssertionError(f"backfill form [{start} .. {end}]: {dialog.inner_text()[-600:]}") from exc
    ui.set_checkbox(dialog, "force", True)
    ui.shot("05-backfill-form")
    ui.submit_backfill(dialog)

    def what_if():
        # a backfill run's plan passes through proposed and validated before publish stores
        # it as what-if: wait until every plan found has reached a terminal status
        plans = [p for p in api.plans() if p["run_type"] == "backfill"
                 and dt.datetime.fromisoformat(p["data_interval_start"]) >= start]
        settled = plans and all(p["status"] not in ("proposed", "validated") for p in plans)
        return plans if settled else None
    plans = api.wait_for("what-if plans of the backfill", what_if, 600, every=10)
    assert all(p["status"] == "what-if" and p["assignment_version"] is None for p in plans), plans
    # (a reprocessed run keeps its run id: match the plans, not the runs)
    backfill = {p["plan_id"] for p in plans}
    published = api.get("/rebalance/api/assignments")
    assert not [v for v in published if v["plan_id"] in backfill], published
    ui.page.goto(f"{ui.base}/rebalance/")
    ui.page.locator("#plans").get_by_text("what-if").first.wait_for(timeout=120_000)
    ui.shot("06-what-if-plans")
    strip = ui.page.locator("#health").inner_text()     # the health strip, at the top
    assert re.search(r"dag active \(unpaused\).*job newest window \S+ \S+ UTC, closed .*"
                     r"last run \S+__", strip), strip


def test_up_unpauses_a_dag_registered_paused_earlier(quiet, api):
    """``airflow dags test`` (or a person in the UI) leaves a DAG paused and Airflow keeps
    the flag; ``make up`` afterwards must unpause every DAG of the service, or nothing is
    scheduled and a triggered run (a rollback) only queues. Here all four are paused, then
    ``up`` runs again over the running stack (every component is already up) and unpauses
    them."""
    from rebalance.ops.health import service_lines

    path = "/api/v2/dags/rebalance"
    # a window the job wrote (a fresh stack has none for its first seconds)
    quiet.wait_windows_until(dt.datetime.fromtimestamp(5 * (time.time() // 5),
                                                       dt.timezone.utc))
    api.call("PATCH", path, {"is_paused": True})
    assert api.get(path)["is_paused"] is True
    others = [f"/api/v2/dags/{d}" for d in quiet.s.dag_ids if d != "rebalance"]
    for other in others:       # the daily maintenance, and the two that run when triggered
        api.call("PATCH", other, {"is_paused": True})
    # `make status` says so (the health strip), and that the job writes windows
    health = dict(service_lines(quiet, quiet.status(), "rebalance"))
    assert health["dag"].startswith("PAUSED: nothing is scheduled"), health
    assert api.get("/rebalance/api/health")["dag"].startswith("PAUSED")   # and the view
    assert re.match(r"running; newest window \S+ \S+ UTC, closed \d+ (s|min) ago",
                    health["job"]), health
    lines: list[str] = []
    out, quiet.out = quiet.out, lines.append
    try:
        assert quiet.up() == []  # nothing new started
    finally:
        quiet.out = out
    assert [api.get(p)["is_paused"] for p in [path, *others]] == [False] * 4
    assert sum("unpaused" in line for line in lines) == 4, lines
    assert dict(service_lines(quiet, quiet.status(), "rebalance"))["dag"] == "active (unpaused)"


def test_a_scheduler_that_dies_is_started_again_by_its_keepalive(quiet, api):
    """Airflow's scheduler exits when its loop raises (a backfill racing a scheduled run
    did it here); ``kill -9`` of the scheduler process alone stands in for that: its
    keepalive (the recorded process) starts it again, and it heartbeats. The tests after
    this one run on the restarted scheduler."""
    import signal

    import psutil

    from rebalance.ops.service import alive

    rec = quiet.records()["scheduler"]
    first = psutil.Process(rec.pid).children()
    assert len(first) == 1, first          # the wrapper runs one scheduler
    killed = dt.datetime.now(dt.timezone.utc)
    os.kill(first[0].pid, signal.SIGKILL)

    def restarted():
        children = [c for c in psutil.Process(rec.pid).children() if c.pid != first[0].pid]
        return children and children[0].pid
    api.wait_for("the keepalive to start the scheduler again", restarted, 60, every=1)
    assert alive(rec), "the keepalive exited with its scheduler"

    def heartbeat():
        beat = api.get("/api/v2/monitor/health")["scheduler"]
        at = beat.get("latest_scheduler_heartbeat")
        return (beat.get("status") == "healthy" and at
                and dt.datetime.fromisoformat(at.replace("Z", "+00:00")) > killed and beat)
    api.wait_for("a heartbeat of the new scheduler", heartbeat, 180, every=2)
    log = Path(rec.log).read_text()
    assert "keepalive: scheduler exited with code -9" in log, log[-2000:]


def test_rebalance_trigger_runs_a_what_if_plan_through_the_rest_api(quiet):
    """The command-line twin of the UI's trigger form, against the real api-server and
    scheduler: params set on the command line reach the run, which stores a what-if plan
    (``apply_mode=dry-run`` changes no assignment); a run that skips prints the reason; a
    wrong password is one line, exit 2."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("rebalance")
    service = quiet
    env = {**os.environ, "AIRFLOW_HOME": str(service.s.airflow_home),
           "REBALANCE_API_PORT": str(service.s.api_port),
           "REBALANCE_REGISTRY": str(service.s.registry.path)}
    env.pop("REBALANCE_AIRFLOW_PASSWORD", None)
    cmd = [str(exe), "trigger", "--set", "force=true", "--set", "apply_mode=dry-run",
           "--set", "method=greedy", "--wait", "--timeout", "900"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1000)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, (done.stdout, done.stderr)
    run_id = done.stdout.split(" run ", 1)[1].split()[0]
    assert f"run {run_id}: success" in done.stdout
    plan_line = next(line for line in done.stdout.splitlines() if line.startswith("plan "))
    assert ": what-if," in plan_line, plan_line
    api = Api(service)
    conf = api.run("rebalance", run_id)["conf"]
    assert (conf["force"], conf["apply_mode"], conf["method"]) == (True, "dry-run", "greedy")
    plan = next(p for p in api.plans() if p["run_id"] == run_id)
    assert plan["status"] == "what-if" and plan["assignment_version"] is None, plan

    # A run that skips says why, from the skipped task's own log.
    skip = subprocess.run([*cmd[:2], "--set", "min_events=1000000000000", "--wait",
                           "--timeout", "900"], env=env, capture_output=True, text=True,
                          timeout=1000)
    print(skip.stdout, skip.stderr)
    assert skip.returncode == 0, (skip.stdout, skip.stderr)
    assert "no plan stored by this run\n" in skip.stdout, skip.stdout
    windows = next(line for line in skip.stdout.splitlines() if line.startswith("  windows "))
    assert "skipped: too few events: " in windows and "1000000000000 required" in windows, windows

    refused = subprocess.run([*cmd[:2], "--password", "wrong"], env=env, capture_output=True,
                             text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert refused.stderr.startswith("rebalance trigger: error: POST /auth/token: HTTP 401"), \
        refused.stderr
    assert refused.stderr.count("\n") == 1, refused.stderr


def test_a_person_triggers_approves_and_reads_the_plan_in_the_ui(quiet, ui, api):
    """On the default placement (the generator's skew), so the plan moves keys and its
    page lists them; verified with the default verification tolerance."""
    quiet.restore_default_placement()
    dialog = ui.open_trigger("rebalance")
    ui.set_select(dialog, "method", "milp")
    ui.set_number(dialog, "theta", 0.15)
    ui.set_checkbox(dialog, "require_approval", True)
    # force: the rollback to the default placement just went live (the trigger rules'
    # cooldown would skip the run)
    ui.set_checkbox(dialog, "force", True)
    ui.shot("01-trigger-form")
    ui.submit_trigger(dialog)
    ui.page.wait_for_url("**/runs/manual__*")
    run_id = ui.page.url.rsplit("/runs/", 1)[1].split("/")[0]
    from urllib.parse import unquote

    run_id = unquote(run_id)
    conf = api.run("rebalance", run_id)["conf"]
    assert (conf["method"], conf["theta"], conf["require_approval"]) == ("milp", 0.15, True)

    def awaiting():
        states = {t: ti["state"] for t, ti in api.task_instances("rebalance", run_id).items()}
        assert states.get("windows") not in ("failed", "skipped"), states
        assert states.get("plan") not in ("failed", "skipped"), states
        return states.get("approve") in ("deferred", "awaiting_input", "running") and states
    api.wait_for("the approval to be asked", awaiting, 300)
    # Airflow may retry the approval task right after it asked (the executor event can race
    # the deferral, seen even on a quiet machine): the new try asks again, and a person
    # answers the new request. So: answer every try that asks, until the run ends.
    answered: set[int] = set()
    deadline = time.monotonic() + 600
    state = None
    while time.monotonic() < deadline:
        state = api.run("rebalance", run_id)["state"]
        if state in ("success", "failed"):
            break
        ti = api.task_instances("rebalance", run_id)["approve"]
        asking = ti["state"] in ("deferred", "awaiting_input", "running")
        if asking and ti["try_number"] not in answered:
            ui.approve("rebalance", run_id, shot="02-required-action" if not answered
                       else f"02-required-action-{len(answered)}")
            answered.add(ti["try_number"])
        time.sleep(5)
    assert answered, "the approval was never answered"
    answer = api.hitl_detail("rebalance", run_id, "approve")
    assert answer["chosen_options"] == ["Approve"] and answer["responded_by_user"]["name"] == api.user
    assert state == "success", api.failure_report("rebalance", run_id)

    plan = next(p for p in api.plans() if p["run_id"] == run_id)
    assert plan["method"] == "milp" and plan["status"] == "verified", plan
    assert plan["moved_keys"] > 0, plan  # planned on the default placement's skew
    ui.page.goto(f"{ui.base}/dags/rebalance/plugin/rebalance-dag")
    frame = ui.page.frame_locator("iframe[title=Rebalance]")
    frame.locator("#plans").wait_for(timeout=120_000)
    frame.locator("#loads-chart").wait_for()
    ui.shot("03-rebalance-tab", full_page=False)
    frame.locator(f"a[href$='/plans/{plan['plan_id']}']").first.click()
    frame.locator("#bars-chart").wait_for(timeout=120_000)
    _assert_moved_keys_shown(frame, plan)
    assert frame.locator("#validation").get_by_text("failed").count() == 0
    assert frame.locator("#commits tr").count() >= 5
    ui.page.goto(f"{ui.base}/rebalance/plans/{plan['plan_id']}")
    ui.page.locator("#bars-chart").wait_for(timeout=120_000)
    _assert_moved_keys_shown(ui.page, plan)
    summary = ui.page.locator("#commits details summary").first
    assert "{" not in summary.inner_text()               # a commit is one line ...
    summary.click()                                       # ... its userMetadata one click away
    assert '"plan_id"' in ui.page.locator("#commits details code").first.inner_text()
    ui.shot("04-plan-page")
    ui.page.goto(f"{ui.base}/rebalance/")
    ui.page.locator("#plans").wait_for(timeout=120_000)
    _assert_readable_index(ui.page)
    ui.shot("07-rebalance-page")


def _assert_readable_index(page) -> None:
    """At 1440 px: both charts have several time ticks over the same range and name their
    units; the plans table fits the page or scrolls in its own box (nothing cut off);
    every column has a header."""
    ticks = [page.locator(f"#{chart} text.xtick").all_text_contents()   # SVG: no innerText
             for chart in ("imbalance-chart", "loads-chart")]
    assert len(ticks[0]) >= 3 and ticks[0] == ticks[1], ticks
    assert all(re.fullmatch(r"(\d\d-\d\d )?\d\d:\d\d(:\d\d)?", t) for t in ticks[0]), ticks
    title = {c: page.locator(c).text_content()
             for c in ("#imbalance-chart text.ytitle", "#loads-chart text.ytitle",
                       "#loads-chart text.xtitle")}
    assert title["#imbalance-chart text.ytitle"] == "imbalance (max / mean load)", title
    assert title["#loads-chart text.ytitle"].startswith("load per "), title
    assert title["#loads-chart text.xtitle"].startswith("window start, UTC, "), title
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], width                    # the page itself never scrolls sideways
    box = page.evaluate("""() => { const t = document.querySelector('#plans');
        const b = t.parentElement; return [t.scrollWidth, b.clientWidth,
        getComputedStyle(b).overflowX]; }""")
    assert box[0] <= box[1] or box[2] == "auto", box
    for table in ("plans", "versions"):
        headers = page.locator(f"#{table} th").all_inner_texts()
        assert all(h.strip() for h in headers), (table, headers)


def _assert_moved_keys_shown(page, plan: dict) -> None:
    """The plan page's moved-keys section: a heading with the count, then one row per key
    (after the header row), or "none" when the plan moves nothing."""
    n = plan["moved_keys"]
    assert page.get_by_role("heading", name=f"Moved keys ({n})").count() == 1
    if n:
        assert page.locator("table#moved tr").count() == n + 1
    else:
        assert page.locator("p#moved").inner_text() == "none"
