"""The dashboard in a real browser: `streamlit run app` headless, driven through Debian's
Chromium by Playwright. A first visit, on an empty store: the doctor started by its one button
on the built-in sample data, followed on the Live page, its answer read on the Session page and
checked against `probe show last` and `probe report last`. Screenshots of each step are kept in
`.artifacts/`.

Without Chromium (or Playwright) the test is skipped, unless FEEDSCOPE_REQUIRE_BROWSER=1 (CI
sets it), which turns the skip into an error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import psutil
import pytest

from helpers import CHROMIUM_ARGS, chromium, free_port, probe_cli
from probe.judge.changes import Recommendation
from probe.judge.results import read_session
from probe.judge.verdicts import Verdict
from probe.present.doctor_tables import dataloader_against_dali
from probe.present.listing import session_rows
from probe.present.tables import headline, recommendation_text
from probe.records import RunStatus
from probe.store.db import Store

if TYPE_CHECKING:
    from playwright.sync_api import Download, Locator, Page

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / ".artifacts"
CHROMIUM, MISSING = chromium()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@pytest.fixture
def dashboard(tmp_path: Path, sample_cache: Path) -> Iterator[tuple[str, Path]]:
    """A headless dashboard on a fresh store; its address and the store."""
    db = tmp_path / "store.db"
    port = free_port()
    env = {**os.environ, "FEEDSCOPE_DB": str(db), "XDG_CACHE_HOME": str(sample_cache)}
    log = tmp_path / "streamlit.log"
    with open(log, "wb") as output:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "streamlit",
                "run",
                str(ROOT / "app"),
                "--server.port",
                str(port),
            ],
            cwd=tmp_path,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )  # fmt: skip  (from another folder: the app's own config applies wherever it starts)
    url = f"http://localhost:{port}"
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=1) as answer:
                    if answer.read() == b"ok":
                        break
            except OSError:
                pass
            if server.poll() is not None:
                pytest.fail(f"streamlit exited: {log.read_text()}")
            time.sleep(0.5)
        else:
            pytest.fail(f"streamlit did not answer: {log.read_text()}")
        listening = {
            c.laddr.ip
            for c in psutil.Process(server.pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        }
        assert listening and listening <= {"127.0.0.1", "::1"}, listening  # this machine only
        yield url, db
    finally:
        server.terminate()
        server.wait(timeout=30)
        with Store(db) as store:  # a probe left running would outlive the test
            for record in store.launches():
                if record.status is RunStatus.RUNNING and record.pid is not None:
                    subprocess.run(["kill", str(record.pid)], check=False)


def test_a_first_visit_runs_the_doctor_and_lands_on_its_answer(
    dashboard: tuple[str, Path],
) -> None:
    """From an empty store: the one button, the doctor followed on Live from point to point,
    its answer on the Session page, the same answer from `probe show last` and `probe report
    last`, the three exports clicked in quick succession, and its run of your setting."""
    from playwright.sync_api import expect, sync_playwright

    url, db = dashboard
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(60_000)
        hosts: set[str] = set()
        page.on("request", lambda request: hosts.add(urlsplit(request.url).hostname or ""))

        page.goto(url)
        expect(page.get_by_text("Is your GPU waiting for data?")).to_be_visible()
        start = page.get_by_role("button", name="Run the doctor on the built-in sample data")
        expect(start).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "1-first-visit.png"), full_page=True)
        start.click()

        expect(page.get_by_role("heading", name="Live")).to_be_visible()
        expect(page.get_by_text("1 point so far").first).to_be_visible(timeout=180_000)
        expect(page.get_by_text("Processes now").first).to_be_visible(timeout=60_000)
        point = page.locator("li").filter(has_text=" images/s, data-wait ").first
        expect(point).to_be_visible()  # the points so far, a line each, whole at 1,400 px
        _whole(point)
        page.screenshot(path=str(ARTIFACTS / "2-live-doctor.png"), full_page=True)

        expect(page.get_by_role("heading", name="Its runs")).to_be_visible(timeout=240_000)
        expect(page.get_by_text("Recommendations (measured by the doctor")).to_be_visible()
        expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "3-session-answer.png"), full_page=True)
        _tables_whole(page)
        session = _the_answer_agrees(page, db)
        _download_all(page, session)

        with Store(db) as store:
            yours = read_session(store, session).verdict_run_id
        page.get_by_role("link", name=f"Open run {yours}").click()
        expect(page.get_by_role("heading", name="Diagnosis")).to_be_visible()
        basis = f"the doctor session's, measured: {session}"
        expect(page.get_by_text(basis)).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "4-run-page.png"), full_page=True)
        _runs_whole(page, url, db, session)
        _compare_and_launch(page, url, db, session)
        browser.close()
    assert hosts == {"localhost"}  # no usage statistics, no fonts or scripts from elsewhere


def _compare_and_launch(page: Page, url: str, db: Path, session: str) -> None:
    """Compare opens on the session's runs, all of them, with the DataLoader against DALI in the
    session's own figures and no GPU panel on the CPU; Launch opens on the doctor."""
    from playwright.sync_api import expect

    with Store(db) as store:
        doctor = read_session(store, session)
    runs, told = doctor.run_ids, dataloader_against_dali(doctor)
    page.goto(f"{url}/compare")
    expect(page.get_by_role("heading", name="Compare")).to_be_visible()
    if told is None:  # the doctor did not judge both: the best of the runs shown
        expect(page.get_by_text(f"of the {len(runs)} runs shown")).to_be_visible()
    else:  # the session's own figures, as its Session page gives them
        expect(page.get_by_text(f"as doctor session {session} measured them")).to_be_visible()
        expect(page.get_by_text(told)).to_be_visible()
        _whole(page.get_by_text(told))
    expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible()
    expect(page.get_by_text("data-wait", exact=True).first).to_be_attached()  # the table is drawn
    expect(page.get_by_text("GPU busy")).to_have_count(0)
    _bars_possible(page, len(runs))
    _tables_whole(page)
    page.screenshot(path=str(ARTIFACTS / "6-compare.png"), full_page=True)
    page.goto(f"{url}/launch")
    expect(page.get_by_role("heading", name="Launch", exact=True)).to_be_visible()
    expect(page.get_by_role("radio", name="doctor")).to_be_checked()
    page.screenshot(path=str(ARTIFACTS / "7-launch.png"), full_page=True)


