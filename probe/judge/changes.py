"""Recommendations and what each changes: a knob and its value (`Change`), from which the exact
setting people read is written (`Change.setting`: "num_workers=12", "DALI decoder=mixed
num_threads=8"). A change with no knob sets nothing in the pipeline: "no change", "measure
again", "storage".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Knob(str, Enum):
    NUM_WORKERS = "num_workers"  # DataLoader
    NUM_THREADS = "num_threads"  # DALI
    PIPELINE = "pipeline"  # a migration to DALI, with its decoder and threads
    PERSISTENT_WORKERS = "persistent_workers"
    SAMPLER = "sampler"
    EPOCH_LENGTH = "epoch_length"  # a multiple of today's epoch
    PIN_MEMORY = "pin_memory"
    OUTPUT_DTYPE = "output_dtype"
    HW_DECODER_LOAD = "hw_decoder_load"  # DALI's share of JPEGs sent to the hardware decoder
    RECIPE = "recipe"  # feedscope's DataLoader recipe, written for the job, at its num_workers


@dataclass(frozen=True)
class DaliPipeline:
    """The DALI pipeline a migration moves to."""

    decoder: str  # "mixed" or "cpu"
    num_threads: int
    # the share of JPEGs `mixed` sends to the hardware decoder (None: cpu, or DALI's default)
    hw_decoder_load: float | None = None

    @property
    def setting(self) -> str:
        """ "DALI decoder=mixed num_threads=4 hw_decoder_load=0.9", as a change writes it."""
        text = f"DALI decoder={self.decoder} num_threads={self.num_threads}"
        return (
            text
            if self.hw_decoder_load is None
            else f"{text} hw_decoder_load={self.hw_decoder_load:g}"
        )

    @property
    def code(self) -> str:
        """The change as code: `pipelines.DaliOptions`, and the calls of a DALI pipeline of
        one's own."""
        load = "" if self.hw_decoder_load is None else f", hw_decoder_load={self.hw_decoder_load:g}"
        return (
            f"DaliOptions(num_threads={self.num_threads}, decoder=Decoder.{self.decoder.upper()}"
            f"{load}); in a pipeline of your own: @pipeline_def(num_threads={self.num_threads}, "
            f'...) and fn.decoders.image(..., device="{self.decoder}"{load})'
        )


Value = int | float | bool | str | DaliPipeline | None

_TEXT = {
    Knob.NUM_WORKERS: "num_workers={}",
    Knob.NUM_THREADS: "DALI num_threads={}",
    Knob.PERSISTENT_WORKERS: "persistent_workers={}",
    Knob.SAMPLER: "sampler={}",
    Knob.EPOCH_LENGTH: "epoch_length={}x",
    Knob.PIN_MEMORY: "pin_memory={}",
    Knob.OUTPUT_DTYPE: "output_dtype={}",
    Knob.HW_DECODER_LOAD: "DALI hw_decoder_load={}",
    Knob.RECIPE: "feedscope's DataLoader recipe num_workers={}",
}


@dataclass(frozen=True)
class Change:
    """One exact change. Without a knob, `value` says what to do instead of setting one."""

    knob: Knob | None
    value: Value = None

    @property
    def setting(self) -> str:
        """The change as people write it: 'num_workers=12', 'DALI decoder=mixed
        num_threads=8', 'no change'."""
        if self.knob is None:
            return str(self.value)
        if self.knob is Knob.PIPELINE:
            assert isinstance(self.value, DaliPipeline)
            return self.value.setting
        return _TEXT[self.knob].format(self.value)

    def to_json(self) -> dict[str, Any]:
        value = self.value
        if isinstance(value, DaliPipeline):
            written = {k: v for k, v in vars(value).items() if v is not None}
            return {"knob": Knob.PIPELINE.value, "value": written}
        return {"knob": None if self.knob is None else self.knob.value, "value": value}

    @classmethod
    def parse(cls, setting: str) -> Change:
        """The change a `setting` text writes (the inverse of `setting`); a text no knob writes
        is a change of no knob, as "no change" is."""
        words = dict(part.split("=", 1) for part in setting.split()[1:] if "=" in part)
        if setting.startswith("DALI decoder=") and "num_threads" in words:
            load = words.get("hw_decoder_load")
            return to_dali(
                words["decoder"], int(words["num_threads"]), None if load is None else float(load)
            )
        for knob, text in _TEXT.items():
            head, _, tail = text.partition("{}")
            if setting.startswith(head) and setting.endswith(tail) and len(setting) > len(head):
                raw = setting[len(head) : len(setting) - len(tail)]
                return cls(knob, _value(raw))
        return cls(None, setting)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Change:
        knob = None if data["knob"] is None else Knob(data["knob"])
        value = data["value"]
        if knob is Knob.PIPELINE:
            value = DaliPipeline(**value)
        return cls(knob, value)


NO_CHANGE = Change(None, "no change")
MEASURE_AGAIN = Change(None, "measure again")
STORAGE = Change(None, "storage")


def workers(count: int) -> Change:
    return Change(Knob.NUM_WORKERS, count)


def to_dali(decoder: str, num_threads: int, hw_decoder_load: float | None = None) -> Change:
    """A move to DALI; `hw_decoder_load` is kept for the `mixed` decoder alone."""
    load = hw_decoder_load if decoder == "mixed" else None
    return Change(Knob.PIPELINE, DaliPipeline(decoder, num_threads, load))


def _value(text: str) -> Value:
    """A setting's value as written: a bool, a whole number, a number, else the text."""
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class Recommendation:
    """A change, ranked by the images/s it is predicted to give, and how that was predicted."""

    action: str  # what to do, in words
    change: Change
    predicted_images_per_s: float | None
    basis: str  # how the prediction was made: measured (where), or estimated (how)
    measured_images_per_s: float | None = None  # once verified by running it
    notes: tuple[str, ...] = ()  # what it frees and costs, or why not more
    predicted_error: float | None = None  # of a prediction measured: its 95% half-width

    @property
    def setting(self) -> str:
        """The exact change, e.g. "num_workers=12"."""
        return self.change.setting

    def to_json(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "setting": self.setting,
            "predicted_images_per_s": self.predicted_images_per_s,
            "basis": self.basis,
            "measured_images_per_s": self.measured_images_per_s,
            "notes": list(self.notes),
            "predicted_error": self.predicted_error,
            "change": self.change.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Recommendation:
        """A recommendation from its JSON (one written before "change" was: its setting, as
        a change of no knob)."""
        change = data.get("change")
        return cls(
            action=data["action"],
            change=Change.parse(data["setting"]) if change is None else Change.from_json(change),
            predicted_images_per_s=data["predicted_images_per_s"],
            basis=data["basis"],
            measured_images_per_s=data.get("measured_images_per_s"),
            notes=tuple(data.get("notes", ())),
            predicted_error=data.get("predicted_error"),
        )
