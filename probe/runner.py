"""Runs probes: one lane process per GPU (or CPU shard), samplers, and the store.

The coordinating process (this one) spawns the lanes, samples the hardware in a background
thread, and is the only writer of a run: lanes send their batch events here. Lane i reads shard i
of N, as DDP training does. The lanes stay up for a whole session (`Lanes`): a sweep or doctor
builds and tunes each consumer once, and every run after the first rebuilds only the pipeline.
A run measures until every lane knows its images/s within the precision asked (or a fixed number
of batches or seconds). A lane that fails fails the run, with its reason, and the other lanes run
on; everything recorded is kept. Asked to stop (Ctrl-C, SIGTERM, `stop`), it tells the lanes to
stop after their current batch, writes what they sent, and marks the run `interrupted`.
"""

from __future__ import annotations

import importlib.metadata
import math
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
from probe.lane import LaneSetup, Measure, Read, lane_main
from probe.recorder import Recorder
from probe.samplers.host import HostSampler, host_facts, pid_alive
from probe.samplers.nvml import GpuSampler
from probe.steady import MAX_MEASURE_S, PRECISION, wait_share
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
    sample_hz: float = 10.0  # 0: no sampling
    label: str | None = None
    torchrun: bool = False  # one rank's lane of a run launched by torchrun

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

    @property
    def until_precise(self) -> bool:
        """Whether it measures until images/s is known within `precision` (no fixed length)."""
        return self.batches is None and self.duration_s is None

    def lane_spec(self, plan: LanePlan) -> PipelineSpec:
        device = None if plan.device is None else plan.device.index
        return replace(self.spec, device=device, shard_id=plan.shard_id, num_shards=plan.num_shards)


@dataclass
class LaneLive:
    """A lane as the live display shows it."""

    lane: int
    device: str
    shard: str
    state: str = "starting"  # starting, warming up, measuring, precise, done, stopped, failed
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
        return wait_share(sum(e.wait_s for e in events), sum(e.step_s for e in events))

    def _window(self, now_ns: int) -> list[BatchEvent]:
        return [e for e in self.recent if not e.warmup and now_ns - e.t_ns <= LIVE_WINDOW_NS]


@dataclass(frozen=True)
class Checked:
    """What checking a configuration found out: the dataset's class count, and each lane's
    shard size."""

    num_classes: int
    shard_images: dict[int, int]  # lane -> images in its shard


def check_config(config: ProbeConfig) -> Checked:
    """Checks what can be checked before a run starts.

    Raises:
        InputError: the dataset, a shard, the reading or the backend cannot work.
    """
    check_backend(config.backend)
    dataset = read_order(
        discover(config.spec.data_dir), shuffle=config.spec.shuffle, seed=config.spec.seed
    )
    sizes = {}
    batch = config.spec.batch_size
    for plan in config.lanes:
        images = len(shard(dataset, plan.shard_id, plan.num_shards))
        if config.read is Read.EPOCHS and images < batch:
            raise InputError(
                f"--read epochs needs a whole batch per epoch: shard {plan.shard_id} of "
                f"{plan.num_shards} holds {images} images, fewer than the batch size {batch} "
                "(read it as a stream, or give a smaller --batch-size)"
            )
        sizes[plan.lane] = images
    return Checked(len(dataset.classes), sizes)


def batch_sizes(config: ProbeConfig, images: int) -> tuple[int, ...]:
    """The batch sizes a lane's consumer will see: full ones, and where epochs end, the last
    one of an epoch (a stream of the DataLoader has full batches only)."""
    batch, last = config.spec.batch_size, images % config.spec.batch_size
    stream = config.read is Read.STREAM and config.backend is Backend.TORCH
    return (batch,) if stream or last == 0 else (batch, last)


def run_probe(
    config: ProbeConfig,
    store: Store,
    *,
    stop: threading.Event | None = None,
    on_update: Callable[[list[LaneLive]], None] | None = None,
    on_start: Callable[[str], None] | None = None,
    run_id: str | None = None,
) -> str:
    """Runs the probe (its lanes started for it and ended after it) and records it; returns
    the run's id.

    Args:
        stop: set it to stop the run early (it is then marked interrupted).
        on_update: called about four times a second with the lanes' live state.
        on_start: called with the run id once the run is in the store.
        run_id: the run's id (the ranks of a torchrun probe share one); default a new one.

    Raises:
        InputError: the configuration cannot work; nothing is written then.
    """
    checked = check_config(config)
    with Lanes(config.lanes, config.consumer, checked.num_classes, stop) as lanes:
        return lanes.measure(
            config, store, checked, on_update=on_update, on_start=on_start, run_id=run_id
        )


