"""One lane's figures (`LaneFigures`, the JSON of a run document's lanes) and how they are
computed (`lane_figures`); what each figure is, its label and unit, is `probe.metrics`'.

A lane's figures come from its measured batch events, warm-up ones left out, and from the
samples of its measured window. A batch's time is its wait plus its step (`batch_seconds`):
images/s is images over that time and data-wait (`wait_share`) the share of it spent waiting
for batches, each with its 95% error (`probe.steady`). The lane's CPU is over that time too, so
that CPU per image is one time's: a training loop's time outside the loader's `for`
(validation, checkpoints) is in no figure but the lane's wall time (`TimeSplit`).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from probe.metrics import STAGES, Metric, Percentiles, Side, busy_metric, median_error, percentiles
from probe.records import BatchEvent, GpuSample, LaneCpuSample, RunRecord
from probe.steady import batch_seconds, data_wait, epoch_starts, images_per_s


@dataclass(frozen=True)
class EpochStartCost:
    """What a lane's measured epoch starts cost (`probe.steady.epoch_starts`), split where the
    lane saw its loader start into the loader's start and the prefetch's refill; and what its
    epochs' tails cost (their last round of batches, made with workers idle)."""

    starts: int
    batches_per_epoch: float
    opening_batches: int
    stall_ms: float  # per start
    share: float  # of the measured time
    steady_images_per_s: float  # with the stalls taken out
    loader_start_ms: float | None = None
    refill_ms: float | None = None
    ends: int = 0  # epoch ends whose tails were measured (none in a document stored before)
    tail_batches: int = 0  # the batches of each end counted as its tail
    tail_ms: float = 0.0  # per end: its tail's wait beyond the steady wait
    tail_share: float = 0.0  # of the measured time
    # The error of the lane's data-wait with the starts counted as measured, not as noise: from
    # its blocks with each start's stall taken out (None in a document stored before).
    wait_error: float | None = None


