"""Benchmark: how long a long run takes to open on the dashboard's Run page.

Writes one run into a fresh store through the store's writers (rollups included), ten minutes
of it a transaction per table: 8 GPUs sampled at 10 Hz for an hour (288,000 GPU rows), the
host at 10 Hz with 128 cores, the lanes' CPU, and 10 batches a second per lane; the lanes store
their figures at the end, as a probe's do. Then it opens the Run page on it (Streamlit's
AppTest, the page as a browser session would run it) and writes its reports with `probe report`
(the whole command, start-up included), and prints a table of how long each part took and how
large each report is. The samples are synthetic (smooth load with dips and bursts): the store
cannot tell, and opening a run reads them as it reads any other. A day (`--hours 24`, 6.9
million GPU rows, 2.4 GiB) takes about 11 minutes to write on a 2-core machine; `--keep` keeps
it to be opened again.

    python tests/benchmarks/dashboard_scale.py [--hours 1] [--gpus 8] [--repeat 3] [--keep DB]
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from pipelines.spec import DataLoaderOptions, PipelineSpec
from probe.judge.diagnosis import diagnose_run
from probe.present.charts import run_figures
from probe.records import (
    BatchEvent,
    GpuSample,
    HostSample,
    LaneCpuSample,
    LaneRecord,
    RunRecord,
    RunStatus,
)
from probe.store.db import Store
from probe.store.documents import lane_figures_from_store, read_run
from probe.store.series import latency_histogram, run_series

APP = Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py"
RUN_ID = "scale-run"


def write_run(store: Store, hours: float, gpus: int, hz: float = 10.0) -> str:
    """One long run, written in chunks as a probe would."""
    rng = random.Random(0)
    run_id = RUN_ID
    uuids = [f"GPU-scale-{i}" for i in range(gpus)]
    host = {
        "hostname": "scale",
        "cpus": 128,
        "gpus": [{"index": i, "uuid": u, "name": "NVIDIA H200"} for i, u in enumerate(uuids)],
    }
    spec = PipelineSpec(
        Path("/data/imagenet/train"), 256, dataloader=DataLoaderOptions(num_workers=16)
    )
    config = {
        "pipeline": "torch", "spec": spec.as_dict(), "consumer": "model:resnet50",
        "warmup": 5, "batches": None, "duration_s": hours * 3600, "sample_hz": hz,
        "lanes": [{"lane": i, "gpu": i, "shard_id": i, "num_shards": gpus} for i in range(gpus)],
    }  # fmt: skip
    run = RunRecord(
        run_id, "probe", "2026-11-21T00:00:00Z", RunStatus.RUNNING, None, "torch",
        "model:resnet50", "scale benchmark", config, host, "scale", None, 0, None,
    )  # fmt: skip
    lanes = [
        LaneRecord(run_id, i, i, u, i, gpus, "scale", None, RunStatus.RUNNING, None, None)
        for i, u in enumerate(uuids)
    ]
    store.create_run(run, lanes)
    ticks = int(hours * 3600 * hz)
    step_ns = int(1e9 / hz)
    chunk = int(600 * hz)  # ten minutes a transaction
    cores: tuple[float, ...] = ()
    for first in range(0, ticks, chunk):
        gpu_rows, host_rows, cpu_rows, events = [], [], [], []
        for tick in range(first, min(ticks, first + chunk)):
            t_ns = tick * step_ns
            phase = tick / (hz * 60)
            if tick % int(hz) == 0:  # the cores' load moves slowly: once a second
                cores = tuple(
                    min(100.0, max(0.0, 60 + 30 * math.sin(phase + c / 9))) for c in range(128)
                )
            for lane, uuid in enumerate(uuids):
                dip = 0.3 if rng.random() < 0.002 else 1.0  # rare stalls, kept by the bands
                busy = max(0.0, min(100.0, dip * (55 + 25 * math.sin(phase + lane))))
                gpu_rows.append(GpuSample(t_ns, uuid, busy + 10, busy, busy / 2, 0.0, None,
                                          70_000.0, None, None, 400.0, 0))  # fmt: skip
                cpu_rows.append(
                    LaneCpuSample(t_ns, lane, 900 + 100 * rng.random(), 120.0, 40.0, 17, 40)
                )
                if tick % 1 == 0:  # 10 batches a second per lane
                    wait = max(0.0, 0.03 + 0.02 * math.sin(phase * 3 + lane) + rng.gauss(0, 0.01))
                    events.append(BatchEvent(lane, tick, t_ns, wait, 0.07, 256, tick < 20))
            host_rows.append(HostSample(t_ns, sum(cores) / 128, cores, 0.5, 0.0, 12.0, 500_000.0,
                                        7000.0, 140))  # fmt: skip
        store.add_gpu_samples(run_id, gpu_rows)
        store.add_host_samples(run_id, "scale", host_rows)
        store.add_lane_cpu(run_id, cpu_rows)
        store.add_batches(run_id, events)
    for record in store.lanes(run_id):
        store.update_lane(run_id, record.lane, status=RunStatus.COMPLETED,
                          summary=lane_figures_from_store(store, run, record))  # fmt: skip
    store.finish_run(run_id, RunStatus.COMPLETED, None, ticks * step_ns)
    return run_id


def timed(work: object) -> tuple[float, object]:
    started = time.perf_counter()
    result = work()  # type: ignore[operator]
    return time.perf_counter() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--keep", type=Path, default=None, help="the store to write the run into and keep; "
        "one that holds it already is opened as it is (its hours and GPUs, not the flags')",
    )  # fmt: skip
    args = parser.parse_args()
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    with tempfile.TemporaryDirectory() as scratch:
        db = args.keep or Path(scratch) / "scale.db"
        rows: dict[str, list[float]] = {}
        with Store(db) as store:
            if any(run.run_id == RUN_ID for run in store.runs()):
                print(f"opening the run written before in {db}")
            else:
                took, _ = timed(lambda: write_run(store, args.hours, args.gpus))
                rows["writing the run (once)"] = [took]
            run = store.run(RUN_ID)
            hours = (run.ended_ns or 0) / 3600e9
            counts = store.sample_counts(RUN_ID)
            lanes = store.lanes(RUN_ID)
            events = sum(store.batch_totals(RUN_ID, x.lane, w).batches for x in lanes
                         for w in (False, True))  # fmt: skip
        print(f"{counts['gpu']:,} GPU rows, {counts['host']:,} host rows and {events:,} batch "
              f"events ({db.stat().st_size / 2**20:,.0f} MiB)")  # fmt: skip
        os.environ["FEEDSCOPE_DB"] = str(db)
        for _ in range(args.repeat):
            with Store(db) as store:
                parts = {
                    "run document": lambda: read_run(store, RUN_ID).to_json(),
                    "diagnosis": lambda: diagnose_run(store, RUN_ID),
                    "series (SQL, downsampled)": lambda: run_series(store, RUN_ID),
                    "latency histogram": lambda: latency_histogram(store, RUN_ID),
                }
                results = {}
                for name, work in parts.items():
                    took, results[name] = timed(work)
                    rows.setdefault(name, []).append(took)
                drawn = (results["series (SQL, downsampled)"], results["latency histogram"])
                took, _ = timed(lambda drawn=drawn: run_figures(*drawn))
                rows.setdefault("figures (plotly)", []).append(took)
            st.cache_data.clear()  # every open measured cold, as a first visit is
            page = AppTest.from_file(str(APP), default_timeout=60)
            page.query_params["run"] = RUN_ID
            page.run()  # the Runs page: a browser's first request
            page.switch_page("views/run.py")
            took, _ = timed(page.run)
            assert not page.exception, [e.value for e in page.exception]
            rows.setdefault("Run page opened cold, all of it (AppTest)", []).append(took)
            for form, what in (("md", "Markdown summary"), ("html", "HTML report"),
                               ("json", "JSON report")):  # fmt: skip
                out = Path(scratch) / f"report.{form}"
                command = [sys.executable, "-m", "probe", "report", RUN_ID, "--db", str(db),
                           "-o", str(out)]  # fmt: skip
                took, _ = timed(
                    lambda command=command: subprocess.run(command, check=True, capture_output=True)
                )
                name = f"{what}: probe report -o report.{form} ({out.stat().st_size / 1e6:.1f} MB)"
                rows.setdefault(name, []).append(took)
    table = Table(title=f"Opening a run of {hours:g} h on {len(lanes)} GPUs at 10 Hz "
                  f"({counts['gpu']:,} GPU rows)")  # fmt: skip
    for column in ("part", "median s", "each run"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for name, values in rows.items():
        table.add_row(
            name, f"{statistics.median(values):.2f}", " ".join(f"{v:.2f}" for v in values)
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
