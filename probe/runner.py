"""Runs a probe: one lane process per GPU (or CPU shard), samplers, and the store.

The coordinating process (this one) spawns the lanes, samples the hardware in a background
thread, and is the only writer of the run: lanes send their batch events here. Lane i reads
shard i of N, as DDP training does. A lane that fails fails the run, with its reason, and the
other lanes run on; everything recorded is kept. Asked to stop (Ctrl-C, SIGTERM, `stop`), it
tells the lanes to stop after their current batch, writes what they sent, and marks the run
`interrupted`.
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import platform
import queue
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pipelines import Backend, InputError, PipelineSpec, available_cpus, check_backend, discover
from pipelines.dataset import read_order, shard
from probe.consumers import ConsumerSpec, model_note
from probe.devices import CudaDevice, cuda_devices
from probe.distributed import Rank
from probe.lane import LaneJob, lane_main
from probe.recorder import Recorder
from probe.samplers.host import HostSampler, host_facts, pid_alive
from probe.samplers.nvml import GpuSampler
from probe.store import BatchEvent, LaneRecord, RunRecord, RunStatus, Store
from probe.summary import figures_from_store

STOP_GRACE_S = 20.0  # how long stopping lanes may take before they are terminated
WRITE_EVERY_S = 0.5
LIVE_WINDOW_NS = 3_000_000_000  # live figures cover the last 3 s


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
    """A probe run: the pipeline, where its lanes run, what consumes the batches, how long."""

    backend: Backend
    spec: PipelineSpec  # shared settings; each lane sets its device and shard
    lanes: tuple[LanePlan, ...]
    consumer: ConsumerSpec
    warmup: int = 5
    batches: int | None = None  # measured batches per lane
    duration_s: float | None = 10.0  # measured seconds per lane
    sample_hz: float = 10.0  # 0: no sampling
    label: str | None = None
    torchrun: bool = False  # one rank's lane of a run launched by torchrun

    def __post_init__(self) -> None:
        if not self.lanes:
            raise InputError("a run needs at least one lane")
        if isinstance(self.warmup, bool) or self.warmup < 0:
            raise InputError(f"--warmup must be >= 0 (got {self.warmup})")
        if self.batches is not None and self.batches < 1:
            raise InputError(f"--batches must be >= 1 (got {self.batches})")
        if self.duration_s is not None and not self.duration_s > 0:
            raise InputError(f"--duration must be > 0 seconds (got {self.duration_s})")
        if self.batches is None and self.duration_s is None:
            raise InputError("give --batches, --duration or both: when to stop measuring")
        if not 0 <= self.sample_hz <= 1000:
            raise InputError(f"--sample-hz must be within 0..1000 (got {self.sample_hz})")

    def lane_spec(self, plan: LanePlan) -> PipelineSpec:
        device = None if plan.device is None else plan.device.index
        return replace(self.spec, device=device, shard_id=plan.shard_id, num_shards=plan.num_shards)


@dataclass
class LaneLive:
    """A lane as the live display shows it."""

    lane: int
    device: str
    shard: str
    state: str = "starting"  # starting, warming up, measuring, done, stopped, failed
    warmup_batches: int = 0
    batches: int = 0  # measured
    reason: str | None = None
    recent: deque[BatchEvent] = field(default_factory=lambda: deque(maxlen=4096))

    def images_per_s(self, now_ns: int) -> float | None:
        events = self._window(now_ns)
        if len(events) < 2:
            return None
        span_ns = now_ns - events[0].t_ns
        return sum(e.size for e in events) / (span_ns / 1e9) if span_ns > 0 else None

    def data_wait_frac(self, now_ns: int) -> float | None:
        events = self._window(now_ns)
        busy = sum(e.wait_s + e.step_s for e in events)
        return sum(e.wait_s for e in events) / busy if busy > 0 else None

    def _window(self, now_ns: int) -> list[BatchEvent]:
        return [e for e in self.recent if not e.warmup and now_ns - e.t_ns <= LIVE_WINDOW_NS]


def check_config(config: ProbeConfig) -> int:
    """Checks what can be checked before a run starts; returns the dataset's class count.

    Raises:
        InputError: the dataset, a shard, or the backend cannot work.
    """
    check_backend(config.backend)
    dataset = read_order(
        discover(config.spec.data_dir), shuffle=config.spec.shuffle, seed=config.spec.seed
    )
    for plan in config.lanes:
        shard(dataset, plan.shard_id, plan.num_shards)
    return len(dataset.classes)


def run_probe(
    config: ProbeConfig,
    store: Store,
    *,
    stop: threading.Event | None = None,
    on_update: Callable[[list[LaneLive]], None] | None = None,
    on_start: Callable[[str], None] | None = None,
    session_id: str | None = None,
    run_id: str | None = None,
) -> str:
    """Runs the probe and records it; returns the run's id.

    Args:
        stop: set it to stop the run early (it is then marked interrupted).
        on_update: called about four times a second with the lanes' live state.
        on_start: called with the run id once the run is in the store.
        session_id: the sweep or doctor session the run belongs to.
        run_id: the run's id (the ranks of a torchrun probe share one); default a new one.

    Raises:
        InputError: the configuration cannot work; nothing is written then.
    """
    num_classes = check_config(config)
    stop = stop or threading.Event()
    hostname = socket.gethostname()
    store.mark_abandoned_runs(hostname, pid_alive)
    gpu_uuids = [plan.device.uuid for plan in config.lanes if plan.device is not None]
    gpus = GpuSampler(gpu_uuids) if gpu_uuids and config.sample_hz > 0 else None
    run = RunRecord(
        run_id=run_id or new_run_id(),
        kind="probe",
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        status=RunStatus.RUNNING,
        reason=None,
        pipeline=config.backend.value,
        consumer=str(config.consumer),
        label=config.label,
        config=_config_dict(config, num_classes),
        host=describe_host(gpus),
        hostname=hostname,
        pid=os.getpid(),
        started_ns=time.monotonic_ns(),
        ended_ns=None,
        session_id=session_id,
    )
    store.create_run(
        run,
        [
            LaneRecord(
                run_id=run.run_id,
                lane=plan.lane,
                gpu_index=None if plan.device is None else plan.device.index,
                gpu_uuid=None if plan.device is None else plan.device.uuid,
                shard_id=plan.shard_id,
                num_shards=plan.num_shards,
                hostname=hostname,
                pid=None,
                status=RunStatus.RUNNING,
                reason=None,
                summary=None,
            )
            for plan in config.lanes
        ],
    )
    if on_start is not None:
        on_start(run.run_id)
    recorder = None
    if config.sample_hz > 0:
        recorder = Recorder(config.sample_hz, gpus, HostSampler())
        recorder.start()
    coordinator = _Coordinator(config, store, run, recorder, num_classes, stop, on_update)
    try:
        coordinator.run()
    finally:
        if recorder is not None:
            recorder.stop()
        if gpus is not None:
            gpus.close()
        coordinator.write(recorder)
        coordinator.finish()
    return run.run_id


class _Coordinator:
    def __init__(
        self,
        config: ProbeConfig,
        store: Store,
        run: RunRecord,
        recorder: Recorder | None,
        num_classes: int,
        stop: threading.Event,
        on_update: Callable[[list[LaneLive]], None] | None,
    ) -> None:
        self.config, self.store, self.run_record = config, store, run
        self.recorder, self.num_classes, self.stop = recorder, num_classes, stop
        self.on_update = on_update
        self.live = {
            plan.lane: LaneLive(
                lane=plan.lane,
                device="cpu" if plan.device is None else f"cuda:{plan.device.index}",
                shard=f"{plan.shard_id}/{plan.num_shards}",
            )
            for plan in config.lanes
        }
        self.outcome: dict[int, tuple[RunStatus, str | None]] = {}
        self.skipped: dict[int, int] = {}
        self.pending: list[BatchEvent] = []
        self.interrupted = False
        self.dead_since: dict[int, float] = {}

    def run(self) -> None:
        context = multiprocessing.get_context("spawn")  # lanes start CUDA afresh; no fork
        messages = context.Queue()
        stop_lanes = context.Event()
        processes = {
            plan.lane: self._spawn(context, plan, messages, stop_lanes)
            for plan in self.config.lanes
        }
        deadline: float | None = None
        last_write = last_update = time.monotonic()
        while len(self.outcome) < len(processes):
            try:
                self._handle(messages.get(timeout=0.1))
                while True:
                    self._handle(messages.get_nowait())
            except queue.Empty:
                pass
            except KeyboardInterrupt:
                self.stop.set()
            now = time.monotonic()
            if self.stop.is_set() and deadline is None:
                self.interrupted = True
                stop_lanes.set()
                deadline = now + STOP_GRACE_S
            self._check_processes(processes, now, deadline)
            if now - last_write >= WRITE_EVERY_S:
                self.write(self.recorder)
                last_write = now
            if self.on_update is not None and now - last_update >= 0.25:
                self.on_update(list(self.live.values()))
                last_update = now
        for process in processes.values():
            process.join(timeout=5)
        if self.on_update is not None:
            self.on_update(list(self.live.values()))

    def _spawn(self, context: Any, plan: LanePlan, messages: Any, stop_lanes: Any) -> Any:
        job = LaneJob(
            lane=plan.lane,
            spec=self.config.lane_spec(plan),
            backend=self.config.backend,
            consumer=self.config.consumer,
            warmup=self.config.warmup,
            batches=self.config.batches,
            duration_s=self.config.duration_s,
            num_classes=self.num_classes,
        )
        process = context.Process(
            target=lane_main, args=(job, messages, stop_lanes), name=f"feedscope-lane-{plan.lane}"
        )
        process.start()
        if self.recorder is not None:
            self.recorder.set_lane_pid(plan.lane, process.pid)
        self.store.update_lane(self.run_record.run_id, plan.lane, pid=process.pid)
        return process

    def _check_processes(
        self, processes: dict[int, Any], now: float, deadline: float | None
    ) -> None:
        """Closes the lanes whose process died without a word, or did not stop in time."""
        for lane, process in processes.items():
            if lane in self.outcome:
                continue
            if deadline is not None and now > deadline:
                process.terminate()
                self._close_lane(lane, RunStatus.INTERRUPTED, "did not stop in time: killed")
            # A dead lane's last messages may still be in the pipe: wait a moment before judging.
            elif not process.is_alive() and now - self.dead_since.setdefault(lane, now) > 2.0:
                self._close_lane(lane, RunStatus.FAILED, _exit_reason(process.exitcode))

    def _handle(self, message: tuple[str, int, Any]) -> None:
        kind, lane, payload = message
        live = self.live[lane]
        if kind == "batches":
            self.pending.extend(payload)
            for event in payload:
                live.recent.append(event)
                if event.warmup:
                    live.warmup_batches += 1
                else:
                    live.batches += 1
            if payload:
                live.state = "warming up" if payload[-1].warmup else "measuring"
        elif kind == "started":
            live.state = "starting"
        elif kind == "ended":
            self.skipped[lane] = payload["skipped_files"]
            status = RunStatus.INTERRUPTED if payload["stopped"] else RunStatus.COMPLETED
            self._close_lane(lane, status, "stopped when asked" if payload["stopped"] else None)
        elif kind == "failed":
            self._close_lane(lane, RunStatus.FAILED, payload["reason"])

    def _close_lane(self, lane: int, status: RunStatus, reason: str | None) -> None:
        if lane in self.outcome:
            return
        self.outcome[lane] = (status, reason)
        live = self.live[lane]
        live.reason = reason
        live.state = {
            RunStatus.COMPLETED: "done",
            RunStatus.INTERRUPTED: "stopped",
            RunStatus.FAILED: "failed",
        }.get(status, status.value)

    def write(self, recorder: Recorder | None) -> None:
        """Writes what lanes and samplers produced since the last write."""
        run_id = self.run_record.run_id
        if self.pending:
            self.store.add_batches(run_id, self.pending)
            self.pending = []
        if recorder is not None:
            drained = recorder.drain()
            self.store.add_gpu_samples(run_id, drained.gpu)
            self.store.add_host_samples(run_id, self.run_record.hostname, drained.host)
            self.store.add_lane_cpu(run_id, drained.lanes)
            self.store.add_unavailable(run_id, drained.unavailable)

    def finish(self) -> None:
        """Writes each lane's figures and status, then the run's."""
        run_id = self.run_record.run_id
        failures = []
        for lane in self.store.lanes(run_id):
            status, reason = self.outcome.get(
                lane.lane, (RunStatus.INTERRUPTED, "the run ended before the lane did")
            )
            figures = figures_from_store(self.store, self.run_record, lane)
            figures["skipped_files"] = self.skipped.get(lane.lane, 0)
            self.store.update_lane(run_id, lane.lane, status=status, reason=reason, summary=figures)
            if status is RunStatus.FAILED:
                failures.append(f"lane {lane.lane} failed: {reason}")
        if self.interrupted:
            run_status, run_reason = RunStatus.INTERRUPTED, "stopped before its end (interrupted)"
        elif failures:
            run_status, run_reason = RunStatus.FAILED, "; ".join(failures)
        else:
            run_status, run_reason = RunStatus.COMPLETED, None
        self.store.finish_run(run_id, run_status, run_reason, time.monotonic_ns())


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        names = {
            9: "SIGKILL (out of memory?)",
            11: "SIGSEGV (crashed)",
            15: "SIGTERM",
            6: "SIGABRT",
        }
        return f"the lane process died of signal {names.get(-code, -code)}"
    return f"the lane process exited with code {code} without a word"


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + "-" + secrets.token_hex(2)


def _config_dict(config: ProbeConfig, num_classes: int) -> dict[str, Any]:
    return {
        "pipeline": config.backend.value,
        "spec": config.spec.as_dict(),
        "consumer": str(config.consumer),
        "consumer_note": model_note(config.consumer),
        "warmup": config.warmup,
        "batches": config.batches,
        "duration_s": config.duration_s,
        "sample_hz": config.sample_hz,
        "num_classes": num_classes,
        "world_size": config.lanes[0].num_shards if config.torchrun else len(config.lanes),
        "torchrun": config.torchrun,
        "lanes": [
            {
                "lane": plan.lane,
                "gpu": None if plan.device is None else plan.device.index,
                "shard_id": plan.shard_id,
                "num_shards": plan.num_shards,
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
        "cpus": available_cpus(),
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
