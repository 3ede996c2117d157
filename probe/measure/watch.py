"""`watch`: measure your own training loop's input pipeline from inside it.

    from probe import watch

    for images, labels in watch(train_loader, name="resnet50-bs256"):
        ...  # your training step

Each batch's data-wait (the time spent getting it from the loader, `iter()` included: a
DataLoader starts or resumes its workers there) and step (the time from handing it over until
the next one is asked for) are recorded, with the GPU and host samplers running, as a run of
kind `watch` in the store: the dashboard, `probe show`, the diagnosis and the reports work on it
as on a probe's run. One watched job is one run, and each `for` over it an epoch of that run, so
that its epoch starts are measured and judged; its first batches are warm-up, once. Under DDP
(torchrun), each rank is a lane of one run. Recording never breaks training: if the store cannot
be used, or stays locked by another process (`probe.measure.unwritten`), it warns once and the
loop runs on unwatched.

The data-wait ends when the loader hands the batch over, not when it is ready on the GPU: a
copy still under way (`pin_memory` with `non_blocking`, DALI's GPU outputs) falls into the step,
and the batches are recorded `synced=False`. Waiting for the device there would hold the loop
until the previous step's queued kernels finish too, taking away the overlap of host and GPU
that the training relies on. Where torch is loaded and sees no CUDA device there is nothing to
wait for: `synced=True`; where it cannot be told (torch not loaded), `synced=False`.
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
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pipelines import InputError
from probe.measure.described import batch_size, describe, image_size, type_name
from probe.measure.devices import CudaDevice, cuda_devices, device_sync, loop_device
from probe.measure.live import Labels, Live, nvml_index, require, start_live
from probe.measure.recorder import Drained, Recorder
from probe.measure.timer import BatchTimer
from probe.measure.unwritten import WRITE_WAIT_S, Unwritten, patiently
from probe.records import BatchEvent, LaneRecord, RunExport, RunRecord, RunStatus
from probe.steady import Warmup
from probe.store.db import Store
from probe.store.merge import add_rows, clock_shift, import_run, settle_run

if TYPE_CHECKING:
    from probe.measure.tensorboard import TensorBoard

T = TypeVar("T")
WRITE_EVERY_S = 0.5
_warned: list[str] = []  # what was warned of: once is enough
_calls = itertools.count()  # watch() calls in this process: ranks number them alike


def watch(
    iterable: Iterable[T],
    name: str | None = None,
    *,
    db: Path | str | None = None,
    sample_hz: float = 10.0,
    warmup: int | str = 5,
    metrics_port: int | None = None,
    tensorboard: str | Path | Any | None = None,
    tensorboard_every: int = 100,
    answer: bool = True,
) -> Watched[T]:
    """Yields what `iterable` yields, recording how long each item took to get and to use.

    One watched job is one run: each `for` over the result is an epoch of it, and the run ends
    with `close()`, at the end of a `with` block, when the result is dropped, or when the
    process exits.

    Args:
        iterable: a torch DataLoader, a DALI iterator or any iterable of batches.
        name: the run's label in listings.
        db: the store; default `$FEEDSCOPE_DB`, else your data folder.
        sample_hz: GPU and host samples per second (0: none).
        warmup: the job's first batches, recorded but left out of every figure (workers
            starting, cuDNN choosing its algorithms), once; or "auto": until the rate settles.
        metrics_port: serve the figures on this port's `/metrics` for Prometheus (under
            torchrun, each rank on `metrics_port + LOCAL_RANK`); needs the `prometheus` extra.
        tensorboard: a folder, or your SummaryWriter, to write the figures to as scalars every
            `tensorboard_every` measured batches; needs the `tensorboard` extra.
        answer: when the process exits, print on stderr the answer for each loader it watched
            (its verdict and first change), the training loader (the most batches) first.

    Raises:
        InputError: an extra these options need is not installed, or an option is out of range.
    """
    outlets = Outlets.checked(metrics_port, tensorboard, tensorboard_every)
    return Watched(iterable, name, db, sample_hz, warmup, outlets, answer)


@dataclass(frozen=True)
class Outlets:
    """Where a watched loop's figures go besides the store: a Prometheus endpoint's port,
    TensorBoard (a folder or a SummaryWriter) and how often it gets a point."""

    metrics_port: int | None = None
    tensorboard: str | Path | Any | None = None
    tensorboard_every: int = 100

    @classmethod
    def checked(cls, port: int | None, board: str | Path | Any | None, every: int) -> Outlets:
        if port is not None:
            if not 0 < port < 65536:
                raise InputError(f"metrics_port {port}: a port is 1 to 65535")
            require("prometheus_client", "prometheus-client", "the Prometheus endpoint",
                    "prometheus")  # fmt: skip
        if board is not None:
            if every < 1:
                raise InputError(f"tensorboard_every {every}: write every 1 batch or more")
            require("tensorboard", "tensorboard", "writing to TensorBoard", "tensorboard")
        return cls(port, board, every)

    def __bool__(self) -> bool:
        return self.metrics_port is not None or self.tensorboard is not None


class Watched(Generic[T]):
    """An iterable that records its iteration: one run, each `for` over it an epoch."""

    def __init__(
        self, iterable: Iterable[T], name: str | None, db: Path | str | None, sample_hz: float,
        warmup: int | str, outlets: Outlets | None = None, answer: bool = False,
    ) -> None:  # fmt: skip
        self.iterable, self.name, self.db = iterable, name, db
        self.answer = answer  # told when the process exits (`Answer`)
        self.sample_hz, self.warmup = sample_hz, warmup
        self.outlets = outlets or Outlets()
        self._recording: _Recording | None = None
        self._started = False
        self._epoch = -1
        self._active = [False]  # a `for` is under way (read by the run's end at exit)
        fixed = None if str(warmup) == "auto" else int(warmup)
        self._warmup = Warmup(fixed, _workers(iterable), by_epoch=True)

    @property
    def run_id(self) -> str | None:
        """The run it records into, once iterated (None before, or where it cannot record)."""
        return None if self._recording is None else self._recording.run.run_id

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]

    def __enter__(self) -> Watched[T]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(RunStatus.COMPLETED if exc_type is None else RunStatus.INTERRUPTED)

    def close(self, status: RunStatus = RunStatus.COMPLETED, reason: str | None = None) -> None:
        """Ends the run: what is left is written, with the lane's figures."""
        if self._recording is not None:
            self._recording.finish(status, reason)

    def _start(self) -> _Recording | None:
        """The recording, started at the first call (None where it cannot record)."""
        if not self._started:
            self._started = True
            self._recording = _Recording.start(self)
            if self._recording is not None:  # ends the run when this object goes
                weakref.finalize(self, self._recording.finish_quietly, self._active)
        return self._recording

    def __iter__(self) -> Iterator[T]:
        recording = self._start()
        if recording is None or recording.ended:
            yield from unwatched(self.iterable)
            return
        self._epoch += 1
        events, timer, epoch = recording.events, recording.timer(), self._epoch
        size: int | None = None  # the batch handed out, until its step is done
        self._active[0] = True
        timer.ask()  # before iter(): a DataLoader starts, or resumes, its workers there
        try:
            started_ns = time.monotonic_ns()
            source = unwatched(self.iterable)
            recording.started(epoch, started_ns, time.monotonic_ns())
            while True:
                try:
                    batch = next(source)
                except StopIteration:
                    return
                timer.got()
                size = batch_size(batch)
                recording.saw(batch)
                yield batch
                if not recording.ended:  # a recording given up on keeps nothing more
                    events.append(self._warm(timer.done(size, epoch)))
                size = None
                timer.ask(timer.done_ns)
        except GeneratorExit:  # the loop was left (a break, or an error in the step)
            raise
        except BaseException as error:  # the loader failed: recorded, and raised on
            reason = f"{type(error).__name__}: {error}".splitlines()[0]
            recording.finish(RunStatus.FAILED, reason)
            raise
        finally:
            if size is not None:
                events.append(self._warm(timer.done(size, epoch)))
            self._active[0] = False

    def _warm(self, event: BatchEvent) -> BatchEvent:
        return replace(event, warmup=True) if self._warmup.warming(event) else event


