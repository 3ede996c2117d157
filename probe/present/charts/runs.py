"""A run's figures: its lanes' data-wait against GPU busy-ness, and on several lanes the worst
rank's data-wait, throughput and latency, the latency histogram, GPUs and CPU per core, over the
run's time; the timelines shade its start-up and warm-up (`run_phases`), which their figures
leave out. The sentence under the lanes' timelines is made here too (`slowest_line`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.metrics import DATA_WAIT
from probe.present.charts.layout import BUSY_COLOR, PALETTE, WAIT_COLOR, layout, values
from probe.store.documents import LaneDocument
from probe.store.series import (
    Band,
    CpuStrip,
    LatencyHistogram,
    RunSeries,
    SlowestLanes,
    slowest_lanes,
)

CAPACITY_COLOR = "#fd8d3c"  # the pipeline's (its workers' stages are oranges)
CAPACITY_WAIT = "waiting for data % (no consumer)"
TIME_AXIS = "seconds since the run started"
SLOWEST_TITLE = "the worst rank's data-wait per interval, marked by its lane (DDP waits for it)"
WORST_WAIT = f"{DATA_WAIT.label}, worst rank %"
SLOWEST_HEIGHT = 160  # px of the worst rank's row
STARTUP, WARMUP = "start-up", "warm-up"
PHASE_COLORS = {STARTUP: "rgba(110,110,110,0.14)", WARMUP: "rgba(230,160,0,0.16)"}
STARTUP_AND_WARMUP = "start-up and warm-up"  # where the lanes' warm-up lengths are not known
WASHED_OUT = "rgba(255,255,255,0.45)"  # a phase over a heatmap


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
    is down. With two lanes or more, a row under them draws, for each interval, the highest
    data-wait of any lane and marks which lane it was (`slowest_lanes`): the worst rank's
    data-wait, the `max` over a job's ranks of what Prometheus gives each as
    `rate(feedscope_data_wait_seconds_total)` over it plus `rate(feedscope_step_seconds_total)`.
    The run's start-up and warm-up (`run_phases`) are shaded.
    A run with no consumer (`pipeline_only`) waits by design: its wait is drawn in the
    pipeline's colour, as its capacity at work, not in the alarm's."""
    gpus = {gpu.uuid: gpu for gpu in series.gpus}
    slowest = slowest_lanes(series)
    lane_rows = max(1, len(series.lanes))
    rows = lane_rows + (slowest is not None)
    heights = [200] * lane_rows
    titles = [lane.label for lane in series.lanes] or [""]
    if slowest is not None:
        heights.append(SLOWEST_HEIGHT)
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
                x=values(lane.t_s),
                y=values(wait),
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
        color = CAPACITY_COLOR if pipeline_only else WAIT_COLOR
        _slowest_strip(figure, series, slowest, rows, color)
    _mark_phases(figure, phases, rows)
    figure.update_xaxes(title_text=TIME_AXIS, row=rows, col=1)
    figure.update_xaxes(range=series.span_s)
    against = " / ".join(sorted(metrics)) if metrics else "GPU busy-ness (not measured on the CPU)"
    title = f"Data-wait against {against}, per lane"
    if pipeline_only:
        title = f"Waiting for data with no consumer (the pipeline's capacity) against {against}"
    strip_px = 0 if slowest is None else heights[-1] + 60  # its title and a gap
    return layout(figure, title, height=200 * lane_rows + 100 + strip_px)


