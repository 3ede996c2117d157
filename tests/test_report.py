"""`probe report` in each format and `probe check`, on a store that real CPU probes filled; the
HTML opened in Chromium with the network blocked, and a hostile folder and label kept as text."""

from __future__ import annotations

import html
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import (
    CHROMIUM_ARGS,
    HOSTILE_FOLDER,
    HOSTILE_LABEL,
    chromium,
    probe_cli,
    skip_on_a_busy_host,
)
from probe.judge.changes import Recommendation, workers
from probe.judge.evidence import Evidence
from probe.metrics import IMAGES_PER_S
from probe.present import charts
from probe.present.doctor_tables import doctor_lines
from probe.present.report import REPORT_SCHEMA, Report, build_report, render
from probe.present.tables import SHORT, recommendation_grid, recommendation_notes
from probe.store.db import Store

CHROMIUM, MISSING = chromium()


def report(filled: dict[str, Any], subject: str, form: str) -> str:
    result = probe_cli("report", subject, "--db", filled["db"], "--format", form)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_json_report_holds_the_run_its_diagnosis_and_its_series(
    filled_store: dict[str, Any],
) -> None:
    two = filled_store["two"]
    document = json.loads(report(filled_store, two["run_id"], "json"))
    assert document["schema"] == REPORT_SCHEMA
    assert (document["kind"], document["subject"]) == ("run", f"run {two['run_id']}")
    shown = json.loads(
        probe_cli("show", two["run_id"], "--db", filled_store["db"], "--json").stdout
    )
    assert document["run"] == {key: value for key, value in shown.items() if key != "diagnosis"}
    assert document["diagnosis"] == shown["diagnosis"]
    assert document["verdict"] == shown["diagnosis"]["verdict"]
    assert document["reproduce"].startswith("probe run --pipeline torch --data ")
    lanes = document["series"]["lanes"]
    assert [lane["label"] for lane in lanes] == ["lane 0: cpu, shard 0/2", "lane 1: cpu, shard 1/2"]
    assert all(len(lane["t_s"]) == len(lane["data_wait_frac"]) > 0 for lane in lanes)
    histogram = document["latency_histogram"]
    assert [sum(lane["counts"]) for lane in histogram["lanes"]] == [6, 6]  # measured batches


def test_the_markdown_summary_of_a_doctor_session_fits_a_pr_comment(
    filled_store: dict[str, Any],
) -> None:
    doctor = filled_store["doctor"]
    skip_on_a_busy_host(doctor)
    text = report(filled_store, doctor["session_id"], "md")
    assert text.startswith(f"### feedscope: doctor session {doctor['session_id']}\n")
    top = doctor["recommendations"][0]
    assert f"**Top recommendation**: `{top['setting']}`" in text
    shown = IMAGES_PER_S.cell(top["predicted_images_per_s"], top["predicted_error"])
    assert f"predicted {shown} images/s" in text
    runs = re.findall(r"^\| (\d{8}-\d{6}-\w{4}) \|", text, re.MULTILINE)
    assert runs == doctor["run_ids"]
    assert len(text.splitlines()) - len(runs) < 40, text  # and a row a run (a call's pairs too)


def test_reports_of_a_failed_run_say_it_is_partial(filled_store: dict[str, Any]) -> None:
    failed = filled_store["failed"]["run_id"]
    assert "partial: the run did not complete" in report(filled_store, failed, "md")
    page = report(filled_store, failed, "html")
    assert "partial: the run did not complete" in page
    assert "zz_truncated.jpg" in page  # the failed lane's reason


def test_a_sweep_report_has_its_curve_and_points(filled_store: dict[str, Any]) -> None:
    sweep = filled_store["sweep"]
    document = json.loads(report(filled_store, sweep["session_id"], "json"))
    assert document["kind"] == "sweep"
    assert [brief["run"] for brief in document["runs"]] == sweep["run_ids"]
    assert document["run"]["run_id"] == sweep["knee"]["run_id"]  # the timelines are the knee's
    page = report(filled_store, sweep["session_id"], "html")
    assert "<h2>Sweep of num_workers</h2>" in page


