"""The measuring flags, written once: the table the `probe` command's options are built from,
the probe configuration they describe, and the flags written back out (the dashboard's Launch
form, and the command that reproduces a stored run).

`FLAGS` names each flag, the field of a run's stored configuration it sets, its type, default
and help. The CLI turns its rows into click options; `probe_config` (and `config_of`, from
values keyed by the rows' `dest`) builds the `ProbeConfig` they describe, with every check the
command makes before it starts; `argv` writes values back as flags, in the table's order.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines import (
    Backend,
    DaliOptions,
    DataLoaderOptions,
    Decoder,
    InputError,
    OutputDtype,
    PipelineSpec,
    available_cpus,
    check_backend,
    parse_cpu_set,
)
from pipelines.sample_data import default_sample_dir
from probe.judge.thresholds import SAME_PACE
from probe.lane_figures import LaneFigures
from probe.steady import MAX_MEASURE_S, PRECISION, STALL_FLOOR_S, STALL_TIMES
from probe.store.documents import RunDocument

if TYPE_CHECKING:
    from probe.judge.evidence import UnwaitedStep
    from probe.measure.config import ProbeConfig  # imported where used: it brings torch
    from probe.measure.distributed import Rank

GPU_BATCH_SIZE, CPU_BATCH_SIZE = 128, 32
DOCTOR_CONSUMER = "sleep:30"  # what ResNet-50 takes per batch of 128 on one H200: 30 ms
# The doctor's default budget, on GPUs as on the CPU: room for a close call's first pairs in
# alternation, which stop where those the budget left fits could not decide it (on one H200 with
# 16 cores, the default doctor spent about 90 s of 176.5 s on 5 pairs that ended "either: +1% ±
# 10%", a call no session decides). A model built before the first point (about 35 s for
# ResNet-50 on an H100) or a pipeline starved on large images leaves fewer, shorter points:
# give --budget.
DOCTOR_BUDGET_S = 120.0
# --scaling adds a point per pipeline for 1 GPU and each power of two below N: each about this
SCALING_POINT_S = {"gpu": 25.0, "cpu": 15.0}
SWEEP_BUDGET_S = 120.0
SESSIONS = {"sweep": (2, "a sweep"), "doctor": (1, "a diagnosis")}  # points a budget must fit
MEASURING = ("run", "sweep", "doctor")
BACKENDS = tuple(b.value for b in Backend)
READS = ("stream", "epochs")  # probe.measure.lane.Read, which brings torch


def doctor_consumer_note(batch_size: int) -> str:
    """What the doctor's default consumer is, at a run's batch size: a simulated step, the same
    30 ms whatever the batch; ResNet-50's on one H200 only at the batch that was timed (128)."""
    step_ms = DOCTOR_CONSUMER.split(":")[1]
    step = f"a simulated training step of {step_ms} ms per batch of {batch_size}"
    if batch_size == GPU_BATCH_SIZE:
        return f"{step}, about what ResNet-50 takes on one H200"
    return f"{step}, a fixed wait that stands for your model's step"


@dataclass(frozen=True)
class Flag:
    """A measuring flag: its spelling, the stored configuration's field it sets, its type and
    default, and which commands take it (a flag whose default or help differs by command has a
    row per command)."""

    name: str  # "--batch-size"; a bool with default True also takes "--no-NAME"
    dest: str  # the command's argument, and the key of `argv`'s values
    field: str | None  # path in a run's stored `config` ("spec.batch_size"); None: not stored
    type: type | tuple[str, ...]  # int, float, str, Path, bool (a switch), or the choices
    default: Any  # None: decided when the lanes are known (the help says how)
    help: str | None
    _: KW_ONLY
    group: str  # "pipeline" (PipelineArgs), "lanes" (LaneArgs), or "command" (an argument)
    commands: tuple[str, ...] = MEASURING
    backend: Backend | None = None  # the pipeline it is for (None: both)
    from_stored: Callable[[Any], Any] | None = None  # the stored value as the flag's value

    @property
    def off(self) -> str:
        """A switch's other spelling: `--no-persistent-workers`."""
        return f"--no-{self.name[2:]}"

    @property
    def label(self) -> str:
        """The flag as a form field's label: "batch size"."""
        return self.name[2:].replace("-", " ")

    @property
    def default_note(self) -> str | None:
        """How the help says a default of None is decided ("128 on a GPU, 32 on the CPU");
        None where it says nothing."""
        found = re.search(r"\[default: (.*)\]", self.help or "")
        return found.group(1) if found else None


