"""`probe migrate`'s parts: a DataLoader's recipe, and the DALI module written from it, run on
the CPU against torchvision's transforms (as `fake_torchvision` computes them with PIL) on the
same files."""

from __future__ import annotations

import ast
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import fake_torchvision as tv
import numpy as np
import pytest
import torch
from fake_torchvision import MEAN, STD, to_unit, training, validation
from PIL import Image

from helpers import data_loader, outside_imports, photo_folder, written_module
from probe.fix.dali import DaliSetting, Unmovable, dali_module
from probe.measure.recipe import recipe_of

pytest.importorskip("nvidia.dali")

SETTING = DaliSetting(
    num_threads=2,
    hw_decoder_load=0.65,
    decoder="mixed",
    source="doctor session doctor-20261127-0600 (--like run 20261127-053256-1c2f): 2,861 images/s",
)
ORIGIN = "run 20261127-053256-1c2f of main.py (training loader)"
# Per pixel, in 0..1 units, between the written loader's validation images and torchvision's:
# measured 0.0050 on average over these photos, 0.0068 on the worst one (JPEG decoding and
# resampling differ by a level or so here and there).
VALIDATION_BOUND = 0.015


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Nine JPEGs in three classes, 320x240, 500x375 and 240x320 (a portrait)."""
    return photo_folder(tmp_path_factory.mktemp("photos"), [(320, 240), (500, 375), (240, 320)], 3)


def coded_gray(index: int) -> int:
    return 20 + 8 * index


@pytest.fixture(scope="module")
def coded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Twelve flat gray 40x32 JPEGs in classes of 3, 4 and 5, each gray naming its index."""
    root = tmp_path_factory.mktemp("coded")
    index = 0
    for label, count in enumerate((3, 4, 5)):
        (root / f"c{label}").mkdir()
        for n in range(count):
            gray = np.full((32, 40, 3), coded_gray(index), np.uint8)
            Image.fromarray(gray).save(root / f"c{label}" / f"{n:02d}.jpg", quality=95)
            index += 1
    return root


@pytest.fixture(scope="module")
def coordinates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """64 copies of a 256x256 PNG whose red is its x and green its y coordinate."""
    root = tmp_path_factory.mktemp("coordinates")
    (root / "all").mkdir()
    y, x = np.mgrid[0:256, 0:256].astype(np.uint8)
    pixels = np.stack([x, y, np.full_like(x, 128)], axis=-1)
    Image.fromarray(pixels).save(root / "all" / "00.png")
    for n in range(1, 64):
        shutil.copy(root / "all" / "00.png", root / "all" / f"{n:02d}.png")
    return root


def written(loader: Any, folder: Path, name: str = "dali_loader") -> ModuleType:
    """The module written for a DataLoader, imported from `folder`."""
    return written_module(dali_module(recipe_of(loader), SETTING, ORIGIN), folder / f"{name}.py")


def coded_indices(batches: Iterator[tuple[torch.Tensor, torch.Tensor]]) -> list[int]:
    """The indices of the coded files in the order a loader gave them."""
    indices: list[int] = []
    for images, _ in batches:
        grays = to_unit(images).mean(dim=(1, 2, 3)) * 255
        indices.extend(round((float(gray) - 20) / 8) for gray in grays)
    return indices


def test_recipe_of_a_dataloader_reads_the_dataset_transforms_and_batching(photos: Path) -> None:
    dataset = tv.ImageFolder(str(photos), transform=training())
    recipe = recipe_of(data_loader(dataset, batch_size=4, shuffle=True))

    assert json.loads(json.dumps(recipe)) == recipe
    assert recipe == {
        "dataset": {
            "kind": "folder",
            "type": "ImageFolder",
            "root": str(photos),
            "class_to_idx": {"class0": 0, "class1": 1, "class2": 2},
            "extensions": list(tv.IMG_EXTENSIONS),
            "count": 9,
            "first": str(photos / "class0" / "0.jpg"),
            "loader": "default_loader",
        },
        "subset": None,
        "transform": [
            {
                "name": "RandomResizedCrop",
                "fields": {
                    "size": [224, 224],
                    "interpolation": "bilinear",  # a str Enum, by its value
                    "antialias": True,
                    "scale": [0.08, 1.0],
                    "ratio": [0.75, 4 / 3],
                },
            },
            {"name": "RandomHorizontalFlip", "fields": {"p": 0.5}},
            {"name": "ToTensor", "fields": {}},
            {"name": "Normalize", "fields": {"mean": MEAN, "std": STD, "inplace": False}},
        ],
        "target_transform": None,
        "loader_text": None,
        "batch_size": 4,
        "shuffle": True,
        "drop_last": False,
        "sampler": {"name": "RandomSampler"},
        "collate_fn": "default",
    }


