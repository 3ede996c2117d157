"""A stored run read as one typed document: its record, its lanes and their figures
(`probe.lane_figures.LaneFigures`), and its run-level figures by the rule of `probe.metrics`.

`read_run` is what the judging and presenting layers read; `RunDocument.to_json()` is the run's
JSON (schema `feedscope.run/1`), made only where it leaves the program: `--json`, reports, the
dashboard's downloads. `RunBrief` is a run's headline figures, to compare runs side by side.
`lane_figures_from_store` computes a lane's figures from its events and samples: what a lane
stores as its summary when it ends.

A lane that stored no figures (still running, or stopped before it could) has them computed
from its raw rows while they are few (`RAW_MAX_BATCHES`, `RAW_MAX_S`), else from the rollups
(`lane_figures_from_rollups`), a bounded number of rows: its counts, images/s, data-wait, wall
time and the GPU figures of its window as the raw rows give them; its percentiles from the
batches' duration bins (within 0.05% and half a microsecond); the errors of images/s and
data-wait from blocks of whole seconds rather than of batches (the same ratio estimator on
blocks of the same number of batches, about); its CPU figures the mean of its window's samples,
not over its batches' time alone: the rollups keep each second's samples, not what of their
intervals the batches hold, so the time outside the loop's iteration (a validation between
epochs) is in them until the lane stores its own when it ends; no epoch-start cost, which needs
the batches one by one (the lane computes it when it ends).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probe.lane_figures import LaneFigures, Reading, lane_figures
from probe.metrics import CPU, DATA_WAIT, IMAGES_PER_S, Percentiles, errors_added
from probe.records import LaneRecord, RunRecord
from probe.steady import MAX_BLOCKS, block_batches, steady_ratio
from probe.store.db import Store
from probe.store.rollups import GPU, LANE_CPU, RESOLUTIONS_S, Totals, bin_width_us

RUN_SCHEMA = "feedscope.run/1"
RAW_MAX_BATCHES = 20_000  # a lane without stored figures has them from its raw rows up to this
RAW_MAX_S = 600.0  # ... and a measured window up to this long


@dataclass(frozen=True)
class LaneDocument:
    """One lane of a run: where it ran, how it ended, and its figures."""

    lane: int
    gpu: int | None  # CUDA index; None: the CPU
    gpu_uuid: str | None
    shard_id: int
    num_shards: int
    hostname: str
    status: str
    reason: str | None
    figures: LaneFigures
    traceback: str | None = None  # a failed lane's, whole

    @property
    def device(self) -> str:
        return "cpu" if self.gpu is None else f"cuda:{self.gpu}"

    def to_json(self) -> dict[str, Any]:
        return {
            "lane": self.lane, "gpu": self.gpu, "gpu_uuid": self.gpu_uuid,
            "shard_id": self.shard_id, "num_shards": self.num_shards, "hostname": self.hostname,
            "status": self.status, "reason": self.reason, "traceback": self.traceback,
            **self.figures.to_json(),
        }  # fmt: skip


@dataclass(frozen=True)
class RunDocument:
    """A run, its lanes and its run-level figures."""

    run_id: str
    kind: str  # "probe" or "watch"
    status: str
    reason: str | None
    created: str
    label: str | None
    pipeline: str
    consumer: str
    seconds: float | None  # from its start to its end
    config: Mapping[str, Any]
    host: Mapping[str, Any]
    samples: Mapping[str, int]  # how many GPU and host samples it holds
    unavailable_metrics: tuple[Mapping[str, Any], ...]
    lanes: tuple[LaneDocument, ...]

    @property
    def images_per_s(self) -> float:
        return IMAGES_PER_S.of_run(x.figures.images_per_s for x in self.lanes) or 0.0

    @property
    def images_per_s_error(self) -> float | None:
        return errors_added(x.figures.images_per_s_error for x in self.lanes)

    @property
    def data_wait_frac(self) -> float | None:
        """The run's data-wait: its worst lane's (DDP waits for the slowest rank)."""
        return DATA_WAIT.of_run(x.figures.data_wait_frac for x in self.lanes)

    @property
    def worst_lane(self) -> LaneDocument | None:
        """The lane whose data-wait is the run's."""
        waited = [x for x in self.lanes if x.figures.data_wait_frac is not None]
        return max(waited, key=lambda x: x.figures.data_wait_frac or 0.0, default=None)

    @property
    def cpu_pct(self) -> float | None:
        """Its lanes' processes together, in % of one core."""
        return CPU.of_run(x.figures.cpu_pct for x in self.lanes)

    @property
    def name(self) -> str:
        return self.label or f"{self.pipeline} {self.run_id[-4:]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA,
            "run_id": self.run_id,
            "kind": self.kind,
            "status": self.status,
            "reason": self.reason,
            "created": self.created,
            "label": self.label,
            "pipeline": self.pipeline,
            "consumer": self.consumer,
            "images_per_s": self.images_per_s,
            "images_per_s_error": self.images_per_s_error,
            "data_wait_frac": self.data_wait_frac,
            "seconds": self.seconds,
            "config": dict(self.config),
            "host": dict(self.host),
            "samples": dict(self.samples),
            "unavailable_metrics": [dict(u) for u in self.unavailable_metrics],
            "lanes": [lane.to_json() for lane in self.lanes],
        }


