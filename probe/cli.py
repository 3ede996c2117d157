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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

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
from probe.bench import BenchResult, bench_pipeline, describe_settings
from probe.consumers import check_model, parse_consumer
from probe.store import RunStatus, Store

BENCH_SCHEMA = "feedscope.bench/1"
RUNS_SCHEMA = "feedscope.runs/1"
EXIT_FAILED, EXIT_INTERRUPTED = 1, 130

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
    batch_size: int
    image_size: int
    workers: int | None
    threads: int | None
    decoder: str | None
    dtype: str
    skip_corrupt: bool

    def spec(self, device: int | None, cores: int) -> PipelineSpec:
        """The spec they describe (workers and threads default to `cores`), validated before
        any long work starts; the data folder is the sample data's until it is resolved."""
        return PipelineSpec(
            data_dir=self.data_dir if self.data_dir is not None else default_sample_dir(),
            batch_size=self.batch_size,
            image_size=self.image_size,
            device=device,
            skip_corrupt=self.skip_corrupt,
            dataloader=DataLoaderOptions(
                num_workers=cores if self.workers is None else self.workers,
                output_dtype=OutputDtype(self.dtype),
            ),
            dali=DaliOptions(
                num_threads=cores if self.threads is None else self.threads,
                decoder=None if self.decoder is None else Decoder(self.decoder),
            ),
        )


def _pipeline_options(function: F) -> F:
    """Adds the options that describe the input pipeline; the command gets them as `pipeline`."""
    options = [
        click.option(
            "--data", "data_dir", type=click.Path(path_type=Path), default=None,
            help="Class-per-folder dataset.  [default: the built-in sample data]",
        ),
        click.option("--batch-size", default=128, show_default=True, type=int),
        click.option("--image-size", default=224, show_default=True, type=int,
                     help="Output side in pixels (square)."),
        click.option("--workers", default=None, type=int,
                     help="DataLoader workers.  [default: the CPU cores per lane]"),
        click.option("--threads", default=None, type=int,
                     help="DALI CPU threads.  [default: the CPU cores per lane]"),
        click.option("--decoder", type=click.Choice(["mixed", "cpu"]), default=None,
                     help="DALI decoder.  [default: mixed on a GPU, cpu without]"),
        click.option("--dtype", type=click.Choice(["uint8", "float32"]), default="uint8",
                     show_default=True,
                     help="What DataLoader workers hand over (uint8: normalized on the device)."),
        click.option("--skip-corrupt", is_flag=True, help="Skip and count undecodable images."),
    ]  # fmt: skip
    names = [field.name for field in fields(PipelineArgs)]

    @functools.wraps(function)
    def command(**kwargs: Any) -> Any:
        pipeline = PipelineArgs(**{name: kwargs.pop(name) for name in names})
        return function(pipeline=pipeline, **kwargs)

    for option in reversed(options):
        command = option(command)
    return command  # type: ignore[return-value]


def _json_option(function: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print one JSON document on stdout."
    )(function)


def _store_option(function: F) -> F:
    return click.option(
        "--db", type=click.Path(path_type=Path), default=None,
        help="The store (an SQLite file).  [default: $FEEDSCOPE_DB, else your data folder]",
    )(function)  # fmt: skip


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
@click.option(
    "--batches",
    default=None,
    type=click.IntRange(min=1),
    help="Stop after this many measured batches, if sooner.",
)
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
    _out.print(_bench_table(results))
    for backend_name, reason in missing.items():
        _err.print(f"{backend_name}: not measured: {reason}")