def test_recipe_of_a_subset_with_a_function_for_transform(photos: Path) -> None:
    def augment(image: Any) -> Any:
        return image

    dataset = tv.ImageFolder(str(photos), transform=augment)
    subset = torch.utils.data.Subset(dataset, [4, 2, 7])
    recipe = recipe_of(data_loader(subset, batch_size=2, shuffle=False, drop_last=True))

    assert recipe["subset"] == [4, 2, 7]
    assert recipe["dataset"]["kind"] == "folder"
    assert recipe["transform"] == [{"name": "augment", "fields": {}, "callable": True}]
    assert "augment" in recipe["loader_text"]
    assert (recipe["shuffle"], recipe["drop_last"]) == (False, True)
    assert recipe["sampler"] == {"name": "SequentialSampler"}


def test_validation_images_match_torchvision_on_the_same_files(
    photos: Path, tmp_path: Path
) -> None:
    dataset = tv.ImageFolder(str(photos), transform=validation())
    module = written(data_loader(dataset, batch_size=4, shuffle=False), tmp_path)
    dali = module.loader(seed=1)

    differences: list[torch.Tensor] = []
    labels: list[int] = []
    for images, batch_labels in dali:
        start = len(labels)
        labels.extend(batch_labels.tolist())
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 224, 224)
        assert batch_labels.dtype == torch.int64 and batch_labels.shape == (len(images),)
        expected = torch.stack([dataset[start + n][0] for n in range(len(images))])
        differences.append((to_unit(images) - to_unit(expected)).abs().mean(dim=(1, 2, 3)))

    assert labels == dataset.targets
    mean_absolute = torch.cat(differences)
    assert float(mean_absolute.max()) < VALIDATION_BOUND, mean_absolute.tolist()


def test_training_crops_and_flips_are_within_what_was_asked(
    coordinates: Path, tmp_path: Path
) -> None:
    size, scale, ratio = 64, (0.25, 0.6), (3 / 4, 4 / 3)
    dataset = tv.ImageFolder(str(coordinates), transform=training(size, scale))
    module = written(data_loader(dataset, batch_size=16, shuffle=True), tmp_path)

    areas, aspects, mirrored = tv.crops_seen(
        module.loader(seed=3), size, side=256, pixels_a_level=1
    )

    assert len(areas) == 64
    tolerance = 0.05  # relative: resampling moves an edge pixel by a pixel or so of ~150
    assert scale[0] * (1 - tolerance) <= min(areas) and max(areas) <= scale[1] * (1 + tolerance)
    assert ratio[0] * (1 - tolerance) <= min(aspects) and max(aspects) <= ratio[1] * (1 + tolerance)
    assert min(areas) < 0.35 and max(areas) > 0.5  # drawn over the range, not one size
    assert 16 <= mirrored <= 48  # p = 0.5 of 64: outside this by chance once in 10^5


@pytest.mark.parametrize("drop_last", [False, True])
def test_epochs_are_full_shuffled_passes_as_long_as_the_dataloaders(
    coded: Path, tmp_path: Path, drop_last: bool
) -> None:
    dataset = tv.ImageFolder(str(coded), transform=validation(32, 32))
    torch_loader = data_loader(dataset, batch_size=5, shuffle=True, drop_last=drop_last)
    module = written(torch_loader, tmp_path)
    dali = module.loader(seed=7)

    assert len(dali) == len(torch_loader) == (2 if drop_last else 3)
    assert dali.batch_size == 5
    dali.set_epoch(1)
    epochs = [coded_indices(iter(dali)), coded_indices(iter(dali))]
    assert [len(epoch) for epoch in epochs] == [10, 10] if drop_last else [12, 12]
    if not drop_last:
        assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(12))
    assert epochs[0] != sorted(epochs[0])
    assert epochs[0] != epochs[1]


