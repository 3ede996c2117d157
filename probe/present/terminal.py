"""What the `probe` command shows on a terminal: tables and verdicts built from documents.

Pure: documents in, rich renderables or lines of text out. Labels, units and formats are those
of `probe.metrics`; every GPU figure says which metric it is: SM activity (GPM), or
kernel-active (NVML utilization.gpu), which overstates busy-ness.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from probe.judge.results import Session
from probe.measure.bench import BenchResult
from probe.metrics import DATA_WAIT, IMAGES_PER_S, LaneFigures
from probe.present.tables import lane_grid, point_grid
from probe.store.documents import RunDocument


def live_table(lanes: Sequence[Any]) -> Table:
    """The lanes of a run in progress (`LaneLive`), over the last 3 s."""
    now_ns = time.monotonic_ns()
    table = Table(title="live (last 3 s)", title_justify="left")
    for column in ("lane", "device", "shard", "state", "batches", IMAGES_PER_S.heading,
                   DATA_WAIT.heading):  # fmt: skip
        table.add_column(column, justify="right" if column in _NUMERIC else "left")
    for lane in lanes:
        state = lane.state
        if state == "warming up":
            state = f"warming up ({lane.warmup_batches})"
        table.add_row(
            str(lane.lane), lane.device, lane.shard, state, str(lane.batches),
            IMAGES_PER_S.cell(lane.images_per_s(now_ns)),
            DATA_WAIT.cell(lane.data_wait_frac(now_ns)),
        )  # fmt: skip
    return table


def run_table(document: RunDocument) -> Table:
    """One row per lane of a run."""
    grid = lane_grid(document)
    table = Table(
        title=f"run {document.run_id}: {document.pipeline}, consumer {document.consumer} "
        f"({document.status})",
        caption=f"all lanes: {IMAGES_PER_S.text(document.images_per_s)}, "
        f"{DATA_WAIT.label} {DATA_WAIT.text(document.data_wait_frac)} (the worst lane's); "
        "± is the 95% interval; warm-up batches excluded",
    )
    shown = [i for i, column in enumerate(grid.header) if column != "reason"]
    for i in shown:
        table.add_column(grid.header[i], justify="right" if i in grid.numeric else "left")
    for row in grid.rows:
        table.add_row(*(row[i] for i in shown))
    return table


def run_line(document: RunDocument) -> str:
    """One run in a line: images/s with its error, its data-wait, what it took."""
    wait = document.data_wait_frac
    waited = "" if wait is None else f", {DATA_WAIT.label} {DATA_WAIT.text(wait)}"
    took = ""
    first = document.lanes[0].figures if document.lanes else LaneFigures()
    if first.seconds:
        took = f"; {first.seconds:.1f} s measured after {first.warmup_s:.1f} s of warm-up"
    if first.startup_s:
        took += f" and {first.startup_s:.1f} s to start the lane"
    rate = IMAGES_PER_S.text(document.images_per_s, document.images_per_s_error)
    return f"{rate}{waited} ({document.status}, run {document.run_id}{took})"


def runs_table(documents: Sequence[RunDocument]) -> Table:
    """The newest runs, one row each; data-wait is each run's (its worst lane's)."""
    table = Table(title=f"Runs ({len(documents)} newest)")
    for column in ("run", "created (UTC)", "status", "pipeline", "consumer", "lanes",
                   IMAGES_PER_S.heading, DATA_WAIT.heading, "label"):  # fmt: skip
        table.add_column(column, justify="right" if column in _NUMERIC else "left",
                         no_wrap=column == "run")  # fmt: skip
    for d in documents:
        table.add_row(
            d.run_id, d.created.replace("T", " ").rstrip("Z"), d.status, d.pipeline,
            d.consumer, lanes_text(d), IMAGES_PER_S.cell(d.images_per_s),
            DATA_WAIT.cell(d.data_wait_frac), d.label or "",
        )  # fmt: skip
    return table


def lanes_text(document: RunDocument) -> str:
    gpus = [lane.gpu for lane in document.lanes]
    if all(g is None for g in gpus):
        return f"{len(gpus)} cpu"
    return "gpu " + ",".join(str(g) for g in gpus)


def sweep_table(session: Session) -> Table:
    """A sweep's points (a doctor's too), its knee and what it flagged."""
    grid = point_grid(session)
    table = Table(title=f"sweep of {session.knob}, consumer {session.consumer}")
    table.caption = "± is the 95% interval of each point's images/s"
    for i, column in enumerate(grid.header):
        table.add_column(column, justify="right" if i in grid.numeric else "left")
    for row in grid.rows:
        table.add_row(*row)
    return table


def bench_table(results: Sequence[BenchResult]) -> Table:
    table = Table(title="Input pipelines alone (no consumer), warm-up excluded")
    for column in ("pipeline", "device", "settings", "batches", "images/s",
                   "batch p50 ms", "batch p95 ms", "start-up s"):  # fmt: skip
        left = column in ("pipeline", "device", "settings")
        table.add_column(column, justify="left" if left else "right")
    for r in results:
        table.add_row(
            r.backend.value, r.device, r.settings, str(r.batches), f"{r.images_per_s:,.0f}",
            f"{r.batch_interval_ms_p50:.1f}", f"{r.batch_interval_ms_p95:.1f}",
            f"{r.startup_s:.1f}",
        )  # fmt: skip
    if len(results) == 2 and results[0].images_per_s > 0:
        ratio = results[1].images_per_s / results[0].images_per_s
        table.caption = f"{results[1].backend.value} / {results[0].backend.value}: {ratio:.2f}x"
    return table


_NUMERIC = {"batches", IMAGES_PER_S.heading, DATA_WAIT.heading}
