"""Plotly figures of runs, sweeps and comparisons: data in, figure out (nothing is shown here).

The dashboard and the exported reports draw with these. Every busy-ness axis says which metric
it is: SM activity (GPM), or kernel-active (NVML utilization.gpu), which overstates busy-ness.
Downsampled series are drawn as a band from each bucket's minimum to its maximum, with the mean
as a line: peaks and dips stay visible however long the run.

Where a chart needs a sentence under it, it is made here too (`slowest_line`, `stage_line`), so
that the dashboard and the reports say the same. The timelines shade the run's start-up and
warm-up (`run_phases`), which their figures leave out.

An HTML page holds each figure as its JSON (`html_div`: numbers rounded to what a chart shows)
and draws them with plotly.js's cartesian bundle, inlined once, gzipped (`page_script`).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from itertools import cycle
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from probe.judge.results import Session
from probe.metrics import (
    CPU,
    DATA_WAIT,
    IMAGES_PER_S,
    KERNEL_ACTIVE,
    SM_ACTIVE,
    STAGE_TIME,
    STAGES,
    Metric,
    Side,
    busy_metric,
)
from probe.store.documents import LaneDocument, RunBrief
from probe.store.series import (
    Band,
    CpuStrip,
    LatencyHistogram,
    RunSeries,
    SlowestLanes,
    slowest_lanes,
)

WAIT_COLOR = "#d62728"
CAPACITY_COLOR = "#fd8d3c"  # the pipeline's (its workers' stages are oranges)
CAPACITY_WAIT = "waiting for data % (no consumer)"
BUSY_COLOR = "#1f77b4"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
TIME_AXIS = "seconds since the run started"
# The stages' colours: the DataLoader workers' in oranges, the main process's in blues (dark to
# light, in `STAGES` order).
WORKER_COLORS = ("#7f2704", "#a63603", "#d94801", "#f16913", "#fd8d3c", "#fdae6b", "#fdd0a2")
MAIN_COLORS = ("#08306b", "#08519c", "#2171b5", "#4292c6", "#6baed6", "#9ecae1", "#c6dbef")
MEASURED_COLOR = "#111111"
SIDE_TITLES = {Side.WORKERS: "DataLoader workers", Side.MAIN: "main process"}
SLOWEST_TITLE = "slowest lane per interval (the highest data-wait; DDP waits for it)"
SLOWEST_SPAN = 30  # px per lane of the slowest-lane strip
STARTUP, WARMUP = "start-up", "warm-up"
PHASE_COLORS = {STARTUP: "rgba(110,110,110,0.14)", WARMUP: "rgba(230,160,0,0.16)"}
STARTUP_AND_WARMUP = "start-up and warm-up"  # where the lanes' warm-up lengths are not known
WASHED_OUT = "rgba(255,255,255,0.45)"  # a phase over a heatmap
# plotly.js's cartesian bundle (scatter, bar, heatmap, histogram, box and more: the npm package
# plotly.js-cartesian-dist-min, the plotly.js version plotly.py bundles), gzipped: 0.5 MB where
# the whole plotly.js is 4.8 MB
PLOTLY_BUNDLE = Path(__file__).with_name("assets") / "plotly-cartesian.min.js.gz"
SIGNIFICANT = 4  # digits of the numbers a page's figures carry: no chart shows more
CHART_CLASS = "plotly-graph-div"  # a page's chart (`html_div`), named as plotly.py names it


@dataclass(frozen=True)
class Phase:
    """A stretch of a run before its figures, in seconds since the run started: start-up
    (before the lanes' first batch) or warm-up (their warm-up batches, left out of figures)."""

    label: str
    start_s: float
    end_s: float


def run_phases(series: RunSeries, lanes: Sequence[LaneDocument] = ()) -> list[Phase]:
    """A run's start-up and warm-up: from its start to the first interval the last lane
    measured. The lanes' documents split the two (each lane's warm-up batches took its
    `warmup_s`, right before its measured ones); without them it is one stretch. Nothing for a
    window that does not begin at the run's start (a live run's last minutes)."""
    if series.span_s[0] > 0:
        return []
    half = series.batch_bucket_s / 2  # the intervals' times are their middles
    measured = {lane.lane: lane.t_s[0] - half for lane in series.lanes if lane.t_s}
    end = max(measured.values(), default=0.0)
    if end <= 0:
        return []
    firsts = [  # each lane's first batch: its warm-up batches came right before its measured
        measured[lane.lane] - lane.figures.warmup_s for lane in lanes if lane.lane in measured
    ]
    if not firsts:
        return [Phase(STARTUP_AND_WARMUP, 0.0, end)]
    first_batch = min(end, max(0.0, min(firsts)))
    phases = [Phase(STARTUP, 0.0, first_batch), Phase(WARMUP, first_batch, end)]
    return [phase for phase in phases if phase.end_s > phase.start_s]


def _mark_phases(
    figure: go.Figure, phases: Sequence[Phase], rows: int = 0, above: bool = False
) -> None:
    """Shades each phase on every plot of the figure (each of `rows` subplots, or its one
    plot), its label at the top left of the first; `above` the traces where they would hide
    it (a heatmap: washed out, within dotted lines)."""
    for index, phase in enumerate(phases):
        color = PHASE_COLORS.get(phase.label, PHASE_COLORS[STARTUP])
        shape: dict[str, Any] = {"x0": phase.start_s, "x1": phase.end_s, "fillcolor": color,
                                 "line_width": 0, "layer": "below"}  # fmt: skip
        if above:
            shape.update(fillcolor=WASHED_OUT, layer="above",
                         line={"width": 1, "dash": "dot", "color": "#555"})  # fmt: skip
        for row in range(1, rows + 1):
            figure.add_vrect(**shape, row=row, col=1)
        if not rows:
            figure.add_vrect(**shape)
        figure.add_annotation(
            x=phase.start_s,
            xanchor="left",
            y=1,
            yref="y domain",
            yanchor="top",
            yshift=-14 * index,  # one under the other: a short start-up's label is narrow
            text=phase.label,
            showarrow=False,
            font={"size": 10, "color": "#555"},
            bgcolor="rgba(255,255,255,0.7)",
            **({"row": 1, "col": 1} if rows else {}),
        )


def lane_timelines(
    series: RunSeries, phases: Sequence[Phase] = (), pipeline_only: bool = False
) -> go.Figure:
    """Per lane, on one time axis: data-wait (the share of each interval spent waiting for
    data) against the lane's GPU busy-ness, both in %. Starvation shows as red up where blue
    is down. With two lanes or more, a strip under them marks, for each interval, the lane that
    waited most (`slowest_lanes`). The run's start-up and warm-up (`run_phases`) are shaded.
    A run with no consumer (`pipeline_only`) waits by design: its wait is drawn in the
    pipeline's colour, as its capacity at work, not in the alarm's."""
    gpus = {gpu.uuid: gpu for gpu in series.gpus}
    slowest = slowest_lanes(series)
    lane_rows = max(1, len(series.lanes))
    rows = lane_rows + (slowest is not None)
    heights = [200] * lane_rows
    titles = [lane.label for lane in series.lanes] or [""]
    if slowest is not None:
        heights.append(SLOWEST_SPAN * len(series.lanes))
        titles.append(SLOWEST_TITLE)
    figure = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.08, 0.3 / rows),
        subplot_titles=titles,
        row_heights=[h / sum(heights) for h in heights],
    )
    metrics = set()
    for row, lane in enumerate(series.lanes, 1):
        wait = [None if w is None else 100 * w for w in lane.data_wait_frac]
        figure.add_trace(
            go.Scatter(
                x=_values(lane.t_s),
                y=_values(wait),
                name=CAPACITY_WAIT if pipeline_only else DATA_WAIT.axis,
                line={"color": CAPACITY_COLOR if pipeline_only else WAIT_COLOR},
                fill="tozeroy",
                legendgroup="wait",
                showlegend=row == 1,
            ),
            row=row,
            col=1,
        )
        gpu = gpus.get(lane.gpu_uuid or "")
        if gpu is not None:
            metrics.add(gpu.busy_metric)
            for trace in _band(gpu.busy, f"{gpu.busy_metric} %", BUSY_COLOR, "busy", row == 1):
                figure.add_trace(trace, row=row, col=1)
        figure.update_yaxes(range=[0, 105], title_text="%", row=row, col=1)
    if slowest is not None:
        _slowest_strip(figure, series, slowest, rows)
    _mark_phases(figure, phases, rows)
    figure.update_xaxes(title_text=TIME_AXIS, row=rows, col=1)
    figure.update_xaxes(range=series.span_s)
    against = " / ".join(sorted(metrics)) if metrics else "GPU busy-ness (not measured on the CPU)"
    title = f"Data-wait against {against}, per lane"
    if pipeline_only:
        title = f"Waiting for data with no consumer (the pipeline's capacity) against {against}"
    strip_px = 0 if slowest is None else heights[-1] + 60  # its title and a gap
    return _layout(figure, title, height=200 * lane_rows + 100 + strip_px)


