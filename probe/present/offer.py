"""The offer of `probe migrate RUN` where DALI is the answer for a watched DataLoader, with the
one line of the user's script to change: the same words at exit, in `probe show`, on the Run
page and in the reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from probe.judge.changes import Knob, Recommendation
from probe.present.migrate import DaliSetting, Unmovable, dali_module
from probe.store.documents import RunDocument

MODULE = "dali_loader"  # the written module's name where the loader's is not known


def origin_of(document: RunDocument) -> str:
    """Which loader of which job the module replaces, as its header says."""
    label = document.label or ""
    which = f" ({label.split(' (', 1)[1]}" if " (" in label else ""
    return f"run {document.run_id} of {script_of(document)}{which}"


def script_of(document: RunDocument) -> str:
    """The watched script's name (its run's label names it: `train.py`, `train.py (loader 2)`)."""
    return (document.label or "train.py").split(" (")[0]


def change_line(document: RunDocument, module: str) -> str:
    """The one change to the user's script: where its loader is made, the module's instead."""
    recipe = document.config.get("spec", {}).get("recipe") or {}
    name = recipe.get("variable") or "loader"
    where = ""
    if recipe.get("line"):
        where = f", iterated at {Path(str(recipe.get('file') or '')).name}:{recipe['line']}"
    return (
        f"change one line (where {script_of(document)} makes `{name}`{where}): "
        f"`{name} = {module}.loader()`, with `import {module}` beside it (the module next to "
        f"{script_of(document)})"
    )


def module_name(document: RunDocument) -> str:
    """The written module's default name: after the loader's name in the script
    (`dali_train_loader`), so that a script's loaders get one each."""
    recipe = document.config.get("spec", {}).get("recipe") or {}
    name = str(recipe.get("variable") or "")
    return f"dali_{name}" if name.isidentifier() else MODULE


@dataclass(frozen=True)
class MigrateOffer:
    """The command that writes a watched loader's DALI module, and the line to change."""

    command: str
    change: str

    @property
    def lines(self) -> list[str]:
        return [f"DALI written for this loader: `{self.command}`", self.change]


def migrate_offer(
    document: RunDocument, recommendations: Sequence[Recommendation]
) -> MigrateOffer | None:
    """Where DALI is the answer (the first change) for a watched DataLoader whose recorded
    recipe can be written (`dali_module` refuses nothing of it): the command that writes its
    DALI loader, and the line to change; else None."""
    spec = document.config.get("spec", {})
    recipe = spec.get("recipe")
    if document.kind != "watch" or document.pipeline != "torch" or not recipe:
        return None
    if not recommendations or recommendations[0].change.knob is not Knob.PIPELINE:
        return None
    try:
        dali_module(recipe, DaliSetting(num_threads=1, hw_decoder_load=0.0), "")
    except Unmovable:
        return None
    module = module_name(document)
    return MigrateOffer(
        f"probe migrate {document.run_id} -o {module}.py", change_line(document, module)
    )
