"""Every figure feedscope shows, defined once: what it is computed from, its label and unit, the
source that measures it, how it is written, and how a run's lanes make one run-level figure.

The `probe` command's tables, the reports, the dashboard and the diagnosis read labels, units
and values from here, and the store's GPU sample columns are `GPU_METRICS`' names.

Data-wait is `wait_share` of some batches' sums, every percentile `percentiles`, and every
comparison with a prediction `against`. One lane's figures, and how they are computed from its
batch events and samples, are `probe.lane_figures`'.

The run-level rule (`Metric.across`): images/s and CPU cores add up over the lanes (errors in
quadrature); data-wait and batch latency are the worst lane's, because under DDP every step
waits for the slowest rank; GPU figures are the lanes' mean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import Enum


class Source(str, Enum):
    """What measures a figure; shown next to it."""

    BATCHES = "batch clock"  # the lanes' own timing of each batch
    GPM = "GPM"  # NVML's GPU performance monitoring (Hopper and newer)
    NVML = "NVML"
    PSUTIL = "psutil"


class Across(str, Enum):
    """How a run's lanes make its run-level figure."""

    SUM = "sum"
    WORST = "worst"  # the largest: DDP waits for the slowest rank
    MEAN = "mean"


@dataclass(frozen=True)
class Metric:
    """One figure: its key (a field, a JSON key and a store column), how it is shown, and how
    a run's lanes combine into one."""

    name: str
    label: str  # "data-wait", "SM activity"
    unit: str  # "%", "images/s", "ms", "cores", "MiB", "W", "MiB/s", or "" for none
    source: Source
    digits: int = 0  # decimals shown
    scale: float = 1.0  # shown = stored x scale (a share 0.31 is 31%; 250% of one core is 2.5)
    across: Across = Across.MEAN
    note: str = ""  # what to know when reading it
    integer: bool = False  # stored as a whole number (a bit mask)

    @property
    def title(self) -> str:
        """The label with its source: 'SM activity (GPM)', 'kernel-active (NVML
        utilization.gpu)'; figures of the batch clock need none."""
        if self.source is Source.BATCHES:
            return self.label
        return f"{self.label} ({self.source.value}{f' {self.note}' if self.note else ''})"

    @property
    def heading(self) -> str:
        """A table column: the label, with its unit where the cells do not carry it
        ('data-wait', 'images/s', 'CPU cores', 'memory used MiB')."""
        if self.unit == "%":
            return self.label
        return self.axis

    @property
    def axis(self) -> str:
        """A chart's axis or trace: the label and its unit, 'data-wait %'."""
        if not self.unit or self.unit in self.label:
            return self.label
        return f"{self.label} {self.unit}"

    def number(self, value: float | None) -> str:
        """The value as shown, without its unit: '31.0', '3,945'; '-' for none."""
        if value is None:
            return "-"
        return f"{value * self.scale:,.{self.digits}f}"

    def cell(self, value: float | None, error: float | None = None) -> str:
        """The value for a table cell under `heading`: '31.0% ± 1.2%' for a share, '3,945 ±
        40' for images/s, '2.5' for cores; '-' for none."""
        if value is None:
            return "-"
        sign = "%" if self.unit == "%" else ""
        shown = f"{self.number(value)}{sign}"
        return shown if error is None else f"{shown} ± {self.number(error)}{sign}"

    def text(self, value: float | None, error: float | None = None) -> str:
        """The value in running text, with its unit: '31.0%', '3,945 ± 40 images/s',
        '2.5 cores'; '-' for none."""
        shown = self.cell(value, error)
        if value is None or not self.unit or self.unit == "%":
            return shown
        return f"{shown} {self.unit}"

    def of_run(self, values: Iterable[float | None]) -> float | None:
        """The run-level figure of its lanes' values (None where no lane has one)."""
        present = [v for v in values if v is not None]
        if not present:
            return None
        if self.across is Across.SUM:
            return sum(present)
        if self.across is Across.WORST:
            return max(present)
        return sum(present) / len(present)