def _slowest_strip(figure: go.Figure, series: RunSeries, slowest: SlowestLanes, row: int) -> None:
    """A row of one category per lane: a mark at each interval where that lane was the
    slowest, in the lane's colour (as in the throughput chart)."""
    names = [f"lane {lane.lane}" for lane in series.lanes]
    intervals = list(zip(slowest.t_s, slowest.lane, slowest.data_wait_frac, strict=True))
    for index, lane in enumerate(series.lanes):
        marked = [(t_s, wait) for t_s, slow, wait in intervals if slow == lane.lane]
        figure.add_trace(
            go.Scatter(
                x=_values([t for t, _ in marked]),
                y=[names[index]] * len(marked),
                customdata=_values([DATA_WAIT.scale * w for _, w in marked]),
                mode="markers",
                marker={"symbol": "square", "size": 9, "color": PALETTE[index % len(PALETTE)]},
                name=f"slowest: {names[index]}",
                showlegend=False,
                hovertemplate=f"{names[index]} the slowest: data-wait %{{customdata:.1f}}%"
                "<extra></extra>",
            ),
            row=row,
            col=1,
        )
    figure.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=names,
        range=[len(names) - 0.5, -0.5],  # lane 0 on top, as the rows above
        fixedrange=True,
        row=row,
        col=1,
    )