@dataclass(frozen=True)
class TimeSplit:
    """A lane's wall time from its first measured batch to its last one's end, split: the
    windows between epoch starts and tails; the epoch starts and the epoch tails (their
    batches' wait beyond the steady wait, `EpochStartCost`); and the time outside the loop's
    iteration (validation, checkpoints: the wall time less the batches')."""

    wall_s: float
    windows_s: float
    starts_s: float
    tails_s: float
    outside_s: float

    def share(self, seconds: float) -> float:
        """`seconds`' share of the wall time."""
        return seconds / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class LaneFigures:
    """One lane's figures over its measured batches (warm-up ones left out), and how the lane
    ran. The JSON keys of a run document's lanes are these fields' names."""

    warmup_batches: int = 0
    warmup_s: float = 0.0
    batches: int = 0
    images: int = 0
    seconds: float = 0.0
    images_per_s: float = 0.0
    images_per_s_error: float | None = None  # 95% interval half-width
    data_wait_frac: float | None = None
    data_wait_frac_error: float | None = None
    blocks: int = 0  # the blocks its errors rest on
    epoch_start: EpochStartCost | None = None
    batch_latency_ms: Percentiles = field(default_factory=Percentiles)
    wait_ms_p50: float | None = None
    step_ms_p50: float | None = None
    sm_active_pct: float | None = None  # GPU busy-ness: the metric `sm_active_source` says
    sm_active_source: str | None = None  # "gpm" or "nvml" (see `busy_metric`)
    kernel_active_pct: float | None = None
    sm_occupancy_pct: float | None = None
    # The SM activity of its steps: `sm_active_pct` over the batches' time, less their waits
    # (the GPU taken as idle while the loop waits for data), at most 100 (None: not measured).
    step_sm_active_pct: float | None = None
    nvjpg_pct: float | None = None
    memory_used_mib: float | None = None
    cpu_pct: float | None = None  # the lane's processes, % of one core, over the batches' time
    main_thread_cpu_pct: float | None = None
    # How the lane ran, as it said when it ended (None: not said, as for a watched loop).
    skipped_files: int | None = None
    capped: bool | None = None  # measuring stopped at its time limit before it was precise
    warmup_settled: bool | None = None
    build_s: float | None = None  # the pipeline's build
    startup_s: float | None = None  # the lane process's start, consumer included
    consumer_alone: Mapping[str, Any] | None = None  # the consumer on batches on the device
    step_ms_p50_error: float | None = None  # 95% interval of the median step, half-width
    # CPU ms per image by stage (`STAGES`' names), over the measured batches (None: not timed,
    # as for DALI, whose stages run inside its threads, or a watched loop's workers).
    stages_ms: Mapping[str, float] | None = None
    # A DataLoader worker's busy ms per image: its thread's wall time from a batch's first
    # sample to the stacked batch, its waits for a core left out (None: not timed). Above its
    # stages' CPU where it waits for the GIL (the queue's thread hands batches over) or a disk.
    worker_serial_ms: float | None = None
    pss_mib: float | None = None  # the lane's processes' largest PSS while it measured
    worker_threads: int | None = None  # the most threads one DataLoader worker ran
    # The lane's cgroup CPU throttling while it measured (None: no cgroup counters to read).
    cfs_periods: int | None = None
    throttled_periods: int | None = None
    throttled_s: float | None = None
    # From the first measured batch's request to the last one's end, the loop's time outside
    # its iteration included (None: a document stored before it was).
    wall_s: float | None = None

    @property
    def cpu_ms_per_image(self) -> float | None:
        """The lane's processes' CPU time per image (`CPU_PER_IMAGE`)."""
        if self.cpu_pct is None or not self.images_per_s:
            return None
        return self.cpu_pct / 100 / self.images_per_s * 1e3

    @property
    def time_split(self) -> TimeSplit | None:
        """Its wall time split (`TimeSplit`); None where the wall time was not stored."""
        if self.wall_s is None:
            return None
        start = self.epoch_start
        starts = start.share * self.seconds if start else 0.0
        tails = start.tail_share * self.seconds if start else 0.0
        return TimeSplit(
            wall_s=self.wall_s,
            windows_s=max(0.0, self.seconds - starts - tails),
            starts_s=starts,
            tails_s=tails,
            outside_s=max(0.0, self.wall_s - self.seconds),
        )

    @property
    def windows_images_per_s(self) -> float | None:
        """Images/s over its batches' time less its epoch starts' and tails': what reading
        across epoch ends would give, were nothing else to hold the loader (its images/s where
        it read one stream); None where nothing is left."""
        start = self.epoch_start
        left = 1 - (start.share + start.tail_share if start else 0.0)
        return self.images_per_s / left if left > 0 and self.images_per_s else None

    def stage_ms(self, side: Side | None = None, training: bool = True) -> float | None:
        """The stages' CPU ms per image, of one side or of all; without the training step's
        own (`training=False`: the pipeline's alone)."""
        if not self.stages_ms:
            return None
        names = {s.name for s in STAGES if side is None or s.side is side}
        if not training:
            names -= {"step", "main_threads"}
        return sum(v for k, v in self.stages_ms.items() if k in names)

    @property
    def busy(self) -> Metric | None:
        """The metric of `sm_active_pct`."""
        return busy_metric(self.sm_active_source)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        if self.consumer_alone is not None:
            out["consumer_alone"] = dict(self.consumer_alone)
        if self.stages_ms is not None:
            out["stages_ms"] = dict(self.stages_ms)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaneFigures:
        """Figures from their JSON (keys it does not know are left out: a newer store's)."""
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("epoch_start") is not None:
            values["epoch_start"] = _known(EpochStartCost, values["epoch_start"])
        if values.get("batch_latency_ms") is not None:
            values["batch_latency_ms"] = _known(Percentiles, values["batch_latency_ms"])
        else:
            values.pop("batch_latency_ms", None)
        return cls(**values)


