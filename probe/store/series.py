"""What the dashboard and the reports draw: a run's series, downsampled, and a live run's.

Long runs hold millions of samples (a day at 10 Hz on 8 GPUs: 6.9 million GPU rows); the series
here are about `points` buckets per run, each keeping its minimum, mean and maximum so that a
downsampled line still shows its peaks and dips. They are read from the rollups
(`probe.store.rollups`): whole buckets of the coarsest resolution that gives the chart two thirds
of its points or more (`resolution`), a bounded number of rows whatever the run's length; a run
shorter than `points` seconds from its raw rows. Times are seconds since the run's start.

`slowest_lanes` names, per batch interval, the lane that waited longest for data: under
synchronous DDP every step waits for the slowest rank, so that lane set the pace.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from probe.metrics import KERNEL_ACTIVE, MEMORY, NVJPG, SM_ACTIVE, wait_share
from probe.records import HostSample, RunRecord
from probe.store.db import Store
from probe.store.rollups import COARSEST_S, RESOLUTIONS_S, SECOND_NS, floor_div, histogram_bin_us
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
    res_s, bucket_ns = resolution(max(MIN_SAMPLE_BUCKET_NS, -(-(end - start) // points)))
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
    for row in batch_buckets(store, run.run_id, batch_bucket_ns):
        series = lanes.get(row["lane"])
        if series is None:
            continue
        series.t_s.append((row["slot"] + 0.5) * batch_bucket_s)  # the interval's middle
        series.images_per_s.append(row["images"] / batch_bucket_s)
        series.data_wait_frac.append(wait_share(row["wait_s"], row["step_s"]))
        series.latency_mean_ms.append(row["latency_mean_s"] * 1e3)
        series.latency_max_ms.append(row["latency_max_s"] * 1e3)
    for row in lane_cpu_buckets(store, run.run_id, start, bucket_ns, res_s):
        series = lanes.get(row["lane"])
        if series is not None:
            series.cpu_t_s.append(row["slot"] * bucket_ns / 1e9)
            series.cpu_pct.append(row["cpu_pct"])
    return RunSeries(
        run_id=run.run_id,
        start_ns=start,
        bucket_s=bucket_ns / 1e9,
        lanes=[lanes[key] for key in sorted(lanes)],
        gpus=_gpu_series(gpu_buckets(store, run.run_id, start, bucket_ns, res_s), run, bucket_ns),
        cpu=_cpu_strip(host_rows_bucketed(store, run.run_id, start, bucket_ns, res_s), start),
        span_s=(0.0, (end - start) / 1e9),
    )


def resolution(wanted_ns: int) -> tuple[int | None, int]:
    """The rollup resolution (s) to draw buckets of about `wanted_ns` from, and the buckets'
    length, a whole number of its buckets: the coarsest resolution whose buckets then are at
    most 1.5 x `wanted_ns` (two thirds of the points, or more), else the finest; None and
    `wanted_ns` (raw rows) for buckets shorter than the finest resolution."""
    fits = [r for r in RESOLUTIONS_S if r * SECOND_NS <= wanted_ns]
    for res_s in reversed(fits):
        res_ns = res_s * SECOND_NS
        bucket_ns = -(-wanted_ns // res_ns) * res_ns
        if 2 * bucket_ns <= 3 * wanted_ns or res_s == fits[0]:
            return res_s, bucket_ns
    return None, wanted_ns


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
            t_s = row["slot"] * bucket_ns / 1e9
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
    """The run's batch latency histogram, its bins spread over 1.5 x the slowest lane's p99
    (widened to a whole number of the stored bins: at most a few percent); None if no batch
    was measured. A batch counts by its latency to the microsecond."""
    worst = 0.0
    for lane in store.lanes(run_id):
        figures = lane.summary or {}
        p99 = (figures.get("batch_latency_ms") or {}).get("p99")
        worst = max(worst, p99 or 0.0)
    bin_us = histogram_bin_us(max(0.05, worst * 1.5 / bins) if worst else 1.0, bins)
    bin_ms = bin_us / 1000
    lanes: dict[int, tuple[list[float], list[int]]] = {}
    for row in store.query(
        "SELECT lane, MIN(key_us / :bin, :last) AS bin, SUM(n) AS n FROM batch_bins "
        "WHERE run_id = :run AND kind = 'latency' GROUP BY lane, bin ORDER BY lane, bin",
        {"bin": bin_us, "last": bins, "run": run_id},
    ):
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
        """Reads what was recorded since the last update (at first, the window's last
        `window_s` seconds and a minute more); returns how many rows."""
        if self.start_ns is None:
            span = store.time_span(self.run_id)
            if span is None:
                return 0
            self.start_ns = store.run(self.run_id).started_ns
            since = span[1] - int((self.window_s + 60) * 1e9)
            self.cursors = {table: max(at, since) for table, at in self.cursors.items()}
        read = 0
        for table in self.cursors:
            rows = rows_since(store, table, self.run_id, self.cursors[table])
            if not rows:
                continue
            read += len(rows)
            self.cursors[table] = rows[-1]["t_ns"]
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
        return (t_ns - (t_ns if self.start_ns is None else self.start_ns)) // SECOND_NS

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


# SQL aggregates: rollups for long runs, raw rows for short ones


def gpu_buckets(
    store: Store, run_id: str, start_ns: int, bucket_ns: int, res_s: int | None
) -> list[sqlite3.Row]:
    """GPU samples per GPU and time bucket (`slot`): min, mean and max of the busy-ness
    figures, so that downsampled lines keep their peaks and dips; from the rollups at `res_s`,
    or the raw rows (None)."""
    if res_s is None:
        columns = ", ".join(
            f"MIN({c}) AS {c}_min, AVG({c}) AS {c}_mean, MAX({c}) AS {c}_max"
            for c in BUCKETED_GPU_COLUMNS
        )
        slot = floor_div("t_ns - :start", ":bucket")
        source = "gpu_samples WHERE run_id = :run"
    else:
        columns = ", ".join(
            f"MIN({c}_min) AS {c}_min, TOTAL({c}_sum) / SUM({c}_n) AS {c}_mean, "
            f"MAX({c}_max) AS {c}_max"
            for c in BUCKETED_GPU_COLUMNS
        )
        slot = floor_div("bucket", str(bucket_ns // (res_s * SECOND_NS)))
        source = "gpu_rollup WHERE run_id = :run AND res_s = :res"
    return store.query(
        f"SELECT gpu_uuid, {slot} AS slot, {columns} FROM {source} "
        "GROUP BY gpu_uuid, slot ORDER BY gpu_uuid, slot",
        {"start": start_ns, "bucket": bucket_ns, "run": run_id, "res": res_s},
    )


def batch_buckets(store: Store, run_id: str, bucket_ns: int) -> list[sqlite3.Row]:
    """Measured batch events per lane and time bucket (`slot`; `bucket_ns` a whole number of
    seconds): images, wait and step sums, mean and worst latency."""
    res_s = next(r for r in reversed(RESOLUTIONS_S) if bucket_ns % (r * SECOND_NS) == 0)
    slot = floor_div("bucket", str(bucket_ns // (res_s * SECOND_NS)))
    return store.query(
        f"SELECT lane, {slot} AS slot, SUM(images) AS images, TOTAL(wait_s) AS wait_s, "
        "TOTAL(step_s) AS step_s, TOTAL(seconds) / SUM(batches) AS latency_mean_s, "
        "MAX(latency_max_s) AS latency_max_s FROM batch_rollup "
        "WHERE run_id = ? AND res_s = ? AND warmup = 0 GROUP BY lane, slot ORDER BY lane, slot",
        (run_id, res_s),
    )


def lane_cpu_buckets(
    store: Store, run_id: str, start_ns: int, bucket_ns: int, res_s: int | None
) -> list[sqlite3.Row]:
    """The lanes' mean CPU per time bucket (`slot`), as `gpu_buckets`."""
    if res_s is None:
        slot, mean = floor_div("t_ns - :start", ":bucket"), "AVG(cpu_pct)"
        source = "lane_cpu WHERE run_id = :run"
    else:
        slot = floor_div("bucket", str(bucket_ns // (res_s * SECOND_NS)))
        mean, source = (
            "TOTAL(cpu_pct_sum) / SUM(cpu_pct_n)",
            "lane_cpu_rollup WHERE run_id = :run AND res_s = :res",
        )
    return store.query(
        f"SELECT lane, {slot} AS slot, {mean} AS cpu_pct FROM {source} "
        "GROUP BY lane, slot ORDER BY lane, slot",
        {"start": start_ns, "bucket": bucket_ns, "run": run_id, "res": res_s},
    )


def host_rows_bucketed(
    store: Store, run_id: str, start_ns: int, bucket_ns: int, res_s: int | None
) -> list[HostSample]:
    """The first host sample of each time bucket (per-core figures are long to decode); the
    rollups name it by its host and time (`res_s`), else the raw rows are grouped (None)."""
    if res_s is None:
        first = (
            "SELECT hostname, MIN(t_ns) AS t_ns FROM host_samples WHERE run_id = :run "
            f"GROUP BY {floor_div('t_ns - :start', ':bucket')}"
        )
    else:
        first = (
            "SELECT hostname, MIN(first_ns) AS t_ns FROM host_rollup "
            "WHERE run_id = :run AND res_s = :res "
            f"GROUP BY {floor_div('bucket', str(bucket_ns // (res_s * SECOND_NS)))}"
        )
    rows = store.query(
        f"SELECT h.* FROM ({first}) AS f JOIN host_samples AS h ON h.run_id = :run "
        "AND h.hostname = f.hostname AND h.t_ns = f.t_ns ORDER BY h.t_ns",
        {"run": run_id, "start": start_ns, "bucket": bucket_ns, "res": res_s},
    )
    return [host_from_row(row) for row in rows]


_KEYS = {
    "batches": "lane",
    "gpu_samples": "gpu_uuid",
    "lane_cpu": "lane",
    "host_samples": "hostname",
}
_ROLLUPS = {
    "batches": "batch_rollup", "gpu_samples": "gpu_rollup", "lane_cpu": "lane_cpu_rollup",
    "host_samples": "host_rollup",
}  # fmt: skip


def rows_since(store: Store, table: str, run_id: str, since_ns: int) -> list[sqlite3.Row]:
    """Rows of `batches`, `gpu_samples`, `lane_cpu` or `host_samples` newer than a time, in
    time order; read GPU by GPU (lane by lane, host by host) from that time on, so that a long
    run's older rows are not scanned."""
    if table not in _KEYS:
        raise ValueError(f"not a table of samples or events: {table}")
    key = _KEYS[table]
    keys = store.query(
        f"SELECT DISTINCT {key} FROM {_ROLLUPS[table]} WHERE run_id = ? AND res_s = ?",
        (run_id, COARSEST_S),
    )
    rows: list[sqlite3.Row] = []
    for (wanted,) in keys:
        if table != "batches":
            rows += store.query(
                f"SELECT * FROM {table} WHERE run_id = ? AND {key} = ? AND t_ns > ?",
                (run_id, wanted, since_ns),
            )
            continue
        # Batches are stored by index: from the first index of the second that holds the time.
        second = (since_ns - store.run(run_id).started_ns) // SECOND_NS
        (first,) = store.query(
            "SELECT MIN(first_idx) FROM batch_rollup WHERE run_id = ? AND res_s = 1 "
            "AND warmup IN (0, 1) AND lane = ? AND bucket >= ?",
            (run_id, wanted, second),
        )[0]
        if first is not None:
            rows += store.query(
                "SELECT * FROM batches WHERE run_id = ? AND lane = ? AND idx >= ? AND t_ns > ?",
                (run_id, wanted, first, since_ns),
            )
    return sorted(rows, key=lambda row: row["t_ns"])
