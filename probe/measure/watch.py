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

import gc
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pipelines import InputError
from probe.measure.described import batch_size
from probe.measure.live import require
from probe.measure.recording import Recording
from probe.records import BatchEvent, RunStatus
from probe.steady import Warmup

if TYPE_CHECKING:
    from probe.measure.timer import BatchTimer

T = TypeVar("T")


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
        self.command: dict[str, Any] | None = None  # `probe watch --`'s, which a re-run needs
        self._recording: Recording | None = None
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

    def _start(self) -> Recording | None:
        """The recording, started at the first call (None where it cannot record)."""
        if not self._started:
            self._started = True
            self._recording = Recording.start(self)
            if self._recording is not None:  # ends the run when this object goes
                weakref.finalize(self, _dropped, self._recording, self._active)
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
        except GeneratorExit:  # the loop was left: it may be iterated again
            raise
        except KeyboardInterrupt:  # stopped by Ctrl-C: interrupted, whoever ends the run, and
            # even where the script goes on and drops the loader (not waited for: its writer
            # would make the Ctrl-C wait)
            recording.finish(RunStatus.INTERRUPTED, "interrupted (Ctrl-C)", wait=False)
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


_collecting = threading.Event()  # a collection of cycles is under way (`gc.callbacks`)


def _collection(phase: str, _: dict[str, int]) -> None:
    if phase == "start":
        _collecting.set()
    else:
        _collecting.clear()


gc.callbacks.append(_collection)


def _dropped(recording: Recording, active: list[bool]) -> None:
    """A watched loader gone: its run ends. Where the loop let it go (`for batch in
    watch(loader)` ended), the run's end is written before the code goes on, as `close()`
    writes it. Where a collection of cycles took it (a loader the script dropped, which holds
    its `Watched`), the writer ends on its own: a collection runs in any thread, the writer's or
    one holding the store's lock mid-transaction, and waiting there for a writer could hold
    them both."""
    recording.finish_quietly(active, wait=not _collecting.is_set())


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
    with leaving_alone():
        return iter(iterable)


@contextmanager
def leaving_alone() -> Iterator[None]:
    """Marks this thread as inside a watched loader's own iteration while the block runs: the
    loaders it starts meanwhile are that loader's, not the script's to watch."""
    _inside.on = True
    try:
        yield
    finally:
        _inside.on = False


def iterated_by_watch() -> bool:
    """Whether this thread is in a watched loader's own `iter()` (`unwatched`)."""
    return bool(getattr(_inside, "on", False))


def _workers(iterable: Any) -> int | None:
    """A torch DataLoader's workers, which make batches in turn."""
    workers = getattr(iterable, "num_workers", None)
    return workers if isinstance(workers, int) else None
