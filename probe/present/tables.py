"""The tables and headlines every output shows alike: the terminal, the reports (Markdown and
HTML) and the dashboard build theirs from these, so that a figure reads the same everywhere.

Pure: documents in, headers and text cells out (no markup: each output escapes and draws them).
Labels, units and formats are those of `probe.metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probe.metrics import (
    CPU,
    DATA_WAIT,
    IMAGES_PER_S,
    KERNEL_ACTIVE,
    LATENCY,
    LaneFigures,
    busy_metric,
)
from probe.store.documents import LaneDocument, RunBrief, RunDocument


@dataclass(frozen=True)
class Grid:
    """A table: its header, its rows of text cells, and which columns hold numbers."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: frozenset[int]

    def records(self) -> list[dict[str, str]]:
        """One dict per row, keyed by the header (a dashboard's data frame)."""
        return [dict(zip(self.header, row, strict=True)) for row in self.rows]


LATENCY_HEADING = f"{LATENCY.label} p50/p95/p99 {LATENCY.unit}"


def lane_grid(document: RunDocument) -> Grid:
    """One row per lane of a run: where it ran, its steady figures with their errors, its GPU
    busy-ness (labelled with its metric) and the CPU cores its processes used."""
    header = ("lane", "device", "shard", "status", "batches", IMAGES_PER_S.heading,
              DATA_WAIT.heading, LATENCY_HEADING, "GPU busy", CPU.heading, "reason")  # fmt: skip
    rows = []
    for lane in document.lanes:
        figures = lane.figures
        latency = figures.batch_latency_ms
        rows.append(
            (
                str(lane.lane),
                lane.device,
                f"{lane.shard_id}/{lane.num_shards}",
                lane.status,
                str(figures.batches),
                IMAGES_PER_S.cell(figures.images_per_s, figures.images_per_s_error),
                DATA_WAIT.cell(figures.data_wait_frac, figures.data_wait_frac_error),
                "/".join(LATENCY.number(v) for v in (latency.p50, latency.p95, latency.p99)),
                gpu_busy(figures),
                CPU.cell(figures.cpu_pct),
                lane.reason or "",
            )
        )
    return Grid(header, tuple(rows), frozenset({0, 4, 5, 6, 7, 9}))


def brief_grid(briefs: Sequence[RunBrief]) -> Grid:
    """Runs side by side: each run's images/s, data-wait (its worst lane's), GPU busy-ness and
    CPU cores."""
    header = ("run", "setting", "pipeline", IMAGES_PER_S.heading, DATA_WAIT.heading,
              "GPU busy %", "GPU busy metric", CPU.heading)  # fmt: skip
    rows = tuple(
        (
            b.run,
            b.label or "",
            b.pipeline,
            IMAGES_PER_S.cell(b.images_per_s, b.images_per_s_error),
            DATA_WAIT.cell(b.data_wait_frac),
            busy.number(b.sm_active_pct) if (busy := busy_metric(b.sm_active_source)) else "-",
            busy.title if busy else "-",
            CPU.cell(None if b.cpu_cores is None else b.cpu_cores / CPU.scale),
        )
        for b in briefs
    )
    return Grid(header, rows, frozenset({3, 4, 5, 7}))


def recommendation_grid(recommendations: Sequence[Mapping[str, Any]]) -> Grid:
    """Ranked recommendations: the change, what it is, predicted and verified images/s, and how
    the prediction was made."""
    header = ("#", "change", "what", "predicted images/s", "verified images/s", "basis")
    rows = tuple(
        (
            str(rank),
            str(item["setting"]),
            str(item["action"]),
            IMAGES_PER_S.cell(item["predicted_images_per_s"], item.get("predicted_error")),
            IMAGES_PER_S.cell(item.get("measured_images_per_s")),
            "; ".join([str(item["basis"]), *item.get("notes", ())]),
        )
        for rank, item in enumerate(recommendations, 1)
    )
    return Grid(header, rows, frozenset({0, 3, 4}))


def gpu_busy(figures: LaneFigures) -> str:
    """A lane's GPU busy-ness, labelled with its metric: SM activity (GPM) with NVML's
    kernel-active beside it, or kernel-active alone where there is no GPM."""
    busy = figures.busy
    if busy is None:
        return "-"
    shown = f"{busy.label} {busy.text(figures.sm_active_pct)} ({busy.source.value})"
    if busy is not KERNEL_ACTIVE and figures.kernel_active_pct is not None:
        kernel = KERNEL_ACTIVE.text(figures.kernel_active_pct)
        shown += f", {KERNEL_ACTIVE.label} {kernel} ({KERNEL_ACTIVE.source.value})"
    return shown


