"""Converts the H200 traces in tests/data/h200-traces (see its README) into a feedscope store.

Each folder is one run recorded on a host with two H200s and 32 cores: its meta.json becomes the
run's config and host, batches.csv its batch events, samples.csv its GPU samples and the host's
CPU. The two `two_gpu_rn50_gpu{0,1}_w14` folders ran at the same time and become one run with two
lanes. The DataLoader runs read epoch by epoch (the README says how): 32 batches per epoch, the
first epoch start at measured batch 29, and so are their events' epochs. What the traces did not
record (per-core CPU, per-process CPU, memory) stays unknown. With `gpm=False` the GPM columns are
left out, as a GPU without GPM (before Hopper) records them: busy-ness is then NVML's.

    python tests/h200_traces.py STORE.db
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

from probe.records import BatchEvent, GpuSample, HostSample, LaneRecord, RunRecord, RunStatus
from probe.store.db import Store
from probe.store.documents import lane_figures_from_store

TRACES = Path(__file__).parent / "data" / "h200-traces"
TOGETHER = {"two_gpu_rn50": ["two_gpu_rn50_gpu0_w14", "two_gpu_rn50_gpu1_w14"]}
HOST = "h200-trace-host"
BATCHES_PER_EPOCH = 32  # 4096 images, batch 128, drop_last
FIRST_EPOCH_START = 29  # the measured batch that opens the first epoch after the warm-up


def convert(store: Store, traces: Path = TRACES, *, gpm: bool = True) -> dict[str, str]:
    """Writes every traced run into `store`; returns run ids by name (the folder's)."""
    return {name: convert_run(store, name, traces, gpm=gpm) for name in names(traces)}


def names(traces: Path = TRACES) -> list[str]:
    """The traced runs' names: their folders', the two GPUs' run as one."""
    folders = sorted(p.name for p in traces.iterdir() if (p / "meta.json").exists())
    alone = [name for name in folders if not any(name in g for g in TOGETHER.values())]
    return sorted([*alone, *TOGETHER])


def convert_run(
    store: Store,
    name: str,
    traces: Path = TRACES,
    *,
    gpm: bool = True,
    session_id: str | None = None,
) -> str:
    """Writes one traced run into `store` (in the sweep or doctor session `session_id`, if
    given); returns its run id."""
    parts = TOGETHER.get(name, [name])
    metas = [json.loads((traces / part / "meta.json").read_text()) for part in parts]
    meta = metas[0]
    run_id = f"trace-{name}"
    backend = "dali" if meta["phase"] == "dali" else "torch"
    spec: dict[str, Any] = {
        "data_dir": "h200 traces: 4096 synthetic JPEGs, 8 classes",
        "batch_size": meta["bs"],
        "image_size": 224,
        "device": 0,
        "num_shards": len(parts),
        "dataloader": {
            "num_workers": meta.get("workers"),
            "prefetch_factor": meta.get("prefetch_factor"),
            "pin_memory": meta.get("pin_memory"),
            "persistent_workers": True,
            "output_dtype": "float32",  # torchvision's ToTensor and Normalize in the workers
        },
        "dali": {"num_threads": meta.get("threads"), "decoder": meta.get("decoder")},
    }
    gpus = [{"index": i, "uuid": f"GPU-h200-trace-{i}", "name": meta["gpu"]} for i in range(2)]
    run = RunRecord(
        run_id=run_id,
        kind="probe",
        created="2026-11-21T00:00:00Z",
        status=RunStatus.COMPLETED,
        reason=None,
        pipeline=backend,
        consumer=f"model:{meta['model_name']}" if meta["model"] else "none",
        label=name,
        config={
            "pipeline": backend,
            "spec": spec,
            "read": "epochs" if backend == "torch" else "stream",
            "lanes": [
                {
                    "lane": i,
                    "gpu": i,
                    "shard_id": i,
                    "num_shards": len(parts),
                    "batches_per_epoch": BATCHES_PER_EPOCH,
                }
                for i in range(len(parts))
            ],
            "source": "tests/data/h200-traces",
        },
        host={"hostname": HOST, "cpus": meta["host_cpus"], "gpus": gpus},
        hostname=HOST,
        pid=None,
        started_ns=0,
        ended_ns=None,
        session_id=session_id,
    )
    lanes = [
        LaneRecord(run_id, i, i, gpus[i]["uuid"], i, len(parts), HOST, None,
                   RunStatus.COMPLETED, None, None)
        for i in range(len(parts))
    ]  # fmt: skip
    store.create_run(run, lanes)
    end_ns = 0
    for lane, part in enumerate(parts):
        events = [
            BatchEvent(
                lane=lane,
                index=int(row["batch"]),
                t_ns=_ns(row["t_start_s"]),
                wait_s=float(row["data_wait_s"]),
                step_s=float(row["step_s"]),
                size=int(row["samples"]),
                warmup=False,  # the traces start after their warm-up
                epoch=_epoch(int(row["batch"])) if backend == "torch" else 0,
            )
            for row in _rows(traces / part / "batches.csv")
        ]
        store.add_batches(run_id, events)
        end_ns = max([end_ns] + [e.t_ns + int((e.wait_s + e.step_s) * 1e9) for e in events])
        samples = _rows(traces / part / "samples.csv")
        gpu = [_gpu_sample(row, gpus[lane]["uuid"], gpm) for row in samples]
        store.add_gpu_samples(run_id, gpu)
        if lane == 0:  # one host: its CPU as the first lane's process saw it
            store.add_host_samples(run_id, HOST, [_host_sample(row) for row in samples])
    for record in store.lanes(run_id):
        store.update_lane(run_id, record.lane, summary=lane_figures_from_store(store, run, record))
    store.finish_run(run_id, RunStatus.COMPLETED, None, end_ns)
    return run_id


def _gpu_sample(row: dict[str, str], uuid: str, gpm: bool) -> GpuSample:
    return GpuSample(
        t_ns=_ns(row["t_s"]),
        gpu_uuid=uuid,
        kernel_active_pct=_float(row["nvml_gpu_util_pct"]),
        sm_active_pct=_float(row["gpm_sm_util_pct"]) if gpm else None,
        sm_occupancy_pct=_float(row["gpm_sm_occupancy_pct"]) if gpm else None,
        nvjpg_pct=_float(row["nvjpg_util_pct"]),
        nvjpg_gpm_pct=None,
        memory_used_mib=_float(row["gpu_mem_used_mib"]),
        pcie_rx_mib_s=None,
        pcie_tx_mib_s=None,
        power_w=None,
        clocks_event_reasons=None,
    )


def _host_sample(row: dict[str, str]) -> HostSample:
    return HostSample(
        t_ns=_ns(row["t_s"]),
        cpu_pct=float(row["cpu_total_pct"]),
        per_core_pct=(),
        iowait_pct=None,
        steal_pct=None,
        disk_read_mib_s=None,
        memory_used_mib=None,
        tree_cpu_pct=None,
        tree_processes=None,
    )


def _epoch(index: int) -> int:
    """The epoch of a DataLoader trace's measured batch `index`."""
    if index < FIRST_EPOCH_START:
        return 0
    return 1 + (index - FIRST_EPOCH_START) // BATCHES_PER_EPOCH


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def _ns(seconds: str) -> int:
    return round(float(seconds) * 1e9)


def _float(text: str) -> float | None:
    return float(text) if text.strip() else None


if __name__ == "__main__":
    with Store(sys.argv[1]) as target:
        for name, run_id in convert(target).items():
            print(f"{name}: {run_id}")