def _slowest_strip(
    figure: go.Figure, series: RunSeries, slowest: SlowestLanes, row: int, color: str
) -> None:
    """The worst rank's data-wait per interval, in %, in `color`, and at each interval a mark
    in the colour of the lane it was (as in the throughput chart); an interval where no lane
    waited more than the others has its figure and no mark."""
    worst = [DATA_WAIT.scale * w for w in slowest.data_wait_frac]
    figure.add_trace(
        go.Scatter(
            x=values(slowest.t_s),
            y=values(worst),
            mode="lines",
            name=WORST_WAIT,
            line={"color": color, "width": 1},
            hoverinfo="skip",
        ),
        row=row,
        col=1,
    )
    intervals = list(zip(slowest.t_s, slowest.lane, worst, strict=True))
    for index, lane in enumerate(series.lanes):
        marked = [(t_s, wait) for t_s, slow, wait in intervals if slow == lane.lane]
        name = f"lane {lane.lane}"
        figure.add_trace(
            go.Scatter(
                x=values([t for t, _ in marked]),
                y=values([w for _, w in marked]),
                mode="markers",
                marker={"symbol": "square", "size": 7, "color": PALETTE[index % len(PALETTE)]},
                name=f"slowest: {name}",
                hovertemplate=f"{name} the slowest: {DATA_WAIT.label} %{{y:.1f}}%<extra></extra>",
            ),
            row=row,
            col=1,
        )
    figure.update_yaxes(range=[0, 105], title_text="%", row=row, col=1)


def slowest_line(slowest: SlowestLanes) -> str:
    """The sentence under the lanes' timelines: 'lane 1 was the slowest in 42 of 60 seconds;
    lane 0 in 15; in 3 no lane waited more than the others.'"""
    total = _seconds(slowest.seconds)
    unit = "second" if total == "1" else "seconds"
    parts = []
    for index, (lane, count) in enumerate(slowest.counts().items()):
        seconds = _seconds(count * slowest.bucket_s)
        if index == 0:
            parts.append(f"lane {lane} was the slowest in {seconds} of {total} {unit}")
        else:
            parts.append(f"lane {lane} in {seconds}")
    if not parts:
        return f"No lane waited for data more than the others in any of {total} {unit}."
    if slowest.ties:
        parts.append(
            f"in {_seconds(slowest.ties * slowest.bucket_s)} no lane waited more than the others"
        )
    return "; ".join(parts) + "."


def _seconds(value: float) -> str:
    return f"{value:,.0f}"


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
                x=values(lane.t_s),
                y=values(lane.images_per_s),
                name=lane.label,
                line={"color": color},
                legendgroup=lane.label,
            ),
            row=1,
            col=1,
        )
        for latency, dash in ((lane.latency_mean_ms, "solid"), (lane.latency_max_ms, "dot")):
            figure.add_trace(
                go.Scatter(
                    x=values(lane.t_s),
                    y=values(latency),
                    name=lane.label,
                    line={"color": color, "dash": dash},
                    legendgroup=lane.label,
                    showlegend=False,
                ),
                row=2,
                col=1,
            )
    _mark_phases(figure, phases, rows=2)
    figure.update_xaxes(title_text=TIME_AXIS, row=2, col=1)
    figure.update_xaxes(range=series.span_s)
    return layout(figure, "Throughput and batch latency", height=480)


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
    return layout(figure, "GPUs", height=600)


def cpu_heat_strip(
    strip: CpuStrip, span_s: tuple[float, float] | None = None, phases: Sequence[Phase] = ()
) -> go.Figure:
    """CPU busy share of every core over time (over `span_s`, the run's other charts' range;
    its colour bar lies below, so that its time axis lines up with theirs), in whole percent
    (as its hover shows it); the run's start-up and warm-up shaded over it."""
    figure = go.Figure(
        go.Heatmap(
            x=values(strip.t_s),
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
    return layout(figure, "CPU per core (busy %; iowait and steal excluded)", height=height)


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
    return layout(figure, "Batch latency", height=320)


def _band(band: Band, name: str, color: str, group: str, legend: bool) -> list[go.Scatter]:
    """A downsampled series: the min-max envelope, shaded, and the mean."""
    edge: dict[str, Any] = {"line": {"width": 0}, "hoverinfo": "skip", "showlegend": False,
                            "legendgroup": group}  # fmt: skip
    return [
        go.Scatter(x=values(band.t_s), y=values(band.high), **edge),
        go.Scatter(
            x=values(band.t_s),
            y=values(band.low),
            fill="tonexty",
            fillcolor=_translucent(color),
            **edge,
        ),
        go.Scatter(
            x=values(band.t_s),
            y=values(band.mean),
            name=name,
            line={"color": color},
            legendgroup=group,
            showlegend=legend,
        ),
    ]


def _translucent(color: str) -> str:
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgba({red},{green},{blue},0.2)"
