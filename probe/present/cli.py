"""The `probe` command (also `python -m probe`): its command group, options and commands.

Exit codes: 0 ok, 1 the run failed (or the store stayed locked by another process), 2 bad usage
or bad input (one line, no traceback), 130 the run was interrupted (what it recorded is kept).
With `--json` a command prints one JSON document on stdout; human text goes to stderr, except a
command's final table, which goes to stdout.

The measuring options are built from `probe.present.options.FLAGS`; what each command does is
in `measuring` (bench, run, sweep, doctor) and `stored` (runs, show, report, check, merge).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from pipelines import Backend, InputError
from pipelines.sample_data import DEFAULT_SAMPLE, SampleParams, make_sample_dataset
from probe.measure.distributed import RanksLost
from probe.present import console, measuring, stored
from probe.present.options import Flag, LaneArgs, PipelineArgs, flags
from probe.store.connection import StoreBusy, StoreFailed

EXIT_USAGE = 2

F = TypeVar("F", bound=Callable[..., Any])


def _options(*options: Callable[[F], F]) -> Callable[[F], F]:
    def apply(function: F) -> F:
        for option in reversed(options):
            function = option(function)
        return function

    return apply


def _option(flag: Flag) -> Callable[[F], F]:
    """A row of the flag table as a click option."""
    settings: dict[str, Any] = {
        "default": flag.default,
        "show_default": flag.default not in (None, False),
        "help": flag.help,
    }
    declaration = flag.name
    if flag.type is bool and flag.default:
        declaration = f"{flag.name}/{flag.off}"
    elif flag.type is bool:
        settings["is_flag"] = True
    elif isinstance(flag.type, tuple):
        settings["type"] = click.Choice(flag.type)
    elif flag.type is Path:
        settings["type"] = click.Path(path_type=Path)
    else:
        settings["type"] = flag.type
    return click.option(declaration, flag.dest, **settings)


def _flag_options(command: str) -> Callable[[F], F]:
    """`command`'s own options from the flag table, each passed as an argument."""
    return _options(*(_option(flag) for flag in flags(command, "command")))


def _bundled(kind: type[PipelineArgs | LaneArgs], command: str) -> Callable[[F], F]:
    """`command`'s options of the table's group `pipeline` or `lanes`, passed as one `kind`
    object (argument `pipeline` or `lanes`)."""
    group = "pipeline" if kind is PipelineArgs else "lanes"

    def decorate(function: F) -> F:
        @functools.wraps(function)
        def command_(**kwargs: Any) -> Any:
            values = {flag.dest: kwargs.pop(flag.dest) for flag in flags(command, group)}
            return function(**{group: kind.of(values, command)}, **kwargs)

        options = _options(*(_option(flag) for flag in flags(command, group)))
        return options(cast(F, command_))

    return decorate


_json_option = click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON document on stdout."
)
_store_option = click.option(
    "--db", type=click.Path(path_type=Path), default=None,
    help="The store (an SQLite file).  [default: $FEEDSCOPE_DB, else your data folder]",
)  # fmt: skip


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
@click.option(
    "--width",
    metavar="A-B",
    default=None,
    help="Each image's width in pixels, drawn from A to B (or exactly A); with --height.  "
    "[default: the sample data's 300-640 px a side]",
)
@click.option("--height", metavar="A-B", default=None, help="Each image's height, as --width.")
def data_make(
    directory: Path, count: int, classes: int, seed: int, width: str | None, height: str | None
) -> None:
    """Write natural-looking JPEGs into DIRECTORY/class_XX/ (a new or empty folder).

    Give --width and --height to mimic your data set's resolution, e.g. a camera's
    --width 1600-2000 --height 1200-1500."""
    params = SampleParams(
        count=count,
        classes=classes,
        seed=seed,
        width=_pixel_range(width, "--width"),
        height=_pixel_range(height, "--height"),
    )
    with console.progress() as bar:
        task = bar.add_task("writing JPEGs", total=count)
        summary = make_sample_dataset(directory, params, progress=lambda n: bar.advance(task, n))
    console.err.print(
        f"wrote {summary.count} images in {summary.classes} classes to {summary.root} "
        f"(mean {summary.mean_kb:.0f} KB)"
    )


def _pixel_range(text: str | None, option: str) -> tuple[int, int] | None:
    """`1600-2000` -> (1600, 2000); `640` -> (640, 640).

    Raises:
        InputError: anything else.
    """
    if text is None:
        return None
    low, _, high = text.strip().partition("-")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise InputError(
            f"{option} takes pixels as A-B or A, like 1600-2000 (got {text!r})"
        ) from None


