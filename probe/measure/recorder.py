"""One background thread that samples the GPUs and the host at a fixed rate.

It only samples, into a lock-guarded buffer; the coordinating process drains the buffer and
writes it to the store, so the store keeps one writer.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from probe.measure.samplers.host import HostSampler
from probe.measure.samplers.nvml import GpuSampler
from probe.records import GpuSample, HostSample, LaneCpuSample, Unavailable

logger = logging.getLogger(__name__)


@dataclass
class Drained:
    """What the samplers produced since the last drain."""

    gpu: list[GpuSample] = field(default_factory=list)
    host: list[HostSample] = field(default_factory=list)
    lanes: list[LaneCpuSample] = field(default_factory=list)
    unavailable: list[Unavailable] = field(default_factory=list)


class Recorder:
    """Samples at `hz` samples per second from `start()` until `stop()`."""

    def __init__(self, hz: float, gpus: GpuSampler | None, host: HostSampler) -> None:
        if hz <= 0:
            raise ValueError("a recorder needs a rate above 0 Hz")
        self.period_s = 1 / hz
        self.gpus = gpus
        self.host = host
        self._buffer = Drained()
        self._reported: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="feedscope-recorder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)

    def set_lane_pid(self, lane: int, pid: int) -> None:
        """Attributes process `pid` and its children to `lane` from now on."""
        self.host.lane_pids[lane] = pid

    def drain(self) -> Drained:
        with self._lock:
            drained, self._buffer = self._buffer, Drained()
        return drained

    def _loop(self) -> None:
        next_tick = time.monotonic()
        while not self._stopped.wait(max(0.0, next_tick - time.monotonic())):
            try:
                self._tick()
            except Exception:  # a sampler bug must not end the run: log it and carry on
                logger.exception("sampling failed")
            next_tick += self.period_s
            now = time.monotonic()
            if next_tick < now:  # fell behind (a slow NVML call): skip the ticks missed
                next_tick = now + self.period_s

    def _tick(self) -> None:
        t_ns = time.monotonic_ns()
        gpu = self.gpus.sample(t_ns) if self.gpus is not None else []
        host, lanes = self.host.sample()
        unavailable = (self.gpus.unavailable() if self.gpus is not None else []) + (
            self.host.unavailable()
        )
        new = [u for u in unavailable if (u.source, u.device, u.metric) not in self._reported]
        self._reported.update((u.source, u.device, u.metric) for u in new)
        with self._lock:
            self._buffer.gpu.extend(gpu)
            self._buffer.host.append(host)
            self._buffer.lanes.extend(lanes)
            self._buffer.unavailable.extend(new)
