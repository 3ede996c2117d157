"""A lane: one process driving one GPU (or the CPU) and one shard, kept warm for a session.

The process builds its consumer once. For each run the coordinator sends it (a `Measure`), it
builds the pipeline, reads it (one endless stream, or epoch by epoch as a training loop's
`for epoch: for batch in loader` does), feeds every batch to the consumer and times it: how
long the consumer waited for it (until it was ready on the device, the copy included) and how
long the step took. Batches until the rate settles are warm-up. Before its first run it times
the consumer alone, on batches already on the device: the most any input fix can reach. It
sends the events to the coordinating process in small bundles; it does not touch the store.
"""

from __future__ import annotations

import math
import os
import queue
import signal
import statistics
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from pipelines import Backend, Batch, InputError, InputPipeline, PipelineSpec, build_pipeline
from pipelines.host import Throttling, cpu_throttling
from pipelines.loader import MAIN_STAGES, NOTHING_TO_READ
from probe.measure.causes import failure_reason
from probe.measure.consumers import Consumer, ConsumerKind, ConsumerSpec, build_consumer
from probe.measure.devices import device_sync
from probe.measure.timer import BatchTimer
from probe.metrics import median_error
from probe.records import BatchEvent
from probe.steady import (
    MIN_BLOCKS,
    MIN_MEASURE_S,
    Warmup,
    batch_seconds,
    block_batches,
    images_per_s,
    transient,
)

FLUSH_NS = 250_000_000  # events reach the coordinator at least this often
STOPPED_WITHIN_S = 1.0  # a pipeline failure this close to a stop is the stop's doing
TREND_CHECK_GROWTH = 1.5  # a window is tested for a trend each time it has grown by half
CONSUMER_ALONE_MAX_S = 10.0
# The consumer alone has no pipeline to settle (its tuning is done before): shorter windows.
CONSUMER_WINDOW_S = 0.25


class Read(str, Enum):
    """How a lane reads its shard: as one endless stream (what a long training job sees once
    it runs), or epoch by epoch, restarting the loader at each (what a `for` loop per epoch
    pays)."""

    STREAM = "stream"
    EPOCHS = "epochs"


@dataclass(frozen=True)
class LaneSetup:
    """What a lane process keeps for its whole life."""

    lane: int
    device: int | None  # CUDA index; None: the CPU
    consumer: ConsumerSpec
    num_classes: int


@dataclass(frozen=True)
class Measure:
    """One run's work for a lane."""

    job: int  # the coordinator's number for it: messages about it carry it
    spec: PipelineSpec  # its device and shard are the lane's
    backend: Backend
    read: Read
    warmup: int | None  # warm-up batches; None: until the rate settles
    batches: int | None  # measured batches, after the warm-up
    duration_s: float | None  # measured seconds, after the warm-up
    precision: float | None  # say "precise" once images/s is known within this share
    max_s: float  # measuring until precise: at most this long
    enough_s: float | None  # ... or this long, once on MIN_BLOCKS full blocks (None: no)
    batch_sizes: tuple[int, ...]  # the sizes of its batches: the consumer is tuned to each


# Messages to the coordinator, (kind, lane, job, payload); `job` is -1 for the process's own:
#   ("ready", lane, -1, {"pid": int, "gpu_uuid": str | None})
#   ("consumer", lane, job, {"images_per_s", "images_per_s_error", "step_ms_p50", ...} | None)
#   ("batches", lane, job, [BatchEvent, ...])
#   ("rewarm", lane, job, [BatchEvent, ...])  measured ones that were warm-up after all (a trend)
#   ("precise", lane, job, {})           images/s is known within the precision asked for
#   ("ended", lane, job, {"stopped", "capped", "skipped_files", "build_s", "warmup_settled",
#                         "starts": [[epoch, started_ns, ready_ns], ...],
#                         "stages_ns": {stage: CPU ns} | None, "stage_images": int,
#                         "serial_ns": workers' busy ns | None, "serial_images": int,
#                         "throttling": [periods, throttled periods, throttled s] | None})
#   ("failed", lane, job, {"reason": str, "traceback": str, "input": bool})
#                                   job -1: the process is done; input: the user's input is bad


