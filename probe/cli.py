"""The `probe` command (also `python -m probe`).

Exit codes: 0 ok, 1 the run failed, 2 bad usage or bad input (one line, no traceback), 130 the
run was interrupted (what it recorded is kept). With `--json` a command prints one JSON document
on stdout; human text goes to stderr, except a command's final table, which goes to stdout.
"""

from __future__ import annotations

import functools
import json
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from pipelines import (
    Backend,
    BackendUnavailable,
    DaliOptions,
    DataLoaderOptions,
    Decoder,
    InputError,
    OutputDtype,
    PipelineSpec,
    available_cpus,
    check_backend,
    check_device,
    discover,
)
from pipelines.loader import cuda_device_count
from pipelines.sample_data import (
    DEFAULT_SAMPLE,
    SampleParams,
    default_dataset_ready,
    default_sample_dir,
    ensure_default_dataset,
    make_sample_dataset,
)
from probe import terminal
from probe.bench import BenchResult, bench_pipeline, describe_settings
from probe.consumers import check_model, parse_consumer
from probe.lane import Read
from probe.steady import MAX_MEASURE_S, PRECISION
from probe.store import RunStatus, Store

if TYPE_CHECKING:
    from probe.distributed import Rank
    from probe.runner import ProbeConfig  # imported where used: it brings torch

STARTED = time.monotonic()  # the command's start: a session's budget counts from it
BENCH_SCHEMA = "feedscope.bench/1"
GPU_BATCH_SIZE, CPU_BATCH_SIZE = 128, 32
EXIT_FAILED, EXIT_INTERRUPTED = 1, 130
DOCTOR_CONSUMER = "sleep:30"  # what ResNet-50 takes per batch of 128 on one H200: 30 ms
# A GPU session builds, moves and tunes a model before its first point; a CPU one has none.
DOCTOR_BUDGET_S = {"gpu": 120.0, "cpu": 60.0}

F = TypeVar("F", bound=Callable[..., Any])


def _console(stderr: bool) -> Console:
    # Logs and pipes get lines unwrapped and tables 120 columns wide, not rich's 80.
    tty = (sys.stderr if stderr else sys.stdout).isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=True, width=None if tty else 120)


_err = _console(stderr=True)
_out = _console(stderr=False)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="feedscope", prog_name="probe")
def cli() -> None:
    """feedscope: is your GPU waiting for data, why, and what should you change?"""


@dataclass(frozen=True)
class PipelineArgs:
    """The pipeline options of a measuring command, as given."""

    data_dir: Path | None
    batch_size: int | None
    image_size: int
    workers: int | None
    threads: int | None
    decoder: str | None
    dtype: str | None
    persistent_workers: bool
    start_method: str | None
    skip_corrupt: bool

    def spec(self, device: int | None, cores: int, on_gpu: bool | None = None) -> PipelineSpec:
        """The spec they describe (workers and threads default to `cores`, the batch size to
        one for a GPU or for the CPU), validated before any long work starts; the data folder
        is the sample data's until it is resolved."""
        gpu = device is not None if on_gpu is None else on_gpu
        return PipelineSpec(
            data_dir=self.data_dir if self.data_dir is not None else default_sample_dir(),
            batch_size=(GPU_BATCH_SIZE if gpu else CPU_BATCH_SIZE)
            if self.batch_size is None
            else self.batch_size,
            image_size=self.image_size,
            device=device,
            skip_corrupt=self.skip_corrupt,
            dataloader=DataLoaderOptions(
                num_workers=cores if self.workers is None else self.workers,
                output_dtype=None if self.dtype is None else OutputDtype(self.dtype),
                persistent_workers=self.persistent_workers,
                start_method=self.start_method,
            ),
            dali=DaliOptions(
                num_threads=cores if self.threads is None else self.threads,
                decoder=None if self.decoder is None else Decoder(self.decoder),
            ),
        )


@dataclass(frozen=True)
class LaneArgs:
    """Where and how a probe runs: GPUs, shards, consumer, reading, warm-up, precision,
    sampling."""

    gpus: str | None
    num_shards: int | None
    consumer: str
    read: str
    warmup: str
    precision: str
    sample_hz: float

    def warmup_batches(self) -> int | None:
        """`--warmup`: None for auto (until the rate settles), else a number of batches."""
        if self.warmup.strip().lower() == "auto":
            return None
        try:
            return int(self.warmup)
        except ValueError:
            raise InputError(
                f"--warmup takes auto or a number of batches (got {self.warmup!r})"
            ) from None

    def precision_share(self) -> float:
        from probe.gate import parse_share

        return parse_share(self.precision, "--precision")


def _options(*options: Callable[[F], F]) -> Callable[[F], F]:
    def apply(function: F) -> F:
        for option in reversed(options):
            function = option(function)
        return function

    return apply