def slowest_line(slowest: SlowestLanes) -> str:
    """The sentence under the lanes' timelines: 'lane 1 was the slowest in 42 of 60 seconds;
    lane 0 in 15; in 3 no lane waited more than the others.'"""
    total = _seconds(slowest.seconds)
    parts = []
    for index, (lane, count) in enumerate(slowest.counts().items()):
        seconds = _seconds(count * slowest.bucket_s)
        if index == 0:
            unit = "second" if total == "1" else "seconds"
            parts.append(f"lane {lane} was the slowest in {seconds} of {total} {unit}")
        else:
            parts.append(f"lane {lane} in {seconds}")
    if not parts:
        return f"No lane waited for data more than the others in any of {total} seconds."
    if slowest.ties:
        parts.append(
            f"in {_seconds(slowest.ties * slowest.bucket_s)} no lane waited more than the others"
        )
    return "; ".join(parts) + "."


def _seconds(value: float) -> str:
    return f"{value:,.0f}"


def stage_bars(lanes: Sequence[LaneDocument]) -> go.Figure | None:
    """Where each image's CPU time goes: per lane that timed its stages (`stages_ms`), a bar of
    its stages in `STAGES` order, the workers' in oranges and the main process's in blues, and
    a black mark at the CPU per image its processes measured (psutil), which the stages should
    add up to; each lane's label says both ('lane 0<br>9.80 of 12.34 ms'). A segment too
    narrow for its label is left unlabelled (the legend and its hover name it). None where no
    lane timed its stages."""
    timed = [lane for lane in lanes if lane.figures.stages_ms]
    if not timed:
        return None
    names = [f"lane {lane.lane}" for lane in timed]
    figure = go.Figure()
    shades = {Side.WORKERS: cycle(WORKER_COLORS), Side.MAIN: cycle(MAIN_COLORS)}
    for stage in STAGES:
        color = next(shades[stage.side])
        ms = [(lane.figures.stages_ms or {}).get(stage.name) for lane in timed]
        if all(value is None for value in ms):
            continue
        shown = [STAGE_TIME.number(value) for value in ms]
        figure.add_trace(
            go.Bar(
                y=names,
                x=_values(ms),
                orientation="h",
                name=stage.label,
                legendgroup=stage.side.value,
                legendgrouptitle_text=SIDE_TITLES[stage.side],
                marker={"color": color, "line": {"color": "white", "width": 1}},
                text=[f"{stage.label} {value}" for value in shown],
                textposition="inside",
                insidetextanchor="middle",
                textangle=0,
                customdata=shown,
                hovertemplate=f"{stage.label} ({SIDE_TITLES[stage.side]}): "
                f"%{{customdata}} {STAGE_TIME.unit}<extra></extra>",
            )
        )
    measured = [lane.figures.cpu_ms_per_image for lane in timed]
    if any(value is not None for value in measured):
        figure.add_trace(
            go.Scatter(
                y=names,
                x=_values(measured),
                mode="markers",
                name=f"measured ({CPU.source.value})",
                legendgroup="measured",
                legendgrouptitle_text="all the lane's processes",
                marker={
                    "symbol": "line-ns",
                    "size": 34,  # as tall as a bar: set below, once the height is known
                    "line": {"width": 4, "color": MEASURED_COLOR},
                },
                customdata=[STAGE_TIME.number(value) for value in measured],
                hovertemplate=f"measured: %{{customdata}} {STAGE_TIME.unit}<extra></extra>",
            )
        )
    totals = [lane.figures.stage_ms() or 0.0 for lane in timed]
    widest = max([*totals, *(value or 0.0 for value in measured)])
    ticks = [f"{name}<br>{_stages_of(lane)}" for name, lane in zip(names, timed, strict=True)]
    # the legend on the right, a column of the workers' stages and one of the main process's:
    # its height, not the page's width, sets the figure's
    legend_px = 20 * len(figure.data) + 40 * 3  # entries, and three groups' titles and gaps
    margins = 70 + 70  # the title's, and the axis title's
    height = margins + max(60 * len(timed), legend_px)
    _layout(figure, "Where each image's CPU time goes", height=height)
    figure.update_traces(
        marker_size=0.8 * (height - margins) / len(timed), selector={"type": "scatter"}
    )
    figure.update_layout(
        barmode="stack",
        hovermode="closest",
        uniformtext={"mode": "hide", "minsize": 10},  # a label that does not fit is not drawn
        margin={"b": 70},
        legend={
            "orientation": "v",
            "x": 1.02,
            "xanchor": "left",
            "y": 1,
            "yanchor": "top",
            "traceorder": "grouped",
            "groupclick": "toggleitem",
        },
    )
    figure.update_xaxes(
        title_text=f"CPU {STAGE_TIME.unit} per image", range=[0, 1.04 * widest or 1.0]
    )
    figure.update_yaxes(
        tickmode="array",
        tickvals=names,
        ticktext=ticks,
        autorange="reversed",
        automargin=True,
    )
    return figure


