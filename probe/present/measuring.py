"""What the measuring commands do: `probe bench`, `run` (alone or as a torchrun rank), `sweep`
and `doctor`. Each returns the command's exit code: 0, EXIT_FAILED where the run or session
failed, EXIT_INTERRUPTED where it was stopped (what it recorded is kept).
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pipelines import (
    Backend,
    BackendUnavailable,
    InputError,
    available_cpus,
    check_backend,
    check_device,
    discover,
    keep_to_cores,
)
from pipelines.loader import cuda_device_count
from probe.measure.bench import BenchResult
from probe.measure.stop import Stop
from probe.metrics import counted
from probe.present import console, terminal
from probe.present.jsontext import json_text
from probe.present.like_run import like_run, like_told
from probe.present.options import (
    DOCTOR_CONSUMER,
    LaneArgs,
    PipelineArgs,
    check_budget,
    doctor_budget,
    doctor_consumer_note,
    probe_config,
)
from probe.records import RunStatus
from probe.store.db import Store
from probe.store.documents import read_run

if TYPE_CHECKING:
    from probe.measure.config import ProbeConfig  # imported where used: it brings torch
    from probe.measure.distributed import Ending, Rank

STARTED = time.monotonic()  # the command's start: a session's budget counts from it


def _prepared(*args: Any, **kwargs: Any) -> tuple[ProbeConfig, Store, float]:
    """`prepare` for a sweep or a doctor, with when its budget starts: the command's start, with
    what `prepare` took left out (writing the sample data on first use, which may take a minute
    on a busy host, is not the session's to pay)."""
    before = time.monotonic()
    config, store = prepare(*args, **kwargs)
    return config, store, STARTED + (time.monotonic() - before)


BENCH_SCHEMA = "feedscope.bench/1"
EXIT_FAILED, EXIT_INTERRUPTED = 1, 130


def exit_code(status: str) -> int:
    """The command's exit code for how its run or session ended."""
    if status == RunStatus.INTERRUPTED.value:
        return EXIT_INTERRUPTED
    if status == RunStatus.FAILED.value:
        return EXIT_FAILED
    return 0


def bench(
    pipeline: PipelineArgs,
    as_json: bool,
    backends: Sequence[str],
    gpu: str | None,
    warmup: int,
    duration: float,
    batches: int | None,
) -> int:
    """`probe bench`: both pipelines (or those named) alone, in this process."""
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
    root = console.resolve_data(pipeline.data_dir)
    dataset = discover(root)
    where = "CPU" if device is None else f"GPU {device}"
    console.err.print(
        f"data: {root} ({len(dataset)} images, {len(dataset.classes)} classes); "
        f"device: {where}{device_note}; batch size {pipeline.batch_size}; "
        f"{cpus} CPU cores available"
    )
    spec = replace(spec, data_dir=root)
    results = [console.bench_one(spec, b, dataset, warmup, duration, batches) for b in chosen]
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
        click.echo(json_text(document))
        return 0
    console.out.print(terminal.bench_table(results))
    for backend_name, reason in missing.items():
        console.err.print(f"{backend_name}: not measured: {reason}")
    return 0


def _result_json(result: BenchResult) -> dict[str, Any]:
    fields_ = asdict(result)
    fields_["backend"] = result.backend.value
    fields_["images_per_s"] = result.images_per_s
    return fields_


def prepare(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    db: Path | None,
    backend: Backend,
    batches: int | None = None,
    duration: float | None = None,
    label: str | None = None,
    rank: Rank | None = None,
    session: tuple[str, float] | None = None,
) -> tuple[ProbeConfig, Store]:
    """Checks everything a probe needs, cheapest first (for a `session`, a sweep's or a doctor's,
    that its budget fits its first points); opens the store; then resolves the data (generating
    the sample data on first use). Under torchrun, the rank's one lane."""
    from probe.measure.config import check_batch_fits, check_config

    if lanes.cores is not None:
        keep_to_cores(lanes.cores)
    config = probe_config(pipeline, lanes, backend, batches, duration, label, rank)
    if session is not None:
        check_budget(session[0], session[1], config)
    check_batch_fits(config)  # before the sample data is written: it needs no data
    store = Store(db)
    data_dir = console.resolve_data(pipeline.data_dir)
    config = replace(config, spec=replace(config.spec, data_dir=data_dir))
    check_config(config)  # the dataset and its shards, before anything is announced
    return config, store


def run(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    backend: Backend,
    batches: int | None,
    duration: float | None,
    label: str | None,
    no_gather: bool,
    metrics_port: int | None = None,
) -> int:
    """`probe run`: here, or as one rank of a torchrun launch."""
    from probe.measure.distributed import torchrun_rank
    from probe.measure.runner import run_probe

    rank = torchrun_rank()
    if metrics_port is not None:
        from probe.measure.live import require

        require("prometheus_client", "prometheus-client", "--metrics-port", "prometheus")
        check_port(metrics_port + (rank.local_rank if rank is not None else 0))
    if rank is not None:
        return _run_ranked(rank, pipeline, lanes, as_json, db, backend, batches, duration, label,
                           gather=not no_gather, metrics_port=metrics_port)  # fmt: skip
    if no_gather:
        raise InputError("--no-gather is for runs under torchrun")
    config, store = prepare(pipeline, lanes, db, backend, batches, duration, label)
    config = replace(config, metrics_port=metrics_port)
    console.announce(config, bool(lanes.gpus), store)
    stop = Stop()
    with console.stopping_on_signals(stop), console.live_lanes() as update:
        run_id = run_probe(
            config,
            store,
            stop=stop,
            on_update=update,
            on_start=lambda run_id: console.err.print(f"run {run_id}"),
        )
    return _finish_run(store, run_id, as_json)


def _finish_run(store: Store, run_id: str, as_json: bool) -> int:
    """A finished run's table, notes and diagnosis (or its JSON); its exit code."""
    from probe.judge.diagnosis import diagnose_run

    document = read_run(store, run_id)
    diagnosis = diagnose_run(store, run_id)
    store.close()
    if as_json:
        click.echo(json_text({**document.to_json(), "diagnosis": diagnosis.to_json()}))
    else:
        console.print_run(document, diagnosis)
    return exit_code(document.status)


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
    metrics_port: int | None = None,
) -> int:
    """`probe run` as one rank of a torchrun launch."""
    from torch.distributed import DistError

    from probe.measure import distributed
    from probe.measure.config import new_run_id
    from probe.measure.runner import run_probe

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
                    prepared = prepare(pipeline, lanes, db, backend, batches, duration, label,
                                       rank=rank)  # fmt: skip
                except InputError as error:
                    mine = str(error)
            distributed.barrier()
        errors = distributed.all_errors(mine)
        if prepared is None or any(errors):
            first = next(e for e in errors if e)
            raise InputError(first if rank.rank == 0 else f"rank {errors.index(first)}: {first}")
        config, store = prepared
        config = replace(config, metrics_port=metrics_port)
        if rank.rank == 0:
            console.announce(config, bool(lanes.gpus), store)
        run_id = distributed.shared_run_id(rank, new_run_id)
        stop = Stop()
        show = rank.rank == 0 and console.on_terminal()
        with console.stopping_on_signals(stop, quiet=True), console.live_lanes(show) as update:
            ending = distributed.run_ranked(
                rank,
                lambda spool, run_id: run_probe(config, spool, stop=stop, run_id=run_id,
                                                on_update=update),
                store,
                run_id,
                stop,
                gather=gather,
            )  # fmt: skip
    except DistError as error:  # a collective with a rank that is gone
        raise distributed.RanksLost(
            f"rank {rank.rank}: lost the job's other ranks: {error}"
        ) from None
    finally:
        distributed.disconnect()
    if not ending.whole:
        return _ended_apart(rank, store, ending)
    if rank.rank == 0 and (code := _finish_run(store, run_id, as_json)):
        return code
    store.close()
    where = "rank 0's store" if ending.gathered else str(store.path)
    console.err.print(f"rank {rank.rank}: lane {rank.rank} of run {run_id} recorded in {where}")
    return 0


