"""The dashboard's pages, driven by Streamlit's AppTest against stores that real CPU probes
filled: a doctor session (DataLoader and DALI runs), a two-lane run and a failed run; the empty
store; and probes launched from the pages themselves."""

from __future__ import annotations

import base64
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
from streamlit.testing.v1 import AppTest

from helpers import files_dataset, probe_cli
from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.judge.changes import Recommendation, to_dali, workers
from probe.judge.model import Curve
from probe.judge.results import Session, SessionKind, Skipped, Verification
from probe.judge.thresholds import Severity
from probe.judge.verdicts import TITLES, Verdict, VerdictKind
from probe.metrics import DATA_WAIT, IMAGES_PER_S, against
from probe.present import launch
from probe.present.charts import (
    CAPACITY_WAIT,
    SLOWEST_TITLE,
    STARTUP,
    STARTUP_AND_WARMUP,
    WARMUP,
    slowest_line,
)
from probe.present.doctor_tables import dataloader_against_dali, doctor_lines
from probe.present.listing import run_rows, running_runs
from probe.present.options import CPU_BATCH_SIZE, GPU_BATCH_SIZE, doctor_consumer_note
from probe.present.tables import (
    curve_lines,
    headline,
    measured_again,
    recommendation_text,
    short,
    verification_summary,
)
from probe.records import LaunchRecord, RunStatus, SessionRecord
from probe.store.db import Store
from probe.store.series import run_series, slowest_lanes

