"""Runs probes: one lane process per GPU (or CPU shard), samplers, and the store.

The coordinating process (this one) spawns the lanes, samples the hardware in a background
thread, and is the only writer of a run: lanes send their batch events here (`coordinator`).
Lane i reads shard i of N, as DDP training does. The lanes stay up for a whole session
(`Lanes`): a sweep or doctor builds and tunes each consumer once, and every run after the first
rebuilds only the pipeline. A run measures until every lane knows its images/s within the
precision asked (or a fixed number of batches or seconds). A lane that fails fails the run, with
its reason, and the other lanes run on; everything recorded is kept. Asked to stop (Ctrl-C,
SIGTERM, `stop`), it tells the lanes to stop after their current batch, writes what they sent,
and marks the run `interrupted`.
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from pipelines import InputError
from probe.measure.config import (
    Checked,
    LanePlan,
    ProbeConfig,
    check_config,
    config_dict,
    describe_host,
    new_run_id,
)
from probe.measure.consumers import ConsumerSpec
from probe.measure.coordinator import Coordinator, LaneLive
from probe.measure.lane import LaneSetup, lane_main
from probe.measure.recorder import Recorder
from probe.measure.samplers.host import HostSampler, pid_alive
from probe.measure.samplers.nvml import GpuSampler
from probe.records import LaneRecord, RunRecord, RunStatus
from probe.store.db import Store
from probe.store.spool import tidy


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
        # What a run's coordinator talks to the lanes through:
        self.messages = self._context.Queue()  # from every lane (lane.py lists the messages)
        self.stop_run = self._context.Event()  # stop the current run
        self.stop_all = self._context.Event()  # stop at once, and end the processes
        self.processes: dict[int, Any] = {}
        self.commands: dict[int, Any] = {}  # lane -> its queue of `Measure`s
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
        self.stop_all.set()
        for commands in self.commands.values():
            commands.put(None)
        for process in self.processes.values():
            process.join(timeout=10)
            if process.is_alive():
                process.kill()  # SIGTERM is the lanes' own way to stop: not enough here
                process.join(timeout=5)
        self.processes.clear()

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
        tidy(store, hostname, pid_alive)
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
            config=config_dict(config, checked),
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
        coordinator = Coordinator(self, config, store, run, recorder, checked, on_update)
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

    def new_job(self) -> int:
        """A number for the next run's work, which the lanes' messages about it carry."""
        self._jobs += 1
        return self._jobs

    def ready(self, lane: int) -> None:
        """Notes that the lane's process is up: the interpreter, torch, CUDA, its consumer."""
        self.startup[lane] = time.monotonic() - self._spawned[lane]

    def spawn(self, lane: int) -> Any:
        """The lane's process, started if it is not alive."""
        process = self.processes.get(lane)
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
            args=(setup, commands, self.messages, self.stop_run, self.stop_all),
            name=f"feedscope-lane-{lane}",
        )
        process.start()
        self.processes[lane], self.commands[lane] = process, commands
        self._spawned[lane] = time.monotonic()
        self.startup.pop(lane, None)
        self.consumer_alone.pop(lane, None)
        return process