@cli.command()
@_bundled(PipelineArgs, "bench")
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
) -> int:
    """Measure the DataLoader and DALI pipelines alone on the same data: images/s.

    Both pipelines are built from one spec and get the same CPU budget (workers = threads),
    in this process, with no consumer and no store: a quick comparison.
    """
    return measuring.bench(pipeline, as_json, backends, gpu, warmup, duration, batches)


@cli.command()
@_bundled(PipelineArgs, "run")
@_bundled(LaneArgs, "run")
@_json_option
@_store_option
@_flag_options("run")
@click.option("--no-gather", is_flag=True,
              help="Under torchrun: each rank adds its lane to its own --db (a store per node, "
                   "joined later by probe merge) instead of sending it to rank 0.")  # fmt: skip
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve the lanes' figures on this port's /metrics for Prometheus (under "
    "torchrun, each rank on PORT + LOCAL_RANK); needs the prometheus extra.",
)
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
    metrics_port: int | None,
) -> int:
    """Run a pipeline on the chosen GPUs and shards, sample the hardware, and record it all.

    One process per GPU, lane i reading shard i of N, as DDP training does; with --gpus none,
    one CPU lane per shard. Ctrl-C stops the run and keeps what it recorded.

    Under torchrun, one lane per rank: it drives cuda:LOCAL_RANK (or the CPU with --gpus none)
    and reads shard RANK of WORLD_SIZE; rank 0 records the run with every rank's lane.
    """
    return measuring.run(pipeline, lanes, as_json, db, Backend(backend), batches, duration,
                         label, no_gather, metrics_port)  # fmt: skip


@cli.command()
@_bundled(PipelineArgs, "sweep")
@_bundled(LaneArgs, "sweep")
@_json_option
@_store_option
@_flag_options("sweep")
def sweep(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    backend: str,
    values: str | None,
    budget: float,
    knob: str | None,
) -> int:
    """Sweep DataLoader workers (or DALI threads, or DALI's hardware decoder's share): each
    setting a run; find the knee.

    The lanes start once and stay warm; each setting rebuilds only the pipeline and is measured
    until its images/s is known within --precision. The knee is the smallest setting not
    significantly below 95% of the best; settings past the best that are significantly below
    it are flagged oversubscribed. The sweep stops once throughput has clearly fallen past its
    peak, and drops the settings its budget cannot fit.
    """
    return measuring.sweep(pipeline, lanes, as_json, db, Backend(backend), values, budget, knob)


@cli.command()
@_bundled(PipelineArgs, "doctor")
@_bundled(LaneArgs, "doctor")
@_json_option
@_store_option
@_flag_options("doctor")
def doctor(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    budget: float | None,
    like: str | None,
    scaling: bool,
) -> int:
    """The whole diagnosis: is the GPU starved, why, and what to change; verified by running it.

    On lanes kept warm (the consumer built, tuned and timed alone once), it measures your
    setting (--workers, default the cores per GPU), searches DataLoader workers from it, runs
    DALI (mixed on a GPU, cpu without), reads your setting epoch by epoch where the shard is
    short enough for epoch starts to matter, ranks the changes by measured throughput, and runs
    the first one again to check it. Every point is measured until its images/s is known within
    --precision. The default consumer is a simulated 30 ms step per batch, whatever the batch
    size: at a GPU's batch of 128, about what ResNet-50 takes on one H200. On several GPUs it
    predicts how the job grows from 1 GPU to N on this host's cores (--scaling measures it).

    With --like RUN it measures on a watched job's own files, with its batch size, image size,
    workers and measured step: what your script would gain from each change.
    """
    given = _given_on_the_command_line()
    return measuring.doctor(pipeline, lanes, as_json, db, budget, scaling, like, given)


def _given_on_the_command_line() -> set[str]:
    """The options (by `dest`) the command line gave, not left to their defaults."""
    context = click.get_current_context()
    return {
        name
        for name in context.params
        if context.get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE
    }


@cli.command()
@_store_option
@_json_option
@click.option("--limit", default=50, show_default=True, type=click.IntRange(min=1))
def runs(db: Path | None, as_json: bool, limit: int) -> int:
    """List the recorded runs, newest first."""
    return stored.runs(db, as_json, limit)