def _stages_of(lane: LaneDocument) -> str:
    """'9.80 of 12.34 ms': the stages against the measured CPU per image."""
    total = STAGE_TIME.number(lane.figures.stage_ms())
    measured = lane.figures.cpu_ms_per_image
    if measured is None:
        return f"{total} {STAGE_TIME.unit}"
    return f"{total} of {STAGE_TIME.number(measured)} {STAGE_TIME.unit}"


def stage_line(lanes: Sequence[LaneDocument]) -> str | None:
    """The sentence under `stage_bars`: per lane, how much of the CPU its processes measured
    per image the timed stages account for. None where no lane timed its stages."""
    parts = []
    for lane in lanes:
        figures = lane.figures
        total, measured = figures.stage_ms(), figures.cpu_ms_per_image
        if total is None:
            continue
        text = f"lane {lane.lane}: the stages add up to {STAGE_TIME.text(total)}"
        if measured:
            text += (
                f", {total / measured:.0%} of the {STAGE_TIME.text(measured)} "
                f"its processes measured ({CPU.source.value})"
            )
        parts.append(text)
    return "; ".join(parts) + "." if parts else None


def run_figures(
    series: RunSeries,
    histogram: LatencyHistogram | None,
    lanes: Sequence[LaneDocument] = (),
    pipeline_only: bool = False,
) -> list[go.Figure]:
    """A run's charts, in the order the Run page and the reports show them: lanes (data-wait
    against GPU busy-ness), throughput and latency, the latency histogram, GPUs, CPU per core;
    the timelines with the run's start-up and warm-up shaded (split where the run's `lanes`
    are given: `run_phases`)."""
    phases = run_phases(series, lanes)
    out = [lane_timelines(series, phases, pipeline_only), throughput_timelines(series, phases)]
    if histogram is not None:
        out.append(latency_histogram(histogram))
    if series.gpus:
        out.append(gpu_timelines(series, phases))
    if series.cpu is not None:
        out.append(cpu_heat_strip(series.cpu, series.span_s, phases))
    return out


