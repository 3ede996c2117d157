"""The offer of `probe migrate RUN` where DALI or feedscope's DataLoader recipe is the answer
for a watched DataLoader, with the one line of the user's script to change: the same words at
exit, in `probe show`, on the Run page and in the reports."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines import InputError
from probe.fix.dali import DaliSetting, Unmovable, dali_module
from probe.fix.dataloader import TorchSetting, torch_module
from probe.fix.tune import Job
from probe.judge.changes import Knob, Recommendation
from probe.store.documents import RunDocument


def origin_of(document: RunDocument) -> str:
    """Which loader of which job the module replaces, as its header says."""
    label = document.label or ""
    which = f" ({label.split(' (', 1)[1]}" if " (" in label else ""
    return f"run {document.run_id} of {script_of(document)}{which}"


def script_of(document: RunDocument) -> str:
    """The watched script's file name: from the command the run recorded (`probe watch --`),
    else its label (named after the script unless `--name` named it: `train.py`, `train.py
    (loader 2)`)."""
    argv = (document.config.get("command") or {}).get("argv") or []
    script = next((Path(str(word)).name for word in argv if str(word).endswith(".py")), None)
    return script or (document.label or "train.py").split(" (")[0]


def rerun_text(document: RunDocument, module: str) -> str:  # `module`: the written file
    """How to run the job with the module in place of its loader before a line changes
    (`probe watch --loader`), where the run recorded its command; else how to watch it after."""
    job = _job(document)
    if job is None:
        return f"then check it on the job itself: `probe watch -- python {script_of(document)} ...`"
    launch = f"torchrun --nproc-per-node={job.ranks} -m " if job.ranks > 1 else ""
    return (
        f"try it on the job before a line changes: `{launch}probe watch --loader {module} -- "
        f"{shlex.join(job.argv)}`"
    )


def _job(document: RunDocument) -> Job | None:
    """The watched job as it can run again here (None: it cannot: no command recorded, several
    nodes, not a DataLoader)."""
    try:
        return Job.of(document)
    except InputError:
        return None


def change_line(document: RunDocument, module: str, original: bool = False) -> str:
    """The one change to the user's script: where its loader is made, the module's instead;
    or where the module keeps steps of the job's own (`original`), a line after it that gives
    the module the job's loader."""
    recipe = document.config.get("spec", {}).get("recipe") or {}
    name = recipe.get("variable") or "loader"
    where = ""
    if recipe.get("line"):
        where = f", iterated at {Path(str(recipe.get('file') or '')).name}:{recipe['line']}"
    beside = f"with `import {module}` beside it (the module next to {script_of(document)})"
    if original:
        return (
            f"add one line after the one where {script_of(document)} makes `{name}`{where}: "
            f"`{name} = {module}.loader(original={name})`, {beside}"
        )
    return (
        f"change one line (where {script_of(document)} makes `{name}`{where}): "
        f"`{name} = {module}.loader()`, {beside}"
    )


def module_name(document: RunDocument, prefix: str = "dali") -> str:
    """The written module's default name: after the loader's name in the script
    (`dali_train_loader`, `torch_train_loader`), so that a script's loaders get one each."""
    recipe = document.config.get("spec", {}).get("recipe") or {}
    name = str(recipe.get("variable") or "")
    return f"{prefix}_{name}" if name.isidentifier() else f"{prefix}_loader"


@dataclass(frozen=True)
class MigrateOffer:
    """The command that writes a watched loader's module, what it writes, and the line to
    change; and `probe tune RUN`, where the job can run again, to measure it on the job first."""

    command: str
    change: str
    what: str = "DALI"
    tune: str | None = None

    @property
    def lines(self) -> list[str]:
        lines = [f"{self.what} written for this loader: `{self.command}`", self.change]
        return lines + ([self.tune] if self.tune else [])


def tune_line(document: RunDocument, tuned: str | None = None) -> str | None:
    """`probe tune RUN`, offered for a watched job that recorded how to run it again; where a
    tune session measured it already (`tuned`, `tune_told`'s), what it measured instead."""
    if tuned is not None:
        return tuned
    if _job(document) is None:
        return None
    return (
        f"measure it on your job itself before a line changes: `probe tune {document.run_id}` "
        "(each candidate loader swapped in, the script unchanged)"
    )


def migrate_offer(
    document: RunDocument, recommendations: Sequence[Recommendation], tuned: str | None = None
) -> MigrateOffer | None:
    """Where DALI or feedscope's DataLoader recipe is the answer (the first change) for a
    watched DataLoader whose recorded recipe can be written (nothing of it refused): the command
    that writes its loader, and the line to change; else None."""
    spec = document.config.get("spec", {})
    recipe = spec.get("recipe")
    if document.kind != "watch" or document.pipeline != "torch" or not recipe:
        return None
    knob = recommendations[0].change.knob if recommendations else None
    try:
        if knob is Knob.PIPELINE:
            dali_module(recipe, DaliSetting(num_threads=1, hw_decoder_load=0.0), "")
            module = module_name(document)
            return MigrateOffer(
                f"probe migrate {document.run_id} -o {module}.py",
                change_line(document, module),
                tune=tune_line(document, tuned),
            )
        if knob is Knob.RECIPE:
            written = torch_module(recipe, TorchSetting(num_workers=0), "")
            module = module_name(document, "torch")
            return MigrateOffer(
                f"probe migrate {document.run_id} --to dataloader -o {module}.py",
                change_line(document, module, original=bool(written.keeps)),
                "feedscope's DataLoader recipe",
                tune_line(document, tuned),
            )
    except Unmovable:
        return None
    return None


def offer_lines(
    document: RunDocument, recommendations: Sequence[Recommendation], tuned: str | None = None
) -> list[str]:
    """What is offered after a watched loader's answer: the module that writes its fix and the
    line to change, with `probe tune`; or where the first change is one of the job's own
    settings (its num_workers), `probe tune` alone."""
    offer = migrate_offer(document, recommendations, tuned)
    if offer is not None:
        return offer.lines
    knob = recommendations[0].change.knob if recommendations else None
    tune = tune_line(document, tuned)
    return [tune] if (knob is not None or tuned) and tune else []
