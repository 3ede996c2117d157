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
from probe.devices import cuda_devices

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
    assert lane["kernel_active_pct"] > 50  # matrix products run most of each step
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
