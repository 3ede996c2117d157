"""`probe migrate --to dataloader`'s module: feedscope's DataLoader recipe written for a job's own
loader, run on the CPU against torchvision's transforms (as `fake_torchvision` computes them with
PIL) on the same files and seeds: the validation chain's pixels within a stated difference, the
training chain's crops and flips within what was asked, the same files, labels and batches."""

from __future__ import annotations

import ast
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import fake_torchvision as tv
import numpy as np
import pytest
import torch
from fake_torchvision import MEAN, STD, to_unit, training, validation
from PIL import Image

from helpers import data_loader, natural_image, outside_imports, photo_folder, written_module
from probe.fix.dali import Unmovable
from probe.fix.dataloader import TorchSetting, torch_module
from probe.measure.recipe import recipe_of

SETTING = TorchSetting(num_workers=0, source="the job's own (2 workers)")
ORIGIN = "run 20261128-080000-0000 of main.py (training loader)"
# Per pixel, in 0..1 units, between the written loader's validation images and torchvision's on
# the same camera-sized JPEGs (decoded at 1/2 or 1/4 scale before the resize): measured 0.0006
# on average over these photos and 0.0010 on the worst one (1800x1350, at 1/4). Their edges are
# soft; a sharp photo's differ more where the resize keeps detail the scaled decode smooths.
VALIDATION_BOUND = 0.005


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Six JPEGs in two classes: 1800x1350, 1200x900 and 900x1200 (a portrait) each."""
    sizes = [(1800, 1350), (1200, 900), (900, 1200)]
    return photo_folder(tmp_path_factory.mktemp("photos"), sizes, 2)


@pytest.fixture(scope="module")
def coordinates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """48 copies of a 1024x1024 JPEG whose red is its x / 4 and green its y / 4."""
    root = tmp_path_factory.mktemp("coordinates")
    (root / "all").mkdir()
    y, x = np.mgrid[0:1024, 0:1024]
    pixels = np.stack([x // 4, y // 4, np.full_like(x, 128)], axis=-1).astype(np.uint8)
    first = root / "all" / "00.jpg"
    Image.fromarray(pixels).save(first, quality=95, subsampling=0)
    for n in range(1, 48):
        (root / "all" / f"{n:02d}.jpg").write_bytes(first.read_bytes())
    return root


def written(loader: Any, folder: Path, name: str = "torch_loader") -> ModuleType:
    """The module written for a DataLoader, imported from `folder`."""
    return written_module(torch_module(recipe_of(loader), SETTING, ORIGIN), folder / f"{name}.py")


def test_validation_images_match_torchvision_on_the_same_files(
    photos: Path, tmp_path: Path
) -> None:
    dataset = tv.ImageFolder(str(photos), transform=validation())
    module = written(data_loader(dataset, batch_size=4, shuffle=False), tmp_path)
    assert module.REDUCED and module.HANDOVER == "uint8"

    differences: list[torch.Tensor] = []
    labels: list[int] = []
    for images, batch_labels in module.loader(device="cpu", seed=1):
        start = len(labels)
        labels.extend(batch_labels.tolist())
        assert images.dtype == torch.float32 and images.shape[1:] == (3, 224, 224)
        assert batch_labels.dtype == torch.int64
        expected = torch.stack([dataset[start + n][0] for n in range(len(images))])
        differences.append((to_unit(images) - to_unit(expected)).abs().mean(dim=(1, 2, 3)))

    assert labels == dataset.targets
    mean_absolute = torch.cat(differences)
    assert float(mean_absolute.max()) < VALIDATION_BOUND, mean_absolute.tolist()


def test_uint8_handed_over_and_normalized_after_the_copy_is_what_the_workers_would_give(
    photos: Path, tmp_path: Path
) -> None:
    """On a GPU the workers hand over uint8 and the copy is normalized (`_after_copy`); on the
    CPU alone the workers finish it: the two give the same images to float32's precision."""
    dataset = tv.ImageFolder(str(photos), transform=validation())
    module = written(data_loader(dataset, batch_size=4, shuffle=False), tmp_path)
    pairs = module.samples()
    on_gpu = module.Dataset(pairs, {}, on_gpu=True, seed=1)
    on_cpu = module.Dataset(pairs, {}, on_gpu=False, seed=1)
    handed = torch.stack([on_gpu[i][0] for i in range(3)])
    finished = torch.stack([on_cpu[i][0] for i in range(3)])
    assert handed.dtype == torch.uint8 and finished.dtype == torch.float32
    assert torch.allclose(module._after_copy(handed), finished, atol=1e-5)


