"""Benchmark: what sampling the hardware costs a probe run.

Runs the same probe with the samplers off, at 10 Hz and at 100 Hz, in interleaved rounds (each
round in a different order, so drift in the machine spreads over all three), and prints a table:
images/s (median over rounds) against the samplers off, and the CPU the coordinating process
used (it does the sampling; lanes do the work), from the run's own host samples.

    python tests/benchmarks/sampler_overhead.py [--gpus 0] [--rounds 3] [--duration 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipelines import Backend, DaliOptions, DataLoaderOptions, PipelineSpec, available_cpus
from pipelines.sample_data import ensure_default_dataset
from probe.measure.config import ProbeConfig, plan_lanes
from probe.measure.consumers import parse_consumer
from probe.measure.devices import cuda_devices, select_gpus
from probe.measure.runner import run_probe
from probe.store.db import Store
from probe.store.documents import read_run

RATES = (0.0, 10.0, 100.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default=None, help="as for `probe run` (default: all, or CPU)")
    parser.add_argument("--pipeline", default="torch", choices=["torch", "dali"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()

    plans = plan_lanes(select_gpus(args.gpus, cuda_devices()), None)
    cores = args.workers or max(1, available_cpus() // len(plans))
    spec = PipelineSpec(
        ensure_default_dataset(),
        batch_size=args.batch_size,
        dataloader=DataLoaderOptions(num_workers=cores),
        dali=DaliOptions(num_threads=cores),
    )
    throughput: dict[float, list[float]] = {rate: [] for rate in RATES}
    sampler_cpu: dict[float, list[float]] = {rate: [] for rate in RATES}
    with tempfile.TemporaryDirectory() as scratch, Store(Path(scratch) / "bench.db") as store:
        for round_number in range(args.rounds):
            shift = round_number % len(RATES)
            for rate in RATES[shift:] + RATES[:shift]:
                config = ProbeConfig(
                    backend=Backend(args.pipeline), spec=spec, lanes=plans,
                    consumer=parse_consumer("none"), warmup=5, batches=None,
                    duration_s=args.duration, sample_hz=rate,
                )  # fmt: skip
                run_id = run_probe(config, store)
                throughput[rate].append(read_run(store, run_id).images_per_s)
                if rate > 0:
                    sampler_cpu[rate].append(_coordinator_cpu_pct(store, run_id))
                print(
                    f"round {round_number + 1}, {rate:g} Hz: {throughput[rate][-1]:,.0f} images/s"
                )

    baseline = statistics.median(throughput[0.0])
    table = Table(
        title=f"Sampler overhead: {args.pipeline}, {len(plans)} lane(s), {args.rounds} rounds of "
        f"{args.duration:g} s, batch {args.batch_size}, {cores} workers/threads per lane"
    )
    for column in ("samplers", "images/s (median)", "each round", "vs off", "sampling CPU %"):
        table.add_column(column, justify="right")
    for rate in RATES:
        median = statistics.median(throughput[rate])
        cpu = statistics.median(sampler_cpu[rate]) if sampler_cpu[rate] else None
        table.add_row(
            "off" if rate == 0 else f"{rate:g} Hz",
            f"{median:,.0f}",
            " ".join(f"{x:,.0f}" for x in throughput[rate]),
            f"{median / baseline - 1:+.1%}",
            "-" if cpu is None else f"{cpu:.1f}% of one core",
        )
    Console(width=140).print(table)


def _coordinator_cpu_pct(store: Store, run_id: str) -> float:
    """CPU of the run's processes minus its lanes': the coordinating process, which samples."""
    host = store.host_samples(run_id)[2:]  # the first samples cover the lanes' start-up
    lanes = store.lane_cpu(run_id)
    by_time: dict[int, float] = {}
    for sample in lanes:
        by_time[sample.t_ns] = by_time.get(sample.t_ns, 0.0) + sample.cpu_pct
    # a mean: CPU time is counted in 10 ms ticks, so most short intervals read 0 or 10 ms
    return statistics.fmean((h.tree_cpu_pct or 0.0) - by_time.get(h.t_ns, 0.0) for h in host)


if __name__ == "__main__":
    main()