def throughput_timelines(series: RunSeries, phases: Sequence[Phase] = ()) -> go.Figure:
    """Images/s and batch latency (mean, and the worst per interval) of every lane; the run's
    start-up and warm-up shaded."""
    figure = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.1,
        subplot_titles=["images/s", "batch latency ms (mean; worst dotted)"],
    )
    for index, lane in enumerate(series.lanes):
        color = PALETTE[index % len(PALETTE)]
        figure.add_trace(
            go.Scatter(
                x=_values(lane.t_s),
                y=_values(lane.images_per_s),
                name=lane.label,
                line={"color": color},
                legendgroup=lane.label,
            ),
            row=1,
            col=1,
        )
        figure.add_trace(
            go.Scatter(
                x=_values(lane.t_s),
                y=_values(lane.latency_mean_ms),
                name=lane.label,
                line={"color": color},
                legendgroup=lane.label,
                showlegend=False,
            ),
            row=2,
            col=1,
        )
        figure.add_trace(
            go.Scatter(
                x=_values(lane.t_s),
                y=_values(lane.latency_max_ms),
                name=lane.label,
                line={"color": color, "dash": "dot"},
                legendgroup=lane.label,
                showlegend=False,
            ),
            row=2,
            col=1,
        )
    _mark_phases(figure, phases, rows=2)
    figure.update_xaxes(title_text=TIME_AXIS, row=2, col=1)
    figure.update_xaxes(range=series.span_s)
    return _layout(figure, "Throughput and batch latency", height=480)


def gpu_timelines(series: RunSeries, phases: Sequence[Phase] = ()) -> go.Figure:
    """Per GPU: busy-ness (with its metric's name), the hardware JPEG decoder, memory; the
    run's start-up and warm-up shaded."""
    metrics = sorted({gpu.busy_metric for gpu in series.gpus}) or ["SM activity (GPM)"]
    figure = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=[
            " / ".join(metrics) + " %",
            "hardware JPEG decoder % (NVML)",
            "memory used MiB",
        ],
    )
    for index, gpu in enumerate(series.gpus):
        color = PALETTE[index % len(PALETTE)]
        for row, band in ((1, gpu.busy), (2, gpu.nvjpg), (3, gpu.memory_mib)):
            for trace in _band(band, gpu.label, color, gpu.uuid, row == 1):
                figure.add_trace(trace, row=row, col=1)
    for row in (1, 2):
        figure.update_yaxes(range=[0, 105], row=row, col=1)
    figure.update_yaxes(rangemode="tozero", row=3, col=1)
    _mark_phases(figure, phases, rows=3)
    figure.update_xaxes(title_text=TIME_AXIS, row=3, col=1)
    figure.update_xaxes(range=series.span_s)
    return _layout(figure, "GPUs", height=600)


