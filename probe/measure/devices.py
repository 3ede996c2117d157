"""The CUDA devices this process sees, and which of them a user means by `--gpus`.

A device is named by its CUDA index (what `CUDA_VISIBLE_DEVICES` leaves visible, renumbered from
0) and identified by its UUID, which is what NVML is asked about: NVML numbers GPUs its own way.
"""

from __future__ import annotations

import resource
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from pipelines import InputError, available_cpus


@dataclass(frozen=True)
class CudaDevice:
    index: int  # CUDA index in this process
    uuid: str  # "GPU-..." as NVML spells it
    name: str
    memory_mib: float


_NO_CUDA: list[str] = []  # why CUDA did not start in this process, once asked


def cuda_devices() -> list[CudaDevice]:
    """Every CUDA device visible to this process (none without CUDA, or where it did not start:
    `cuda_failure` says why)."""
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # torch warns once where the driver fails to start
        available = torch.cuda.is_available()
    failed = [str(w.message) for w in caught if "CUDA initialization" in str(w.message)]
    if failed and not _NO_CUDA:
        _NO_CUDA.append(failed[0].split(" (Triggered")[0].split(". Did you run")[0])
    if not available:
        return []
    devices = []
    for index in range(torch.cuda.device_count()):
        properties = torch.cuda.get_device_properties(index)
        uuid = str(properties.uuid)
        devices.append(
            CudaDevice(
                index=index,
                uuid=uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}",
                name=properties.name,
                memory_mib=properties.total_memory / 2**20,
            )
        )
    return devices


def cuda_failure() -> str:
    """Why CUDA did not start here (after `cuda_devices`), with the address-space limit where
    one is set (`ulimit -v`: the driver reserves far more address space than it uses), or ""."""
    if not _NO_CUDA:
        return ""
    why = _NO_CUDA[0].removeprefix("CUDA initialization: ")
    limit, _ = resource.getrlimit(resource.RLIMIT_AS)
    if limit != resource.RLIM_INFINITY:
        why += (
            f"; this process's address space is limited to {limit / 2**30:.1f} GiB (ulimit -v), "
            "too little for CUDA to start: raise it (ulimit -v unlimited)"
        )
    return f"CUDA did not start ({why})"


def host_cores() -> int:
    """The CPU cores this process may use (its affinity and cgroup quota counted), for the
    dashboard, which reaches the host through `probe`."""
    return available_cpus()


def loop_device(default: int | None) -> int | None:
    """The CUDA device a running training loop uses: the current one once CUDA is in use, else
    `default` (a rank's LOCAL_RANK); `default` too where the current one is still device 0, as
    it stays in a rank that puts its tensors on `cuda:LOCAL_RANK` without `set_device`. None
    where torch is not loaded (a loop on CUDA has imported it) or sees no CUDA. Imports
    nothing: it must not load torch into a loop that does not use it."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    current = int(torch.cuda.current_device()) if torch.cuda.is_initialized() else 0
    return default if current == 0 and default is not None else current


def describe(devices: list[CudaDevice]) -> str:
    """`0 (NVIDIA H200), 1 (NVIDIA H200)`, or `none`."""
    return ", ".join(f"{d.index} ({d.name})" for d in devices) or "none"


def select_gpus(text: str | None, devices: list[CudaDevice]) -> list[CudaDevice] | None:
    """The GPUs `--gpus` names: `0,1`, `all`, or `none` (the CPU: returns None).

    Without `--gpus` (text None): every visible GPU, or the CPU where there is none.

    Raises:
        InputError: an index that is not there, or a GPU asked for on a machine without CUDA;
            the message lists what is available.
    """
    if text is None:
        return devices or None
    wanted = text.strip().lower()
    if wanted in ("none", "cpu"):
        return None
    if wanted == "all":
        if not devices:
            raise InputError(
                f"--gpus all: {cuda_failure() or 'no CUDA GPU is visible here'}; use --gpus none "
                "for the CPU"
            )
        return devices
    try:
        indices = [int(part) for part in wanted.split(",") if part.strip()]
    except ValueError:
        raise InputError(
            f"--gpus takes CUDA indices like 0,1, or all, or none (got {text!r})"
        ) from None
    if not indices:
        raise InputError(f"--gpus takes CUDA indices like 0,1, or all, or none (got {text!r})")
    if len(set(indices)) != len(indices):
        raise InputError(f"--gpus names a GPU twice: {text!r}")
    by_index = {d.index: d for d in devices}
    missing = [i for i in indices if i not in by_index]
    if missing:
        if not devices:
            raise InputError(
                f"GPU {missing[0]} was asked for, but "
                + (cuda_failure() or "CUDA sees no GPU here")
                + "; available: the CPU (--gpus none)"
            )
        raise InputError(
            f"GPU {missing[0]} does not exist; available: {describe(devices)} (or --gpus none)"
        )
    return [by_index[i] for i in indices]


def device_spin(device: int) -> Callable[[int], None]:
    """A function that queues, on the device's current stream, one thread spinning for a number
    of clock cycles: the stream stays in use while its SMs are free for other streams' kernels."""
    import torch

    def spin(cycles: int) -> None:
        with torch.cuda.device(device):
            torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]

    return spin


def device_sync(device: int | None) -> Callable[[], None]:
    """A function that waits until the work queued on the device's current stream is done.

    Only that stream: a device-wide synchronize would also wait for DALI, which decodes the next
    batches ahead on streams of its own, and so hide the overlap a pipeline really gives.
    """
    if device is None:
        return lambda: None
    import torch

    stream = torch.cuda.current_stream(device)
    return stream.synchronize
