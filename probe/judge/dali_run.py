"""The doctor's DALI, typed: each setting its search measured (`DaliTried`), the one it chose
(`DaliRun`, whose figures are that setting's run), what holds DALI there, and the cores it frees
against the DataLoader (`CoresFreed`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from probe.judge.changes import Change, DaliPipeline
from probe.judge.dali_model import DaliPoint

# What holds a DALI setting, as the search names it from its run's verdict.
HELD_BY_THREADS = "its CPU threads"
HELD_BY_DECODER = "the hardware decoder"
HELD_BY_SMS = "the SMs"
HELD_BY_NOTHING = "nothing: the consumer sets the pace"


@dataclass(frozen=True)
class CoresFreed:
    """What moving to DALI does to the CPU: the cores the DataLoader's `setting` used, DALI's,
    and the cores the run may use."""

    setting: str  # the DataLoader setting compared: "num_workers=16"
    dataloader_cores: float
    dali_cores: float
    available_cores: float

    @property
    def freed(self) -> float:
        return self.dataloader_cores - self.dali_cores

    @property
    def share(self) -> float:
        """The cores freed, as a share of those the run may use."""
        return self.freed / self.available_cores if self.available_cores > 0 else 0.0

    @property
    def text(self) -> str:
        """ "frees 11.2 of 16 cores (the DataLoader at num_workers=16 used 15.2, DALI 4.0)"."""
        verb = (
            f"frees {self.freed:.1f} of {self.available_cores:g} cores"
            if self.freed >= 0
            else f"uses {-self.freed:.1f} more cores"
        )
        return (
            f"{verb} (the DataLoader at {self.setting} used {self.dataloader_cores:.1f}, DALI "
            f"{self.dali_cores:.1f})"
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "freed": self.freed, "share": self.share}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CoresFreed:
        return cls(
            data["setting"], data["dataloader_cores"], data["dali_cores"], data["available_cores"]
        )


@dataclass(frozen=True)
class DaliTried:
    """One DALI setting the doctor's search measured: why it was chosen, what the search
    predicted for it, and what it measured (per GPU: the worst lane's figures, images/s for the
    run's lanes together as `DaliRun`'s)."""

    pipeline: DaliPipeline
    why: str  # why the search measured it: "DALI's defaults", or what the model read
    predicted_images_per_s: float | None  # the search's prediction (None: its first point)
    images_per_s: float | None = None  # None: not judged (`reason` says why)
    images_per_s_error: float | None = None
    run_id: str | None = None
    reason: str | None = None
    nvjpg_pct: float | None = None  # the hardware JPEG decoder's busy share
    threads_cpu_pct: float | None = None  # DALI's threads' CPU (the lane's less its main thread)
    step_slowed: float | None = None  # the step against the consumer alone (0.3: 30% slower)
    data_wait_frac: float | None = None
    holds: str | None = None  # what held it (`HOLDS`' values)
    lane_images_per_s: float | None = None  # its worst lane's, as the search's model reads it
    main_cpu_pct: float | None = None  # that lane's training loop thread
    cpu_pct: float | None = None  # the run's lanes' CPU, % of one core
    host_busy: bool = False  # other processes took enough CPU to move it

    @property
    def point(self) -> DaliPoint | None:
        """What it tells the search's model (None: not judged)."""
        if not self.lane_images_per_s:
            return None
        return DaliPoint(
            self.pipeline,
            self.lane_images_per_s,
            self.threads_cpu_pct,
            self.main_cpu_pct,
            self.nvjpg_pct,
            self.step_slowed,
        )

    @property
    def setting(self) -> str:
        return self.pipeline.setting

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["pipeline"] = vars(self.pipeline).copy()
        return {**out, "setting": self.setting}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DaliTried:
        values = {k: v for k, v in data.items() if k != "setting"}
        return cls(**{**values, "pipeline": DaliPipeline(**data["pipeline"])})


