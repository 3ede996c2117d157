"""`probe check`: a CI gate on a recorded run. Every lane must meet every threshold given; a run
that did not complete, or holds fewer lanes than it was started with (its world size: a rank
that never reported, a store per node not merged yet), fails the gate, whatever it measured."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pipelines import InputError
from probe.metrics import DATA_WAIT, IMAGES_PER_S, LATENCY
from probe.store.documents import RunDocument

CHECK_SCHEMA = "feedscope.check/1"


@dataclass(frozen=True)
class Thresholds:
    max_data_wait: float | None = None  # a share, 0..1
    min_images_per_s: float | None = None  # per lane
    max_batch_latency_p99_ms: float | None = None

    def check(self) -> None:
        """Raises InputError when no threshold is given or one is out of range."""
        given = (self.max_data_wait, self.min_images_per_s, self.max_batch_latency_p99_ms)
        if all(value is None for value in given):
            raise InputError(
                "give at least one threshold: --max-data-wait, --min-images-per-s or "
                "--max-batch-latency-p99-ms"
            )
        if self.max_data_wait is not None and not 0 <= self.max_data_wait <= 1:
            raise InputError(
                f"--max-data-wait takes a share from 0 to 1, or a percentage like 20% "
                f"(got {self.max_data_wait:g})"
            )
        for flag, value in (
            ("--min-images-per-s", self.min_images_per_s),
            ("--max-batch-latency-p99-ms", self.max_batch_latency_p99_ms),
        ):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise InputError(f"{flag} takes a finite number >= 0 (got {value:g})")

    def text(self) -> str:
        parts = []
        if self.max_data_wait is not None:
            parts.append(f"data-wait <= {self.max_data_wait:.1%}")
        if self.min_images_per_s is not None:
            parts.append(f"images/s >= {self.min_images_per_s:,.0f}")
        if self.max_batch_latency_p99_ms is not None:
            parts.append(f"batch latency p99 <= {self.max_batch_latency_p99_ms:g} ms")
        return ", ".join(parts)


def check_run(document: RunDocument, thresholds: Thresholds) -> dict[str, Any]:
    """A `feedscope.check/1` document: per lane what it missed; `passed` when nothing was."""
    lanes: list[dict[str, Any]] = []
    for lane in document.lanes:
        name = f"lane {lane.lane} ({lane.device}, shard {lane.shard_id}/{lane.num_shards})"
        figures = lane.figures
        misses = []
        wait, rate = figures.data_wait_frac, figures.images_per_s
        p99 = figures.batch_latency_ms.p99
        if not figures.batches:
            misses.append(f"{name}: no measured batch ({lane.status})")
        else:
            limit = thresholds.max_data_wait
            if limit is not None and wait is not None and wait > limit:
                misses.append(f"{name}: {DATA_WAIT.label} {DATA_WAIT.text(wait)} > "
                              f"{DATA_WAIT.text(limit)}")  # fmt: skip
            least = thresholds.min_images_per_s
            if least is not None and rate < least:
                misses.append(f"{name}: {IMAGES_PER_S.text(rate)} < {IMAGES_PER_S.number(least)}")
            most = thresholds.max_batch_latency_p99_ms
            if most is not None and p99 is not None and p99 > most:
                misses.append(f"{name}: {LATENCY.label} p99 {LATENCY.text(p99)} > {most:g} ms")
        lanes.append({"lane": lane.lane, "passed": not misses, "misses": misses})
    run_misses = []
    expected = document.config.get("world_size")
    if isinstance(expected, int) and len(document.lanes) < expected:
        run_misses.append(
            f"the run holds {len(document.lanes)} of its {expected} lanes "
            "(a rank that never reported, or stores per node not merged yet)"
        )
    if document.status != "completed":
        reason = f": {document.reason}" if document.reason else ""
        run_misses.append(f"the run did not complete ({document.status}{reason})")
    return {
        "schema": CHECK_SCHEMA,
        "run_id": document.run_id,
        "passed": not run_misses and all(lane["passed"] for lane in lanes),
        "thresholds": {
            "max_data_wait": thresholds.max_data_wait,
            "min_images_per_s": thresholds.min_images_per_s,
            "max_batch_latency_p99_ms": thresholds.max_batch_latency_p99_ms,
        },
        "misses": run_misses + [miss for lane in lanes for miss in lane["misses"]],
        "lanes": lanes,
    }


def parse_share(text: str, option: str = "--max-data-wait") -> float:
    """0.2 or 20% -> 0.2.

    Raises:
        InputError: neither (`option` names the flag in the message).
    """
    value = text.strip()
    try:
        share = float(value[:-1]) / 100 if value.endswith("%") else float(value)
    except ValueError:
        share = math.nan
    if not math.isfinite(share):
        raise InputError(
            f"{option} takes a share like 0.2 or a percentage like 20% (got {text!r})"
        ) from None
    return share
