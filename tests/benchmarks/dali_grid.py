"""Benchmark: DALI's settings on a grid, each measured for a fixed time on lanes kept warm, the
yardstick for the doctor's DALI search.

Measures every `--threads` x `--loads` setting of the `mixed` decoder (and `--cpu-threads` of the
`cpu` decoder, if given) for `--seconds` each (after the warm-up, no early stop), the consumer
built and tuned once; prints a table (images/s, data-wait, the hardware decoder's busy share,
DALI's threads' CPU, the step against the consumer alone) and the best, and writes the rows to
`--out` as JSON.

    python tests/benchmarks/dali_grid.py --out grid.json --threads 1,2,3,4 \
        --loads 0.65,0.8,0.9,0.95,1 [--seconds 20] -- --gpus 0 --data DIR \
        --consumer model:resnet50
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from probe.judge.changes import to_dali
from probe.judge.evidence import slower_step
from probe.judge.facts import run_facts
from probe.judge.session import with_change
from probe.measure.config import check_config
from probe.measure.runner import Lanes
from probe.present.cli import cli
from probe.present.measuring import prepare
from probe.present.options import LaneArgs, PipelineArgs
from probe.store.documents import read_run


def _flags(argv: list[str]) -> dict[str, Any]:
    """`probe run`'s flags as its command's values (by `dest`), through its own parser."""
    command = cli.commands["run"]
    context = command.make_context("run", [*argv, "--pipeline", "dali"])
    return dict(context.params)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", default="1,2,3,4")
    parser.add_argument("--loads", default="0.65,0.8,0.9,0.95,1")
    parser.add_argument("--cpu-threads", default="", help="the cpu decoder's threads, e.g. 4")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then `probe run`'s flags")
    args = parser.parse_args()
    values = _flags([f for f in args.flags if f != "--"])
    pipeline, lanes = PipelineArgs.of(values), LaneArgs.of(values)
    config, store = prepare(pipeline, lanes, values.get("db"), values["backend"])
    config = replace(config, precision=None, duration_s=args.seconds, batches=None)
    settings = [
        to_dali("mixed", int(t), float(load))
        for t in args.threads.split(",")
        if t
        for load in args.loads.split(",")
    ] + [to_dali("cpu", int(t)) for t in args.cpu_threads.split(",") if t]
    rows: list[dict[str, Any]] = []
    console = Console(width=160)
    started = time.monotonic()
    checked = check_config(config)
    with Lanes(config.lanes, config.consumer, checked.num_classes, None) as warm:
        for change in settings:
            point = with_change(config, change)
            assert point is not None
            run_id = warm.measure(point, store, checked, session_id=None)
            document = read_run(store, run_id)
            facts = run_facts(store, run_id)
            lane = min(facts, key=lambda f: f.figures.images_per_s)
            figures = lane.figures
            threads_cpu = None
            if figures.cpu_pct is not None:
                threads_cpu = figures.cpu_pct - (figures.main_thread_cpu_pct or 0.0)
            row: dict[str, Any] = {
                "setting": change.setting,
                "run_id": run_id,
                "status": document.status,
                "images_per_s": document.images_per_s,
                "images_per_s_error": document.images_per_s_error,
                "data_wait_frac": document.data_wait_frac,
                "nvjpg_pct": figures.nvjpg_pct,
                "threads_cpu_pct": threads_cpu,
                "cpu_pct": figures.cpu_pct,
                "step_slowed": slower_step(lane),
                "seconds": figures.seconds,
                "elapsed_s": time.monotonic() - started,
            }
            rows.append(row)
            args.out.write_text(json.dumps(rows, indent=1))
            console.print(
                f"{row['setting']}: {row['images_per_s']:,.0f} images/s ({row['elapsed_s']:.0f} s)",
                highlight=False,
            )
    table = Table(title=f"DALI grid, {args.seconds:g} s each, {config.consumer}")
    for column in ("setting", "images/s", "data-wait", "NVJPG", "threads' CPU", "step", "run"):
        table.add_column(column, justify="left" if column in ("setting", "run") else "right")

    def pct(value: float | None, scale: float = 1.0) -> str:
        return "-" if value is None else f"{value * scale:.0f}%"

    for row in rows:
        table.add_row(
            row["setting"],
            f"{row['images_per_s']:,.0f} ± {row['images_per_s_error'] or 0:,.0f}",
            pct(row["data_wait_frac"], 100),
            pct(row["nvjpg_pct"]),
            pct(row["threads_cpu_pct"]),
            "-" if row["step_slowed"] is None else f"{row['step_slowed']:+.0%}",
            row["run_id"],
        )
    console.print(table)
    best = max(rows, key=lambda r: r["images_per_s"] or 0.0)
    console.print(f"best: {best['setting']}, {best['images_per_s']:,.0f} images/s")


if __name__ == "__main__":
    main()