def test_training_crops_and_flips_are_within_what_was_asked(
    coordinates: Path, tmp_path: Path
) -> None:
    size, scale, ratio = 64, (0.25, 0.6), (3 / 4, 4 / 3)
    dataset = tv.ImageFolder(str(coordinates), transform=training(size, scale))
    module = written(data_loader(dataset, batch_size=16, shuffle=True), tmp_path)
    assert module.REDUCED  # 1024-pixel crops of 64: decoded at 1/4 or 1/8 of the size

    areas, aspects, mirrored = tv.crops_seen(
        module.loader(device="cpu", seed=3), size, side=1024, pixels_a_level=4
    )

    assert len(areas) == 48
    tolerance = 0.05  # relative: 4 pixels a level, and JPEG's rounding, on crops of ~600
    assert scale[0] * (1 - tolerance) <= min(areas) and max(areas) <= scale[1] * (1 + tolerance)
    assert ratio[0] * (1 - tolerance) <= min(aspects) and max(aspects) <= ratio[1] * (1 + tolerance)
    assert min(areas) < 0.35 and max(areas) > 0.5  # drawn over the range, not one size
    assert 10 <= mirrored <= 38  # p = 0.5 of 48: outside this by chance once in 10^5


@pytest.mark.parametrize("drop_last", [False, True])
def test_epochs_are_the_dataloaders_files_labels_and_batches(
    photos: Path, tmp_path: Path, drop_last: bool
) -> None:
    dataset = tv.ImageFolder(str(photos), transform=validation(32, 32))
    job = data_loader(dataset, batch_size=4, shuffle=True, drop_last=drop_last)
    module = written(job, tmp_path)
    batches = module.loader(device="cpu", seed=5)

    assert len(batches) == len(job) == (1 if drop_last else 2)
    assert batches.batch_size == 4 and len(batches.dataset) == 6
    epochs = []
    for _ in range(2):
        batches.set_epoch(0)
        epochs.append([label for _, labels in batches for label in labels.tolist()])
    assert [len(epoch) for epoch in epochs] == [4, 4] if drop_last else [6, 6]
    if not drop_last:
        assert sorted(epochs[0]) == sorted(dataset.targets)


def test_a_step_it_cannot_write_is_the_jobs_own_from_its_loader(
    photos: Path, tmp_path: Path
) -> None:
    """torchvision's GaussianBlur gives a PIL image: the module's steps go on after it. A
    function may give anything: the steps after it are the job's own too."""
    blur = tv.GaussianBlur([5, 5], (0.5, 1.5))
    chain = tv.Compose(
        [tv.Resize(256), tv.CenterCrop(224), blur, tv.ToTensor(), tv.Normalize(MEAN, STD)]
    )
    dataset = tv.ImageFolder(str(photos), transform=chain)
    job = data_loader(dataset, batch_size=3, shuffle=False)
    module = written(job, tmp_path)
    assert module.KEPT == 1 and module.REDUCED and module.HANDOVER == "uint8"

    with pytest.raises(ValueError, match="keeps the job's own GaussianBlur"):
        module.loader(device="cpu")
    images, _ = next(iter(module.loader(device="cpu", original=job)))
    expected = torch.stack([dataset[n][0] for n in range(3)])
    assert float((to_unit(images) - to_unit(expected)).abs().mean()) < VALIDATION_BOUND

    def grey(image: Image.Image) -> Image.Image:
        return image.convert("L").convert("RGB")

    dataset.transform = tv.Compose(
        [tv.Resize(256), tv.CenterCrop(224), grey, tv.ToTensor(), tv.Normalize(MEAN, STD)]
    )
    job = data_loader(dataset, batch_size=3, shuffle=False)
    module = written(job, tmp_path, "after_a_function")
    assert module.KEPT == 3 and module.HANDOVER == "float"
    images, _ = next(iter(module.loader(device="cpu", original=job)))
    unit = to_unit(images)
    assert float((unit - to_unit(torch.stack([dataset[n][0] for n in range(3)]))).abs().mean()) < (
        VALIDATION_BOUND
    )
    assert float((unit[:, 0] - unit[:, 1]).abs().max()) < 1e-5  # grey: its channels agree


def test_a_step_after_the_tensor_keeps_the_workers_normalizing(
    photos: Path, tmp_path: Path
) -> None:
    def darker(tensor: torch.Tensor) -> torch.Tensor:
        return tensor * 0.5

    chain = tv.Compose([tv.Resize(64), tv.CenterCrop(64), tv.ToTensor(), darker])
    dataset = tv.ImageFolder(str(photos), transform=chain)
    job = data_loader(dataset, batch_size=2, shuffle=False)
    module = written(job, tmp_path)
    assert module.HANDOVER == "float"

    images, _ = next(iter(module.loader(device="cpu", original=job)))
    expected = torch.stack([dataset[n][0] for n in range(2)])
    assert float((images - expected).abs().mean()) < VALIDATION_BOUND


def test_a_custom_collate_and_a_target_transform_are_refused(photos: Path) -> None:
    def stack(batch: list[Any]) -> Any:
        return batch

    dataset = tv.ImageFolder(str(photos), transform=validation())
    dataset.target_transform = lambda label: label + 1  # type: ignore[assignment]
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, collate_fn=stack)

    with pytest.raises(Unmovable) as refused:
        torch_module(recipe_of(loader), SETTING, ORIGIN)
    assert [line.split(" ")[0] for line in refused.value.lines] == [
        "collate_fn",
        "target_transform",
    ]
    assert "cannot be written as a DataLoader" in str(refused.value)


