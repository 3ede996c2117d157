"""The setting a watched loader's written module takes: where it was measured for the job
(`probe tune`'s trials on the job itself first, then a doctor session measured like the run),
else the job's own or DALI's defaults, said so."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pipelines import DaliOptions, InputError
from probe.fix.dali import DaliSetting
from probe.fix.dataloader import TorchSetting
from probe.fix.tune import Figure, Trial, figures
from probe.judge.like import like_session
from probe.judge.recipe import recipe_figure
from probe.metrics import job_scope
from probe.records import TuneRecord
from probe.store.db import Store
from probe.store.documents import RunDocument

DEFAULT_THREADS = 8  # the doctor's first DALI point on a GPU: min(8, cores)
PREFIXES = {"dali": "dali", "dataloader": "torch"}  # a written module's name: PREFIX_loader


def recorded_recipe(document: RunDocument) -> dict[str, Any]:
    """What the run recorded of its loader to move it.

    Raises:
        InputError: the run is not a watched torch DataLoader, or recorded nothing of it.
    """
    spec = document.config.get("spec", {})
    if document.kind != "watch":
        raise InputError(
            f"run {document.run_id} is a {document.kind} run of feedscope's own pipelines: "
            "probe migrate writes the loader of a watched job (`probe watch -- python train.py`)"
        )
    if document.pipeline != "torch":
        raise InputError(
            f"run {document.run_id} watched a {document.pipeline} loader: probe migrate moves a "
            "torch DataLoader"
        )
    recipe = spec.get("recipe")
    if not recipe:
        raise InputError(
            f"run {document.run_id} recorded nothing of its loader's dataset and transforms "
            "(it was watched by an older feedscope): watch the job again"
        )
    return dict(recipe)


def _tune_figures(store: Store, run_id: str) -> Iterator[tuple[TuneRecord, list[Figure]]]:
    """Each `probe tune` session of the run, newest first, with its candidates measured on the
    job, each its trials pooled, the best first (`figures`); one written unlike this one is
    passed over."""
    for record in store.tunes(run_id):
        try:
            trials = [Trial.from_json(x) for x in record.document.get("trials", [])]
        except (KeyError, TypeError):  # written unlike this one
            continue
        yield record, figures(trials)


def tuned(store: Store, run_id: str, kind: str) -> tuple[dict[str, Any], str, float] | None:
    """The newest `probe tune` session of the run whose trials measured a `kind` candidate
    ("dali" or "recipe") best of its kind on the job: (the candidate, a sentence naming where it
    was measured, its images/s for the job); None where none did."""
    for record, measured in _tune_figures(store, run_id):
        of_kind = [f for f in measured if f.candidate.kind == kind]
        if of_kind:
            best = of_kind[0]
            where = (f"tune session {record.tune_id}, measured on the job itself: "
                     f"{best.text()} (run {', '.join(best.run_ids)})")  # fmt: skip
            return dict(vars(best.candidate)), where, best.images_per_s
    return None


def tune_told(store: Store, run_id: str) -> str | None:
    """What the newest `probe tune` session of the run measured on the job itself: its best
    candidate against the job's own loader (None: no tune session measured one)."""
    for record, measured in _tune_figures(store, run_id):
        if not measured:
            continue
        best = measured[0]
        yours = next((f for f in measured if f.candidate.kind == "yours"), None)
        against = "" if yours is None or yours is best else (
            f", yours {yours.text()} ({best.images_per_s / yours.images_per_s:.2f}x)"
        )  # fmt: skip
        write = best.candidate.migrate(run_id)
        which = "the best" if len(measured) > 1 else "the one candidate measured"
        return (
            f"measured on the job itself, tune session {record.tune_id}: {which}, "
            f"{best.candidate.label}, {best.text()}{against}"
            + ("" if write is None else f"; `{write}` writes it")
        )
    return None