class Lanes:
    """Lane processes kept warm for a session: one per plan, each with its consumer built once;
    every `measure` is one run on them. A lane process that died is started again for the next
    run (which then pays its start-up)."""

    def __init__(
        self,
        plans: Sequence[LanePlan],
        consumer: ConsumerSpec,
        num_classes: int,
        stop: threading.Event | None = None,
    ) -> None:
        self.plans = {plan.lane: plan for plan in plans}
        self.consumer, self.num_classes = consumer, num_classes
        self.stop = stop or threading.Event()
        self._context = multiprocessing.get_context("spawn")  # lanes start CUDA afresh; no fork
        self._messages = self._context.Queue()
        self._stop_run = self._context.Event()
        self._stop_all = self._context.Event()
        self._processes: dict[int, Any] = {}
        self._commands: dict[int, Any] = {}
        self._spawned: dict[int, float] = {}  # lane -> when its process was started
        self._jobs = 0
        self.startup: dict[int, float] = {}  # lane -> seconds from spawn to ready, once known
        self.consumer_alone: dict[int, dict[str, Any] | None] = {}

    def __enter__(self) -> Lanes:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the lane processes: asked to, then killed if they do not."""
        self._stop_all.set()
        for commands in self._commands.values():
            commands.put(None)
        for process in self._processes.values():
            process.join(timeout=10)
            if process.is_alive():
                process.kill()  # SIGTERM is the lanes' own way to stop: not enough here
                process.join(timeout=5)
        self._processes.clear()

    def measure(
        self,
        config: ProbeConfig,
        store: Store,
        checked: Checked,
        *,
        on_update: Callable[[list[LaneLive]], None] | None = None,
        on_start: Callable[[str], None] | None = None,
        session_id: str | None = None,
        run_id: str | None = None,
    ) -> str:
        """Measures one run on the lanes and records it; returns its id.

        Raises:
            InputError: no lane measured a batch, and the lanes that failed all failed on their
                input (a shard that yields nothing); the run is recorded, as failed.
        """
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
            config=_config_dict(config, checked),
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
            # Under torchrun the node's ranks are the launcher's children: all of them are the
            # probe's, not the host's other load.
            root = os.getppid() if config.torchrun else None
            recorder = Recorder(config.sample_hz, gpus, HostSampler(root))
            recorder.start()
        coordinator = _Coordinator(self, config, store, run, recorder, checked, on_update)
        try:
            coordinator.run()
        finally:
            if recorder is not None:
                recorder.stop()
            if gpus is not None:
                gpus.close()
            coordinator.write(recorder)
            coordinator.finish()
        failed = sum(status is RunStatus.FAILED for status, _ in coordinator.outcome.values())
        measured = any(live.batches for live in coordinator.live.values())
        if failed and failed == len(coordinator.bad_input) and not measured:
            raise InputError("; ".join(coordinator.bad_input))  # input no lane could read
        return run.run_id

    def _spawn(self, lane: int) -> Any:
        """The lane's process, started if it is not alive."""
        process = self._processes.get(lane)
        if process is not None and process.is_alive():
            return process
        plan = self.plans[lane]
        setup = LaneSetup(
            lane=lane,
            device=None if plan.device is None else plan.device.index,
            consumer=self.consumer,
            num_classes=self.num_classes,
        )
        commands = self._context.Queue()
        process = self._context.Process(
            target=lane_main,
            args=(setup, commands, self._messages, self._stop_run, self._stop_all),
            name=f"feedscope-lane-{lane}",
        )
        process.start()
        self._processes[lane], self._commands[lane] = process, commands
        self._spawned[lane] = time.monotonic()
        self.startup.pop(lane, None)
        self.consumer_alone.pop(lane, None)
        return process


