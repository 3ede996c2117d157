"""Shared fixtures: small datasets written for each test session, and the `gpu` marker."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import code_color, solid, write_jpeg
from pipelines.sample_data import ensure_default_dataset


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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
