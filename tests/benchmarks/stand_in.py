"""Benchmark: what a stand-in for a watched job's step does to DALI beside it. feedscope's own
DALI lane (DALI's defaults: 8 threads, hw_decoder_load 0.65) on the job's files, fed to: the
step as `sleep:MS` (matrix products on every SM for the whole step), as `sleep:MS@SM%` (busy
for the share of the step the job's kernels held the SMs), and a model's real training step;
each consumer also alone. Prints a table: images/s, the consumer's step alone, SM activity.

    python tests/benchmarks/stand_in.py --data DIR --out DIR [--run RUN] [--seconds 25]

RUN defaults to the newest watched training loader (the most batches) in the store.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from probe.store.db import Store
from probe.store.documents import read_run


def watched_step(run: str | None) -> tuple[str, float, float | None]:
    """The watched training loader's run id, median step (ms) and its steps' SM activity."""
    with Store() as store:
        if run is None:
            watched = [r for r in store.runs() if r.kind == "watch" and r.pipeline == "torch"]
            if not watched:
                raise SystemExit("no watched DataLoader in the store")
            run = max(watched, key=lambda r: store.batch_totals(r.run_id, 0).batches).run_id
        figures = read_run(store, run).lanes[0].figures
    if figures.step_ms_p50 is None:
        raise SystemExit(f"run {run} measured no step")
    return run, figures.step_ms_p50, figures.step_sm_active_pct


def measure(out: Path, name: str, data: Path, consumer: str, seconds: float) -> dict[str, Any]:
    """One `probe run` of the DALI lane fed to `consumer`; its document."""
    result = subprocess.run(
        [sys.executable, "-m", "probe", "run", "--pipeline", "dali", "--data", str(data),
         "--gpus", "0", "--batch-size", "128", "--image-size", "224", "--threads", "8",
         "--consumer", consumer, "--duration", f"{seconds:g}", "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    (out / f"{name}.log").write_text(result.stderr)
    (out / f"{name}.json").write_text(result.stdout)
    print(f"{name}: {consumer}: exit {result.returncode}", flush=True)
    document: dict[str, Any] = json.loads(result.stdout) if result.stdout.strip() else {}
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run", default=None)
    parser.add_argument("--seconds", type=float, default=25.0)
    parser.add_argument(
        "--also-ms",
        type=float,
        default=None,
        help="a longer step too, every SM and the watched share",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run, step, held = watched_step(args.run)
    print(f"watched run {run}: step {step:.2f} ms, SM activity in its steps {held}", flush=True)
    consumers = {"sleep-all": f"sleep:{step:.2f}", "model": "model:resnet18"}
    if held is not None:
        consumers["sleep-held"] = f"sleep:{step:.2f}@{held:.0f}%"
    consumers["sleep-half"] = f"sleep:{step:.2f}@50%"
    if args.also_ms is not None:
        consumers["long-all"] = f"sleep:{args.also_ms:g}"
        if held is not None:
            consumers["long-held"] = f"sleep:{args.also_ms:g}@{held:.0f}%"
    rows = []
    for name, consumer in consumers.items():
        document = measure(args.out, name, args.data, consumer, args.seconds)
        lanes = document.get("lanes") or [{}]
        figures = lanes[0]
        alone = figures.get("consumer_alone") or {}
        rows.append((consumer, document.get("images_per_s"), figures.get("images_per_s_error"),
                     alone.get("step_ms_p50"), figures.get("sm_active_pct"),
                     figures.get("step_sm_active_pct"), figures.get("nvjpg_pct")))  # fmt: skip
    print(f"{'consumer':<24}{'images/s':>16}{'step alone ms':>15}{'SM act. %':>11}"
          f"{'in steps %':>12}{'NVJPG %':>9}")  # fmt: skip
    for consumer, rate, error, alone, sm, in_steps, nvjpg in rows:
        cells = [f"{rate:,.0f} ± {error or 0:,.0f}" if rate else "-"]
        cells += [f"{v:.1f}" if isinstance(v, float) else "-" for v in (alone, sm, in_steps, nvjpg)]
        print(f"{consumer:<24}{cells[0]:>16}{cells[1]:>15}{cells[2]:>11}{cells[3]:>12}"
              f"{cells[4]:>9}")  # fmt: skip


if __name__ == "__main__":
    main()