WHOLE = """e => {
    let box = e;  // the block the text is laid out in
    while (getComputedStyle(box).display.startsWith('inline')) box = box.parentElement;
    if (box.scrollWidth > box.clientWidth + 1) return 'cut by its box: ' + box.textContent;
    const edge = box.getBoundingClientRect();
    return edge.left < 0 || edge.right > window.innerWidth ? 'past the window' : null;
}"""


def _whole(locator: Locator) -> None:
    """The element's text is all shown: nothing of it cut by the box it is laid out in (a
    metric's label, say, cut to one line with '...'), nor by the window's edge."""
    cut = locator.evaluate(WHOLE)
    assert cut is None, cut


CUT_TABLES = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')]
    .map(table => [table, table.querySelector('.dvn-scroller')])
    .filter(([, box]) => box && box.scrollWidth > box.clientWidth + 1)
    .map(([table, box]) => `${box.scrollWidth} px in ${box.clientWidth}: ${table.textContent}`)"""
BARS = """() => [...document.querySelector('.js-plotly-plot').data]
    .map(bars => ({names: Array.from(bars.y), values: Array.from(bars.x)}))"""


def _tables_whole(page: Page) -> None:
    """Each table on the page is whole in the window: none wider than its box (scrolled)."""
    from playwright.sync_api import expect

    expect(page.get_by_test_id("stDataFrame").first).to_be_visible()
    page.wait_for_timeout(1_000)  # every table drawn
    assert page.evaluate(CUT_TABLES) == []


def _bars_possible(page: Page, runs: int) -> None:
    """Compare's bars, read from the chart the page drew: a bar each of the runs chosen, in
    each panel (images/s, data-wait, CPU cores: no GPU on the CPU), none over what can be, and
    none added to another (plotly stacks the bars of one trace that share a name)."""
    images, waits, cores = page.evaluate(BARS)
    for bars in (images, waits, cores):
        assert len(bars["names"]) == len(set(bars["names"])) == runs, bars
    assert all(0 <= wait <= 100 for wait in waits["values"] if wait is not None), waits
    host = os.cpu_count() or 0
    assert all(0 <= used <= host + 0.05 for used in cores["values"] if used is not None), cores


def _runs_whole(page: Page, url: str, db: Path, session: str) -> None:
    """At 1,400 px the Runs page writes the session's answer whole under its table (the table's
    cells are shortened), and the verdicts its runs' table shortens."""
    from playwright.sync_api import expect

    with Store(db) as store:
        (row,) = session_rows(store)
    page.goto(url)
    expect(page.get_by_role("heading", name="Sessions")).to_be_visible()
    answer = page.locator("li").filter(has_text=f"{session}: ")
    expected = f"{session}: {row.answer}" + (
        "" if row.recommendation == "-" else f"; first recommendation: {row.recommendation}"
    )
    expect(answer).to_have_text(expected.replace("`", ""))  # code marks drawn, not written
    expect(page.get_by_text("verdict", exact=True).first).to_be_attached()  # the runs' table
    page.wait_for_timeout(1_000)  # and what follows it: the verdicts it shortens, whole
    for line in page.get_by_test_id("stMarkdownContainer").locator("li").all():
        _whole(line)
    _tables_whole(page)
    page.screenshot(path=str(ARTIFACTS / "5-runs.png"), full_page=True)


