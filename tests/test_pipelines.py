"""Both backends, built from one spec, on the CPU (DALI in CPU-only mode): same batches, same
files per shard, labels from the folders, augmentation applied, bad files named or skipped."""

from __future__ import annotations

import gc
import itertools
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from helpers import decode_codes, solid, write_jpeg
from pipelines import (
    Augmentation,
    Backend,
    BackendUnavailable,
    Batch,
    CorruptImageError,
    DaliOptions,
    DataLoaderOptions,
    InputError,
    InputPipeline,
    PipelineSpec,
    build_pipeline,
    discover,
    read_order,
    shard,
)
from pipelines.torch_loader import random_resized_crop

BACKENDS = [Backend.TORCH, Backend.DALI]
MEAN, STD = Augmentation().mean, Augmentation().std


def make_spec(root: Path, **changes: Any) -> PipelineSpec:
    settings: dict[str, Any] = {
        "data_dir": root,
        "batch_size": 4,
        "image_size": 32,
        "dataloader": DataLoaderOptions(num_workers=1),
        "dali": DaliOptions(num_threads=1),
    }
    settings.update(changes)
    return PipelineSpec(**settings)


def epoch(pipeline: InputPipeline) -> list[Batch]:
    return list(pipeline)


def all_images(batches: list[Batch]) -> torch.Tensor:
    return torch.cat([b.images for b in batches])


def all_labels(batches: list[Batch]) -> list[int]:
    return [int(label) for b in batches for label in b.labels]


@pytest.mark.parametrize("backend", BACKENDS)
def test_batches_have_one_layout_dtype_and_value_range(
    backend: Backend, coded_dataset: Path
) -> None:
    spec = make_spec(coded_dataset, batch_size=8, image_size=48)
    with build_pipeline(spec, backend) as pipeline:
        batches = epoch(pipeline)
    assert [b.images.shape[0] for b in batches] == [8, 8, 8, 8, 5]  # 37 files, last one partial
    for batch in batches:
        assert batch.images.shape[1:] == (3, 48, 48)
        assert batch.images.dtype == torch.float32
        assert batch.images.device.type == "cpu"
        assert batch.images.is_contiguous()
        assert batch.labels.dtype == torch.int64
        assert batch.labels.shape == (batch.images.shape[0],)
    images = all_images(batches)
    for channel in range(3):  # normalized pixels lie within (0 - mean) / std .. (1 - mean) / std
        low = (0 - MEAN[channel]) / STD[channel]
        high = (1 - MEAN[channel]) / STD[channel]
        assert low - 1e-4 <= images[:, channel].min() <= images[:, channel].max() <= high + 1e-4


@pytest.mark.parametrize("num_shards", [1, 2, 3, 4])
def test_each_backend_reads_exactly_its_shard_with_folder_labels(
    coded_dataset: Path, num_shards: int
) -> None:
    dataset = discover(coded_dataset)
    code_of = {path: code for code, path in enumerate(dataset.files)}  # codes follow sorted order
    ordered = read_order(dataset, shuffle=True, seed=3)
    read_by_shard = []
    for shard_id in range(num_shards):
        expected = shard(ordered, shard_id, num_shards)
        expected_codes = [code_of[f] for f in expected.files]
        spec = make_spec(coded_dataset, seed=3, shard_id=shard_id, num_shards=num_shards)
        for backend in BACKENDS:
            with build_pipeline(spec, backend) as pipeline:
                for _ in range(2):  # the second epoch reads the same files again
                    batches = epoch(pipeline)
                    codes = decode_codes(all_images(batches), MEAN, STD)
                    assert codes == expected_codes, f"{backend.value} shard {shard_id}/{num_shards}"
                    assert all_labels(batches) == [dataset.labels[c] for c in codes]
        read_by_shard.append(set(expected_codes))
    assert set().union(*read_by_shard) == set(range(len(dataset)))
    assert sum(len(s) for s in read_by_shard) == len(dataset)


