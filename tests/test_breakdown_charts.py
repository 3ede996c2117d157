"""Where each image's CPU time goes (`charts.stage_bars`, the reports' stage table) and which
lane was the slowest, interval by interval (`series.slowest_lanes`, the strip under the lanes'
timelines), on hand-made lanes and series whose answers are known."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

import pytest

from probe.lane_figures import LaneFigures
from probe.metrics import STAGE_BY_NAME, STAGE_TIME, STAGES, Side
from probe.present import charts
from probe.present.report import build_report, render, stage_grid
from probe.store.db import Store
from probe.store.documents import LaneDocument, RunDocument
from probe.store.series import (
    Band,
    CpuStrip,
    GpuSeries,
    LaneSeries,
    RunSeries,
    slowest_lanes,
)

# CPU ms per image of each stage: decoding 4, crop and resize 2, the others 4 between them
_REST = 4.0 / (len(STAGES) - 2)
STAGES_MS = {
    stage.name: {"decode": 4.0, "crop_resize": 2.0}.get(stage.name, _REST) for stage in STAGES
}
STEP = STAGE_BY_NAME["step"].label  # the main process's


def lane(number: int, stages: dict[str, float] | None, cpu_pct: float = 250.0) -> LaneDocument:
    """A lane at 200 images/s whose processes used `cpu_pct` (250%: 12.5 ms per image)."""
    figures = LaneFigures(images_per_s=200.0, cpu_pct=cpu_pct, stages_ms=stages)
    return LaneDocument(number, None, None, number, 2, "host", "completed", None, figures)


def bars(figure: Any) -> list[Any]:
    return [trace for trace in figure.data if trace.type == "bar"]


# --- where each image's CPU time goes ----------------------------------------------------------


def test_the_bar_has_one_segment_per_stage_in_order_with_the_measured_mark() -> None:
    figure = charts.stage_bars([lane(0, STAGES_MS)])
    assert figure is not None
    segments = bars(figure)
    assert [s.name for s in segments] == [stage.label for stage in STAGES]
    assert [float(s.x[0]) for s in segments] == [STAGES_MS[stage.name] for stage in STAGES]
    assert all(list(s.y) == ["lane 0"] for s in segments)
    assert figure.layout.barmode == "stack"
    assert sum(float(s.x[0]) for s in segments) == pytest.approx(10.0)
    # each segment says its stage and its ms; the workers' in oranges, the main process's blues
    decode = next(s for s in segments if s.name == "decoding")
    assert decode.text[0] == f"decoding {STAGE_TIME.number(4.0)}" == "decoding 4.00"
    for segment, stage in zip(segments, STAGES, strict=True):
        family = charts.WORKER_COLORS if stage.side is Side.WORKERS else charts.MAIN_COLORS
        assert segment.marker.color in family
        assert segment.legendgroup == stage.side.value
    assert len({s.marker.color for s in segments}) == len(STAGES)
    # the CPU the lane's processes measured: 250% of a core at 200 images/s is 12.5 ms
    (mark,) = [trace for trace in figure.data if trace.type == "scatter"]
    assert float(mark.x[0]) == pytest.approx(12.5)
    assert figure.layout.yaxis.ticktext[0] == "lane 0<br>10.00 of 12.50 ms"
    assert figure.layout.title.text == "Where each image's CPU time goes"
    assert figure.layout.xaxis.title.text == "CPU ms per image"
    assert figure.layout.xaxis.range[1] >= 12.5  # the mark lies inside the plot
    assert figure.layout.uniformtext.mode == "hide"  # labels that do not fit are not drawn


def test_no_stages_no_bar_and_lanes_without_them_are_left_out() -> None:
    assert charts.stage_bars([]) is None
    assert charts.stage_bars([lane(0, None), lane(1, {})]) is None
    assert charts.stage_line([lane(0, None)]) is None
    figure = charts.stage_bars([lane(0, None), lane(1, {"decode": 3.0, "step": 1.5})])
    assert figure is not None
    segments = bars(figure)
    assert [(s.name, list(s.y), float(s.x[0])) for s in segments] == [
        ("decoding", ["lane 1"], 3.0),
        (STEP, ["lane 1"], 1.5),
    ]


def test_two_lanes_two_bars_and_a_line_that_says_how_much_the_stages_explain() -> None:
    half = {name: ms / 2 for name, ms in STAGES_MS.items()}
    lanes = [lane(0, STAGES_MS), lane(1, half, cpu_pct=125.0)]
    figure = charts.stage_bars(lanes)
    assert figure is not None
    decode = next(s for s in bars(figure) if s.name == "decoding")
    assert (list(decode.y), [float(x) for x in decode.x]) == (["lane 0", "lane 1"], [4.0, 2.0])
    assert charts.stage_line(lanes) == (
        "lane 0: the stages add up to 10.00 ms, 80% of the 12.50 ms its processes measured "
        "(psutil); lane 1: the stages add up to 5.00 ms, 80% of the 6.25 ms its processes "
        "measured (psutil)."
    )


def test_the_stage_table_gives_each_stage_its_share() -> None:
    doc = replace(_document(), lanes=(lane(0, STAGES_MS), lane(1, None)))
    grid = stage_grid(doc)
    assert grid is not None
    assert grid.header == ("stage", *(s.label for s in STAGES), "all stages")
    ms, share = (dict(zip(grid.header, row, strict=True)) for row in grid.rows)
    assert (ms["stage"], share["stage"]) == ("ms per image", "share")
    assert (ms["decoding"], share["decoding"]) == ("4.00", "40%")
    rest = (STAGE_TIME.number(_REST), f"{_REST / 10:.0%}")
    assert (ms[STEP], share[STEP]) == rest
    assert (ms["all stages"], share["all stages"]) == ("10.00", "100%")
    assert grid.numeric == frozenset(range(1, len(STAGES) + 2))
    assert stage_grid(replace(doc, lanes=(lane(0, None),))) is None
    # a stage no lane timed has no column; with two lanes, each stage is their mean
    doc = replace(doc, lanes=(lane(0, {"decode": 3.0, "step": 1.0}), lane(1, {"decode": 1.0})))
    grid = stage_grid(doc)
    assert grid is not None
    assert grid.header == ("stage", "decoding", STEP, "all stages")
    assert grid.rows == (("ms per image", "2.00", "1.00", "3.00"), ("share", "67%", "33%", "100%"))


# --- the slowest lane, interval by interval ----------------------------------------------------


def series_of(*waits: list[float | None], bucket_s: float = 1.0) -> RunSeries:
    """Lanes whose data-wait over the intervals 0.5 s, 1.5 s, ... is `waits`."""
    lanes = []
    for number, shares in enumerate(waits):
        t_s = [i + 0.5 for i in range(len(shares))]
        lanes.append(
            LaneSeries(number, f"lane {number}: cpu, shard {number}/2", None, t_s,
                       images_per_s=[100.0] * len(shares), data_wait_frac=list(shares),
                       latency_mean_ms=[10.0] * len(shares), latency_max_ms=[20.0] * len(shares))
        )  # fmt: skip
    span = (0.0, float(max(len(w) for w in waits)))
    return RunSeries("run", 0, bucket_s, lanes, [], None, span)


def test_the_slowest_lane_is_the_one_that_waited_most_in_each_interval() -> None:
    series = series_of([0.10, 0.50, 0.0, 0.30, 0.2, 0.60], [0.40, 0.20, 0.0, None, 0.2, 0.10])
    slowest = slowest_lanes(series)
    assert slowest is not None
    # the interval at 3.5 s: lane 1 measured nothing there; 2.5 s and 4.5 s: a tie
    assert slowest.t_s == [0.5, 1.5, 2.5, 4.5, 5.5]
    assert slowest.lane == [1, 0, None, None, 0]
    assert slowest.data_wait_frac == [0.40, 0.50, 0.0, 0.2, 0.60]
    assert slowest.counts() == {0: 2, 1: 1}
    assert (slowest.ties, slowest.seconds) == (2, 5.0)
    assert charts.slowest_line(slowest) == (
        "lane 0 was the slowest in 2 of 5 seconds; lane 1 in 1; "
        "in 2 no lane waited more than the others."
    )
    # a difference under the tie margin names no lane
    close = slowest_lanes(series_of([0.3000], [0.3005]))
    assert close is not None and close.lane == [None]
    told = "No lane waited for data more than the others in any of 1 second."  # one: singular
    assert charts.slowest_line(close) == told
    assert slowest_lanes(series_of([0.3000], [0.3005]), tie_frac=0.0) is not None


def test_intervals_count_in_seconds_of_the_lanes_buckets() -> None:
    slowest = slowest_lanes(series_of([0.5, 0.5, 0.1], [0.1, 0.2, 0.3], bucket_s=6.0))
    assert slowest is not None and slowest.bucket_s == 6.0
    assert charts.slowest_line(slowest) == (
        "lane 0 was the slowest in 12 of 18 seconds; lane 1 in 6."
    )
    # rates need a second of batches: short runs' lanes use one-second intervals
    assert series_of([0.1], [0.2], bucket_s=0.1).batch_bucket_s == 1.0


def test_one_lane_has_no_slowest_and_its_timeline_no_strip() -> None:
    single = series_of([0.1, 0.5, 0.2])
    assert slowest_lanes(single) is None
    figure = charts.lane_timelines(single)
    assert [a.text for a in figure.layout.annotations] == ["lane 0: cpu, shard 0/2"]
    assert not any(trace.mode == "markers" for trace in figure.data)


def test_the_lanes_timelines_mark_the_slowest_lane_of_each_interval() -> None:
    figure = charts.lane_timelines(series_of([0.1, 0.5, 0.6, 0.0], [0.4, 0.2, 0.1, 0.0]))
    titles = [a.text for a in figure.layout.annotations]
    assert titles == ["lane 0: cpu, shard 0/2", "lane 1: cpu, shard 1/2", charts.SLOWEST_TITLE]
    marks = {trace.name: list(trace.x) for trace in figure.data if trace.mode == "markers"}
    assert marks == {"slowest: lane 0": [1.5, 2.5], "slowest: lane 1": [0.5]}
    # the worst rank's data-wait, each interval's highest, in %: the tie at 3.5 s too
    (worst,) = [trace for trace in figure.data if trace.name == charts.WORST_WAIT]
    assert (list(worst.x), list(worst.y)) == ([0.5, 1.5, 2.5, 3.5], [40.0, 50.0, 60.0, 0.0])
    heights = {trace.name: list(trace.y) for trace in figure.data if trace.mode == "markers"}
    assert heights == {"slowest: lane 0": [50.0, 60.0], "slowest: lane 1": [40.0]}
    strip = [trace for trace in figure.data if trace.mode in ("markers", "lines")]
    assert {trace.yaxis for trace in strip} == {"y3"}
    assert figure.layout.xaxis3.title.text == charts.TIME_AXIS  # the strip shares the time axis
    assert figure.layout.xaxis.matches == "x3"


# --- start-up and warm-up, shaded on every timeline --------------------------------------------


def late(series: RunSeries, by_s: float) -> RunSeries:
    """`series` whose lanes measured from `by_s` on: before, the run started and warmed up."""
    lanes = [replace(lane, t_s=[t + by_s for t in lane.t_s]) for lane in series.lanes]
    times = [0.5 * i for i in range(20)]
    strip = CpuStrip(times, [[50.0] * 20, [80.0] * 20], [65.0] * 20)
    band = Band(times, [40.0] * 20, [50.0] * 20, [60.0] * 20)
    gpu = GpuSeries("GPU-0", "GPU 0 (NVIDIA H200)", "SM activity (GPM)", band, band, band, band)
    span = (0.0, series.span_s[1] + by_s)
    return replace(series, lanes=lanes, gpus=[gpu], cpu=strip, span_s=span)


def bands(figure: Any) -> dict[tuple[float, float], int]:
    """The shaded spans of a figure: (from, to) and on how many of its plots."""
    spans: dict[tuple[float, float], int] = {}
    for shape in figure.layout.shapes:
        if shape.type == "rect" and shape.xref.startswith("x"):
            spans[(shape.x0, shape.x1)] = spans.get((shape.x0, shape.x1), 0) + 1
    return spans


def test_the_timelines_shade_the_start_up_and_the_warm_up() -> None:
    series = late(series_of([0.1, 0.5, 0.2], [0.2, 0.1, 0.3]), by_s=4.0)  # measured from 4 s
    warmed = [replace(doc, figures=replace(doc.figures, warmup_s=3.0)) for doc in
              (lane(0, None), lane(1, None))]  # fmt: skip
    assert charts.run_phases(series, warmed) == [
        charts.Phase("start-up", 0.0, 1.0),
        charts.Phase("warm-up", 1.0, 4.0),
    ]
    drawn = charts.run_figures(series, None, warmed)
    assert len(drawn) == 4  # lanes, throughput, GPUs, CPU per core
    plots = [2 + 1, 2, 3, 1]  # lanes and the slowest-lane strip; images/s, latency; busy,
    # decoder, memory; the heat strip
    for figure, count in zip(drawn, plots, strict=True):
        assert bands(figure) == {(0.0, 1.0): count, (1.0, 4.0): count}
        labels = [a.text for a in figure.layout.annotations]
        assert labels.count("start-up") == labels.count("warm-up") == 1
    heat = drawn[-1]
    assert {shape.layer for shape in heat.layout.shapes} == {"above"}  # over the heatmap
    # without the lanes' warm-up lengths: one stretch; a live window past the start: none
    assert charts.run_phases(series) == [charts.Phase("start-up and warm-up", 0.0, 4.0)]
    assert charts.run_phases(replace(series, span_s=(300.0, 600.0)), warmed) == []
    assert charts.run_phases(series_of([0.1, 0.2]), warmed) == []  # measured from the start


# --- the reports -------------------------------------------------------------------------------


def _document() -> RunDocument:
    return RunDocument(
        "run", "probe", "completed", None, "2025-01-01T00:00:00Z", None, "torch", "sleep:15",
        1.0, {}, {}, {}, (), (),
    )  # fmt: skip


@pytest.fixture(scope="module")
def staged_report(filled_store: dict[str, Any]) -> Any:
    """The two-lane run's report, its lanes given stages and its series a known slowest lane."""
    with Store(filled_store["db"]) as store:
        report = build_report(store, filled_store["two"]["run_id"])
    half = {name: ms / 2 for name, ms in STAGES_MS.items()}
    lanes = tuple(
        replace(doc, figures=replace(doc.figures, stages_ms=stages))
        for doc, stages in zip(report.run.lanes, (STAGES_MS, half), strict=True)
    )
    series = series_of([0.1, 0.5, 0.6, 0.2], [0.4, 0.2, 0.1, 0.0])  # lanes 1, 0, 0, 0
    return replace(report, run=replace(report.run, lanes=lanes), series=series)


