"""Where each image's CPU time goes, stage by stage (`stage_bars`), and the sentence under it
(`stage_line`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import cycle

import plotly.graph_objects as go

from probe.metrics import CPU, STAGE_TIME, STAGES, Side
from probe.present.charts.layout import layout, values
from probe.store.documents import LaneDocument

# The stages' colours: the DataLoader workers' in oranges, the main process's in blues (dark to
# light, in `STAGES` order).
WORKER_COLORS = ("#7f2704", "#a63603", "#d94801", "#f16913", "#fd8d3c", "#fdae6b", "#fdd0a2")
MAIN_COLORS = ("#08306b", "#08519c", "#2171b5", "#4292c6", "#6baed6", "#9ecae1", "#c6dbef")
MEASURED_COLOR = "#111111"
SIDE_TITLES = {Side.WORKERS: "DataLoader workers", Side.MAIN: "main process"}


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
                x=values(ms),
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
                x=values(measured),
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
    layout(figure, "Where each image's CPU time goes", height=height)
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