# Figures of the batch clock (the lanes' timing of each batch).
IMAGES_PER_S = Metric("images_per_s", "images/s", "images/s", Source.BATCHES, across=Across.SUM)
DATA_WAIT = Metric(
    "data_wait_frac", "data-wait", "%", Source.BATCHES, digits=1, scale=100.0, across=Across.WORST
)
LATENCY = Metric("batch_latency_ms", "batch latency", "ms", Source.BATCHES, 1, across=Across.WORST)
# The share of a rank's step spent waiting at DDP's all-reduce for a rank that waits for data
# (`probe.judge.evidence.held_share`).
HELD = Metric(
    "held_frac", "step waiting for another rank", "%", Source.BATCHES, 1, 100.0, Across.WORST
)
# The CPU of a lane's processes (its loader's workers or threads included), in % of one core,
# over its measured batches' time (`probe.lane_figures`).
CPU = Metric("cpu_pct", "CPU cores", "cores", Source.PSUTIL, 1, scale=0.01, across=Across.SUM)
MAIN_THREAD_CPU = Metric("main_thread_cpu_pct", "training loop thread", "%", Source.PSUTIL)
# The median step, the consumer's time per batch once it has it (the worst lane's: DDP's pace).
STEP = Metric("step_ms_p50", "step (median)", "ms", Source.BATCHES, 1, across=Across.WORST)
# The lane's processes' CPU time per image: CPU cores over images/s.
CPU_PER_IMAGE = Metric("cpu_ms_per_image", "CPU per image", "ms", Source.PSUTIL, 2)
# The stages' CPU time per image (`STAGES`), timed where each runs.
STAGE_TIME = Metric("stages_ms", "CPU per image", "ms", Source.BATCHES, 2)
PSS = Metric("pss_mib", "memory (PSS)", "MiB", Source.PSUTIL, across=Across.SUM)
WORKER_THREADS = Metric("worker_threads", "threads per worker", "", Source.PSUTIL)

# GPU samples, in the store's column order.
KERNEL_ACTIVE = Metric(
    "kernel_active_pct", "kernel-active", "%", Source.NVML, note="utilization.gpu, overstates"
)
SM_ACTIVE = Metric("sm_active_pct", "SM activity", "%", Source.GPM)
SM_OCCUPANCY = Metric("sm_occupancy_pct", "SM occupancy", "%", Source.GPM)
NVJPG = Metric("nvjpg_pct", "JPEG decoder", "%", Source.NVML)
NVJPG_GPM = Metric("nvjpg_gpm_pct", "JPEG decoders", "%", Source.GPM, note="mean of engines")
MEMORY = Metric("memory_used_mib", "memory used", "MiB", Source.NVML, across=Across.SUM)
PCIE_RX = Metric("pcie_rx_mib_s", "PCIe to GPU", "MiB/s", Source.GPM)
PCIE_TX = Metric("pcie_tx_mib_s", "PCIe from GPU", "MiB/s", Source.GPM)
POWER = Metric("power_w", "power", "W", Source.NVML)
CLOCKS = Metric(
    "clocks_event_reasons", "clocks event reasons (bit mask)", "", Source.NVML, integer=True
)
GPU_METRICS = (
    KERNEL_ACTIVE, SM_ACTIVE, SM_OCCUPANCY, NVJPG, NVJPG_GPM, MEMORY, PCIE_RX, PCIE_TX, POWER,
    CLOCKS,
)  # fmt: skip
GPU_COLUMNS = tuple(m.name for m in GPU_METRICS)


class Side(str, Enum):
    """Where a stage runs."""

    WORKERS = "workers"  # the DataLoader's worker processes
    MAIN = "main"  # the training process


@dataclass(frozen=True)
class Stage:
    """One stage of a DataLoader pipeline, whose CPU time per image a lane records."""

    name: str  # its key in `probe.lane_figures.LaneFigures.stages_ms`
    label: str
    side: Side


STAGES = (
    Stage("read", "reading the file", Side.WORKERS),
    Stage("decode", "decoding", Side.WORKERS),
    Stage("crop_resize", "crop and resize", Side.WORKERS),
    Stage("flip", "flip", Side.WORKERS),
    Stage("collate", "collation", Side.WORKERS),
    Stage("worker_rest", "the workers' hand-over and loop", Side.WORKERS),
    Stage("receive", "receiving batches (unpickling)", Side.MAIN),
    Stage("to_device", "the copy to the device", Side.MAIN),
    Stage("normalize", "normalizing", Side.MAIN),
    Stage("step", "the training step and loop", Side.MAIN),
    Stage("main_threads", "the training process's other threads", Side.MAIN),
)
STAGE_BY_NAME = {stage.name: stage for stage in STAGES}