def _the_answer_agrees(page: Page, db: Path) -> str:
    """The Session page's answer is `probe show last --json`'s (the doctor's document), and
    `probe show last` and `probe report last` give the same; the session's id."""
    from playwright.sync_api import expect

    with Store(db) as store:
        (session,) = store.sessions()
        launches = store.launches()
    assert [x.argv for x in launches] == [["doctor", "--gpus", "none"]]
    assert f"session={session.session_id}" in page.url
    shown = json.loads(probe_cli("show", "last", "--db", db, "--json").stdout)
    assert shown["session_id"] == session.session_id
    top = Recommendation.from_json(shown["recommendations"][0])
    verify = shown["verify"]  # "verified" where the run again bore the prediction out
    agreed = verify is None or verify.get("verified", verify["agrees"])
    expect(page.get_by_text(recommendation_text(top, "", agreed))).to_be_visible()
    expect(page.get_by_text(headline(Verdict.from_json(shown["verdict"])))).to_be_visible()
    # at 1,400 px, the answer whole: its verdict, its recommendation, and each tile's setting
    _whole(page.get_by_text(recommendation_text(top, "", agreed)))
    _whole(page.get_by_text(headline(Verdict.from_json(shown["verdict"]))))
    settings = page.get_by_test_id("stCaptionContainer").filter(has_text="num_workers=")
    expect(settings.first).to_be_visible()
    recommended = page.get_by_text(top.setting, exact=True)  # its tile's setting
    for setting in settings.all() + ([] if top.predicted_images_per_s is None else [recommended]):
        _whole(setting.first)
    text = probe_cli("show", "last", "--db", db).stdout
    assert f"1. {top.setting}: {top.action}" in text
    report = probe_cli("report", "last", "--db", db).stdout.replace("\\", "")  # md escapes
    assert f"feedscope: doctor session {session.session_id}" in report
    assert top.setting in report and top.action in report
    return session.session_id


def _download_all(page: Page, session: str) -> None:
    """The three exports, clicked one after the other without waiting: three files."""
    labels = ("HTML report", "Markdown summary", "JSON (everything)")
    files: list[Download] = []
    page.on("download", lambda download: files.append(download))  # noqa: PLW0108 (a bound builtin: Playwright cannot wrap it)
    for label in labels:
        page.get_by_role("button", name=label).click()
    for _ in range(120):
        if len(files) == len(labels):
            break
        page.wait_for_timeout(500)
    assert len(files) == len(labels), [f.suggested_filename for f in files]
    names = sorted(f.suggested_filename for f in files)
    assert names == sorted(f"feedscope-{session}.{form}" for form in ("html", "md", "json"))
    by_form = {f.suggested_filename.rsplit(".", 1)[1]: Path(f.path()).read_text() for f in files}
    assert by_form["html"].startswith("<!DOCTYPE html>") and session in by_form["html"]
    assert f"doctor session {session}" in by_form["md"]
    assert json.loads(by_form["json"])["session"]["session_id"] == session
