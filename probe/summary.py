"""A run's figures, from its stored events and samples (pure functions, no hardware).

Warm-up batches count in no figure. A lane's measured time is the sum of its measured batches'
times, each its wait plus its step (`probe.steady`): images/s is images over that time, with its
95% error; data-wait the share of it spent waiting for batches, with its error; batch latency the
time of one whole iteration. What epoch starts cost is a figure of its own. GPU figures are
means over the measured window, of the lane's GPU.
"""

from __future__ import annotations

import math
import shlex
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from probe.samplers import GpuSample, LaneCpuSample
from probe.steady import batch_seconds, data_wait, epoch_starts, images_per_s
from probe.store import BatchEvent, LaneRecord, RunRecord, Store

RUN_SCHEMA = "feedscope.run/1"


def lane_figures(
    events: Sequence[BatchEvent],
    gpu_samples: Sequence[GpuSample] = (),
    cpu_samples: Sequence[LaneCpuSample] = (),
    *,
    reading: Reading | None = None,
    starts: Sequence[Sequence[int]] | None = None,
) -> dict[str, Any]:
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
    figures: dict[str, Any] = {
        "warmup_batches": len(warmup),
        "warmup_s": sum(batch_seconds(e) for e in warmup),
        "batches": len(measured),
        "images": sum(e.size for e in measured),
        "seconds": 0.0,
        "images_per_s": 0.0,
        "images_per_s_error": None,
        "data_wait_frac": None,
        "data_wait_frac_error": None,
        "blocks": 0,
        "epoch_start": None,
        "batch_latency_ms": {"p50": None, "p95": None, "p99": None},
        "wait_ms_p50": None,
        "step_ms_p50": None,
        "sm_active_pct": None,
        "sm_active_source": None,
        "kernel_active_pct": None,
        "sm_occupancy_pct": None,
        "nvjpg_pct": None,
        "memory_used_mib": None,
        "cpu_pct": None,
        "main_thread_cpu_pct": None,
    }
    if not measured:
        return figures
    rate = images_per_s(measured, reading.loaders)
    wait = data_wait(measured, reading.loaders)
    latencies = [batch_seconds(e) * 1e3 for e in measured]
    figures.update(
        seconds=sum(batch_seconds(e) for e in measured),
        images_per_s=rate.value,
        images_per_s_error=rate.error,
        data_wait_frac=min(1.0, wait.value),
        data_wait_frac_error=wait.error,
        blocks=rate.blocks,
        epoch_start=_epoch_start(events, reading, starts),
        batch_latency_ms=percentiles(latencies),
        wait_ms_p50=statistics.median(e.wait_s * 1e3 for e in measured),
        step_ms_p50=statistics.median(e.step_s * 1e3 for e in measured),
    )
    start_ns = measured[0].t_ns
    end_ns = max(e.t_ns + int(batch_seconds(e) * 1e9) for e in measured)
    gpu = _covering(gpu_samples, start_ns, end_ns)
    sm_active = _mean([s.sm_active_pct for s in gpu])
    kernel_active = _mean([s.kernel_active_pct for s in gpu])
    figures.update(
        sm_active_pct=sm_active if sm_active is not None else kernel_active,
        sm_active_source="gpm"
        if sm_active is not None
        else "nvml"
        if kernel_active is not None
        else None,
        kernel_active_pct=kernel_active,
        sm_occupancy_pct=_mean([s.sm_occupancy_pct for s in gpu]),
        nvjpg_pct=_mean([s.nvjpg_pct for s in gpu]),
        memory_used_mib=_max([s.memory_used_mib for s in gpu]),
    )
    cpu = _covering(cpu_samples, start_ns, end_ns)
    figures.update(
        cpu_pct=_mean([s.cpu_pct for s in cpu]),
        main_thread_cpu_pct=_mean([s.main_thread_cpu_pct for s in cpu]),
    )
    return figures


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


