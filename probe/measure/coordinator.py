"""One run on a session's lanes, seen from the coordinating process: it sends each lane its
work, gathers the batch events they send, decides when they stop, keeps their live state for the
display, and is the only writer of the run in the store.

A store locked by another process does not stop the run at once: its rows wait in memory
(`probe.measure.unwritten`). Locked for longer than that allows, the run stops, `failed`, with
a reason that names the lock; it is never `completed` with rows missing.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from probe.measure.config import Checked, LanePlan, ProbeConfig, batch_sizes
from probe.measure.lane import Measure
from probe.measure.live import Labels, Live, nvml_index, start_live
from probe.measure.recorder import Drained, Recorder
from probe.measure.samplers.host import kill_tree, process_states, tree_cpu_s
from probe.measure.stop import stop_cause
from probe.measure.unwritten import WRITE_WAIT_S, Unwritten, patiently
from probe.metrics import counted, wait_share
from probe.records import BatchEvent, RunRecord, RunStatus
from probe.steady import STALL_FLOOR_S, STALL_TIMES
from probe.store.connection import StoreBusy, StoreFailed
from probe.store.db import Store
from probe.store.documents import lane_figures_from_store

if TYPE_CHECKING:
    from probe.measure.runner import Lanes

logger = logging.getLogger(__name__)
STOP_GRACE_S = 20.0  # how long stopping lanes may take before they are terminated
WRITE_EVERY_S = 0.5
# A silent lane whose processes used this share of a core since the last reading (one every few
# seconds) is working, not stalled: a batch of huge images can take minutes.
STALL_CPU_SHARE = 0.1
STALL_CPU_EVERY_S = 5.0
LIVE_WINDOW_NS = 3_000_000_000  # live figures cover the last 3 s


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

    def got(self, events: list[BatchEvent]) -> None:
        """The lane's latest batches."""
        for event in events:
            self.recent.append(event)
            if event.warmup:
                self.warmup_batches += 1
            else:
                self.batches += 1
        if events and self.state not in ("precise",):
            self.state = "warming up" if events[-1].warmup else "measuring"

    def rewarm(self, events: list[BatchEvent]) -> None:
        """Measured batches that were warm-up after all (`probe.steady.transient`)."""
        self.batches -= len(events)
        self.warmup_batches += len(events)
        moved = {event.index for event in events}
        self.recent = deque(
            (replace(e, warmup=True) if e.index in moved else e for e in self.recent),
            maxlen=self.recent.maxlen,
        )

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