def _bundled(kind: type, options: Sequence[Callable[[F], F]], name: str) -> Callable[[F], F]:
    """Adds `options` to a command, which gets them as one `kind` object, argument `name`."""
    names = [field.name for field in fields(kind)]

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def command(**kwargs: Any) -> Any:
            bundle = kind(**{key: kwargs.pop(key) for key in names})
            return function(**{name: bundle}, **kwargs)

        return _options(*options)(command)  # type: ignore[arg-type]

    return decorate


_pipeline_options = _bundled(
    PipelineArgs,
    [
        click.option(
            "--data", "data_dir", type=click.Path(path_type=Path), default=None,
            help="Class-per-folder dataset.  [default: the built-in sample data]",
        ),
        click.option("--batch-size", default=None, type=int,
                     help=f"Images per batch.  [default: {GPU_BATCH_SIZE} on a GPU, "
                          f"{CPU_BATCH_SIZE} on the CPU]"),
        click.option("--image-size", default=224, show_default=True, type=int,
                     help="Output side in pixels (square)."),
        click.option("--workers", default=None, type=int,
                     help="DataLoader workers.  [default: the CPU cores per lane]"),
        click.option("--threads", default=None, type=int,
                     help="DALI CPU threads.  [default: the CPU cores per lane]"),
        click.option("--decoder", type=click.Choice(["mixed", "cpu"]), default=None,
                     help="DALI decoder.  [default: mixed on a GPU, cpu without]"),
        click.option("--dtype", type=click.Choice(["uint8", "float32"]), default=None,
                     help="What DataLoader workers hand over (uint8: normalized on the device).  "
                          "[default: uint8 to a GPU, float32 on the CPU]"),
        click.option("--persistent-workers/--no-persistent-workers", default=True,
                     show_default=True,
                     help="DataLoader workers kept from one epoch to the next (--read epochs)."),
        click.option("--start-method", type=click.Choice(["fork", "spawn", "forkserver"]),
                     default=None,
                     help="How DataLoader workers start.  [default: as a fresh Python process "
                          "starts them]"),
        click.option("--skip-corrupt", is_flag=True, help="Skip and count undecodable images."),
    ],
    "pipeline",
)  # fmt: skip


def _lane_options(consumer: str) -> Callable[[F], F]:
    return _bundled(
        LaneArgs,
        [
            click.option("--gpus", default=None,
                         help="CUDA indices (0,1), all, or none for the CPU.  [default: all "
                              "visible GPUs, else the CPU]"),
            click.option("--num-shards", default=None, type=int,
                         help="Shards the dataset is split into; lane i reads shard i.  "
                              "[default: one per GPU; on the CPU, 1]"),
            click.option("--consumer", default=consumer, show_default=True,
                         help="What eats the batches: none, sleep:MS (a step of MS ms), or "
                              "model:NAME (a training step, e.g. model:resnet50)."),
            click.option("--read", type=click.Choice([r.value for r in Read]),
                         default=Read.STREAM.value, show_default=True,
                         help="stream: the shard as one endless stream (steady state); epochs: "
                              "epoch by epoch, the loader restarted at each, as a for loop per "
                              "epoch does."),
            click.option("--warmup", default="auto", show_default=True,
                         help="Batches per lane before measuring (not counted), or auto: until "
                              "the rate settles."),
            click.option("--precision", default=f"{PRECISION:.0%}", show_default=True,
                         help="Measure until images/s is known within this (95%), unless "
                              "--batches or --duration fix the length."),
            click.option("--sample-hz", default=10.0, show_default=True, type=float,
                         help="Hardware samples per second (0: none)."),
        ],
        "lanes",
    )  # fmt: skip


def _backend_option(help_text: str | None = None) -> Callable[[F], F]:
    return click.option(
        "--pipeline", "backend", type=click.Choice([b.value for b in Backend]), default="torch",
        show_default=True, help=help_text,
    )  # fmt: skip


_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout."
)
_store_option = click.option(
    "--db", type=click.Path(path_type=Path), default=None,
    help="The store (an SQLite file).  [default: $FEEDSCOPE_DB, else your data folder]",
)  # fmt: skip


@cli.group()
def data() -> None:
    """Datasets: make a synthetic one to measure with."""


@data.command("make")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--count", default=DEFAULT_SAMPLE.count, show_default=True, help="Images to write.")
@click.option("--classes", default=DEFAULT_SAMPLE.classes, show_default=True, help="Class folders.")
@click.option(
    "--seed", default=DEFAULT_SAMPLE.seed, show_default=True, help="Same seed, same files."
)
def data_make(directory: Path, count: int, classes: int, seed: int) -> None:
    """Write natural-looking JPEGs into DIRECTORY/class_XX/ (a new or empty folder)."""
    params = SampleParams(count=count, classes=classes, seed=seed)
    with _progress() as progress:
        task = progress.add_task("writing JPEGs", total=count)
        summary = make_sample_dataset(
            directory, params, progress=lambda n: progress.advance(task, n)
        )
    _err.print(
        f"wrote {summary.count} images in {summary.classes} classes to {summary.root} "
        f"(mean {summary.mean_kb:.0f} KB)"
    )