def test_epoch_labels_are_the_files_labels(coded: Path, tmp_path: Path) -> None:
    dataset = tv.ImageFolder(str(coded), transform=validation(32, 32))
    module = written(data_loader(dataset, batch_size=5, shuffle=True), tmp_path)

    for images, labels in module.loader(seed=2):
        indices = coded_indices(iter([(images, labels)]))
        assert labels.dtype == torch.int64 and labels.shape == (len(images),)
        assert labels.tolist() == [dataset.targets[i] for i in indices]


def test_shards_of_two_ranks_are_disjoint_and_cover_the_dataset(
    coded: Path, tmp_path: Path
) -> None:
    dataset = tv.ImageFolder(str(coded), transform=validation(32, 32))
    module = written(data_loader(dataset, batch_size=4, shuffle=True), tmp_path)

    shards = [coded_indices(iter(module.loader(rank=rank, world=2))) for rank in (0, 1)]

    assert set(shards[0]).isdisjoint(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(12))


def test_unsupported_transforms_are_refused_by_name(photos: Path) -> None:
    chain = tv.Compose(
        [
            tv.RandomResizedCrop(224),
            tv.GaussianBlur(kernel_size=[5, 5], sigma=(0.1, 2.0)),
            lambda image: image,
            tv.ToTensor(),
        ]
    )
    loader = data_loader(tv.ImageFolder(str(photos), transform=chain), 4, shuffle=True)

    with pytest.raises(Unmovable) as refused:
        dali_module(recipe_of(loader), SETTING, ORIGIN)

    lines = refused.value.lines
    assert len(lines) == 2, lines
    assert lines[0].startswith("GaussianBlur(kernel_size=[5, 5], sigma=[0.1, 2.0])")
    assert "<lambda>" in lines[1]


def test_a_normalize_before_a_crop_and_a_custom_collate_are_refused(photos: Path) -> None:
    def stack(batch: list[Any]) -> Any:
        return batch

    chain = tv.Compose([tv.ToTensor(), tv.Normalize(MEAN, STD), tv.CenterCrop(224)])
    dataset = tv.ImageFolder(str(photos), transform=chain)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=stack)

    with pytest.raises(Unmovable) as refused:
        dali_module(recipe_of(loader), SETTING, ORIGIN)

    assert [line.split(" ")[0] for line in refused.value.lines] == [
        "CenterCrop(size=[224,",
        "collate_fn",
    ]


def test_a_long_list_of_samples_goes_beside_the_module(tmp_path: Path) -> None:
    samples = [[f"/data/image {n}.jpg", n % 7] for n in range(20_001)]
    recipe = {
        "dataset": {"kind": "list", "type": "Listed", "samples": samples},
        "subset": [20_000, 3],
        "transform": [{"name": "ToTensor", "fields": {}}],
        "target_transform": None,
        "loader_text": None,
        "batch_size": 8,
        "shuffle": False,
        "drop_last": False,
        "sampler": {"name": "SequentialSampler"},
        "collate_fn": "default",
    }
    result = dali_module(recipe, SETTING, ORIGIN)
    assert result.files is not None and "image 17.jpg" not in result.module
    module = written_module(result, tmp_path / "listed.py")

    assert module.samples() == [("/data/image 20000.jpg", 20_000 % 7), ("/data/image 3.jpg", 3)]


@pytest.mark.parametrize("chain", [validation, training])
def test_the_module_imports_torch_and_dali_only(
    photos: Path, chain: Callable[[], tv.Compose]
) -> None:
    loader = data_loader(tv.ImageFolder(str(photos), transform=chain()), 4, shuffle=True)
    text = dali_module(recipe_of(loader), SETTING, ORIGIN).module
    tree = ast.parse(text)

    assert outside_imports(text) == {"torch", "nvidia"}
    docstring = ast.get_docstring(tree) or ""
    assert "feedscope" in docstring
    assert text.lower().count("feedscope") == docstring.lower().count("feedscope")
    assert SETTING.source in text and ORIGIN in text
