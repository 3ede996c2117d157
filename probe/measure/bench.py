"""Throughput of input pipelines alone: images/s and time between batches, warm-up excluded."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from pipelines import Backend, PipelineSpec, build_pipeline
from pipelines.dataset import Dataset
from probe.measure.devices import device_sync
from probe.measure.timer import BatchTimer
from probe.metrics import percentiles
from probe.steady import batch_seconds


@dataclass(frozen=True)
class BenchResult:
    """One pipeline's measured throughput."""

    backend: Backend
    device: str  # "cpu" or "cuda:N"
    settings: str  # the backend's knobs, e.g. "num_workers=2 uint8"
    startup_s: float  # building the pipeline and the warm-up batches
    batches: int  # measured batches
    images: int
    seconds: float
    batch_interval_ms_p50: float  # time from one batch to the next
    batch_interval_ms_p95: float
    skipped_files: int

    @property
    def images_per_s(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else 0.0


def describe_settings(spec: PipelineSpec, backend: Backend) -> str:
    """The knobs that decide a backend's throughput, in one short line."""
    if backend is Backend.TORCH:
        options = spec.dataloader
        return f"num_workers={options.num_workers} {spec.output_dtype.value}"
    text = f"decoder={spec.dali_decoder.value} num_threads={spec.dali.num_threads}"
    if spec.dali_decoder.value == "mixed":
        text += f" hw_decoder_load={spec.dali.hw_decoder_load:g}"
    return text


def bench_pipeline(
    spec: PipelineSpec,
    backend: Backend,
    *,
    warmup_batches: int,
    duration_s: float | None = None,
    max_batches: int | None = None,
    dataset: Dataset | None = None,
    on_batch: Callable[[float], None] | None = None,
) -> BenchResult:
    """Runs one pipeline with no consumer and measures it.

    The first `warmup_batches` batches are not measured: they pay for starting worker processes
    or threads and DALI's first allocations. Measurement stops after `duration_s` seconds or
    `max_batches` batches, whichever comes first. On a GPU each batch is awaited on the device,
    so a batch counts once it is ready there.

    Args:
        on_batch: called after each measured batch with the seconds measured so far.
    """
    if duration_s is None and max_batches is None:
        raise ValueError("give duration_s, max_batches or both")
    timer = BatchTimer(0, device_sync(spec.device))
    started_ns = time.monotonic_ns()
    with build_pipeline(spec, backend, dataset=dataset) as pipeline:
        batches = pipeline.stream()
        for _ in range(warmup_batches):
            next(batches)
        timer.got()  # the warm-up batches are ready on the device
        begin_ns = last_ns = timer.got_ns
        intervals: list[float] = []  # seconds from the end of one batch to the end of the next
        images = 0
        while True:
            timer.ask(last_ns)
            batch = next(batches)
            timer.got()
            if on_batch is not None:
                on_batch((timer.got_ns - begin_ns) / 1e9)
            event = timer.done(int(batch.labels.shape[0]))
            last_ns = timer.done_ns
            intervals.append(batch_seconds(event))
            images += event.size
            if max_batches is not None and len(intervals) >= max_batches:
                break
            if duration_s is not None and (last_ns - begin_ns) / 1e9 >= duration_s:
                break
        skipped = len(pipeline.skipped_files)
    interval = percentiles(intervals)
    assert interval.p50 is not None and interval.p95 is not None  # one batch at least
    return BenchResult(
        backend=backend,
        device="cpu" if spec.device is None else f"cuda:{spec.device}",
        settings=describe_settings(spec, backend),
        startup_s=(begin_ns - started_ns) / 1e9,
        batches=len(intervals),
        images=images,
        seconds=(last_ns - begin_ns) / 1e9,
        batch_interval_ms_p50=interval.p50 * 1e3,
        batch_interval_ms_p95=interval.p95 * 1e3,
        skipped_files=skipped,
    )