@dataclass(frozen=True)
class RunBrief:
    """A run's headline figures, for comparing runs side by side: images/s (its error the
    lanes' added in quadrature), the run's data-wait (the worst lane's), the lanes' mean GPU
    busy-ness (and its metric, where all lanes share one), the CPU cores its lanes used and
    the cores of the machine they ran on (None: on several machines, or not recorded)."""

    run: str
    name: str
    label: str | None
    pipeline: str
    consumer: str
    status: str
    images_per_s: float
    images_per_s_error: float | None
    data_wait_frac: float | None
    sm_active_pct: float | None
    sm_active_source: str | None
    cpu_cores: float | None
    host_cores: float | None

    @classmethod
    def of(cls, document: RunDocument) -> RunBrief:
        figures = [lane.figures for lane in document.lanes]
        sources = {f.sm_active_source for f in figures} - {None}
        busy = [f.sm_active_pct for f in figures if f.sm_active_pct is not None]
        cpu = document.cpu_pct
        one_host = {lane.hostname for lane in document.lanes} <= {document.host.get("hostname")}
        cores = document.host.get("cpus")
        return cls(
            run=document.run_id,
            name=document.name,
            label=document.label,
            pipeline=document.pipeline,
            consumer=document.consumer,
            status=document.status,
            images_per_s=document.images_per_s,
            images_per_s_error=document.images_per_s_error,
            data_wait_frac=document.data_wait_frac,
            sm_active_pct=sum(busy) / len(busy) if busy else None,
            sm_active_source=sources.pop() if len(sources) == 1 else None,
            cpu_cores=None if cpu is None else cpu * CPU.scale,
            host_cores=float(cores) if cores and one_host else None,
        )

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def lane_figures_from_store(
    store: Store, run: RunRecord, lane: LaneRecord, starts: Sequence[Sequence[int]] | None = None
) -> LaneFigures:
    """A lane's figures, computed from its events and the samples of its measured window."""
    events = store.batches(run.run_id, lane.lane)
    measured = store.batch_totals(run.run_id, lane.lane)
    gpu, cpu = [], []
    if measured.first_ns is not None and measured.end_ns is not None:
        window = (measured.first_ns, measured.end_ns)
        gpu = store.gpu_samples(run.run_id, lane.gpu_uuid, window) if lane.gpu_uuid else []
        cpu = store.lane_cpu(run.run_id, lane.lane, window)
    return lane_figures(events, gpu, cpu, reading=Reading.of(run), starts=starts)


def lane_figures_of(store: Store, run: RunRecord, lane: LaneRecord) -> LaneFigures:
    """A lane's figures: those it stored when it ended, else computed from its rows while
    they are few, else from the rollups."""
    if lane.summary is not None:
        return LaneFigures.from_json(lane.summary)
    measured = store.batch_totals(run.run_id, lane.lane)
    warmup = store.batch_totals(run.run_id, lane.lane, warmup=True)
    long = (
        measured.first_ns is not None
        and measured.end_ns is not None
        and (measured.end_ns - measured.first_ns > RAW_MAX_S * 1e9)
    )
    if measured.batches + warmup.batches <= RAW_MAX_BATCHES and not long:
        return lane_figures_from_store(store, run, lane)
    return lane_figures_from_rollups(store, run, lane)