class Hooked:
    """A watched loop driven by a framework's hooks instead of a `for` (Lightning's
    `probe.measure.lightning`): each batch's wait runs from the end of the last step, or the
    epoch's start, to the batch's start; its step from there to its end."""

    def __init__(self, watched: Watched[Any]) -> None:
        self.watched = watched
        self._timer: BatchTimer | None = None
        self._size: int | None = None

    def epoch_start(self) -> None:
        recording = self.watched._start()
        if recording is None or recording.ended:
            self._timer = None
            return
        self.watched._epoch += 1
        self.watched._active[0] = True
        self._timer = recording.timer()
        self._timer.ask()

    def resume(self) -> None:
        """The loop goes back to its batches (after a validation): the wait starts now."""
        if self._timer is not None:
            self._timer.ask()

    def batch_start(self, batch: Any) -> None:
        if self._timer is not None:
            self._timer.got()
            self._size = batch_size(batch)
            if self.watched._recording is not None:
                self.watched._recording.saw(batch)

    def batch_end(self) -> None:
        recording, timer = self.watched._recording, self._timer
        if timer is None or self._size is None or recording is None:
            return
        if not recording.ended:
            event = timer.done(self._size, self.watched._epoch)
            recording.events.append(self.watched._warm(event))
        self._size = None
        timer.ask(timer.done_ns)

    def epoch_end(self) -> None:
        self._timer = None
        self.watched._active[0] = False