PHASES = {STARTUP, WARMUP, STARTUP_AND_WARMUP}  # the shaded spans' labels
APP = str(Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py")
MIGRATE_LEASE = Path(__file__).parent / "benchmarks" / "results" / "2026-11-27-migrate" / "lease1"


def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("app") / "photos"
    make_sample_dataset(root, SampleParams(count=48, classes=4, seed=5))
    return root


@pytest.fixture
def filled(filled_store: dict[str, Any]) -> dict[str, Any]:
    return filled_store


def app(
    monkeypatch: pytest.MonkeyPatch, db: Path, page: str | None = None, **params: str
) -> AppTest:
    monkeypatch.setenv("FEEDSCOPE_DB", str(db))
    # the pages see no GPU on any machine: their probes run on the CPU, as the stores' were
    monkeypatch.setattr("probe.measure.devices.cuda_devices", lambda: [])
    # and a host of 2 cores, where Live tells a probe's progress in words unless asked for charts
    monkeypatch.setattr("probe.measure.devices.host_cores", lambda: 2)
    at = AppTest.from_file(APP, default_timeout=60)
    if page is not None:
        at.switch_page(f"views/{page}.py")
    for name, value in params.items():
        at.query_params[name] = value
    return at.run()


def texts(elements: Any) -> list[str]:
    return [str(element.value) for element in elements]


def no_errors(at: AppTest) -> None:
    """No exception escaped, and the page's guard caught none either."""
    assert not at.exception, at.exception
    assert not [text for text in texts(at.error) if text.startswith("This page could not")]


def charts(at: AppTest) -> list[dict[str, Any]]:
    return [json.loads(chart.proto.spec) for chart in at.get("plotly_chart")]


def trace_names(chart: dict[str, Any]) -> set[str]:
    return {trace.get("name") for trace in chart["data"]} - {None}


def values(data: Any) -> list[Any]:
    """A trace's x or y, as plotly wrote it: a list, or typed binary ({"dtype", "bdata"})."""
    if isinstance(data, dict):
        decoded: list[Any] = np.frombuffer(
            base64.b64decode(data["bdata"]), dtype=data["dtype"]
        ).tolist()
        return decoded
    return list(data)


def table(at: AppTest, column: str) -> list[dict[str, Any]]:
    """The rows of the page's table that has this column."""
    frame = next(df.value for df in at.dataframe if column in df.value.columns)
    records: list[dict[str, Any]] = frame.to_dict("records")
    return records


# --- the empty store ---------------------------------------------------------------------------


def test_an_empty_store_offers_one_button_and_every_page_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    at = app(monkeypatch, db)
    no_errors(at)
    assert [b.label for b in at.button] == ["Run the doctor on the built-in sample data"]
    assert "No runs yet. Is your GPU waiting for data?" in texts(at.info)[0]
    assert doctor_consumer_note(CPU_BATCH_SIZE) in texts(at.info)[0]  # no GPU: the CPU's batch
    for page, message in [
        ("live", "No probe is running now."),
        ("run", "No runs yet: start one on the Launch page, or from the Runs page."),
        ("session", "No doctor or sweep session yet: start one on the Runs or the Launch page."),
        ("compare", "Two or more runs are needed to compare."),
    ]:
        at = app(monkeypatch, db, page)
        no_errors(at)
        assert texts(at.info) == [message]
    at = app(monkeypatch, db, "launch")
    no_errors(at)
    assert at.multiselect(key="launch-devices").value == ["CPU"]  # no GPU seen: see app()
    assert [b.label for b in at.button] == ["Start"]


def test_the_first_button_starts_the_doctor_as_the_cli_would(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, sample_cache: Path
) -> None:
    """`probe doctor` with no flag but the devices: its consumer, budget and batch size are
    the command's own (the whole first visit, followed to its answer, is the browser test's)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(sample_cache))
    db = tmp_path / "store.db"
    at = app(monkeypatch, db)
    at.button(key="runs-first").click().run()
    no_errors(at)
    with Store(db) as store:
        (record,) = store.launches()
        assert record.argv == ["doctor", "--gpus", "none"]  # no GPU seen: see app()
        launch.stop(store, record.launch_id)
        wait_for(lambda: _launch_ended(store, record.launch_id), 60, "the doctor to stop")


def test_a_failed_first_visit_says_why_on_runs_and_live_with_the_click_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The doctor launched from the first visit failed: Runs and Live show its reason, the
    failed session is listed, and one click runs it again with the budget the reason names."""
    db = tmp_path / "store.db"
    reason = (
        "no answer: your setting, num_workers=2, was not measured: what was left of the "
        "budget, 3 s, cannot fit it (it takes at least about 8 s here): --budget 100 would "
        "(session doctor-1)"
    )
    log = tmp_path / "launch.log"
    log.write_text(f"doctor: yours first\n{reason}\n")
    failed = RunStatus.FAILED
    with Store(db) as store:
        argv = ["doctor", "--gpus", "none"]
        store.save_launch(
            LaunchRecord("launch-1", "doctor", argv, ["cpu"], "now", None, failed, 1, str(log), "")
        )
        created = "2026-11-26T10:00:00Z"
        session = Session(
            SessionKind.DOCTOR, "doctor-1", failed, reason[11:-19], created, "sleep:30", 90, 12
        )
        record = SessionRecord(
            "doctor-1", "doctor", created, failed, session.reason, "host", None, session.to_json()
        )
        store.save_session(record)
    again: list[int | None] = []
    monkeypatch.setattr(launch, "again", lambda store, item, budget=None: again.append(budget))
    for page in ("runs", "live"):
        at = app(monkeypatch, db, page)
        assert not at.exception
        (shown,) = texts(at.error)
        assert "launch-1 (probe doctor) ended (failed, exit 1)" in shown
        assert "--budget 100 would" in shown
        assert [b.label for b in at.button if b.label.startswith("Run it again")] == [
            "Run it again with --budget 100"
        ]
    at = app(monkeypatch, db, "runs")
    sessions = table(at, "answer")
    assert [row["session"] for row in sessions] == ["doctor-1"]
    assert sessions[0]["answer"].startswith("no answer: your setting, num_workers=2")
    assert f"- **doctor-1**: no answer: {session.reason}" in texts(at.markdown)  # whole
    next(b for b in at.button if b.label.startswith("Run it again")).click().run()
    assert again == [100]


def _launch_ended(store: Store, launch_id: str) -> bool:
    return any(
        x.launch_id == launch_id and x.status is not RunStatus.RUNNING
        for x in launch.launches(store)
    )


# --- a filled store ----------------------------------------------------------------------------


def test_runs_lists_every_run_with_its_verdict_and_filters(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any]
) -> None:
    at = app(monkeypatch, filled["db"])
    no_errors(at)
    rows = table(at, "verdict")
    expected = {
        *filled["doctor"]["run_ids"], *filled["sweep"]["run_ids"],
        *(filled[name]["run_id"] for name in ("two", "failed", "hostile")),
    }  # fmt: skip
    assert {row["run"] for row in rows} == expected
    # at 1,400 px, whole: the run's pipeline, status and the rest are told for the one selected
    assert list(rows[0]) == ["run", "verdict", "images/s", "data-wait", "label"]
    assert max(len(row["verdict"]) for row in rows) <= 34
    assert max(len(row["label"]) for row in rows) <= 48
    failed = next(row for row in rows if row["run"] == filled["failed"]["run_id"])
    assert failed["verdict"].endswith("(partial)")
    two = next(row for row in rows if row["run"] == filled["two"]["run_id"])
    assert two["images/s"] == round(filled["two"]["images_per_s"])
    # a verdict too long for its cell is shortened there, and written whole under the table
    cells = {row["verdict"].removesuffix(" (partial)") for row in rows}
    titles = set(TITLES.values())
    whole = [line for text in texts(at.markdown) for line in text.splitlines()]
    for cell in cells - titles:
        shown = cell.removesuffix("…")
        assert cell.endswith("…") and any(f"- **{shown}**{t[len(shown) :]}" in whole
                                          for t in titles if t.startswith(shown))  # fmt: skip
    for cell in cells & titles:
        assert not any(line.startswith(f"- **{cell}") for line in whole)

    at.multiselect(key="runs-status").set_value(["failed"]).run()
    assert [row["run"] for row in table(at, "verdict")] == [filled["failed"]["run_id"]]
    at.multiselect(key="runs-status").set_value(["completed", "failed"])
    at.text_input(key="runs-text").input("TWO-lanes").run()
    assert [row["run"] for row in table(at, "verdict")] == [filled["two"]["run_id"]]
    at.multiselect(key="runs-pipeline").set_value(["dali"]).run()
    assert texts(at.info) == [f"None of the {len(rows)} runs matches these filters."]
    assert [frame.key for frame in at.dataframe] == ["runs-sessions"]  # the sessions stay


