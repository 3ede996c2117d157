"""`probe doctor --like RUN`: the doctor's flags taken from a stored run (a watched job's: its
files, batch size, cores and a stand-in for its step), and what is told after its session: that
its figures were estimated on the stand-in, with `probe tune RUN` where the job can run again,
and the recipe as the job's change where it is one."""

from __future__ import annotations

import shlex
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

from pipelines.host import cpu_set_text, own_cores, parse_cpu_set
from probe.metrics import IMAGES_PER_S
from probe.present import console
from probe.present.options import (
    LaneArgs,
    PipelineArgs,
    argv,
    copied_text,
    like_values,
    stand_in_step,
)
from probe.store.db import Store
from probe.store.documents import read_run


@dataclass(frozen=True)
class Liked:
    """What `probe doctor --like` takes from a run: its whole id, the doctor's flags as it ran,
    and how its stand-in's step was read where that needs saying (`StandIn.read`)."""

    run_id: str
    pipeline: PipelineArgs
    lanes: LaneArgs
    step_read: str | None


def like_run(
    db: Path | None, wanted: str, pipeline: PipelineArgs, lanes: LaneArgs, given: Collection[str]
) -> Liked:
    """The run `wanted` names, as `probe show` reads it (`last`: a watched script's training
    loader; a session: the run its figures come from), and the doctor's flags as it ran
    (`like_values`) where `given` sets none, its step a watched job's (`stand_in_step`: under
    DDP, its ranks' without their wait for each other); the first line says what it copied."""
    from probe.judge.evidence import unwaited_step
    from probe.judge.results import focus_run, resolve_subject

    with Store(db, create=db is None) as store:
        run = store.run(focus_run(store, resolve_subject(store, wanted)))
        document = read_run(store, run.run_id)
        loaders = store.loaders(run)
        ranks = sum(1 for lane in document.lanes if lane.figures.batches)
        across = store.batches_across(run.run_id) if run.kind == "watch" and ranks > 1 else []
    step = stand_in_step(document, unwaited_step(across, ranks))
    values = {k: v for k, v in like_values(document, step).items() if k not in given}
    cores, here = values.get("cores"), own_cores()
    kept = ""
    if cores is not None and here is not None and not parse_cpu_set(cores) <= here:
        kept = (
            f"; its cores ({cores}) are not all this process's ({cpu_set_text(here)}): "
            "measured on this process's own"
        )
        del values["cores"]
    role = ""
    if len(loaders) > 1:
        role = f", the training loader of its {len(loaders)}"
    named = f"{document.label}{role}" if document.label else role.lstrip(", ")
    files = document.config.get("spec", {}).get("data_files")
    console.err.print(
        f"like run {document.run_id}{f' ({named})' if named else ''}: copied "
        f"{copied_text(values, files)}{kept}"
    )
    console.err.print(f"  as: probe doctor {shlex.join(argv('doctor', values))}")
    consumer = str(values.get("consumer", ""))
    if step is not None and consumer.startswith("sleep:") and "@" not in consumer:
        why = (
            "its steps held the SMs all their time"
            if step.lane.sm_active_source == "gpm"
            else "its SM activity was not sampled (GPM)"
        )
        console.err.print(
            f"{why}: the stand-in holds every SM for the whole step, and DALI's kernels wait "
            "behind it (beside a 30 ms step on one H100, DALI gave 11% less than beside a step "
            "busy for its measured share)"
        )
    return Liked(
        document.run_id,
        replace(pipeline, **{k: v for k, v in values.items() if hasattr(pipeline, k)}),
        replace(lanes, **{k: v for k, v in values.items() if hasattr(lanes, k)}),
        step.read if step is not None and "consumer" in values else None,  # not one given
    )


def like_told(db: Path | None, like: str) -> None:
    """After a doctor measured like a watched DataLoader: its DataLoader was feedscope's recipe,
    not the job's own loader; where the job's loader costs well more CPU an image, the recipe
    as the job's change, with the figure measured here (`probe.judge.recipe`). Every figure
    here was estimated on a stand-in for the job's step: where the job can run again, `probe
    tune` measures each candidate on the job itself."""
    from probe.judge.changes import Knob
    from probe.judge.diagnosis import diagnose_run

    with Store(db, create=db is None) as store:
        run = store.run(like)
        if run.kind != "watch":
            return
        recommendations = diagnose_run(store, like).recommendations
    again = (
        f"`probe tune {like}` measures each candidate on the job itself"
        if run.config.get("command")
        else "the job recorded no command to run again: watched with `probe watch -- python "
        "train.py`, `probe tune` measures each candidate on the job itself"
    )
    console.err.print(
        f"these figures are estimated on a stand-in for run {like}'s step (a simulated step on "
        f"feedscope's pipelines), not measured on the job; {again}"
    )
    for recipe in recommendations:
        if recipe.change.knob is Knob.RECIPE and recipe.predicted_images_per_s is not None:
            shown = IMAGES_PER_S.cell(recipe.predicted_images_per_s, recipe.predicted_error)
            console.err.print(
                f"the DataLoader measured here is feedscope's recipe, not run {like}'s own "
                f"loader: for the job, {recipe.setting}, predicted {shown} images/s "
                f"({recipe.basis}); `probe migrate {like} --to dataloader` writes it"
            )
