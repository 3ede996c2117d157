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

from probe.measure.bench import BenchResult
from probe.metrics import CPU, DATA_WAIT, IMAGES_PER_S, LaneFigures
from probe.present.tables import epochs_lines, headline, lane_grid
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


def diagnosis_lines(
    verdict: dict[str, Any], recommendations: Sequence[dict[str, Any]]
) -> list[str]:
    """A verdict with its evidence, then the recommendations, ranked."""
    head = f"verdict: {headline(verdict)}"
    lines = [head] + [f"  - {item['text']}" for item in verdict["evidence"]]
    if recommendations:
        lines.append("recommendations:")
    for rank, item in enumerate(recommendations, 1):
        predicted = item["predicted_images_per_s"]
        line = f"  {rank}. {item['setting']}: {item['action']}"
        if predicted is not None:
            shown = IMAGES_PER_S.cell(predicted, item.get("predicted_error"))
            line += f"; predicted {shown} images/s ({item['basis']})"
        else:
            line += f" ({item['basis']})"
        if item.get("measured_images_per_s") is not None:
            measured = item["measured_images_per_s"]
            change = f" ({measured / predicted - 1:+.1%})" if predicted else ""
            line += f"; verified: {measured:,.0f} images/s{change}"
        lines.append(line)
        lines += [f"     {note}" for note in item.get("notes", ())]
    return lines


def sweep_table(points: Sequence[dict[str, Any]], knob: str, document: dict[str, Any]) -> Table:
    """A sweep's points, its knee and what it flagged."""
    knee = (document.get("knee") or {}).get(knob)
    best = (document.get("best") or {}).get(knob)
    over = set(document.get("oversubscribed", []))
    table = Table(title=f"sweep of {knob}, consumer {document['consumer']}")
    table.caption = "± is the 95% interval of each point's images/s"
    for column in (knob, IMAGES_PER_S.heading, DATA_WAIT.heading, CPU.heading, "", "run"):
        table.add_column(column, justify="left" if column in ("", "run") else "right")
    for point in points:
        marks = []
        if point[knob] == knee:
            marks.append("knee")
        if point[knob] == best:
            marks.append("best")
        if point[knob] in over:
            marks.append("oversubscribed: slower than the best")
        if point.get("host_busy"):
            marks.append("the host was busy: not trusted")
        table.add_row(
            str(point[knob]),
            IMAGES_PER_S.cell(point["images_per_s"], point.get("images_per_s_error")),
            DATA_WAIT.cell(point["data_wait_frac"], point.get("data_wait_frac_error")),
            CPU.cell(point.get("cpu_pct")),
            ", ".join(marks),
            point["run_id"] or "",
        )
    for item in document.get("skipped", []):
        table.add_row(str(item["setting"]), "-", "-", "-", f"not run: {item['reason']}", "")
    return table


def doctor_lines(document: dict[str, Any]) -> list[str]:
    """The doctor's answer: verdict, DALI, the epoch reading, recommendations and
    verification, as text."""
    lines = diagnosis_lines(document["verdict"], document["recommendations"])
    dali = document["dali"]
    if dali["images_per_s"] is not None:
        shown = IMAGES_PER_S.cell(dali["images_per_s"], dali.get("images_per_s_error"))
        dali_line = f"DALI ({dali['setting']}): {shown} images/s"
        dali_line += f", data-wait {DATA_WAIT.cell(dali['data_wait_frac'])}"
        lines.append(dali_line + (f": {dali['advice']}" if dali.get("advice") else ""))
    else:
        lines.append(f"DALI: not measured: {dali['reason']}")
    lines += epochs_lines(document.get("epochs"))
    verify = document.get("verify")
    if verify is None:
        lines.append("not verified: the budget ran out, the run was stopped, or nothing to run")
    elif verify["error_frac"] is not None:
        agrees = (
            "within their errors and the drift between runs"
            if verify.get("agrees")
            else "more than their errors and the drift between runs"
        )
        predicted = IMAGES_PER_S.cell(
            verify["predicted_images_per_s"], verify.get("predicted_images_per_s_error")
        )
        measured = IMAGES_PER_S.cell(
            verify["measured_images_per_s"], verify.get("measured_images_per_s_error")
        )
        lines.append(
            f"verified {verify['setting']}: predicted {predicted}, measured {measured} images/s "
            f"({verify['error_frac']:+.1%}: {agrees}; run {verify['run_id']})"
        )
    start = document.get("startup_s")
    if start:
        lines.append(
            f"the lanes started, with the consumer tuned and timed alone, in {start:.1f} s"
        )
    if document.get("consumer_note"):
        lines.append(f"consumer: {document['consumer_note']}")
    return lines


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