def _gpus_text(gpus: Sequence[int | None]) -> str:
    return "none" if None in gpus else ",".join(map(str, gpus))


def _percent(share: float | None) -> str | None:
    return None if share is None else f"{decimal(share * 100)}%"


_LOADER, _DALI = "spec.dataloader.", "spec.dali."
_BENCH_TOO = ("bench", *MEASURING)
_CONSUMER_HELP = (
    "What eats the batches: none, sleep:MS (a step of MS ms), or model:NAME (a training step, "
    "e.g. model:resnet50)."
)

FLAGS: tuple[Flag, ...] = (
    Flag("--pipeline", "backend", "pipeline", BACKENDS, Backend.TORCH.value, None,
         group="command", commands=("run",)),
    Flag("--pipeline", "backend", "pipeline", BACKENDS, Backend.TORCH.value,
         "torch sweeps num_workers; dali sweeps num_threads.",
         group="command", commands=("sweep",)),
    Flag("--data", "data_dir", "spec.data_dir", Path, None,
         "Class-per-folder dataset.  [default: the built-in sample data]",
         group="pipeline", commands=_BENCH_TOO),
    Flag("--gpus", "gpus", "lanes.*.gpu", str, None,
         "CUDA indices (0,1), all, or none for the CPU.  [default: all visible GPUs, else the "
         "CPU]",
         group="lanes", from_stored=_gpus_text),
    Flag("--num-shards", "num_shards", "lanes.0.num_shards", int, None,
         "Shards the dataset is split into; lane i reads shard i.  [default: one per GPU; on "
         "the CPU, 1]",
         group="lanes"),
    Flag("--cores", "cores", "cores", str, None,
         "CPU cores to measure on, as taskset lists them (0-15,32-47).  [default: the cores "
         "this process may use]",
         group="lanes"),
    Flag("--batch-size", "batch_size", "spec.batch_size", int, None,
         f"Images per batch.  [default: {GPU_BATCH_SIZE} on a GPU, {CPU_BATCH_SIZE} on the "
         "CPU]",
         group="pipeline", commands=_BENCH_TOO),
    Flag("--image-size", "image_size", "spec.image_size", int, 224,
         "Output side in pixels (square).",
         group="pipeline", commands=_BENCH_TOO),
    Flag("--workers", "workers", _LOADER + "num_workers", int, None,
         "DataLoader workers.  [default: the CPU cores per lane]",
         group="pipeline", commands=_BENCH_TOO, backend=Backend.TORCH),
    Flag("--threads", "threads", _DALI + "num_threads", int, None,
         "DALI CPU threads.  [default: the CPU cores per lane]",
         group="pipeline", commands=_BENCH_TOO, backend=Backend.DALI),
    Flag("--decoder", "decoder", _DALI + "decoder", tuple(d.value for d in Decoder), None,
         "DALI decoder.  [default: mixed on a GPU, cpu without]",
         group="pipeline", commands=_BENCH_TOO, backend=Backend.DALI),
    Flag("--hw-decoder-load", "hw_decoder_load", _DALI + "hw_decoder_load", float, None,
         "The share of JPEGs DALI's mixed decoder sends to the GPU's hardware JPEG decoder "
         "(0 to 1; the rest go to nvJPEG's CPU + CUDA path).  [default: 0.65, DALI's own]",
         group="pipeline", commands=_BENCH_TOO, backend=Backend.DALI),
    Flag("--dtype", "dtype", _LOADER + "output_dtype", ("uint8", "float32"), None,
         "What DataLoader workers hand over (uint8: normalized on the device).  [default: "
         "uint8 to a GPU, float32 on the CPU]",
         group="pipeline", commands=_BENCH_TOO, backend=Backend.TORCH),
    Flag("--persistent-workers", "persistent_workers", _LOADER + "persistent_workers", bool,
         True, "DataLoader workers kept from one epoch to the next (--read epochs).",
         group="pipeline", commands=_BENCH_TOO, backend=Backend.TORCH),
    Flag("--start-method", "start_method", _LOADER + "start_method",
         ("fork", "spawn", "forkserver"), None,
         "How DataLoader workers start.  [default: as a fresh Python process starts them]",
         group="pipeline", commands=_BENCH_TOO, backend=Backend.TORCH),
    Flag("--skip-corrupt", "skip_corrupt", "spec.skip_corrupt", bool, False,
         "Skip and count undecodable images.",
         group="pipeline", commands=_BENCH_TOO),
    Flag("--consumer", "consumer", "consumer", str, "none", _CONSUMER_HELP,
         group="lanes", commands=("run", "sweep")),
    Flag("--consumer", "consumer", "consumer", str, DOCTOR_CONSUMER, _CONSUMER_HELP,
         group="lanes", commands=("doctor",)),
    Flag("--read", "read", "read", READS, "stream",
         "stream: the shard as one endless stream (steady state); epochs: epoch by epoch, the "
         "loader restarted at each, as a for loop per epoch does.",
         group="lanes", from_stored=lambda read: read or "epochs"),  # runs before --read: epochs
    Flag("--warmup", "warmup", "warmup", str, "auto",
         "Batches per lane before measuring (not counted), or auto: until the rate settles.",
         group="lanes"),
    Flag("--batches", "batches", "batches", int, None,
         "Measured batches per lane.  [default: until --precision]",
         group="command", commands=("run",)),
    Flag("--duration", "duration", "duration_s", float, None,
         f"Measured seconds per lane.  [default: until --precision, at most "
         f"{MAX_MEASURE_S:g} s]",
         group="command", commands=("run",)),
    Flag("--precision", "precision", "precision", str, f"{PRECISION:.0%}",
         "Measure until images/s is known within this (95%), unless --batches or --duration "
         "fix the length.",
         group="lanes", from_stored=_percent),
    Flag("--sample-hz", "sample_hz", "sample_hz", float, 10.0,
         "Hardware samples per second (0: none).",
         group="lanes"),
    Flag("--stall-s", "stall_s", "stall_s", str, "auto",
         "Seconds a lane may go without a batch before it is stopped and failed as stalled, "
         f"or auto: {STALL_TIMES} times its slowest wait between batches so far, at least "
         f"{STALL_FLOOR_S:g} s.",
         group="lanes", from_stored=lambda stall: "auto" if stall is None else decimal(stall)),
    Flag("--label", "label", None, str, None, "A name for the run, shown in listings.",
         group="command", commands=("run",)),
    Flag("--knob", "knob", None, ("num_threads", "hw_decoder_load"), None,
         "DALI's knob to sweep: num_threads, or hw_decoder_load (mixed: the share of JPEGs to "
         "the hardware decoder, shown in whole percent; --values as shares, 0.65,0.9,1).  "
         "[default: num_threads]",
         group="command", commands=("sweep",), backend=Backend.DALI),
    Flag("--values", "values", None, str, None,
         "Settings to try, e.g. 2,4,8,16.  [default: powers of two up to the cores per GPU, "
         "and one step past]",
         group="command", commands=("sweep",)),
    Flag("--budget", "budget", None, float, SWEEP_BUDGET_S,
         "Seconds for the whole sweep, start-ups included.",
         group="command", commands=("sweep",)),
    Flag("--budget", "budget", None, float, None,
         "Seconds for the whole diagnosis, start-ups included; it ends sooner when its search "
         f"does.  [default: {DOCTOR_BUDGET_S:g}]",
         group="command", commands=("doctor",)),
    Flag("--like", "like", None, str, None,
         "Measure like a run (its id, or last): a watched job's files, batch size, image "
         "size, workers or threads, and its median step as the consumer (sleep:MS); the "
         "flags given override it.",
         group="command", commands=("doctor",)),
    Flag("--scaling", "scaling", None, bool, False,
         "On several GPUs: measure the job on 1 GPU and each power of two below too (the "
         "DataLoader and DALI), checking how it scales on this host's cores; the default "
         f"budget grows by about {SCALING_POINT_S['gpu']:g} s a point.",
         group="command", commands=("doctor",)),
)  # fmt: skip