def _epoch_start(
    events: Sequence[BatchEvent], reading: Reading, starts: Sequence[Sequence[int]] | None
) -> dict[str, Any] | None:
    """What the measured epoch starts cost, split (where the lane saw its loader start) into
    the loader's start and the prefetch's refill."""
    found = epoch_starts(events, reading.opening)
    if found is None:
        return None
    starting = None
    if starts:
        opened = {e.epoch for i, e in enumerate(events) if i and e.epoch != events[i - 1].epoch}
        measured = {e.epoch for e in events if not e.warmup}
        spans = [(ready - begun) / 1e9 for epoch, begun, ready in starts
                 if epoch in opened & measured]  # fmt: skip
        starting = min(found.stall_s, sum(spans) / len(spans)) if spans else None
    return {
        "starts": found.starts,
        "batches_per_epoch": found.batches_per_epoch,
        "opening_batches": found.opening_batches,
        "stall_ms": found.stall_s * 1e3,
        "share": found.share,
        "steady_images_per_s": found.steady_images_per_s,
        "loader_start_ms": None if starting is None else starting * 1e3,
        "refill_ms": None if starting is None else (found.stall_s - starting) * 1e3,
    }


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p95 and p99 (inclusive method: never outside the values seen)."""
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    if len(values) == 1:
        return {"p50": values[0], "p95": values[0], "p99": values[0]}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p95": cuts[94], "p99": cuts[98]}


def figures_from_store(
    store: Store, run: RunRecord, lane: LaneRecord, starts: Sequence[Sequence[int]] | None = None
) -> dict[str, Any]:
    """A lane's figures, computed from what the store holds for it."""
    gpu = store.gpu_samples(run.run_id, lane.gpu_uuid) if lane.gpu_uuid else []
    cpu = [s for s in store.lane_cpu(run.run_id) if s.lane == lane.lane]
    events = store.batches(run.run_id, lane.lane)
    return lane_figures(events, gpu, cpu, reading=Reading.of(run), starts=starts)


def run_document(store: Store, run_id: str) -> dict[str, Any]:
    """A run as one JSON-ready document (schema `feedscope.run/1`)."""
    run = store.run(run_id)
    lanes = []
    for lane in store.lanes(run.run_id):
        figures = lane.summary if lane.summary is not None else figures_from_store(store, run, lane)
        lanes.append(
            {
                "lane": lane.lane,
                "gpu": lane.gpu_index,
                "gpu_uuid": lane.gpu_uuid,
                "shard_id": lane.shard_id,
                "num_shards": lane.num_shards,
                "hostname": lane.hostname,
                "status": lane.status.value,
                "reason": lane.reason,
                **figures,
            }
        )
    return {
        "schema": RUN_SCHEMA,
        "run_id": run.run_id,
        "kind": run.kind,
        "status": run.status.value,
        "reason": run.reason,
        "created": run.created,
        "label": run.label,
        "pipeline": run.pipeline,
        "consumer": run.consumer,
        "images_per_s": sum(lane["images_per_s"] for lane in lanes),
        "seconds": None if run.ended_ns is None else (run.ended_ns - run.started_ns) / 1e9,
        "config": run.config,
        "host": run.host,
        "samples": store.sample_counts(run.run_id),
        "unavailable_metrics": [
            {"source": u.source, "device": u.device or None, "metric": u.metric, "reason": u.reason}
            for u in store.unavailable(run.run_id)
        ],
        "lanes": lanes,
    }


def images_per_s_error(lanes: Sequence[dict[str, Any]]) -> float | None:
    """The error of all lanes' images/s: theirs, added in quadrature (None if one is not
    known)."""
    errors = [lane.get("images_per_s_error") for lane in lanes]
    known = [float(e) for e in errors if e is not None]
    return math.hypot(*known) if known and len(known) == len(errors) else None