_Record = TypeVar("_Record", EpochStartCost, Percentiles)


def _known(kind: type[_Record], data: Mapping[str, Any]) -> _Record:
    """A record from the keys of `data` it has (keys it lacks keep their defaults)."""
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Reading:
    """How a lane's loader reads, as far as its figures need it."""

    loaders: int | None = None  # DataLoader workers, which make batches in turn
    opening: int = 1  # batches that open an epoch: a DataLoader makes one per worker at once

    @classmethod
    def of(cls, run: RunRecord) -> Reading:
        loader = run.config.get("spec", {}).get("dataloader") or {}
        workers = loader.get("num_workers") if run.pipeline == "torch" else None
        return cls(workers, max(1, workers or 1))


def lane_figures(
    events: Sequence[BatchEvent],
    gpu_samples: Sequence[GpuSample] = (),
    cpu_samples: Sequence[LaneCpuSample] = (),
    *,
    reading: Reading | None = None,
    starts: Sequence[Sequence[int]] | None = None,
) -> LaneFigures:
    """One lane's figures.

    Args:
        events: the lane's batch events, warm-up ones included (they are left out here).
        gpu_samples: samples of the lane's GPU (any time span: the window is cut here).
        cpu_samples: the lane's CPU samples.
        reading: how the lane's loader reads (its workers size the blocks of the errors).
        starts: the loader's starts of reading as the lane saw them, [epoch, started_ns,
            ready_ns] each: what splits an epoch start's cost.
    """
    reading = reading or Reading()
    measured = [e for e in events if not e.warmup]
    warmup = [e for e in events if e.warmup]
    counts = LaneFigures(
        warmup_batches=len(warmup),
        warmup_s=sum(batch_seconds(e) for e in warmup),
        batches=len(measured),
        images=sum(e.size for e in measured),
    )
    if not measured:
        return counts
    rate = images_per_s(measured, reading.loaders)
    wait = data_wait(measured, reading.loaders)
    start_ns = measured[0].t_ns
    spans = [(e.t_ns, e.t_ns + int(batch_seconds(e) * 1e9)) for e in measured]
    end_ns = max(end for _, end in spans)
    gpu = _covering(gpu_samples, start_ns, end_ns)
    sm_active = _mean(s.sm_active_pct for s in gpu)
    kernel_active = _mean(s.kernel_active_pct for s in gpu)
    source = "gpm" if sm_active is not None else "nvml" if kernel_active is not None else None
    busy_in_batches = _over_batches(
        gpu, spans, lambda s: s.sm_active_pct if source == "gpm" else s.kernel_active_pct
    )
    step_s = sum(e.step_s for e in measured)
    step_share = step_s / sum(batch_seconds(e) for e in measured) if step_s > 0 else 0.0
    cpu = _covering(cpu_samples, start_ns, end_ns)
    return LaneFigures(
        warmup_batches=counts.warmup_batches,
        warmup_s=counts.warmup_s,
        batches=counts.batches,
        images=counts.images,
        seconds=sum(batch_seconds(e) for e in measured),
        images_per_s=rate.value,
        images_per_s_error=rate.error,
        data_wait_frac=min(1.0, wait.value),
        data_wait_frac_error=wait.error,
        blocks=rate.blocks,
        epoch_start=_epoch_start(events, reading, starts),
        batch_latency_ms=percentiles([batch_seconds(e) * 1e3 for e in measured]),
        wait_ms_p50=statistics.median(e.wait_s * 1e3 for e in measured),
        step_ms_p50=statistics.median(e.step_s * 1e3 for e in measured),
        step_ms_p50_error=median_error([e.step_s * 1e3 for e in measured]),
        sm_active_pct=sm_active if sm_active is not None else kernel_active,
        sm_active_source=source,
        kernel_active_pct=kernel_active,
        sm_occupancy_pct=_mean(s.sm_occupancy_pct for s in gpu),
        step_sm_active_pct=None
        if busy_in_batches is None or step_share <= 0
        else min(100.0, busy_in_batches / step_share),
        nvjpg_pct=_mean(s.nvjpg_pct for s in gpu),
        memory_used_mib=max(
            (s.memory_used_mib for s in gpu if s.memory_used_mib is not None), default=None
        ),
        cpu_pct=_over_batches(cpu, spans, lambda s: s.cpu_pct),
        main_thread_cpu_pct=_over_batches(cpu, spans, lambda s: s.main_thread_cpu_pct),
        pss_mib=max((s.pss_mib for s in cpu if s.pss_mib is not None), default=None),
        worker_threads=max(
            (s.worker_threads for s in cpu if s.worker_threads is not None), default=None
        ),
        wall_s=(end_ns - start_ns) / 1e9,
    )