def test_the_run_page_shows_lanes_on_one_time_axis_and_the_diagnosis(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any]
) -> None:
    two = filled["two"]
    at = app(monkeypatch, filled["db"], "run", run=two["run_id"])
    no_errors(at)
    assert at.selectbox(key="run-pick").value == two["run_id"]
    assert at.subheader[0].value.startswith(f"{two['run_id']}: torch, consumer sleep:15")
    assert texts(at.success)[0] == "completed"
    lanes = table(at, "shard")
    assert [row["shard"] for row in lanes] == ["0/2", "1/2"]
    for row, lane in zip(lanes, two["lanes"], strict=True):
        assert row["batches"] == str(lane["batches"]) == "6"
        assert row["data-wait"] == DATA_WAIT.cell(
            lane["data_wait_frac"], lane["data_wait_frac_error"]
        )
    # the diagnosis, with its evidence in measured numbers
    assert texts(at.subheader)[1] == "Diagnosis"
    shown = texts(at.error) + texts(at.warning) + texts(at.success) + texts(at.info)
    assert any(text.startswith(two["diagnosis"]["verdict"]["title"]) for text in shown)
    # the verdict's evidence, a line each (a data-wait, or a finding across the lanes that starts
    # with what it compares)
    first = two["diagnosis"]["verdict"]["evidence"][0]["text"].replace("$", "\\$")
    assert any(f"- {first}" in text.splitlines() for text in texts(at.markdown)), first
    # where each image's CPU time goes, where the lanes timed their stages; lanes on one time
    # axis; throughput; latency histogram; CPU heat strip (no GPU here)
    figures = charts(at)
    staged = any(lane.get("stages_ms") for lane in two["lanes"])
    assert len(figures) == 4 + staged
    if staged:
        assert figures.pop(0)["layout"]["title"]["text"] == "Where each image's CPU time goes"
    lanes_figure = figures[0]
    titles = [a["text"] for a in lanes_figure["layout"]["annotations"]]
    assert titles[:2] == ["lane 0: cpu, shard 0/2", "lane 1: cpu, shard 1/2"]
    waits = [t for t in lanes_figure["data"] if t.get("name") == "data-wait %"]
    assert len(waits) == 2
    assert all(len(values(t["x"])) > 0 for t in waits)
    # one time axis, the slowest-lane strip's (if a lane waited more than the other) included
    rows = len([title for title in titles if title not in PHASES])
    assert lanes_figure["layout"]["xaxis"]["matches"] == f"x{rows}"
    with Store(filled["db"]) as store:
        series = run_series(store, two["run_id"])
    assert series is not None
    # The strip needs a second both lanes measured in: each lane starts once its process is up,
    # and on a loaded host this short run's two lanes can measure apart.
    slowest = slowest_lanes(series)
    if slowest is None:
        assert SLOWEST_TITLE not in titles
        captions = texts(at.caption)
        assert not any(
            "was the slowest in" in text or "than the others" in text for text in captions
        )
    else:
        assert titles[2] == SLOWEST_TITLE
        assert slowest_line(slowest) in texts(at.caption)
    assert figures[3]["data"][0]["type"] == "heatmap"
    labels = [button.proto.label for button in at.get("download_button")]
    assert labels == ["HTML report", "Markdown summary", "JSON (everything)"]
    (command,) = [code.value for code in at.code]
    assert command.startswith("probe run --pipeline torch --data ")
    assert "--gpus none --num-shards 2 --batch-size 8" in command


def test_a_run_of_a_doctor_session_shows_the_sessions_measured_recommendations(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any]
) -> None:
    doctor = filled["doctor"]
    for run_id in doctor["run_ids"]:  # its points, DALI's run and its verification alike
        at = app(monkeypatch, filled["db"], "run", run=run_id)
        no_errors(at)
        shown = "\n".join(texts(at.markdown))
        assert f"the doctor session's, measured: {doctor['session_id']}" in shown
        for rank, item in enumerate(doctor["recommendations"], 1):
            text = recommendation_text(Recommendation.from_json(item))
            assert f"{rank}. **{text}**" in shown


