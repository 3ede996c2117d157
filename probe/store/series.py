"""What the dashboard and the reports draw: a run's series, downsampled, and a live run's.

Long runs hold hundreds of thousands of samples (an hour at 10 Hz on 8 GPUs: 288,000 GPU rows);
the series here are aggregated in SQL per time bucket, about `points` buckets per run, keeping
each bucket's minimum, mean and maximum so that a downsampled line still shows its peaks and
dips. Times are seconds since the run's first record.

`slowest_lanes` names, per batch interval, the lane that waited longest for data: under
synchronous DDP every step waits for the slowest rank, so that lane set the pace.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.metrics import KERNEL_ACTIVE, MEMORY, NVJPG, SM_ACTIVE, wait_share
from probe.records import HostSample, RunRecord
from probe.store.db import Store
from probe.store.schema import host_from_row

# GPU figures downsampled for the charts: the busy-ness figures, the decoder and memory
BUCKETED_GPU_COLUMNS = (SM_ACTIVE.name, KERNEL_ACTIVE.name, NVJPG.name, MEMORY.name)
POINTS = 600  # buckets per series: a chart's width in pixels, about
MIN_BATCH_BUCKET_NS = 1_000_000_000  # rates and shares need several batches per interval
MIN_SAMPLE_BUCKET_NS = 100_000_000  # the default sampling interval


@dataclass(frozen=True)
class Band:
    """A downsampled series: per bucket, its time and the minimum, mean and maximum."""

    t_s: list[float] = field(default_factory=list)
    low: list[float | None] = field(default_factory=list)
    mean: list[float | None] = field(default_factory=list)
    high: list[float | None] = field(default_factory=list)

    def add(self, t_s: float, low: float | None, mean: float | None, high: float | None) -> None:
        self.t_s.append(t_s)
        self.low.append(low)
        self.mean.append(mean)
        self.high.append(high)


@dataclass(frozen=True)
class GpuSeries:
    uuid: str
    label: str  # "GPU 0 (NVIDIA H200)"
    busy_metric: str  # the title of SM activity (GPM), else of kernel-active (NVML)
    busy: Band  # SM activity where GPM has it, else kernel-active
    kernel_active: Band
    nvjpg: Band
    memory_mib: Band


@dataclass(frozen=True)
class LaneSeries:
    lane: int
    label: str  # "lane 0: cuda:0, shard 0/2"
    gpu_uuid: str | None
    t_s: list[float] = field(default_factory=list)
    images_per_s: list[float] = field(default_factory=list)
    data_wait_frac: list[float | None] = field(default_factory=list)
    latency_mean_ms: list[float] = field(default_factory=list)
    latency_max_ms: list[float] = field(default_factory=list)
    cpu_t_s: list[float] = field(default_factory=list)
    cpu_pct: list[float | None] = field(default_factory=list)


@dataclass(frozen=True)
class CpuStrip:
    """CPU busy share per core over time (a heat strip)."""

    t_s: list[float]
    per_core: list[list[float]]  # [core][time]
    total: list[float]


@dataclass(frozen=True)
class RunSeries:
    run_id: str
    start_ns: int  # time 0: when the run started
    bucket_s: float
    lanes: list[LaneSeries]
    gpus: list[GpuSeries]
    cpu: CpuStrip | None
    span_s: tuple[float, float]  # the time range every chart of the run shows

    @property
    def batch_bucket_s(self) -> float:
        """The length of the lanes' intervals (`LaneSeries.t_s`): at least a second, so that
        each holds several batches."""
        return max(MIN_BATCH_BUCKET_NS / 1e9, self.bucket_s)


@dataclass(frozen=True)
class SlowestLanes:
    """Per batch interval in which two lanes or more measured data-wait: the lane that waited
    most (None where none waited more than the others), and its data-wait."""

    bucket_s: float  # the intervals' length
    t_s: list[float]  # each interval's middle
    lane: list[int | None]
    data_wait_frac: list[float]  # the highest lane's

    @property
    def seconds(self) -> float:
        """How long the lanes were compared."""
        return len(self.t_s) * self.bucket_s

    def counts(self) -> dict[int, int]:
        """Per lane, the intervals it was the slowest in; the most first (ties: lower lane)."""
        out: dict[int, int] = {}
        for lane in self.lane:
            if lane is not None:
                out[lane] = out.get(lane, 0) + 1
        return dict(sorted(out.items(), key=lambda item: (-item[1], item[0])))

    @property
    def ties(self) -> int:
        """Intervals where no lane waited more than the others."""
        return self.lane.count(None)


TIE_FRAC = 0.001  # a lane is the slowest only if it waited 0.1% of the interval more


def slowest_lanes(series: RunSeries, tie_frac: float = TIE_FRAC) -> SlowestLanes | None:
    """For each interval, the lane with the highest data-wait; an interval where the highest
    is within `tie_frac` of the next (all lanes at 0, say) has none. Only intervals where two
    lanes or more measured count; None for a run of one lane, or with no such interval."""
    if len(series.lanes) < 2:
        return None
    waits: dict[float, list[tuple[float, int]]] = {}
    for lane in series.lanes:
        for t_s, wait in zip(lane.t_s, lane.data_wait_frac, strict=True):
            if wait is not None:
                waits.setdefault(t_s, []).append((wait, lane.lane))
    out = SlowestLanes(series.batch_bucket_s, [], [], [])
    for t_s, measured in sorted(waits.items()):
        if len(measured) < 2:
            continue
        ranked = sorted(measured, key=lambda item: (-item[0], item[1]))
        (top, first), (second, _) = ranked[0], ranked[1]
        out.t_s.append(t_s)
        out.lane.append(first if top - second > tie_frac else None)
        out.data_wait_frac.append(top)
    return out if out.t_s else None


def run_series(store: Store, run_id: str, points: int = POINTS) -> RunSeries | None:
    """A run's timelines, about `points` buckets each; None if it recorded nothing yet."""
    run = store.run(run_id)
    span = store.time_span(run.run_id)
    if span is None:
        return None
    start = run.started_ns
    end = max(span[1], run.ended_ns or span[1])
    bucket_ns = max(MIN_SAMPLE_BUCKET_NS, -(-(end - start) // points))  # ceiling division
    batch_bucket_ns = max(MIN_BATCH_BUCKET_NS, bucket_ns)  # as `RunSeries.batch_bucket_s`
    batch_bucket_s = batch_bucket_ns / 1e9
    lanes = {
        lane.lane: LaneSeries(
            lane.lane,
            _lane_label(lane.lane, lane.gpu_index, lane.shard_id, lane.num_shards),
            lane.gpu_uuid,
        )
        for lane in store.lanes(run.run_id)
    }
    # Four independent scans of long tables: SQLite lets go of the GIL while it scans, so
    # they run side by side, each on a connection of its own.
    with ThreadPoolExecutor(max_workers=4) as pool:
        batches, cpu, gpu, host = pool.map(
            lambda read: _read(store.path, read),
            [
                lambda s: batch_buckets(s, run.run_id, start, batch_bucket_ns),
                lambda s: lane_cpu_buckets(s, run.run_id, start, bucket_ns),
                lambda s: gpu_buckets(s, run.run_id, start, bucket_ns),
                lambda s: host_rows_bucketed(s, run.run_id, start, bucket_ns),
            ],
        )
    for row in batches:
        series = lanes.get(row["lane"])
        if series is None:
            continue
        series.t_s.append((row["bucket"] + 0.5) * batch_bucket_s)  # the interval's middle
        series.images_per_s.append(row["images"] / batch_bucket_s)
        series.data_wait_frac.append(wait_share(row["wait_s"], row["step_s"]))
        series.latency_mean_ms.append(row["latency_mean_s"] * 1e3)
        series.latency_max_ms.append(row["latency_max_s"] * 1e3)
    for row in cpu:
        series = lanes.get(row["lane"])
        if series is not None:
            series.cpu_t_s.append(row["bucket"] * bucket_ns / 1e9)
            series.cpu_pct.append(row["cpu_pct"])
    return RunSeries(
        run_id=run.run_id,
        start_ns=start,
        bucket_s=bucket_ns / 1e9,
        lanes=[lanes[key] for key in sorted(lanes)],
        gpus=_gpu_series(gpu, run, bucket_ns),
        cpu=_cpu_strip(host, start),
        span_s=(0.0, (end - start) / 1e9),
    )


def _read(path: Path, read: Callable[[Store], Any]) -> Any:
    with Store(path) as store:
        return read(store)


def _gpu_series(gpu_rows: list[Any], run: RunRecord, bucket_ns: int) -> list[GpuSeries]:
    names = {
        g.get("uuid"): f"GPU {g.get('index')} ({g.get('name')})" for g in run.host.get("gpus", [])
    }
    rows_by_gpu: dict[str, list[Any]] = {}
    for row in gpu_rows:
        rows_by_gpu.setdefault(row["gpu_uuid"], []).append(row)
    out = []
    for uuid, rows in rows_by_gpu.items():
        has_gpm = any(row["sm_active_pct_mean"] is not None for row in rows)
        busy_column = "sm_active_pct" if has_gpm else "kernel_active_pct"
        bands = {
            c: Band() for c in (busy_column, "kernel_active_pct", "nvjpg_pct", "memory_used_mib")
        }
        for row in rows:
            t_s = row["bucket"] * bucket_ns / 1e9
            for column, band in bands.items():
                band.add(t_s, row[f"{column}_min"], row[f"{column}_mean"], row[f"{column}_max"])
        out.append(
            GpuSeries(
                uuid=uuid,
                label=names.get(uuid, uuid),
                busy_metric=(SM_ACTIVE if has_gpm else KERNEL_ACTIVE).title,
                busy=bands[busy_column],
                kernel_active=bands["kernel_active_pct"],
                nvjpg=bands["nvjpg_pct"],
                memory_mib=bands["memory_used_mib"],
            )
        )
    return out


def _cpu_strip(rows: list[HostSample], start: int) -> CpuStrip | None:
    cores = max((len(r.per_core_pct) for r in rows), default=0)
    if cores == 0:
        return None
    per_core = [
        [r.per_core_pct[c] if c < len(r.per_core_pct) else 0.0 for r in rows] for c in range(cores)
    ]
    return CpuStrip(
        t_s=[(r.t_ns - start) / 1e9 for r in rows],
        per_core=per_core,
        total=[r.cpu_pct for r in rows],
    )


@dataclass(frozen=True)
class LatencyHistogram:
    """Measured batch latencies per lane: bins of `bin_ms` up to `overflow_ms`, where one last
    bin gathers all slower batches (so that a rare stall does not squash the chart)."""

    bin_ms: float
    overflow_ms: float
    lanes: dict[int, tuple[list[float], list[int]]]  # lane -> bin starts (ms), counts


def latency_histogram(store: Store, run_id: str, bins: int = 60) -> LatencyHistogram | None:
    """The run's batch latency histogram, its bins spread over 1.5 x the slowest lane's p99;
    None if no batch was measured."""
    worst = 0.0
    for lane in store.lanes(run_id):
        figures = lane.summary or {}
        p99 = (figures.get("batch_latency_ms") or {}).get("p99")
        worst = max(worst, p99 or 0.0)
    bin_ms = max(0.05, worst * 1.5 / bins) if worst else 1.0
    lanes: dict[int, tuple[list[float], list[int]]] = {}
    for row in latency_bins(store, run_id, bin_ms, bins):
        starts, counts = lanes.setdefault(row["lane"], ([], []))
        starts.append(row["bin"] * bin_ms)
        counts.append(row["n"])
    return LatencyHistogram(bin_ms, bins * bin_ms, lanes) if lanes else None


def _lane_label(lane: int, gpu: int | None, shard: int, shards: int) -> str:
    device = "cpu" if gpu is None else f"cuda:{gpu}"
    return f"lane {lane}: {device}, shard {shard}/{shards}"


class LiveSeries:
    """A running run's last `window_s` seconds, kept up to date by reading only new rows."""

    def __init__(self, run_id: str, window_s: float = 300.0) -> None:
        self.run_id = run_id
        self.window_s = window_s
        self.cursors = {"batches": 0, "gpu_samples": 0, "lane_cpu": 0, "host_samples": 0}
        self.start_ns: int | None = None
        self.batches: dict[int, dict[int, list[float]]] = {}  # lane -> second -> sums
        self.gpus: dict[str, dict[int, list[float | None]]] = {}  # uuid -> second -> values
        self.lane_cpu: dict[int, dict[int, float]] = {}
        self.cores: dict[int, tuple[float, ...]] = {}
        self.processes: dict[int, tuple[float, float, int, int]] = {}  # latest per lane

    def update(self, store: Store) -> int:
        """Reads what was recorded since the last update; returns how many rows."""
        read = 0
        for table in self.cursors:
            rows = rows_since(store, table, self.run_id, self.cursors[table])
            if not rows:
                continue
            read += len(rows)
            self.cursors[table] = rows[-1]["t_ns"]
            if self.start_ns is None:
                self.start_ns = store.run(self.run_id).started_ns
            getattr(self, f"_add_{table}")(rows)
        self._forget_old()
        return read

    def series(self, store: Store) -> RunSeries | None:
        """The window as a `RunSeries`, in one-second buckets."""
        if self.start_ns is None:
            return None
        run = store.run(self.run_id)
        lanes = []
        for lane in store.lanes(self.run_id):
            series = LaneSeries(
                lane.lane,
                _lane_label(lane.lane, lane.gpu_index, lane.shard_id, lane.num_shards),
                lane.gpu_uuid,
            )
            for second, (images, wait, step, worst, count) in sorted(
                self.batches.get(lane.lane, {}).items()
            ):
                busy = wait + step
                series.t_s.append(float(second))
                series.images_per_s.append(images)
                series.data_wait_frac.append(wait_share(wait, step))
                series.latency_mean_ms.append(1e3 * busy / count if count else 0.0)
                series.latency_max_ms.append(1e3 * worst)
            for second, cpu in sorted(self.lane_cpu.get(lane.lane, {}).items()):
                series.cpu_t_s.append(float(second))
                series.cpu_pct.append(cpu)
            lanes.append(series)
        names = {
            g.get("uuid"): f"GPU {g.get('index')} ({g.get('name')})"
            for g in run.host.get("gpus", [])
        }
        gpus = []
        for uuid, per_second in self.gpus.items():
            has_gpm = any(values[0] is not None for values in per_second.values())
            bands = [Band(), Band(), Band(), Band()]
            for second, values in sorted(per_second.items()):
                shown = (values[0] if has_gpm else values[1], values[1], values[2], values[3])
                for band, value in zip(bands, shown, strict=True):
                    band.add(float(second), value, value, value)
            gpus.append(
                GpuSeries(
                    uuid,
                    names.get(uuid, uuid),
                    (SM_ACTIVE if has_gpm else KERNEL_ACTIVE).title,
                    *bands,
                )
            )
        times = sorted(self.cores)
        strip = None
        if times and self.cores[times[0]]:
            cores = len(self.cores[times[0]])
            strip = CpuStrip(
                t_s=[float(t) for t in times],
                per_core=[
                    [self.cores[t][c] if c < len(self.cores[t]) else 0.0 for t in times]
                    for c in range(cores)
                ],
                total=[sum(self.cores[t]) / max(1, len(self.cores[t])) for t in times],
            )
        newest = self._second(max(self.cursors.values())) + 1.0
        span = (max(0.0, newest - self.window_s), newest)
        return RunSeries(self.run_id, self.start_ns, 1.0, lanes, gpus, strip, span)

    def _second(self, t_ns: int) -> int:
        return (t_ns - (self.start_ns or t_ns)) // 1_000_000_000

    def _add_batches(self, rows: list[Any]) -> None:
        for row in rows:
            if row["warmup"]:
                continue
            bucket = self.batches.setdefault(row["lane"], {}).setdefault(
                self._second(row["t_ns"]), [0.0, 0.0, 0.0, 0.0, 0]
            )
            bucket[0] += row["size"]
            bucket[1] += row["wait_s"]
            bucket[2] += row["step_s"]
            bucket[3] = max(bucket[3], row["wait_s"] + row["step_s"])
            bucket[4] += 1

    def _add_gpu_samples(self, rows: list[Any]) -> None:
        for row in rows:
            self.gpus.setdefault(row["gpu_uuid"], {})[self._second(row["t_ns"])] = [
                row["sm_active_pct"],
                row["kernel_active_pct"],
                row["nvjpg_pct"],
                row["memory_used_mib"],
            ]

    def _add_lane_cpu(self, rows: list[Any]) -> None:
        for row in rows:
            self.lane_cpu.setdefault(row["lane"], {})[self._second(row["t_ns"])] = row["cpu_pct"]
            self.processes[row["lane"]] = (
                row["cpu_pct"],
                row["main_thread_cpu_pct"],
                row["processes"],
                row["threads"],
            )

    def _add_host_samples(self, rows: list[Any]) -> None:
        import json

        for row in rows:
            self.cores[self._second(row["t_ns"])] = tuple(json.loads(row["per_core"]))

    def _forget_old(self) -> None:
        if self.start_ns is None:
            return
        newest = self._second(max(self.cursors.values()))
        oldest = newest - int(self.window_s)
        keyed: list[dict[int, Any]] = [
            *self.batches.values(),
            *self.gpus.values(),
            *self.lane_cpu.values(),
            self.cores,
        ]
        for per_second in keyed:
            for second in [t for t in per_second if t < oldest]:
                del per_second[second]


# SQL aggregates: what long runs need without loading every row


def gpu_buckets(
    store: Store, run_id: str, start_ns: int, bucket_ns: int, since_ns: int | None = None
) -> list[sqlite3.Row]:
    """GPU samples per GPU and time bucket: min, mean and max of the busy-ness figures, so
    that downsampled lines keep their peaks and dips."""
    columns = ", ".join(
        f"MIN({c}) AS {c}_min, AVG({c}) AS {c}_mean, MAX({c}) AS {c}_max"
        for c in BUCKETED_GPU_COLUMNS
    )
    return store.query(
        f"SELECT gpu_uuid, (t_ns - ?) / ? AS bucket, {columns} FROM gpu_samples "
        "WHERE run_id = ? AND t_ns > ? GROUP BY gpu_uuid, bucket ORDER BY gpu_uuid, bucket",
        (start_ns, bucket_ns, run_id, since_ns if since_ns is not None else -1),
    )


def batch_buckets(
    store: Store, run_id: str, start_ns: int, bucket_ns: int, since_ns: int | None = None
) -> list[sqlite3.Row]:
    """Measured batch events per lane and time bucket: images, wait and step sums, mean and
    worst latency."""
    return store.query(
        "SELECT lane, (t_ns - ?) / ? AS bucket, COUNT(*) AS batches, SUM(size) AS images, "
        "SUM(wait_s) AS wait_s, SUM(step_s) AS step_s, "
        "AVG(wait_s + step_s) AS latency_mean_s, MAX(wait_s + step_s) AS latency_max_s "
        "FROM batches WHERE run_id = ? AND warmup = 0 AND t_ns > ? "
        "GROUP BY lane, bucket ORDER BY lane, bucket",
        (start_ns, bucket_ns, run_id, since_ns if since_ns is not None else -1),
    )


def latency_bins(store: Store, run_id: str, bin_ms: float, last_bin: int) -> list[sqlite3.Row]:
    """Measured batch latencies (wait + step) counted per lane in bins of `bin_ms`; bin
    `last_bin` counts all from there on."""
    return store.query(
        "SELECT lane, MIN(CAST((wait_s + step_s) * 1000 / ? AS INTEGER), ?) AS bin, "
        "COUNT(*) AS n FROM batches WHERE run_id = ? AND warmup = 0 "
        "GROUP BY lane, bin ORDER BY lane, bin",
        (bin_ms, last_bin, run_id),
    )


def lane_cpu_buckets(store: Store, run_id: str, start_ns: int, bucket_ns: int) -> list[sqlite3.Row]:
    return store.query(
        "SELECT lane, (t_ns - ?) / ? AS bucket, AVG(cpu_pct) AS cpu_pct, "
        "AVG(main_thread_cpu_pct) AS main_thread_cpu_pct, MAX(processes) AS processes, "
        "MAX(threads) AS threads FROM lane_cpu WHERE run_id = ? "
        "GROUP BY lane, bucket ORDER BY lane, bucket",
        (start_ns, bucket_ns, run_id),
    )


def host_rows_bucketed(
    store: Store, run_id: str, start_ns: int, bucket_ns: int
) -> list[HostSample]:
    """The first host sample of each time bucket (per-core figures are long to decode)."""
    rows = store.query(
        "SELECT * FROM host_samples WHERE run_id = :run AND t_ns IN ("
        " SELECT MIN(t_ns) FROM host_samples WHERE run_id = :run"
        " GROUP BY (t_ns - :start) / :bucket)"
        " ORDER BY t_ns",
        {"run": run_id, "start": start_ns, "bucket": bucket_ns},
    )
    return [host_from_row(row) for row in rows]


def rows_since(store: Store, table: str, run_id: str, since_ns: int) -> list[sqlite3.Row]:
    """Rows of `batches`, `gpu_samples`, `lane_cpu` or `host_samples` newer than a time."""
    if table not in {"batches", "gpu_samples", "lane_cpu", "host_samples"}:
        raise ValueError(f"not a table of samples or events: {table}")
    return store.query(
        f"SELECT * FROM {table} WHERE run_id = ? AND t_ns > ? ORDER BY t_ns", (run_id, since_ns)
    )