def _epoch_start(
    events: Sequence[BatchEvent], reading: Reading, starts: Sequence[Sequence[int]] | None
) -> EpochStartCost | None:
    found = epoch_starts(events, reading.opening)
    if found is None:
        return None
    evened = [e for e in found.evened(events) if not e.warmup]
    starting = None
    if starts:
        opened = {e.epoch for i, e in enumerate(events) if i and e.epoch != events[i - 1].epoch}
        measured = {e.epoch for e in events if not e.warmup}
        spans = [(ready - begun) / 1e9 for epoch, begun, ready in starts
                 if epoch in opened & measured]  # fmt: skip
        starting = min(found.stall_s, sum(spans) / len(spans)) if spans else None
    return EpochStartCost(
        starts=found.starts,
        batches_per_epoch=found.batches_per_epoch,
        opening_batches=found.opening_batches,
        stall_ms=found.stall_s * 1e3,
        share=found.share,
        steady_images_per_s=found.steady_images_per_s,
        loader_start_ms=None if starting is None else starting * 1e3,
        refill_ms=None if starting is None else (found.stall_s - starting) * 1e3,
        ends=found.ends,
        tail_batches=found.tail_batches,
        tail_ms=found.tail_s * 1e3,
        tail_share=found.tail_share,
        wait_error=data_wait(evened, reading.loaders).error,
    )


_Timed = TypeVar("_Timed", GpuSample, LaneCpuSample)


def _covering(samples: Sequence[_Timed], start_ns: int, end_ns: int) -> list[_Timed]:
    """The samples within [start, end], and the first after it: a sample covers the interval
    that ends at its time, so that one covers the window's end (or all of a short window)."""
    inside = [s for s in samples if start_ns <= s.t_ns <= end_ns]
    after = next((s for s in samples if s.t_ns > end_ns), None)
    return inside + ([after] if after is not None else [])


def _over_batches(
    samples: Sequence[_Timed],
    spans: Sequence[tuple[int, int]],
    value: Callable[[_Timed], float | None],
) -> float | None:
    """The mean of `value` over the time of `spans` (the measured batches' [request, end], in
    order): each sample covers the interval since the sample before it (the first, one as long
    as the next one's) and weighs what of that interval the batches hold; a lone sample covers
    it all. Time outside the batches (a loop's validation between epochs) weighs nothing."""
    kept: list[_Timed] = [s for s in samples if value(s) is not None]
    if len(kept) < 2:
        return value(kept[0]) if kept else None
    times: list[int] = [s.t_ns for s in kept]
    begins = [2 * times[0] - times[1], *times[:-1]]
    held_s = weighted = 0.0
    first = 0  # the first span that may end after the interval's beginning
    for sample, begin, end in zip(kept, begins, times, strict=True):
        while first < len(spans) and spans[first][1] <= begin:
            first += 1
        held, at = 0, first
        while at < len(spans) and spans[at][0] < end:
            held += max(0, min(end, spans[at][1]) - max(begin, spans[at][0]))
            at += 1
        held_s += held
        weighted += held * (value(sample) or 0.0)
    return weighted / held_s if held_s > 0 else None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None
