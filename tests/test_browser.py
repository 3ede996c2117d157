"""The dashboard in a real browser: `streamlit run app` headless, driven through Debian's
Chromium by Playwright. A probe is launched from the Launch page on the built-in sample data,
followed on the Live page, and its result and diagnosis read on the Run page. Screenshots of
both pages are kept in `.artifacts/`.

Without Chromium (or Playwright) the test is skipped, unless FEEDSCOPE_REQUIRE_BROWSER=1 (CI
sets it), which turns the skip into an error.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest

from helpers import CHROMIUM_ARGS, chromium
from probe.records import RunStatus
from probe.store.db import Store

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / ".artifacts"
CHROMIUM, MISSING = chromium()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def test_a_probe_launched_in_the_browser_shows_its_result_and_diagnosis(
    dashboard: tuple[str, Path],
) -> None:
    from playwright.sync_api import expect, sync_playwright

    url, db = dashboard
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1800})
        page.set_default_timeout(60_000)
        hosts: set[str] = set()
        page.on("request", lambda request: hosts.add(urlsplit(request.url).hostname or ""))

        page.goto(f"{url}/launch")
        expect(page.get_by_role("heading", name="Launch")).to_be_visible()
        duration = page.get_by_label("seconds measured per lane", exact=True)
        duration.fill("6")
        page.get_by_label("batch size", exact=True).fill("32")
        page.get_by_label("label", exact=True).fill("in-the-browser")
        page.get_by_role("button", name="Start").click()
        expect(page.get_by_text("Started launch-")).to_be_visible()

        page.get_by_role("link", name="Follow it on the Live page").click()
        expect(page.get_by_text("Data-wait against").filter(visible=True).first).to_be_visible(
            timeout=120_000
        )
        page.screenshot(path=str(ARTIFACTS / "live-page.png"), full_page=True)

        ended = page.get_by_role("link", name="Open run")
        expect(ended).to_be_visible(timeout=120_000)
        with Store(db) as store:
            (run,) = store.runs()
        assert run.status is RunStatus.COMPLETED
        assert run.label == "in-the-browser"
        ended.click()

        expect(page.get_by_role("heading", name="Diagnosis")).to_be_visible()
        expect(page.get_by_text(f"{run.run_id}: torch, consumer none")).to_be_visible()
        expect(page.get_by_text("the pipeline alone: its capacity")).to_be_visible()
        expect(page.get_by_text("Data-wait against").filter(visible=True).first).to_be_visible()
        expect(page.get_by_role("button", name="JSON (everything)")).to_be_visible()
        assert f"run={run.run_id}" in page.url
        page.screenshot(path=str(ARTIFACTS / "run-page.png"), full_page=True)
        with page.expect_download() as download:
            page.get_by_role("button", name="HTML report").click()
        saved = Path(download.value.path())
        text = saved.read_text()
        assert download.value.suggested_filename == f"feedscope-{run.run_id}.html"
        assert text.startswith("<!DOCTYPE html>") and f"Run {run.run_id}" in text
        browser.close()
    assert hosts == {"localhost"}  # no usage statistics, no fonts or scripts from elsewhere