def test_markup_in_a_path_or_label_stays_text(filled_store: dict[str, Any]) -> None:
    hostile = filled_store["hostile"]["run_id"]
    page = report(filled_store, hostile, "html")
    assert "<script>window" not in page and "<img" not in page
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page
    summary = report(filled_store, hostile, "md")
    assert re.search(r"(?<!\\)<", summary) is None  # every < escaped: no HTML in the comment
    assert r"\<img src=x onerror=" in summary


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
@pytest.mark.parametrize("which", ["doctor", "hostile"])
def test_the_html_report_draws_its_charts_offline(
    filled_store: dict[str, Any], tmp_path: Path, which: str
) -> None:
    from playwright.sync_api import Route, sync_playwright

    subject = filled_store[which].get("session_id") or filled_store[which]["run_id"]
    out = tmp_path / "report.html"
    written = probe_cli("report", subject, "--db", filled_store["db"], "-o", out)
    assert written.returncode == 0, written.stderr
    page_text = out.read_text()
    charts = page_text.count('class="plotly-graph-div"')
    assert charts >= 4
    assert page_text.count("<script src=") == 0  # nothing loaded from elsewhere
    problems: list[str] = []
    fetched: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(offline=True)

        def keep_local(route: Route) -> None:
            if route.request.url.startswith("file:"):
                route.continue_()
            else:
                fetched.append(route.request.url)
                route.abort()

        context.route("**/*", keep_local)
        page = context.new_page()
        page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.goto(out.as_uri())
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {charts}"
        )
        drawn = page.locator(".js-plotly-plot").count()
        pwned = page.evaluate("window.pwned === undefined ? null : window.pwned")
        text = page.inner_text("body")
        browser.close()
    assert (problems, fetched) == ([], [])
    assert drawn == charts
    assert pwned is None
    if which == "hostile":
        assert "/".join(HOSTILE_FOLDER) in text
        assert HOSTILE_LABEL in text


def test_report_refuses_what_it_cannot_do(filled_store: dict[str, Any], tmp_path: Path) -> None:
    db = filled_store["db"]
    missing = probe_cli("report", "last", "--db", db, "-o", tmp_path / "no" / "r.html")
    assert (missing.returncode, missing.stderr.count("\n")) == (2, 1)
    assert missing.stderr.startswith(f"error: cannot write {tmp_path / 'no' / 'r.html'}")
    unknown = probe_cli("report", "nonesuch", "--db", db)
    assert (unknown.returncode, unknown.stderr.count("\n")) == (2, 1)
    by_suffix = probe_cli("report", "last", "--db", db, "-o", tmp_path / "r.json")
    assert by_suffix.returncode == 0, by_suffix.stderr
    assert json.loads((tmp_path / "r.json").read_text())["schema"] == REPORT_SCHEMA


def test_check_passes_a_run_within_its_thresholds(filled_store: dict[str, Any]) -> None:
    two = filled_store["two"]
    worst = max(lane["data_wait_frac"] for lane in two["lanes"])
    slowest = min(lane["images_per_s"] for lane in two["lanes"])
    passed = probe_cli("check", two["run_id"], "--db", filled_store["db"],
                       "--max-data-wait", f"{worst * 100 + 1:.1f}%",
                       "--min-images-per-s", slowest - 1, "--json")  # fmt: skip
    assert passed.returncode == 0, passed.stderr
    document = json.loads(passed.stdout)
    assert document["passed"] is True
    assert [lane["passed"] for lane in document["lanes"]] == [True, True]


def test_check_fails_a_lane_that_misses_and_says_which(filled_store: dict[str, Any]) -> None:
    two = filled_store["two"]
    slowest = min(two["lanes"], key=lambda lane: lane["images_per_s"])
    threshold = slowest["images_per_s"] + 1
    failed = probe_cli("check", two["run_id"], "--db", filled_store["db"],
                       "--min-images-per-s", threshold)  # fmt: skip
    assert failed.returncode == 1
    lane = slowest["lane"]
    assert (
        f"lane {lane} (cpu, shard {lane}/2): {slowest['images_per_s']:,.0f} images/s < "
        f"{threshold:,.0f}"
    ) in failed.stderr
    latency = probe_cli("check", two["run_id"], "--db", filled_store["db"],
                        "--max-batch-latency-p99-ms", "0.001")  # fmt: skip
    assert latency.returncode == 1
    assert latency.stderr.count("): batch latency p99") == 2  # both lanes


def test_check_fails_a_run_that_did_not_complete(filled_store: dict[str, Any]) -> None:
    failed = probe_cli("check", filled_store["failed"]["run_id"], "--db", filled_store["db"],
                       "--max-data-wait", "1")  # fmt: skip
    assert failed.returncode == 1
    assert "the run did not complete (failed: lane" in failed.stderr


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ([], "error: give at least one threshold"),
        (["--max-data-wait", "lots"], "error: --max-data-wait takes a share like 0.2"),
        (["--max-data-wait", "120%"], "error: --max-data-wait takes a share from 0 to 1"),
    ],
)
def test_check_refuses_bad_thresholds(
    filled_store: dict[str, Any], arguments: list[str], message: str
) -> None:
    result = probe_cli("check", "last", "--db", filled_store["db"], *arguments)
    assert result.returncode == 2
    assert result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1