def cpu_heat_strip(
    strip: CpuStrip, span_s: tuple[float, float] | None = None, phases: Sequence[Phase] = ()
) -> go.Figure:
    """CPU busy share of every core over time (over `span_s`, the run's other charts' range;
    its colour bar lies below, so that its time axis lines up with theirs), in whole percent
    (as its hover shows it); the run's start-up and warm-up shaded over it."""
    figure = go.Figure(
        go.Heatmap(
            x=_values(strip.t_s),
            y=[f"cpu {c}" for c in range(len(strip.per_core))],
            z=np.rint(np.array(strip.per_core, dtype=float)),
            zmin=0,
            zmax=100,
            colorscale="YlOrRd",
            colorbar={
                "title": {"text": "busy %", "side": "right"},
                "orientation": "h",
                "len": 0.3,
                "thickness": 10,
                "x": 1,
                "xanchor": "right",
                "y": 1.02,
                "yanchor": "bottom",
            },
            hovertemplate="%{y}, %{x:.1f} s: %{z:.0f}% busy<extra></extra>",
        )
    )
    _mark_phases(figure, phases, above=True)
    figure.update_xaxes(title_text=TIME_AXIS, range=span_s)
    height = min(900, 220 + 14 * len(strip.per_core))
    return _layout(figure, "CPU per core (busy %; iowait and steal excluded)", height=height)


def latency_histogram(histogram: LatencyHistogram) -> go.Figure:
    """Measured batch latencies (wait plus step) per lane; the last bar holds the slowest."""
    figure = go.Figure()
    slow = 0
    several = len(histogram.lanes) > 1  # then step lines: overlaid bars would hide each other
    for index, (lane, (starts, counts)) in enumerate(sorted(histogram.lanes.items())):
        color = PALETTE[index % len(PALETTE)]
        if several:
            bins = {
                round(start / histogram.bin_ms): n for start, n in zip(starts, counts, strict=True)
            }
            edges = range(max(bins) + 2)
            figure.add_trace(
                go.Scatter(
                    x=[histogram.bin_ms * i for i in edges],
                    y=[bins.get(i, 0) for i in edges],
                    line={"shape": "hv", "color": color},
                    name=f"lane {lane}",
                )
            )
        else:
            figure.add_trace(
                go.Bar(
                    x=[start + histogram.bin_ms / 2 for start in starts],
                    y=counts,
                    width=histogram.bin_ms,
                    name=f"lane {lane}",
                    marker_color=color,
                )
            )
        slow += sum(
            n for start, n in zip(starts, counts, strict=True) if start >= histogram.overflow_ms
        )
    if slow:
        figure.add_annotation(
            x=histogram.overflow_ms,
            y=1,
            yref="y domain",
            text=f"{slow} at {histogram.overflow_ms:,.0f} ms or more",
            showarrow=False,
            xanchor="right",
        )
    figure.update_layout(barmode="overlay")
    figure.update_xaxes(title_text="batch latency ms (wait + step)", rangemode="tozero")
    figure.update_yaxes(title_text="batches")
    return _layout(figure, "Batch latency", height=320)


def sweep_curve(session: Session) -> go.Figure:
    """Images/s over a sweep's settings, its knee marked; DALI's measurement as a line."""
    knob = session.knob
    knee = None if session.knee is None else session.knee.setting
    oversubscribed = session.oversubscribed
    dali = session.dali
    dali_images_per_s = None if dali is None else dali.images_per_s
    dali_label = "DALI" if dali is None else dali.change.setting
    settings = [p.setting for p in session.points]
    rates = [p.images_per_s for p in session.points]
    errors = [p.images_per_s_error or 0.0 for p in session.points]
    figure = go.Figure(
        go.Scatter(
            x=settings,
            y=rates,
            mode="lines+markers",
            name="images/s (± 95%)",
            line={"color": BUSY_COLOR},
            error_y={"type": "data", "array": errors, "visible": any(errors)},
        )
    )
    # a label at the axis's first or last setting reads inwards, not over the plot's edge
    side = _side(knee, settings)
    if knee is not None and knee in settings:
        rate = rates[settings.index(knee)]
        figure.add_trace(
            go.Scatter(
                x=[knee],
                y=[rate],
                mode="markers+text",
                name="knee",
                text=[f"knee: {knob}={knee}"],
                textposition=f"top {side}",
                cliponaxis=False,  # drawn whole, near the top of the plot too
                marker={"size": 14, "symbol": "star", "color": "#2ca02c"},
            )
        )
    over = [(s, r) for s, r in zip(settings, rates, strict=True) if s in set(oversubscribed)]
    if over:
        figure.add_trace(
            go.Scatter(
                x=[s for s, _ in over],
                y=[r for _, r in over],
                mode="markers",
                name="oversubscribed",
                marker={"size": 12, "symbol": "x", "color": WAIT_COLOR},
            )
        )
    if dali_images_per_s is not None:
        figure.add_hline(
            y=dali_images_per_s,
            line_dash="dash",
            line_color="#9467bd",
            annotation_text=f"{dali_label}: {IMAGES_PER_S.text(dali_images_per_s)}",
            # at the end away from the knee's label, which it would run into
            annotation_position="top left" if side == "left" else "top right",
        )
    log = min(settings or [0]) > 0
    figure.update_xaxes(
        title_text=knob,
        type="log" if log else "linear",
        tickvals=settings,  # a log axis's own ticks would show 2, 3, 5 ... between settings
        ticktext=[str(s) for s in settings],
    )
    figure.update_yaxes(title_text="images/s", rangemode="tozero")
    return _layout(figure, f"Sweep of {knob}", height=380)