def lane_main(setup: LaneSetup, commands: Any, messages: Any, stop_run: Any, stop_all: Any) -> None:
    """The lane process's entry point (spawned by the coordinator)."""
    # Ctrl-C reaches every process of the terminal's group: the coordinator alone handles it
    # and tells the lanes to stop, so that they stop cleanly and their data is kept.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop_all.set())
    lane, parent = setup.lane, os.getppid()
    try:
        consumer = build_consumer(setup.consumer, setup.device, setup.num_classes)
    except BaseException as error:
        messages.put(("failed", lane, -1, _failure(error)))
        return
    messages.put(("ready", lane, -1, {"pid": os.getpid(), "gpu_uuid": _gpu_uuid(setup.device)}))
    alone: dict[str, Any] | None = None
    tuned: set[int] = set()
    while not stop_all.is_set():
        try:
            job: Measure | None = commands.get(timeout=0.5)
        except queue.Empty:
            if os.getppid() != parent:  # orphaned
                return
            continue
        if job is None:
            return
        try:
            sizes = [size for size in job.batch_sizes if size not in tuned]
            if sizes and setup.consumer.kind is not ConsumerKind.NONE:
                tune = _consumer_alone if alone is None else _tune
                alone = tune(consumer, setup, job, sizes) or alone
                tuned.update(sizes)
            messages.put(("consumer", lane, job.job, alone))
            ended = _measure(job, setup, consumer, messages, stop_run, stop_all, parent)
        except BaseException as error:
            if _stopping(stop_all):  # a failure the stop caused: a stop, and what came is kept
                messages.put(("ended", lane, job.job, {"stopped": True}))
            else:
                messages.put(("failed", lane, job.job, _failure(error, job)))
        else:
            messages.put(("ended", lane, job.job, ended))


def _stopping(stop_all: Any) -> bool:
    """Whether the lane is being stopped. A signal that stops a job (torchrun's SIGTERM to the
    rank's process group, a Ctrl-C) reaches the pipeline's workers as well: a loader that
    fails on its workers' deaths has met the stop, maybe a moment before this process's own
    handler saw it."""
    return bool(stop_all.wait(STOPPED_WITHIN_S))


def _next_unless_stopped(batches: Iterator[Batch], stop_all: Any) -> Batch | None:
    """The next batch; None where the pipeline failed because the lane is being stopped."""
    try:
        return next(batches)
    except Exception:
        if not _stopping(stop_all):
            raise
        return None


def _failure(error: BaseException, job: Measure | None = None) -> dict[str, Any]:
    """The "failed" message's payload: a one-line reason naming the cause, the traceback."""
    if isinstance(error, InputError):
        return {"reason": str(error), "traceback": "", "input": True}
    spec, backend = (job.spec, job.backend) if job is not None else (None, None)
    reason = failure_reason(error, spec, backend)
    return {"reason": reason, "traceback": traceback.format_exc(), "input": False}


def _measure(
    job: Measure,
    setup: LaneSetup,
    consumer: Consumer,
    messages: Any,
    stop_run: Any,
    stop_all: Any,
    parent: int,
) -> dict[str, Any]:
    """Reads the pipeline until told to stop, or until its own stop rule says so; returns how it
    ended. In epoch reading it stops only where an epoch starts, so that it measures whole
    epochs (the batch that opens the next one is dropped)."""
    lane, by_epoch = setup.lane, job.read is Read.EPOCHS
    loaders = job.spec.dataloader.num_workers if job.backend is Backend.TORCH else None
    built = time.monotonic()
    with build_pipeline(job.spec, job.backend) as pipeline:
        build_s = time.monotonic() - built
        batches = _read(pipeline, job.read)
        timer = BatchTimer(lane, device_sync(setup.device))
        warmup = Warmup(job.warmup, loaders, by_epoch, in_flight=job.spec.in_flight(job.backend))
        pending: list[BatchEvent] = []
        window = Window(job, loaders)
        flushed_ns = time.monotonic_ns()
        stopping = capped = False
        stages = StageTotals()
        while True:
            interrupted = stop_all.is_set() or os.getppid() != parent
            timer.ask()
            cpu_asked = time.process_time_ns(), time.thread_time_ns()
            batch = None if interrupted else _next_unless_stopped(batches, stop_all)
            if batch is not None:
                timer.got()
            epoch = len(pipeline.starts) - 1
            measured = window.events
            whole = not by_epoch or not measured or epoch != measured[-1].epoch
            stopping = stopping or stop_run.is_set()
            if batch is None or capped or (stopping and whole):  # the time limit is kept
                messages.put(("batches", lane, job.job, pending))
                return {
                    "stopped": batch is None,
                    "capped": capped,
                    "skipped_files": len(pipeline.skipped_files),
                    "build_s": build_s,
                    "warmup_settled": warmup.settled,
                    "starts": [
                        [i, s.started_ns, s.ready_ns] for i, s in enumerate(pipeline.starts)
                    ],
                    **stages.payload(),
                }
            assert batch is not None
            if not warmup.flushing:  # what the pipeline held ahead is taken, not stepped
                consumer.step(batch)
            event = timer.done(int(batch.labels.shape[0]), epoch)
            if warmup.warming(event):
                event = replace(event, warmup=True)
            else:
                spent = time.process_time_ns() - cpu_asked[0], time.thread_time_ns() - cpu_asked[1]
                stages.add(pipeline.last_stages, pipeline.last_serial_ns, *spent, event.size)
                window.add(event)
            pending.append(event)
            if window.events:
                done = window.done()
                capped = capped or (not done and window.capped())
                stopping = stopping or done or capped
            if timer.done_ns - flushed_ns >= FLUSH_NS:
                messages.put(("batches", lane, job.job, pending))
                pending, flushed_ns = [], timer.done_ns
                for kind, payload in window.check():
                    if kind == "rewarm":  # the window restarts, on an empty queue
                        warmup.flush()
                    messages.put((kind, lane, job.job, payload))