def _ended_apart(rank: Rank, store: Store, ending: Ending) -> int:
    """A job that did not end whole: one line from the first living rank of each node, naming
    each rank that went wrong and what the node's store keeps; exit 1 where a rank failed or
    was lost, else that of the stop."""
    from probe.measure.distributed import RankState

    document = read_run(store, ending.run_id)
    store.close()
    mine = next(lane for lane in document.lanes if lane.lane == rank.rank)
    here = socket.gethostname()
    me = RankState(rank.rank, here, os.getpid(), mine.status, mine.reason, time.time())
    ranks = sorted([me, *ending.others.values()], key=lambda state: state.rank)
    if rank.rank == min(r.rank for r in ranks if r.host == here and not r.lost):
        wrong = [f"rank {r.rank} {r.what()}" for r in ranks if r.gone_wrong]
        wrong += [f"rank {r.rank} {r.what().split(',')[0]}" for r in ranks if r.knock_on]
        kept = ", ".join(str(lane.lane) for lane in document.lanes)
        console.say(
            f"run {document.run_id} {document.status}: {'; '.join(wrong)}; lanes {kept} "
            f"recorded in {store.path} (`probe show {document.run_id}`)"
        )
    failed = any(r.lost or r.state == RunStatus.FAILED.value for r in ranks)
    return EXIT_FAILED if failed else exit_code(document.status)