def busy_metric(source: str | None) -> Metric | None:
    """The metric a lane's GPU busy-ness (`sm_active_pct` with `sm_active_source`) is: SM
    activity where GPM gives it, else NVML's kernel-active, which overstates it."""
    return {"gpm": SM_ACTIVE, "nvml": KERNEL_ACTIVE}.get(source or "")


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """A count and its noun, singular or plural: "1 block", "3 blocks", "1 batch"."""
    if count == 1:
        return f"1 {noun}"
    many = plural or (noun + "es" if noun.endswith(("ch", "sh", "s")) else noun + "s")
    return f"{count:,} {many}"


def device_word(devices: Sequence[str]) -> str:
    """What a run's lanes drive: "GPU", or "lane" on the CPU."""
    return "GPU" if any(device.startswith("cuda") for device in devices) else "lane"


def job_scope(devices: Sequence[str]) -> str:
    """Whose a run's or a session's images/s are, where it has several lanes: " for all 4
    GPUs" (" for all 2 lanes" on the CPU); nothing for one lane."""
    if len(devices) <= 1:
        return ""
    return f" for all {len(devices)} {device_word(devices)}s"


def per_device(word: str, count: int, rate: float | None = None) -> str:
    """What follows one lane's figure where the job has `count` lanes (nothing for one):
    " per GPU", and with its images/s `rate`, the job's too: " per GPU (14,276 for all 4
    GPUs)". `word`: "GPU", or "lane" on the CPU."""
    if count <= 1:
        return ""
    job = "" if rate is None else f" ({rate * count:,.0f} for all {count} {word}s)"
    return f" per {word}{job}"


def against(measured: float, predicted: float | None) -> float | None:
    """A measured figure against its prediction, the one sign convention of every comparison
    shown: (measured - predicted) / predicted, so "-15%" means measured 15% below what was
    predicted. None without a prediction."""
    return measured / predicted - 1 if predicted else None


def signed(share: float, digits: int = 0) -> str:
    """A change as a signed percentage, "+7%", "-2.4%": one that rounds to nothing reads "+0%",
    never "-0%"."""
    shown = round(share * 100, digits)
    return f"{(shown or 0.0) / 100:+.{digits}%}"


def against_text(measured: float, predicted: float | None, digits: int = 1) -> str:
    """`against` as shown: "+2.4%"; "-" without a prediction."""
    share = against(measured, predicted)
    return "-" if share is None else signed(share, digits)


def wait_share(wait_s: float, step_s: float) -> float | None:
    """Data-wait: the share of batch time (wait plus step) spent waiting for batches; None
    without any time. Every data-wait shown is this, of some batches' sums."""
    seconds = wait_s + step_s
    return wait_s / seconds if seconds > 0 else None


def percentiles(values: Sequence[float]) -> Percentiles:
    """p50, p95 and p99 (inclusive method: never outside the values seen). Every percentile
    shown is this."""
    if not values:
        return Percentiles()
    if len(values) == 1:
        return Percentiles(values[0], values[0], values[0])
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return Percentiles(statistics.median(values), cuts[94], cuts[98])


def median_error(values: Sequence[float]) -> float | None:
    """The 95% interval of the median, half-width (the wider side), from the order statistics
    (distribution-free: ranks n/2 -+ 1.96 sqrt(n)/2); None under 10 values."""
    n = len(values)
    if n < 10:
        return None
    ordered = sorted(values)
    median = statistics.median(ordered)
    reach = 1.96 * math.sqrt(n) / 2
    low = ordered[max(0, math.floor(n / 2 - reach) - 1)]
    high = ordered[min(n - 1, math.ceil(n / 2 + reach) - 1)]
    return max(median - low, high - median)


def errors_added(errors: Iterable[float | None]) -> float | None:
    """The error of a sum: its parts' errors in quadrature (None if one is not known)."""
    parts = list(errors)
    if not parts or any(e is None for e in parts):
        return None
    return math.hypot(*(float(e) for e in parts if e is not None))


@dataclass(frozen=True)
class Percentiles:
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
