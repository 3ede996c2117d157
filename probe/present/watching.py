"""`probe watch -- python train.py ARGS`: the command's body. The script runs with its loaders
watched (its training loader swapped where `--loader` or `--workers` says), and when it ends the
answer for each loader it iterated is told, rank 0 telling it for the job's ranks."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines import InputError
from probe.present import console, tables
from probe.present.measuring import check_port
from probe.records import RunStatus
from probe.store.connection import StoreBusy, StoreFailed
from probe.store.db import Store

if TYPE_CHECKING:
    from probe.measure.autowatch import Swap


def watch_script(command: Sequence[str], db: Path | None, name: str | None, warmup: str,
                 sample_hz: float, metrics_port: int | None, tensorboard: Path | None,
                 tensorboard_every: int, swap: Swap | None = None) -> int:  # fmt: skip
    """`probe watch -- SCRIPT ARGS`: runs the script with its loaders watched (its training
    loader swapped where `swap` says); its exit code. Bad options, a missing script or a module
    that cannot be imported are refused before it starts."""
    from probe.measure.autowatch import Script, Watching, rerun_record, run_script
    from probe.measure.distributed import torchrun_rank
    from probe.measure.recording import Answer
    from probe.measure.watch import Outlets

    if warmup != "auto" and not warmup.isdigit():
        raise InputError(f"--warmup {warmup}: a number of batches, or auto")
    script = Script.of(command)
    outlets = Outlets.checked(metrics_port, tensorboard, tensorboard_every)
    rank = torchrun_rank()
    if metrics_port is not None:
        check_port(metrics_port + (rank.local_rank if rank is not None else 0))
    options = {"name": name, "db": db, "sample_hz": sample_hz,
               "warmup": warmup if warmup == "auto" else int(warmup),
               "command": rerun_record(command, rank)}  # fmt: skip
    if swap is not None:
        if swap.batches is not None and warmup == "auto":
            raise InputError("--batches counts beyond a fixed --warmup: give --warmup N")
        swap.warmup = 0 if warmup == "auto" else int(warmup)
        swap.load()
    watching = Watching(script, options, outlets, swap)
    code = run_script(script, watching)
    if swap is not None and not watching.swapped and code == 0:
        where = "" if swap.site is None else f" at {':'.join(map(str, swap.site))}"
        console.err.print(f"error: nothing was swapped: the job iterated no loader{where}")
        code = 1
    if Answer.first is not None and (rank is None or rank.rank == 0):  # one rank tells it
        try:
            lines = loader_answers(*Answer.first)
        except (InputError, StoreBusy, StoreFailed, sqlite3.Error) as error:
            lines = [f"no answer: the store could not be read: {error}"]
        console.print_lines([f"feedscope: {line}" for line in lines])
    return code


# How long the answer at exit waits for the job's other ranks to end their lanes: a rank
# that ended with the job writes its last rows and its lane within a writer's interval or two.
RANKS_END_S = 5.0


def loader_answers(db: Path | None, run_id: str) -> list[str]:
    """The answer for each loader the process that watched `run_id` recorded, the training
    loader first (`tables.loader_lines`). Under torchrun rank 0 tells it once its own lanes
    have ended, often before the other ranks' have: it waits for them (`ranks_ended`), so
    that a job that completed is told completed, as `probe show` tells it."""
    from probe.judge.diagnosis import diagnose_run
    from probe.store.documents import read_run

    loaders = []
    with Store(db) as store:
        ranks_ended(store, [run.run_id for run in store.loaders(store.run(run_id))])
        for run in store.loaders(store.run(run_id)):
            diagnosis = diagnose_run(store, run.run_id)
            loaders.append((read_run(store, run.run_id), diagnosis.verdict,
                            diagnosis.recommendations, diagnosis.findings))  # fmt: skip
    return tables.loader_lines(loaders)


def ranks_ended(store: Store, run_ids: Sequence[str], within_s: float | None = None) -> bool:
    """Waits, at most `within_s` (RANKS_END_S), until none of the runs of several ranks is
    still running (every rank's lane ended and the run settled:
    `probe.store.merge.settle_run`); returns whether they have ended. A run settled already
    costs no wait, nor does one of a single process (its own end settled it, unless its store was
    lost); one whose ranks do not end in time is told as it is then (`tables.loader_lines`
    names the ranks still running)."""
    deadline = time.monotonic() + (RANKS_END_S if within_s is None else within_s)
    while True:
        runs = [store.run(x) for x in run_ids]
        running = [
            run.run_id
            for run in runs
            if run.status is RunStatus.RUNNING and int(run.config.get("world_size") or 1) > 1
        ]
        if not running:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
        run_ids = running