def headline(verdict: Mapping[str, Any]) -> str:
    """A verdict in one line: its title, severity and data-wait, and whether it is partial or
    not trusted."""
    text = str(verdict["title"])
    if verdict["severity"] != "none":
        wait = DATA_WAIT.text(verdict["data_wait_frac"])
        text += f" ({verdict['severity']}: {DATA_WAIT.label} {wait})"
    if verdict.get("partial"):
        text += " - partial: the run did not complete"
    if verdict.get("reliable") is False:
        text += " - not trusted: the host was busy"
    return text


def run_notes(document: RunDocument) -> list[str]:
    """How it read and warmed up, the transients, lane failures, skipped files, the consumer's
    note and unavailable metrics."""
    notes = []
    config = document.config
    read = config.get("read")
    if read:
        per_epoch = sorted({lane.get("batches_per_epoch") for lane in config.get("lanes", [])}
                           - {None})  # fmt: skip
        epochs = f", {'/'.join(map(str, per_epoch))} batches per epoch" if per_epoch else ""
        notes.append(f"read: {'one endless stream' if read == 'stream' else 'epoch by epoch'}"
                     f"{epochs}")  # fmt: skip
    for lane in document.lanes:
        notes += _transients(lane)
        if lane.reason:
            notes.append(f"lane {lane.lane}: {lane.status}: {lane.reason}")
        if lane.figures.skipped_files:
            notes.append(
                f"lane {lane.lane}: skipped {lane.figures.skipped_files} undecodable files"
            )
    if config.get("consumer_note"):
        notes.append(f"consumer: {config['consumer_note']}")
    unavailable: dict[str, set[str]] = {}
    for item in document.unavailable_metrics:
        unavailable.setdefault(item["reason"], set()).add(item["metric"])
    notes += [f"unavailable: {', '.join(sorted(m))}: {r}" for r, m in unavailable.items()]
    if document.status == "running":
        notes.append("the run is still going: figures so far")
    return notes


def _transients(lane: LaneDocument) -> list[str]:
    """A lane's start-up, warm-up, epoch starts and consumer alone: measured, and apart from
    its steady figures."""
    figures = lane.figures
    parts = []
    if figures.startup_s:
        parts.append(f"its process started in {figures.startup_s:.1f} s")
    if figures.build_s:
        parts.append(f"the pipeline built in {figures.build_s:.1f} s")
    if figures.warmup_batches:
        settled = ", not settled" if figures.warmup_settled is False else ""
        parts.append(f"warm-up {figures.warmup_batches} batches, {figures.warmup_s:.1f} s{settled}")
    if figures.capped:
        parts.append("measuring stopped at its time limit before images/s was as precise")
    out = [f"lane {lane.lane}: " + "; ".join(parts)] if parts else []
    start = figures.epoch_start
    if start:
        split = ""
        if start.loader_start_ms is not None and start.refill_ms is not None:
            split = (
                f" ({start.loader_start_ms:,.0f} ms starting the loader, "
                f"{start.refill_ms:,.0f} ms refilling its prefetch)"
            )
        out.append(
            f"lane {lane.lane}: {start.starts} epoch starts, {start.stall_ms:,.0f} ms "
            f"each{split}: {start.share:.1%} of the time"
        )
    alone = figures.consumer_alone
    if alone and alone.get("images_per_s"):
        tuned = f" (tuned first, in {alone['tune_s']:.1f} s)" if alone.get("tune_s") else ""
        rate = IMAGES_PER_S.text(alone["images_per_s"], alone.get("images_per_s_error"))
        out.append(
            f"lane {lane.lane}: the consumer alone{tuned}, on batches already on the device: {rate}"
        )
    return out


def epochs_lines(epochs: dict[str, Any] | None) -> list[str]:
    """Your setting read epoch by epoch, against the same read as one stream."""
    if not epochs:
        return []
    if epochs.get("images_per_s") is None:
        return [f"epoch by epoch: not measured: {epochs.get('reason')}"]
    shown = IMAGES_PER_S.cell(epochs["images_per_s"], epochs.get("images_per_s_error"))
    line = (
        f"epoch by epoch ({epochs['setting']}, {epochs['batches_per_epoch']} batches per epoch, "
        f"as a `for` loop per epoch reads it): {shown} images/s"
    )
    if epochs.get("cost_frac") is not None:
        line += f", {epochs['cost_frac']:.1%} below the same read as one stream"
    start = epochs.get("epoch_start")
    if start:
        line += f"; each epoch start {start['stall_ms']:,.0f} ms, {start['share']:.1%} of the time"
    return [line]