def flags(command: str, group: str | None = None) -> list[Flag]:
    """The rows `command` takes (of one `group`), in the table's order."""
    return [f for f in FLAGS if command in f.commands and group in (None, f.group)]


def defaults(command: str) -> dict[str, Any]:
    """Each flag's default for `command`, by `dest`."""
    return {flag.dest: flag.default for flag in flags(command)}


def form_flags(command: str, backend: str | None = None) -> list[Flag]:
    """The rows a form for `command` asks for besides the devices (`--gpus`) and the pipeline
    (`--pipeline`): those of `backend`'s pipeline, or of both where it is None (the doctor
    measures both)."""
    return [
        flag
        for flag in flags(command)
        if flag.dest not in ("gpus", "backend")
        and (backend is None or flag.backend in (None, Backend(backend)))
    ]


def _given(kind: type, values: Mapping[str, Any], command: str) -> dict[str, Any]:
    given = {**defaults(command), **values}
    return {field.name: given[field.name] for field in fields(kind)}


@dataclass(frozen=True)
class PipelineArgs:
    """The pipeline flags of a measuring command, as given."""

    data_dir: Path | None
    batch_size: int | None
    image_size: int
    workers: int | None
    threads: int | None
    decoder: str | None
    hw_decoder_load: float | None
    dtype: str | None
    persistent_workers: bool
    start_method: str | None
    skip_corrupt: bool

    @classmethod
    def of(cls, values: Mapping[str, Any], command: str = "run") -> PipelineArgs:
        """From values by `dest` (`command`'s defaults for those missing)."""
        given = _given(cls, values, command)
        if given["data_dir"] is not None:
            given["data_dir"] = Path(given["data_dir"])
        return cls(**given)

    def spec(self, device: int | None, cores: int) -> PipelineSpec:
        """The spec they describe (workers and threads default to `cores`, the batch size to
        one for a GPU or for the CPU), validated before any long work starts; the data folder
        is the sample data's until it is resolved."""
        return PipelineSpec(
            data_dir=self.data_dir if self.data_dir is not None else default_sample_dir(),
            batch_size=(GPU_BATCH_SIZE if device is not None else CPU_BATCH_SIZE)
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
                hw_decoder_load=DaliOptions.hw_decoder_load
                if self.hw_decoder_load is None
                else self.hw_decoder_load,
            ),
        )