def test_a_run_too_short_to_judge_is_told_in_blue_not_green(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from probe import watch

    db = tmp_path / "store.db"
    loader = DataLoader(TensorDataset(torch.zeros(12, 3)), batch_size=4)
    for _ in watch(loader, name="val", db=db, answer=False):
        pass
    with Store(db) as store:
        (run,) = store.runs()
    at = app(monkeypatch, db, "run", run=run.run_id)
    no_errors(at)
    told = "too few batches to judge"  # its 3 batches were warm-up
    assert [text for text in texts(at.info) if text.startswith(told)]
    assert not [text for text in texts(at.success) if text.startswith(told)]
    html = probe_cli("report", run.run_id, "--db", db, "--format", "html")
    assert html.returncode == 0, html.stderr
    assert f"<div class='verdict unjudged'>{told}" in html.stdout
    # tensors, not files: the doctor cannot measure like it, and the page says what to pass
    (caption,) = [text for text in texts(at.caption) if "files are not known" in text]
    assert "TensorDataset" in caption and "--data" in caption


def test_a_watched_job_that_names_its_files_is_offered_the_doctor_on_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, photos: Path
) -> None:
    """A dataset holding (path, label) pairs, as torchvision's ImageFolder does: the Run page
    gives `probe doctor --like RUN`, and its click starts that doctor on the job's files."""
    from torch.utils.data import DataLoader

    from probe import watch

    db = tmp_path / "store.db"
    for _ in watch(
        DataLoader(files_dataset(photos, 64), batch_size=8), name="train", db=db, answer=False
    ):
        pass
    with Store(db) as store:
        (run,) = store.runs()
    assert run.config["spec"]["data_dir"] == str(photos)
    assert run.config["spec"]["data_files"] == 48 and run.config["spec"]["image_size"] == 64
    at = app(monkeypatch, db, "run", run=run.run_id)
    no_errors(at)
    assert f"probe doctor --like {run.run_id}" in texts(at.code)
    at.button(key="run-like").click().run()
    no_errors(at)
    with Store(db) as store:
        (record,) = store.launches()
        assert record.argv[:3] == ["doctor", "--data", str(photos)]
        assert record.argv[-2:] == ["--like", run.run_id]
        launch.stop(store, record.launch_id)
        wait_for(lambda: _launch_ended(store, record.launch_id), 60, "the doctor to stop")


def test_a_watched_dataloader_that_dali_answers_is_offered_its_migration(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """pytorch/examples' script watched on one H100 (tests/benchmarks/results): DALI first, so
    the Run page gives `probe migrate RUN` and the line of the script to change."""
    db = Path(shutil.copy(MIGRATE_LEASE / "feedscope.db", tmp_path / "feedscope.db"))
    at = app(monkeypatch, db, "run", run="20261127-221443-8247")
    no_errors(at)
    assert "probe migrate 20261127-221443-8247 -o dali_train_loader.py" in texts(at.code)
    changes = [text for text in texts(at.caption) if "`train_loader = dali_train_loader.loader()`"
               in text]  # fmt: skip
    assert changes


def test_the_session_page_gives_the_doctors_answer_and_its_curve(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any]
) -> None:
    doctor = filled["doctor"]
    at = app(monkeypatch, filled["db"], "session", session=doctor["session_id"])
    no_errors(at)
    assert at.selectbox(key="session-pick").value == doctor["session_id"]
    verdict = Verdict.from_json(doctor["verdict"])
    boxes = texts(at.error) + texts(at.warning) + texts(at.success) + texts(at.info)
    assert headline(verdict) in boxes
    shown = "\n".join(texts(at.markdown))
    top = Recommendation.from_json(doctor["recommendations"][0])
    assert f"1. **{recommendation_text(top)}**" in shown
    metrics = {m.label: m.value for m in at.metric}  # short labels: a metric's is cut to a line
    yours = next(p for p in doctor["sweep"] if p["run_id"] == doctor["verdict"]["run_id"])
    session = Session.from_json(doctor)
    if top.change == workers(yours["num_workers"]):  # no change: one tile, the answer's figure
        figure = IMAGES_PER_S.cell(top.predicted_images_per_s, top.predicted_error)
        assert metrics["yours, the answer"] == figure and "yours" not in metrics
    else:  # yours as the session's pages give it: its runs in alternation pooled, if any
        mine = session.shown(f"num_workers={yours['num_workers']}")
        assert mine is not None and metrics["yours"] == IMAGES_PER_S.cell(
            mine.images_per_s, mine.error
        )
    assert f"num_workers={yours['num_workers']}" in texts(at.caption)  # its setting, whole
    dali = doctor["dali"]
    assert "DALI" in metrics
    points = [p for p in table(at, "num_workers") if not p["marks"].startswith("not run")]
    assert [p["num_workers"] for p in points] == [str(p["num_workers"]) for p in doctor["sweep"]]
    (curve,) = charts(at)
    marked = [trace for trace in curve["data"] if trace.get("name") == "knee"]
    if doctor["knee"] is None:  # one point measured, or a busy host: no knee told nor starred
        busy = any(p["host_busy"] for p in doctor["sweep"])
        assert marked == [] and (len(doctor["sweep"]) < 2 or busy)
    else:
        assert values(marked[0]["x"]) == [doctor["knee"]["num_workers"]]
    if dali["images_per_s"] is not None:  # at the figure of its tile
        assert session.dali is not None
        theirs = session.shown(session.dali.change.setting)
        assert theirs is not None
        pooled = "" if len(theirs.run_ids) == 1 else f" ({len(theirs.run_ids)} runs pooled)"
        line = f"{dali['setting']}{pooled}: {theirs.images_per_s:,.0f} images/s"
        assert [a["text"] for a in curve["layout"]["annotations"]] == [line]
    runs = table(at, "what")
    assert {row["run"] for row in runs} == set(doctor["run_ids"])
    labels = [button.proto.label for button in at.get("download_button")]
    assert labels == ["HTML report", "Markdown summary", "JSON (everything)"]


