"""A run's figures, from its stored events and samples (pure functions, no hardware).

Warm-up batches count in no figure. A lane's measured window runs from the moment its consumer
asked for its first measured batch to the end of its last step; images/s is images over that
window, data-wait the share of it spent waiting for batches, and batch latency the time of one
whole iteration (wait plus step). GPU figures are means over the same window, of the lane's GPU.
"""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Sequence
from typing import Any, TypeVar

from probe.samplers import GpuSample, LaneCpuSample
from probe.store import BatchEvent, LaneRecord, RunRecord, Store

RUN_SCHEMA = "feedscope.run/1"


def lane_figures(
    events: Sequence[BatchEvent],
    gpu_samples: Sequence[GpuSample] = (),
    cpu_samples: Sequence[LaneCpuSample] = (),
) -> dict[str, Any]:
    """One lane's figures.

    Args:
        events: the lane's batch events, warm-up ones included (they are left out here).
        gpu_samples: samples of the lane's GPU (any time span: the window is cut here).
        cpu_samples: the lane's CPU samples.
    """
    measured = [e for e in events if not e.warmup]
    figures: dict[str, Any] = {
        "warmup_batches": len(events) - len(measured),
        "batches": len(measured),
        "images": sum(e.size for e in measured),
        "seconds": 0.0,
        "images_per_s": 0.0,
        "data_wait_frac": None,
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
    start_ns = measured[0].t_ns
    end_ns = max(e.t_ns + int((e.wait_s + e.step_s) * 1e9) for e in measured)
    seconds = (end_ns - start_ns) / 1e9
    latencies = [(e.wait_s + e.step_s) * 1e3 for e in measured]
    figures.update(
        seconds=seconds,
        images_per_s=figures["images"] / seconds if seconds > 0 else 0.0,
        data_wait_frac=min(1.0, sum(e.wait_s for e in measured) / seconds) if seconds > 0 else None,
        batch_latency_ms=percentiles(latencies),
        wait_ms_p50=statistics.median(e.wait_s * 1e3 for e in measured),
        step_ms_p50=statistics.median(e.step_s * 1e3 for e in measured),
    )
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


def percentiles(values: Sequence[float]) -> dict[str, float | None]:
    """p50, p95 and p99 (inclusive method: never outside the values seen)."""
    if not values:
        return {"p50": None, "p95": None, "p99": None}
    if len(values) == 1:
        return {"p50": values[0], "p95": values[0], "p99": values[0]}
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": statistics.median(values), "p95": cuts[94], "p99": cuts[98]}


def figures_from_store(store: Store, run: RunRecord, lane: LaneRecord) -> dict[str, Any]:
    """A lane's figures, computed from what the store holds for it."""
    gpu = store.gpu_samples(run.run_id, lane.gpu_uuid) if lane.gpu_uuid else []
    cpu = [s for s in store.lane_cpu(run.run_id) if s.lane == lane.lane]
    return lane_figures(store.batches(run.run_id, lane.lane), gpu, cpu)


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


def run_brief(document: dict[str, Any]) -> dict[str, Any]:
    """A run's headline figures, for comparing runs side by side: images/s, the worst lane's
    data-wait, the lanes' mean GPU busy-ness (and its metric, where all lanes share one), and
    the CPU cores its lanes used."""
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
    options += [
        ("--consumer", config["consumer"]),
        ("--warmup", config["warmup"]),
        ("--batches", config["batches"]),
        ("--duration", config["duration_s"]),
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
