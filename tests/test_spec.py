"""PipelineSpec validation: every bad value gets a one-line message that names it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from pipelines import (
    Augmentation,
    DaliOptions,
    DataLoaderOptions,
    Decoder,
    InputError,
    OutputDtype,
    PipelineSpec,
)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PipelineSpec(Path("d"), batch_size=0), "batch size must be >= 1 (got 0)"),
        (lambda: PipelineSpec(Path("d"), batch_size=2.5), "batch size must be a whole number"),  # type: ignore[arg-type]
        (lambda: PipelineSpec(Path("d"), image_size=0), "image size must be >= 1"),
        (lambda: PipelineSpec(Path("d"), shard_id=2, num_shards=2), "shard_id 2 is out of range"),
        (lambda: PipelineSpec(Path("d"), shard_id=-1, num_shards=2), "shard_id must be >= 0"),
        (lambda: PipelineSpec(Path("d"), num_shards=0), "num_shards must be >= 1"),
        (lambda: PipelineSpec(Path("d"), seed=-3), "seed must be >= 0"),
        (lambda: PipelineSpec(Path("d"), device=-1), "CUDA device index must be >= 0"),
        (lambda: PipelineSpec(Path("d"), device="gpu0"), "device must be a CUDA index or None"),  # type: ignore[arg-type]
        (lambda: DataLoaderOptions(num_workers=-1), "num_workers must be >= 0 (got -1)"),
        (lambda: DataLoaderOptions(prefetch_factor=0), "prefetch_factor must be >= 1"),
        (lambda: DataLoaderOptions(output_dtype="float16"), "unknown output dtype 'float16'"),  # type: ignore[arg-type]
        (lambda: DaliOptions(num_threads=0), "DALI num_threads must be >= 1 (got 0)"),
        (lambda: DaliOptions(num_threads=-2), "DALI num_threads must be >= 1"),
        (
            lambda: DaliOptions(decoder="gpu"),  # type: ignore[arg-type]
            "unknown DALI decoder 'gpu' (choose from: mixed, cpu)",
        ),
        (lambda: DaliOptions(hw_decoder_load=1.5), "hw_decoder_load must be within 0..1"),
        (lambda: DaliOptions(prefetch_queue_depth=0), "prefetch_queue_depth must be >= 1"),
        (
            lambda: PipelineSpec(Path("d"), dali=DaliOptions(decoder=Decoder.MIXED)),
            "DALI decoder 'mixed' needs a GPU",
        ),
        (lambda: Augmentation(crop_area=(0.5, 0.2)), "crop area must satisfy"),
        (lambda: Augmentation(crop_aspect_ratio=(0, 1)), "crop aspect ratio must satisfy"),
        (lambda: Augmentation(flip_probability=2), "flip probability must be within 0..1"),
        (lambda: Augmentation(std=(0.2, 0, 0.2)), "std values must be > 0"),
    ],
)
def test_bad_values_raise_one_line_input_errors(make: Any, message: str) -> None:
    with pytest.raises(InputError) as caught:
        make()
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)
    assert isinstance(caught.value, ValueError)  # callers may catch plain ValueError


def test_defaults_describe_imagenet_training_at_224() -> None:
    spec = PipelineSpec("data")  # type: ignore[arg-type]
    assert spec.data_dir == Path("data")
    assert spec.image_size == 224
    assert spec.augmentation.crop_area == (0.08, 1.0)
    assert spec.augmentation.flip_probability == 0.5
    assert spec.augmentation.mean == (0.485, 0.456, 0.406)
    assert spec.dataloader.output_dtype is None  # chosen by the device:
    assert spec.output_dtype is OutputDtype.FLOAT32  # normalized by the workers on the CPU,
    assert PipelineSpec(Path("data"), device=0).output_dtype is OutputDtype.UINT8  # on a GPU after


def test_strings_become_enums_and_the_decoder_follows_the_device() -> None:
    float32 = DataLoaderOptions(output_dtype="float32")  # type: ignore[arg-type]
    assert float32.output_dtype is OutputDtype.FLOAT32
    assert PipelineSpec(Path("d")).dali_decoder is Decoder.CPU
    assert PipelineSpec(Path("d"), device=0).dali_decoder is Decoder.MIXED
    cpu_decoder = DaliOptions(decoder="cpu")  # type: ignore[arg-type]
    on_gpu_cpu_decode = PipelineSpec(Path("d"), device=1, dali=cpu_decoder)
    assert on_gpu_cpu_decode.dali_decoder is Decoder.CPU


def test_spec_is_frozen_and_with_shard_validates() -> None:
    spec = PipelineSpec(Path("d"), num_shards=4, shard_id=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.batch_size = 3  # type: ignore[misc]
    assert spec.with_shard(1, 2).shard_id == 1
    with pytest.raises(InputError, match="shard_id 5 is out of range for 2"):
        spec.with_shard(5, 2)