def _side(setting: int | None, settings: Sequence[int]) -> str:
    """Where a label beside `setting` reads: 'right' of the first setting, 'left' of the
    last, 'center' between them."""
    if setting is None or len(settings) < 2:
        return "center"
    if setting == min(settings):
        return "right"
    return "left" if setting == max(settings) else "center"


def compare_bars(briefs: Sequence[RunBrief]) -> go.Figure:
    """Runs side by side: images/s, data-wait (each run's worst lane's), GPU busy-ness and CPU
    cores."""
    names = [brief.name for brief in briefs]
    metrics = {busy_metric(brief.sm_active_source) for brief in briefs} - {None}
    busy = next(iter(metrics)) if len(metrics) == 1 else None
    busy_title = (  # the metrics' names on a line of their own: too long for a half-width title
        f"{busy.title} %"
        if busy
        else f"GPU busy %<br><sup>{SM_ACTIVE.title} or {KERNEL_ACTIVE.title}</sup>"
    )
    figure = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[IMAGES_PER_S.axis, DATA_WAIT.axis, busy_title, CPU.axis],
    )
    panels: list[tuple[int, int, str, list[float | None]]] = [  # and each one's hover value
        (1, 1, "%{y:,.0f} images/s", [brief.images_per_s for brief in briefs]),
        (1, 2, "%{y:.1f}%", [_shown(DATA_WAIT, brief.data_wait_frac) for brief in briefs]),
        (2, 1, "%{y:.1f}%", [brief.sm_active_pct for brief in briefs]),
        (2, 2, "%{y:.1f} cores", [brief.cpu_cores for brief in briefs]),
    ]
    for row, col, shown, values in panels:
        figure.add_trace(
            go.Bar(
                x=names,
                y=values,
                marker_color=PALETTE[: len(names)],
                showlegend=False,
                name="",
                hovertemplate=f"%{{x}}: {shown}<extra></extra>",
            ),
            row=row,
            col=col,
        )
        if all(value is None for value in values):
            figure.add_annotation(
                text="not measured for these runs",
                showarrow=False,
                xref="x domain",
                yref="y domain",
                x=0.5,
                y=0.5,
                row=row,
                col=col,
            )
    return _layout(figure, "Runs compared", height=560)


def _band(band: Band, name: str, color: str, group: str, legend: bool) -> list[go.Scatter]:
    """A downsampled series: the min-max envelope, shaded, and the mean."""
    return [
        go.Scatter(
            x=_values(band.t_s),
            y=_values(band.high),
            line={"width": 0},
            hoverinfo="skip",
            showlegend=False,
            legendgroup=group,
        ),
        go.Scatter(
            x=_values(band.t_s),
            y=_values(band.low),
            line={"width": 0},
            fill="tonexty",
            fillcolor=_translucent(color),
            hoverinfo="skip",
            showlegend=False,
            legendgroup=group,
        ),
        go.Scatter(
            x=_values(band.t_s),
            y=_values(band.mean),
            name=name,
            line={"color": color},
            legendgroup=group,
            showlegend=legend,
        ),
    ]


def _values(values: Sequence[float | None]) -> np.ndarray:
    """A float array, None as NaN: plotly draws NaN as a gap, and checks an array at once
    where it checks a list item by item (six times slower for a 600-point line)."""
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def _translucent(color: str) -> str:
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},0.2)"


