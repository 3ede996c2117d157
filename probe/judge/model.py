"""A predicted curve: a DataLoader lane's images/s against num_workers, from one steady run.

The model is small and its terms are measured in the run it starts from:

- **workers**: each worker's thread makes an image in `serial_ms` (the stages it runs in turn:
  read, decode, crop and resize, flip, collation; as the worker timed its busy wall time, its
  waits for a core left out, since its waits for the GIL its queue's thread holds, and for a
  disk, are as serial as its CPU; else their CPU time on its clock), so w workers make at most
  w x 1000 / serial_ms images/s;
- **cores**: the workers' processes spend `worker_ms` of CPU per image (those stages and what
  else they run, as handing batches over on the queue's own thread) and the training process
  `main_ms` (receiving, stepping, its other threads: it grows with the rate, as the workers'
  does), and they share the cores the lane may use (the cgroup quota and affinity, split among
  the host's lanes) less what other processes use (`other_cores`): at most
  (cores - other) x 1000 / (worker_ms + main_ms);
- **consumer**: the training loop's thread takes one batch per hand-off (`handoff_ms`:
  receiving, copying and normalizing it, on its own CPU clock) plus one step: at most batch x
  1000 / (handoff + step). The step under the loader's load can be slower than the consumer
  alone (the noisy neighbour): it is taken to grow with the cores the workers keep busy, from
  the consumer alone's step (none busy) to the run's step (the run's busy cores).

The workers make batches at the lesser of their two terms; the loop takes them at its own. The
queue between the two runs empty now and then where they are close (batches come in bursts, as
each worker finishes a whole batch at once), so the two combine as a smooth minimum, (a^-p +
b^-p)^(-1/p) with p = QUEUE_SHARPNESS: equal terms give 89% of either, terms 1.5x apart 99% of
the lesser. p is the model's one constant, not a measured term: it was chosen on an H100 sweep
of ResNet-50 (4 to 16 workers) and is checked by every doctor's measured points.

With no workers, the training process does everything in turn: batch x 1000 / (batch x
worker_ms + handoff + step). It knows nothing of storage: where the disk is the limit, it is
wrong, and the doctor's measured points say so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from probe.judge.facts import LaneFacts, run_facts
from probe.judge.thresholds import KNEE_WITHIN
from probe.metrics import Side
from probe.store.db import Store

MIN_WORKER_CORES = 0.1  # a floor for the workers' cores, where others take them all
QUEUE_SHARPNESS = 6.0  # p of the smooth minimum of the workers' rate and the loop's


@dataclass(frozen=True)
class Curve:
    """One lane's predicted images/s against num_workers, and the measured terms it rests on.
    A run's prediction is `lanes` times a lane's (under DDP the lanes keep one pace)."""

    run_id: str | None
    workers: int  # the setting measured
    batch_size: int
    worker_ms: float  # the workers' processes' CPU ms per image
    cores: float  # the cores the lane may use
    main_ms: float  # the training process's CPU ms per image
    other_cores: float  # other processes' CPU, in cores per lane
    handoff_ms: float  # the training process's CPU per batch: receive, copy, normalize
    step_ms: float  # the mean step at the setting measured
    step_alone_ms: float | None  # the consumer alone's mean step (None: not measured)
    lanes: int = 1
    measured_images_per_s: float | None = None  # the run's own, at `workers`
    serial_ms: float | None = None  # a worker's thread's busy ms per image (None: worker_ms)

    @property
    def worker_cores(self) -> float:
        """The cores left to the workers when the lane's cores are all busy."""
        share = self.worker_ms / (self.worker_ms + self.main_ms)
        return max(MIN_WORKER_CORES, (self.cores - self.other_cores) * share)

    def step_at(self, workers: int) -> float:
        """The step's mean at `workers`: the consumer alone's, slowed in proportion to the
        cores the workers keep busy, as the run measured it."""
        alone = self.step_alone_ms
        if alone is None:
            return self.step_ms
        slowed = max(0.0, self.step_ms - alone)
        busy_then = min(self.workers, self.worker_cores)
        if busy_then <= 0:
            return alone + slowed
        return alone + slowed * min(workers, self.worker_cores) / busy_then

    def terms(self, workers: int) -> dict[str, float]:
        """Each term's bound on one lane's images/s at `workers`."""
        step = self.step_at(workers)
        if workers == 0:
            serial = self.batch_size * self.worker_ms + self.handoff_ms + step
            return {"training process": self.batch_size * 1000 / serial}
        return {
            "workers": workers * 1000 / (self.serial_ms or self.worker_ms),
            "cores": self.worker_cores * 1000 / self.worker_ms,
            "consumer": self.batch_size * 1000 / (self.handoff_ms + step),
        }

    def lane_images_per_s(self, workers: int) -> float:
        terms = self.terms(workers)
        if workers == 0:
            return terms["training process"]
        made = min(terms["workers"], terms["cores"])
        taken = terms["consumer"]
        return float((made**-QUEUE_SHARPNESS + taken**-QUEUE_SHARPNESS) ** (-1 / QUEUE_SHARPNESS))

    def images_per_s(self, workers: int) -> float:
        """The run's predicted images/s at `workers`."""
        return self.lanes * self.lane_images_per_s(workers)

    def bound(self, workers: int) -> str:
        """The term that binds at `workers`."""
        terms = self.terms(workers)
        return min(terms, key=lambda name: terms[name])

    def knee(self, settings: Iterable[int], within: float = KNEE_WITHIN) -> int:
        """The smallest of `settings` predicted within `within` of the best of them."""
        ordered = sorted(set(settings))
        best = max(self.images_per_s(w) for w in ordered)
        return next(w for w in ordered if self.images_per_s(w) >= (1 - within) * best)

    def settings(self) -> list[int]:
        """The settings worth predicting: 0 up to past the cores and past the run's own."""
        return list(range(0, max(self.workers, int(self.cores) + 2) + 1))

    @property
    def text(self) -> str:
        """The terms, for people."""
        alone = (
            "not measured"
            if self.step_alone_ms is None
            else f"{self.step_alone_ms:.1f} ms alone, {self.step_ms:.1f} ms under the loader's "
            f"load at num_workers={self.workers}"
        )
        return (
            f"a worker's thread busy {self.serial_ms or self.worker_ms:.2f} ms per image, "
            f"the workers' processes {self.worker_ms:.2f} ms, the training process "
            f"{self.main_ms:.2f} ms; {self.cores:g} cores for the lane, {self.other_cores:.1f} "
            f"used by other processes; hand-off {self.handoff_ms:.1f} ms per batch of "
            f"{self.batch_size}; step {alone}"
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Curve:
        return cls(**data)


def curve_of(facts: LaneFacts, run_id: str | None = None, lanes: int = 1) -> Curve | None:
    """The curve of a DataLoader lane's run, or None where a term was not measured (DALI, no
    stage times, no CPU figures, nothing measured)."""
    figures = facts.figures
    worker_ms = figures.stage_ms(Side.WORKERS)
    main_ms = figures.stage_ms(Side.MAIN)
    if (
        facts.backend != "torch"
        or facts.batch_size <= 0
        or not worker_ms
        or main_ms is None
        or not figures.images_per_s
        or figures.cpu_pct is None
        or not figures.stages_ms
    ):
        return None
    rate = figures.images_per_s
    workers = facts.num_workers or 0
    handoff = figures.stage_ms(Side.MAIN, training=False) or 0.0
    # with no workers, the training process ran the workers' stages: they are not its own load
    main_ms = max(0.0, figures.cpu_pct / 100 * 1000 / rate - worker_ms) if workers else 0.0
    step = facts.step_ms_mean if facts.step_ms_mean is not None else figures.step_ms_p50
    alone = figures.consumer_alone or {}
    alone_rate = alone.get("images_per_s")
    step_alone = (
        float(alone.get("batch_size") or facts.batch_size) * 1000 / alone_rate
        if alone_rate
        else None
    )
    return Curve(
        run_id=run_id,
        workers=workers,
        batch_size=facts.batch_size,
        worker_ms=worker_ms,
        cores=facts.cores_per_lane,
        main_ms=main_ms,
        other_cores=facts.other_cores_per_lane,
        handoff_ms=handoff * facts.batch_size,
        step_ms=step or 0.0,
        step_alone_ms=step_alone,
        lanes=lanes,
        measured_images_per_s=rate * lanes,
        serial_ms=figures.worker_serial_ms or worker_ms - figures.stages_ms.get("worker_rest", 0.0),
    )


def run_curve(store: Store, run_id: str) -> Curve | None:
    """The curve of a stored DataLoader run, from its slowest lane (under DDP every lane keeps
    its pace), for all its lanes."""
    facts = [f for f in run_facts(store, run_id) if f.figures.batches]
    if not facts:
        return None
    slowest = min(facts, key=lambda f: f.figures.images_per_s)
    return curve_of(slowest, run_id, len(facts))
