"""What the `probe` command shows while it works: its two consoles (human text on stderr, tables
on stdout), progress bars, the live table of a run, and the narration of runs and sessions.

The CLI's modules print through here; rich is imported here and in `terminal` alone.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pipelines import Backend, PipelineSpec
from pipelines.sample_data import DEFAULT_SAMPLE, default_dataset_ready, ensure_default_dataset
from probe.judge.diagnosis import RunDiagnosis
from probe.judge.results import Session, SessionKind
from probe.measure.bench import BenchResult, bench_pipeline, describe_settings
from probe.measure.stop import Stop
from probe.metrics import counted, job_scope
from probe.present import doctor_tables, tables, terminal
from probe.present.offer import offer_lines
from probe.present.options import decimal
from probe.present.progress import progress_line
from probe.present.tables import run_notes
from probe.store.db import Store
from probe.store.documents import RunDocument

if TYPE_CHECKING:
    from probe.measure.config import ProbeConfig


def _console(stderr: bool) -> Console:
    # Logs and pipes get lines unwrapped and tables 120 columns wide, not rich's 80.
    tty = (sys.stderr if stderr else sys.stdout).isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=None if tty else 120)


err = _console(stderr=True)  # human text
out = _console(stderr=False)  # a command's final table


def say(text: str) -> None:
    """One line of human text on stderr, printed as it is (no rich markup)."""
    err.print(text, markup=False)


def print_lines(lines: Sequence[str], to_stdout: bool = False) -> None:
    for line in lines:
        (out if to_stdout else err).print(line, markup=False)


def progress(unit: str = "images") -> Progress:
    """A progress bar on stderr, gone when done."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    )


@contextmanager
def live_lanes(show: bool = True) -> Iterator[Callable[[Sequence[Any]], None] | None]:
    """The live table of a run's lanes on stderr, while the block runs: yields the function that
    redraws it from the lanes' states (None without `show`)."""
    with Live(console=err, refresh_per_second=4, transient=True) as live:
        yield (lambda states: live.update(terminal.live_table(states))) if show else None


def on_terminal() -> bool:
    return err.is_terminal


