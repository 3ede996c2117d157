"""A watched lane's figures as running totals, for the places users already look while a job
runs: a Prometheus endpoint (`probe.measure.prometheus`) and TensorBoard
(`probe.measure.tensorboard`).

The training loop does nothing more for them: it appends each batch's event to its recording's
queue, as it does for the store, and the thread that writes the store hands the same events
and samples to `Live.add` twice a second. No lock, no call and no store write is added to the
batch path.

The totals are the store's figures kept as sums: measured batches only (warm-up ones are
counted apart, as every figure leaves them out), a batch's time its wait plus its step
(`probe.steady.batch_seconds`), and the epoch starts' stall by `probe.steady.epoch_starts`'
rule (`EpochStartTally`). A rate of the wait over the rate of wait and step, over any window,
is the data-wait share of that window.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pipelines import InputError
from probe.lane_figures import Reading
from probe.records import BatchEvent, LaneCpuSample, RunRecord
from probe.steady import EpochStartTally

if TYPE_CHECKING:
    from probe.measure.devices import CudaDevice
    from probe.measure.samplers.nvml import GpuSampler


@dataclass(frozen=True)
class Labels:
    """Who a lane's figures are: the run's name, its rank, and its host and GPU as NVIDIA's
    DCGM exporter labels them (`Hostname`, `gpu`: NVML's index, `UUID`), so that one query
    joins the two on a GPU."""

    job: str
    rank: int
    local_rank: int
    hostname: str
    gpu: str  # "" on the CPU
    uuid: str  # "" on the CPU


@dataclass
class Live:
    """One lane's running totals, updated by its writer thread, read by whoever asks."""

    labels: Labels
    workers: int | None  # the loader's workers (a DataLoader's num_workers)
    stalls: EpochStartTally
    batches: int = 0
    images: int = 0
    wait_s: float = 0.0
    step_s: float = 0.0
    warmup_batches: int = 0
    cpu_cores: float | None = None  # the lane's processes (its workers included), last sample
    # Called with each lot of events once the totals include them (TensorBoard's writer).
    listeners: list[Callable[[Live, Sequence[BatchEvent]], None]] = field(default_factory=list)

    def add(self, events: Sequence[BatchEvent], cpu: Sequence[LaneCpuSample] = ()) -> None:
        """Counts `events` in; the last of `cpu` that is this lane's sets the CPU gauge."""
        for event in events:
            self.stalls.add(event)
            if event.warmup:
                self.warmup_batches += 1
                continue
            self.batches += 1
            self.images += event.size
            self.wait_s += event.wait_s
            self.step_s += event.step_s
        mine = [s for s in cpu if s.lane == self.labels.rank]
        if mine:
            self.cpu_cores = mine[-1].cpu_pct / 100
        for listener in self.listeners:
            listener(self, events)


def start_live(labels: Labels, run: RunRecord, port: int | None) -> Live:
    """A lane's running totals, served on `port`'s `/metrics` where one is given.

    Raises:
        OSError: the port cannot be had.
    """
    reading = Reading.of(run)
    live = Live(labels, reading.loaders, EpochStartTally(reading.opening))
    if port is not None:
        from probe.measure import prometheus

        prometheus.serve(port, live)
    return live


def nvml_index(device: CudaDevice | None, gpus: GpuSampler | None) -> str:
    """The GPU's NVML index, as DCGM's exporter labels it `gpu` (CUDA's index differs where
    CUDA_VISIBLE_DEVICES reorders the GPUs); "" on the CPU or where NVML cannot tell."""
    if device is None:
        return ""
    from probe.measure.samplers.nvml import GpuSampler

    sampler = gpus or GpuSampler([device.uuid])
    index = sampler.info(device.uuid).index
    if gpus is None:
        sampler.close()
    return "" if index is None else str(index)


def require(module: str, package: str, what: str, extra: str) -> None:
    """Raises a one-line InputError naming the extra where `module` cannot be imported."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise InputError(
            f"{what} needs {package} ({error}): pip install 'feedscope[{extra}]'"
        ) from None
