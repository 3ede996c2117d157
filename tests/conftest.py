"""Shared fixtures: small datasets written for each test session, and the `gpu` marker."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import HOSTILE_FOLDER, HOSTILE_LABEL, code_color, probe_cli, solid, write_jpeg
from pipelines.sample_data import SampleParams, ensure_default_dataset, make_sample_dataset

pytest_plugins = ["interrupts"]  # Ctrl-C stops the run within seconds, with pytest's summary


@pytest.fixture(scope="session")
def coded_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """37 coded JPEGs in 4 classes of unequal size (5, 8, 11, 13): shards differ in labels."""
    root = tmp_path_factory.mktemp("coded")
    index = 0
    for label, count in enumerate((5, 8, 11, 13)):
        for n in range(count):
            write_jpeg(root / f"c{label}" / f"{n:03d}.jpg", solid(code_color(index)))
            index += 1
    return root


@pytest.fixture(scope="session")
def mixed_formats_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JPEG, PNG, grayscale JPEG, CMYK JPEG and an upper-case extension, in two classes."""
    root = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(0)

    def noise(height: int, width: int) -> np.ndarray:
        return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)

    write_jpeg(root / "a" / "rgb.jpg", noise(120, 160))
    Image.fromarray(noise(90, 70)).save(root / "a" / "image.png")
    Image.fromarray(noise(100, 100)).save(root / "a" / "UPPER.JPG")
    gray = rng.integers(0, 256, (80, 120), dtype=np.uint8)
    (root / "b").mkdir()
    Image.fromarray(gray).save(root / "b" / "gray.jpg", quality=90)
    Image.fromarray(noise(110, 90)).convert("CMYK").save(root / "b" / "cmyk.jpg", quality=90)
    write_jpeg(root / "b" / "rgb2.jpeg", noise(64, 200))
    return root


@pytest.fixture(scope="session")
def sample_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An XDG_CACHE_HOME holding the built-in sample data (written once per test session)."""
    root = tmp_path_factory.mktemp("cache")
    ensure_default_dataset(cache_dir=root / "feedscope")
    return root


SMALL = ["--gpus", "none", "--batch-size", "8", "--image-size", "64", "--warmup", "2"]


@pytest.fixture(scope="session")
def filled_store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A store as a user's looks after real CPU probes: a doctor session, a labelled two-lane
    run, a failed run (a truncated JPEG), a sweep, and a run on a hostile folder and label;
    with each command's JSON document."""
    root = tmp_path_factory.mktemp("filled")
    photos = root / "photos"
    make_sample_dataset(photos, SampleParams(count=48, classes=4, seed=5))
    db = root / "store.db"

    def probe(*args: Any, code: int = 0) -> dict[str, Any]:
        result = probe_cli(*args, "--db", db, "--json", *SMALL)
        assert result.returncode == code, result.stderr
        return dict(json.loads(result.stdout))

    out: dict[str, Any] = {"db": db, "photos": photos}
    out["doctor"] = probe("doctor", "--data", photos, "--budget", "45")
    out["two"] = probe("run", "--data", photos, "--num-shards", "2", "--batches", "6",
                       "--workers", "1", "--consumer", "sleep:15",
                       "--label", "two-lanes")  # fmt: skip
    broken = root / "broken"
    shutil.copytree(photos, broken)
    bad = broken / "class_03" / "zz_truncated.jpg"
    bad.write_bytes((broken / "class_03" / "img_000003.jpg").read_bytes()[:500])
    out["failed"] = probe("run", "--data", broken, "--num-shards", "2", "--batches", "8",
                          "--workers", "1", code=1)  # fmt: skip
    out["sweep"] = probe("sweep", "--data", photos, "--values", "1,2", "--budget", "30",
                         "--consumer", "sleep:10")  # fmt: skip
    hostile = root.joinpath(*HOSTILE_FOLDER)
    shutil.copytree(photos, hostile)
    out["hostile"] = probe("run", "--data", hostile, "--batches", "4", "--workers", "1",
                           "--consumer", "sleep:5", "--label", HOSTILE_LABEL)  # fmt: skip
    return out


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
