"""The dashboard's and reports' series: downsampled in SQL without losing peaks and dips."""

from __future__ import annotations

from pathlib import Path

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
from probe.store.series import LiveSeries, latency_histogram, run_series


def test_an_hour_downsampled_keeps_a_single_sample_dip_and_spike(tmp_path: Path) -> None:
    hz, seconds = 10, 3600
    dip_at, spike_at = 1234 * hz, 2345 * hz  # one sample each, in 36,000
    with Store(tmp_path / "s.db") as store:
        run = RunRecord(
            "long", "probe", "2026-11-21T00:00:00Z", RunStatus.RUNNING, None, "torch", "none",
            None, {}, {"gpus": [{"index": 0, "uuid": "GPU-a", "name": "GPU"}]}, "h", None, 0,
            None,
        )  # fmt: skip
        store.create_run(run, [LaneRecord("long", 0, 0, "GPU-a", 0, 1, "h", None,
                                          RunStatus.RUNNING, None, None)])  # fmt: skip
        samples = []
        for tick in range(seconds * hz):
            busy = 0.0 if tick == dip_at else 100.0 if tick == spike_at else 50.0
            samples.append(GpuSample(tick * 100_000_000, "GPU-a", busy, busy, None, None, None,
                                     None, None, None, None, None))  # fmt: skip
        store.add_gpu_samples("long", samples)
        store.add_batches("long", [BatchEvent(0, i, i * 1_000_000_000, 0.1, 0.9, 8, False)
                                   for i in range(seconds)])  # fmt: skip
        store.finish_run("long", RunStatus.COMPLETED, None, seconds * 1_000_000_000)
        series = run_series(store, "long", points=600)
    assert series is not None
    # every chart of the run shows the same time range
    assert series.span_s == (0.0, float(seconds))
    (gpu,) = series.gpus
    assert gpu.busy_metric == "SM activity (GPM)"
    assert len(gpu.busy.t_s) <= 601  # 36,000 samples in about 600 buckets
    low = [value for value in gpu.busy.low if value is not None]
    high = [value for value in gpu.busy.high if value is not None]
    assert min(low) == 0.0  # the dip survives ...
    assert max(high) == 100.0  # ... and so does the spike
    dip_bucket = next(i for i, value in enumerate(gpu.busy.low) if value == 0.0)
    assert abs(gpu.busy.t_s[dip_bucket] - dip_at / hz) < seconds / 600 + 1
    (lane,) = series.lanes
    assert all(abs(w - 0.1) < 1e-9 for w in lane.data_wait_frac if w is not None)
    assert all(abs(rate - 8.0) < 1e-6 for rate in lane.images_per_s)  # 8 images a second


def test_the_latency_histogram_gathers_rare_stalls_in_its_last_bin(tmp_path: Path) -> None:
    with Store(tmp_path / "s.db") as store:
        run = RunRecord(
            "r", "probe", "2026-11-21T00:00:00Z", RunStatus.RUNNING, None, "torch", "none", None,
            {}, {}, "h", None, 0, None,
        )  # fmt: skip
        summary = {"batch_latency_ms": {"p50": 10.0, "p95": 10.0, "p99": 10.0}}
        store.create_run(run, [LaneRecord("r", 0, None, None, 0, 1, "h", None,
                                          RunStatus.COMPLETED, None, summary)])  # fmt: skip
        latencies = [0.010] * 99 + [0.002, 5.0]  # and a warm-up batch, not counted
        store.add_batches("r", [BatchEvent(0, 0, 0, 9.0, 0.0, 8, True)] + [
            BatchEvent(0, i + 1, i, latency, 0.0, 8, False) for i, latency in enumerate(latencies)
        ])  # fmt: skip
        histogram = latency_histogram(store, "r", bins=60)
    assert histogram is not None
    assert histogram.bin_ms == 0.25  # 60 bins over 1.5 x p99
    assert histogram.overflow_ms == 15.0
    starts, counts = histogram.lanes[0]
    assert sum(counts) == 101
    assert dict(zip(starts, counts, strict=True)) == {2.0: 1, 10.0: 99, 15.0: 1}


def test_a_live_view_of_a_long_run_reads_its_window_alone(tmp_path: Path) -> None:
    second = 1_000_000_000
    uuids = ("GPU-a", "GPU-b")

    def write(store: Store, first: int, last: int) -> None:  # seconds [first, last) at 10 Hz
        ticks = range(first * 10, last * 10)
        store.add_gpu_samples("live", [
            GpuSample(t * second // 10, u, float(t % 97), None, None, 1.0, None, 5.0, None,
                      None, None, None)
            for t in ticks for u in uuids
        ])  # fmt: skip
        store.add_batches("live", [
            BatchEvent(lane, t, t * second // 10 + lane, 0.01 * (t % 5), 0.05, 8, t < 5)
            for t in ticks for lane in (0, 1)
        ])  # fmt: skip
        store.add_lane_cpu("live", [
            LaneCpuSample(t * second // 10, lane, float(t % 13), 50.0, 40.0, 2, 9)
            for t in ticks for lane in (0, 1)
        ])  # fmt: skip
        store.add_host_samples("live", "h", [
            HostSample(t * second // 10, 50.0, (float(t % 7), 20.0), 0.0, 0.0, None, None, None,
                       None)
            for t in ticks
        ])  # fmt: skip

    def everything(store: Store, window_s: float) -> LiveSeries:
        """A live view fed every row of the run, as it would be by reading them all."""
        live = LiveSeries("live", window_s)
        live.start_ns = store.run("live").started_ns
        for table in live.cursors:
            rows = sorted(store.query(f"SELECT * FROM {table} WHERE run_id = 'live'"),
                          key=lambda row: row["t_ns"])  # fmt: skip
            live.cursors[table] = rows[-1]["t_ns"]
            getattr(live, f"_add_{table}")(rows)
        live._forget_old()
        return live

    with Store(tmp_path / "s.db") as store:
        run = RunRecord(
            "live", "watch", "2026-11-21T00:00:00Z", RunStatus.RUNNING, None, "torch", "none",
            None, {}, {"gpus": []}, "h", None, 0, None,
        )  # fmt: skip
        lanes = [
            LaneRecord("live", lane, lane, uuid, lane, 2, "h", None, RunStatus.RUNNING, None, None)
            for lane, uuid in enumerate(uuids)
        ]
        store.create_run(run, lanes)
        write(store, 0, 1800)
        live = LiveSeries("live", window_s=60)
        read = live.update(store)
        assert read <= 7 * 10 * 125  # 7 rows a tick, the window and a minute more
        assert live.series(store) == everything(store, 60).series(store)
        write(store, 1800, 1830)
        assert live.update(store) == 7 * 10 * 30  # what came since, alone
        assert live.series(store) == everything(store, 60).series(store)