@cli.command()
@_pipeline_options
@_json_option
@click.option(
    "--pipeline",
    "backends",
    type=click.Choice([b.value for b in Backend]),
    multiple=True,
    help="Pipeline to measure; repeat for several.  [default: torch and dali]",
)
@click.option(
    "--gpu",
    default=None,
    help="CUDA device index, or 'none' for the CPU.  [default: GPU 0 if there is one]",
)
@click.option(
    "--warmup",
    default=3,
    show_default=True,
    type=click.IntRange(min=0),
    help="Batches run before measuring.",
)
@click.option(
    "--duration",
    default=8.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="Seconds measured per pipeline.",
)
@click.option("--batches", default=None, type=click.IntRange(min=1),
              help="Stop after this many measured batches, if sooner.")  # fmt: skip
def bench(
    pipeline: PipelineArgs,
    as_json: bool,
    backends: Sequence[str],
    gpu: str | None,
    warmup: int,
    duration: float,
    batches: int | None,
) -> None:
    """Measure the DataLoader and DALI pipelines alone on the same data: images/s.

    Both pipelines are built from one spec and get the same CPU budget (workers = threads),
    in this process, with no consumer and no store: a quick comparison.
    """
    device, device_note = _pick_gpu(gpu)
    cpus = available_cpus()
    spec = pipeline.spec(device, cpus)
    check_device(device)
    chosen = [Backend(b) for b in backends] or list(Backend)
    missing: dict[str, str] = {}
    for backend in list(chosen):
        try:
            check_backend(backend)
        except BackendUnavailable as error:
            if backends:  # asked for by name: an error, not a note
                raise
            missing[backend.value] = str(error)
            chosen.remove(backend)
    root = _resolve_data(pipeline.data_dir)
    dataset = discover(root)
    where = "CPU" if device is None else f"GPU {device}"
    _err.print(
        f"data: {root} ({len(dataset)} images, {len(dataset.classes)} classes); "
        f"device: {where}{device_note}; batch size {pipeline.batch_size}; "
        f"{cpus} CPU cores available"
    )
    spec = replace(spec, data_dir=root)
    results = [_bench_one(spec, b, dataset, warmup, duration, batches) for b in chosen]
    if as_json:
        document = {
            "schema": BENCH_SCHEMA,
            "data_dir": str(root),
            "images_in_dataset": len(dataset),
            "device": None if device is None else f"cuda:{device}",
            "batch_size": pipeline.batch_size,
            "cpus": cpus,
            "results": [_result_json(r) for r in results],
            "unavailable": missing,
        }
        click.echo(json.dumps(document, indent=2))
        return
    _out.print(terminal.bench_table(results))
    for backend_name, reason in missing.items():
        _err.print(f"{backend_name}: not measured: {reason}")


@cli.command()
@_pipeline_options
@_lane_options(consumer="none")
@_json_option
@_store_option
@_backend_option()
@click.option(
    "--batches",
    default=None,
    type=int,
    help="Measured batches per lane.  [default: until --precision]",
)
@click.option(
    "--duration",
    default=None,
    type=float,
    help=f"Measured seconds per lane.  [default: until --precision, at most {MAX_MEASURE_S:g} s]",
)
@click.option("--label", default=None, help="A name for the run, shown in listings.")  # fmt: skip
@click.option("--no-gather", is_flag=True,
              help="Under torchrun: each rank adds its lane to its own --db (a store per node, "
                   "joined later by probe merge) instead of sending it to rank 0.")  # fmt: skip
def run(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    backend: str,
    batches: int | None,
    duration: float | None,
    label: str | None,
    no_gather: bool,
) -> None:
    """Run a pipeline on the chosen GPUs and shards, sample the hardware, and record it all.

    One process per GPU, lane i reading shard i of N, as DDP training does; with --gpus none,
    one CPU lane per shard. Ctrl-C stops the run and keeps what it recorded.

    Under torchrun, one lane per rank: it drives cuda:LOCAL_RANK (or the CPU with --gpus none)
    and reads shard RANK of WORLD_SIZE; rank 0 records the run with every rank's lane.
    """
    from probe.distributed import torchrun_rank
    from probe.runner import run_probe

    rank = torchrun_rank()
    if rank is not None:
        _run_ranked(rank, pipeline, lanes, as_json, db, Backend(backend), batches, duration,
                    label, gather=not no_gather)  # fmt: skip
        return
    if no_gather:
        raise InputError("--no-gather is for runs under torchrun")
    config, store = _prepare(pipeline, lanes, db, Backend(backend), batches, duration, label)
    _announce(config, lanes, store)
    stop = threading.Event()
    with (
        _stopping_on_signals(stop),
        Live(console=_err, refresh_per_second=4, transient=True) as live,
    ):
        run_id = run_probe(
            config,
            store,
            stop=stop,
            on_update=lambda states: live.update(terminal.live_table(states)),
            on_start=lambda run_id: _err.print(f"run {run_id}"),
        )
    _print_run(store, run_id, as_json)