class Coordinator:
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
        self.unwritten = Unwritten()
        self.tracebacks: dict[int, str] = {}  # failed lanes' whole tracebacks
        self.store_lost: str | None = None  # why the run stopped: the store locked or failed
        self.interrupted = False
        self.dead_since: dict[int, float] = {}
        self.heard: dict[int, float] = {}  # when each running lane last said or did anything
        self.cpu_read: dict[int, tuple[float, float]] = {}  # when, and its processes' CPU s
        self.slowest_gap: dict[int, float] = {}  # its longest wait between batches so far
        self.job = 0
        self.bad_input: list[str] = []  # lanes that failed on the user's input
        self.figures = _served(config, run, recorder)  # for Prometheus: --metrics-port

    def run(self) -> None:
        lanes = self.lanes
        self.job = lanes.new_job()
        lanes.stop_run.clear()
        for plan in self.config.lanes:
            self._start(plan)
        deadline: float | None = None
        self.store.busy_timeout(WRITE_WAIT_S)  # a locked store must not stall the lanes' messages
        last_write = last_update = time.monotonic()
        while len(self.outcome) < len(self.live):
            try:
                self._handle(lanes.messages.get(timeout=0.1))
                while True:
                    self._handle(lanes.messages.get_nowait())
            except queue.Empty:
                pass
            except KeyboardInterrupt:
                lanes.stop.set()
            now = time.monotonic()
            if (lanes.stop.is_set() or self.store_lost) and deadline is None:
                self.interrupted = lanes.stop.is_set()
                lanes.stop_all.set()
                deadline = now + STOP_GRACE_S
            running = set(self.live) - set(self.outcome)
            if self.config.until_precise and running and running <= self.precise:
                lanes.stop_run.set()  # every lane still running knows its rate well enough
            self._check_processes(now, deadline)
            if deadline is None:
                self._check_stalls(now)
            if now - last_write >= WRITE_EVERY_S:
                self.write(self.recorder)
                last_write = now
            if self.on_update is not None and now - last_update >= 0.25:
                self.on_update(list(self.live.values()))
                last_update = now
        lanes.stop_run.clear()
        if self.on_update is not None:
            self.on_update(list(self.live.values()))

    def _start(self, plan: LanePlan) -> None:
        """Starts the lane's process if it is not alive, and sends it this run's work."""
        lanes = self.lanes
        alive = lanes.processes.get(plan.lane)
        if alive is None or not alive.is_alive():
            self.started_here.add(plan.lane)
        process = lanes.spawn(plan.lane)
        self.heard[plan.lane] = time.monotonic()
        if self.recorder is not None:
            self.recorder.set_lane_pid(plan.lane, process.pid)
        with suppress(StoreBusy):  # the pid is for a reader's curiosity; the run goes on
            self.store.update_lane(self.run_record.run_id, plan.lane, pid=process.pid)
        images = self.checked.shard_images[plan.lane]
        lanes.commands[plan.lane].put(
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
                enough_s=self.config.enough_s,
                batch_sizes=batch_sizes(self.config, images),
            )
        )

    def _check_processes(self, now: float, deadline: float | None) -> None:
        """Closes the lanes whose process died without a word, or did not stop in time."""
        for lane in self.live:
            if lane in self.outcome:
                continue
            process = self.lanes.processes[lane]
            if deadline is not None and now > deadline:
                process.kill()
                self._close_lane(lane, RunStatus.INTERRUPTED, "did not stop in time: killed")
            # A dead lane's last messages may still be in the pipe: wait a moment before judging.
            elif not process.is_alive() and now - self.dead_since.setdefault(lane, now) > 2.0:
                self._close_lane(lane, RunStatus.FAILED, _exit_reason(process.exitcode))

    def _check_stalls(self, now: float) -> None:
        """Stops and fails the lanes that said nothing for longer than the stall bound: a batch
        that never comes must not hang the run."""
        for lane in list(self.heard):
            if lane in self.outcome:
                continue
            bound = self.config.stall_s or max(
                STALL_FLOOR_S, STALL_TIMES * self.slowest_gap.get(lane, 0.0)
            )
            when, cpu = self.cpu_read.get(lane, (0.0, 0.0))
            if now - when >= STALL_CPU_EVERY_S:  # a lane whose processes work is not stalled
                used = tree_cpu_s(self.lanes.processes[lane].pid)
                if when and used - cpu >= STALL_CPU_SHARE * (now - when):
                    self.heard[lane] = now
                self.cpu_read[lane] = (now, used)
            if now - self.heard[lane] > bound:
                process = self.lanes.processes[lane]
                reason = _stall_reason(self.live[lane], now - self.heard[lane], bound, process.pid)
                kill_tree(process.pid)
                self._close_lane(lane, RunStatus.FAILED, reason)

    def _handle(self, message: tuple[str, int, int, Any]) -> None:
        kind, lane, job, payload = message
        if lane not in self.live or job not in (-1, self.job):
            return  # a lane of another run, or of an earlier one that was cut short
        live = self.live[lane]
        now = time.monotonic()
        if kind == "batches" and live.warmup_batches + live.batches:
            gap = now - self.heard[lane]
            self.slowest_gap[lane] = max(self.slowest_gap.get(lane, 0.0), gap)
        self.heard[lane] = now
        if kind in ("batches", "rewarm"):  # rewarm: written again, the store replaces them
            self.pending.extend(payload)
            if kind == "batches" and lane in self.figures:
                self.figures[lane].add(payload)
            (live.got if kind == "batches" else live.rewarm)(payload)
        elif kind == "ready":  # from its spawning: the interpreter, torch, CUDA, the consumer
            self.lanes.ready(lane)
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
            asked = stop_cause(self.lanes.stop) or "stopped when asked"
            self._close_lane(lane, status, asked if payload["stopped"] else None)
        elif kind == "failed":
            if payload.get("input"):
                self.bad_input.append(f"lane {lane}: {payload['reason']}")
            self.tracebacks.setdefault(lane, payload.get("traceback") or "")
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
        """Writes what lanes and samplers produced since the last write, and what earlier
        writes could not (the store was locked); notes when the store is lost to the run."""
        drained = recorder.drain() if recorder is not None else None
        for figures in self.figures.values():
            figures.add((), drained.lanes if drained is not None else ())
        self.unwritten.add(self.pending, drained)
        self.pending = []
        if self.unwritten.flush(self._add_rows) and self.store_lost is None:
            self.store_lost = self.unwritten.lost_reason(self.store)

    def _add_rows(self, batches: list[BatchEvent], drained: Drained) -> None:
        self.store.add_rows(
            self.run_record.run_id,
            batches=batches,
            gpu=drained.gpu,
            host={self.run_record.hostname: drained.host},
            lane_cpu=drained.lanes,
            unavailable=drained.unavailable,
        )

    def finish(self) -> None:
        """Writes what is left, each lane's figures and status, then the run's.

        Raises:
            StoreBusy: the store stayed locked until the run could not be recorded (it is left
                `running`, and marked interrupted once its process is gone).
            StoreFailed: the machine failed the store (a full disk), saying what was kept.
        """
        try:
            self._finish()
        except StoreFailed as error:
            run_id, kept = self.run_record.run_id, self.unwritten.written
            if error.gone:
                raise StoreFailed(f"{error}; run {run_id} was in it", gone=True) from None
            raise StoreFailed(
                f"{error}; run {run_id} kept what it wrote, {counted(kept, 'batch')} (it is marked "
                "interrupted when the store is next read)"
            ) from None

    def _finish(self) -> None:
        run_id = self.run_record.run_id
        self.store.busy_timeout(WRITE_WAIT_S)
        while not self.unwritten.flush(self._add_rows) and self.unwritten.blocked_since:
            time.sleep(max(0.0, self.unwritten.retry_at - time.monotonic()))
        if self.unwritten.unfinished():
            self.store_lost = self.store_lost or self.unwritten.lost_reason(self.store)
        since = time.monotonic()
        failures, unfinished = [], []
        for lane in self.store.lanes(run_id):
            status, reason = self.outcome.get(
                lane.lane, (RunStatus.INTERRUPTED, "the run ended before the lane did")
            )
            if self.store_lost is not None and status is not RunStatus.FAILED:
                status, reason = RunStatus.FAILED, self.store_lost
            ended = self.ended.get(lane.lane, {})
            figures = lane_figures_from_store(
                self.store, self.run_record, lane, ended.get("starts")
            )
            figures = replace(
                figures,
                skipped_files=ended.get("skipped_files", 0),
                capped=ended.get("capped", False),
                warmup_settled=ended.get("warmup_settled"),
                build_s=ended.get("build_s"),
                startup_s=self.lanes.startup.get(lane.lane)
                if lane.lane in self.started_here
                else None,
                consumer_alone=self.lanes.consumer_alone.get(lane.lane),
                **_stage_figures(ended),
            )
            update = partial(self.store.update_lane, run_id, lane.lane)
            patiently(
                partial(update, status=status, reason=reason, summary=figures,
                        traceback=self.tracebacks.get(lane.lane) or None),
                since,
            )  # fmt: skip
            if status is RunStatus.FAILED and reason != self.store_lost:
                failures.append(f"lane {lane.lane} failed: {reason}")
            elif status is RunStatus.INTERRUPTED:
                unfinished.append(f"lane {lane.lane}: {reason}")
        if self.store_lost is not None:
            run_status, run_reason = RunStatus.FAILED, self.store_lost
        elif self.interrupted:
            run_status = RunStatus.INTERRUPTED
            run_reason = stop_cause(self.lanes.stop) or "stopped before its end (interrupted)"
        elif failures:
            run_status, run_reason = RunStatus.FAILED, "; ".join(failures)
        elif unfinished:  # never `completed` with a lane that was not
            run_status, run_reason = RunStatus.INTERRUPTED, "; ".join(unfinished)
        else:
            run_status, run_reason = RunStatus.COMPLETED, None
        ended_ns = time.monotonic_ns()
        patiently(partial(self.store.finish_run, run_id, run_status, run_reason, ended_ns), since)
        self.store.busy_timeout()