def test_a_session_of_one_point_says_what_its_chart_draws(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any], tmp_path: Path
) -> None:
    """One setting measured: the chart draws its point, and the caption over it says so and why
    no other, and claims no line of a curve it does not draw (the curve is told in words)."""
    db = tmp_path / "store.db"
    shutil.copy(filled["db"], db)
    doctor = Session.from_json(filled["doctor"])
    why = "the budget cannot fit it"
    one = replace(
        doctor,
        session_id="doctor-one",
        points=doctor.points[:1],
        knee=None,
        skipped=(Skipped(1, why), Skipped(4, why)),
        dali=None if doctor.dali is None else replace(doctor.dali, num_threads=1),
    )
    with Store(db) as store:
        store.save_session(
            SessionRecord("doctor-one", "doctor", "2099-01-01T00:00:00Z", one.status, None,
                          "host", None, one.to_json())
        )  # fmt: skip
    at = app(monkeypatch, db, "session", session="doctor-one")
    no_errors(at)
    assert f"One setting measured, yours; the others were not measured: {why}" in texts(at.caption)
    (chart,) = charts(at)
    drawn = [trace for trace in chart["data"] if trace.get("mode", "").startswith("lines")]
    assert [len(values(trace["x"])) for trace in drawn] == [1]  # a point: no line
    assert not [text for text in texts(at.caption) if "the line" in text]
    if one.dali is not None:  # its tile's setting: one thread, not "1 threads"
        assert f"{one.dali.decoder} decoder, 1 thread" in texts(at.caption)


def test_the_verified_figure_is_signed_measured_against_predicted() -> None:
    """One sign convention: (measured - predicted) / predicted, first in a metric's delta (its
    arrow and colour follow it); "verified" only where the run again agreed, and where it did
    not, no percentage beside it (the verification's line gives the one, against the
    prediction as first made)."""

    def item(predicted: float, measured: float | None) -> Recommendation:
        return Recommendation("no change", workers(2), predicted, "measured",
                              measured_images_per_s=measured)  # fmt: skip

    cell = IMAGES_PER_S.cell
    assert measured_again(item(895, 871), delta=True) == f"-2.7%: verified {cell(871)}"  # down
    assert measured_again(item(871, 895), delta=True) == f"+2.8%: verified {cell(895)}"  # up
    assert measured_again(item(871, None)) is None
    refuted = measured_again(item(447, 379), agreed=False)
    assert refuted == f"measured again {IMAGES_PER_S.text(379)}"
    assert measured_again(item(447, 379), agreed=False, delta=True) == refuted
    assert against(379, 447) == pytest.approx(-0.152, abs=1e-3)


def test_runs_lists_the_sessions_with_their_answers(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any]
) -> None:
    """Each session in the table, its answer shortened to its cell, and whole under it."""
    at = app(monkeypatch, filled["db"])
    no_errors(at)
    rows = table(at, "answer")
    doctor, sweep = filled["doctor"], filled["sweep"]
    assert [row["session"] for row in rows] == [sweep["session_id"], doctor["session_id"]]
    told = headline(Verdict.from_json(doctor["verdict"]))
    assert rows[1]["answer"] == short(told, clauses=False)
    top = Recommendation.from_json(doctor["recommendations"][0])
    # at 1,400 px, whole: the first recommendation is written out under the table alone
    assert list(rows[1]) == ["session", "answer", "status", "consumer", "devices", "runs"]
    knee = f"knee at num_workers={sweep['knee']['num_workers']}"
    assert rows[0]["answer"] == knee
    (whole,) = [text for text in texts(at.markdown) if doctor["session_id"] in text]
    assert whole.splitlines() == [
        f"- **{sweep['session_id']}**: {knee}",
        f"- **{doctor['session_id']}**: {told}; first recommendation: {recommendation_text(top)}",
    ]