@cli.command()
@_pipeline_options
@_json_option
@_store_option
@click.option(
    "--pipeline",
    "backend",
    type=click.Choice([b.value for b in Backend]),
    default="torch",
    show_default=True,
)
@click.option(
    "--gpus",
    default=None,
    help="CUDA indices (0,1), all, or none for the CPU.  [default: all visible GPUs, else the CPU]",
)
@click.option(
    "--num-shards",
    default=None,
    type=int,
    help="Shards the dataset is split into; lane i reads shard i.  [default: one per "
    "GPU; on the CPU, 1]",
)
@click.option(
    "--consumer",
    default="none",
    show_default=True,
    help="What eats the batches: none, sleep:MS, or model:NAME (e.g. model:resnet50).",
)
@click.option("--batches", default=None, type=int, help="Measured batches per lane.")
@click.option(
    "--warmup",
    default=5,
    show_default=True,
    type=int,
    help="Batches per lane before measuring (not counted).",
)
@click.option(
    "--duration",
    default=None,
    type=float,
    help="Measured seconds per lane.  [default: 10 unless --batches is given]",
)
@click.option(
    "--sample-hz",
    default=10.0,
    show_default=True,
    type=float,
    help="Hardware samples per second (0: none).",
)
@click.option("--label", default=None, help="A name for the run, shown in listings.")
def run(
    pipeline: PipelineArgs,
    as_json: bool,
    db: Path | None,
    backend: str,
    gpus: str | None,
    num_shards: int | None,
    consumer: str,
    batches: int | None,
    warmup: int,
    duration: float | None,
    sample_hz: float,
    label: str | None,
) -> None:
    """Run a pipeline on the chosen GPUs and shards, sample the hardware, and record it all.

    One process per GPU, lane i reading shard i of N, as DDP training does; with --gpus none,
    one CPU lane per shard. Ctrl-C stops the run and keeps what it recorded.
    """
    from probe.devices import cuda_devices, describe, select_gpus
    from probe.runner import ProbeConfig, check_config, plan_lanes, run_probe
    from probe.summary import run_document

    consumer_spec = parse_consumer(consumer)
    check_model(consumer_spec)
    devices = cuda_devices()
    chosen = select_gpus(gpus, devices)
    plans = plan_lanes(chosen, num_shards)
    per_lane = max(1, available_cpus() // len(plans))
    spec = pipeline.spec(None, per_lane)
    config = ProbeConfig(
        backend=Backend(backend),
        spec=spec,
        lanes=plans,
        consumer=consumer_spec,
        warmup=warmup,
        batches=batches,
        duration_s=duration if duration is not None or batches is not None else 10.0,
        sample_hz=sample_hz,
        label=label,
    )
    check_backend(config.backend)
    store = Store(db)
    config = replace(config, spec=replace(spec, data_dir=_resolve_data(pipeline.data_dir)))
    check_config(config)  # the dataset and its shards, before the run is announced
    if chosen is None:
        where = f"the CPU, {len(plans)} lane(s)" + ("" if devices else " (no CUDA GPU visible)")
    else:
        where = (
            "GPU " + describe(list(chosen)) + ("" if gpus else " (all visible; pick with --gpus)")
        )
    stop_rule = " or ".join(
        part
        for part in (
            f"{config.batches} batches" if config.batches else "",
            f"{config.duration_s:g} s" if config.duration_s else "",
        )
        if part
    )
    options = describe_settings(config.lane_spec(plans[0]), config.backend)
    options += f", batch {pipeline.batch_size}"
    _err.print(
        f"probe: {backend} ({options}) on {where}; consumer {consumer_spec}; "
        f"{warmup} warm-up batches, then {stop_rule} per lane; samples at {sample_hz:g} Hz"
    )
    _err.print(f"data: {config.spec.data_dir}; store: {store.path}")
    stop = threading.Event()
    with (
        _stopping_on_signals(stop),
        Live(console=_err, refresh_per_second=4, transient=True) as live,
    ):
        run_id = run_probe(
            config,
            store,
            stop=stop,
            on_update=lambda lanes: live.update(_live_table(lanes)),
            on_start=lambda run_id: _err.print(f"run {run_id}"),
        )
    document = run_document(store, run_id)
    store.close()
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        _out.print(_run_table(document))
        _print_run_notes(document)
    if document["status"] == RunStatus.INTERRUPTED.value:
        sys.exit(EXIT_INTERRUPTED)
    if document["status"] == RunStatus.FAILED.value:
        sys.exit(EXIT_FAILED)


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
            {**{k: d[k] for k in keys}, "lanes": len(d["lanes"]), "data_wait_frac": _mean_wait(d)}
            for d in documents
        ]
        click.echo(json.dumps(listing, indent=2))
        return
    if not documents:
        _err.print("no runs yet: start one with `probe run`")
        return
    table = Table(title=f"Runs ({len(documents)} newest)")
    for column in ("run", "created (UTC)", "status", "pipeline", "consumer", "lanes", "images/s",
                   "data-wait", "label"):  # fmt: skip
        table.add_column(column, justify="right" if column in ("images/s", "data-wait") else "left")
    for d in documents:
        wait = _mean_wait(d)
        table.add_row(
            d["run_id"], d["created"].replace("T", " ").rstrip("Z"), d["status"], d["pipeline"],
            d["consumer"], _lanes_text(d), f"{d['images_per_s']:,.0f}",
            "-" if wait is None else f"{wait:.0%}", d["label"] or "",
        )  # fmt: skip
    _out.print(table)