def _print_run(store: Store, run_id: str, as_json: bool) -> None:
    """A finished run's table, notes and diagnosis (or its JSON); exits as its status says."""
    from probe.diagnose import diagnose_run
    from probe.summary import run_document

    document = run_document(store, run_id)
    diagnosis = diagnose_run(store, run_id).as_dict()
    store.close()
    if as_json:
        click.echo(json.dumps({**document, "diagnosis": diagnosis}, indent=2))
    else:
        _out.print(terminal.run_table(document))
        _print_lines(terminal.run_notes(document))
        _print_lines(terminal.diagnosis_lines(diagnosis["verdict"], diagnosis["recommendations"]))
    _exit_for(document["status"])


def _run_ranked(
    rank: Rank,
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    backend: Backend,
    batches: int | None,
    duration: float | None,
    label: str | None,
    gather: bool,
) -> None:
    """`probe run` as one rank of a torchrun launch."""
    from probe import distributed
    from probe.runner import new_run_id, run_probe

    if lanes.gpus not in (None, "none"):
        raise InputError(
            "under torchrun each rank drives cuda:LOCAL_RANK: leave --gpus out, or give "
            "--gpus none for the CPU"
        )
    if lanes.num_shards not in (None, rank.world_size):
        raise InputError(
            f"under torchrun rank i reads shard i of WORLD_SIZE ({rank.world_size}): leave "
            f"--num-shards out (got {lanes.num_shards})"
        )
    distributed.connect(rank)
    try:
        prepared, mine = None, None
        for turn in (0, 1):  # each node's local rank 0 first: it writes the sample data once
            if (rank.local_rank == 0) == (turn == 0):
                try:
                    prepared = _prepare(pipeline, lanes, db, backend, batches, duration, label,
                                        rank=rank)  # fmt: skip
                except InputError as error:
                    mine = str(error)
            distributed.barrier()
        errors = distributed.all_errors(mine)
        if prepared is None or any(errors):
            first = next(e for e in errors if e)
            raise InputError(first if rank.rank == 0 else f"rank {errors.index(first)}: {first}")
        config, store = prepared
        if rank.rank == 0:
            _announce(config, lanes, store)
        run_id = distributed.shared_run_id(rank, new_run_id)
        stop = threading.Event()
        with (
            _stopping_on_signals(stop),
            Live(console=_err, refresh_per_second=4, transient=True) as live,
        ):
            show = rank.rank == 0 and _err.is_terminal
            failures = distributed.run_ranked(
                rank,
                lambda local, run_id: run_probe(
                    config, local, stop=stop, run_id=run_id,
                    on_update=(lambda states: live.update(terminal.live_table(states)))
                    if show else None,
                ),
                store,
                run_id,
                gather=gather,
            )  # fmt: skip
    finally:
        distributed.disconnect()
    for failure in failures:
        _err.print(f"not recorded: {failure}", markup=False)
    if rank.rank == 0:
        _print_run(store, run_id, as_json)
    store.close()
    where = "rank 0's store" if gather else str(store.path)
    _err.print(f"rank {rank.rank}: lane {rank.rank} of run {run_id} recorded in {where}")


@cli.command()
@_pipeline_options
@_lane_options(consumer="none")
@_json_option
@_store_option
@_backend_option("torch sweeps num_workers; dali sweeps num_threads.")
@click.option(
    "--values",
    default=None,
    help="Settings to try, e.g. 2,4,8,16.  [default: powers of two up to the cores "
    "per GPU, and one step past]",
)
@click.option("--budget", default=120.0, show_default=True, type=float,
              help="Seconds for the whole sweep, start-ups included.")  # fmt: skip
def sweep(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    backend: str,
    values: str | None,
    budget: float,
) -> None:
    """Sweep DataLoader workers (or DALI threads): each setting a run; find the knee.

    The lanes start once and stay warm; each setting rebuilds only the pipeline and is measured
    until its images/s is known within --precision. The knee is the smallest setting not
    significantly below 95% of the best; settings past the best that are significantly below
    it are flagged oversubscribed. The sweep stops once throughput has clearly fallen past its
    peak, and drops the settings its budget cannot fit.
    """
    from probe.diagnose import ladder
    from probe.sweep import run_sweep

    knob = "num_workers" if backend == Backend.TORCH.value else "num_threads"
    config, store = _prepare(pipeline, lanes, db, Backend(backend), None, None, None,
                             budget=(budget, 2, "a sweep"))  # fmt: skip
    settings = _int_list(values, "--values") if values else ladder(_cores_per_lane(config))
    _err.print(
        f"sweep: {knob} over {', '.join(map(str, settings))}; consumer {config.consumer}; "
        f"each until images/s is known within {config.precision:.0%}; budget {budget:g} s; "
        f"store: {store.path}"
    )
    with _stopping_on_signals(stop := threading.Event()):
        document = run_sweep(config, knob, settings, budget, store, stop=stop, on_event=_narrate,
                             started=STARTED)  # fmt: skip
    store.close()
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        _out.print(terminal.sweep_table(document["points"], knob, document))
        if document["reason"]:
            _err.print(document["reason"])
    _exit_for(document["status"])


