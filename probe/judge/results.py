"""A sweep's or a doctor's result, typed: `Session` holds its measured points in one field
(`points`) whichever it was, with its knee, what it skipped, and for the doctor its verdict,
recommendations, DALI run, epoch reading and verification.

`Session.to_json()` is the stored and printed document (`feedscope.sweep/1`: its points under
"points"; `feedscope.doctor/1`: under "sweep"); `Session.from_json` and `read_session` read
either back, so that readers need not tell the schemas apart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from enum import Enum
from typing import Any

from pipelines import InputError
from probe.judge.changes import Change, Recommendation, workers
from probe.judge.dali_run import DaliRun
from probe.judge.knee import SweepAnalysis, SweepPoint
from probe.judge.model import Curve
from probe.judge.verdicts import Verdict
from probe.lane_figures import EpochStartCost
from probe.metrics import IMAGES_PER_S, against
from probe.records import RunStatus
from probe.steady import Estimate, margin, pooled
from probe.store.db import Store

TORCH, DALI = "torch", "dali"  # a scaling point's pipeline
NOT_VERIFIED = "not verified"  # where a doctor's reason says why it did not verify
SWEEP_SCHEMA = "feedscope.sweep/1"
DOCTOR_SCHEMA = "feedscope.doctor/1"


class SessionKind(str, Enum):
    SWEEP = "sweep"
    DOCTOR = "doctor"


@dataclass(frozen=True)
class Skipped:
    """A setting a session did not measure, and why."""

    setting: int
    reason: str


@dataclass(frozen=True)
class EpochsRun:
    """Your setting read epoch by epoch, against the same setting read as one stream; or why
    it was not read so."""

    num_workers: int
    batches_per_epoch: int
    persistent_workers: bool
    stream_images_per_s: float
    reason: str | None
    run_id: str | None = None
    images_per_s: float | None = None
    images_per_s_error: float | None = None
    cost_frac: float | None = None  # of the stream's images/s
    epoch_start: EpochStartCost | None = None

    def against(self, stream: float) -> EpochsRun:
        """Read against `stream`, the same setting read as one stream at its figure in the
        answer (its first run's, until the answer weighs another)."""
        cost = None if self.images_per_s is None or not stream else 1 - self.images_per_s / stream
        return replace(self, stream_images_per_s=stream, cost_frac=cost)

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": workers(self.num_workers).setting,
            "batches_per_epoch": self.batches_per_epoch,
            "persistent_workers": self.persistent_workers,
            "run_id": self.run_id,
            "images_per_s": self.images_per_s,
            "images_per_s_error": self.images_per_s_error,
            "stream_images_per_s": self.stream_images_per_s,
            "cost_frac": self.cost_frac,
            "epoch_start": None if self.epoch_start is None else asdict(self.epoch_start),
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EpochsRun:
        start = data.get("epoch_start")
        return cls(
            num_workers=int(data["setting"].split("=")[1]),
            batches_per_epoch=data["batches_per_epoch"],
            persistent_workers=data["persistent_workers"],
            stream_images_per_s=data["stream_images_per_s"],
            reason=data.get("reason"),
            run_id=data.get("run_id"),
            images_per_s=data.get("images_per_s"),
            images_per_s_error=data.get("images_per_s_error"),
            cost_frac=data.get("cost_frac"),
            epoch_start=None if start is None else EpochStartCost(**start),
        )


@dataclass(frozen=True)
class InTurn:
    """One run of yours or of a candidate, measured in turn with the other: after a
    verification disagreed, or yours beside a DALI verification."""

    setting: str  # "num_workers=8", "DALI decoder=mixed num_threads=8"
    images_per_s: float
    images_per_s_error: float | None
    run_id: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> InTurn:
        return cls(
            data["setting"], data["images_per_s"], data.get("images_per_s_error"), data["run_id"]
        )


def pooled_in_turn(runs: Sequence[InTurn], setting: str) -> Estimate | None:
    """A setting's runs in turn pooled (None: none of them)."""
    mine = [Estimate(r.images_per_s, r.images_per_s_error, 0) for r in runs if r.setting == setting]
    return pooled(mine) if mine else None


IN_ALTERNATION = "measured in alternation"  # how the basis of a figure the pairs measured starts


def alternation_source(run_ids: Sequence[str]) -> str:
    """Whose a setting's figure in alternation is: "its run in alternation, 2026..." or "the
    mean of its 3 runs in alternation"."""
    if len(run_ids) == 1:
        return f"its run in alternation, {run_ids[0]}"
    return f"the mean of its {len(run_ids)} runs in alternation"


def in_alternation(
    recommendations: Sequence[Recommendation], verify: Verification | None
) -> tuple[Recommendation, ...]:
    """The recommendations with each setting that the verification measured in alternation,
    in pairs, at its runs there pooled: the figure the answer weighs. Its first figure (its run
    in the sweep or DALI's search) is said in its basis as that run's, and it has no measured
    figure of its own: the pairs are the check, told once, by the verification, against the
    first figure, which is not part of the pool."""
    if verify is None or not verify.pairs:
        return tuple(recommendations)
    out = []
    for item in recommendations:
        runs = verify.pooled(item.setting)
        if runs is None:
            out.append(item)
            continue
        basis = item.basis
        if not basis.startswith(IN_ALTERNATION):
            others = sorted({r.setting for r in verify.in_turn} - {item.setting})
            count = sum(r.setting == item.setting for r in verify.in_turn)
            mean = "its run" if count == 1 else f"the mean of its {count} runs"
            first = IMAGES_PER_S.text(item.predicted_images_per_s, item.predicted_error)
            basis = f"{IN_ALTERNATION} with {', '.join(others)}, {mean} (first {first}, {basis})"
        out.append(
            replace(
                item,
                predicted_images_per_s=runs.value,
                predicted_error=runs.error,
                measured_images_per_s=None,
                basis=basis,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class Verification:
    """The first recommendation run again: what it predicted, what it measured, and whether
    the two agree within their errors and the drift between runs. Where they do not, yours
    and the candidate measured in turn (`in_turn`), and what the answer became (`outcome`)."""

    change: Change
    predicted_images_per_s: float
    predicted_images_per_s_error: float | None
    measured_images_per_s: float
    measured_images_per_s_error: float | None
    agrees: bool
    host_busy: bool
    run_id: str
    in_turn: tuple[InTurn, ...] = ()
    outcome: str | None = None  # where it disagreed: what the answer became, and why
    precise: bool = True  # its images/s known within the precision asked
    # the other setting in turn over `ratio_over` (the one that changes less), from adjacent
    # pairs, or where there were none (`pairs` 0), from the two's first measurements
    ratio: float | None = None
    ratio_error: float | None = None
    ratio_over: str | None = None

    @property
    def run_ids(self) -> tuple[str, ...]:
        """The runs its measured figure is of: its runs in turn pooled, else its one run."""
        mine = tuple(item.run_id for item in self.in_turn if item.setting == self.change.setting)
        return mine or (self.run_id,)

    def pooled(self, setting: str) -> Estimate | None:
        """A setting's runs in turn pooled (None: it was not measured in turn)."""
        return pooled_in_turn(self.in_turn, setting)

    @property
    def pairs(self) -> int:
        """The pairs measured in turn."""
        return len(self.in_turn) // 2

    @property
    def error_frac(self) -> float | None:
        return against(self.measured_images_per_s, self.predicted_images_per_s)

    @property
    def verified(self) -> bool:
        """Whether it bears its prediction out: measured within the precision asked, and
        agreeing within their errors and the drift (else it was "measured again")."""
        return self.agrees and self.precise

    def to_json(self) -> dict[str, Any]:
        return {
            "setting": self.change.setting,
            "predicted_images_per_s": self.predicted_images_per_s,
            "predicted_images_per_s_error": self.predicted_images_per_s_error,
            "measured_images_per_s": self.measured_images_per_s,
            "measured_images_per_s_error": self.measured_images_per_s_error,
            "error_frac": self.error_frac,
            "agrees": self.agrees,
            "host_busy": self.host_busy,
            "run_id": self.run_id,
            "in_turn": [item.to_json() for item in self.in_turn],
            "outcome": self.outcome,
            "precise": self.precise,
            "verified": self.verified,
            "run_ids": list(self.run_ids),
            "ratio": self.ratio,
            "ratio_error": self.ratio_error,
            "ratio_over": self.ratio_over,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], change: Change) -> Verification:
        return cls(
            change=change,
            predicted_images_per_s=data["predicted_images_per_s"],
            predicted_images_per_s_error=data.get("predicted_images_per_s_error"),
            measured_images_per_s=data["measured_images_per_s"],
            measured_images_per_s_error=data.get("measured_images_per_s_error"),
            agrees=bool(data.get("agrees", False)),  # older documents lack it
            host_busy=bool(data.get("host_busy", False)),
            run_id=data["run_id"],
            in_turn=tuple(InTurn.from_json(item) for item in data.get("in_turn", ())),
            outcome=data.get("outcome"),
            precise=bool(data.get("precise", True)),  # older documents lack it
            ratio=data.get("ratio"),
            ratio_error=data.get("ratio_error"),
            ratio_over=data.get("ratio_over"),
        )


@dataclass(frozen=True)
class Shown:
    """A setting's figure as a doctor's pages show it, and what it is of: its runs in
    alternation pooled where the pairs measured it (the figures its answer weighed), else its
    one run."""

    images_per_s: float
    error: float | None
    run_ids: tuple[str, ...]

    @property
    def source(self) -> str:
        """'run 2026...' or 'the mean of its 5 runs in alternation'."""
        if len(self.run_ids) == 1:
            return f"run {self.run_ids[0]}"
        return alternation_source(self.run_ids)

    @property
    def text(self) -> str:
        return IMAGES_PER_S.text(self.images_per_s, self.error)


@dataclass(frozen=True)
class ScalePoint:
    """One pipeline on `gpus` GPUs: its setting, the job's images/s predicted, and measured
    where it was."""

    gpus: int
    pipeline: str  # "torch" or "dali"
    setting: str  # "num_workers=8", "DALI decoder=mixed num_threads=4" (per GPU)
    predicted_images_per_s: float | None  # the job's
    measured_images_per_s: float | None = None
    measured_images_per_s_error: float | None = None
    run_id: str | None = None
    fitted: bool = False  # the prediction rests on this point's own run: no check of it

    @property
    def images_per_s(self) -> float | None:
        """What the job gives: measured where it was, else predicted."""
        measured = self.measured_images_per_s
        return measured if measured is not None else self.predicted_images_per_s

    @property
    def error_frac(self) -> float | None:
        """Measured against predicted (None: one of them missing, or the prediction made from
        this very run)."""
        if self.fitted or self.measured_images_per_s is None:
            return None
        return against(self.measured_images_per_s, self.predicted_images_per_s)

    @property
    def missed(self) -> bool:
        """Whether it measured apart from its prediction beyond its error and the drift
        between runs: the prediction is refuted, and the measured figure stands."""
        if self.error_frac is None or self.measured_images_per_s is None:
            return False
        assert self.predicted_images_per_s is not None
        measured = Estimate(self.measured_images_per_s, self.measured_images_per_s_error, 0)
        predicted = Estimate(self.predicted_images_per_s, None, 0)
        gap = abs(self.measured_images_per_s - self.predicted_images_per_s)
        return gap > margin(measured, 1.0, predicted, drift=True)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "error_frac": self.error_frac, "missed": self.missed}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScalePoint:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class Scaling:
    """A pipeline's rate on 1 to `lanes` GPUs of one host, and the cores per GPU it needs."""

    lanes: int  # the GPUs the doctor ran on
    cores: float  # the cores the job may use on the host
    device: str  # "GPU", or "lane" on the CPU
    points: tuple[ScalePoint, ...]
    consumer_images_per_s: float | None = None  # the consumer alone, per GPU
    torch_cpu_ms: float | None = None  # the DataLoader's CPU per image (workers and training)
    dali_cpu_ms: float | None = None  # DALI's, its threads and the training process
    other_cores: float = 0.0  # other processes' load on the host's cores
    unchecked: str | None = None  # why GPU counts below N were not measured

    def at(self, pipeline: str, gpus: int) -> ScalePoint | None:
        return next((p for p in self.points if p.pipeline == pipeline and p.gpus == gpus), None)

    def cpu_ms(self, pipeline: str) -> float | None:
        """`pipeline`'s CPU ms per image."""
        return self.torch_cpu_ms if pipeline == TORCH else self.dali_cpu_ms

    def cores_needed(self, pipeline: str) -> float | None:
        """The cores per GPU `pipeline` needs to keep up with the consumer alone."""
        cpu_ms = self.cpu_ms(pipeline)
        if cpu_ms is None or not self.consumer_images_per_s:
            return None
        return self.consumer_images_per_s * cpu_ms / 1000

    def feeds(self, pipeline: str) -> float | None:
        """How many GPUs' worth the host's cores (less the other processes') feed at the
        consumer's rate with `pipeline` (None: not known)."""
        need = self.cores_needed(pipeline)
        if not need:
            return None
        return max(0.0, self.cores - self.other_cores) / need

    def gpus_fed(self, pipeline: str) -> int | None:
        """The whole GPUs `feeds` (None: not known)."""
        fed = self.feeds(pipeline)
        return None if fed is None else math.floor(fed)

    def measured(self, pipeline: str) -> list[ScalePoint]:
        return [p for p in self.points if p.pipeline == pipeline and p.measured_images_per_s]

    def with_measured(
        self,
        pipeline: str,
        gpus: int,
        rate: float,
        error: float | None,
        run_id: str,
        fitted: bool = False,
    ) -> Scaling:
        """The same, with `pipeline` on `gpus` GPUs measured (`fitted`: by the run its
        prediction rests on)."""
        points = tuple(
            replace(p, measured_images_per_s=rate, measured_images_per_s_error=error,
                    run_id=run_id, fitted=fitted)
            if p.pipeline == pipeline and p.gpus == gpus else p
            for p in self.points
        )  # fmt: skip
        return replace(self, points=points)

    def with_point(self, point: ScalePoint) -> Scaling:
        """The same, with `point` in place of its pipeline's on its GPUs."""
        key = (point.pipeline, point.gpus)
        points = tuple(point if (p.pipeline, p.gpus) == key else p for p in self.points)
        return replace(self, points=points)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["points"] = [p.to_json() for p in self.points]
        for pipeline in (TORCH, DALI):
            out[f"{pipeline}_cores_per_gpu"] = self.cores_needed(pipeline)
            out[f"{pipeline}_gpus_fed"] = self.gpus_fed(pipeline)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Scaling:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["points"] = tuple(ScalePoint.from_json(p) for p in data.get("points", ()))
        return cls(**known)


@dataclass(frozen=True)
class Session:
    """A sweep or a doctor session, as it ended. Fields a kind does not have stay empty."""

    kind: SessionKind
    session_id: str
    status: RunStatus
    reason: str | None
    created: str
    consumer: str
    budget_s: float
    elapsed_s: float
    knob: str = "num_workers"  # the doctor's is always num_workers
    points: tuple[SweepPoint, ...] = ()  # judged ones, by setting
    best: SweepPoint | None = None
    knee: SweepPoint | None = None
    oversubscribed: tuple[int, ...] = ()
    skipped: tuple[Skipped, ...] = ()
    run_ids: tuple[str, ...] = ()
    precision: float | None = None
    startup_s: float | None = None  # the lanes' start and the consumer timed alone
    consumer_alone: Mapping[str, Any] | None = None
    pipeline: str | None = None  # a sweep's: "torch" or "dali"
    read: str | None = None  # a sweep's
    consumer_note: str | None = None  # the doctor's, from here on
    lanes: int | None = None
    devices: tuple[str, ...] = ()
    verdict: Verdict | None = None  # None: the doctor had nothing to answer on
    verdict_run_id: str | None = None  # the run of your setting the verdict is about
    recommendations: tuple[Recommendation, ...] = ()
    asides: tuple[Recommendation, ...] = ()  # changes measured or predicted below yours
    dali: DaliRun | None = None
    epochs: EpochsRun | None = None
    verify: Verification | None = None
    curve: Curve | None = None  # the DataLoader's predicted curve, from its first point's run
    scaling: Scaling | None = None  # on several lanes: the job on 1 to N of them
    like: str | None = None  # the watched run a doctor measured like (`--like`)

    def shown(self, setting: str) -> Shown | None:
        """A setting's one figure on a doctor's pages (`Shown`): of your setting, any DataLoader
        setting or DALI's; None where the session did not measure it."""
        verify = self.verify
        pooled = None if verify is None or not verify.pairs else verify.pooled(setting)
        if verify is not None and pooled is not None:
            runs = tuple(item.run_id for item in verify.in_turn if item.setting == setting)
            return Shown(pooled.value, pooled.error, runs)
        dali = self.dali
        if dali is not None and dali.change.setting == setting and dali.images_per_s is not None:
            assert dali.run_id is not None  # measured
            return Shown(dali.images_per_s, dali.images_per_s_error, (dali.run_id,))
        point = next((p for p in self.points if workers(p.setting).setting == setting), None)
        if point is None or point.run_id is None:
            return None
        return Shown(point.images_per_s, point.images_per_s_error, (point.run_id,))

    def predicted(self, setting: int) -> float | None:
        """The curve's images/s at `setting` (None without a curve, or for DALI threads)."""
        if self.curve is None or self.knob != "num_workers":
            return None
        return self.curve.images_per_s(setting)

    def _curve_json(self) -> dict[str, Any] | None:
        if self.curve is None:
            return None
        settings = sorted(set(self.curve.settings()) | {p.setting for p in self.points})
        return {
            **self.curve.to_json(),
            "predicted": [
                {
                    self.knob: s,
                    "images_per_s": self.curve.images_per_s(s),
                    "bound": self.curve.bound(s),
                }
                for s in settings
            ],
        }

    @property
    def not_verified(self) -> str | None:
        """Why a doctor did not verify its answer, as its reason says (None: not said)."""
        for part in (self.reason or "").removeprefix("partial: ").split("; "):
            if part.startswith(f"{NOT_VERIFIED}: "):
                return part.removeprefix(f"{NOT_VERIFIED}: ")
        return None

    @property
    def host_busy(self) -> list[int]:
        """The settings measured while the host's other load could have moved them."""
        return sorted(p.setting for p in self.points if p.host_busy)

    @property
    def answered(self) -> bool:
        """Whether a doctor measured your setting, and so has a verdict (a sweep: always)."""
        return self.kind is SessionKind.SWEEP or self.verdict is not None

    def to_json(self) -> dict[str, Any]:
        """The session's document, as stored and as `--json` prints it."""
        head = {
            "schema": DOCTOR_SCHEMA if self.kind is SessionKind.DOCTOR else SWEEP_SCHEMA,
            "session_id": self.session_id,
            "status": self.status.value,
            "reason": self.reason,
            "created": self.created,
            **({"like": self.like} if self.like else {}),
        }
        points = [p.to_json(self.knob) for p in self.points]
        knee = None if self.knee is None else self.knee.to_json(self.knob)
        skipped = [asdict(s) for s in self.skipped]
        alone = None if self.consumer_alone is None else dict(self.consumer_alone)
        if self.kind is SessionKind.SWEEP:
            return {
                **head, "pipeline": self.pipeline, "consumer": self.consumer, "read": self.read,
                "precision": self.precision, "budget_s": self.budget_s,
                "elapsed_s": self.elapsed_s, "startup_s": self.startup_s, "consumer_alone": alone,
                "knob": self.knob, "points": points,
                "best": None if self.best is None else self.best.to_json(self.knob),
                "knee": knee, "oversubscribed": list(self.oversubscribed), "skipped": skipped,
                "host_busy": self.host_busy, "run_ids": list(self.run_ids),
                "curve": self._curve_json(),
            }  # fmt: skip
        if self.verdict is None:
            return {
                **head, "consumer": self.consumer, "verdict": None, "recommendations": [],
                "sweep": points, "knee": knee, "skipped": skipped, "dali": None, "epochs": None,
                "verify": None, "budget_s": self.budget_s, "elapsed_s": self.elapsed_s,
                "run_ids": list(self.run_ids),
            }  # fmt: skip
        return {
            **head, "consumer": self.consumer, "consumer_note": self.consumer_note,
            "lanes": self.lanes, "devices": list(self.devices), "precision": self.precision,
            "budget_s": self.budget_s, "elapsed_s": self.elapsed_s, "startup_s": self.startup_s,
            "consumer_alone": alone,
            "verdict": {**self.verdict.to_json(), "run_id": self.verdict_run_id},
            "recommendations": [r.to_json() for r in self.recommendations],
            "asides": [r.to_json() for r in self.asides],
            "sweep": points, "knee": knee, "oversubscribed": list(self.oversubscribed),
            "skipped": skipped, "host_busy": self.host_busy,
            "dali": None if self.dali is None else self.dali.to_json(),
            "epochs": None if self.epochs is None else self.epochs.to_json(),
            "verify": None if self.verify is None else self.verify.to_json(),
            "run_ids": list(self.run_ids), "curve": self._curve_json(),
            "scaling": None if self.scaling is None else self.scaling.to_json(),
        }  # fmt: skip

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Session:
        """A session from its document, sweep or doctor."""
        doctor = str(document["schema"]).startswith("feedscope.doctor")
        knob = "num_workers" if doctor else document.get("knob", "num_workers")
        points = tuple(SweepPoint.from_json(p, knob) for p in document["sweep" if doctor else
                                                                         "points"])  # fmt: skip
        by_setting = {p.setting: p for p in points}

        def point(data: Mapping[str, Any] | None) -> SweepPoint | None:
            if data is None:
                return None
            return by_setting.get(data[knob]) or SweepPoint.from_json(data, knob)

        verdict = document.get("verdict")
        recommendations = tuple(Recommendation.from_json(r) for r in document["recommendations"]
                                ) if doctor else ()  # fmt: skip
        verify_json = document.get("verify")
        verify = None if verify_json is None else Verification.from_json(
            verify_json, _verified(verify_json, recommendations)
        )  # fmt: skip
        return cls(
            kind=SessionKind.DOCTOR if doctor else SessionKind.SWEEP,
            session_id=document["session_id"],
            status=RunStatus(document["status"]),
            reason=document.get("reason"),
            created=document["created"],
            consumer=document["consumer"],
            budget_s=document["budget_s"],
            elapsed_s=document["elapsed_s"],
            knob=knob,
            points=points,
            best=point(document.get("best")) or _best(points),
            knee=point(document.get("knee")),
            oversubscribed=tuple(document.get("oversubscribed", ())),
            skipped=tuple(Skipped(s["setting"], s["reason"]) for s in document["skipped"]),
            run_ids=tuple(document["run_ids"]),
            precision=document.get("precision"),
            startup_s=document.get("startup_s"),
            like=document.get("like"),
            consumer_alone=document.get("consumer_alone"),
            pipeline=document.get("pipeline"),
            read=document.get("read"),
            consumer_note=document.get("consumer_note"),
            lanes=document.get("lanes"),
            devices=tuple(document.get("devices", ())),
            verdict=None if verdict is None else Verdict.from_json(verdict),
            verdict_run_id=None if verdict is None else verdict.get("run_id"),
            recommendations=in_alternation(recommendations, verify),
            asides=tuple(Recommendation.from_json(r) for r in document.get("asides", ())),
            dali=None if document.get("dali") is None else DaliRun.from_json(document["dali"]),
            epochs=_epochs(document.get("epochs"), verify),
            verify=verify,
            curve=_curve(document.get("curve")),
            scaling=None
            if document.get("scaling") is None
            else Scaling.from_json(document["scaling"]),
        )

    def analysis(self) -> SweepAnalysis | None:
        """Its points as a sweep analysis (None without a judged point), with the knee and the
        oversubscribed settings it concluded."""
        if self.best is None or self.knee is None:
            return None
        over = tuple(p for p in self.points if p.setting in set(self.oversubscribed))
        return SweepAnalysis(self.knob, self.points, self.best, self.knee, over)


def read_session(store: Store, session_id: str) -> Session:
    """A stored sweep or doctor session (its id, or a unique start of it)."""
    return Session.from_json(store.session(session_id).document)


SESSION_PREFIXES = tuple(f"{kind.value}-" for kind in SessionKind)


def is_session_id(subject: str) -> bool:
    return subject.startswith(SESSION_PREFIXES)


def resolve_subject(store: Store, wanted: str) -> str:
    """What a user names, as a run id or a session id: `last` is the newest run or session a
    user started (a session's own runs, its points and verification, belong to it; the runs
    of a session still measuring count as runs until it ends; of a watched script's loaders,
    the one with the most batches); a session id stays as given; anything else is a run (its
    id or a unique start of it).

    Raises:
        InputError: the store holds nothing, or no run (or several) matches.
    """
    if is_session_id(wanted):
        return store.session(wanted).session_id
    if wanted != "last":
        return store.run(wanted).run_id
    sessions = store.sessions()
    ended = {s.session_id for s in sessions}
    runs = [run for run in store.runs() if run.session_id not in ended]
    newest = [(r.created, r.run_id) for r in runs[:1]] + [
        (s.created, s.session_id) for s in sessions[:1]
    ]
    if not newest:
        raise InputError(f"the store {store.path} holds no runs yet")
    subject = max(newest)[1]
    if runs and subject == runs[0].run_id:
        return store.loaders(runs[0])[0].run_id
    return subject


def focus_run(store: Store, subject: str) -> str:
    """The run a subject's figures come from: a run's own id; a doctor session's run of your
    setting (its verdict is about it), a sweep's knee, else the session's first run.

    Raises:
        InputError: a session that recorded no run.
    """
    if not is_session_id(subject):
        return subject
    session = read_session(store, subject)
    knee = None if session.knee is None else session.knee.run_id
    focus = session.verdict_run_id or knee or (session.run_ids[0] if session.run_ids else None)
    if focus is None:
        raise InputError(f"session {session.session_id} recorded no run: nothing to report")
    return focus


def _epochs(data: Mapping[str, Any] | None, verify: Verification | None) -> EpochsRun | None:
    """The epoch reading, against your setting's one figure as one stream: where the pairs
    measured it, its runs in alternation pooled (a document read before they were its figure
    has its first run's)."""
    if data is None:
        return None
    epochs = EpochsRun.from_json(data)
    setting = workers(epochs.num_workers).setting
    pooled = None if verify is None or not verify.pairs else verify.pooled(setting)
    return epochs if pooled is None else epochs.against(pooled.value)


def _curve(data: Mapping[str, Any] | None) -> Curve | None:
    if not data:
        return None
    known = {f.name for f in fields(Curve)}
    try:
        return Curve.from_json({k: v for k, v in data.items() if k in known})
    except TypeError:  # written unlike this one
        return None


def _best(points: tuple[SweepPoint, ...]) -> SweepPoint | None:
    return max(points, key=lambda p: p.images_per_s) if points else None


def _verified(verify: Mapping[str, Any], recommendations: tuple[Recommendation, ...]) -> Change:
    """The change a verification ran: the recommendation it verified (the first)."""
    for item in recommendations:
        if item.setting == verify["setting"]:
            return item.change
    return Change.parse(verify["setting"])