class Window:
    """A lane's measured window: its batches, the seconds measured since warm-up ended (what
    the caps bound), and its stop rules. Measuring until precise, the window is tested for a
    trend at growing lengths; a first half that still belongs to the start is moved into the
    warm-up (`probe.steady.transient`)."""

    def __init__(self, job: Measure, loaders: int | None) -> None:
        self.job, self.loaders = job, loaders
        self.events: list[BatchEvent] = []
        self.seconds = 0.0
        self.precise = False
        self._next_check = 0

    def add(self, event: BatchEvent) -> None:
        self.events.append(event)
        self.seconds += batch_seconds(event)

    def done(self) -> bool:
        """Whether the length the user fixed is measured."""
        job = self.job
        return (job.batches is not None and len(self.events) >= job.batches) or (
            job.duration_s is not None and self.seconds >= job.duration_s
        )

    def capped(self) -> bool:
        """Whether measuring until precise reaches a cap: its longest (`max_s`), or `enough_s`
        once the figure rests on MIN_BLOCKS blocks of a batch per worker."""
        job = self.job
        if job.precision is None:
            return False
        enough = (
            job.enough_s is not None
            and self.seconds >= job.enough_s
            and len(self.events) >= MIN_BLOCKS * block_batches(self.loaders)
        )
        return self.seconds >= job.max_s or enough

    def check(self) -> list[tuple[str, Any]]:
        """Measuring until precise: moves a start still trending into the warm-up, and tells
        when images/s is known within the precision; the messages that say so."""
        job = self.job
        out: list[tuple[str, Any]] = []
        if job.precision is None or self.precise:
            return []
        if len(self.events) >= self._next_check:  # at growing lengths: rarely by chance
            cut = transient(self.events, self.loaders)
            if cut:  # written again as warm-up: the window opens after them
                out.append(("rewarm", [replace(e, warmup=True) for e in self.events[:cut]]))
                self.events = self.events[cut:]
            self._next_check = math.ceil(TREND_CHECK_GROWTH * len(self.events))
        self.precise = _known_within(self.events, self.loaders, job.precision)
        if self.precise:
            out.append(("precise", {}))
        return out


class StageTotals:
    """The measured batches' CPU time by stage (`pipelines.loader.WORKER_STAGES` and
    `MAIN_STAGES`, as the pipeline times them; the step: what else the loop's thread spent on
    the batch, the step, its wait for the device and the loop; main_threads: the training
    process's other threads meanwhile, pin memory's and the step's own), and the lane's cgroup
    throttling from its first measured batch to its end."""

    def __init__(self) -> None:
        self.ns: dict[str, int] | None = None
        self.images = 0
        self.serial_ns = self.serial_images = 0  # the workers' busy time, where timed
        self._throttling: Throttling | None = None

    def add(
        self,
        stages: dict[str, int] | None,
        serial_ns: int | None,
        process_ns: int,
        thread_ns: int,
        images: int,
    ) -> None:
        """One measured batch: its pipeline's stages, how long its worker was busy on it, and
        the training process's CPU (all its threads, and the loop's thread alone) from asking
        for it to the end of its step."""
        if not self.images:
            self._throttling = cpu_throttling()
        self.images += images
        if serial_ns is not None:
            self.serial_ns += serial_ns
            self.serial_images += images
        if stages is None:
            return
        self.ns = self.ns or dict.fromkeys([*stages, "step", "main_threads"], 0)
        for name, spent in stages.items():
            self.ns[name] = self.ns.get(name, 0) + spent
        main = sum(stages.get(name, 0) for name in MAIN_STAGES)
        self.ns["step"] += max(0, thread_ns - main)
        self.ns["main_threads"] += max(0, process_ns - thread_ns)

    def payload(self) -> dict[str, Any]:
        throttled = None
        if self._throttling is not None and (now := cpu_throttling()) is not None:
            spent = now - self._throttling
            throttled = [spent.periods, spent.throttled_periods, spent.throttled_s]
        return {
            "stages_ns": self.ns,
            "stage_images": self.images,
            "serial_ns": self.serial_ns or None,
            "serial_images": self.serial_images,
            "throttling": throttled,
        }