def sweep(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    backend: Backend,
    values: str | None,
    budget: float,
    knob: str | None = None,
) -> int:
    """`probe sweep`: one knob over settings, each a run on lanes kept warm."""
    from probe.judge.dali_model import SHARES
    from probe.judge.knee import ladder
    from probe.judge.session import SHARE_PCT
    from probe.judge.sweep import run_sweep

    if backend is Backend.TORCH:
        if knob not in (None, "num_workers"):
            raise InputError(f"--knob {knob} is DALI's: give --pipeline dali")
        knob = "num_workers"
    knob = knob or "num_threads"
    config, store, started = _prepared(pipeline, lanes, db, backend, session=("sweep", budget))
    if knob == "hw_decoder_load":  # swept in whole percent: a setting is a whole number
        if config.lane_spec(config.lanes[0]).dali_decoder.value != "mixed":
            raise InputError(
                "--knob hw_decoder_load: the share goes to the hardware decoder of DALI's mixed "
                "decoder, which needs a GPU (--gpus) and --decoder mixed"
            )
        shares = _share_list(values) if values else list(SHARES)
        knob, settings = SHARE_PCT, [round(share * 100) for share in shares]
    else:
        settings = _int_list(values, "--values") if values else ladder(_cores_per_lane(config))
    console.err.print(
        f"sweep: {knob} over {', '.join(map(str, settings))}; consumer {config.consumer}; "
        f"each until images/s is known within {config.precision:.0%}; budget {budget:g} s; "
        f"store: {store.path}"
    )
    with console.stopping_on_signals(stop := Stop()):
        session = run_sweep(config, knob, settings, budget, store, stop=stop,
                             on_event=console.narrate, started=started)  # fmt: skip
    store.close()
    if as_json:
        click.echo(json_text(session.to_json()))
    else:
        console.out.print(terminal.sweep_table(session))
        if session.reason:
            console.err.print(session.reason)
    return exit_code(session.status.value)


