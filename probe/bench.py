"""Throughput of input pipelines alone: images/s and time between batches, warm-up excluded."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipelines import Backend, PipelineSpec, build_pipeline
from pipelines.dataset import Dataset
from probe.devices import device_sync


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
    return f"decoder={spec.dali_decoder.value} num_threads={spec.dali.num_threads}"


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
    sync = device_sync(spec.device)
    started = time.perf_counter()
    with build_pipeline(spec, backend, dataset=dataset) as pipeline:
        batches = pipeline.stream()
        for _ in range(warmup_batches):
            next(batches)
        sync()
        begin = time.perf_counter()
        startup_s = begin - started
        intervals: list[float] = []
        images = 0
        last = begin
        while True:
            batch = next(batches)
            sync()
            now = time.perf_counter()
            intervals.append(now - last)
            last = now
            images += batch.labels.shape[0]
            if on_batch is not None:
                on_batch(now - begin)
            if max_batches is not None and len(intervals) >= max_batches:
                break
            if duration_s is not None and now - begin >= duration_s:
                break
        skipped = len(pipeline.skipped_files)
    quantiles = statistics.quantiles(intervals, n=20) if len(intervals) > 1 else intervals * 19
    return BenchResult(
        backend=backend,
        device="cpu" if spec.device is None else f"cuda:{spec.device}",
        settings=describe_settings(spec, backend),
        startup_s=startup_s,
        batches=len(intervals),
        images=images,
        seconds=last - begin,
        batch_interval_ms_p50=statistics.median(intervals) * 1e3,
        batch_interval_ms_p95=quantiles[18] * 1e3,
        skipped_files=skipped,
    )
