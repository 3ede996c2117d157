"""The `probe` command (also `python -m probe`).

Exit codes: 0 ok, 1 the measured thing failed, 2 bad usage or bad input (one line, no
traceback). With `--json` a command prints one JSON document on stdout; human text goes to
stderr, except a command's final table, which goes to stdout.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
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

BENCH_SCHEMA = "feedscope.bench/1"


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
@click.option(
    "--data",
    "data_dir",
    type=click.Path(path_type=Path),
    default=None,
    help="Class-per-folder dataset.  [default: the built-in sample data]",
)
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
@click.option("--batch-size", default=64, show_default=True, type=int)
@click.option("--workers", default=None, type=int, help="DataLoader workers.  [default: CPU cores]")
@click.option("--threads", default=None, type=int, help="DALI CPU threads.  [default: CPU cores]")
@click.option(
    "--decoder",
    type=click.Choice(["mixed", "cpu"]),
    default=None,
    help="DALI decoder.  [default: mixed on a GPU, cpu without]",
)
@click.option(
    "--dtype",
    type=click.Choice(["uint8", "float32"]),
    default="uint8",
    show_default=True,
    help="What DataLoader workers hand over (uint8: normalized on the device).",
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
@click.option("--skip-corrupt", is_flag=True, help="Skip and count undecodable images.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document on stdout.")
def bench(
    data_dir: Path | None,
    backends: Sequence[str],
    gpu: str | None,
    batch_size: int,
    workers: int | None,
    threads: int | None,
    decoder: str | None,
    dtype: str,
    warmup: int,
    duration: float,
    batches: int | None,
    skip_corrupt: bool,
    as_json: bool,
) -> None:
    """Measure the DataLoader and DALI pipelines alone on the same data: images/s.

    Both pipelines are built from one spec and get the same CPU budget (workers = threads).
    """
    device, device_note = _pick_gpu(gpu)
    cpus = available_cpus()
    spec = PipelineSpec(  # validates the settings before any long work starts
        data_dir=data_dir if data_dir is not None else default_sample_dir(),
        batch_size=batch_size,
        device=device,
        skip_corrupt=skip_corrupt,
        dataloader=DataLoaderOptions(
            num_workers=cpus if workers is None else workers, output_dtype=OutputDtype(dtype)
        ),
        dali=DaliOptions(
            num_threads=cpus if threads is None else threads,
            decoder=None if decoder is None else Decoder(decoder),
        ),
    )
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
    root = data_dir if data_dir is not None else _sample_data()
    dataset = discover(root)
    where = "CPU" if device is None else f"GPU {device}"
    _err.print(
        f"data: {root} ({len(dataset)} images, {len(dataset.classes)} classes); "
        f"device: {where}{device_note}; batch size {batch_size}; {cpus} CPU cores available"
    )
    results = [_bench_one(spec, b, dataset, warmup, duration, batches) for b in chosen]
    if as_json:
        document = {
            "schema": BENCH_SCHEMA,
            "data_dir": str(root),
            "images_in_dataset": len(dataset),
            "device": None if device is None else f"cuda:{device}",
            "batch_size": batch_size,
            "cpus": cpus,
            "results": [_result_json(r) for r in results],
            "unavailable": missing,
        }
        click.echo(json.dumps(document, indent=2))
        return
    _out.print(_bench_table(results))
    for backend_name, reason in missing.items():
        _err.print(f"{backend_name}: not measured: {reason}")


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
    for column in (
        "pipeline",
        "device",
        "settings",
        "batches",
        "images/s",
        "batch p50 ms",
        "batch p95 ms",
        "start-up s",
    ):
        table.add_column(
            column, justify="left" if column in ("pipeline", "device", "settings") else "right"
        )
    for r in results:
        table.add_row(
            r.backend.value,
            r.device,
            r.settings,
            str(r.batches),
            f"{r.images_per_s:,.0f}",
            f"{r.batch_interval_ms_p50:.1f}",
            f"{r.batch_interval_ms_p95:.1f}",
            f"{r.startup_s:.1f}",
        )
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


def _sample_data() -> Path:
    if default_dataset_ready():
        return ensure_default_dataset()
    _err.print(
        f"generating the built-in sample dataset ({DEFAULT_SAMPLE.count} images, once; "
        "it is kept in your cache folder)"
    )
    with _progress() as progress:
        task = progress.add_task("writing JPEGs", total=DEFAULT_SAMPLE.count)
        return ensure_default_dataset(progress=lambda n: progress.advance(task, n))


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
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)