_inside = threading.local()  # a watched loader's own `iter()` is under way in this thread


def unwatched(iterable: Iterable[T]) -> Iterator[T]:
    """`iter(iterable)`, known to be a watched loader's own: `probe watch`, which watches every
    loader a script iterates, leaves it to the `watch` already around it."""
    _inside.on = True
    try:
        return iter(iterable)
    finally:
        _inside.on = False


def iterated_by_watch() -> bool:
    """Whether this thread is in a watched loader's own `iter()` (`unwatched`)."""
    return bool(getattr(_inside, "on", False))


def _workers(iterable: Any) -> int | None:
    """A torch DataLoader's workers, which make batches in turn."""
    workers = getattr(iterable, "num_workers", None)
    return workers if isinstance(workers, int) else None


class Answer:
    """The answer a watching process tells when it exits: each loader's verdict and first
    change. The judge is above this layer: `probe` (the package) gives the way to tell it
    (`teller`, which loads it); `probe watch` tells its own when the script ends
    (`elsewhere`)."""

    teller: Callable[[], Callable[[Path, str], list[str]]] | None = None
    tell: Callable[[Path, str], list[str]] | None = None  # (store, a run) -> the lines
    elsewhere = False
    first: tuple[Path, str] | None = None  # the process's first watched run: store, run id

    @classmethod
    def started(cls, store_path: Path, run_id: str, at_exit: bool) -> None:
        """Notes a watched run's start; `at_exit`: tells the answer when the process exits,
        after its runs have ended (atexit runs the last registered first, and every run's own
        end is registered after this)."""
        if cls.first is None:
            cls.first = (store_path, run_id)
        if at_exit and cls.tell is None and cls.teller is not None:
            try:
                cls.tell = cls.teller()  # loaded now: an exiting process cannot load it
            except Exception as error:  # never break training
                _warn_once(f"no answer at exit: {error}")
                return
            atexit.register(cls._told)

    @classmethod
    def _told(cls) -> None:
        if cls.elsewhere or cls.tell is None or cls.first is None:
            return
        try:
            lines = cls.tell(*cls.first)
        except Exception as error:  # the process is ending: one line, never a traceback
            lines = [f"no answer: {error}"]
        for line in lines:
            print(f"feedscope: {line}", file=sys.stderr)