def test_its_workers_are_kept_between_epochs(photos: Path, tmp_path: Path) -> None:
    dataset = tv.ImageFolder(str(photos), transform=validation(32, 32))
    result = torch_module(
        recipe_of(data_loader(dataset, batch_size=3, shuffle=False)),
        TorchSetting(num_workers=2, source="measured", prefetch_factor=2),
        ORIGIN,
    )
    module = written_module(result, tmp_path / "kept_workers.py")
    batches = module.loader(device="cpu", seed=1)
    assert batches.batches.persistent_workers and batches.batches.num_workers == 2
    labels = [[label for _, labels in batches for label in labels.tolist()] for _ in range(2)]
    assert labels[0] == labels[1] == dataset.targets


def test_the_module_imports_torch_numpy_and_pillow_only(photos: Path) -> None:
    loader = data_loader(tv.ImageFolder(str(photos), transform=training()), 4, shuffle=True)
    text = torch_module(recipe_of(loader), SETTING, ORIGIN).module
    tree = ast.parse(text)

    assert outside_imports(text) == {"torch", "numpy", "PIL"}
    docstring = ast.get_docstring(tree) or ""
    assert "feedscope" in docstring and ORIGIN in text and SETTING.source in text


def test_a_distributed_samplers_shards_cover_the_files_and_move_on_each_epoch(
    photos: Path, tmp_path: Path
) -> None:
    """A script calls set_epoch on its own DistributedSampler, which the written loader does not
    read: the loader's moves to the next epoch's order by itself."""
    dataset = tv.ImageFolder(str(photos), transform=validation(32, 32))
    sampler: Any = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=0, seed=4)
    job = torch.utils.data.DataLoader(dataset, batch_size=2, sampler=sampler)
    module = written(job, tmp_path)
    shards = [module.loader(device="cpu", rank=rank, world=2).sampler for rank in (0, 1)]

    first = [list(shard) for shard in shards]
    assert sorted(first[0] + first[1]) == list(range(6))
    orders = [first[0]] + [list(shards[0]) for _ in range(3)]
    assert len({tuple(order) for order in orders}) > 1  # 4 epochs of 3 of 6: not one order
    sampler.set_epoch(0)
    assert first[0] == list(sampler)  # the job's order in its first epoch


def test_training_images_match_torchvision_drawn_from_the_same_seed(tmp_path: Path) -> None:
    """The same draws (python's random, in torchvision's order) give the same crops and flips:
    on photos whose sides are no multiple of 8, decoded at a reduced scale, the pixels are
    torchvision's within the validation chain's bound (measured 0.0009 on average, 0.0011 on the
    worst)."""
    root = tmp_path / "odd"
    (root / "a").mkdir(parents=True)
    for n, (width, height) in enumerate([(1001, 751), (1499, 1003), (803, 1201)] * 2):
        natural_image(width, height, seed=40 + n).save(root / "a" / f"{n}.jpg", quality=90)
    dataset = tv.ImageFolder(str(root), transform=training(96, scale=(0.3, 1.0)))
    module = written(data_loader(dataset, batch_size=2, shuffle=False), tmp_path)
    ours = module.Dataset(module.samples(), {}, on_gpu=False, seed=7)

    random.seed(7)
    expected = torch.stack([dataset[n][0] for n in range(len(dataset))])
    images = torch.stack([ours[n][0] for n in range(len(dataset))])
    differences = (to_unit(images) - to_unit(expected)).abs().mean(dim=(1, 2, 3))
    assert float(differences.max()) < VALIDATION_BOUND, differences.tolist()


def test_a_center_crop_larger_than_the_image_is_padded_as_torchvision_pads(
    tmp_path: Path,
) -> None:
    root = tmp_path / "small"
    (root / "a").mkdir(parents=True)
    Image.fromarray(np.full((64, 10, 3), 200, np.uint8)).save(root / "a" / "0.png")
    chain = tv.Compose([tv.CenterCrop((67, 120)), tv.PILToTensor()])
    module = written(data_loader(tv.ImageFolder(str(root), transform=chain), 1, False), tmp_path)
    image = module.Dataset(module.samples(), {}, on_gpu=False, seed=0)[0][0]

    rows = image[0].amax(dim=1).nonzero().flatten().tolist()
    columns = image[0].amax(dim=0).nonzero().flatten().tolist()
    assert image.shape == (3, 67, 120)
    assert (rows[0], rows[-1]) == (1, 64)  # torchvision pads (67 - 64) // 2 = 1 row above
    assert (columns[0], columns[-1]) == (55, 64)  # and (120 - 10) // 2 = 55 columns left