def _served(config: ProbeConfig, run: RunRecord, recorder: Recorder | None) -> dict[int, Live]:
    """Each lane's running totals, served for Prometheus on `--metrics-port` (under torchrun,
    on the port plus LOCAL_RANK); none without the option. A window a lane later moves into
    its warm-up stays counted: a counter does not go back."""
    if config.metrics_port is None:
        return {}
    local = int(os.environ.get("LOCAL_RANK", "0")) if config.torchrun else 0
    gpus = recorder.gpus if recorder is not None else None
    served = {}
    for plan in config.lanes:
        labels = Labels(
            run.label or run.run_id, plan.lane, local if config.torchrun else plan.lane,
            run.hostname, nvml_index(plan.device, gpus),
            "" if plan.device is None else plan.device.uuid,
        )  # fmt: skip
        try:
            served[plan.lane] = start_live(labels, run, config.metrics_port + local)
        except OSError as error:
            logger.warning("no metrics endpoint on port %s: %s", config.metrics_port + local,
                           error.strerror or error)  # fmt: skip
            return {}
    return served


def _stage_figures(ended: dict[str, Any]) -> dict[str, Any]:
    """The lane's stages in CPU ms per image, its workers' busy ms per image, and its cgroup's
    throttling, as it ended."""
    out: dict[str, Any] = {}
    stages, images = ended.get("stages_ns"), ended.get("stage_images")
    if stages and images:
        out["stages_ms"] = {name: ns / 1e6 / images for name, ns in stages.items()}
    if ended.get("serial_ns") and ended.get("serial_images"):
        out["worker_serial_ms"] = ended["serial_ns"] / 1e6 / ended["serial_images"]
    if ended.get("throttling") is not None:
        periods, throttled, seconds = ended["throttling"]
        out.update(cfs_periods=periods, throttled_periods=throttled, throttled_s=seconds)
    return out


def _stall_reason(live: LaneLive, quiet_s: float, bound_s: float, pid: int) -> str:
    """What a stalled lane was doing: its phase, its batches, and each of its processes' state
    and where in the kernel it sleeps (what it waits for), with its CPU time."""
    states = process_states(pid)
    return (
        f"stalled: no batch and no CPU work for {quiet_s:.0f} s (the bound: {bound_s:.0f} s, "
        f"--stall-s) while "
        f"{live.state}, after {live.warmup_batches} warm-up and {live.batches} measured batches; "
        + ("; ".join(states) or "its processes could not be read")
        + ": stopped"
    )


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
