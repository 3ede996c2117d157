"""The NVML/GPM sampler against a scenario-table fake of pynvml.

The fake replaces pynvml's functions (the exceptions are pynvml's own): one table per GPU says
what each function answers, or which NVML error it raises. Every failure must become an
"unavailable" metric, recorded once and not asked again, never a crash.
"""

from __future__ import annotations

import sys
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from probe.measure.samplers.nvml import GpuSampler, Nvml

SECOND = 1_000_000_000
GPM_VALUES = {2: 48.2, 3: 27.2, 20: 95.0, 21: 1900.0, **{40 + e: 40.0 + e for e in range(7)}}


def hopper(utilization: int = 62, **changes: Any) -> dict[str, Any]:
    """An H200 that answers everything (NVJPG 7 does not exist on it, as on the real one)."""
    table: dict[str, Any] = {
        "nvmlDeviceGetUtilizationRates": SimpleNamespace(gpu=utilization, memory=20),
        "nvmlDeviceGetJpgUtilization": [51, 166_666],
        "nvmlDeviceGetMemoryInfo": SimpleNamespace(used=7899 * 2**20, total=143_771 * 2**20),
        "nvmlDeviceGetPowerUsage": 412_000,
        "nvmlDeviceGetCurrentClocksEventReasons": 0,
        "nvmlDeviceGetName": "NVIDIA H200",
        "nvmlDeviceGetIndex": 0,
        "nvmlGpmQueryDeviceSupport": SimpleNamespace(isSupportedDevice=1),
        "gpm": dict(GPM_VALUES),
    }
    table.update(changes)
    return table