@dataclass(frozen=True)
class LaneArgs:
    """Where and how a probe runs: GPUs, shards, consumer, reading, warm-up, precision,
    sampling."""

    gpus: str | None
    num_shards: int | None
    cores: str | None
    consumer: str
    read: str
    warmup: str
    precision: str
    sample_hz: float
    stall_s: str

    @classmethod
    def of(cls, values: Mapping[str, Any], command: str = "run") -> LaneArgs:
        """From values by `dest` (`command`'s defaults for those missing)."""
        return cls(**_given(cls, values, command))

    def warmup_batches(self) -> int | None:
        """`--warmup`: None for auto (until the rate settles), else a number of batches."""
        if str(self.warmup).strip().lower() == "auto":
            return None
        try:
            return int(self.warmup)
        except ValueError:
            raise InputError(
                f"--warmup takes auto or a number of batches (got {self.warmup!r})"
            ) from None

    def stall_bound(self) -> float | None:
        """`--stall-s`: None for auto (from the lane's rate), else seconds."""
        if self.stall_s is None or str(self.stall_s).strip().lower() == "auto":
            return None
        try:
            return float(self.stall_s)
        except ValueError:
            raise InputError(
                f"--stall-s takes auto or a number of seconds (got {self.stall_s!r})"
            ) from None

    def precision_share(self) -> float:
        from probe.present.gate import parse_share

        return parse_share(str(self.precision), "--precision")