def _layout(figure: go.Figure, title: str, height: int) -> go.Figure:
    # White with light grid lines, set directly: applying a named template re-validates all of
    # it, a fifth of a second for every figure.
    figure.update_layout(
        title={"text": title, "x": 0},
        height=height,
        margin={"l": 60, "r": 60, "t": 70, "b": 110},
        # the legend 70 px under the plot, whatever its height (below the time axis's title)
        legend={"orientation": "h", "yanchor": "top", "y": -70 / max(1, height - 180)},
        hovermode="x unified",
        plot_bgcolor="white",
        paper_bgcolor="white",
        font={"color": "#2a3f5f"},
    )
    figure.update_xaxes(gridcolor="#ebf0f8", linecolor="#ebf0f8", zeroline=False)
    figure.update_yaxes(gridcolor="#ebf0f8", linecolor="#ebf0f8", zeroline=False)
    return figure


def html_div(figure: go.Figure) -> str:
    """A figure as an HTML fragment: its (empty) div and its JSON, numbers to `SIGNIFICANT`
    digits and without the template all the page's figures share; `page_script` draws it."""
    spec = figure.to_plotly_json()
    spec["layout"].pop("template", None)
    height = figure.layout.height or 450
    return (
        f'<div class="{CHART_CLASS}" style="height:{height}px;width:100%"></div>'
        f'<script type="application/json">{_json(spec)}</script>'
    )


def page_script() -> str:
    """What draws a page's figures (`html_div`), to put at the end of its body: plotly.js's
    cartesian bundle inlined (gzipped, base64), unpacked by the browser's DecompressionStream,
    and the template the figures share, once. Nothing is fetched: the page works offline."""
    template = pio.templates[pio.templates.default].to_plotly_json()
    draw = _DRAW.replace("CHART_CLASS", CHART_CLASS).replace("BUNDLE", _bundle_base64())
    return (
        f'<script type="application/json" id="plotly-template">{_json(template)}</script>'
        f"<script>{draw}</script>"
    )


_DRAW = """(async () => {
  const charts = document.querySelectorAll("div.CHART_CLASS");
  if (!charts.length) return;
  try {
    const packed = Uint8Array.from(atob("BUNDLE"), (c) => c.charCodeAt(0));
    const unpacked = new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"));
    const plotly = document.createElement("script");
    plotly.textContent = await new Response(unpacked).text();
    document.head.append(plotly);
    const template = JSON.parse(document.getElementById("plotly-template").textContent);
    for (const chart of charts) {
      const figure = JSON.parse(chart.nextElementSibling.textContent);
      figure.layout.template = template;
      await Plotly.newPlot(chart, figure.data, figure.layout,
                           {displaylogo: false, responsive: true});
    }
  } catch (error) {
    for (const chart of charts) {
      chart.textContent = "The chart could not be drawn: " + error + " (it needs a browser"
        + " with DecompressionStream: Chrome 80, Firefox 113, Safari 16.4 or newer)";
    }
  }
})();"""


@cache
def _bundle_base64() -> str:
    return base64.b64encode(PLOTLY_BUNDLE.read_bytes()).decode("ascii")


def _json(value: Any) -> str:
    """Compact JSON of a figure's parts, to put inside a <script> element: numbers rounded
    (`_rounded`), and `<` escaped, so that no text in it can close the element."""
    text = json.dumps(_rounded(value), separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c")


def _rounded(value: Any) -> Any:
    """Plain JSON values: arrays (numpy's, and plotly's base64 typed arrays) as lists, floats
    to `SIGNIFICANT` digits (whole ones as ints), NaN and infinities as null (a gap)."""
    if isinstance(value, dict) and {"dtype", "bdata"} <= value.keys():
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        value = array if shape is None else array.reshape([int(n) for n in shape.split(",")])
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        short = float(f"{value:.{SIGNIFICANT}g}")
        return int(short) if short.is_integer() else short
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(item) for item in value]
    return value


def _shown(metric: Metric, value: float | None) -> float | None:
    return None if value is None else value * metric.scale
