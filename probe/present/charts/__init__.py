"""Plotly figures of runs, sweeps and comparisons: data in, figure out (nothing is shown here).

The dashboard and the exported reports draw with these: a run's timelines and phases (`runs`),
where its CPU time goes (`stages`), a sweep's curve and runs compared (`comparisons`), on the
look they share (`layout`); an HTML page draws them offline (`page`). Every busy-ness axis says
which metric it is: SM activity (GPM), or kernel-active (NVML utilization.gpu), which overstates
busy-ness. Downsampled series are drawn as a band from each bucket's minimum to its maximum, with
the mean as a line: peaks and dips stay visible however long the run.

Where a chart needs a sentence under it, it is made here too (`slowest_line`, `stage_line`), so
that the dashboard and the reports say the same.
"""

from probe.present.charts.comparisons import (
    bar_names,
    compare_bars,
    scaling_chart,
    sweep_curve,
)
from probe.present.charts.page import CHART_CLASS, PLOTLY_BUNDLE, html_div, page_script
from probe.present.charts.runs import (
    CAPACITY_WAIT,
    SLOWEST_TITLE,
    STARTUP,
    STARTUP_AND_WARMUP,
    TIME_AXIS,
    WARMUP,
    WORST_WAIT,
    Phase,
    cpu_heat_strip,
    gpu_timelines,
    lane_timelines,
    run_figures,
    run_phases,
    slowest_line,
    throughput_timelines,
)
from probe.present.charts.stages import MAIN_COLORS, WORKER_COLORS, stage_bars, stage_line

__all__ = [
    "CAPACITY_WAIT",
    "CHART_CLASS",
    "MAIN_COLORS",
    "PLOTLY_BUNDLE",
    "SLOWEST_TITLE",
    "STARTUP",
    "STARTUP_AND_WARMUP",
    "TIME_AXIS",
    "WARMUP",
    "WORKER_COLORS",
    "WORST_WAIT",
    "Phase",
    "bar_names",
    "compare_bars",
    "cpu_heat_strip",
    "gpu_timelines",
    "html_div",
    "lane_timelines",
    "page_script",
    "run_figures",
    "run_phases",
    "scaling_chart",
    "slowest_line",
    "stage_bars",
    "stage_line",
    "sweep_curve",
    "throughput_timelines",
]