def test_a_failed_run_shows_what_it_recorded_and_why_it_failed(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any]
) -> None:
    failed = filled["failed"]
    (bad,) = [lane["lane"] for lane in failed["lanes"] if lane["status"] == "failed"]
    at = app(monkeypatch, filled["db"], "run", run=failed["run_id"])
    no_errors(at)
    status = texts(at.warning)[0]
    assert status.startswith(f"failed: lane {bad} failed: corrupt or truncated image")
    lanes = table(at, "shard")
    assert [row["status"] == "failed" for row in lanes] == [lane == bad for lane in (0, 1)]
    assert "zz_truncated.jpg" in lanes[bad]["reason"]
    assert lanes[1 - bad]["batches"] == "8"
    shown = texts(at.error) + texts(at.warning) + texts(at.success) + texts(at.info)
    assert any(text.endswith("partial: the run did not complete") for text in shown)
    assert len(charts(at)) >= 2  # lane 0's batches are kept and drawn


def test_an_unknown_run_in_the_address_falls_back_to_the_newest(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any]
) -> None:
    at = app(monkeypatch, filled["db"], "run", run="run-nonesuch")
    no_errors(at)
    assert texts(at.warning)[0] == "No run run-nonesuch in the store; showing the newest."
    assert at.selectbox(key="run-pick").value == filled["hostile"]["run_id"]


def test_compare_puts_dataloader_and_dali_runs_side_by_side(
    monkeypatch: pytest.MonkeyPatch, filled: dict[str, Any]
) -> None:
    doctor = filled["doctor"]
    torch_run = doctor["verdict"]["run_id"]  # yours
    dali_run = doctor["dali"]["run_id"]
    at = app(monkeypatch, filled["db"], "compare")
    with Store(filled["db"]) as store:
        newest = run_rows(store)[0].session_id
    if newest == doctor["session_id"]:  # the newest session's runs, every one
        assert sorted(at.multiselect(key="compare-runs").value) == sorted(doctor["run_ids"])
    at.multiselect(key="compare-runs").set_value([torch_run, dali_run]).run()
    no_errors(at)
    rows = table(at, "pipeline")
    assert [row["pipeline"] for row in rows] == ["torch", "dali"]
    assert not any("GPU" in column for column in rows[0])  # on the CPU: no GPU columns
    (bars,) = charts(at)
    rates, waits = (values(bar["x"]) for bar in bars["data"][:2])
    assert [IMAGES_PER_S.cell(rate) for rate in rates] == [
        row["images/s"].split(" ±")[0] for row in rows
    ]
    assert [f"{wait:.1f}%" for wait in waits] == [row["data-wait"] for row in rows]
    assert values(bars["data"][0]["y"]) == [row["run"] for row in rows]  # named as the bars
    assert [row["run id"] for row in rows] == [torch_run, dali_run]
    titles = [a["text"] for a in bars["layout"]["annotations"]]
    assert len(bars["data"]) == 3 and not any("GPU" in title for title in titles)  # on the CPU
    # the runs of one doctor session: its own figures, those of its Session page, not the best
    # of the runs shown (its verification and in-turn runs measure the same settings again)
    session = Session.from_json(doctor)
    told = dataloader_against_dali(session)
    line = next(text for text in texts(at.markdown) if "DataLoader against DALI" in text)
    if told is None:  # the doctor did not judge both (a busy host, say): the best shown
        assert line.startswith("**DataLoader against DALI**, of the 2 runs shown")
    else:
        assert session.dali is not None
        assert f"as doctor session {doctor['session_id']} measured them" in line
        assert f": {told}." in line  # its figures as its Session page gives them (`shown`)
        theirs = session.shown(session.dali.change.setting)
        assert theirs is not None
        assert f"{session.dali.change.setting.removeprefix('DALI ')}, {theirs.text}" in line
        at.multiselect(key="compare-runs").set_value(doctor["run_ids"]).run()  # all of them
        shown = next(text for text in texts(at.markdown) if "DataLoader against DALI" in text)
        assert f"{told}." in shown
    # all of them: a bar each, named as in the table (runs again share their labels)
    at.multiselect(key="compare-runs").set_value(doctor["run_ids"]).run()
    (bars,) = charts(at)
    names = [row["run"] for row in table(at, "pipeline")]
    assert len(set(names)) == len(doctor["run_ids"])
    assert all(values(bar["y"]) == names for bar in bars["data"])
    # runs of no one session: the best of those shown
    at.multiselect(key="compare-runs").set_value([filled["two"]["run_id"], dali_run]).run()
    no_errors(at)
    line = next(text for text in texts(at.markdown) if "DataLoader against DALI" in text)
    assert line.startswith("**DataLoader against DALI**, of the 2 runs shown: the best")
    assert f"the best DALI run {doctor['dali']['images_per_s']:,.0f}" in line
    at.multiselect(key="compare-runs").set_value([torch_run]).run()
    assert texts(at.info) == ["Pick two or more runs."]


def test_no_page_lets_html_through() -> None:
    """Streamlit shows markup in labels and paths as text unless a page allows HTML."""
    pages = Path(APP).parent
    for source in [*pages.glob("*.py"), *pages.glob("views/*.py")]:
        assert "unsafe_allow_html" not in source.read_text(), source


# --- launching ---------------------------------------------------------------------------------


