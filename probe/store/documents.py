"""A stored run read as one typed document: its record, its lanes and their figures
(`probe.metrics.LaneFigures`), and its run-level figures by the rule of `probe.metrics`.

`read_run` is what the judging and presenting layers read; `RunDocument.to_json()` is the run's
JSON (schema `feedscope.run/1`), made only where it leaves the program: `--json`, reports, the
dashboard's downloads. `RunBrief` is a run's headline figures, to compare runs side by side.
`lane_figures_from_store` computes a lane's figures from its events and samples: what a lane
stores as its summary when it ends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probe.metrics import (
    CPU,
    DATA_WAIT,
    IMAGES_PER_S,
    LaneFigures,
    Reading,
    errors_added,
    lane_figures,
)
from probe.records import LaneRecord, RunRecord
from probe.store.db import Store

RUN_SCHEMA = "feedscope.run/1"


@dataclass(frozen=True)
class LaneDocument:
    """One lane of a run: where it ran, how it ended, and its figures."""

    lane: int
    gpu: int | None  # CUDA index; None: the CPU
    gpu_uuid: str | None
    shard_id: int
    num_shards: int
    hostname: str
    status: str
    reason: str | None
    figures: LaneFigures

    @property
    def device(self) -> str:
        return "cpu" if self.gpu is None else f"cuda:{self.gpu}"

    def to_json(self) -> dict[str, Any]:
        return {
            "lane": self.lane, "gpu": self.gpu, "gpu_uuid": self.gpu_uuid,
            "shard_id": self.shard_id, "num_shards": self.num_shards, "hostname": self.hostname,
            "status": self.status, "reason": self.reason, **self.figures.to_json(),
        }  # fmt: skip


@dataclass(frozen=True)
class RunDocument:
    """A run, its lanes and its run-level figures."""

    run_id: str
    kind: str  # "probe" or "watch"
    status: str
    reason: str | None
    created: str
    label: str | None
    pipeline: str
    consumer: str
    seconds: float | None  # from its start to its end
    config: Mapping[str, Any]
    host: Mapping[str, Any]
    samples: Mapping[str, int]  # how many GPU and host samples it holds
    unavailable_metrics: tuple[Mapping[str, Any], ...]
    lanes: tuple[LaneDocument, ...]

    @property
    def images_per_s(self) -> float:
        return IMAGES_PER_S.of_run(x.figures.images_per_s for x in self.lanes) or 0.0

    @property
    def images_per_s_error(self) -> float | None:
        return errors_added(x.figures.images_per_s_error for x in self.lanes)

    @property
    def data_wait_frac(self) -> float | None:
        """The run's data-wait: its worst lane's (DDP waits for the slowest rank)."""
        return DATA_WAIT.of_run(x.figures.data_wait_frac for x in self.lanes)

    @property
    def worst_lane(self) -> LaneDocument | None:
        """The lane whose data-wait is the run's."""
        waited = [x for x in self.lanes if x.figures.data_wait_frac is not None]
        return max(waited, key=lambda x: x.figures.data_wait_frac or 0.0, default=None)

    @property
    def cpu_pct(self) -> float | None:
        """Its lanes' processes together, in % of one core."""
        return CPU.of_run(x.figures.cpu_pct for x in self.lanes)

    @property
    def name(self) -> str:
        return self.label or f"{self.pipeline} {self.run_id[-4:]}"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": RUN_SCHEMA,
            "run_id": self.run_id,
            "kind": self.kind,
            "status": self.status,
            "reason": self.reason,
            "created": self.created,
            "label": self.label,
            "pipeline": self.pipeline,
            "consumer": self.consumer,
            "images_per_s": self.images_per_s,
            "images_per_s_error": self.images_per_s_error,
            "data_wait_frac": self.data_wait_frac,
            "seconds": self.seconds,
            "config": dict(self.config),
            "host": dict(self.host),
            "samples": dict(self.samples),
            "unavailable_metrics": [dict(u) for u in self.unavailable_metrics],
            "lanes": [lane.to_json() for lane in self.lanes],
        }


@dataclass(frozen=True)
class RunBrief:
    """A run's headline figures, for comparing runs side by side: images/s (its error the
    lanes' added in quadrature), the run's data-wait (the worst lane's), the lanes' mean GPU
    busy-ness (and its metric, where all lanes share one), and the CPU cores its lanes used."""

    run: str
    name: str
    label: str | None
    pipeline: str
    consumer: str
    status: str
    images_per_s: float
    images_per_s_error: float | None
    data_wait_frac: float | None
    sm_active_pct: float | None
    sm_active_source: str | None
    cpu_cores: float | None

    @classmethod
    def of(cls, document: RunDocument) -> RunBrief:
        figures = [lane.figures for lane in document.lanes]
        sources = {f.sm_active_source for f in figures} - {None}
        busy = [f.sm_active_pct for f in figures if f.sm_active_pct is not None]
        cpu = document.cpu_pct
        return cls(
            run=document.run_id,
            name=document.name,
            label=document.label,
            pipeline=document.pipeline,
            consumer=document.consumer,
            status=document.status,
            images_per_s=document.images_per_s,
            images_per_s_error=document.images_per_s_error,
            data_wait_frac=document.data_wait_frac,
            sm_active_pct=sum(busy) / len(busy) if busy else None,
            sm_active_source=sources.pop() if len(sources) == 1 else None,
            cpu_cores=None if cpu is None else cpu * CPU.scale,
        )

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def lane_figures_from_store(
    store: Store, run: RunRecord, lane: LaneRecord, starts: Sequence[Sequence[int]] | None = None
) -> LaneFigures:
    """A lane's figures, computed from what the store holds for it."""
    gpu = store.gpu_samples(run.run_id, lane.gpu_uuid) if lane.gpu_uuid else []
    cpu = [s for s in store.lane_cpu(run.run_id) if s.lane == lane.lane]
    events = store.batches(run.run_id, lane.lane)
    return lane_figures(events, gpu, cpu, reading=Reading.of(run), starts=starts)


def lane_figures_of(store: Store, run: RunRecord, lane: LaneRecord) -> LaneFigures:
    """A lane's figures: those it stored when it ended, else computed from its events."""
    if lane.summary is not None:
        return LaneFigures.from_json(lane.summary)
    return lane_figures_from_store(store, run, lane)


def read_run(store: Store, run_id: str) -> RunDocument:
    """A stored run as a document (`run_id`: its id, a unique start of it, or `last`)."""
    run = store.run(run_id)
    lanes = tuple(
        LaneDocument(
            lane=lane.lane,
            gpu=lane.gpu_index,
            gpu_uuid=lane.gpu_uuid,
            shard_id=lane.shard_id,
            num_shards=lane.num_shards,
            hostname=lane.hostname,
            status=lane.status.value,
            reason=lane.reason,
            figures=lane_figures_of(store, run, lane),
        )
        for lane in store.lanes(run.run_id)
    )
    return RunDocument(
        run_id=run.run_id,
        kind=run.kind,
        status=run.status.value,
        reason=run.reason,
        created=run.created,
        label=run.label,
        pipeline=run.pipeline,
        consumer=run.consumer,
        seconds=None if run.ended_ns is None else (run.ended_ns - run.started_ns) / 1e9,
        config=run.config,
        host=run.host,
        samples=store.sample_counts(run.run_id),
        unavailable_metrics=tuple(
            {"source": u.source, "device": u.device or None, "metric": u.metric, "reason": u.reason}
            for u in store.unavailable(run.run_id)
        ),
        lanes=lanes,
    )
