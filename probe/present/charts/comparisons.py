"""Figures that set results side by side: a sweep's images/s over its settings (`sweep_curve`),
the job's images/s per GPU over its GPUs (`scaling_chart`) and runs compared (`compare_bars`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from probe.judge.results import DALI, TORCH, Scaling, Session
from probe.metrics import (
    CPU,
    DATA_WAIT,
    IMAGES_PER_S,
    KERNEL_ACTIVE,
    SM_ACTIVE,
    Metric,
    busy_metric,
    counted,
)
from probe.present.charts.layout import BUSY_COLOR, PALETTE, WAIT_COLOR, layout
from probe.store.documents import RunBrief


def sweep_curve(session: Session) -> go.Figure:
    """Images/s over a sweep's settings, its knee marked; DALI's measurement as a line."""
    knob = session.knob
    knee = None if session.knee is None else session.knee.setting
    oversubscribed = session.oversubscribed
    dali = session.dali
    # DALI's figure as the session's pages give it: its runs in alternation pooled, where the
    # pairs measured it
    measured = None if dali is None or not dali.judged else session.shown(dali.change.setting)
    dali_images_per_s = None if measured is None else measured.images_per_s
    dali_label = "DALI" if dali is None else dali.change.setting
    if measured is not None and dali is not None and measured.run_ids != (dali.run_id,):
        dali_label = f"{dali_label} ({counted(len(measured.run_ids), 'run')} pooled)"
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
    return layout(figure, f"Sweep of {knob}", height=380)


def scaling_chart(scaling: Scaling) -> go.Figure:
    """Images/s per GPU against the GPUs of one host: each pipeline's prediction as a line,
    what was measured as markers (± 95%); a pipeline whose per-GPU rate falls as GPUs are
    added is short of cores."""
    device = scaling.device
    figure = go.Figure()
    for (key, name), color in zip(((TORCH, "DataLoader"), (DALI, "DALI")), PALETTE, strict=False):
        points = [p for p in scaling.points if p.pipeline == key]
        if not points:
            continue
        figure.add_trace(
            go.Scatter(
                x=[p.gpus for p in points],
                y=[(p.predicted_images_per_s or 0.0) / p.gpus for p in points],
                mode="lines",
                line={"color": color, "dash": "dash"},
                name=f"{name}, predicted",
                hovertemplate=f"{name} predicted: %{{y:,.0f}} images/s per {device}<extra></extra>",
            )
        )
        measured = [p for p in points if p.measured_images_per_s is not None]
        if measured:
            figure.add_trace(
                go.Scatter(
                    x=[p.gpus for p in measured],
                    y=[(p.measured_images_per_s or 0.0) / p.gpus for p in measured],
                    mode="markers",
                    marker={"color": color, "size": 11},
                    error_y={
                        "type": "data",
                        "array": [
                            (p.measured_images_per_s_error or 0.0) / p.gpus for p in measured
                        ],
                    },
                    name=f"{name}, measured",
                    hovertemplate=f"{name} measured: %{{y:,.0f}} images/s per {device}"
                    "<extra></extra>",
                )
            )
    if scaling.consumer_images_per_s:
        figure.add_hline(
            y=scaling.consumer_images_per_s,
            line_dash="dot",
            line_color="#7f7f7f",
            annotation_text=f"the consumer alone: "
            f"{IMAGES_PER_S.text(scaling.consumer_images_per_s)} per {device}",
            annotation_position="top left",
        )
    counts = list(range(1, scaling.lanes + 1))
    figure.update_xaxes(title_text=f"{device}s", tickvals=counts, ticktext=[str(c) for c in counts])
    figure.update_yaxes(title_text=f"images/s per {device}", rangemode="tozero")
    return layout(
        figure,
        f"Images/s per {device} on {scaling.cores:g} core{'' if scaling.cores == 1 else 's'}",
        height=380,
    )


def _side(setting: int | None, settings: Sequence[int]) -> str:
    """Where a label beside `setting` reads: 'right' of the first setting, 'left' of the
    last, 'center' between them."""
    if setting is None or len(settings) < 2:
        return "center"
    if setting == min(settings):
        return "right"
    return "left" if setting == max(settings) else "center"


def bar_names(briefs: Sequence[RunBrief]) -> list[str]:
    """Each run's name on the bars and in the table under them, one per run: its name (its
    label, else its pipeline and its id's tail) with its id's tail where runs shown share that
    name, as the runs of a doctor's alternation do; its whole id where even that is shared."""
    counts = Counter(brief.name for brief in briefs)
    names = [
        brief.name if counts[brief.name] == 1 else f"{brief.name} ({brief.run[-4:]})"
        for brief in briefs
    ]
    return names if len(set(names)) == len(names) else [brief.run for brief in briefs]