def test_the_markdown_report_has_the_stage_table(staged_report: Any) -> None:
    text = render(staged_report, "md")
    assert (
        "Where each image's CPU time goes (ms per image, the lanes' mean; the DataLoader "
        "workers' stages, then the main process's): lane 0: the stages add up to 10.00 ms"
    ) in text
    labels = " | ".join(stage.label for stage in STAGES)
    assert f"| stage | {labels} | all stages |" in text
    # the lanes' mean: the second lane's stages are half the first's
    means = [STAGE_TIME.number(0.75 * STAGES_MS[stage.name]) for stage in STAGES]
    assert f"| ms per image | {' | '.join(means)} | 7.50 |" in text
    shares = [f"{STAGES_MS[stage.name] / 10:.0%}" for stage in STAGES]
    assert f"| share | {' | '.join(shares)} | 100% |" in text
    without = replace(
        staged_report,
        run=replace(
            staged_report.run,
            lanes=tuple(
                replace(doc, figures=replace(doc.figures, stages_ms=None))
                for doc in staged_report.run.lanes
            ),
        ),
    )
    assert "| stage |" not in render(without, "md")
    assert "Where each image" not in render(without, "html")


def test_the_html_report_draws_the_stages_and_names_the_slowest_lane(staged_report: Any) -> None:
    page = render(staged_report, "html")
    assert "Where each image&#x27;s CPU time goes" in page or "Where each image's CPU" in page
    # the stage chart lies between the lanes table and the timelines
    stages_at = page.index("the stages add up to 10.00 ms")
    assert page.index("<table>") < stages_at < page.index("<h2>Timelines of run")
    slowest = "lane 0 was the slowest in 3 of 4 seconds; lane 1 in 1."
    assert f"<p class=note>{slowest}</p>" in page
    assert re.search(r"decoding 4\.00", page)  # a segment's label, in the figure's data


def test_the_json_report_carries_each_lanes_stages(staged_report: Any) -> None:
    document = json.loads(render(staged_report, "json"))
    lanes = document["run"]["lanes"]
    assert lanes[0]["stages_ms"] == STAGES_MS
    assert lanes[1]["stages_ms"]["decode"] == 2.0


def test_a_doctor_summary_with_its_stages_still_fits_a_pr_comment(
    filled_store: dict[str, Any],
) -> None:
    with Store(filled_store["db"]) as store:
        report = build_report(store, filled_store["doctor"]["session_id"])
    lanes = tuple(
        replace(doc, figures=replace(doc.figures, stages_ms=STAGES_MS)) for doc in report.run.lanes
    )
    text = render(replace(report, run=replace(report.run, lanes=lanes)), "md")
    assert f"| ms per image | {STAGE_TIME.number(_REST)} | 4.00 | 2.00 | " in text
    plain = render(report, "md")  # test_report's summary: a few lines and a row a run
    assert len(text.splitlines()) <= len(plain.splitlines()) + 8, text  # the stages: a table
