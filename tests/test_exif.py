"""One image, one tensor: both backends apply EXIF orientation, and give the same pixels for the
same files where the augmentation is deterministic (the whole image, no flip)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines import (
    Augmentation,
    Backend,
    DaliOptions,
    DataLoaderOptions,
    PipelineSpec,
    build_pipeline,
)

WHOLE_IMAGE = Augmentation(crop_area=(1.0, 1.0), flip_probability=0.0)  # square: all of it


def halves(size: int = 64) -> np.ndarray:
    """A square image, its left half red and its right half blue (as stored)."""
    pixels = np.zeros((size, size, 3), np.uint8)
    pixels[:, : size // 2] = (220, 20, 20)
    pixels[:, size // 2 :] = (20, 20, 220)
    return pixels


def write(path: Path, pixels: np.ndarray, orientation: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation
    Image.fromarray(pixels).save(path, "JPEG", quality=95, exif=exif)


def images(root: Path, backend: Backend, size: int = 32) -> torch.Tensor:
    """The dataset's images, in order, as 0..255 floats (normalization undone)."""
    spec = PipelineSpec(
        root, batch_size=2, image_size=size, shuffle=False, augmentation=WHOLE_IMAGE,
        dataloader=DataLoaderOptions(num_workers=0), dali=DaliOptions(num_threads=1),
    )  # fmt: skip
    with build_pipeline(spec, backend) as pipeline:
        out = torch.cat([batch.images.float().cpu() for batch in pipeline])
    mean = torch.tensor(WHOLE_IMAGE.mean).view(1, 3, 1, 1) * 255
    std = torch.tensor(WHOLE_IMAGE.std).view(1, 3, 1, 1) * 255
    return out * std + mean


@pytest.mark.parametrize("backend", [Backend.TORCH, Backend.DALI])
def test_exif_orientation_is_applied(tmp_path: Path, backend: Backend) -> None:
    write(tmp_path / "c" / "a_plain.jpg", halves())
    write(tmp_path / "c" / "b_turned.jpg", halves(), orientation=6)  # shown turned 90 degrees
    plain, turned = images(tmp_path, backend)
    red = 0  # channel
    assert plain[red, :, :16].mean() > 150 > plain[red, :, 16:].mean()  # red on the left
    assert turned[red, :16, :].mean() > 150 > turned[red, 16:, :].mean()  # red on top


def test_both_backends_give_the_same_pixels(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    for index in range(4):  # smooth content: JPEG decoders differ little on it
        base = rng.integers(0, 255, (4, 4, 3), dtype=np.uint8)
        smooth = np.asarray(Image.fromarray(base).resize((64, 64), Image.Resampling.BILINEAR))
        write(tmp_path / "c" / f"{index}.jpg", smooth, orientation=[None, 3, 6, 8][index])
    torch_pixels = images(tmp_path, Backend.TORCH)
    dali_pixels = images(tmp_path, Backend.DALI)
    difference = (torch_pixels - dali_pixels).abs()
    assert difference.mean() < 3.0, f"mean difference {difference.mean():.2f} grey levels"
    assert difference.max() < 40, f"largest difference {difference.max():.0f} grey levels"