def test_launch_refuses_a_bad_form_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    at = app(monkeypatch, db, "launch")
    at.radio(key="launch-command").set_value("run").run()  # it opens on the doctor
    at.text_input(key="launch-run-data").input(str(tmp_path / "missing"))
    at.text_input(key="launch-run-consumer").input("sleep:soon")
    at.button[0].click().run()
    assert not at.exception
    errors = texts(at.error)
    assert any("missing" in text for text in errors)
    assert any("sleep:soon" in text for text in errors)
    at.radio(key="launch-command").set_value("doctor").run()
    at.number_input(key="launch-doctor-budget").set_value(3.0)
    at.button[0].click().run()
    (problem,) = texts(at.error)
    assert problem.startswith("--budget 3 s cannot fit one trustworthy point")
    with Store(db) as store:
        assert store.launches() == []


def test_launch_starts_a_probe_refuses_a_second_follows_it_live_and_stops_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, photos: Path
) -> None:
    db = tmp_path / "store.db"
    at = app(monkeypatch, db, "launch")
    at.radio(key="launch-command").set_value("run").run()  # it opens on the doctor
    at.text_input(key="launch-run-data").input(str(photos))
    at.number_input(key="launch-run-batch-size").set_value(8)
    at.number_input(key="launch-run-workers").set_value(1)
    at.number_input(key="launch-run-duration").set_value(120.0)
    at.text_input(key="launch-run-label").input("from-the-page")
    at.button[0].click().run()
    no_errors(at)
    assert texts(at.success)[0].startswith("Started launch-")
    with Store(db) as store:
        (record,) = store.launches()
    assert record.argv[record.argv.index("--label") + 1] == "from-the-page"

    at.button[0].click().run()  # the same form again, on the same device
    assert texts(at.error) == [
        f"the CPU is in use by launch {record.launch_id} (run): stop it or wait for it before "
        "starting another probe there (two would measure each other)"
    ]

    with Store(db) as store:
        run = wait_for(lambda: running_runs(store), 60, "the run to start")[0]
        wait_for(lambda: len(store.batches(run.run_id, 0)) > 10, 60, "measured batches")
    live = app(monkeypatch, db, "live")
    no_errors(live)
    assert f"Recording run {run.run_id}" in texts(live.info)[0]
    live.toggle(key="live-charts").set_value(True).run()  # this host is small: charts on ask
    first = charts(live)
    assert len(first) == 3  # lanes, throughput, CPU heat strip
    assert CAPACITY_WAIT in trace_names(first[0])  # no consumer: its capacity
    time.sleep(1.5)
    live.run()  # reads only what was recorded since
    assert len(charts(live)) == 3
    assert any("processes" in text for text in texts(live.caption))

    at = app(monkeypatch, db, "launch")
    at.button(key=f"launch-stop-{record.launch_id}").click().run()
    no_errors(at)
    with Store(db) as store:
        wait_for(lambda: _launch_ended(store, record.launch_id), 60, "the probe to stop")
        assert store.launches()[0].status is RunStatus.INTERRUPTED
        assert store.run(run.run_id).status is RunStatus.INTERRUPTED
        assert len(store.batches(run.run_id, 0)) > 10  # kept
    at = app(monkeypatch, db, "live")
    assert texts(at.info) == ["No probe is running now."]


def test_a_probe_launched_from_the_dashboard_is_reaped_as_it_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """No zombie of a launched probe is left to the dashboard (here, this process) until its
    next look at the launches: a failed run, run again from the Runs page, ends at once."""
    db = tmp_path / "store.db"
    argv = ["run", "--gpus", "none", "--data", str(tmp_path / "missing")]
    log, created = str(tmp_path / "launch-1.log"), "2026-11-26T10:00:00Z"
    with Store(db) as store:
        failed = RunStatus.FAILED
        store.save_launch(
            LaunchRecord("launch-1", "run", argv, ["cpu"], created, None, failed, 2, log, "")
        )
    at = app(monkeypatch, db, "runs")
    at.button(key="runs-again-launch-1").click().run()
    no_errors(at)
    with Store(db) as store:
        again = store.launches()[0]  # read raw: `launch.launches` is no look that reaps
        assert again.launch_id != "launch-1" and again.pid is not None
        wait_for(lambda: store.launches()[0].status is failed, 60, "the probe to fail")
    assert "missing" in Path(again.log_path).read_text()  # it ran, and failed as it should
    dashboard = psutil.Process()
    wait_for(lambda: again.pid not in {c.pid for c in dashboard.children()}, 30, "it to be reaped")