# --- what the reports say, and how -------------------------------------------------------------


def built(filled: dict[str, Any], subject: str) -> Report:
    with Store(filled["db"]) as store:
        return build_report(store, subject)


def shown_text(page: str) -> str:
    """What a page shows as text: no scripts, no preformatted command or configuration."""
    page = re.sub(r"<script.*?</script>|<pre>.*?</pre>", " ", page, flags=re.DOTALL)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def test_code_marks_are_code_not_backticks(filled_store: dict[str, Any]) -> None:
    report = built(filled_store, filled_store["two"]["run_id"])
    marked = Evidence("sweep", 0.0, "run `probe sweep --values 1,2` to see the knee")
    advice = Recommendation("try more workers, then `probe doctor` to check", workers(2),
                            None, "estimated: `probe doctor` measures it")  # fmt: skip
    diagnosis = replace(report.diagnosis, recommendations=(advice,),
                        verdict=replace(report.verdict, evidence=(marked,)))  # fmt: skip
    report = replace(report, diagnosis=diagnosis)
    page = render(report, "html")
    assert "<li>run <code>probe sweep --values 1,2</code> to see the knee</li>" in page
    assert "<code>probe doctor</code> to check" in page
    assert "`" not in shown_text(page)
    summary = render(report, "md")
    assert "- run `probe sweep --values 1,2` to see the knee" in summary
    assert "then `probe doctor` to check" in summary
    assert "\\`" not in summary


@pytest.mark.parametrize("which", ["doctor", "two", "failed", "sweep", "hostile"])
def test_nothing_unknown_reads_none(filled_store: dict[str, Any], which: str) -> None:
    subject = filled_store[which].get("session_id") or filled_store[which]["run_id"]
    report = built(filled_store, subject)
    page, summary = shown_text(render(report, "html")), render(report, "md")
    for text in (page, summary):
        assert re.search(r"\bNone\b", text) is None
    assert "driver not found (no GPU sampled)" in page  # these runs sampled no GPU
    assert "driver not found (no GPU sampled)" in summary
    session = report.session
    if session is not None:
        unanswered = replace(session, verdict=None, reason=None)
        assert doctor_lines(unanswered) == [f"session {session.session_id}: no answer"]


def test_long_cells_are_short_and_whole_under_the_table(filled_store: dict[str, Any]) -> None:
    action = "raise num_workers from 1 to 2: the smallest setting within 5% of the best measured"
    basis = "measured in a sweep: num_workers=2 gave 222 images/s, within 5% of the best"
    advice = Recommendation(action, workers(2), 222.0, basis, notes=("frees a core",))
    grid = recommendation_grid([advice])
    (row,) = grid.records()
    assert (row["what"], row["basis"]) == ("raise num_workers from 1 to 2…", "measured in a sweep…")
    assert all(len(cell) <= SHORT for cell in grid.rows[0])
    (whole,) = recommendation_notes([advice])
    assert whole == f"num_workers=2: {action}; basis: {basis}; frees a core"
    report = built(filled_store, filled_store["two"]["run_id"])
    page = render(replace(report, diagnosis=replace(report.diagnosis, recommendations=(advice,))),
                  "html")  # fmt: skip
    assert html.escape(whole, quote=True) in page


def test_a_sweep_report_marks_its_knee_inside_the_plot(filled_store: dict[str, Any]) -> None:
    report = built(filled_store, filled_store["sweep"]["session_id"])
    session = report.session
    assert session is not None and report.session_point
    measured = session.points[0]
    points = tuple(replace(measured, setting=setting) for setting in (1, 4, 8))
    for knee, side in zip(points, ("right", "center", "left"), strict=True):
        figure = charts.sweep_curve(replace(session, points=points, knee=knee))
        (marked,) = [trace for trace in figure.data if trace.name == "knee"]
        assert (marked.textposition, marked.cliponaxis) == (f"top {side}", False)
    # the session's point is measured again as the session measured it: until precise
    command = report.to_json()["reproduce"]
    assert "--precision" in command and "--duration" not in command


def test_compared_runs_say_each_setting_then_its_figure(filled_store: dict[str, Any]) -> None:
    report = built(filled_store, filled_store["doctor"]["session_id"])
    figure = charts.compare_bars(report.runs)
    assert {trace.hovertemplate.split("%{x")[0] for trace in figure.data} == {"%{y}: "}
