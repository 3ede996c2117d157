"""What the `probe` command shows on a terminal: tables and verdicts built from documents.

Pure: documents in, rich renderables or lines of text out. Labels, units and formats are those
of `probe.metrics`; every GPU figure says which metric it is: SM activity (GPM), or
kernel-active (NVML utilization.gpu), which overstates busy-ness.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table

from probe.judge.results import Scaling, Session
from probe.lane_figures import LaneFigures
from probe.measure.bench import BenchResult
from probe.metrics import DATA_WAIT, IMAGES_PER_S
from probe.present.doctor_tables import dali_grid, scaling_grid
from probe.present.listing import SessionRow
from probe.present.tables import (
    PIPELINE_ONLY_WAIT,
    Grid,
    lane_grid,
    pipeline_only,
    point_grid,
    point_notes,
    run_wait,
)
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
        f"{run_wait(document)}; "
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


def runs_table(documents: Sequence[RunDocument]) -> Fitted:
    """The newest runs, one row each; data-wait is each run's (its worst lane's). Run ids stay
    whole however narrow the console: where its columns do not fit, each id has the rest of
    its run beside it, in a line that wraps."""
    title = f"Runs ({len(documents)} newest)"
    header = ("run", "created (UTC)", "status", "pipeline", "consumer", "lanes",
              IMAGES_PER_S.heading, DATA_WAIT.heading)  # fmt: skip
    rows = [
        (d.run_id, d.created.replace("T", " ").rstrip("Z"), d.status, d.pipeline, d.consumer,
         lanes_text(d), IMAGES_PER_S.cell(d.images_per_s),
         PIPELINE_ONLY_WAIT if pipeline_only(d.consumer) else DATA_WAIT.cell(d.data_wait_frac))
        for d in documents
    ]  # fmt: skip
    wide, narrow = Table(title=title), Table(title=title)
    for table in (wide, narrow):
        table.add_column("run", **_whole(d.run_id for d in documents))
    for position, column in enumerate(header[1:], 1):
        whole = _whole(row[position] for row in rows) if column in _WHOLE else {}
        wide.add_column(column, justify="right" if column in _NUMERIC else "left", **whole)
    wide.add_column("label", overflow="fold", min_width=LABEL_ROOM)  # free text: gives way first
    narrow.add_column("created (UTC), status; pipeline, consumer, lanes; figures; label")
    for d, row in zip(documents, rows, strict=True):
        wide.add_row(*row, d.label or "")
        label = f"; label {d.label}" if d.label else ""
        narrow.add_row(
            d.run_id,
            f"{row[1]}, {d.status}; {d.pipeline}, consumer {d.consumer}, {row[5]}; "
            f"{IMAGES_PER_S.text(d.images_per_s)}, {DATA_WAIT.label} {row[7]}{label}",
        )
    # the columns' longest words, their padding and rules, and a little room for the label
    needs = sum(3 + max(len(text) if column[0] in _WHOLE else max(map(len, text.split()))
                        for text in column)
                for column in zip(header, *rows, strict=True)) + 4 + LABEL_ROOM  # fmt: skip
    return Fitted(wide, narrow, needs)


def sessions_table(rows: Sequence[SessionRow]) -> Table:
    """The newest doctor and sweep sessions, one row each, with their answers: the verdict (or
    the knee, or why there is none) and the first recommendation."""
    table = Table(title=f"Sessions ({len(rows)} newest)")
    table.add_column("session", **_whole(r.session_id for r in rows))
    table.add_column("created (UTC)", **_whole(r.created for r in rows))
    table.add_column("status")
    table.add_column("answer", overflow="fold", ratio=1)
    table.add_column("first recommendation", overflow="fold", ratio=1)
    for row in rows:
        created = row.created.replace("T", " ").rstrip("Z")
        table.add_row(row.session_id, created, row.status, row.answer, row.recommendation)
    return table


LABEL_ROOM = 14  # columns the label keeps in the wide layout ("num_workers=12" whole)
_WHOLE = frozenset({"created (UTC)"})  # columns kept on one line in the wide layout


class Fitted:
    """A table drawn as it is where the console has the columns it `needs`, else another, of
    fewer columns."""

    def __init__(self, table: Table, narrow: Table, needs: int) -> None:
        self.table, self.narrow, self.needs = table, narrow, needs

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table if self.needs <= options.max_width else self.narrow


def _whole(values: Iterable[str]) -> dict[str, Any]:
    """A column's settings that keep each of `values` (run ids) whole, on one line."""
    return {"no_wrap": True, "min_width": max(map(len, values), default=0)}


def lanes_text(document: RunDocument) -> str:
    gpus = [lane.gpu for lane in document.lanes]
    if all(g is None for g in gpus):
        return f"{len(gpus)} cpu"
    return "gpu " + ",".join(str(g) for g in gpus)


def sweep_table(session: Session) -> Table:
    """A sweep's points (a doctor's too), its knee and what it flagged (what its marks mean,
    and why a setting was not run, under it)."""
    grid = point_grid(session)
    table = Table(title=f"sweep of {session.knob}, consumer {session.consumer}")
    table.caption = "\n".join(["± is the 95% interval of each point's images/s",
                               *point_notes(session)])  # fmt: skip
    for i, column in enumerate(grid.header):
        if column == "run":
            table.add_column(column, **_whole(row[i] for row in grid.rows))
        else:
            table.add_column(column, justify="right" if i in grid.numeric else "left")
    for row in grid.rows:
        table.add_row(*row)
    return table


def scaling_table(scaling: Scaling) -> Table:
    """The job on 1 to N GPUs of one host, each pipeline predicted and measured."""
    title = f"from 1 {scaling.device} to {scaling.lanes}, images/s for the job"
    return _table(scaling_grid(scaling), title)


def dali_table(session: Session) -> Table | None:
    """The DALI settings a doctor's search measured, where it measured more than one."""
    dali = session.dali
    if dali is None or len(dali.tried) < 2:
        return None
    title = "DALI's settings searched (each point chosen by what the points before it measured)"
    return _table(dali_grid(dali, session.devices), title)


def _table(grid: Grid, title: str) -> Table:
    table = Table(title=title)
    for i, column in enumerate(grid.header):
        if column == "run":
            table.add_column(column, **_whole(row[i] for row in grid.rows))
        else:
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