@cli.command()
@_store_option
@click.argument("run_id", metavar="RUN")
@_json_option
@click.option("-v", "--verbose", is_flag=True, help="Also print failed lanes' whole tracebacks.")
def show(db: Path | None, run_id: str, as_json: bool, verbose: bool) -> int:
    """Show a run and its diagnosis (its id, a unique start of it, or `last`), or a sweep or
    doctor session (its id)."""
    return stored.show(db, run_id, as_json, verbose)


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
def report(db: Path | None, subject: str, form: str | None, output: Path | None) -> int:
    """Write a report of a run (its id, a unique start of it, or `last`) or of a doctor or sweep
    session (its id): verdict, recommendations, lanes, timelines, host, and the configuration
    that reproduces it."""
    return stored.report(db, subject, form, output)


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
          as_json: bool) -> int:  # fmt: skip
    """Gate on a run (its id, a unique start of it, or `last`): exit 0 when every lane meets
    every threshold given, 1 when one misses (each miss printed) or the run did not complete."""
    return stored.check(db, run_id, max_data_wait, min_images_per_s, max_batch_latency_p99_ms,
                        as_json)  # fmt: skip


@cli.command()
def grafana() -> None:
    """Print the Grafana dashboard (JSON) for the figures `--metrics-port` serves: data-wait per
    rank against DCGM's SM activity, images/s, epoch-start stalls, and the jobs starving now.

    probe grafana > feedscope.json, then in Grafana: Dashboards > New > Import."""
    from importlib.resources import files

    dashboard = files("probe.present").joinpath("assets/grafana-dashboard.json")
    click.echo(dashboard.read_text(encoding="utf-8"), nl=False)


@cli.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@_store_option
@click.option("--name", default=None,
              help="The runs' name.  [default: the script's file name]")  # fmt: skip
@click.option("--warmup", default="5", show_default=True,
              help="Each loader's first batches, left out of every figure; or 'auto'.")  # fmt: skip
@click.option("--sample-hz", default=10.0, show_default=True, type=click.FloatRange(min=0),
              help="GPU and host samples per second (0: none).")  # fmt: skip
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None,
              help="Serve the figures on this port's /metrics for Prometheus (under torchrun, "
                   "each rank on PORT + LOCAL_RANK); needs the prometheus extra.")  # fmt: skip
@click.option(
    "--tensorboard",
    type=click.Path(path_type=Path),
    default=None,
    help="Write the figures to this TensorBoard folder; needs the tensorboard extra.",
)
@click.option("--tensorboard-every", default=100, show_default=True, type=click.IntRange(min=1),
              help="A TensorBoard point every this many batches.")  # fmt: skip
@click.option("--loader", "module", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A module `probe migrate` wrote: its loader() in place of the "
              "training loader, with no edit to the script.")  # fmt: skip
@click.option("--workers", type=click.IntRange(min=0), default=None,
              help="The training loader's num_workers, in place of the script's.")  # fmt: skip
@click.option("--at", "site", default=None, metavar="FILE:LINE",
              help="The loader to swap: the one iterated at this line.  [default: the first "
              "loader iterated]")  # fmt: skip
@click.option("--batches", type=click.IntRange(min=1), default=None,
              help="With --loader or --workers: stop the job after this many batches beyond the "
              "warm-up, every rank at the same batch.")  # fmt: skip
@click.argument("command", nargs=-1, type=click.UNPROCESSED, required=True)
def watch(db: Path | None, name: str | None, warmup: str, sample_hz: float,
          metrics_port: int | None, tensorboard: Path | None, tensorboard_every: int,
          module: Path | None, workers: int | None, site: str | None, batches: int | None,
          command: tuple[str, ...]) -> int:  # fmt: skip
    """Run a training script unchanged and watch every DataLoader and DALI iterator it
    iterates, as `watch()` in its code would:

        probe watch -- python train.py ARGS

    Under torchrun: torchrun ... -m probe watch -- train.py ARGS. Each loader is a run named
    after the script. Exits with the script's exit code.

    With --loader MODULE the training loader's batches come from the module `probe migrate`
    wrote (its loader()), for as long as the job runs: the fix, tried with no edit."""
    from probe.measure.autowatch import Swap

    swap = None
    if module is not None or workers is not None:
        if module is not None and workers is not None:
            raise InputError("--loader and --workers: give one (a written module sets its own)")
        swap = Swap(module, workers, _site(site), batches)
    elif site is not None or batches is not None:
        raise InputError("--at and --batches go with --loader or --workers")
    from probe.present.watching import watch_script

    return watch_script(command, db, name, warmup, sample_hz, metrics_port,
                                  tensorboard, tensorboard_every, swap)  # fmt: skip


def _site(site: str | None) -> tuple[str, int] | None:
    """--at FILE:LINE as (file name, line)."""
    if site is None:
        return None
    name, _, line = site.rpartition(":")
    if not name or not line.isdigit():
        raise InputError(f"--at {site}: give the loop's FILE:LINE, e.g. train.py:214")
    return Path(name).name, int(line)