def probe_config(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    backend: Backend | str = Backend.TORCH,
    batches: int | None = None,
    duration: float | None = None,
    label: str | None = None,
    rank: Rank | None = None,
) -> ProbeConfig:
    """The probe configuration the flags describe, checked cheapest first (the consumer, the
    lanes, the spec, the lengths, the backend); its data folder is the one given, else the
    sample data's (not made yet). Under torchrun (`rank`), the rank's one lane.

    Raises:
        InputError: a flag, or a combination of them, that cannot work here.
    """
    from probe.measure.config import ProbeConfig, plan_lanes, rank_plan
    from probe.measure.consumers import check_model, parse_consumer
    from probe.measure.devices import cuda_devices, select_gpus
    from probe.measure.lane import Read

    consumer = parse_consumer(lanes.consumer)
    check_model(consumer)
    if lanes.cores is not None:
        parse_cpu_set(lanes.cores)  # kept to them where it measures (`keep_to_cores`)
    if rank is None:
        plans = plan_lanes(select_gpus(lanes.gpus, cuda_devices()), lanes.num_shards)
        lanes_here = len(plans)
    else:
        plans = (rank_plan(rank, cuda_devices() if lanes.gpus != "none" else []),)
        lanes_here = rank.local_world_size
    # the lanes' spec is checked as the first lane's: each lane then sets its own device
    first = plans[0].device
    spec = pipeline.spec(
        None if first is None else first.index, max(1, available_cpus() // lanes_here)
    )
    config = ProbeConfig(
        backend=Backend(backend),
        spec=spec,
        lanes=plans,
        consumer=consumer,
        read=Read(lanes.read),
        warmup=lanes.warmup_batches(),
        batches=batches,
        duration_s=duration,
        precision=lanes.precision_share(),
        sample_hz=lanes.sample_hz,
        stall_s=lanes.stall_bound(),
        cores=lanes.cores,
        label=label,
        torchrun=rank is not None,
    )
    check_backend(config.backend)
    return config


def config_of(command: str, values: Mapping[str, Any]) -> ProbeConfig:
    """`probe_config` of values by `dest` (the command's defaults for those missing), as
    `command` reads them (the doctor measures the DataLoader first)."""
    given = {**defaults(command), **values}
    return probe_config(
        PipelineArgs.of(given, command),
        LaneArgs.of(given, command),
        Backend.TORCH if command == "doctor" else given.get("backend", Backend.TORCH.value),
        given.get("batches"),
        given.get("duration"),
        given.get("label"),
    )


def check_budget(command: str, budget_s: float, config: ProbeConfig) -> None:
    """Raises InputError if a sweep's or a doctor's budget cannot fit its first points."""
    from probe.judge.session import check_budget as check

    points, what = SESSIONS[command]
    check(budget_s, points, config, what)


def doctor_budget(lanes: LaneArgs, scaling: bool = False, count: int = 1) -> float:
    """The doctor's budget where none is given: DOCTOR_BUDGET_S, and with `scaling`, a point
    per pipeline for each count of its `count` lanes it checks."""
    from probe.judge.scaling import checked_counts
    from probe.measure.devices import cuda_devices, select_gpus

    kind = "gpu" if select_gpus(lanes.gpus, cuda_devices()) is not None else "cpu"
    extra = 2 * len(checked_counts(count)) * SCALING_POINT_S[kind] if scaling else 0.0
    return DOCTOR_BUDGET_S + extra


def decimal(value: float) -> str:
    """A number as a flag takes it, without float noise: 2 decimals at most (2 significant
    digits where that would read 0), no trailing zeros (10.0 -> 10, 7.23316 -> 7.23)."""
    text = f"{value:.2f}" if round(value, 2) or not value else f"{value:.2g}"
    return text.rstrip("0").rstrip(".") if "." in text and "e" not in text else text


def argv(command: str, values: Mapping[str, Any]) -> list[str]:
    """`command`'s flags for `values` (by `dest`), in the table's order: a value None is left
    out, a switch written only where it differs from its default."""
    words: list[str] = []
    for flag in flags(command):
        value = values.get(flag.dest)
        if value is None:
            continue
        if flag.type is bool:
            if bool(value) != flag.default:
                words.append(flag.name if value else flag.off)
        elif isinstance(value, float):
            words += [flag.name, decimal(value)]
        else:
            words += [flag.name, str(value)]
    return words


def _stored(config: Mapping[str, Any], path: str) -> Any:
    value: Any = config
    for i, key in enumerate(path.split(".")):
        if key == "*":
            rest = ".".join(path.split(".")[i + 1 :])
            return [_stored(item, rest) for item in value]
        if isinstance(value, Sequence) and not isinstance(value, str):
            value = value[int(key)] if int(key) < len(value) else None
        elif isinstance(value, Mapping):
            value = value.get(key)
        if value is None:
            return None
    return value


# A session point's measuring length is the session's, not a flag: a point is measured until
# precise, within a cap (`max_s`); stores written before `max_s` kept the cap in `duration_s`.
SESSION_LENGTHS = ("batches", "duration")


def stored_values(config: Mapping[str, Any], of_session: bool = False) -> dict[str, Any]:
    """A stored run's configuration as `probe run`'s flag values (by `dest`): those of its
    pipeline, and only what it set (a session point's measuring cap is none of them; nor,
    `of_session`, its stored batches or duration)."""
    backend = Backend(config["pipeline"])
    values = {}
    for flag in flags("run"):
        if flag.field is None or flag.backend not in (None, backend):
            continue
        if of_session and flag.dest in SESSION_LENGTHS:
            continue
        value = _stored(config, flag.field)
        values[flag.dest] = value if flag.from_stored is None else flag.from_stored(value)
    return values


def reproduce_command(
    document: RunDocument | Mapping[str, Any], of_session: bool = False
) -> str | None:
    """The `probe run` command line that measures a run's configuration again (under torchrun
    for a run of ranks), numbers as `decimal` writes them; None for a watched training loop.
    A point of a sweep or doctor session (`of_session`) is measured again as the session
    measured it, until precise: its stored batches or duration were no flags of the user's."""
    if isinstance(document, RunDocument):
        kind, config = document.kind, document.config
    else:
        kind, config = document["kind"], document["config"]
    if kind != "probe":
        return None
    values = stored_values(config, of_session)
    words = ["probe", "run"]
    if config.get("torchrun"):
        words = ["torchrun", f"--nproc-per-node={config['world_size']}", "-m", "probe", "run"]
        values["num_shards"] = None  # WORLD_SIZE
        if values["gpus"] != "none":
            values["gpus"] = None  # cuda:LOCAL_RANK
    return shlex.join(words + argv("run", values))


def stand_in(figures: LaneFigures, step_ms: float | None = None) -> str:
    """The consumer that stands in for a watched lane's step: its median time (or `step_ms`:
    its ranks' without their wait for each other, `stand_in_step`), and the share of it its
    kernels held the SMs where GPM measured SM activity (`sleep:MS@SM%`, 1% at least); else
    every SM, the whole step (`sleep:MS`): NVML's kernel-active time is no SM share."""
    held = figures.step_sm_active_pct
    step = f"sleep:{decimal(step_ms if step_ms is not None else figures.step_ms_p50 or 0.0)}"
    if held is None or figures.sm_active_source != "gpm" or held >= 99.5:
        return step
    return f"{step}@{max(1, round(held))}%"


def copied_text(values: Mapping[str, Any], files: int | None = None) -> str:
    """What `like_values` copied, each by its flag's name: "data /d (its 384 files), batch size
    6, ..., gpus 0, cores 0-15"; `files`: how many of the folder's files the job read."""
    said = []
    for flag in flags("doctor"):
        value = values.get(flag.dest)
        if value is None:
            continue
        if flag.type is bool:
            value = "on" if value else "off"
        elif flag.dest == "data_dir" and files:
            value = f"{value} (its {files:,} files)"
        said.append(f"{flag.label} {value}")
    return ", ".join(said) or "nothing"


def ran_on_cores(host: Mapping[str, Any]) -> str | None:
    """The cores a run's process was kept to, as taskset lists them, where its affinity named
    fewer than its machine's (None: all of them, or not recorded)."""
    limits = host.get("cpu_limits") or {}
    affinity, machine = limits.get("affinity"), limits.get("machine")
    if affinity is None or machine is None or affinity >= machine:
        return None
    return limits.get("cpu_set")


def watched_folder(document: RunDocument) -> Path:
    """The folder a watched job's files share, where `probe doctor --like` measures.

    Raises:
        InputError: the run's dataset names no files that can be read, with what to pass.
    """
    folder = document.config.get("spec", {}).get("data_dir")
    if not folder or not Path(folder).is_dir():
        raise InputError(
            f"run {document.run_id}: its dataset's files are not known ({folder}): give "
            "--data with a class-per-folder copy of its images"
        )
    return Path(folder)


@dataclass(frozen=True)
class StandIn:
    """The step `probe doctor --like` copies from a watched run: the lane whose SM share it
    takes, the step's time where that is not the lane's median, and how it was read where
    that needs saying (the session's consumer note says it: `consumer_note`)."""

    lane: LaneFigures
    step_ms: float | None = None
    read: str | None = None


def stand_in_step(document: RunDocument, unwaited: UnwaitedStep | None) -> StandIn | None:
    """The step a watched run's stand-in copies: its slowest lane's median (under DDP every
    rank waits for the slowest); where its ranks ran in step, their step without their wait for
    each other (`unwaited`, `probe.judge.evidence.unwaited_step`), with the SM share of the
    rank whose median step is shortest (it waited least for the others: its share is of its
    own work, not of a wait, where NCCL's kernels may hold SMs). None without a step."""
    stepped = [lane.figures for lane in document.lanes if lane.figures.batches]
    stepped = [f for f in stepped if f.step_ms_p50]
    if not stepped:
        return None
    slowest = max(stepped, key=lambda f: f.step_ms_p50 or 0.0)
    if len(stepped) < 2:
        return StandIn(slowest)
    if unwaited is None:
        paces = [f.seconds / f.batches for f in stepped]
        if max(paces) > (1 + SAME_PACE) * min(paces):  # each rank its own loop: no wait
            return StandIn(slowest)
        return StandIn(slowest, read=(
            f"the slowest of its {len(stepped)} ranks' median: they kept one pace, but their "
            "steps could not be read apart from their wait for each other (their batches are "
            "not in step on the host, as where CUDA runs ahead of the all-reduce), so it may "
            "hold that wait"
        ))  # fmt: skip
    read = (
        f"each batch's shortest across its {unwaited.ranks} ranks (their step without waiting "
        "for each other at the all-reduce; the slowest rank's own median "
        f"{decimal(slowest.step_ms_p50 or 0.0)} ms)"
    )
    return StandIn(min(stepped, key=lambda f: f.step_ms_p50 or 0.0), unwaited.step_ms, read)


def like_values(document: RunDocument, step: StandIn | None) -> dict[str, Any]:
    """`probe doctor`'s flag values (by `dest`) that measure like a stored run: a watched job's
    files (`watched_folder`), batch size, image size, workers or threads, its step as the
    consumer (`stand_in` of `step`, `stand_in_step`'s) and its lanes (its GPUs, or as many on
    the CPU); a probe run's own flags; either's cores, where its affinity kept it to fewer than
    its machine's (`ran_on_cores`).

    Raises:
        InputError: the run's dataset names no files that can be read, with what to pass.
    """
    config = document.config
    if document.kind == "probe":
        values = stored_values(config, of_session=True)
    else:
        spec = config.get("spec", {})
        folder = watched_folder(document)
        measured = [lane.figures for lane in document.lanes if lane.figures.batches]
        images = sum(f.images for f in measured)
        loader, dali = spec.get("dataloader", {}), spec.get("dali", {})
        gpus = sorted({lane.gpu for lane in document.lanes}, key=lambda gpu: gpu or 0)
        values = {
            "data_dir": folder,
            "batch_size": spec.get("batch_size")
            or (round(images / sum(f.batches for f in measured)) if images else None),
            "image_size": spec.get("image_size"),
            "workers": loader.get("num_workers"),
            "threads": dali.get("num_threads"),
            "persistent_workers": loader.get("persistent_workers"),
            "consumer": None if step is None else stand_in(step.lane, step.step_ms),
            "gpus": _gpus_text(gpus),
            "num_shards": len(document.lanes) if None in gpus else None,
        }
    values["cores"] = values.get("cores") or ran_on_cores(document.host)
    doctor = {flag.dest for flag in flags("doctor") if flag.group != "command"}
    return {k: v for k, v in values.items() if v is not None and k in doctor - {"read"}}