def test_unshuffled_order_is_the_sorted_one(coded_dataset: Path) -> None:
    spec = make_spec(coded_dataset, shuffle=False)
    for backend in BACKENDS:
        with build_pipeline(spec, backend) as pipeline:
            assert decode_codes(all_images(epoch(pipeline)), MEAN, STD) == list(range(37))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stream_keeps_every_batch_full_across_the_end_of_a_pass(
    coded_dataset: Path, backend: Backend
) -> None:
    """Read as a stream, a batch that crosses the end of the shard holds its last images and
    the first of the next pass, as a long job's reader gives them: no short batch, no short
    step."""
    spec = make_spec(coded_dataset, shuffle=False, batch_size=8)
    with build_pipeline(spec, backend) as pipeline:
        batches = list(itertools.islice(pipeline.stream(), 10))  # 80 images: two passes of 37
        starts = len(pipeline.starts)
    assert [b.images.shape[0] for b in batches] == [8] * 10
    assert decode_codes(all_images(batches), MEAN, STD) == [i % 37 for i in range(80)]
    assert starts == 1  # one start of reading, no epoch end


@pytest.mark.parametrize("output_dtype", ["uint8", "float32"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_dataloader_options_change_speed_not_results(
    coded_dataset: Path, output_dtype: str, num_workers: int
) -> None:
    options = DataLoaderOptions(num_workers=num_workers, output_dtype=output_dtype)  # type: ignore[arg-type]
    spec = make_spec(coded_dataset, shuffle=False, dataloader=options)
    with build_pipeline(spec, Backend.TORCH) as pipeline:
        batches = epoch(pipeline)
    assert all(b.images.dtype == torch.float32 for b in batches)
    assert decode_codes(all_images(batches), MEAN, STD) == list(range(37))


@pytest.fixture(scope="module")
def halves_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Square images, red on the left half and blue on the right: a flip shows."""
    root = tmp_path_factory.mktemp("halves")
    pixels = solid((220, 20, 20), 64, 64)
    pixels[:, 32:] = (20, 20, 220)
    for n in range(16):
        write_jpeg(root / "only" / f"{n:02d}.jpg", pixels)
    return root


def count_flipped(pipeline: InputPipeline, epochs: int) -> tuple[int, int]:
    flipped = total = 0
    for _ in range(epochs):
        for batch in pipeline:
            left_red = batch.images[:, 0, :, :4].mean(dim=(1, 2))
            left_blue = batch.images[:, 2, :, :4].mean(dim=(1, 2))
            flipped += int((left_blue > left_red).sum())
            total += batch.images.shape[0]
    return flipped, total


@pytest.mark.parametrize("backend", BACKENDS)
def test_horizontal_flip_follows_its_probability(backend: Backend, halves_dataset: Path) -> None:
    whole_image = {"crop_area": (1.0, 1.0)}  # no crop fits, so both fall back to the whole image
    for probability, allowed in ((0.0, range(0, 1)), (1.0, range(64, 65)), (0.5, range(16, 49))):
        augmentation = Augmentation(flip_probability=probability, **whole_image)  # type: ignore[arg-type]
        spec = make_spec(halves_dataset, augmentation=augmentation)
        with build_pipeline(spec, backend) as pipeline:
            flipped, total = count_flipped(pipeline, epochs=4)
        assert total == 64
        assert flipped in allowed, f"p={probability}: {flipped} of 64 flipped"


def test_random_resized_crop_draws_boxes_like_torchvision() -> None:
    augmentation = Augmentation()
    rng = random.Random(0)
    shares, ratios = [], []
    for _ in range(2000):
        left, top, width, height = random_resized_crop(500, 375, augmentation, rng)
        assert left >= 0
        assert top >= 0
        assert left + width <= 500
        assert top + height <= 375
        shares.append(width * height / (500 * 375))
        ratios.append(width / height)
    assert 0.07 <= min(shares) < 0.15
    assert max(shares) > 0.9
    assert min(ratios) >= 0.74
    assert max(ratios) <= 1.34
    # no random box fits a very wide image: a center crop at the widest allowed ratio
    assert random_resized_crop(1000, 10, augmentation, rng) == (493, 0, 13, 10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_png_grayscale_cmyk_and_upper_case_extensions_load(
    backend: Backend, mixed_formats_dataset: Path
) -> None:
    spec = make_spec(mixed_formats_dataset, shuffle=False, batch_size=6)
    with build_pipeline(spec, backend) as pipeline:
        (batch,) = epoch(pipeline)
    assert batch.images.shape == (6, 3, 32, 32)
    assert torch.isfinite(batch.images).all()
    assert batch.labels.tolist() == [0, 0, 0, 1, 1, 1]
    # sorted: UPPER.JPG, image.png, rgb.jpg | cmyk.jpg, gray.jpg, rgb2.jpeg
    gray = batch.images[4] * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)
    assert torch.allclose(gray[0], gray[1], atol=0.02)
    assert torch.allclose(gray[1], gray[2], atol=0.02)


@pytest.fixture
def broken_dataset(tmp_path: Path, coded_dataset: Path) -> tuple[Path, list[str]]:
    """The coded dataset plus a truncated JPEG and a file that is no image at all."""
    root = tmp_path / "broken"
    shutil.copytree(coded_dataset, root)
    whole = (root / "c1" / "000.jpg").read_bytes()
    truncated = root / "c1" / "000_truncated.jpg"
    truncated.write_bytes(whole[: len(whole) // 2])
    garbage = root / "c3" / "zz_garbage.jpg"
    garbage.write_bytes(b"this is not a JPEG " * 20)
    return root, sorted([str(truncated), str(garbage)])


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_corrupt_image_is_named_in_the_error(
    backend: Backend, broken_dataset: tuple[Path, list[str]]
) -> None:
    root, bad_files = broken_dataset
    spec = make_spec(root, shuffle=False)
    with pytest.raises(CorruptImageError) as caught, build_pipeline(spec, backend) as pipeline:
        for _ in range(2):
            epoch(pipeline)
    assert caught.value.path in bad_files
    message = str(caught.value)
    assert caught.value.path in message
    assert "\n" not in message


@pytest.mark.parametrize("backend", BACKENDS)
def test_corrupt_images_can_be_skipped_and_counted(
    backend: Backend, broken_dataset: tuple[Path, list[str]]
) -> None:
    root, bad_files = broken_dataset
    spec = make_spec(root, shuffle=False, skip_corrupt=True)
    with build_pipeline(spec, backend) as pipeline:
        epoch(pipeline)  # meets both bad files (DALI starts the epoch over after each)
        assert sorted(pipeline.skipped_files) == bad_files
        codes = decode_codes(all_images(epoch(pipeline)), MEAN, STD)
    assert sorted(codes) == list(range(37))  # every good file, once


def _fail_and_keep_the_error(root: Path) -> None:
    """DALI fails on a bad file, and its error is kept as a logging caller might keep it: in a
    frame its own traceback holds, a reference cycle that only the garbage collector frees."""
    try:
        with build_pipeline(make_spec(root, shuffle=False), Backend.DALI) as pipeline:
            epoch(pipeline)
    except CorruptImageError as error:
        kept = error  # noqa: F841


def _collect_garbage(worker_id: int) -> None:
    gc.collect()


def test_a_dataloader_forked_after_a_dali_failure_does_not_hang(
    broken_dataset: tuple[Path, list[str]],
) -> None:
    """The failed pipeline's garbage reaches the workers that fork after it. Had its DALI
    pipeline not been shut down where it failed, a worker collecting that garbage would wait
    for DALI's threads, which a forked process does not have, forever. A probe lane runs
    DataLoader jobs after DALI's in one process, as this test process does."""
    gc.collect()
    gc.disable()  # the failure's cycle is still garbage when the workers fork
    try:
        _fail_and_keep_the_error(broken_dataset[0])
        loader = DataLoader(TensorDataset(torch.arange(4)), batch_size=2, num_workers=1,
                            worker_init_fn=_collect_garbage, multiprocessing_context="fork",
                            timeout=30)  # fmt: skip
        assert [batch.tolist() for (batch,) in loader] == [[0, 1], [2, 3]]
    finally:
        gc.enable()


def test_without_dali_only_the_dali_pipeline_is_unavailable(
    monkeypatch: pytest.MonkeyPatch, coded_dataset: Path
) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)  # import nvidia.dali -> ImportError
    monkeypatch.delitem(sys.modules, "pipelines.dali_loader", raising=False)
    spec = make_spec(coded_dataset)
    with pytest.raises(BackendUnavailable, match=r"pip install 'feedscope\[dali\]'"):
        build_pipeline(spec, Backend.DALI)
    with build_pipeline(spec, Backend.TORCH) as pipeline:
        assert len(epoch(pipeline)) == 10


def test_a_gpu_without_cuda_is_refused(
    monkeypatch: pytest.MonkeyPatch, coded_dataset: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for backend in BACKENDS:
        with pytest.raises(InputError, match="GPU 0 was asked for, but CUDA is not available"):
            build_pipeline(make_spec(coded_dataset, device=0), backend)


def test_a_gpu_index_that_does_not_exist_is_refused(
    monkeypatch: pytest.MonkeyPatch, coded_dataset: Path
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(InputError, match=r"GPU 2 does not exist: CUDA sees 2 device\(s\), 0..1"):
        build_pipeline(make_spec(coded_dataset, device=2), Backend.TORCH)


@pytest.fixture(scope="module")
def photo_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipelines.sample_data import SampleParams, make_sample_dataset

    root = tmp_path_factory.mktemp("photos") / "data"
    make_sample_dataset(root, SampleParams(count=24, classes=3, seed=1), processes=1)
    return root


def test_both_backends_see_the_same_pixels_on_photos(photo_dataset: Path) -> None:
    """Per-channel statistics of an epoch agree between backends (the crops differ)."""
    spec = make_spec(photo_dataset, image_size=64, batch_size=8)
    means = {}
    for backend in BACKENDS:
        with build_pipeline(spec, backend) as pipeline:
            images = torch.cat([all_images(epoch(pipeline)) for _ in range(3)])
        means[backend] = images.mean(dim=(0, 2, 3))
    assert torch.allclose(means[Backend.TORCH], means[Backend.DALI], atol=0.1), means


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("backend", "decoder"), [("torch", None), ("dali", "mixed"), ("dali", "cpu")]
)
def test_gpu_batches_land_on_the_chosen_device(
    backend: str, decoder: str | None, coded_dataset: Path
) -> None:
    device = torch.cuda.device_count() - 1
    spec = make_spec(coded_dataset, device=device, shuffle=False, dali=DaliOptions(decoder=decoder))  # type: ignore[arg-type]
    with build_pipeline(spec, backend) as pipeline:
        batches = epoch(pipeline)
    assert all(b.images.device == torch.device("cuda", device) for b in batches)
    assert all(b.labels.device == torch.device("cuda", device) for b in batches)
    assert decode_codes(all_images(batches), MEAN, STD) == list(range(37))


def _start_method_in_this_process(root: str) -> str:
    spec = make_spec(Path(root), dataloader=DataLoaderOptions(num_workers=1))
    with build_pipeline(spec, Backend.TORCH) as pipeline:
        loader, _ = pipeline._loader("stream")  # type: ignore[attr-defined]
        return str(loader.multiprocessing_context.get_start_method())


def test_workers_start_as_in_a_fresh_process_even_inside_a_spawned_one(
    coded_dataset: Path,
) -> None:
    """A spawned process (a probe lane) defaults to spawn; its DataLoader workers must start as
    a training script's do (fork on Linux before Python 3.14), or they measure something else."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        used = pool.apply(_start_method_in_this_process, (str(coded_dataset),))
    assert used == multiprocessing.get_all_start_methods()[0]
    asked = make_spec(
        coded_dataset, dataloader=DataLoaderOptions(num_workers=1, start_method="spawn")
    )
    with build_pipeline(asked, Backend.TORCH) as pipeline:
        loader, _ = pipeline._loader("epoch")  # type: ignore[attr-defined]
        assert loader.multiprocessing_context.get_start_method() == "spawn"
