"""GPU samples from NVML and GPM. `Nvml.query` is the only door into NVML.

NVML answers differently per GPU, driver and binding version: a metric may be unsupported
(NotSupported), the driver may lack a function (FunctionNotFound), the binding may lack it (an
older nvidia-ml-py), a GPU may fall off the bus (GPU is lost), or there may be no NVML at all (no
driver). Each of those makes the metric "unavailable": recorded once, with the reason, and
`None` in every sample from then on. Nothing here raises for them.

GPM (GPU Performance Monitoring, Hopper and newer) gives what utilization.gpu cannot: the share of
SMs that are busy, not the share of time some kernel ran. Its metrics are computed over windows
of at least 1 s between two GPM samples; a sample carries the last window that closed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from probe.metrics import GPU_METRICS, Source
from probe.records import GpuSample, Unavailable

logger = logging.getLogger(__name__)

GPM_WINDOW_NS = 1_000_000_000
# GPM metric ids (nvml.h, stable across versions): SM activity, SM occupancy, PCIe traffic in
# MiB/s from and to the GPU, and the hardware JPEG decoders NVJPG 0..7.
GPM_SM_UTIL, GPM_SM_OCCUPANCY = 2, 3
GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC = 20, 21
GPM_NVJPG_UTIL = tuple(range(40, 48))


class Nvml:
    """The only door into NVML: loads it lazily and turns its failures into "unavailable"."""

    def __init__(self) -> None:
        self._lib: ModuleType | None = None
        self._loaded = False
        self.unavailable: dict[tuple[str, str], str] = {}  # (device, metric) -> reason
        self._lost: set[str] = set()

    @property
    def lib(self) -> ModuleType | None:
        """The initialized pynvml module, or None where there is no NVML."""
        if not self._loaded:
            self._loaded = True
            try:
                import pynvml

                pynvml.nvmlInit()
                self._lib = pynvml
            except ImportError:
                self.mark_unavailable("", "nvml", "nvidia-ml-py is not installed")
            except Exception as error:  # NVMLError: no driver, no library, no permission
                self.mark_unavailable("", "nvml", f"NVML is not available: {_describe(error)}")
        return self._lib

    def query(self, function: str, *args: Any, device: str = "", metric: str = "") -> Any:
        """Calls `pynvml.<function>(*args)`.

        Args:
            function: the pynvml function's name.
            device: the GPU's UUID, for recording ("" for the whole library).
            metric: what the answer is recorded as when it cannot be had (default: `function`).

        Returns:
            The answer, or None if NVML cannot give it (recorded once per device and metric).
        """
        metric = metric or function
        lib = self.lib
        if lib is None or device in self._lost or (device, metric) in self.unavailable:
            return None
        call = getattr(lib, function, None)
        if call is None:
            self.mark_unavailable(
                device, metric, f"{function} is missing from nvidia-ml-py (too old)"
            )
            return None
        try:
            return call(*args)
        except lib.NVMLError_GpuIsLost:
            self._lost.add(device)
            self.mark_unavailable(device, "*", "the GPU is lost (fell off the bus or was reset)")
        except lib.NVMLError_FunctionNotFound:
            self.mark_unavailable(
                device, metric, f"{function} is missing from the driver (too old)"
            )
        except lib.NVMLError_NotSupported:
            self.mark_unavailable(device, metric, "not supported on this GPU or driver")
        except lib.NVMLError as error:
            self.mark_unavailable(device, metric, _describe(error))
        return None

    def attribute(self, name: str) -> Any:
        """A pynvml constant, structure type or function, or None (no NVML, or an old binding)."""
        lib = self.lib
        return None if lib is None else getattr(lib, name, None)

    def shutdown(self) -> None:
        if self._lib is not None:
            self.query("nvmlShutdown", metric="shutdown")
            self._lib = None

    def mark_unavailable(self, device: str, metric: str, reason: str) -> None:
        """Records that `metric` of `device` cannot be had, once."""
        if (device, metric) not in self.unavailable:
            self.unavailable[(device, metric)] = reason
            logger.info("NVML: %s unavailable on %s: %s", metric, device or "all GPUs", reason)


@dataclass(frozen=True)
class GpuInfo:
    """What NVML says of one GPU."""

    uuid: str
    name: str | None
    memory_total_mib: float | None
    index: int | None = None  # NVML's index, which DCGM's exporter labels `gpu`


class GpuSampler:
    """Samples the GPUs with the given UUIDs (the lanes' devices), keyed by UUID."""

    def __init__(self, uuids: Sequence[str], nvml: Nvml | None = None) -> None:
        self.nvml = nvml or Nvml()
        self._handles: dict[str, Any] = {}
        self._gpm: dict[str, _GpmWindow] = {}
        for uuid in dict.fromkeys(uuids):
            handle = self.nvml.query("nvmlDeviceGetHandleByUUID", uuid, device=uuid, metric="*")
            if handle is None:
                continue
            self._handles[uuid] = handle
            support = self.nvml.query(
                "nvmlGpmQueryDeviceSupport", handle, device=uuid, metric="gpm"
            )
            if support is not None and support.isSupportedDevice:
                self._gpm[uuid] = _GpmWindow(self.nvml, uuid, handle)
            elif support is not None:
                self.nvml.mark_unavailable(uuid, "gpm", "GPM needs a Hopper or newer GPU")
        self._reasons_function = (
            "nvmlDeviceGetCurrentClocksEventReasons"
            if self.nvml.attribute("nvmlDeviceGetCurrentClocksEventReasons") is not None
            else "nvmlDeviceGetCurrentClocksThrottleReasons"
        )

    def info(self, uuid: str) -> GpuInfo:
        handle = self._handles.get(uuid)
        if handle is None:
            return GpuInfo(uuid, None, None)
        name = self.nvml.query("nvmlDeviceGetName", handle, device=uuid, metric="name")
        memory = self.nvml.query("nvmlDeviceGetMemoryInfo", handle, device=uuid, metric="memory")
        index = self.nvml.query("nvmlDeviceGetIndex", handle, device=uuid, metric="index")
        return GpuInfo(
            uuid,
            name.decode() if isinstance(name, bytes) else name,
            None if memory is None else memory.total / 2**20,
            index if isinstance(index, int) else None,
        )

    def driver_version(self) -> str | None:
        version = self.nvml.query("nvmlSystemGetDriverVersion", metric="driver_version")
        return version.decode() if isinstance(version, bytes) else version

    def sample(self, t_ns: int) -> list[GpuSample]:
        return [self._sample_one(t_ns, uuid, handle) for uuid, handle in self._handles.items()]

    def unavailable(self) -> list[Unavailable]:
        """Every metric recorded unavailable so far, GPM-derived ones spelled out."""
        out = []
        for (device, metric), reason in self.nvml.unavailable.items():
            if metric == "gpm":
                names = [m.name for m in GPU_METRICS if m.source is Source.GPM]
                out += [Unavailable("gpu", device, name, reason) for name in names]
            else:
                out.append(Unavailable("gpu", device, metric, reason))
        return out

    def close(self) -> None:
        for window in self._gpm.values():
            window.close()
        self._gpm.clear()
        self.nvml.shutdown()

    def _sample_one(self, t_ns: int, uuid: str, handle: Any) -> GpuSample:
        def ask(function: str, metric: str, *args: Any) -> Any:
            return self.nvml.query(function, handle, *args, device=uuid, metric=metric)

        utilization = ask("nvmlDeviceGetUtilizationRates", "kernel_active_pct")
        jpeg = ask("nvmlDeviceGetJpgUtilization", "nvjpg_pct")
        memory = ask("nvmlDeviceGetMemoryInfo", "memory_used_mib")
        power_mw = ask("nvmlDeviceGetPowerUsage", "power_w")
        reasons = ask(self._reasons_function, "clocks_event_reasons")
        window = self._gpm.get(uuid)
        gpm = window.advance(t_ns) if window is not None else {}
        nvjpg = [gpm[m] for m in GPM_NVJPG_UTIL if m in gpm]
        return GpuSample(
            t_ns=t_ns,
            gpu_uuid=uuid,
            kernel_active_pct=None if utilization is None else float(utilization.gpu),
            sm_active_pct=gpm.get(GPM_SM_UTIL),
            sm_occupancy_pct=gpm.get(GPM_SM_OCCUPANCY),
            nvjpg_pct=None if jpeg is None else float(jpeg[0]),
            nvjpg_gpm_pct=sum(nvjpg) / len(nvjpg) if nvjpg else None,
            memory_used_mib=None if memory is None else memory.used / 2**20,
            pcie_rx_mib_s=gpm.get(GPM_PCIE_RX_PER_SEC),
            pcie_tx_mib_s=gpm.get(GPM_PCIE_TX_PER_SEC),
            power_w=None if power_mw is None else power_mw / 1000,
            clocks_event_reasons=None if reasons is None else int(reasons),
        )


class _GpmWindow:
    """GPM metrics over windows of at least 1 s, between the last two GPM samples."""

    METRICS = (GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_PCIE_TX_PER_SEC, GPM_PCIE_RX_PER_SEC)

    def __init__(self, nvml: Nvml, uuid: str, handle: Any) -> None:
        self.nvml, self.uuid, self.handle = nvml, uuid, handle
        self.samples = [self._alloc(), self._alloc()]  # the window's start and end
        self.started_ns: int | None = None
        self.last: dict[int, float] = {}
        self.metrics = self.METRICS + GPM_NVJPG_UTIL

    def advance(self, t_ns: int) -> dict[int, float]:
        """Closes a window if 1 s has passed since it opened; returns the last closed one."""
        if any(s is None for s in self.samples):
            return {}
        if self.started_ns is None:
            if self._take(self.samples[0]):
                self.started_ns = t_ns
            return {}
        if t_ns - self.started_ns < GPM_WINDOW_NS or not self._take(self.samples[1]):
            return self.last
        self.last = self._metrics(self.samples[0], self.samples[1])
        self.samples.reverse()  # this window's end opens the next one
        self.started_ns = t_ns
        return self.last

    def close(self) -> None:
        for sample in self.samples:
            if sample is not None:
                self.nvml.query("nvmlGpmSampleFree", sample, device=self.uuid, metric="gpm_free")

    def _alloc(self) -> Any:
        return self.nvml.query("nvmlGpmSampleAlloc", device=self.uuid, metric="gpm")

    def _take(self, sample: Any) -> bool:
        got = self.nvml.query(
            "nvmlGpmSampleGet", self.handle, sample, device=self.uuid, metric="gpm"
        )
        return got is not None

    def _metrics(self, first: Any, second: Any) -> dict[int, float]:
        request_type = self.nvml.attribute("c_nvmlGpmMetricsGet_t")
        if request_type is None:
            return {}
        request = request_type()
        request.version = self.nvml.attribute("NVML_GPM_METRICS_GET_VERSION") or 1
        request.numMetrics = len(self.metrics)
        request.sample1, request.sample2 = first, second
        for slot, metric_id in enumerate(self.metrics):
            request.metrics[slot].metricId = metric_id
        answer = self.nvml.query("nvmlGpmMetricsGet", request, device=self.uuid, metric="gpm")
        if answer is None:
            return {}
        values = {}
        for slot, metric_id in enumerate(self.metrics):
            entry = answer.metrics[slot]
            if entry.nvmlReturn == 0:  # engines the GPU lacks (NVJPG 7 on most) answer an error
                values[metric_id] = float(entry.value)
        return values


def _describe(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # pynvml's __str__ itself calls NVML
        return type(error).__name__
