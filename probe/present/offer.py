"""The offer of `probe migrate RUN` where DALI is the answer for a watched DataLoader, with the
one line of the user's script to change: the same words at exit, in `probe show`, on the Run
page and in the reports."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from probe.judge.changes import Knob, Recommendation
from probe.store.documents import RunDocument

MODULE = "dali_loader"  # the written module's default name


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
    made = f" (where {script_of(document)} makes `{name}`" + (
        f", iterated at line {recipe['line']})" if recipe.get("line") else ")"
    )
    return (
        f"change one line{made}: `{name} = {module}.loader()`, with `import {module}` beside it "
        f"(the module next to {script_of(document)})"
    )


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
    """Where DALI is the answer (the first change) for a watched DataLoader that recorded what
    it is: the command that writes its DALI loader, and the line to change; else None."""
    spec = document.config.get("spec", {})
    if document.kind != "watch" or document.pipeline != "torch" or not spec.get("recipe"):
        return None
    if not recommendations or recommendations[0].change.knob is not Knob.PIPELINE:
        return None
    return MigrateOffer(
        f"probe migrate {document.run_id} -o {MODULE}.py", change_line(document, MODULE)
    )