def compare_bars(briefs: Sequence[RunBrief]) -> go.Figure:
    """Runs side by side, a bar each: images/s, data-wait (each run's worst lane's), CPU cores,
    and GPU busy-ness where a run has it (runs on the CPU alone get no GPU panel).

    Raises:
        ValueError: a run's data-wait over 100% or its CPU cores over its machine's: a figure
            that cannot be is a fault in it, drawn by no bar.
    """
    _possible(briefs)
    names = bar_names(briefs)
    metrics = {busy_metric(brief.sm_active_source) for brief in briefs} - {None}
    busy = next(iter(metrics)) if len(metrics) == 1 else None
    busy_title = (  # the metrics' names on a line of their own: too long for a half-width title
        f"{busy.title} %"
        if busy
        else f"GPU busy %<br><sup>{SM_ACTIVE.title} or {KERNEL_ACTIVE.title}</sup>"
    )
    titled: list[tuple[str, str, list[float | None]]] = [  # and each one's hover value
        (IMAGES_PER_S.axis, "%{x:,.0f} images/s", [brief.images_per_s for brief in briefs]),
        (DATA_WAIT.axis, "%{x:.1f}%", [_shown(DATA_WAIT, b.data_wait_frac) for b in briefs]),
        (busy_title, "%{x:.1f}%", [brief.sm_active_pct for brief in briefs]),
        (CPU.axis, "%{x:.1f} cores", [brief.cpu_cores for brief in briefs]),
    ]
    if all(brief.sm_active_pct is None for brief in briefs) and not metrics:  # no GPU
        titled = [panel for panel in titled if panel[0] != busy_title]
    # a row a run, its name whole at the left, and a panel a figure beside the others
    figure = make_subplots(
        rows=1,
        cols=len(titled),
        shared_yaxes=True,
        horizontal_spacing=0.04,
        subplot_titles=[title for title, _, _ in titled],
    )
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
    for col, (_, shown, values) in enumerate(titled, 1):
        figure.add_trace(
            go.Bar(
                x=values,
                y=names,
                orientation="h",
                marker_color=colors,
                showlegend=False,
                name="",
                hovertemplate=f"%{{y}}: {shown}<extra></extra>",
            ),
            row=1,
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
                row=1,
                col=col,
            )
    # in the order given, the first at the top; a label that reads as a number stays a name
    figure.update_yaxes(type="category", autorange="reversed", automargin=True)
    figure.update_xaxes(rangemode="tozero")
    machines = [brief.host_cores for brief in briefs if brief.host_cores is not None]
    if machines:  # the cores' axis ends at the machine's: a bar there uses all of them
        figure.update_xaxes(range=[0, max(machines)], row=1, col=len(titled))
    figure = layout(figure, "Runs compared", height=180 + 28 * len(names))
    # a bar's own figure on hover, not its row's; no legend under the plot to leave room for
    return figure.update_layout(hovermode="closest", margin={"b": 50})


def _possible(briefs: Sequence[RunBrief]) -> None:
    """Raises ValueError where a run's figures, as shown (to their last digit), are over what
    can be: its data-wait over all of its time, its CPU over its machine's cores."""
    for brief in briefs:
        wait = _shown(DATA_WAIT, brief.data_wait_frac)
        if wait is not None and round(wait, DATA_WAIT.digits) > 100:
            raise ValueError(
                f"run {brief.run} reads a data-wait of {DATA_WAIT.text(brief.data_wait_frac)}, "
                "over all of its time: its figures are wrong, and no bar draws them"
            )
        cores, host = brief.cpu_cores, brief.host_cores
        if cores is not None and host is not None and round(cores, CPU.digits) > host:
            raise ValueError(
                f"run {brief.run} reads {cores:.{CPU.digits}f} CPU cores on a machine of "
                f"{host:g}: its figures are wrong, and no bar draws them"
            )


def _shown(metric: Metric, value: float | None) -> float | None:
    return None if value is None else value * metric.scale
