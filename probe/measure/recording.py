"""A watched loop's recording: its run in the store, the samplers, the thread that writes both
(`Recording`), and the answer the process tells when it exits (`Answer`).

The loop only appends its batch events; the writer thread takes them every WRITE_EVERY_S with the
samplers' rows and writes them, so that nothing on the batch path waits for the store. A store
locked by another process keeps the rows for later writes (`probe.measure.unwritten`); a store
lost to the recording fails the run, warns once, and the loop runs on unwatched.
"""

from __future__ import annotations

import atexit
import hashlib
import itertools
import os
import socket
import sys
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable
from contextlib import suppress
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines import InputError, cpu_set_text, own_cores
from probe.measure.described import describe, image_size, shard_of, type_name
from probe.measure.devices import CudaDevice, cuda_devices, device_sync, loop_device
from probe.measure.live import Labels, Live, nvml_index, start_live
from probe.measure.recorder import Drained, Recorder
from probe.measure.samplers.host import pid_alive
from probe.measure.timer import BatchTimer
from probe.measure.unwritten import WRITE_WAIT_S, Unwritten, patiently
from probe.records import (
    BatchEvent,
    LaneRecord,
    RunExport,
    RunRecord,
    RunStatus,
    stopped_for_another,
)
from probe.store.db import Store
from probe.store.merge import add_rows, clock_shift, import_run, settle_run
from probe.store.spool import died, mark_dead_ranks, stopped_for

if TYPE_CHECKING:
    from probe.measure.tensorboard import TensorBoard
    from probe.measure.watch import Outlets, Watched

WRITE_EVERY_S = 0.5
RANKS_EVERY_S = 1.5  # how often a rank's writer looks for ranks of its job on its host that died
# How long a rank that ends otherwise than completed looks for one that died: a collective
# loses its connection to a rank killed some milliseconds before that rank's process is gone.
DYING_S = 0.3
_warned: list[str] = []  # what was warned of: once is enough
_calls = itertools.count()  # watch() calls in this process: ranks number them alike


class Answer:
    """The answer a watching process tells when it exits: each loader's verdict and first
    change. The judge is above this layer: `probe` (the package) gives the way to tell it
    (`teller`, which loads it); `probe watch` tells its own when the script ends
    (`elsewhere`)."""

    teller: Callable[[], Callable[[Path, str], list[str]]] | None = None
    tell: Callable[[Path, str], list[str]] | None = None  # (store, a run) -> the lines
    elsewhere = False
    first: tuple[Path, str] | None = None  # the process's first watched run: store, run id
    asked: tuple[Path, str] | None = None  # its first run watched with the answer at exit

    @classmethod
    def started(cls, store_path: Path, run_id: str, at_exit: bool) -> None:
        """Notes a watched run's start; `at_exit`: tells the answer when the process exits,
        after its runs have ended (atexit runs the last registered first, and every run's own
        end is registered after this), from the store of the first run that asked for it."""
        if cls.first is None:
            cls.first = (store_path, run_id)
        if at_exit and cls.asked is None:
            cls.asked = (store_path, run_id)
        if at_exit and cls.tell is None and cls.teller is not None:
            try:
                cls.tell = cls.teller()  # loaded now: an exiting process cannot load it
            except Exception as error:  # never break training
                warn_once(f"no answer at exit: {error}")
                return
            atexit.register(cls._told)

    @classmethod
    def _told(cls) -> None:
        if cls.elsewhere or cls.tell is None or cls.asked is None:
            return
        try:
            lines = cls.tell(*cls.asked)
        except Exception as error:  # the process is ending: one line, never a traceback
            lines = [f"no answer: {error}"]
        for line in lines:
            print(f"feedscope: {line}", file=sys.stderr)