@cli.command()
@_store_option
@click.argument("run_id", metavar="RUN")
@_json_option
def show(db: Path | None, run_id: str, as_json: bool) -> None:
    """Show one run (its id, a unique start of it, or `last`)."""
    from probe.summary import run_document

    with Store(db) as store:
        document = run_document(store, store.run(run_id).run_id)
    if as_json:
        click.echo(json.dumps(document, indent=2))
        return
    host = document["host"]
    _err.print(
        f"run {document['run_id']} ({document['status']}"
        + (f": {document['reason']}" if document["reason"] else "")
        + f"), created {document['created']}"
        + (f", label {document['label']}" if document["label"] else "")
    )
    _err.print(
        f"pipeline {document['pipeline']}, consumer {document['consumer']}; "
        f"data {document['config']['spec']['data_dir']}"
    )
    gpus = ", ".join(f"{g['index']}: {g['name']}" for g in host["gpus"]) or "none"
    _err.print(
        f"host {host['hostname']}: {host['cpus']} CPU cores ({host.get('cpu_model')}), "
        f"GPUs {gpus}; torch {host['torch']}, DALI {host['dali'] or 'not installed'}"
    )
    _out.print(_run_table(document))
    _print_run_notes(document)


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


class _stopping_on_signals:
    """Ctrl-C and SIGTERM set `stop` (the run ends cleanly) instead of killing the process."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> None:
        def handle(signum: int, _: Any) -> None:
            if not self.stop.is_set():
                _err.print(f"{signal.Signals(signum).name}: stopping the run, keeping its data")
            self.stop.set()

        for signum in (signal.SIGINT, signal.SIGTERM):
            self.previous[signum] = signal.signal(signum, handle)

    def __exit__(self, *_: object) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def _live_table(lanes: Sequence[Any]) -> Table:
    import time

    now_ns = time.monotonic_ns()
    table = Table(title="live (last 3 s)", title_justify="left")
    for column in ("lane", "device", "shard", "state", "batches", "images/s", "data-wait"):
        table.add_column(
            column, justify="right" if column in ("batches", "images/s", "data-wait") else "left"
        )
    for lane in lanes:
        rate, wait = lane.images_per_s(now_ns), lane.data_wait_frac(now_ns)
        state = lane.state
        if state == "warming up":
            state = f"warming up ({lane.warmup_batches})"
        table.add_row(
            str(lane.lane), lane.device, lane.shard, state, str(lane.batches),
            "-" if rate is None else f"{rate:,.0f}", "-" if wait is None else f"{wait:.0%}",
        )  # fmt: skip
    return table


def _run_table(document: dict[str, Any]) -> Table:
    table = Table(
        title=f"run {document['run_id']}: {document['pipeline']}, consumer {document['consumer']}"
        f" ({document['status']})",
        caption=f"all lanes: {document['images_per_s']:,.0f} images/s; warm-up batches excluded",
    )
    for column in ("lane", "device", "shard", "status", "batches", "images/s", "data-wait",
                   "latency p50/p95/p99 ms", "GPU busy", "CPU %"):  # fmt: skip
        table.add_column(
            column, justify="left" if column in ("lane", "device", "status") else "right"
        )
    for lane in document["lanes"]:
        latency = lane["batch_latency_ms"]
        table.add_row(
            str(lane["lane"]),
            "cpu" if lane["gpu"] is None else f"cuda:{lane['gpu']}",
            f"{lane['shard_id']}/{lane['num_shards']}",
            lane["status"],
            str(lane["batches"]),
            f"{lane['images_per_s']:,.0f}",
            "-" if lane["data_wait_frac"] is None else f"{lane['data_wait_frac']:.1%}",
            "/".join(
                "-" if latency[k] is None else f"{latency[k]:.1f}" for k in ("p50", "p95", "p99")
            ),
            _gpu_busy_text(lane),
            "-" if lane["cpu_pct"] is None else f"{lane['cpu_pct']:.0f}",
        )
    return table


def _gpu_busy_text(lane: dict[str, Any]) -> str:
    """SM activity (GPM), and NVML's kernel-active beside it, each labelled."""
    if lane["sm_active_source"] == "gpm":
        kernel = lane["kernel_active_pct"]
        nvml = "" if kernel is None else f", kernel-active {kernel:.0f}% (NVML)"
        return f"SM active {lane['sm_active_pct']:.0f}% (GPM){nvml}"
    if lane["sm_active_source"] == "nvml":
        return f"kernel-active {lane['sm_active_pct']:.0f}% (NVML)"
    return "-"