@dataclass(frozen=True)
class DaliRun:
    """The doctor's DALI: the setting its search chose (its figures are that setting's run), or
    why there is none; every setting it measured; what holds DALI there; where DALI does not
    help, the advice that says so."""

    decoder: str  # "mixed" or "cpu"
    num_threads: int
    images_per_s: float | None = None
    images_per_s_error: float | None = None
    run_id: str | None = None
    data_wait_frac: float | None = None
    host_busy: bool = False
    reason: str | None = None  # why it has no images/s, or is not judged
    advice: str | None = None
    cpu_pct: float | None = None  # its lanes' CPU, in % of one core
    freed: CoresFreed | None = None  # against the DataLoader setting it was compared with
    hw_decoder_load: float | None = None  # mixed: the share of JPEGs to the hardware decoder
    tried: tuple[DaliTried, ...] = ()  # the search's points, in the order measured
    holds: str | None = None  # what holds DALI at this setting, with its evidence
    not_searched: str | None = None  # what the search left alone, and why

    @property
    def change(self) -> Change:
        """The migration to the pipeline it ran."""
        return Change.parse(self.pipeline.setting)

    @property
    def pipeline(self) -> DaliPipeline:
        load = self.hw_decoder_load if self.decoder == "mixed" else None
        return DaliPipeline(self.decoder, self.num_threads, load)

    @property
    def judged(self) -> bool:
        """Whether it measured images/s well enough to compare."""
        return bool(self.images_per_s) and self.reason is None

    @property
    def first(self) -> DaliTried | None:
        """The search's first point, where it measured more than one: the setting it started
        from (DALI's defaults, or the one asked for), against which tuning is told."""
        return self.tried[0] if len(self.tried) > 1 and self.tried[0].images_per_s else None

    @property
    def gain(self) -> float | None:
        """The chosen setting against the first point (0.8: 80% faster); None where the
        search measured one setting."""
        first = self.first
        if first is None or not self.images_per_s or not first.images_per_s:
            return None
        return self.images_per_s / first.images_per_s - 1

    @property
    def remedy(self) -> str | None:
        """What would lift what holds it, first (None: nothing holds it, or not known)."""
        share = self.hw_decoder_load
        larger = self.decoder == "mixed" and share is not None and share < 1
        if self.holds == HELD_BY_THREADS:
            if larger:
                return "a larger hw_decoder_load (fewer JPEGs on the threads), then more threads"
            return "more threads, up to the cores it may use, or more cores"
        if self.holds == HELD_BY_DECODER:
            return "a smaller hw_decoder_load, where the threads have room"
        if self.holds == HELD_BY_SMS:
            if larger:
                return "a larger hw_decoder_load (fewer JPEGs decoded on the SMs)"
            return "the cpu decoder, where the cores can keep up"
        return None

    def chosen(self, point: DaliTried) -> DaliRun:
        """This run with `point`'s setting and figures."""
        pipeline = point.pipeline
        return replace(
            self,
            decoder=pipeline.decoder,
            num_threads=pipeline.num_threads,
            hw_decoder_load=pipeline.hw_decoder_load,
            images_per_s=point.images_per_s,
            images_per_s_error=point.images_per_s_error,
            run_id=point.run_id,
            data_wait_frac=point.data_wait_frac,
            cpu_pct=point.cpu_pct,
            host_busy=point.host_busy,
        )

    def to_json(self) -> dict[str, Any]:
        out = {
            "images_per_s": self.images_per_s,
            "images_per_s_error": self.images_per_s_error,
            "setting": self.change.setting,
            "run_id": self.run_id,
            "data_wait_frac": self.data_wait_frac,
            "host_busy": self.host_busy,
            "reason": self.reason,
            "cpu_pct": self.cpu_pct,
            "freed": None if self.freed is None else self.freed.to_json(),
            "tried": [point.to_json() for point in self.tried],
            "holds": self.holds,
            "not_searched": self.not_searched,
            "code": self.pipeline.code,
        }
        return out if self.advice is None else {**out, "advice": self.advice}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DaliRun:
        # its setting is "DALI decoder=D num_threads=N[ hw_decoder_load=L]"
        words = dict(part.split("=", 1) for part in str(data["setting"]).split()[1:])
        load = words.get("hw_decoder_load")
        return cls(
            decoder=words["decoder"],
            num_threads=int(words["num_threads"]),
            hw_decoder_load=None if load is None else float(load),
            images_per_s=data["images_per_s"],
            images_per_s_error=data.get("images_per_s_error"),
            run_id=data.get("run_id"),
            data_wait_frac=data.get("data_wait_frac"),
            host_busy=bool(data.get("host_busy", False)),
            reason=data.get("reason"),
            advice=data.get("advice"),
            cpu_pct=data.get("cpu_pct"),
            freed=None if data.get("freed") is None else CoresFreed.from_json(data["freed"]),
            tried=tuple(DaliTried.from_json(point) for point in data.get("tried", ())),
            holds=data.get("holds"),
            not_searched=data.get("not_searched"),
        )
