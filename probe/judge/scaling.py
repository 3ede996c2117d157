"""How a job's rate grows from one GPU to N on one host's cores: predicted from a doctor's runs
on N lanes, and checked where it measured.

- **The DataLoader** on k GPUs is the curve of your setting's run (`probe.judge.model`) on k
  lanes that share the host's cores: each gets cores / k, and the other processes' load is
  split alike; it runs at the knee the curve predicts for k (the workers per GPU a user would
  set there).
- **DALI** on k GPUs: each GPU decodes on its own (`mixed`: its own hardware decoder and SMs),
  so a lane keeps the rate its run measured per lane, where its CPU had room; where its CPU held
  it, a lane makes what its share of the cores (at most its threads) makes at its measured CPU
  per image, up to the consumer alone.
- **Cores per GPU**: what a pipeline needs to keep up with the consumer alone, its CPU per
  image times the consumer's rate (DS-Analyzer's "CPUs per GPU needed"); the host's cores over
  that are the GPUs it feeds at the consumer's rate.

Every images/s here is for the job (all k GPUs) unless it says per GPU. A point the doctor
measured (`--scaling`, or its own points on N) sits beside its prediction
(`probe.judge.results.Scaling`).
"""

from __future__ import annotations

import math
from dataclasses import replace

from probe.judge.changes import workers
from probe.judge.dali_run import DaliRun
from probe.judge.model import Curve
from probe.judge.results import DALI, TORCH, ScalePoint, Scaling
from probe.judge.thresholds import KNEE_WITHIN

# DALI whose lanes made this share of what their cores (at most their threads) can at its CPU
# per image was held by its CPU (cores shared among lanes' threads are not all work: on 2 H200s
# with 16 cores, 8 threads a lane made 79% of it, and 96% on one GPU alone).
DALI_CPU_BOUND = 0.7


def torch_at(curve: Curve, gpus: int) -> tuple[int, float]:
    """The DataLoader on `gpus` lanes of the curve's host: the knee the curve predicts there
    (aimed at half KNEE_WITHIN, as the doctor's search aims), and the job's images/s at it."""
    host = curve.cores * curve.lanes
    shared = replace(
        curve, lanes=gpus, cores=host / gpus, other_cores=curve.other_cores * curve.lanes / gpus
    )
    knee = shared.knee(shared.settings(), KNEE_WITHIN / 2)
    return knee, shared.images_per_s(knee)


def dali_at(dali: DaliRun, lanes: int, cores: float, alone: float | None, gpus: int) -> float:
    """DALI's job images/s on `gpus` lanes, from its run on `lanes`: on `lanes`, as measured;
    on fewer, where its lanes used DALI_CPU_BOUND or more of what their threads and cores
    allow, what a lane's share of the cores (at most its threads) makes at its CPU per image,
    else a lane's rate as measured (each GPU decodes on its own); never less per lane than on
    `lanes`, never more than the consumer alone (`alone`, per lane)."""
    assert dali.images_per_s is not None
    per_lane = dali.images_per_s / lanes
    if gpus != lanes and dali.cpu_pct:
        cpu_ms = dali.cpu_pct / 100 * 1000 / dali.images_per_s  # its lanes' CPU per image
        # the cores a lane's DALI can keep busy: its threads, and for `mixed` the thread that
        # feeds its GPU stage
        threads = dali.num_threads + (1 if dali.decoder == "mixed" else 0)

        def made(count: int) -> float:
            return min(cores / count, threads) * 1000 / cpu_ms

        if per_lane >= DALI_CPU_BOUND * made(lanes):
            per_lane = max(per_lane, made(gpus))
    if alone:
        per_lane = min(per_lane, alone)
    return per_lane * gpus


def predict(
    curve: Curve | None,
    dali: DaliRun | None,
    alone: float | None,
    lanes: int,
    cores: float,
    on_gpu: bool,
) -> Scaling | None:
    """The job on 1 to `lanes` GPUs of this host, predicted from the doctor's runs on `lanes`:
    its DataLoader curve (None: a term not measured) and its DALI run (None or unjudged: not
    measured); `alone` is the consumer alone per lane; `cores` those the job may use. None for
    one lane, or where neither pipeline can be predicted."""
    dali = dali if dali is not None and dali.judged else None
    if lanes <= 1 or (curve is None and dali is None):
        return None
    points = []
    for gpus in range(1, lanes + 1):
        if curve is not None:
            knee, rate = torch_at(curve, gpus)
            points.append(ScalePoint(gpus, TORCH, workers(knee).setting, rate))
        if dali is not None:
            rate = dali_at(dali, lanes, cores, alone, gpus)
            points.append(ScalePoint(gpus, DALI, dali.change.setting, rate))
    dali_ms = None
    if dali is not None and dali.cpu_pct is not None and dali.images_per_s:
        dali_ms = dali.cpu_pct / 100 * 1000 / dali.images_per_s
    return Scaling(
        lanes=lanes,
        cores=cores,
        device="GPU" if on_gpu else "lane",
        points=tuple(points),
        consumer_images_per_s=alone,
        torch_cpu_ms=None if curve is None else curve.worker_ms + curve.main_ms,
        dali_cpu_ms=dali_ms,
        other_cores=0.0 if curve is None else curve.other_cores * curve.lanes,
    )


def checked_counts(lanes: int) -> list[int]:
    """The GPU counts a scaling check measures besides N's own points: 1, and the powers of two
    between 1 and N."""
    return [2**i for i in range(int(math.log2(lanes)) + 1) if 2**i < lanes]