def setting_for(
    store: Store,
    document: RunDocument,
    threads: int | None = None,
    hw_decoder_load: float | None = None,
) -> DaliSetting:
    """The DALI setting for the run's job: the newest doctor session measured like it (or like
    another loader of its process: a script's training loader sets its validation loader's),
    else the newest on the same files, else DALI's defaults; `threads` and `hw_decoder_load` where
    given replace the session's. A `probe tune` session's best DALI trial comes first."""
    found = like_session(
        store,
        store.run(document.run_id),
        lambda session: session.dali is not None and session.dali.images_per_s is not None,
    )
    on_job = tuned(store, document.run_id, "dali")
    if on_job is not None:
        candidate, where, measured = on_job
        share = candidate.get("share")
        base = DaliSetting(
            num_threads=int(candidate["threads"]),
            hw_decoder_load=DaliOptions.hw_decoder_load if share is None else float(share),
            decoder="mixed" if share is not None else "cpu",
            source=where,
            predicted_images_per_s=measured,
        )
    elif found is not None and found.session.dali is not None:
        chosen, how, dali = found.session, found.how, found.session.dali
        figure = chosen.shown(dali.change.setting)  # the one its answer weighed
        whose = job_scope(chosen.devices)
        rate = "no rate" if figure is None else f"{figure.text}{whose} ({figure.source})"
        base = DaliSetting(
            num_threads=dali.num_threads,
            hw_decoder_load=DaliOptions.hw_decoder_load
            if dali.hw_decoder_load is None
            else dali.hw_decoder_load,
            decoder=dali.decoder,
            source=f"doctor session {chosen.session_id}, {how}: {rate}",
            predicted_images_per_s=None if figure is None else figure.images_per_s,
        )
    else:
        base = DaliSetting(
            num_threads=DEFAULT_THREADS,
            hw_decoder_load=DaliOptions.hw_decoder_load,
            source=f"DALI's defaults, not measured for this job: `probe doctor --like "
            f"{document.run_id}` finds its best setting",
        )
    if threads is None and hw_decoder_load is None:
        return base
    return DaliSetting(
        num_threads=threads or base.num_threads,
        hw_decoder_load=base.hw_decoder_load if hw_decoder_load is None else hw_decoder_load,
        decoder=base.decoder,
        source=f"given on the command line (the measured setting: {base.source})",
    )


def torch_setting_for(
    store: Store, document: RunDocument, workers: int | None = None
) -> TorchSetting:
    """The workers for feedscope's DataLoader recipe in the run's job: the doctor's best
    DataLoader point measured like the run (`probe doctor --like RUN`: its DataLoader is the
    recipe), else the job's own; `workers` where given replaces them. A `probe tune` session's
    best recipe trial comes first."""
    loader = document.config.get("spec", {}).get("dataloader", {})
    prefetch = loader.get("prefetch_factor")
    found = like_session(
        store,
        store.run(document.run_id),
        lambda session: session.best is not None and session.like == document.run_id,
    )
    figure = None if found is None else recipe_figure(found.session)
    on_job = tuned(store, document.run_id, "recipe")
    if on_job is not None:
        candidate, where, measured = on_job
        base = TorchSetting(
            num_workers=int(candidate["workers"]),
            source=where,
            predicted_images_per_s=measured,
            prefetch_factor=prefetch,
        )
    elif found is not None and figure is not None:
        base = TorchSetting(
            num_workers=figure.num_workers,
            source=f"doctor session {found.session.session_id}, {found.how}: feedscope's "
            f"DataLoader gave {figure.cell} images/s at num_workers={figure.num_workers}, read "
            f"{figure.read}",
            predicted_images_per_s=figure.images_per_s,
            prefetch_factor=prefetch,
        )
    else:
        base = TorchSetting(
            num_workers=int(loader.get("num_workers") or 0),
            source=f"the job's own, not measured for the recipe: `probe doctor --like "
            f"{document.run_id}` measures it",
            prefetch_factor=prefetch,
        )
    if workers is None:
        return base
    return TorchSetting(
        num_workers=workers,
        source=f"given on the command line (the measured setting: {base.source})",
        prefetch_factor=prefetch,
    )