class _Recording:
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
        self._thread = threading.Thread(
            target=self._write_loop, name="feedscope-watch", daemon=True
        )

    @classmethod
    def start(cls, watched: Watched[Any]) -> _Recording | None:
        try:
            return cls._start(watched)
        except Exception as error:  # never break training
            _warn_once(f"not recording: {error}")
            return None

    @classmethod
    def _start(cls, watched: Watched[Any]) -> _Recording:
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
        kind, spec = describe(watched.iterable)
        run = RunRecord(
            run_id=run_id, kind="watch", created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            status=RunStatus.RUNNING, reason=None, pipeline=kind, consumer="your training step",
            label=watched.name,
            config={
                "pipeline": kind, "spec": spec, "consumer": "your training step",
                "warmup": watched.warmup, "read": "epochs", "batches": None, "duration_s": None,
                "sample_hz": watched.sample_hz, "world_size": world, "torchrun": rank is not None,
                "lanes": [{"lane": lane, "gpu": None if device is None else device.index,
                           "shard_id": lane, "num_shards": world}],
                "iterable": type_name(watched.iterable),
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
            _warn_once(f"no metrics endpoint on port {port}: {error.strerror or error}")
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

    def finish(self, status: RunStatus, reason: str | None) -> None:
        """Ends the recording: the writer writes what is left, the lane's figures and status."""
        if self._ended is not None:
            return
        self._ended = (status, reason)
        self.ended = True
        self._done.set()
        self._thread.join(timeout=30)
        atexit.unregister(self.finish_quietly)

    def finish_quietly(self, active: list[bool]) -> None:
        """The run's end when nobody ended it: completed, unless a `for` was under way."""
        if active[0]:
            self.finish(RunStatus.INTERRUPTED, "the process exited mid-loop")
        else:
            self.finish(RunStatus.COMPLETED, None)

    def _write_loop(self) -> None:
        from probe.store.documents import lane_figures_from_store

        unwritten = Unwritten()
        try:
            with Store(self.store_path) as store:
                store.busy_timeout(WRITE_WAIT_S)  # a locked store: try again later
                lost = False
                while not lost and not self._done.wait(WRITE_EVERY_S):
                    lost = self._write(store, unwritten)
                if self.recorder is not None:
                    self.recorder.stop()
                if self.gpus is not None:
                    self.gpus.close()
                while not lost and not self._write(store, unwritten) and unwritten.blocked_since:
                    time.sleep(max(0.0, unwritten.retry_at - time.monotonic()))
                if self.board is not None:
                    self.board.close()
                status, reason = self._ended or (RunStatus.INTERRUPTED, None)
                if lost or unwritten.unfinished():
                    self.ended = True  # the loop goes on unrecorded
                    status, reason = RunStatus.FAILED, unwritten.lost_reason(store)
                    _warn_once(f"recording stopped: {reason}")
                run, lane = store.run(self.run.run_id), store.lanes(self.run.run_id)
                mine = next(x for x in lane if x.lane == self.lane)
                figures = lane_figures_from_store(store, run, mine, self.starts)
                update = partial(store.update_lane, run.run_id, self.lane)
                patiently(partial(update, status=status, reason=reason, summary=figures))
                patiently(partial(settle_run, store, run.run_id))
        except Exception as error:  # never break training
            _warn_once(f"recording stopped: {error}")

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
                _warn_once(f"figures no longer written out: {error}")
        unwritten.add(events, drained)

        def write(batches: list[BatchEvent], drained: Drained) -> None:
            export = RunExport(self.run, [], batches, drained.gpu,
                               {self.run.hostname: drained.host}, drained.lanes,
                               drained.unavailable)  # fmt: skip
            add_rows(store, export, self.shift)

        return unwritten.flush(write)


def _without_cuda() -> bool:
    """Whether the loop surely runs without CUDA: torch is in use and sees no CUDA device."""
    return "torch" in sys.modules and not cuda_devices()


def _device_in_use(rank: Any) -> CudaDevice | None:
    """The CUDA device the loop uses (the current one once CUDA is in use, else LOCAL_RANK's),
    or None for the CPU."""
    index = loop_device(rank.local_rank if rank is not None else 0)
    return next((d for d in cuda_devices() if d.index == index), None)


def _warn_once(message: str) -> None:
    if not _warned:
        _warned.append(message)
        warnings.warn(f"feedscope watch: {message}; training goes on", RuntimeWarning, stacklevel=3)