def doctor(
    pipeline: PipelineArgs,
    lanes: LaneArgs,
    as_json: bool,
    db: Path | None,
    budget: float | None,
    scaling: bool = False,
    like: str | None = None,
    given: Collection[str] = (),
) -> int:
    """`probe doctor`: the whole diagnosis, on lanes kept warm, within its budget; `like`: a
    stored run whose settings it takes where the flags `given` do not set them."""
    from probe.judge.doctor import run_doctor
    from probe.judge.knee import ladder

    step_read = None
    if like is not None:
        liked = like_run(db, like, pipeline, lanes, given)
        like, step_read = liked.run_id, liked.step_read
        pipeline, lanes = liked.pipeline, liked.lanes
    if lanes.cores is not None:  # before the budget and the lanes are planned on the cores
        keep_to_cores(lanes.cores)
    if lanes.read != "stream":
        raise InputError(
            "--read: the doctor reads your setting both ways itself (as one stream, and epoch "
            "by epoch where the epochs are short enough to matter); leave --read out"
        )
    if budget is None:
        budget = doctor_budget(lanes)
        if scaling:  # its points are counted once the lanes are known
            count = len(probe_config(pipeline, lanes, Backend.TORCH).lanes)
            budget = doctor_budget(lanes, scaling, count)
    config, store, started = _prepared(
        pipeline, lanes, db, Backend.TORCH, session=("doctor", budget)
    )
    cores = _cores_per_lane(config)
    baseline = config.spec.dataloader.num_workers
    on_gpu = config.lanes[0].device is not None
    threads = pipeline.threads or (min(8, cores) if on_gpu else cores)
    settings = ladder(cores)
    if lanes.consumer == DOCTOR_CONSUMER:
        note = doctor_consumer_note(config.spec.batch_size)
        console.err.print(f"consumer: {DOCTOR_CONSUMER}, {note}; give --consumer for yours")
    scaled = ""
    if len(config.lanes) > 1:
        word = "GPU" if on_gpu else "lane"
        scaled = (
            f"; then the job on 1 {word} and each power of two below {len(config.lanes)}"
            if scaling
            else f"; how the job scales from 1 {word} to {len(config.lanes)} is predicted"
        )
    console.err.print(
        f"doctor: yours (num_workers={baseline}) first, then the DataLoader around the knee "
        "its run predicts (where a term cannot be measured, workers from yours over "
        f"{', '.join(map(str, settings))}), DALI searched from {counted(threads, 'thread')}, "
        f"the epoch reading where it matters, and a verification{scaled}; each point until "
        f"images/s is known within {config.precision:.0%}; budget {budget:g} s; store: {store.path}"
    )
    with console.stopping_on_signals(stop := Stop()):
        session = run_doctor(
            config, settings, baseline, threads, budget, store, stop=stop,
            on_event=console.narrate, started=started, scaling=scaling, like=like,
            step_read=step_read,
        )  # fmt: skip
    store.close()
    if as_json:
        click.echo(json_text(session.to_json()))
    elif session.verdict is None:
        console.err.print(f"no answer: {session.reason} (session {session.session_id})")
    else:
        console.print_session(session)
        if like is not None:
            like_told(db, like)
        console.err.print(f"session {session.session_id}")
    return exit_code(session.status.value)


def _cores_per_lane(config: ProbeConfig) -> int:
    return max(1, available_cpus() // len(config.lanes))


def _pick_gpu(value: str | None) -> tuple[int | None, str]:
    """`probe bench --gpu`: the device asked for ('none', or a CUDA index), else GPU 0 if CUDA
    has one, else the CPU.

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


def _int_list(text: str, option: str) -> list[int]:
    """`2,4,8` -> [2, 4, 8].

    Raises:
        InputError: anything but whole numbers >= 0.
    """
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"{option} takes whole numbers like 2,4,8 (got {text!r})") from None
    if not values or min(values) < 0:
        raise InputError(f"{option} takes whole numbers >= 0 like 2,4,8 (got {text!r})")
    return values


def _share_list(text: str) -> list[float]:
    """`0.65,0.9,1` -> [0.65, 0.9, 1.0].

    Raises:
        InputError: anything but shares within 0..1.
    """
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError(f"--values takes shares like 0.65,0.9,1 (got {text!r})") from None
    if not values or not all(0 <= v <= 1 for v in values):
        raise InputError(f"--values takes shares within 0..1 like 0.65,0.9,1 (got {text!r})")
    return values


def check_port(port: int) -> None:
    """Refuses, before anything starts, a --metrics-port this machine will not give (taken,
    or privileged)."""
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the endpoint binds it
        try:
            sock.bind(("", port))
        except OSError as error:
            raise InputError(f"--metrics-port: port {port}: {error.strerror or error}") from None