def run_brief(document: dict[str, Any]) -> dict[str, Any]:
    """A run's headline figures, for comparing runs side by side: images/s (and its error, the
    lanes' added in quadrature), the worst lane's data-wait, the lanes' mean GPU busy-ness (and
    its metric, where all lanes share one), and the CPU cores its lanes used."""
    lanes = document["lanes"]
    busy = [x["sm_active_pct"] for x in lanes if x["sm_active_pct"] is not None]
    sources = {x["sm_active_source"] for x in lanes} - {None}
    waits = [x["data_wait_frac"] for x in lanes if x["data_wait_frac"] is not None]
    cpu = [x["cpu_pct"] for x in lanes if x.get("cpu_pct") is not None]
    return {
        "run": document["run_id"],
        "name": document["label"] or f"{document['pipeline']} {document['run_id'][-4:]}",
        "label": document["label"],
        "pipeline": document["pipeline"],
        "consumer": document["consumer"],
        "status": document["status"],
        "images_per_s": document["images_per_s"],
        "images_per_s_error": images_per_s_error(lanes),
        "data_wait_frac": max(waits) if waits else None,
        "sm_active_pct": sum(busy) / len(busy) if busy else None,
        "sm_active_source": sources.pop() if len(sources) == 1 else None,
        "cpu_cores": sum(cpu) / 100 if cpu else None,
    }


def reproduce_command(document: dict[str, Any]) -> str | None:
    """The `probe run` command line that measures a run's configuration again (under torchrun
    for a run of ranks); None for a watched training loop."""
    if document["kind"] != "probe":
        return None
    config = document["config"]
    spec = config["spec"]
    gpus = [lane["gpu"] for lane in config["lanes"]]
    loader, dali = spec["dataloader"], spec["dali"]
    options: list[tuple[str, object]] = [
        ("--pipeline", config["pipeline"]),
        ("--data", spec["data_dir"]),
        ("--gpus", "none" if None in gpus else ",".join(map(str, gpus))),
        ("--num-shards", config["lanes"][0]["num_shards"]),
        ("--batch-size", spec["batch_size"]),
        ("--image-size", spec["image_size"]),
    ]
    if config["pipeline"] == "dali":
        options += [("--threads", dali["num_threads"]), ("--decoder", dali["decoder"])]
    else:
        options += [("--workers", loader["num_workers"]), ("--dtype", loader["output_dtype"])]
        if loader.get("start_method"):
            options.append(("--start-method", loader["start_method"]))
    precision = config.get("precision")
    options += [
        ("--consumer", config["consumer"]),
        ("--read", config.get("read", "epochs")),
        ("--warmup", config["warmup"]),
        ("--batches", config["batches"]),
        ("--duration", config["duration_s"]),
        ("--precision", None if precision is None else f"{precision:.1%}".replace(".0%", "%")),
        ("--sample-hz", config["sample_hz"]),
    ]
    words = ["probe", "run"]
    if config.get("torchrun"):
        words = ["torchrun", f"--nproc-per-node={config['world_size']}", "-m", "probe", "run"]
        options = [(flag, value) for flag, value in options if flag != "--num-shards"]
        if None not in gpus:
            options = [(flag, value) for flag, value in options if flag != "--gpus"]
    for flag, value in options:
        if value is not None:
            words += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    if spec["skip_corrupt"]:
        words.append("--skip-corrupt")
    if config["pipeline"] == "torch" and not loader.get("persistent_workers", True):
        words.append("--no-persistent-workers")
    return shlex.join(words)


_Timed = TypeVar("_Timed", GpuSample, LaneCpuSample)


def _covering(samples: Sequence[_Timed], start_ns: int, end_ns: int) -> list[_Timed]:
    """The samples within [start, end], and the first after it: a sample covers the interval
    that ends at its time, so that one covers the window's end (or all of a short window)."""
    inside = [s for s in samples if start_ns <= s.t_ns <= end_ns]
    after = next((s for s in samples if s.t_ns > end_ns), None)
    return inside + ([after] if after is not None else [])


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _max(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None
