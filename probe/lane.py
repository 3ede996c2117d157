"""One lane: one pipeline on one device and shard, feeding one consumer, in its own process.

A lane times every batch: how long the consumer waited for it (until it was ready on the device,
the copy included) and how long the consumer's step took. It sends the events to the
coordinating process in small bundles; it does not touch the store. The first `warmup` batches
are sent marked as warm-up: they pay for starting workers, DALI's allocations and cuDNN's choices.
"""

from __future__ import annotations

import os
import signal
import time
import traceback
from dataclasses import dataclass
from typing import Any

from pipelines import Backend, InputError, PipelineSpec, build_pipeline
from probe.consumers import ConsumerSpec, build_consumer
from probe.devices import device_sync
from probe.store import BatchEvent

FLUSH_NS = 250_000_000  # events reach the coordinator at least this often


@dataclass(frozen=True)
class LaneJob:
    lane: int
    spec: PipelineSpec  # its device and shard are the lane's
    backend: Backend
    consumer: ConsumerSpec
    warmup: int
    batches: int | None  # measured batches, after the warm-up
    duration_s: float | None  # measured seconds, after the warm-up
    num_classes: int


# Messages to the coordinator, (kind, lane, payload):
#   ("started", lane, {"pid": int, "gpu_uuid": str | None})
#   ("batches", lane, [BatchEvent, ...])
#   ("ended", lane, {"stopped": bool, "skipped_files": int})   finished, or stopped when asked
#   ("failed", lane, {"reason": str, "traceback": str})


def lane_main(job: LaneJob, messages: Any, stop: Any) -> None:
    """The lane process's entry point (spawned by the coordinator)."""
    # Ctrl-C reaches every process of the terminal's group: the coordinator alone handles it
    # and tells the lanes to stop, so that they stop cleanly and their data is kept.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stopped, skipped = _run(job, messages, stop)
    except InputError as error:
        messages.put(("failed", job.lane, {"reason": str(error), "traceback": ""}))
    except BaseException as error:
        reason = f"{type(error).__name__}: {error}".strip().splitlines()[0]
        messages.put(("failed", job.lane, {"reason": reason, "traceback": traceback.format_exc()}))
    else:
        messages.put(("ended", job.lane, {"stopped": stopped, "skipped_files": skipped}))


def _run(job: LaneJob, messages: Any, stop: Any) -> tuple[bool, int]:
    """Runs the lane; returns whether it was stopped before its end, and files skipped."""
    parent = os.getppid()
    device = job.spec.device
    messages.put(("started", job.lane, {"pid": os.getpid(), "gpu_uuid": _gpu_uuid(device)}))
    consumer = build_consumer(job.consumer, device, job.num_classes)
    ready = device_sync(device)
    pending: list[BatchEvent] = []
    flushed_ns = time.monotonic_ns()
    measured = 0
    first_measured_ns: int | None = None
    with build_pipeline(job.spec, job.backend) as pipeline:
        batches = pipeline.forever()
        index = 0
        while True:
            if stop.is_set() or os.getppid() != parent:  # asked to stop, or orphaned
                messages.put(("batches", job.lane, pending))
                return True, len(pipeline.skipped_files)
            asked_ns = time.monotonic_ns()
            batch = next(batches)
            ready()
            got_ns = time.monotonic_ns()
            consumer.step(batch)
            done_ns = time.monotonic_ns()
            warmup = index < job.warmup
            pending.append(
                BatchEvent(
                    lane=job.lane,
                    index=index,
                    t_ns=asked_ns,
                    wait_s=(got_ns - asked_ns) / 1e9,
                    step_s=(done_ns - got_ns) / 1e9,
                    size=int(batch.labels.shape[0]),
                    warmup=warmup,
                )
            )
            index += 1
            finished = False
            if not warmup:
                measured += 1
                if first_measured_ns is None:
                    first_measured_ns = asked_ns
                finished = (job.batches is not None and measured >= job.batches) or (
                    job.duration_s is not None
                    and (done_ns - first_measured_ns) / 1e9 >= job.duration_s
                )
            if finished or done_ns - flushed_ns >= FLUSH_NS:
                messages.put(("batches", job.lane, pending))
                pending, flushed_ns = [], done_ns
            if finished:
                return False, len(pipeline.skipped_files)


def _gpu_uuid(device: int | None) -> str | None:
    if device is None:
        return None
    from probe.devices import cuda_devices

    return next((d.uuid for d in cuda_devices() if d.index == device), None)