@cli.command()
@_pipeline_options
@_lane_options(consumer=DOCTOR_CONSUMER)
@_json_option
@_store_option
@click.option("--budget", default=None, type=float,
              help="Seconds for the whole diagnosis, start-ups included; it ends sooner when "
                   f"its search does.  [default: {DOCTOR_BUDGET_S['gpu']:g} on GPUs, "
                   f"{DOCTOR_BUDGET_S['cpu']:g} on the CPU]")  # fmt: skip
def doctor(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    budget: float | None,
) -> None:
    """The whole diagnosis: is the GPU starved, why, and what to change; verified by running it.

    On lanes kept warm (the consumer built, tuned and timed alone once), it measures your
    setting (--workers, default the cores per GPU), searches DataLoader workers from it, runs
    DALI (mixed on a GPU, cpu without), reads your setting epoch by epoch where the shard is
    short enough for epoch starts to matter, ranks the changes by measured throughput, and runs
    the first one again to check it. Every point is measured until its images/s is known within
    --precision. The default consumer is a 30 ms step per batch: what ResNet-50 takes at batch
    128 on one H200.
    """
    from probe.diagnose import ladder
    from probe.sweep import run_doctor

    if lanes.read != Read.STREAM.value:
        raise InputError(
            "--read: the doctor reads your setting both ways itself (as one stream, and epoch "
            "by epoch where the epochs are short enough to matter); leave --read out"
        )
    if budget is None:
        from probe.devices import cuda_devices, select_gpus

        on_gpu = select_gpus(lanes.gpus, cuda_devices()) is not None
        budget = DOCTOR_BUDGET_S["gpu" if on_gpu else "cpu"]
    config, store = _prepare(pipeline, lanes, db, Backend.TORCH, None, None, None,
                             budget=(budget, 1, "a diagnosis"))  # fmt: skip
    cores = _cores_per_lane(config)
    baseline = config.spec.dataloader.num_workers
    on_gpu = config.lanes[0].device is not None
    threads = pipeline.threads or (min(8, cores) if on_gpu else cores)
    settings = ladder(cores)
    if lanes.consumer == DOCTOR_CONSUMER:
        _err.print(
            f"consumer: {DOCTOR_CONSUMER}, a training step of 30 ms per batch (ResNet-50 takes "
            "about that at batch 128 on one H200); give --consumer for yours"
        )
    _err.print(
        f"doctor: yours (num_workers={baseline}) first, then DataLoader workers from it over "
        f"{', '.join(map(str, settings))}, DALI with {threads} threads, the epoch reading where "
        f"it matters, and a verification; each point until images/s is known within "
        f"{config.precision:.0%}; budget {budget:g} s; store: {store.path}"
    )
    with _stopping_on_signals(stop := threading.Event()):
        document = run_doctor(
            config, settings, baseline, threads, budget, store, stop=stop, on_event=_narrate,
            started=STARTED,
        )  # fmt: skip
    store.close()
    if as_json:
        click.echo(json.dumps(document, indent=2))
    elif document["verdict"] is None:
        _err.print(f"no answer: {document['reason']} (session {document['session_id']})")
    else:
        _out.print(terminal.sweep_table(document["sweep"], "num_workers", document))
        _print_lines(terminal.doctor_lines(document), console=_out)
        _err.print(f"session {document['session_id']}")
    _exit_for(document["status"])


@cli.command()
@_store_option
@_json_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
def runs(db: Path | None, as_json: bool, limit: int) -> None:
    """List the recorded runs, newest first."""
    from probe.samplers.host import pid_alive
    from probe.summary import run_document

    with Store(db) as store:
        store.mark_abandoned_runs(socket.gethostname(), pid_alive)
        documents = [run_document(store, r.run_id) for r in store.runs()[:limit]]
    if as_json:
        keys = ("run_id", "status", "reason", "pipeline", "consumer", "created", "label",
                "images_per_s")  # fmt: skip
        listing = [
            {**{k: d[k] for k in keys}, "lanes": len(d["lanes"]),
             "data_wait_frac": terminal.mean_wait(d)}
            for d in documents
        ]  # fmt: skip
        click.echo(json.dumps(listing, indent=2))
        return
    if not documents:
        _err.print("no runs yet: start one with `probe run`")
        return
    _out.print(terminal.runs_table(documents))


