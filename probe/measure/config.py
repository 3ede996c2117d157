"""What a probe run is asked to do, and where: its lanes (one per GPU, or per CPU shard, or a
torchrun rank's), what it reads and for how long, checked before anything starts; and how the
run's record describes it and its host.
"""

from __future__ import annotations

import importlib.metadata
import math
import platform
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipelines import (
    Backend,
    InputError,
    PipelineSpec,
    available_cpus,
    check_backend,
    cpu_limits,
    discover,
    shm_free_mib,
)
from pipelines.dataset import read_order, shard
from pipelines.spec import bytes_text
from probe.measure.consumers import ConsumerSpec, consumer_note
from probe.measure.devices import CudaDevice, cuda_devices
from probe.measure.distributed import Rank
from probe.measure.lane import Read
from probe.measure.samplers.host import host_facts
from probe.measure.samplers.nvml import GpuSampler
from probe.steady import MAX_MEASURE_S, PRECISION


@dataclass(frozen=True)
class LanePlan:
    lane: int
    device: CudaDevice | None  # None: the CPU
    shard_id: int
    num_shards: int


def plan_lanes(gpus: Sequence[CudaDevice] | None, num_shards: int | None) -> tuple[LanePlan, ...]:
    """One lane per GPU reading shard i of N (N: `num_shards`, default the GPU count); on the
    CPU, one lane per shard.

    Raises:
        InputError: fewer shards than GPUs, or fewer than one.
    """
    if num_shards is not None and num_shards < 1:
        raise InputError(f"--num-shards must be >= 1 (got {num_shards})")
    if gpus is None:
        count = num_shards or 1
        return tuple(LanePlan(i, None, i, count) for i in range(count))
    shards = num_shards or len(gpus)
    if shards < len(gpus):
        raise InputError(
            f"--num-shards {shards} is fewer than the {len(gpus)} GPUs chosen: "
            "each GPU reads a shard of its own"
        )
    return tuple(LanePlan(i, gpu, i, shards) for i, gpu in enumerate(gpus))


def rank_plan(rank: Rank, gpus: Sequence[CudaDevice]) -> LanePlan:
    """A torchrun rank's lane: cuda:LOCAL_RANK (the CPU when `gpus` is empty), shard RANK of
    WORLD_SIZE.

    Raises:
        InputError: GPUs are visible but fewer than the node's ranks.
    """
    device = None
    if gpus:
        if rank.local_rank >= len(gpus):
            raise InputError(
                f"LOCAL_RANK {rank.local_rank} has no GPU: {len(gpus)} visible for "
                f"{rank.local_world_size} ranks on this node (one GPU per rank)"
            )
        device = gpus[rank.local_rank]
    return LanePlan(rank.rank, device, rank.rank, rank.world_size)


@dataclass(frozen=True)
class ProbeConfig:
    """A probe run: the pipeline, where its lanes run, what consumes the batches, how it reads
    and how long it measures."""

    backend: Backend
    spec: PipelineSpec  # shared settings; each lane sets its device and shard
    lanes: tuple[LanePlan, ...]
    consumer: ConsumerSpec
    read: Read = Read.STREAM
    warmup: int | None = None  # warm-up batches per lane; None: until the rate settles
    batches: int | None = None  # measured batches per lane
    duration_s: float | None = None  # measured seconds per lane
    precision: float | None = PRECISION  # else: until images/s is known within this share ...
    max_s: float = MAX_MEASURE_S  # ... or for this long
    # ... or this long, once the figure rests on MIN_BLOCKS blocks of a batch per worker (a
    # session's point: the rest of its budget goes to other points); None: no such stop
    enough_s: float | None = None
    sample_hz: float = 10.0  # 0: no sampling
    stall_s: float | None = None  # a lane silent this long is stopped; None: from its rate
    label: str | None = None
    torchrun: bool = False  # one rank's lane of a run launched by torchrun
    metrics_port: int | None = None  # the lanes' figures for Prometheus (+ LOCAL_RANK)
    cores: str | None = None  # the cores it was kept to (--cores); None: the process's own

    def __post_init__(self) -> None:
        if not self.lanes:
            raise InputError("a run needs at least one lane")
        if self.warmup is not None and (isinstance(self.warmup, bool) or self.warmup < 0):
            raise InputError(f"--warmup must be auto or >= 0 (got {self.warmup})")
        if self.batches is not None and self.batches < 1:
            raise InputError(f"--batches must be >= 1 (got {self.batches})")
        if self.duration_s is not None and not self.duration_s > 0:
            raise InputError(f"--duration must be > 0 seconds (got {self.duration_s})")
        if self.precision is not None and not 0 < self.precision < 1:
            raise InputError(f"--precision must be within 0..100% (got {self.precision:.0%})")
        if self.batches is None and self.duration_s is None and self.precision is None:
            raise InputError("give --batches, --duration or --precision: when to stop measuring")
        if not self.max_s > 0:
            raise InputError(f"the longest measurement must be > 0 seconds (got {self.max_s})")
        if not 0 <= self.sample_hz <= 1000:
            raise InputError(f"--sample-hz must be within 0..1000 (got {self.sample_hz})")
        if self.stall_s is not None and not self.stall_s > 0:
            raise InputError(f"--stall-s must be auto or > 0 seconds (got {self.stall_s:g})")

    @property
    def until_precise(self) -> bool:
        """Whether it measures until images/s is known within `precision` (no fixed length)."""
        return self.batches is None and self.duration_s is None

    def lane_spec(self, plan: LanePlan) -> PipelineSpec:
        device = None if plan.device is None else plan.device.index
        return replace(self.spec, device=device, shard_id=plan.shard_id, num_shards=plan.num_shards)


