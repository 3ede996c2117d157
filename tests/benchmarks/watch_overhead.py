"""Benchmark: what `watch` costs a training loop.

Two measurements, each in interleaved rounds (plain, watched, watched without samplers, watched
with the Prometheus endpoint and TensorBoard on, in a different order each round) and printed
as a table of medians:

- per batch: a loop over ready-made batches with an empty step, plain and watched; the watched
  loop's extra time divided by its batches is what recording one batch costs;
- throughput: the DataLoader pipeline on the sample data (2 workers) feeding a fixed step of
  `--step-ms`, plain and watched as one long iteration: images/s, and the watched loop's
  change against the plain one.

    python tests/benchmarks/watch_overhead.py [--rounds 5] [--batches 200000] [--seconds 15]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from pipelines import Backend, DataLoaderOptions, PipelineSpec, build_pipeline
from pipelines.sample_data import ensure_default_dataset
from probe import watch


def timed_loop(batches: Iterable[Any], step: Callable[[], None]) -> tuple[float, int]:
    count = 0
    started = time.perf_counter()
    for _ in batches:
        step()
        count += 1
    return time.perf_counter() - started, count


def for_seconds(batches: Iterable[Any], seconds: float) -> Iterator[Any]:
    """`batches` over and over (epochs) for `seconds`: one watched iteration, as a long epoch."""
    end = time.perf_counter() + seconds
    while True:
        for batch in batches:
            if time.perf_counter() >= end:
                return
            yield batch


def free_port() -> int:
    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        return int(probe_socket.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=200_000, help="per-batch loop length")
    parser.add_argument("--seconds", type=float, default=15.0, help="per throughput run")
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args()

    ready = [object()] * args.batches
    per_batch: dict[str, list[float]] = {}
    rate: dict[str, list[float]] = {}
    spec = PipelineSpec(ensure_default_dataset(), 64, dataloader=DataLoaderOptions(num_workers=2))
    with tempfile.TemporaryDirectory() as scratch:
        db = Path(scratch) / "watch.db"
        port = free_port()
        ways: dict[str, Callable[[Iterable[Any]], Iterable[Any]]] = {
            "plain": lambda it: it,
            "watched, 10 Hz samplers": lambda it: watch(it, db=db),
            "watched, no samplers": lambda it: watch(it, db=db, sample_hz=0),
            "watched, endpoint + TensorBoard": lambda it: watch(
                it, db=db, metrics_port=port, tensorboard=Path(scratch) / "tb"
            ),
        }
        list(watch(range(10), db=db))  # imports and first-use costs, paid once per process
        for round_ in range(args.rounds):
            order = list(ways.items())
            order = order[round_ % len(order) :] + order[: round_ % len(order)]
            for name, wrap in order:
                seconds, count = timed_loop(wrap(ready), lambda: None)
                per_batch.setdefault(name, []).append(seconds / count)
            with build_pipeline(spec, Backend.TORCH) as pipeline:  # iterable of batches
                for _ in pipeline:  # warm the page cache
                    pass
                for name, wrap in order:
                    images = 0
                    started = time.perf_counter()
                    for batch in wrap(for_seconds(pipeline, args.seconds)):
                        time.sleep(args.step_ms / 1000)
                        images += int(batch.images.shape[0])
                    rate.setdefault(name, []).append(images / (time.perf_counter() - started))
    plain_batch = statistics.median(per_batch["plain"])
    plain_rate = statistics.median(rate["plain"])
    table = Table(title=f"watch's cost: {args.rounds} interleaved rounds, medians")
    for column in ("loop", "µs per batch", "recording costs µs", "images/s", "vs plain"):
        table.add_column(column, justify="left" if column == "loop" else "right")
    for name, times in per_batch.items():
        batch = statistics.median(times)
        throughput = statistics.median(rate[name])
        table.add_row(
            name, f"{batch * 1e6:.2f}", f"{(batch - plain_batch) * 1e6:.2f}", f"{throughput:,.0f}",
            f"{throughput / plain_rate - 1:+.1%}",
        )  # fmt: skip
    Console(width=120).print(table)
    spread = " / ".join(f"{min(v):,.0f}-{max(v):,.0f}" for v in rate.values())
    print(f"images/s ranges over rounds ({' / '.join(rate)}): {spread}")


if __name__ == "__main__":
    main()