def _print_run_notes(document: dict[str, Any]) -> None:
    for lane in document["lanes"]:
        if lane["reason"]:
            _err.print(f"lane {lane['lane']}: {lane['status']}: {lane['reason']}")
        if lane.get("skipped_files"):
            _err.print(f"lane {lane['lane']}: skipped {lane['skipped_files']} undecodable file(s)")
    note = document["config"].get("consumer_note")
    if note:
        _err.print(f"consumer: {note}")
    unavailable: dict[str, list[str]] = {}
    for item in document["unavailable_metrics"]:
        unavailable.setdefault(item["reason"], []).append(item["metric"])
    for reason, metrics in unavailable.items():
        _err.print(f"unavailable: {', '.join(sorted(set(metrics)))}: {reason}")
    if document["status"] == RunStatus.RUNNING.value:
        _err.print("the run is still going: figures so far")


def _mean_wait(document: dict[str, Any]) -> float | None:
    waits = [
        lane["data_wait_frac"] for lane in document["lanes"] if lane["data_wait_frac"] is not None
    ]
    return sum(waits) / len(waits) if waits else None


def _lanes_text(document: dict[str, Any]) -> str:
    gpus = [lane["gpu"] for lane in document["lanes"]]
    if all(g is None for g in gpus):
        return f"{len(gpus)} cpu"
    return "gpu " + ",".join(str(g) for g in gpus)


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


def _bench_table(results: Sequence[BenchResult]) -> Table:
    table = Table(title="Input pipelines alone (no consumer), warm-up excluded")
    for column in ("pipeline", "device", "settings", "batches", "images/s",
                   "batch p50 ms", "batch p95 ms", "start-up s"):  # fmt: skip
        left = column in ("pipeline", "device", "settings")
        table.add_column(column, justify="left" if left else "right")
    for r in results:
        table.add_row(
            r.backend.value, r.device, r.settings, str(r.batches), f"{r.images_per_s:,.0f}",
            f"{r.batch_interval_ms_p50:.1f}", f"{r.batch_interval_ms_p95:.1f}",
            f"{r.startup_s:.1f}",
        )  # fmt: skip
    if len(results) == 2 and results[0].images_per_s > 0:
        ratio = results[1].images_per_s / results[0].images_per_s
        table.caption = f"{results[1].backend.value} / {results[0].backend.value}: {ratio:.2f}x"
    return table


def _result_json(result: BenchResult) -> dict[str, Any]:
    fields = asdict(result)
    fields["backend"] = result.backend.value
    fields["images_per_s"] = result.images_per_s
    return fields


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