def lane_figures_from_rollups(store: Store, run: RunRecord, lane: LaneRecord) -> LaneFigures:
    """A lane's figures from the rollups (what they give and how closely: the module's
    docstring)."""
    measured = store.batch_totals(run.run_id, lane.lane)
    warmup = store.batch_totals(run.run_id, lane.lane, warmup=True)
    counts = LaneFigures(
        warmup_batches=warmup.batches,
        warmup_s=warmup.seconds,
        batches=measured.batches,
        images=measured.images,
    )
    if measured.first_ns is None or measured.end_ns is None:
        return counts
    window = (measured.first_ns, measured.end_ns)
    size = block_batches(Reading.of(run).loaders, measured.batches)
    blocks = _time_blocks(store, run.run_id, lane.lane, window, size)
    rate = steady_ratio([(images, seconds) for images, _, seconds in blocks])
    wait = steady_ratio([(waited, seconds) for _, waited, seconds in blocks])
    gpu = store.totals(GPU, run.run_id, lane.gpu_uuid, window, then=True) if lane.gpu_uuid else {}
    cpu = store.totals(LANE_CPU, run.run_id, lane.lane, window, then=True)
    sm_active, kernel_active = _mean(gpu, "sm_active_pct"), _mean(gpu, "kernel_active_pct")
    source = "gpm" if sm_active is not None else "nvml" if kernel_active is not None else None
    latency = _Binned(store, run.run_id, lane.lane, "latency", measured.batches)
    step = _Binned(store, run.run_id, lane.lane, "step", measured.batches)
    wait_ms = _Binned(store, run.run_id, lane.lane, "wait", measured.batches)
    memory, pss, threads = gpu.get("memory_used_mib"), cpu["pss_mib"], cpu["worker_threads"]
    return LaneFigures(
        warmup_batches=counts.warmup_batches,
        warmup_s=counts.warmup_s,
        batches=counts.batches,
        images=counts.images,
        seconds=measured.seconds,
        images_per_s=rate.value,
        images_per_s_error=rate.error,
        data_wait_frac=min(1.0, wait.value),
        data_wait_frac_error=wait.error,
        blocks=rate.blocks,
        batch_latency_ms=latency.percentiles(),
        wait_ms_p50=wait_ms.median(),
        step_ms_p50=step.median(),
        step_ms_p50_error=step.median_error(),
        sm_active_pct=sm_active if sm_active is not None else kernel_active,
        sm_active_source=source,
        kernel_active_pct=kernel_active,
        sm_occupancy_pct=_mean(gpu, "sm_occupancy_pct"),
        nvjpg_pct=_mean(gpu, "nvjpg_pct"),
        memory_used_mib=None if memory is None else memory.high,
        cpu_pct=_mean(cpu, "cpu_pct"),
        main_thread_cpu_pct=_mean(cpu, "main_thread_cpu_pct"),
        pss_mib=pss.high,
        worker_threads=None if threads.high is None else int(threads.high),
        wall_s=(measured.end_ns - measured.first_ns) / 1e9,
    )


def _mean(totals: Mapping[str, Totals], name: str) -> float | None:
    found = totals.get(name)
    return None if found is None else found.mean


