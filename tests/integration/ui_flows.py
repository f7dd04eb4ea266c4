"""What a person does in the Airflow UI, as Playwright steps (used by ``test_service.py``).

Each step drives the real page (Debian's Chromium through Playwright) the way a person
does: the login form, the Trigger dialog with its Params form, the Required actions page,
the Rebalance tab. Screenshots go to ``shots`` for a person to look at.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]


def chromium_path() -> str | None:
    """Debian's Chromium (Playwright cannot download its own browser here)."""
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


class UI:
    """One logged-in browser page on the service's UI."""

    def __init__(self, page, base_url: str, shots: Path) -> None:
        self.page = page
        self.base = base_url.rstrip("/")
        self.shots = shots
        shots.mkdir(parents=True, exist_ok=True)

    def shot(self, name: str, full_page: bool = True) -> Path:
        path = self.shots / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=full_page)
        return path

    # ------------------------------------------------------------------ login
    def login(self, user: str, password: str) -> None:
        page = self.page
        page.goto(self.base + "/")
        page.locator("input[name=username]").fill(user)
        page.locator("input[name=password]").fill(password)
        page.keyboard.press("Enter")
        page.wait_for_url(re.compile(r".*/(?!auth).*"), timeout=30_000)
        page.get_by_role("link", name="Dags").first.wait_for(timeout=30_000)

    # ---------------------------------------------------------------- trigger
    def open_trigger(self, dag_id: str):
        page = self.page
        page.goto(f"{self.base}/dags/{dag_id}")
        page.get_by_role("button", name="Trigger").first.click()
        dialog = page.get_by_role("dialog")
        dialog.get_by_text("Run Parameters").first.wait_for(timeout=30_000)
        return dialog

    @staticmethod
    def set_select(dialog, name: str, value: str) -> None:
        """A Param with an enum (a combobox whose hidden input is ``element_<name>``)."""
        box = dialog.locator(f"input[name=element_{name}]").locator(
            "xpath=ancestor::div[.//input[@role='combobox']][1]").locator("input[role=combobox]")
        box.click()
        box.fill(value)
        dialog.page.get_by_role("option", name=value, exact=True).click()

    @staticmethod
    def set_number(dialog, name: str, value: float) -> None:
        field = dialog.locator(f"[id='number-input:element_{name}:inc']").locator(
            "xpath=ancestor::div[.//input[@role='spinbutton']][1]").locator("input[role=spinbutton]")
        field.fill(str(value))
        field.press("Tab")

    @staticmethod
    def set_checkbox(dialog, name: str, on: bool) -> None:
        box = dialog.locator(f"input[name=element_{name}]")
        if box.is_checked() != on:
            box.locator("xpath=ancestor::label[1]").click()

    def submit_trigger(self, dialog) -> None:
        dialog.locator("[data-testid=trigger-dag-submit]").click()
        dialog.wait_for(state="detached", timeout=30_000)

    # --------------------------------------------------------------- backfill
    def open_backfill(self, dag_id: str):
        dialog = self.open_trigger(dag_id)
        dialog.get_by_text("Backfill", exact=True).click()
        dialog.get_by_text("Date Range").wait_for(timeout=10_000)
        return dialog

    @staticmethod
    def set_backfill_range(dialog, start, end) -> None:
        """From/To through the date-time pickers (UTC datetimes), then reprocess every run
        in the range with the form's params ("All Runs", override parameters)."""
        page = dialog.page
        for i, when in enumerate((start, end)):
            dialog.locator("[data-testid=datetime-input]").nth(i).click()
            picker = page.locator("[data-scope=popover][data-part=content][data-state=open]")
            picker.get_by_placeholder("YYYY/MM/DD").fill(when.strftime("%Y/%m/%d"))
            clock = picker.get_by_placeholder("HH:mm")
            clock.fill(when.strftime("%H:%M"))
            clock.press("Enter")
            dialog.get_by_text("Date Range").click()  # closes the picker
        # The dry run under the default behaviour (missing runs) finds none when every
        # interval already ran on schedule: wait for its answer, whichever it is.
        dialog.get_by_text(re.compile(
            r"\d+ runs? will be triggered|No runs matching selected criteria")).wait_for()
        dialog.get_by_text("All Runs", exact=True).click()
        dialog.get_by_text("Override parameters on existing runs").click()
        dialog.get_by_text(re.compile(r"\d+ runs? will be triggered")).wait_for(timeout=120_000)

    def submit_backfill(self, dialog) -> None:
        dialog.get_by_role("button", name=re.compile(r"Run Backfill")).click()
        dialog.wait_for(state="detached", timeout=30_000)

    # -------------------------------------------------------- required action
    def approve(self, dag_id: str, run_id: str, shot: str | None = None) -> None:
        """Open the run's Required actions, read the request, choose Approve."""
        from urllib.parse import quote

        page = self.page
        page.goto(f"{self.base}/dags/{dag_id}/runs/{quote(run_id, safe='')}/required_actions")
        page.get_by_text(re.compile("Apply rebalance plan")).first.click()
        button = page.get_by_role("button", name="Approve")
        button.wait_for()
        if shot:
            self.shot(shot, full_page=False)
        button.click()