class Recording:
    """One watched iteration: the run in the store, the samplers, a thread writing both."""

    def __init__(self, store_path: Path, run: RunRecord, lane: int, shift: int, gpus: Any) -> None:
        self.store_path, self.run, self.lane, self.shift = store_path, run, lane, shift
        # Without CUDA a batch in hand is ready; on a GPU the loop must not be made to wait.
        self._wait_for_device = device_sync(None) if _without_cuda() else None
        self._numbers = itertools.count()  # the lane's batches, over all its epochs
        self.events: deque[BatchEvent] = deque()  # appended by the loop, taken by the writer
        # Each `for`'s start as the loop saw it, [epoch, iter() called, iter() returned]: a
        # DataLoader starts (or resumes) its workers in iter(), and what follows until the
        # first batch is the prefetch's refill (workers started by `spawn` finish starting
        # then too, and count as refill).
        self.starts: list[list[int]] = []
        self.spec: dict[str, Any] = {}  # what the batches tell of the pipeline, to write once
        self._shaped = False
        self.gpus = gpus
        self.recorder: Recorder | None = None
        self.live: Live | None = None  # the figures for Prometheus and TensorBoard
        self.board: TensorBoard | None = None
        self._done = threading.Event()
        self._ended: tuple[RunStatus, str | None] | None = None
        self.ended = False
        self._ranks_due = 0.0  # when the writer next looks for ranks that died (`_watch_ranks`)
        self._thread = threading.Thread(
            target=self._write_loop, name="feedscope-watch", daemon=True
        )

    @classmethod
    def start(cls, watched: Watched[Any]) -> Recording | None:
        try:
            return cls._start(watched)
        except Exception as error:  # never break training
            warn_once(f"not recording: {error}")
            return None

    @classmethod
    def _start(cls, watched: Watched[Any]) -> Recording:
        from probe.measure.config import describe_host, new_run_id
        from probe.measure.distributed import torchrun_rank
        from probe.measure.samplers.host import HostSampler
        from probe.measure.samplers.nvml import GpuSampler

        try:
            rank = torchrun_rank()
        except InputError:
            rank = None
        call = next(_calls)
        world = rank.world_size if rank is not None else 1
        lane = rank.rank if rank is not None else 0
        device = _device_in_use(rank)
        gpus = None
        if device is not None and watched.sample_hz > 0:
            gpus = GpuSampler([device.uuid])
        if world > 1:  # every rank derives the same id, with no collective call
            launch = os.environ.get("TORCHELASTIC_RUN_ID") or os.environ.get("MASTER_PORT", "")
            restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
            key = f"{launch}/{restart}/{watched.name}/{call}"
            run_id = time.strftime("%Y%m%d-", time.gmtime()) + "watch-" + hashlib.sha1(
                key.encode()
            ).hexdigest()[:8]  # fmt: skip
        else:
            run_id = new_run_id()
        hostname = socket.gethostname()
        kind, spec = describe(getattr(watched.iterable, "feedscope_inner", watched.iterable))
        run = RunRecord(
            run_id=run_id, kind="watch", created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            status=RunStatus.RUNNING, reason=None, pipeline=kind, consumer="your training step",
            label=watched.name,
            config={
                "pipeline": kind, "spec": spec, "consumer": "your training step",
                "warmup": watched.warmup, "read": "epochs", "batches": None, "duration_s": None,
                "sample_hz": watched.sample_hz, "world_size": world, "torchrun": rank is not None,
                "lanes": [{"lane": lane, "gpu": None if device is None else device.index,
                           "shard_id": lane, "num_shards": world,
                           **rank_given(watched.iterable, spec)}],
                "iterable": type_name(watched.iterable),
                **({"command": watched.command} if watched.command else {}),
            },
            host=describe_host(gpus), hostname=hostname, pid=os.getpid(),
            started_ns=time.monotonic_ns(), ended_ns=None,
        )  # fmt: skip
        record = LaneRecord(
            run_id, lane, None if device is None else device.index,
            None if device is None else device.uuid, lane, world, hostname, os.getpid(),
            RunStatus.RUNNING, None, None,
        )  # fmt: skip
        with Store(watched.db) as store:
            import_run(store, RunExport(run, [record], [], [], {}, [], []))
            here = store.run(run_id)
            shift = 0 if here.hostname == hostname else clock_shift(here.host, run.host)
            path = store.path
        recording = cls(path, run, lane, shift, gpus)
        if watched.outlets:
            labels = Labels(
                watched.name or run_id, lane, rank.local_rank if rank is not None else 0,
                hostname, nvml_index(device, gpus), "" if device is None else device.uuid,
            )  # fmt: skip
            recording.open_outlets(watched.outlets, labels, run)
        if watched.sample_hz > 0:
            # Under torchrun the node's ranks are the launcher's children: all of them are the
            # job's, not the host's other load.
            root = os.getppid() if rank is not None else None
            recording.recorder = Recorder(watched.sample_hz, gpus, HostSampler(root))
            recording.recorder.set_lane_pid(lane, os.getpid())
            recording.recorder.start()
        recording._thread.start()
        Answer.started(path, run_id, watched.answer and lane == 0)  # one rank tells it
        atexit.register(recording.finish_quietly, watched._active)
        return recording

    def open_outlets(self, outlets: Outlets, labels: Labels, run: RunRecord) -> None:
        """The Prometheus endpoint and TensorBoard, fed by the writer thread from now on; an
        endpoint whose port cannot be had is warned of, and training goes on without it."""
        from probe.measure.tensorboard import TensorBoard

        port = None if outlets.metrics_port is None else outlets.metrics_port + labels.local_rank
        try:
            live = start_live(labels, run, port)
        except OSError as error:
            warn_once(f"no metrics endpoint on port {port}: {error.strerror or error}")
            live = start_live(labels, run, None)
        if outlets.tensorboard is not None:
            self.board = TensorBoard(outlets.tensorboard, outlets.tensorboard_every)
            live.listeners.append(self.board)
        self.live = live

    def started(self, epoch: int, called_ns: int, returned_ns: int) -> None:
        self.starts.append([epoch, called_ns + self.shift, returned_ns + self.shift])

    def saw(self, batch: Any) -> None:
        """Notes what the first batch tells of the pipeline: its images' size."""
        if not self._shaped:
            self._shaped = True
            side = image_size(batch)
            if side is not None:
                self.spec["image_size"] = side

    def timer(self) -> BatchTimer:
        """A timer for one `for` over the loader, numbering on from the others."""
        return BatchTimer(self.lane, self._wait_for_device, self._numbers)

    def finish(self, status: RunStatus, reason: str | None, wait: bool = True) -> None:
        """Ends the recording: the writer writes what is left, the lane's figures and status;
        with `wait`, before this returns (else the writer ends on its own)."""
        if self._ended is None:
            self._ended = (status, reason)
            self.ended = True
            self._done.set()
        if wait:
            self._thread.join(timeout=30)
            atexit.unregister(self.finish_quietly)

    def finish_quietly(self, active: list[bool], wait: bool = True) -> None:
        """The run's end when nobody ended it: completed, unless a `for` was under way. Its
        loader collected (`wait` False), it never waits: the collector may run in any thread,
        the writer's own or one holding the store's lock, mid-transaction."""
        if active[0]:
            self.finish(RunStatus.INTERRUPTED, "the process exited mid-loop", wait)
        else:
            self.finish(RunStatus.COMPLETED, None, wait)

    def _write_loop(self) -> None:
        from probe.store.documents import lane_figures_from_store

        unwritten = Unwritten()
        try:
            with Store(self.store_path) as store:
                store.busy_timeout(WRITE_WAIT_S)  # a locked store: try again later
                lost = False
                while not lost and not self._done.wait(WRITE_EVERY_S):
                    lost = self._write(store, unwritten)
                    self._watch_ranks(store)
                status, reason = self._ended or (RunStatus.INTERRUPTED, None)
                if not lost:  # first: torchrun may end this process (SIGTERM) at any moment now
                    reason = self._blamed(store, status, reason)
                if self.recorder is not None:
                    self.recorder.stop()
                if self.gpus is not None:
                    self.gpus.close()
                while not lost and not self._write(store, unwritten) and unwritten.blocked_since:
                    time.sleep(max(0.0, unwritten.retry_at - time.monotonic()))
                if self.board is not None:
                    self.board.close()
                if lost or unwritten.unfinished():
                    self.ended = True  # the loop goes on unrecorded
                    status, reason = RunStatus.FAILED, unwritten.lost_reason(store)
                    warn_once(f"recording stopped: {reason}")
                run, lane = store.run(self.run.run_id), store.lanes(self.run.run_id)
                mine = next(x for x in lane if x.lane == self.lane)
                figures = lane_figures_from_store(store, run, mine, self.starts)
                update = partial(store.update_lane, run.run_id, self.lane)
                patiently(partial(update, status=status, reason=reason, summary=figures))
                patiently(partial(settle_run, store, run.run_id))
        except Exception as error:  # never break training
            warn_once(f"recording stopped: {error}")

    def _watch_ranks(self, store: Store) -> None:
        """Under torchrun, every RANKS_EVERY_S, marks the lanes of the job's ranks on this host
        whose process is gone: a rank killed says nothing, and the others may wait for it in a
        collective until their launcher stops them."""
        if self._ranked and time.monotonic() >= self._ranks_due:
            self._ranks_due = time.monotonic() + RANKS_EVERY_S
            self._mark_dead_ranks(store)

    def _mark_dead_ranks(self, store: Store) -> None:
        with suppress(Exception):  # a locked store: at the next look; never break training
            mark_dead_ranks(store, self.run.hostname, pid_alive, self.run.run_id)

    def _blamed(self, store: Store, status: RunStatus, reason: str | None) -> str | None:
        """This lane's reason, where it ends otherwise than completed after a rank of its job
        died without a word (found so now, where its process is gone, looking for DYING_S):
        stopped for that rank (`stopped_for`), so that the run's reason names the rank that
        died, not what this one saw of it (a collective's lost connection)."""
        if not self._ranked or status is RunStatus.COMPLETED or stopped_for_another(reason):
            return reason
        deadline = time.monotonic() + DYING_S
        while True:
            self._mark_dead_ranks(store)
            try:
                lanes = store.lanes(self.run.run_id)
            except Exception:  # never break training
                return reason
            dead = [x for x in lanes if x.lane != self.lane and died(x)]
            if dead:
                return stopped_for(dead[0], reason)
            if time.monotonic() >= deadline:
                return reason
            time.sleep(DYING_S / 20)

    @property
    def _ranked(self) -> bool:
        """One of several ranks, each writing its own lane."""
        return int(self.run.config.get("world_size") or 1) > 1

    def _write(self, store: Store, unwritten: Unwritten) -> bool:
        """Writes what the loop and the samplers produced since the last write, with what
        earlier writes could not; returns whether the store is lost to the recording."""
        events = [self.events.popleft() for _ in range(len(self.events))]
        if self.spec and self.lane == 0:  # one rank describes the run
            try:
                store.update_spec(self.run.run_id, **self.spec)
                self.spec = {}
            except Exception:  # a locked store: with the next write
                pass
        drained = self.recorder.drain() if self.recorder is not None else None
        if self.live is not None:
            try:
                self.live.add(events, drained.lanes if drained is not None else ())
            except Exception as error:  # TensorBoard's folder gone: the store goes on
                self.live = None
                warn_once(f"figures no longer written out: {error}")
        unwritten.add(events, drained)

        def write(batches: list[BatchEvent], drained: Drained) -> None:
            export = RunExport(self.run, [], batches, drained.gpu,
                               {self.run.hostname: drained.host}, drained.lanes,
                               drained.unavailable)  # fmt: skip
            add_rows(store, export, self.shift)

        return unwritten.flush(write)