@cli.command(context_settings={"ignore_unknown_options": True})
@_store_option
@click.option("--batches", type=click.IntRange(min=10), default=200, show_default=True,
              help="Each trial's batches beyond its warm-up.")  # fmt: skip
@click.option("--trial-s", type=click.FloatRange(min=10), default=180.0, show_default=True,
              help="A trial still running after this many seconds is stopped, what it measured "
              "kept.")  # fmt: skip
@click.option("--trials", type=click.IntRange(min=1), default=6, show_default=True,
              help="The most trials: runs of the job.")  # fmt: skip
@click.option("--budget", type=click.FloatRange(min=10), default=None,
              help="The session's seconds: no trial starts that would pass them, and one under "
              "way at their end is stopped.  [default: bounded by --trials]")  # fmt: skip
@click.argument("words", nargs=-1, type=click.UNPROCESSED)
def tune(db: Path | None, batches: int, trial_s: float, trials: int, budget: float | None,
         words: tuple[str, ...]) -> int:  # fmt: skip
    """Measure each candidate loader on the watched job itself, before a line changes:

        probe tune RUN
        probe tune -- python train.py ARGS    (watches the job first)

    Runs the job's command again once per candidate (its own loader at other num_workers,
    feedscope's DataLoader recipe, DALI), each in place of its training loader, and answers with
    the one the job measured best and the command that writes it."""
    from probe.present.tuning import tune as run_tune

    run_id = words[0] if len(words) == 1 and not _script_like(words[0]) else None
    command = () if run_id else words
    return run_tune(db, run_id, command, batches, trial_s, trials, budget)


def _script_like(word: str) -> bool:
    return word.endswith(".py") or Path(word).name.startswith("python") or word == "-m"


@cli.command()
@_store_option
@click.argument("run_id", metavar="RUN")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="The module to write.  [default: dali_ or torch_ and the loader's name, .py]",
)
@click.option(
    "--to",
    type=click.Choice(["dali", "dataloader"]),
    default="dali",
    show_default=True,
    help="DALI, or feedscope's DataLoader recipe (for jobs that stay on PyTorch).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    help="--to dataloader: its num_workers.  [default: the best measured for this job]",
)
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=None,
    help="DALI's CPU threads.  [default: the setting measured best for this job]",
)
@click.option(
    "--hw-decoder-load",
    type=click.FloatRange(0, 1),
    default=None,
    help="The share of JPEGs to the hardware decoder.  [default: as --threads]",
)
@click.option("--force", is_flag=True, help="Write over a file that is there.")
def migrate(
    db: Path | None,
    run_id: str,
    output: Path | None,
    threads: int | None,
    hw_decoder_load: float | None,
    force: bool,
    to: str,
    workers: int | None,
) -> int:
    """Write a loader for a watched DataLoader (RUN: its id, a unique start of it, or `last`):
    a module your script imports in place of its loader. DALI's, with the setting measured best
    for the job (`probe doctor --like RUN`); or, --to dataloader, feedscope's DataLoader recipe
    (JPEGs decoded at a reduced scale, uint8 normalized after the copy, workers kept), with the
    workers measured best. What it cannot write is named, and nothing is written."""
    from probe.present.migrating import migrate as write

    return write(db, run_id, output, threads, hw_decoder_load, force, to, workers)  # fmt: skip


@cli.command()
@click.argument(
    "sources",
    metavar="DB...",
    nargs=-1,
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
)
@_store_option
def merge(sources: tuple[Path, ...], db: Path | None) -> int:
    """Add the runs of other stores to this one (--db).

    A run already here gets the lanes it lacks: the nodes of a torchrun probe with --no-gather,
    or of a watched DDP job, each wrote their lanes to a store of their own.
    """
    return stored.merge(sources, db)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the command (`argv`, else the process's arguments) and returns its exit code; user
    errors become one line on stderr and exit code 2."""
    try:
        code = cli.main(args=argv, prog_name="probe", standalone_mode=False)
    except click.ClickException as error:  # usage errors, exit code 2
        click.echo(f"error: {error.format_message()}", err=True)
        return error.exit_code
    except InputError as error:
        click.echo(f"error: {error}", err=True)
        return EXIT_USAGE
    except (StoreBusy, StoreFailed, RanksLost) as error:  # the machine failed, not the input
        click.echo(f"error: {error}", err=True)
        return measuring.EXIT_FAILED
    except sqlite3.DatabaseError as error:  # met in the store's rows, where no statement named it
        click.echo(f"error: the store failed: {error}", err=True)
        return measuring.EXIT_FAILED
    except (click.Abort, KeyboardInterrupt):
        click.echo("interrupted", err=True)
        return measuring.EXIT_INTERRUPTED
    return code if isinstance(code, int) else 0