def _time_blocks(
    store: Store, run_id: str, lane: int, window: tuple[int, int], size: int
) -> list[tuple[int, float, float]]:
    """A lane's measured batches in consecutive blocks of whole seconds (of the coarsest
    resolution that gives MAX_BLOCKS buckets over the window), each with at least `size`
    batches (`probe.steady.block_batches`), a last short one joined to the one before, at most
    MAX_BLOCKS (neighbours joined evenly), as `probe.steady.blocks` cuts batches: images, wait
    and seconds of each."""
    length_s = (window[1] - window[0]) / 1e9
    res_s = next((r for r in reversed(RESOLUTIONS_S) if length_s / r >= MAX_BLOCKS), 1)
    rows = store.query(
        "SELECT batches, images, wait_s, seconds FROM batch_rollup "
        "WHERE run_id = ? AND res_s = ? AND warmup = 0 AND lane = ? ORDER BY bucket",
        (run_id, res_s, lane),
    )
    blocks: list[list[float]] = []
    for row in rows:
        if not blocks or blocks[-1][0] >= size:
            blocks.append([0, 0, 0.0, 0.0])
        blocks[-1] = [a + b for a, b in zip(blocks[-1], row, strict=True)]
    if len(blocks) > 1 and blocks[-1][0] < size:
        last = blocks.pop()
        blocks[-1] = [a + b for a, b in zip(blocks[-1], last, strict=True)]
    if len(blocks) > MAX_BLOCKS:
        edges = [round(i * len(blocks) / MAX_BLOCKS) for i in range(MAX_BLOCKS + 1)]
        blocks = [
            [sum(column) for column in zip(*blocks[a:b], strict=True)]
            for a, b in itertools.pairwise(edges)
        ]
    return [(int(images), waited, seconds) for _, images, waited, seconds in blocks]


class _Binned:
    """A lane's measured batches' latencies, waits or steps (ms) by rank, read from their
    `batch_bins` bins (each value the middle of its bin); the percentiles and median error as
    `probe.metrics.percentiles` and `median_error` take them from the sorted values."""

    def __init__(self, store: Store, run_id: str, lane: int, kind: str, count: int) -> None:
        n = self.count = count
        reach = 1.96 * math.sqrt(n) / 2
        self.cuts = [divmod(i * (n - 1), 100) for i in (95, 99)]
        self.spread = (
            max(0, math.floor(n / 2 - reach) - 1),
            min(n - 1, math.ceil(n / 2 + reach) - 1),
        )
        ranks = [(n - 1) // 2, n // 2, *self.spread, *(j + k for j, _ in self.cuts for k in (0, 1))]
        keys = store.batch_ranks(run_id, lane, kind, [r for r in ranks if 0 <= r < n])
        self.at = {rank: (key + (bin_width_us(key) - 1) / 2) / 1e3 for rank, key in keys.items()}

    def median(self) -> float | None:
        n = self.count
        return (self.at[(n - 1) // 2] + self.at[n // 2]) / 2 if n else None

    def percentiles(self) -> Percentiles:
        if self.count < 2:
            median = self.median()
            return Percentiles(median, median, median)
        at = self.at
        p95, p99 = ((at[j] * (100 - d) + at[j + 1] * d) / 100 for j, d in self.cuts)
        return Percentiles(self.median(), p95, p99)

    def median_error(self) -> float | None:
        if self.count < 10:
            return None
        (low, high), median = self.spread, self.median() or 0.0
        return max(median - self.at[low], self.at[high] - median)


def read_run(store: Store, run_id: str) -> RunDocument:
    """A stored run as a document (`run_id`: its id, a unique start of it, or `last`)."""
    run = store.run(run_id)
    lanes = tuple(
        LaneDocument(
            lane=lane.lane,
            gpu=lane.gpu_index,
            gpu_uuid=lane.gpu_uuid,
            shard_id=lane.shard_id,
            num_shards=lane.num_shards,
            hostname=lane.hostname,
            status=lane.status.value,
            reason=lane.reason,
            figures=lane_figures_of(store, run, lane),
            traceback=lane.traceback,
        )
        for lane in store.lanes(run.run_id)
    )
    return RunDocument(
        run_id=run.run_id,
        kind=run.kind,
        status=run.status.value,
        reason=run.reason,
        created=run.created,
        label=run.label,
        pipeline=run.pipeline,
        consumer=run.consumer,
        seconds=None if run.ended_ns is None else (run.ended_ns - run.started_ns) / 1e9,
        config=run.config,
        host=run.host,
        samples=store.sample_counts(run.run_id),
        unavailable_metrics=tuple(
            {"source": u.source, "device": u.device or None, "metric": u.metric, "reason": u.reason}
            for u in store.unavailable(run.run_id)
        ),
        lanes=lanes,
    )