class FakeNvml:
    """Installs the scenario: `gpus` maps a UUID to its table."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, gpus: dict[str, dict[str, Any]]) -> None:
        self.gpus = gpus
        self.calls: Counter[tuple[str, str]] = Counter()
        self.init_error: BaseException | None = None
        for name in (
            "nvmlDeviceGetUtilizationRates",
            "nvmlDeviceGetJpgUtilization",
            "nvmlDeviceGetMemoryInfo",
            "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetName",
            "nvmlDeviceGetIndex",
            "nvmlGpmQueryDeviceSupport",
        ):
            monkeypatch.setattr(pynvml, name, self._answer(name))
        monkeypatch.setattr(pynvml, "nvmlInit", self._init)
        monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
        monkeypatch.setattr(pynvml, "nvmlSystemGetDriverVersion", lambda: "580.159.04")
        monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", self._handle)
        monkeypatch.setattr(pynvml, "nvmlGpmSampleAlloc", lambda: SimpleNamespace(values=None))
        monkeypatch.setattr(pynvml, "nvmlGpmSampleFree", lambda sample: None)
        monkeypatch.setattr(pynvml, "nvmlGpmSampleGet", self._gpm_sample)
        monkeypatch.setattr(pynvml, "nvmlGpmMetricsGet", self._gpm_metrics)
        monkeypatch.setattr(pynvml, "c_nvmlGpmMetricsGet_t", _MetricsRequest)

    def _init(self) -> None:
        if self.init_error is not None:
            raise self.init_error

    def _handle(self, uuid: str) -> str:
        if uuid not in self.gpus:
            raise pynvml.NVMLError_NotFound()
        return uuid  # the handle is the UUID: enough to find the table

    def _lookup(self, handle: str, name: str) -> Any:
        self.calls[(handle, name)] += 1
        answer = self.gpus[handle].get(name, pynvml.NVMLError_NotSupported)
        if isinstance(answer, type) and issubclass(answer, BaseException):
            raise answer()
        if isinstance(answer, BaseException):
            raise answer
        return answer(handle) if callable(answer) else answer

    def _answer(self, name: str) -> Any:
        return lambda handle, *args: self._lookup(handle, name)

    def _gpm_sample(self, handle: str, sample: SimpleNamespace) -> SimpleNamespace:
        sample.values = self._lookup(handle, "gpm")
        return sample

    def _gpm_metrics(self, request: _MetricsRequest) -> _MetricsRequest:
        values = request.sample2.values
        for slot in range(request.numMetrics):
            entry = request.metrics[slot]
            if entry.metricId in values:
                entry.value, entry.nvmlReturn = values[entry.metricId], 0
            else:
                entry.value, entry.nvmlReturn = 0.0, pynvml.NVML_ERROR_NOT_SUPPORTED
        return request


class _MetricsRequest:
    def __init__(self) -> None:
        self.version = self.numMetrics = 0
        self.sample1 = self.sample2 = SimpleNamespace(values={})
        self.metrics = [SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(64)]


def reasons(sampler: GpuSampler) -> dict[tuple[str, str], str]:
    return {(u.device, u.metric): u.reason for u in sampler.unavailable()}


def test_a_hopper_gpu_gives_every_metric_with_gpm_after_its_first_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeNvml(monkeypatch, {"GPU-a": hopper()})
    sampler = GpuSampler(["GPU-a"])
    first = sampler.sample(0)[0]
    assert first.gpu_uuid == "GPU-a"
    assert first.kernel_active_pct == 62
    assert first.nvjpg_pct == 51
    assert first.memory_used_mib == 7899
    assert first.power_w == 412
    assert first.clocks_event_reasons == 0
    assert first.sm_active_pct is None  # no GPM window has closed yet
    assert sampler.sample(SECOND // 2)[0].sm_active_pct is None
    closed = sampler.sample(SECOND)[0]
    assert closed.sm_active_pct == 48.2
    assert closed.sm_occupancy_pct == 27.2
    assert closed.pcie_rx_mib_s == 1900.0
    assert closed.pcie_tx_mib_s == 95.0
    assert closed.nvjpg_gpm_pct == pytest.approx(sum(40 + e for e in range(7)) / 7)
    held = sampler.sample(SECOND + SECOND // 10)[0]  # held until the next window closes
    assert held.sm_active_pct == 48.2
    assert sampler.unavailable() == []
    assert sampler.info("GPU-a").name == "NVIDIA H200"
    assert sampler.driver_version() == "580.159.04"
    sampler.close()


@pytest.mark.parametrize(
    ("function", "metric"),
    [
        ("nvmlDeviceGetUtilizationRates", "kernel_active_pct"),
        ("nvmlDeviceGetJpgUtilization", "nvjpg_pct"),
        ("nvmlDeviceGetMemoryInfo", "memory_used_mib"),
        ("nvmlDeviceGetPowerUsage", "power_w"),
        ("nvmlDeviceGetCurrentClocksEventReasons", "clocks_event_reasons"),
    ],
)
def test_an_unsupported_metric_is_unavailable_once_and_not_asked_again(
    monkeypatch: pytest.MonkeyPatch, function: str, metric: str
) -> None:
    fake = FakeNvml(monkeypatch, {"GPU-a": hopper(**{function: pynvml.NVMLError_NotSupported})})
    sampler = GpuSampler(["GPU-a"])
    samples = [sampler.sample(t * SECOND // 10)[0] for t in range(5)]
    assert all(getattr(s, metric) is None for s in samples)
    assert all(s.kernel_active_pct is not None for s in samples if metric != "kernel_active_pct")
    assert fake.calls[("GPU-a", function)] == 1
    assert reasons(sampler) == {("GPU-a", metric): "not supported on this GPU or driver"}


def test_functions_missing_from_the_driver_or_the_binding(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(
        monkeypatch,
        {"GPU-a": hopper(nvmlDeviceGetCurrentClocksEventReasons=pynvml.NVMLError_FunctionNotFound)},
    )
    monkeypatch.delattr(pynvml, "nvmlDeviceGetJpgUtilization")  # an nvidia-ml-py without it
    sampler = GpuSampler(["GPU-a"])
    sample = sampler.sample(0)[0]
    assert sample.clocks_event_reasons is None
    assert sample.nvjpg_pct is None
    assert sample.kernel_active_pct == 62
    found = reasons(sampler)
    assert "missing from the driver" in found[("GPU-a", "clocks_event_reasons")]
    assert "missing from nvidia-ml-py" in found[("GPU-a", "nvjpg_pct")]


def test_a_lost_gpu_stops_its_metrics_and_not_the_other_gpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FakeNvml(monkeypatch, {"GPU-a": hopper(utilization=10), "GPU-b": hopper(utilization=90)})
    sampler = GpuSampler(["GPU-a", "GPU-b"])
    assert [s.kernel_active_pct for s in sampler.sample(0)] == [10, 90]
    fake.gpus["GPU-a"] = dict.fromkeys(hopper(), pynvml.NVMLError_GpuIsLost)
    lost, healthy = sampler.sample(SECOND)
    assert lost.kernel_active_pct is None
    assert lost.memory_used_mib is None
    assert healthy.kernel_active_pct == 90
    assert healthy.sm_active_pct == 48.2
    calls_when_lost = sum(n for (gpu, _), n in fake.calls.items() if gpu == "GPU-a")
    sampler.sample(2 * SECOND)
    assert sum(n for (gpu, _), n in fake.calls.items() if gpu == "GPU-a") == calls_when_lost
    assert reasons(sampler)[("GPU-a", "*")].startswith("the GPU is lost")


def test_no_nvml_library_gives_no_gpu_samples_and_no_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(monkeypatch, {"GPU-a": hopper()})
    fake.init_error = pynvml.NVMLError_LibraryNotFound()
    sampler = GpuSampler(["GPU-a"])
    assert sampler.sample(0) == []
    assert sampler.driver_version() is None
    assert "NVML is not available" in reasons(sampler)[("", "nvml")]
    sampler.close()


def test_no_nvidia_ml_py_gives_no_gpu_samples_and_no_crash(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)
    sampler = GpuSampler(["GPU-a"])
    assert sampler.sample(0) == []
    assert reasons(sampler) == {("", "nvml"): "nvidia-ml-py is not installed"}


def test_gpm_needs_hopper_and_nvml_still_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    ampere = hopper(nvmlGpmQueryDeviceSupport=SimpleNamespace(isSupportedDevice=0))
    FakeNvml(monkeypatch, {"GPU-a": ampere})
    sampler = GpuSampler(["GPU-a"])
    sample = sampler.sample(5 * SECOND)[0]
    assert sample.sm_active_pct is None
    assert sample.kernel_active_pct == 62
    unavailable = {u.metric for u in sampler.unavailable()}
    assert {"sm_active_pct", "sm_occupancy_pct", "nvjpg_gpm_pct", "pcie_rx_mib_s"} <= unavailable
    assert set(reasons(sampler).values()) == {"GPM needs a Hopper or newer GPU"}


def test_gpus_are_found_and_keyed_by_uuid(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch, {"GPU-a": hopper(utilization=10), "GPU-b": hopper(utilization=90)})
    sampler = GpuSampler(["GPU-b", "GPU-a", "GPU-gone"])
    by_uuid = {s.gpu_uuid: s.kernel_active_pct for s in sampler.sample(0)}
    assert by_uuid == {"GPU-b": 90, "GPU-a": 10}
    assert reasons(sampler)[("GPU-gone", "*")] == "Not Found"


def test_the_door_never_raises_nvml_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeNvml(monkeypatch, {"GPU-a": hopper(nvmlDeviceGetPowerUsage=pynvml.NVMLError_Unknown)})
    nvml = Nvml()
    assert nvml.query("nvmlDeviceGetPowerUsage", "GPU-a", device="GPU-a", metric="power_w") is None
    assert nvml.unavailable == {("GPU-a", "power_w"): "Unknown Error"}
