"""The probe on a real GPU (marked `gpu`: skipped without CUDA)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipelines.sample_data import SampleParams, make_sample_dataset
from probe.measure.devices import cuda_devices

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gpu") / "photos"
    make_sample_dataset(root, SampleParams(count=256, classes=4, seed=3))
    return root


def probe_json(*args: object, env: dict[str, str] | None = None) -> dict:  # type: ignore[type-arg]
    result = subprocess.run(
        [sys.executable, "-m", "probe", *map(str, args), "--json"],
        capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_a_gpu_lane_is_sampled_by_its_uuid_and_a_busy_step_shows(
    tmp_path: Path, photos: Path
) -> None:
    document = probe_json(
        "run", "--gpus", "0", "--data", photos, "--db", tmp_path / "s.db", "--consumer", "sleep:20",
        "--batch-size", "64", "--duration", "4", "--workers", "4",
    )  # fmt: skip
    (lane,) = document["lanes"]
    assert lane["gpu"] == 0
    assert lane["gpu_uuid"] == cuda_devices()[0].uuid
    assert document["samples"]["gpu"] > 20
    assert lane["sm_active_source"] in ("gpm", "nvml")
    # Matrix products run through each step: the GPU is busy for most of the time not waiting.
    assert lane["kernel_active_pct"] > 50 * (1 - lane["data_wait_frac"])
    assert 17 <= lane["step_ms_p50"] <= 26
    assert lane["memory_used_mib"] > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_cuda_visible_devices_cannot_make_it_watch_the_wrong_gpu(
    tmp_path: Path, photos: Path
) -> None:
    import pynvml

    pynvml.nvmlInit()
    second = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(1))
    second = second.decode() if isinstance(second, bytes) else second
    document = probe_json(
        "run", "--gpus", "0", "--data", photos, "--db", tmp_path / "s.db", "--batches", "5",
        env={"CUDA_VISIBLE_DEVICES": "1"},
    )  # fmt: skip
    assert document["lanes"][0]["gpu_uuid"] == second
    assert document["host"]["gpus"][0]["uuid"] == second


def test_a_torchvision_model_trains_on_the_gpu(tmp_path: Path, photos: Path) -> None:
    pytest.importorskip("torchvision")
    document = probe_json(
        "run", "--gpus", "0", "--data", photos, "--db", tmp_path / "s.db",
        "--consumer", "model:resnet18", "--batch-size", "64", "--batches", "10",
    )  # fmt: skip
    (lane,) = document["lanes"]
    assert lane["status"] == "completed"
    assert lane["step_ms_p50"] > 0
    assert document["config"]["consumer_note"] is None


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_watch_finds_a_ddp_resnet50_loop_fed_by_4_dataloader_workers_per_gpu_starved(
    tmp_path: Path,
) -> None:
    """The README's example loop (torchvision's ImageFolder, transforms and ResNet-50 under DDP)
    under torchrun on two GPUs, watched: one run, a lane per rank. With 4 DataLoader workers per
    GPU it is starved (ResNet-50 takes about 4,000 images/s per H200; 4 workers decode about a
    quarter of that). With 16 workers per GPU on a 32-core host it was fed."""
    pytest.importorskip("torchvision")
    from pipelines.sample_data import ensure_default_dataset
    from probe.judge.diagnosis import diagnose_run
    from probe.judge.verdicts import STARVED
    from probe.store.db import Store
    from probe.store.documents import read_run

    db = tmp_path / "watch.db"
    script = Path(__file__).with_name("watch_resnet50.py")
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         str(script), "--data", str(ensure_default_dataset()), "--workers", "4", "--db", str(db)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    with Store(db) as store:
        (run,) = store.runs()
        document = read_run(store, run.run_id).to_json()
        diagnosis = diagnose_run(store, run.run_id).to_json()
    print(json.dumps({"run": {k: document[k] for k in ("run_id", "status", "images_per_s")},
                      "lanes": document["lanes"], "verdict": diagnosis["verdict"],
                      "findings": diagnosis["findings"],
                      "recommendations": diagnosis["recommendations"]}, indent=1))  # fmt: skip
    assert run.kind == "watch" and run.status.value == "completed"
    assert [(x["lane"], x["shard_id"], x["num_shards"]) for x in document["lanes"]] == [
        (0, 0, 2),
        (1, 1, 2),
    ]
    assert all(x["batches"] == 115 and x["sm_active_pct"] is not None for x in document["lanes"])
    assert diagnosis["verdict"]["kind"] in {kind.value for kind in STARVED}