class _Coordinator:
    """One run on the lanes: sends each its work, gathers events, decides when they stop,
    writes the store."""

    def __init__(
        self,
        lanes: Lanes,
        config: ProbeConfig,
        store: Store,
        run: RunRecord,
        recorder: Recorder | None,
        checked: Checked,
        on_update: Callable[[list[LaneLive]], None] | None,
    ) -> None:
        self.lanes, self.config, self.store, self.run_record = lanes, config, store, run
        self.recorder, self.checked, self.on_update = recorder, checked, on_update
        self.live = {
            plan.lane: LaneLive(
                lane=plan.lane,
                device="cpu" if plan.device is None else f"cuda:{plan.device.index}",
                shard=f"{plan.shard_id}/{plan.num_shards}",
            )
            for plan in config.lanes
        }
        self.outcome: dict[int, tuple[RunStatus, str | None]] = {}
        self.ended: dict[int, dict[str, Any]] = {}
        self.started_here: set[int] = set()  # lanes whose process started for this run
        self.precise: set[int] = set()
        self.pending: list[BatchEvent] = []
        self.interrupted = False
        self.dead_since: dict[int, float] = {}
        self.job = 0
        self.bad_input: list[str] = []  # lanes that failed on the user's input

    def run(self) -> None:
        lanes = self.lanes
        lanes._jobs += 1
        self.job = lanes._jobs
        lanes._stop_run.clear()
        for plan in self.config.lanes:
            alive = lanes._processes.get(plan.lane)
            if alive is None or not alive.is_alive():
                self.started_here.add(plan.lane)
            process = lanes._spawn(plan.lane)
            if self.recorder is not None:
                self.recorder.set_lane_pid(plan.lane, process.pid)
            self.store.update_lane(self.run_record.run_id, plan.lane, pid=process.pid)
            images = self.checked.shard_images[plan.lane]
            lanes._commands[plan.lane].put(
                Measure(
                    job=self.job,
                    spec=self.config.lane_spec(plan),
                    backend=self.config.backend,
                    read=self.config.read,
                    warmup=self.config.warmup,
                    batches=self.config.batches,
                    duration_s=self.config.duration_s,
                    precision=self.config.precision if self.config.until_precise else None,
                    max_s=self.config.max_s,
                    batch_sizes=batch_sizes(self.config, images),
                )
            )
        deadline: float | None = None
        last_write = last_update = time.monotonic()
        while len(self.outcome) < len(self.live):
            try:
                self._handle(lanes._messages.get(timeout=0.1))
                while True:
                    self._handle(lanes._messages.get_nowait())
            except queue.Empty:
                pass
            except KeyboardInterrupt:
                lanes.stop.set()
            now = time.monotonic()
            if lanes.stop.is_set() and deadline is None:
                self.interrupted = True
                lanes._stop_all.set()
                deadline = now + STOP_GRACE_S
            running = set(self.live) - set(self.outcome)
            if self.config.until_precise and running and running <= self.precise:
                lanes._stop_run.set()  # every lane still running knows its rate well enough
            self._check_processes(now, deadline)
            if now - last_write >= WRITE_EVERY_S:
                self.write(self.recorder)
                last_write = now
            if self.on_update is not None and now - last_update >= 0.25:
                self.on_update(list(self.live.values()))
                last_update = now
        lanes._stop_run.clear()
        if self.on_update is not None:
            self.on_update(list(self.live.values()))

    def _check_processes(self, now: float, deadline: float | None) -> None:
        """Closes the lanes whose process died without a word, or did not stop in time."""
        for lane in self.live:
            if lane in self.outcome:
                continue
            process = self.lanes._processes[lane]
            if deadline is not None and now > deadline:
                process.kill()
                self._close_lane(lane, RunStatus.INTERRUPTED, "did not stop in time: killed")
            # A dead lane's last messages may still be in the pipe: wait a moment before judging.
            elif not process.is_alive() and now - self.dead_since.setdefault(lane, now) > 2.0:
                self._close_lane(lane, RunStatus.FAILED, _exit_reason(process.exitcode))

    def _handle(self, message: tuple[str, int, int, Any]) -> None:
        kind, lane, job, payload = message
        if lane not in self.live or job not in (-1, self.job):
            return  # a lane of another run, or of an earlier one that was cut short
        live = self.live[lane]
        if kind == "batches":
            self.pending.extend(payload)
            for event in payload:
                live.recent.append(event)
                if event.warmup:
                    live.warmup_batches += 1
                else:
                    live.batches += 1
            if payload and live.state not in ("precise",):
                live.state = "warming up" if payload[-1].warmup else "measuring"
        elif kind == "ready":  # from its spawning: the interpreter, torch, CUDA, the consumer
            self.lanes.startup[lane] = time.monotonic() - self.lanes._spawned[lane]
            live.state = "tuning the consumer"
        elif kind == "consumer":
            self.lanes.consumer_alone[lane] = payload
            live.state = "warming up"
        elif kind == "precise":
            self.precise.add(lane)
            live.state = "precise"
        elif kind == "ended":
            self.ended[lane] = payload
            status = RunStatus.INTERRUPTED if payload["stopped"] else RunStatus.COMPLETED
            self._close_lane(lane, status, "stopped when asked" if payload["stopped"] else None)
        elif kind == "failed":
            if payload.get("input"):
                self.bad_input.append(f"lane {lane}: {payload['reason']}")
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
            ended = self.ended.get(lane.lane, {})
            figures = figures_from_store(self.store, self.run_record, lane, ended.get("starts"))
            figures.update(
                skipped_files=ended.get("skipped_files", 0),
                capped=ended.get("capped", False),
                warmup_settled=ended.get("warmup_settled"),
                build_s=ended.get("build_s"),
                startup_s=self.lanes.startup.get(lane.lane)
                if lane.lane in self.started_here
                else None,
                consumer_alone=self.lanes.consumer_alone.get(lane.lane),
            )
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


def _config_dict(config: ProbeConfig, checked: Checked) -> dict[str, Any]:
    batch = config.spec.batch_size
    return {
        "pipeline": config.backend.value,
        "spec": config.spec.as_dict(),
        "consumer": str(config.consumer),
        "consumer_note": model_note(config.consumer),
        "read": config.read.value,
        "warmup": "auto" if config.warmup is None else config.warmup,
        "batches": config.batches,
        "duration_s": config.duration_s,
        "precision": config.precision if config.until_precise else None,
        "max_s": config.max_s,
        "sample_hz": config.sample_hz,
        "num_classes": checked.num_classes,
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
