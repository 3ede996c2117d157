"""The records that travel from measuring to storing to judging: batch events, hardware
samples, and a run, its lanes and sessions as the store keeps them. Frozen, typed, no behaviour.

Times are `time.monotonic_ns()`, the clock the lanes stamp their batches with (system-wide on
Linux), so samples and batches line up. `None` means "not measured": unavailable on this GPU or
driver, or not yet known (a GPM window that has not closed).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant. GPM values are those of the last 1 s window that closed."""

    t_ns: int
    gpu_uuid: str
    kernel_active_pct: float | None  # share of time a kernel ran: overstates busy-ness
    sm_active_pct: float | None  # share of SMs busy (GPM, Hopper and newer)
    sm_occupancy_pct: float | None  # active warps over the maximum (GPM)
    nvjpg_pct: float | None  # hardware JPEG decoder (NVML)
    nvjpg_gpm_pct: float | None  # hardware JPEG decoders, mean over engines (GPM)
    memory_used_mib: float | None
    pcie_rx_mib_s: float | None
    pcie_tx_mib_s: float | None
    power_w: float | None
    clocks_event_reasons: int | None  # NVML's bit mask: why clocks are below their maximum


@dataclass(frozen=True)
class HostSample:
    """The host's CPUs, disks and memory over the interval that ends at `t_ns`."""

    t_ns: int
    cpu_pct: float  # all cores, busy share (steal and iowait excluded)
    per_core_pct: tuple[float, ...]
    iowait_pct: float | None
    steal_pct: float | None  # time a hypervisor gave this machine's CPUs to others
    disk_read_mib_s: float | None
    memory_used_mib: float | None
    tree_cpu_pct: float | None  # the run's processes together, in % of one core
    tree_processes: int | None
    # busy share of the cores the run's processes may run on (their affinity; None: not known)
    job_cpu_pct: float | None = None


@dataclass(frozen=True)
class LaneCpuSample:
    """One lane's processes over the interval that ends at `t_ns`, in % of one core."""

    t_ns: int
    lane: int
    cpu_pct: float  # the lane process and its children (DataLoader workers)
    main_cpu_pct: float  # the lane process alone, its threads included (DALI's, pin memory)
    main_thread_cpu_pct: float  # the Python thread that runs the loop
    processes: int
    threads: int
    # Read once a second with the process trees (None where not read): the proportional set
    # size of the lane's processes (shared pages split among their sharers, not RSS, which
    # counts them once per worker), and the most busy threads (10% of a core or more) any one
    # DataLoader worker runs.
    pss_mib: float | None = None
    worker_threads: int | None = None


@dataclass(frozen=True)
class Unavailable:
    """A metric this machine cannot give, recorded once."""

    source: str  # "gpu" or "host"
    device: str  # GPU UUID, or "" for the host or all GPUs
    metric: str
    reason: str


class RunStatus(str, Enum):
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


# How a lane's reason begins where another rank of its job ending stopped it: the other rank's
# reason, not this one, says why the run ended.
STOPPED_FOR = "stopped for rank "


def stopped_for_another(reason: str | None) -> bool:
    """Whether a lane's reason says another rank's end stopped it (`STOPPED_FOR`)."""
    return (reason or "").startswith(STOPPED_FOR)


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    kind: str  # "probe"
    created: str  # UTC, ISO 8601: for people; durations come from the monotonic clock
    status: RunStatus
    reason: str | None
    pipeline: str  # "torch" or "dali"
    consumer: str
    label: str | None
    config: dict[str, Any]
    host: dict[str, Any]
    hostname: str
    pid: int | None  # the process that writes the run
    started_ns: int  # time.monotonic_ns() of the host that ran it
    ended_ns: int | None
    session_id: str | None = None  # the sweep or doctor session it belongs to


@dataclass(frozen=True)
class SessionRecord:
    """A sweep or a doctor session: several runs and what was concluded from them."""

    session_id: str  # "sweep-..." or "doctor-..."
    kind: str  # "sweep" or "doctor"
    created: str
    status: RunStatus
    reason: str | None
    hostname: str
    pid: int | None
    document: dict[str, Any]


@dataclass(frozen=True)
class TuneRecord:
    """A `probe tune` session: a watched run's candidates, each measured on the job itself
    (its trials, their runs and the pick in `document`)."""

    tune_id: str  # "tune-..."
    run_id: str  # the watched run it tuned
    created: str
    status: RunStatus
    reason: str | None
    document: dict[str, Any]


@dataclass(frozen=True)
class LaunchRecord:
    """A probe command started by the dashboard, in a process of its own."""

    launch_id: str
    command: str  # "run", "sweep" or "doctor"
    argv: list[str]  # the probe command's arguments
    devices: list[str]  # "cpu", or GPU indices as text
    created: str
    pid: int | None
    status: RunStatus
    exit_code: int | None
    log_path: str
    ended: str | None


@dataclass(frozen=True)
class LaneRecord:
    run_id: str
    lane: int
    gpu_index: int | None
    gpu_uuid: str | None
    shard_id: int
    num_shards: int
    hostname: str
    pid: int | None
    status: RunStatus
    reason: str | None
    summary: dict[str, Any] | None  # the lane's figures, written when it ends
    traceback: str | None = None  # where a failed lane failed, whole (its reason is one line)


@dataclass(frozen=True)
class BatchEvent:
    """One batch as the consumer saw it."""

    lane: int
    index: int
    t_ns: int  # when the consumer asked for it
    wait_s: float  # blocked on the pipeline, the copy to the device included
    step_s: float  # the consumer's step
    size: int
    warmup: bool
    # Which reading of the loader it came from: an epoch's `for` (a stream is one reading).
    epoch: int = 0
    # The wait lasted until the batch was ready on the device. False (`watch` on a GPU): until
    # the loader handed it over; a copy still under way then falls into the step.
    synced: bool = True


@dataclass(frozen=True)
class BatchAcross:
    """One batch index as every lane measured it: its steps' and its batch times' (wait plus
    step) shortest and longest across the lanes, in seconds."""

    step_min_s: float
    step_max_s: float
    batch_min_s: float
    batch_max_s: float


@dataclass(frozen=True)
class RunExport:
    """A run's lanes with everything recorded for them, as one store hands them to another:
    the ranks of a torchrun probe to rank 0, and `probe merge`."""

    run: RunRecord
    lanes: list[LaneRecord]
    batches: list[BatchEvent]
    gpu: list[GpuSample]
    host: dict[str, list[HostSample]]  # by hostname
    lane_cpu: list[LaneCpuSample]
    unavailable: list[Unavailable]
