"""feedscope's DataLoader recipe as a change for a watched DataLoader job: decoding JPEGs at a
reduced scale where the crop allows, uint8 handed over and normalized after the copy, workers
kept between epochs (`pipelines.torch_loader`; `probe migrate --to dataloader` writes it for the
job). It is recommended where the job starves and its loader costs RECIPE_WORTH_IT times the CPU
an image that the recipe cost on the job's files, measured by the doctor like the run
(`probe doctor --like RUN`: its DataLoader points are the recipe's), at the images/s measured
there; before that is measured, where the CPU holds the loader, with what measures it. Where
DALI is not installed here, it is the first change."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines import InputError
from probe.judge.changes import Change, Knob, Recommendation
from probe.judge.facts import LaneFacts, run_facts
from probe.judge.like import LikeSession, like_session
from probe.judge.results import Session
from probe.judge.thresholds import RECIPE_WORTH_IT
from probe.judge.verdicts import FED_KINDS, Verdict, VerdictKind
from probe.measure.recipe import RECIPE_STEPS, refusals
from probe.metrics import CPU_PER_IMAGE, IMAGES_PER_S
from probe.records import RunRecord
from probe.store.db import Store

# Where the CPU holds a DataLoader: a loader that costs less CPU an image is a change of its own
_CPU_HELD = frozenset(
    {
        VerdictKind.STARVED_CPU_SATURATED,
        VerdictKind.STARVED_CPU_HEADROOM,
        VerdictKind.MAIN_PROCESS_BOUND,
        VerdictKind.OVERSUBSCRIBED,
        VerdictKind.SHARED_CORES,
    }
)
# The first step of a chain whose cost feedscope's DataLoader stands for: it crops as it does
STANDS_FOR = "RandomResizedCrop"
WHAT_IT_DOES = (
    "JPEGs decoded at a reduced scale where the crop allows, uint8 handed over and normalized "
    "after the copy, its workers kept between epochs"
)


@dataclass(frozen=True)
class RecipeFigure:
    """What the doctor measured of feedscope's DataLoader at its best num_workers: as the job
    reads it, epoch by epoch (the doctor's epochs run, where it read the best setting so, with
    the job's persistent_workers: the recipe keeps its workers, so that is its floor), else as
    one stream: its answer's figure for the setting (pooled where it measured it again), else
    the point's."""

    num_workers: int
    images_per_s: float
    error: float | None
    run_id: str | None
    read: str  # "epoch by epoch", or "as one stream" (the answer's figure where it gave one)

    @property
    def cell(self) -> str:
        return IMAGES_PER_S.cell(self.images_per_s, self.error)


def recipe_figure(session: Session) -> RecipeFigure | None:
    """The recipe's figure in a doctor session (None: it measured no DataLoader point)."""
    best = session.best
    if best is None:
        return None
    epochs = session.epochs
    if epochs is not None and epochs.images_per_s and epochs.num_workers == best.setting:
        return RecipeFigure(
            best.setting,
            epochs.images_per_s,
            epochs.images_per_s_error,
            epochs.run_id,
            "epoch by epoch",
        )
    for answer in session.recommendations:  # its answer's figure: pooled where measured again
        change = answer.change
        if (
            change.knob is Knob.NUM_WORKERS
            and change.value == best.setting
            and answer.predicted_images_per_s is not None
        ):
            return RecipeFigure(
                best.setting,
                answer.predicted_images_per_s,
                answer.predicted_error,
                best.run_id,
                "as one stream, as the doctor's answer gives it",
            )
    return RecipeFigure(
        best.setting, best.images_per_s, best.images_per_s_error, best.run_id, "as one stream"
    )


def with_recipe(
    store: Store,
    run: RunRecord,
    facts: Sequence[LaneFacts],
    verdict: Verdict,
    recommendations: Sequence[Recommendation],
) -> list[Recommendation]:
    """The run's recommendations with the recipe among them where it is one (`recipe_change`),
    ranked by its predicted images/s, or first where DALI is not installed here."""
    recipe = recipe_change(store, run, facts, verdict)
    out = list(recommendations)
    if recipe is None:
        return out
    if importlib.util.find_spec("nvidia.dali") is None:
        return [recipe, *out]
    predicted = recipe.predicted_images_per_s
    place = next(
        (
            index
            for index, other in enumerate(out)
            if predicted is not None
            and (other.predicted_images_per_s is None or other.predicted_images_per_s < predicted)
        ),
        len(out),
    )
    return [*out[:place], recipe, *out[place:]]


def recipe_change(
    store: Store, run: RunRecord, facts: Sequence[LaneFacts], verdict: Verdict
) -> Recommendation | None:
    """feedscope's DataLoader recipe for a watched DataLoader that starves (None: not one)."""
    if run.kind != "watch" or run.pipeline != "torch" or not facts or not verdict.reliable:
        return None
    if verdict.kind in FED_KINDS or verdict.kind is VerdictKind.IO_BOUND:
        return None
    recorded = run.config.get("spec", {}).get("recipe")
    if not recorded or refusals(recorded, "the written DataLoader"):
        return None  # `probe migrate --to dataloader` could not write it
    found = like_session(
        store, run, lambda session: session.best is not None and session.like == run.run_id
    )
    if found is not None:
        return _measured(store, run, facts, found)
    if verdict.kind not in _CPU_HELD or not facts[0].watched_files:
        return None
    return Recommendation(
        _action(run),
        Change(Knob.RECIPE, facts[0].num_workers or 0),
        None,
        f"not predicted: `probe doctor --like {run.run_id}` measures it on the job's files",
    )


def _action(run: RunRecord) -> str:
    return (
        f"feedscope's DataLoader recipe, written for this loader by `probe migrate {run.run_id} "
        f"--to dataloader`: {WHAT_IT_DOES}"
    )


def _measured(
    store: Store, run: RunRecord, facts: Sequence[LaneFacts], found: LikeSession
) -> Recommendation | None:
    """The recipe at the doctor's best DataLoader point, where the job's loader costs
    RECIPE_WORTH_IT times its CPU an image and it was faster than the job (None: not so)."""
    figure = recipe_figure(found.session)
    assert figure is not None
    costs = [f.figures.cpu_ms_per_image for f in facts if f.figures.cpu_ms_per_image]
    own_cpu = sum(costs) / len(costs) if costs else None
    recipe_cpu = _cpu_per_image(store, figure.run_id)
    if own_cpu is None or recipe_cpu is None or own_cpu < RECIPE_WORTH_IT * recipe_cpu:
        return None
    if figure.images_per_s <= sum(f.figures.images_per_s for f in facts):
        return None  # no faster than the job as it ran
    costs_text = (
        f"it cost {CPU_PER_IMAGE.text(recipe_cpu)} of CPU an image on the job's files, where "
        f"this loader costs {CPU_PER_IMAGE.text(own_cpu)}"
    )
    first, kept = _first_step(run), _kept(run)
    change = Change(Knob.RECIPE, figure.num_workers)
    why_not = None
    if first != STANDS_FOR:
        why_not = (
            f"the doctor's DataLoader crops as {STANDS_FOR} does, and this loader's transform "
            f"starts with {first}"
        )
    elif kept:
        why_not = (
            f"the written loader keeps {', '.join(kept)} as the job's own, a cost the doctor's "
            "DataLoader has not"
        )
    if why_not is not None:
        return Recommendation(_action(run), change, None, f"not predicted: {why_not}; {costs_text}")
    return Recommendation(
        _action(run),
        change,
        figure.images_per_s,
        f"measured by doctor session {found.session.session_id} ({found.how}), read "
        f"{figure.read}, run {figure.run_id}: {costs_text}",
        predicted_error=figure.error,
    )


def _first_step(run: RunRecord) -> str | None:
    """The name of the first step of a watched loader's transform (None: none recorded)."""
    steps = run.config.get("spec", {}).get("recipe", {}).get("transform") or []
    return str(steps[0].get("name")) if steps else None


def _kept(run: RunRecord) -> list[str]:
    """The steps of a watched loader's transform that the written loader keeps as the job's own
    (functions; transforms other than those it writes: `RECIPE_STEPS`)."""
    steps = run.config.get("spec", {}).get("recipe", {}).get("transform") or []
    return [
        str(step.get("name"))
        for step in steps
        if step.get("callable") or step.get("name") not in RECIPE_STEPS
    ]


def _cpu_per_image(store: Store, run_id: str | None) -> float | None:
    """A run's CPU per image over its lanes (None: not measured)."""
    if run_id is None:
        return None
    try:
        costs = [f.figures.cpu_ms_per_image for f in run_facts(store, run_id)]
    except (InputError, KeyError):
        return None
    measured = [c for c in costs if c is not None and math.isfinite(c)]
    return sum(measured) / len(measured) if measured else None