def rank_given(iterable: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """What this rank was given, beside the others of its job: its own cores (`cpu_set` as
    taskset lists them, and how many: `cpus`; a scheduler or `taskset` may give each rank
    its own), its shard's size (`shard_of`) and the folder of its files (`data_dir`). The
    run's host description is one rank's: a rank that holds the others is told apart by
    these (`probe.judge.across_lanes`)."""
    cores = None
    with suppress(OSError):  # not known: never a reason not to record
        cores = own_cores()
    return {
        "cpu_set": None if cores is None else cpu_set_text(cores),
        "cpus": None if cores is None else len(cores),
        **shard_of(iterable),
        "data_dir": spec.get("data_dir"),
    }


def _without_cuda() -> bool:
    """Whether the loop surely runs without CUDA: torch is in use and sees no CUDA device."""
    return "torch" in sys.modules and not cuda_devices()


def _device_in_use(rank: Any) -> CudaDevice | None:
    """The CUDA device the loop uses (the current one once CUDA is in use, else LOCAL_RANK's),
    or None for the CPU."""
    index = loop_device(rank.local_rank if rank is not None else 0)
    return next((d for d in cuda_devices() if d.index == index), None)


def warn_once(message: str) -> None:
    if not _warned:
        _warned.append(message)
        warnings.warn(f"feedscope watch: {message}; training goes on", RuntimeWarning, stacklevel=3)