@cli.command()
@_store_option
@click.argument("run_id", metavar="RUN")
@_json_option
def show(db: Path | None, run_id: str, as_json: bool) -> None:
    """Show a run and its diagnosis (its id, a unique start of it, or `last`), or a sweep or
    doctor session (its id)."""
    from probe.diagnose import diagnose_run
    from probe.summary import run_document

    with Store(db) as store:
        if run_id.startswith(("sweep-", "doctor-")):
            _show_session(store.session(run_id).document, as_json)
            return
        document = run_document(store, store.run(run_id).run_id)
        diagnosis = diagnose_run(store, document["run_id"]).as_dict()
    if as_json:
        click.echo(json.dumps({**document, "diagnosis": diagnosis}, indent=2))
        return
    host = document["host"]
    reason = f": {document['reason']}" if document["reason"] else ""
    label = f", label {document['label']}" if document["label"] else ""
    gpus = ", ".join(f"{g['index']}: {g['name']}" for g in host.get("gpus", [])) or "none"
    _print_lines(
        [
            f"run {document['run_id']} ({document['status']}{reason}), created "
            f"{document['created']}{label}",
            f"pipeline {document['pipeline']}, consumer {document['consumer']}; data "
            f"{document['config']['spec']['data_dir']}",
            f"host {host.get('hostname')}: {host.get('cpus')} CPU cores "
            f"({host.get('cpu_model', '?')}), GPUs {gpus}; torch {host.get('torch', '?')}, "
            f"DALI {host.get('dali') or 'not installed'}",
        ]
    )
    _out.print(terminal.run_table(document))
    _print_lines(terminal.run_notes(document))
    _print_lines(terminal.diagnosis_lines(diagnosis["verdict"], diagnosis["recommendations"]))


@cli.command()
@_store_option
@click.argument("subject", metavar="RUN")
@click.option(
    "--format",
    "form",
    type=click.Choice(["html", "md", "json"]),
    default=None,
    help="html (self-contained, works offline), md (a summary for a PR comment) or "
    "json (everything).  [default: from -o's suffix, else md]",
)
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The file to write.  [default: standard output]")  # fmt: skip
def report(db: Path | None, subject: str, form: str | None, output: Path | None) -> None:
    """Write a report of a run (its id, a unique start of it, or `last`) or of a doctor or sweep
    session (its id): verdict, recommendations, lanes, timelines, host, and the configuration
    that reproduces it."""
    from probe.report import build_report, render

    suffixes = {".html": "html", ".htm": "html", ".md": "md", ".json": "json"}
    form = form or suffixes.get(output.suffix.lower() if output else "", "md")
    if output is not None and not output.parent.is_dir():
        raise InputError(f"cannot write {output}: no folder {output.parent}")
    with Store(db) as store:
        text = render(build_report(store, subject), form)
    if output is None:
        click.echo(text, nl=False)
        return
    partial = output.with_name(output.name + ".partial")
    try:
        partial.write_text(text, encoding="utf-8")
        partial.replace(output)  # never half a report under the name asked for
    except OSError as error:
        partial.unlink(missing_ok=True)
        raise InputError(f"cannot write {output}: {error.strerror or error}") from None
    click.echo(f"wrote {output} ({form}, {len(text.encode()) / 1e6:.1f} MB)", err=True)


@cli.command()
@_store_option
@click.argument("run_id", metavar="RUN")
@click.option(
    "--max-data-wait",
    metavar="F",
    help="Most data-wait a lane may have: a share (0.2) or a percentage (20%).",
)
@click.option(
    "--min-images-per-s", type=float, metavar="N", help="Fewest images/s a lane may deliver."
)
@click.option(
    "--max-batch-latency-p99-ms",
    type=float,
    metavar="M",
    help="Longest 99th-percentile batch latency (wait plus step) a lane may have.",
)
@_json_option
def check(db: Path | None, run_id: str, max_data_wait: str | None,
          min_images_per_s: float | None, max_batch_latency_p99_ms: float | None,
          as_json: bool) -> None:  # fmt: skip
    """Gate on a run (its id, a unique start of it, or `last`): exit 0 when every lane meets
    every threshold given, 1 when one misses (each miss printed) or the run did not complete."""
    from probe.gate import Thresholds, check_run, parse_share
    from probe.summary import run_document

    thresholds = Thresholds(
        None if max_data_wait is None else parse_share(max_data_wait),
        min_images_per_s,
        max_batch_latency_p99_ms,
    )
    thresholds.check()
    with Store(db) as store:
        result = check_run(run_document(store, store.run(run_id).run_id), thresholds)
    if as_json:
        click.echo(json.dumps(result, indent=2))
    elif result["passed"]:
        click.echo(f"run {result['run_id']}: every lane meets {thresholds.text()}", err=True)
    else:
        click.echo(f"run {result['run_id']} fails the check ({thresholds.text()}):", err=True)
        for miss in result["misses"]:
            click.echo(f"  {miss}", err=True)
    if not result["passed"]:
        sys.exit(EXIT_FAILED)