def _known_within(
    measured: list[BatchEvent],
    loaders: int | None,
    precision: float,
    least_s: float = MIN_MEASURE_S,
) -> bool:
    """Whether images/s is known within `precision`, on enough blocks and `least_s` seconds."""
    if len(measured) < MIN_BLOCKS * block_batches(loaders):
        return False
    if sum(batch_seconds(e) for e in measured) < least_s:
        return False
    return images_per_s(measured, loaders).within(precision)


def _read(pipeline: InputPipeline, read: Read) -> Iterator[Batch]:
    if read is Read.STREAM:
        yield from pipeline.stream()
        return
    while True:
        yielded = False
        for batch in pipeline:
            yielded = True
            yield batch
        if not yielded:
            raise InputError(NOTHING_TO_READ)


def _synthetic(job: Measure, setup: LaneSetup, size: int) -> Batch:
    """A batch of the pipeline's shape, already on the lane's device (its values do not
    change a step's time)."""
    import torch

    device = torch.device("cpu") if setup.device is None else torch.device("cuda", setup.device)
    side = job.spec.image_size
    return Batch(
        torch.randn(size, 3, side, side, device=device),
        torch.randint(0, max(1, setup.num_classes), (size,), device=device),
    )


def _tune(consumer: Consumer, setup: LaneSetup, job: Measure, sizes: list[int]) -> None:
    """Runs the consumer on batches of each size once more than it takes to settle its choices
    (cuDNN's benchmark picks kernels per shape), so that no batch measured pays for it."""
    for size in sizes:
        batch = _synthetic(job, setup, size)
        for _ in range(3):
            consumer.step(batch)


def _consumer_alone(
    consumer: Consumer, setup: LaneSetup, job: Measure, sizes: list[int]
) -> dict[str, Any]:
    """The consumer alone on a batch already on the device, once tuned to every batch size,
    until its rate settles and is known within the precision asked (or CONSUMER_ALONE_MAX_S)."""
    tuning = time.monotonic()
    _tune(consumer, setup, job, sizes)
    batch = _synthetic(job, setup, sizes[0])
    warmup = Warmup(None, None, by_epoch=False, min_window_s=CONSUMER_WINDOW_S)
    timer = BatchTimer(setup.lane, device_sync(setup.device))
    steps: list[BatchEvent] = []
    measured: list[BatchEvent] = []
    started = time.monotonic()
    precision = job.precision or 0.03
    while time.monotonic() - started < CONSUMER_ALONE_MAX_S:
        timer.ask()
        timer.got()  # at once: the batch is on the device, and the last step waited for its work
        consumer.step(batch)
        event = timer.done(sizes[0])
        steps.append(event)
        if warmup.warming(event):
            continue
        measured.append(event)
        if len(measured) % MIN_BLOCKS == 0 and _known_within(measured, None, precision, 1.0):
            break
    if not measured:  # it never settled: its later half, whose error says how well it is known
        measured = steps[len(steps) // 2 :]
    estimate = images_per_s(measured)
    return {
        "images_per_s": estimate.value,
        "images_per_s_error": estimate.error,
        "step_ms_p50": statistics.median(e.step_s for e in measured) * 1e3 if measured else None,
        "step_ms_p50_error": median_error([e.step_s * 1e3 for e in measured]),
        "steps": len(measured),
        "batch_size": sizes[0],
        "tune_s": started - tuning,  # cuDNN's choices, per batch size
        "seconds": time.monotonic() - tuning,  # the tuning and the timing
    }


def _gpu_uuid(device: int | None) -> str | None:
    if device is None:
        return None
    from probe.measure.devices import cuda_devices

    return next((d.uuid for d in cuda_devices() if d.index == device), None)