def test_a_setting_has_one_prediction_and_verified_is_said_only_of_what_was_run_again() -> None:
    """The doctor's DALI measured once, first; its verification re-ran yours ("no change"),
    which measured apart and is predicted at its runs' mean: the answer says which one was run
    again ("measured again": it disagreed), calls its first prediction what it was, gives one
    percentage against it, and "verified" nowhere."""
    yours, dali = workers(2), to_dali("cpu", 2)
    verdict = Verdict(VerdictKind.STARVED_CPU_SATURATED, Severity.HIGH, 0.4, ())
    mean = Recommendation("no change: keep num_workers=2", yours, 413.0, "measured",
                          measured_images_per_s=379.0, predicted_error=24.0)  # fmt: skip
    first = Recommendation("move to DALI", dali, 480.0, "measured", predicted_error=20.0)
    verify = Verification(yours, 447.0, 47.0, 379.0, 20.0, agrees=False, host_busy=False,
                          run_id="r2", outcome="predicted at their mean")  # fmt: skip
    session = Session(SessionKind.DOCTOR, "doctor-1", RunStatus.COMPLETED, None, "now",
                      "sleep:30", 90, 60, verdict=verdict, recommendations=(first, mean),
                      verify=verify)  # fmt: skip
    text = "\n".join(doctor_lines(session))
    assert verification_summary(session) == (
        "the first one measured once; recommendation 2 run again"
    )
    assert "measured again num_workers=2 (recommendation 2; recommendation 1, DALI" in text
    assert "predicted at first 447 ± 47" in text and text.count("predicted 413 ± 24") == 1
    assert "measured again 379 images/s" in text and "-8.2%" not in text  # one percentage:
    assert "(-15.2%: more than their errors" in text  # the verification's, against its first
    assert "verified" not in text


def test_the_knee_and_the_doctors_aim_are_each_said_once_and_plainly() -> None:
    """The curve's knee (within 5% of its best), and for a doctor the setting it aims at
    (within 2.5%, half that, for the curve's own error): one statement each, the second said
    as the same setting where it is."""
    apart = Curve("r1", 2, 32, 10.0, 16, 0.1, 0.0, 1.0, 30.0, 30.0)  # knee 12, aim 13
    doctor = Session(SessionKind.DOCTOR, "doctor-1", RunStatus.COMPLETED, None, "now",
                     "sleep:30", 90, 60, curve=apart)  # fmt: skip
    knee = "the knee (the fewest workers within 5% of its best) is num_workers=12, "
    aim = "the doctor aims within 2.5% (half that, to leave room for the curve's own error): "
    line = curve_lines(doctor)[0]
    assert knee in line and f"{aim}num_workers=13, " in line and "(and " not in line
    one = replace(doctor, curve=Curve("r1", 2, 32, 2.5, 2, 0.1, 0.0, 1.0, 30.0, 30.0))
    line = curve_lines(one)[0]
    assert line.endswith("own error), and that is num_workers=2 too")
    assert "doctor" not in curve_lines(replace(doctor, kind=SessionKind.SWEEP))[0]


def test_the_default_consumer_is_said_to_be_resnet_50_only_at_its_batch() -> None:
    """The 30 ms step stands for ResNet-50 at batch 128 on one H200: said at a GPU's batch,
    never at the CPU's 32."""
    gpu, cpu = doctor_consumer_note(GPU_BATCH_SIZE), doctor_consumer_note(CPU_BATCH_SIZE)
    assert gpu.startswith("a simulated training step of 30 ms per batch of 128")
    assert "ResNet-50" in gpu
    assert cpu.startswith("a simulated training step of 30 ms per batch of 32")
    assert "ResNet" not in cpu and "128" not in cpu


H200_DOCTOR = (
    Path(__file__).parent / "benchmarks" / "results" / "2026-11-26-dali-tuning" / "doctor4"
)


def test_a_doctors_dali_search_reads_on_its_page_and_in_its_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The doctor's store from one H200 held to 4 cores: its DALI search (4 settings, from
    DALI's defaults to 2 threads at a share of 1) on the Session page and in the HTML report."""
    db = tmp_path / "h200.db"
    db.write_bytes((H200_DOCTOR / "feedscope.db").read_bytes())
    document = json.loads((H200_DOCTOR / "doctor4" / "doctor.json").read_text())
    session_id = document["session_id"]
    at = app(monkeypatch, db, "session", session=session_id)
    no_errors(at)
    rows = table(at, "decoder, threads, share")
    assert [row["decoder, threads, share"] for row in rows] == [
        "mixed, 4, 0.65", "mixed, 1, 1", "mixed, 3, 1", "mixed, 2, 1 (chosen)",
    ]  # fmt: skip
    shown = "\n".join(texts(at.markdown))
    assert "what holds DALI there: its CPU threads" in shown
    assert "DaliOptions(num_threads=2, decoder=Decoder.MIXED, hw_decoder_load=1)" in shown
    assert "DALI" in {m.label for m in at.metric}
    assert "mixed decoder, 2 threads, share 1" in texts(at.caption)
    report = tmp_path / "doctor.html"
    result = probe_cli("report", session_id, "-o", report, "--db", db)
    assert result.returncode == 0, result.stderr
    html = report.read_text()
    assert "DALI&#x27;s settings searched" in html or "DALI's settings searched" in html
    assert "+138% on where its search started" in html
