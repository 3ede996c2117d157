"""Plotly figures of runs, sweeps and comparisons: data in, figure out (nothing is shown here).

The dashboard and the exported reports draw with these. Every busy-ness axis says which metric
it is: SM activity (GPM), or kernel-active (NVML utilization.gpu), which overstates busy-ness.
Downsampled series are drawn as a band from each bucket's minimum to its maximum, with the mean
as a line: peaks and dips stay visible however long the run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from probe.judge.results import Session
from probe.metrics import (
    CPU,
    DATA_WAIT,
    IMAGES_PER_S,
    KERNEL_ACTIVE,
    SM_ACTIVE,
    Metric,
    busy_metric,
)
from probe.store.documents import RunBrief
from probe.store.series import Band, CpuStrip, LatencyHistogram, RunSeries

WAIT_COLOR = "#d62728"
BUSY_COLOR = "#1f77b4"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
TIME_AXIS = "seconds since the run started"


def lane_timelines(series: RunSeries) -> go.Figure:
    """Per lane, on one time axis: data-wait (the share of each interval spent waiting for
    data) against the lane's GPU busy-ness, both in %. Starvation shows as red up where blue
    is down."""
    gpus = {gpu.uuid: gpu for gpu in series.gpus}
    rows = max(1, len(series.lanes))
    figure = make_subplots(
        rows=rows,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=min(0.08, 0.3 / rows),
        subplot_titles=[lane.label for lane in series.lanes] or [""],
    )
    metrics = set()
    for row, lane in enumerate(series.lanes, 1):
        wait = [None if w is None else 100 * w for w in lane.data_wait_frac]
        figure.add_trace(
            go.Scatter(
                x=_values(lane.t_s),
                y=_values(wait),
                name=DATA_WAIT.axis,
                line={"color": WAIT_COLOR},
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
    figure.update_xaxes(title_text=TIME_AXIS, row=rows, col=1)
    figure.update_xaxes(range=series.span_s)
    against = " / ".join(sorted(metrics)) if metrics else "GPU busy-ness (not measured on the CPU)"
    title = f"Data-wait against {against}, per lane"
    return _layout(figure, title, height=200 * rows + 100)


def run_figures(series: RunSeries, histogram: LatencyHistogram | None) -> list[go.Figure]:
    """A run's charts, in the order the Run page and the reports show them: lanes (data-wait
    against GPU busy-ness), throughput and latency, the latency histogram, GPUs, CPU per core."""
    out = [lane_timelines(series), throughput_timelines(series)]
    if histogram is not None:
        out.append(latency_histogram(histogram))
    if series.gpus:
        out.append(gpu_timelines(series))
    if series.cpu is not None:
        out.append(cpu_heat_strip(series.cpu, series.span_s))
    return out


def throughput_timelines(series: RunSeries) -> go.Figure:
    """Images/s and batch latency (mean, and the worst per interval) of every lane."""
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
    figure.update_xaxes(title_text=TIME_AXIS, row=2, col=1)
    figure.update_xaxes(range=series.span_s)
    return _layout(figure, "Throughput and batch latency", height=480)


def gpu_timelines(series: RunSeries) -> go.Figure:
    """Per GPU: busy-ness (with its metric's name), the hardware JPEG decoder, memory."""
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
    figure.update_xaxes(title_text=TIME_AXIS, row=3, col=1)
    figure.update_xaxes(range=series.span_s)
    return _layout(figure, "GPUs", height=600)


def cpu_heat_strip(strip: CpuStrip, span_s: tuple[float, float] | None = None) -> go.Figure:
    """CPU busy share of every core over time (over `span_s`, the run's other charts' range;
    its colour bar lies below, so that its time axis lines up with theirs)."""
    figure = go.Figure(
        go.Heatmap(
            x=_values(strip.t_s),
            y=[f"cpu {c}" for c in range(len(strip.per_core))],
            z=np.array(strip.per_core, dtype=float),
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
    if knee is not None and knee in settings:
        rate = rates[settings.index(knee)]
        figure.add_trace(
            go.Scatter(
                x=[knee],
                y=[rate],
                mode="markers+text",
                name="knee",
                text=[f"knee: {knob}={knee}"],
                textposition="top center",
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
            annotation_text=f"{dali_label}: {dali_images_per_s:,.0f} images/s",
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


def compare_bars(briefs: Sequence[RunBrief]) -> go.Figure:
    """Runs side by side: images/s, data-wait (each run's worst lane's), GPU busy-ness and CPU
    cores."""
    names = [brief.name for brief in briefs]
    metrics = {busy_metric(brief.sm_active_source) for brief in briefs} - {None}
    busy = next(iter(metrics)) if len(metrics) == 1 else None
    busy_title = (
        f"{busy.title} %" if busy else f"GPU busy % ({SM_ACTIVE.title} or {KERNEL_ACTIVE.title})"
    )
    figure = make_subplots(
        rows=2,
        cols=2,
        subplot_titles=[IMAGES_PER_S.axis, DATA_WAIT.axis, busy_title, CPU.axis],
    )
    panels: list[tuple[int, int, list[float | None]]] = [
        (1, 1, [brief.images_per_s for brief in briefs]),
        (1, 2, [_shown(DATA_WAIT, brief.data_wait_frac) for brief in briefs]),
        (2, 1, [brief.sm_active_pct for brief in briefs]),
        (2, 2, [brief.cpu_cores for brief in briefs]),
    ]
    for row, col, values in panels:
        figure.add_trace(
            go.Bar(x=names, y=values, marker_color=PALETTE[: len(names)], showlegend=False),
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
    """A figure as an HTML fragment that draws with plotly.js already on the page."""
    config = {"displaylogo": False, "responsive": True}
    return str(pio.to_html(figure, include_plotlyjs=False, full_html=False, config=config))


def plotly_js() -> str:
    """plotly.js itself, to inline once in a self-contained page."""
    return str(get_plotlyjs())


def _shown(metric: Metric, value: float | None) -> float | None:
    return None if value is None else value * metric.scale
