"""What the hardware does during a run: one module per source, typed frozen samples.

`nvml` reads the GPUs (NVML and GPM, through one query function), `host` reads the CPUs, disks
and the run's processes (psutil). Only these modules import pynvml and psutil.

Times are `time.monotonic_ns()`, the clock the lanes stamp their batches with (system-wide on
Linux), so samples and batches line up. `None` means "not measured": unavailable on this GPU or
driver, or not yet known (a GPM window that has not closed).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One measured quantity: its field and column name, label with unit, and source."""

    name: str
    label: str
    source: str  # what reads it, shown next to it


# Every GPU metric, once; views and tables loop over this.
GPU_METRICS = (
    Metric("kernel_active_pct", "kernel-active % (NVML utilization.gpu)", "nvml"),
    Metric("sm_active_pct", "SM activity % (GPM)", "gpm"),
    Metric("sm_occupancy_pct", "SM occupancy % (GPM)", "gpm"),
    Metric("nvjpg_pct", "JPEG decoder % (NVML)", "nvml"),
    Metric("nvjpg_gpm_pct", "JPEG decoders % (GPM, mean of engines)", "gpm"),
    Metric("memory_used_mib", "memory used MiB", "nvml"),
    Metric("pcie_rx_mib_s", "PCIe to GPU MiB/s", "nvml"),
    Metric("pcie_tx_mib_s", "PCIe from GPU MiB/s", "nvml"),
    Metric("power_w", "power W", "nvml"),
    Metric("clocks_event_reasons", "clocks event reasons (bit mask)", "nvml"),
)


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


@dataclass(frozen=True)
class Unavailable:
    """A metric this machine cannot give, recorded once."""

    source: str  # "gpu" or "host"
    device: str  # GPU UUID, or "" for the host or all GPUs
    metric: str
    reason: str