@dataclass(frozen=True)
class Checked:
    """What checking a configuration found out: the dataset's class count, and each lane's
    shard size."""

    num_classes: int
    shard_images: dict[int, int]  # lane -> images in its shard
    notes: tuple[str, ...] = ()  # what the user should know about the data (stored with the run)


def check_config(config: ProbeConfig) -> Checked:
    """Checks what can be checked before a run starts.

    Raises:
        InputError: the dataset, a shard, the reading or the backend cannot work.
    """
    check_backend(config.backend)
    check_batch_fits(config)
    dataset = read_order(
        discover(config.spec.data_dir), shuffle=config.spec.shuffle, seed=config.spec.seed
    )
    sizes = {}
    notes = []
    if dataset.skipped_links:
        notes.append(
            f"skipped {len(dataset.skipped_links)} link(s) to folders inside the dataset (a loop, "
            f"or images read already), e.g. {dataset.skipped_links[0]}: each folder is read once"
        )
    batch = config.spec.batch_size
    for plan in config.lanes:
        images = len(shard(dataset, plan.shard_id, plan.num_shards))
        if config.read is Read.EPOCHS and images < batch:
            raise InputError(
                f"--read epochs needs a whole batch per epoch: shard {plan.shard_id} of "
                f"{plan.num_shards} holds {images} images, fewer than the batch size {batch} "
                "(read it as a stream, or give a smaller --batch-size)"
            )
        if images < batch:
            notes.append(
                f"shard {plan.shard_id} of {plan.num_shards} holds {images} images, fewer than "
                f"the batch size {batch}: each batch holds some images more than once"
            )
        sizes[plan.lane] = images
    return Checked(len(dataset.classes), sizes, tuple(notes))


def check_batch_fits(config: ProbeConfig) -> None:
    """Refuses a batch larger than the host's memory, or than a lane's GPU's: it could only
    fail, after its processes started and built their pipelines."""
    from probe.measure.samplers.host import memory_bytes

    spec, backend = config.spec, config.backend
    needed = spec.batch_bytes(backend)
    memory = memory_bytes()
    places = [("this host's memory", memory)] + [
        (f"cuda:{plan.device.index}'s memory", plan.device.memory_mib * 2**20)
        for plan in config.lanes
        if plan.device is not None
    ]
    for where, limit in places:
        if needed > limit:
            raise InputError(
                f"one {spec.batch_text(backend)} is more than {where} ({bytes_text(limit)}): "
                "give a smaller --batch-size or --image-size"
            )


def batch_sizes(config: ProbeConfig, images: int) -> tuple[int, ...]:
    """The batch sizes a lane's consumer will see: full ones, and where epochs end, the last
    one of an epoch (a stream of the DataLoader has full batches only)."""
    batch, last = config.spec.batch_size, images % config.spec.batch_size
    stream = config.read is Read.STREAM and config.backend is Backend.TORCH
    return (batch,) if stream or last == 0 else (batch, last)


def new_run_id() -> str:
    """A new run's id: its UTC start, to the second, and a random suffix."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def config_dict(config: ProbeConfig, checked: Checked) -> dict[str, Any]:
    """The run's `config`, as its record and its JSON document hold it."""
    batch = config.spec.batch_size
    return {
        "pipeline": config.backend.value,
        "spec": config.spec.as_dict(),
        "consumer": str(config.consumer),
        "consumer_note": consumer_note(config.consumer),
        "read": config.read.value,
        "warmup": "auto" if config.warmup is None else config.warmup,
        "batches": config.batches,
        "duration_s": config.duration_s,
        "precision": config.precision if config.until_precise else None,
        "max_s": config.max_s,
        "enough_s": config.enough_s,
        "sample_hz": config.sample_hz,
        "stall_s": config.stall_s,
        "cores": config.cores,
        "num_classes": checked.num_classes,
        "data_notes": list(checked.notes),
        "world_size": config.lanes[0].num_shards if config.torchrun else len(config.lanes),
        "torchrun": config.torchrun,
        "lanes": [
            {
                "lane": plan.lane,
                "gpu": None if plan.device is None else plan.device.index,
                "shard_id": plan.shard_id,
                "num_shards": plan.num_shards,
                "images": checked.shard_images[plan.lane],
                "batches_per_epoch": math.ceil(checked.shard_images[plan.lane] / batch),
            }
            for plan in config.lanes
        ],
    }


def describe_host(gpus: GpuSampler | None) -> dict[str, Any]:
    """This host as a run records it; `clock` (its monotonic and wall clocks read together)
    lets a run's lanes from several hosts share one time axis."""
    import torch

    devices = cuda_devices()
    return {
        "hostname": socket.gethostname(),
        "clock": {"monotonic_ns": time.monotonic_ns(), "unix_ns": time.time_ns()},
        "cpus": available_cpus(),  # the cores it may use: affinity and cgroup quota included
        "cpu_limits": cpu_limits().to_json(),
        "shm_free_mib": shm_free_mib(),
        **host_facts(),
        "gpus": [
            {"index": d.index, "uuid": d.uuid, "name": d.name, "memory_mib": round(d.memory_mib)}
            for d in devices
        ],
        "driver": gpus.driver_version() if gpus is not None else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dali": _installed_version("nvidia-dali-cuda120", "nvidia-dali-cuda130"),
    }


def _installed_version(*distributions: str) -> str | None:
    for name in distributions:
        try:
            return f"{importlib.metadata.version(name)} ({name})"
        except importlib.metadata.PackageNotFoundError:
            continue
    return None
