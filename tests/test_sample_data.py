"""The synthetic dataset: photo-like JPEGs of the promised size and quality, deterministic."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines import InputError, discover, sample_data
from pipelines.sample_data import SampleParams, make_sample_dataset, render_image


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sample") / "data"
    make_sample_dataset(root, SampleParams(count=40, classes=4, seed=5), processes=2)
    return root


def test_layout_labels_and_manifest(sample: Path) -> None:
    dataset = discover(sample)
    assert dataset.classes == ("class_00", "class_01", "class_02", "class_03")
    assert len(dataset) == 40
    assert sorted(dataset.labels) == sorted([i % 4 for i in range(40)])
    manifest = json.loads((sample / "feedscope-sample.json").read_text())
    assert manifest == {"count": 40, "classes": 4, "seed": 5, "generator_version": 1}


def test_images_are_photo_sized_quality_90_jpegs(sample: Path) -> None:
    reference = io.BytesIO()
    Image.new("RGB", (8, 8)).save(reference, "JPEG", quality=90)
    quality_90_tables = Image.open(reference).quantization  # type: ignore[attr-defined]
    sizes = []
    for path in discover(sample).files:
        with Image.open(path) as image:
            assert image.format == "JPEG"
            assert image.mode == "RGB"
            assert min(image.size) >= 300 and max(image.size) <= 640
            assert image.quantization == quality_90_tables
        sizes.append(Path(path).stat().st_size)
    assert 50_000 <= np.mean(sizes) <= 120_000, f"mean {np.mean(sizes) / 1000:.0f} KB"


def test_images_look_natural_not_like_noise(sample: Path) -> None:
    for path in discover(sample).files[:10]:
        pixels = np.asarray(Image.open(path).convert("L"), dtype=np.float32)
        step = np.abs(np.diff(pixels, axis=1))
        assert step.mean() < 12  # mostly smooth (uniform noise: about 85)
        across_edges = np.abs(pixels[:, 3:] - pixels[:, :-3])  # edges are soft, over a few pixels
        assert np.percentile(across_edges, 99.9) > 50  # yet there are edges
        assert pixels.std() > 15  # not one flat colour


def test_same_seed_same_bytes_whatever_the_process_count(tmp_path: Path, sample: Path) -> None:
    again = tmp_path / "again"
    make_sample_dataset(again, SampleParams(count=40, classes=4, seed=5), processes=1)
    for first, second in zip(discover(sample).files, discover(again).files, strict=True):
        assert Path(first).read_bytes() == Path(second).read_bytes()
    assert render_image(5, 3, 3, 4) != render_image(6, 3, 3, 4)


def test_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(InputError, match="exists and is not an empty folder"):
        make_sample_dataset(tmp_path, SampleParams(count=2, classes=1))
    assert (tmp_path / "keep.txt").read_text() == "mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert make_sample_dataset(empty, SampleParams(count=2, classes=2)).count == 2


@pytest.mark.parametrize(
    ("count", "classes", "message"),
    [
        (0, 1, "image count must be >= 1"),
        (3, 4, "classes must be within 1..count"),
        (3, 0, "classes"),
    ],
)
def test_bad_parameters(count: int, classes: int, message: str) -> None:
    with pytest.raises(InputError, match=message):
        SampleParams(count=count, classes=classes)


def test_images_of_a_chosen_size(tmp_path: Path) -> None:
    """A camera's resolution, to mimic a data set's: each image's width and height drawn from
    the ranges asked for; the built-in sample's images stay as they were."""
    params = SampleParams(count=6, classes=2, seed=2, width=(700, 760), height=(500, 520))
    summary = make_sample_dataset(tmp_path / "big", params, processes=1)
    for path in discover(tmp_path / "big").files:
        with Image.open(path) as image:
            width, height = image.size
        assert 700 <= width <= 760 and 500 <= height <= 520
    manifest = json.loads((tmp_path / "big" / "feedscope-sample.json").read_text())
    assert manifest["width"] == [700, 760] and manifest["height"] == [500, 520]
    assert summary.mean_kb > 100  # about twice the built-in images' pixels
    assert render_image(5, 3, 3, 4) != render_image(5, 3, 3, 4, ((700, 760), (500, 520)))


@pytest.mark.parametrize(
    ("width", "height", "message"),
    [
        ((700, 760), None, "give both a width and a height range"),
        ((760, 700), (500, 520), "width must be a range of pixels within 16..8192, its low end"),
        ((700, 760), (8, 520), "height must be a range"),
    ],
)
def test_bad_image_sizes(
    width: tuple[int, int] | None, height: tuple[int, int] | None, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        SampleParams(count=2, classes=1, width=width, height=height)


def test_default_dataset_is_made_once_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sample_data, "DEFAULT_SAMPLE", SampleParams(count=6, classes=2))
    (tmp_path / sample_data.default_sample_dir(tmp_path).name).mkdir()  # a broken earlier try
    generated: list[int] = []

    def make() -> Path:
        return sample_data.ensure_default_dataset(cache_dir=tmp_path, progress=generated.append)

    threads = [threading.Thread(target=make) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    root = make()
    assert root.parent == tmp_path
    assert sum(generated) == 6  # one of the four callers generated it
    assert sample_data.default_dataset_ready(tmp_path)
    assert len(discover(root)) == 6