@contextmanager
def stopping_on_signals(stop: threading.Event, quiet: bool = False) -> Iterator[None]:
    """Ctrl-C and SIGTERM set `stop` (the run ends cleanly) instead of killing the process; a
    `Stop` is told which signal it was. `quiet`: no word of it here (a torchrun rank's signal
    may be torchrun passing on another rank's death: the rank says at its end what it was)."""

    def handle(signum: int, _: Any) -> None:
        name = signal.Signals(signum).name
        if not stop.is_set() and not quiet:
            err.print(f"{name}: stopping, keeping what was recorded")
        if isinstance(stop, Stop):
            stop.ask(f"stopped by {name}")
        stop.set()

    previous = {signum: signal.signal(signum, handle) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def resolve_data(data_dir: Path | None) -> Path:
    """The dataset folder: the one given, else the built-in sample data (made on first use)."""
    if data_dir is not None:
        return data_dir
    if default_dataset_ready():
        return ensure_default_dataset()
    err.print(
        f"generating the built-in sample dataset ({DEFAULT_SAMPLE.count} images, once; "
        "it is kept in your cache folder)"
    )
    if on_terminal():
        with progress() as bar:
            task = bar.add_task("writing JPEGs", total=DEFAULT_SAMPLE.count)
            return ensure_default_dataset(progress=lambda n: bar.advance(task, n))
    lines = _progress_lines("writing the sample data", DEFAULT_SAMPLE.count, "images")
    return ensure_default_dataset(progress=lines)


def _progress_lines(
    what: str, total: int, unit: str, every_s: float = 3.0
) -> Callable[[int], None]:
    """A progress callback (called with the items finished since its last call) that prints
    a line at most every `every_s` seconds and at the end: where no terminal draws a bar, as
    in a launch's log, which the dashboard reads back."""
    started = time.monotonic()
    state = {"done": 0, "printed": started}

    def advance(count: int) -> None:
        state["done"] += count
        now = time.monotonic()
        done = int(state["done"])
        if now - state["printed"] >= every_s or done >= total:
            state["printed"] = now
            say(progress_line(what, done, total, unit, now - started))

    return advance


def bench_one(
    spec: PipelineSpec,
    backend: Backend,
    dataset: Any,
    warmup: int,
    duration: float,
    batches: int | None,
) -> BenchResult:
    """`bench_pipeline`, with a progress bar."""
    label = f"{backend.value:<5} {describe_settings(spec, backend)}"
    unit = "batches" if batches else "s"
    with progress(unit) as bar:
        task = bar.add_task(f"{label} (starting)", total=batches or duration)

        def advance(elapsed_s: float) -> None:
            done = bar.tasks[task].completed + 1 if batches else elapsed_s
            bar.update(task, completed=done, description=label)

        return bench_pipeline(
            spec,
            backend,
            warmup_batches=warmup,
            duration_s=duration,
            max_batches=batches,
            dataset=dataset,
            on_batch=advance,
        )


def announce(config: ProbeConfig, gpus_given: bool, store: Store) -> None:
    """What a probe is about to do, where, for how long; its data and its store."""
    from probe.measure.devices import cuda_devices, cuda_failure, describe
    from probe.measure.lane import Read

    devices = [p.device for p in config.lanes if p.device is not None]
    if config.torchrun:
        plan = config.lanes[0]
        where = (
            f"{plan.num_shards} torchrun ranks, rank i reading shard i of {plan.num_shards} on "
            + ("cuda:LOCAL_RANK" if devices else "the CPU")
        )
    elif not devices:
        visible = "" if cuda_devices() else f" ({cuda_failure() or 'no CUDA GPU visible'})"
        where = f"the CPU, {len(config.lanes)} lane(s){visible}"
    else:
        where = (
            "GPU " + describe(devices) + ("" if gpus_given else " (all visible; pick with --gpus)")
        )
    if config.read is Read.STREAM:
        reading = "as one stream"
    elif config.backend is Backend.DALI:
        reading = "epoch by epoch"
    elif config.spec.dataloader.persistent_workers:
        reading = "epoch by epoch, workers kept"
    else:
        reading = "epoch by epoch, workers started anew each epoch"
    warmup = (
        "warm-up until the rate settles"
        if config.warmup is None
        else f"{config.warmup} warm-up batches"
    )
    options = describe_settings(config.lane_spec(config.lanes[0]), config.backend)
    err.print(
        f"probe: {config.backend.value} ({options}, batch {config.spec.batch_size}) on {where}; "
        f"consumer {config.consumer}; reading the shard {reading}; {warmup}, then "
        f"{_stop_text(config)} per lane; samples at {config.sample_hz:g} Hz"
    )
    err.print(f"data: {config.spec.data_dir}; store: {store.path}")


def _stop_text(config: ProbeConfig) -> str:
    if config.until_precise:
        return f"until images/s is known within {config.precision:.0%} (at most {config.max_s:g} s)"
    return " or ".join(
        part
        for part in (
            counted(config.batches, "batch") if config.batches else "",
            f"{decimal(config.duration_s)} s" if config.duration_s else "",
        )
        if part
    )


def narrate(kind: str, payload: Any) -> None:
    """The `on_event` of a sweep or doctor session: one line per run it measures (a run comes
    as its RunDocument)."""
    if kind == "start":
        err.print(f"measuring {payload['label']} (at most {payload['max_s']:.0f} s)")
    elif kind == "run":
        say(f"  {terminal.run_line(payload)}")


def print_run(document: RunDocument, diagnosis: RunDiagnosis, tuned: str | None = None) -> None:
    """A run's table on stdout; its notes and diagnosis on stderr, with what a doctor session
    measured like it and a tune session on it (`tuned`), where they did."""
    out.print(terminal.run_table(document))
    print_lines(run_notes(document))
    print_lines(
        tables.diagnosis_lines(
            diagnosis.verdict,
            diagnosis.recommendations,
            diagnosis.asides,
            job_scope(tables.run_devices(document)),
            diagnosis.verified,
            diagnosis.findings,
        )
    )
    if diagnosis.what_if is not None:
        print_lines([diagnosis.what_if])
    print_lines(offer_lines(document, diagnosis.recommendations, tuned))


def print_session(session: Session) -> None:
    """A doctor's or a sweep's points, and the doctor's answer, on stdout."""
    if session.points or session.skipped:
        out.print(terminal.sweep_table(session))
        print_lines(tables.curve_lines(session), to_stdout=True)
    if session.kind is SessionKind.DOCTOR:
        searched = terminal.dali_table(session)
        if searched is not None:
            out.print(searched)
        print_lines(doctor_tables.doctor_lines(session), to_stdout=True)
    if session.scaling is not None:
        out.print(terminal.scaling_table(session.scaling))
        print_lines(doctor_tables.scaling_lines(session.scaling), to_stdout=True)