@cli.command()
@click.argument(
    "sources",
    metavar="DB...",
    nargs=-1,
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
)
@_store_option
def merge(sources: tuple[Path, ...], db: Path | None) -> None:
    """Add the runs of other stores to this one (--db).

    A run already here gets the lanes it lacks: the nodes of a torchrun probe with --no-gather,
    or of a watched DDP job, each wrote their lanes to a store of their own.
    """
    with Store(db) as store:
        for source in sources:
            if not source.is_file():
                raise InputError(f"no store at {source}")
            if source.resolve() == store.path.resolve():
                raise InputError(f"{source} is the store merged into (--db): give other stores")
            with Store(source) as other:
                for run in reversed(other.runs()):
                    added = store.import_run(other.export_run(run.run_id))
                    what = f"lanes {', '.join(map(str, added))}" if added else "nothing new"
                    _err.print(f"{source}: run {run.run_id}: {what}", markup=False)
                for session in other.sessions():
                    if session.session_id not in {s.session_id for s in store.sessions()}:
                        store.save_session(session)


def _show_session(document: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    if document["schema"].startswith("feedscope.doctor") and document["verdict"] is None:
        _print_lines([f"session {document['session_id']}: no answer: {document['reason']}"])
    elif document["schema"].startswith("feedscope.doctor"):
        _out.print(terminal.sweep_table(document["sweep"], "num_workers", document))
        _print_lines(terminal.doctor_lines(document), console=_out)
    else:
        knob = document.get("knob", "num_workers")
        _out.print(terminal.sweep_table(document["points"], knob, document))


def _prepare(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    db: Path | None,
    backend: Backend,
    batches: int | None,
    duration: float | None,
    label: str | None,
    rank: Rank | None = None,
    budget: tuple[float, int, str] | None = None,
) -> tuple[ProbeConfig, Store]:
    """Checks everything a probe needs, cheapest first (with `budget`, that the seconds given
    fit so many points of a session); opens the store; then resolves the data (generating the
    sample data on first use). Under torchrun, the rank's one lane."""
    from probe.devices import cuda_devices, select_gpus
    from probe.runner import ProbeConfig, check_config, plan_lanes, rank_plan

    consumer = parse_consumer(lanes.consumer)
    check_model(consumer)
    if rank is None:
        plans = plan_lanes(select_gpus(lanes.gpus, cuda_devices()), lanes.num_shards)
        lanes_here = len(plans)
    else:
        plans = (rank_plan(rank, cuda_devices() if lanes.gpus != "none" else []),)
        lanes_here = rank.local_world_size
    on_gpu = any(plan.device is not None for plan in plans)
    spec = pipeline.spec(None, max(1, available_cpus() // lanes_here), on_gpu=on_gpu)
    config = ProbeConfig(
        backend=backend,
        spec=spec,
        lanes=plans,
        consumer=consumer,
        read=Read(lanes.read),
        warmup=lanes.warmup_batches(),
        batches=batches,
        duration_s=duration,
        precision=lanes.precision_share(),
        sample_hz=lanes.sample_hz,
        label=label,
        torchrun=rank is not None,
    )
    check_backend(backend)
    if budget is not None:
        from probe.sweep import check_budget

        check_budget(budget[0], budget[1], config, budget[2])
    store = Store(db)
    config = replace(config, spec=replace(spec, data_dir=_resolve_data(pipeline.data_dir)))
    check_config(config)  # the dataset and its shards, before anything is announced
    return config, store


def _announce(config: ProbeConfig, lanes: LaneArgs, store: Store) -> None:
    from probe.devices import cuda_devices, describe

    devices = [p.device for p in config.lanes if p.device is not None]
    if config.torchrun:
        plan = config.lanes[0]
        where = (
            f"{plan.num_shards} torchrun ranks, rank i reading shard i of {plan.num_shards} on "
            + ("cuda:LOCAL_RANK" if devices else "the CPU")
        )
    elif not devices:
        visible = "" if cuda_devices() else " (no CUDA GPU visible)"
        where = f"the CPU, {len(config.lanes)} lane(s){visible}"
    else:
        where = (
            "GPU " + describe(devices) + ("" if lanes.gpus else " (all visible; pick with --gpus)")
        )
    options = describe_settings(config.lane_spec(config.lanes[0]), config.backend)
    _err.print(
        f"probe: {config.backend.value} ({options}, batch {config.spec.batch_size}) on {where}; "
        f"consumer {config.consumer}; reading the shard {_reading_text(config)}; "
        f"{_warmup_text(config)}, then {_stop_text(config)} per lane; samples at "
        f"{config.sample_hz:g} Hz"
    )
    _err.print(f"data: {config.spec.data_dir}; store: {store.path}")


def _reading_text(config: ProbeConfig) -> str:
    if config.read is Read.STREAM:
        return "as one stream"
    persistent = config.spec.dataloader.persistent_workers
    restart = "" if config.backend is Backend.DALI else (
        ", workers kept" if persistent else ", workers started anew each epoch"
    )  # fmt: skip
    return f"epoch by epoch{restart}"


def _warmup_text(config: ProbeConfig) -> str:
    if config.warmup is None:
        return "warm-up until the rate settles"
    return f"{config.warmup} warm-up batches"


def _stop_text(config: ProbeConfig) -> str:
    if config.until_precise:
        return f"until images/s is known within {config.precision:.0%} (at most {config.max_s:g} s)"
    return " or ".join(
        part
        for part in (
            f"{config.batches} batches" if config.batches else "",
            f"{config.duration_s:g} s" if config.duration_s else "",
        )
        if part
    )


def _narrate(kind: str, payload: dict[str, Any]) -> None:
    """One line per run of a sweep or doctor session."""
    if kind == "start":
        _err.print(f"measuring {payload['label']} (at most {payload['max_s']:.0f} s)")
    elif kind == "run":
        _err.print(f"  {terminal.run_line(payload)}", markup=False)


def _cores_per_lane(config: ProbeConfig) -> int:
    return max(1, available_cpus() // len(config.lanes))


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"{option} takes whole numbers like 2,4,8 (got {text!r})") from None
    if not values or min(values) < 0:
        raise InputError(f"{option} takes whole numbers >= 0 like 2,4,8 (got {text!r})")
    return values


def _exit_for(status: str) -> None:
    if status == RunStatus.INTERRUPTED.value:
        sys.exit(EXIT_INTERRUPTED)
    if status == RunStatus.FAILED.value:
        sys.exit(EXIT_FAILED)


def _print_lines(lines: Sequence[str], console: Console | None = None) -> None:
    for line in lines:
        (console or _err).print(line, markup=False)


def _resolve_data(data_dir: Path | None) -> Path:
    """The dataset folder: the one given, else the built-in sample data (made on first use)."""
    if data_dir is not None:
        return data_dir
    if default_dataset_ready():
        return ensure_default_dataset()
    _err.print(
        f"generating the built-in sample dataset ({DEFAULT_SAMPLE.count} images, once; "
        "it is kept in your cache folder)"
    )
    with _progress() as progress:
        task = progress.add_task("writing JPEGs", total=DEFAULT_SAMPLE.count)
        return ensure_default_dataset(progress=lambda n: progress.advance(task, n))


@contextmanager
def _stopping_on_signals(stop: threading.Event) -> Iterator[None]:
    """Ctrl-C and SIGTERM set `stop` (the run ends cleanly) instead of killing the process."""

    def handle(signum: int, _: Any) -> None:
        if not stop.is_set():
            _err.print(f"{signal.Signals(signum).name}: stopping, keeping what was recorded")
        stop.set()

    previous = {signum: signal.signal(signum, handle) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _bench_one(
    spec: PipelineSpec,
    backend: Backend,
    dataset: Any,
    warmup: int,
    duration: float,
    batches: int | None,
) -> BenchResult:
    label = f"{backend.value:<5} {describe_settings(spec, backend)}"
    unit = "batches" if batches else "s"
    with _progress(unit) as progress:
        task = progress.add_task(f"{label} (starting)", total=batches or duration)

        def advance(elapsed_s: float) -> None:
            done = progress.tasks[task].completed + 1 if batches else elapsed_s
            progress.update(task, completed=done, description=label)

        return bench_pipeline(
            spec,
            backend,
            warmup_batches=warmup,
            duration_s=duration,
            max_batches=batches,
            dataset=dataset,
            on_batch=advance,
        )


def _result_json(result: BenchResult) -> dict[str, Any]:
    fields_ = asdict(result)
    fields_["backend"] = result.backend.value
    fields_["images_per_s"] = result.images_per_s
    return fields_


def _pick_gpu(value: str | None) -> tuple[int | None, str]:
    """The device asked for ('none', or a CUDA index), else GPU 0 if CUDA has one, else the CPU.

    Returns:
        The device (None for the CPU) and a note on how it was chosen, for the screen.
    """
    if value is None:
        if cuda_device_count() == 0:
            return None, " (no CUDA GPU visible)"
        return 0, " (the first visible GPU; pick one with --gpu)"
    if value.strip().lower() in ("none", "cpu"):
        return None, ""
    try:
        return int(value), ""
    except ValueError:
        raise InputError(f"--gpu takes a CUDA device index or 'none' (got {value!r})") from None


def _progress(unit: str = "images") -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn(unit),
        TimeRemainingColumn(),
        console=_err,
        transient=True,
    )


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: runs the command and turns user errors into one line and exit code 2."""
    try:
        code = cli.main(args=argv, prog_name="probe", standalone_mode=False)
    except click.ClickException as error:  # usage errors, exit code 2
        click.echo(f"error: {error.format_message()}", err=True)
        sys.exit(error.exit_code)
    except InputError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(code if isinstance(code, int) else 0)
