"""feedscope's DataLoader recipe written for a user's own job (`probe migrate --to dataloader`).

`torch_module(recipe, setting, origin)` turns a DataLoader's recipe (`probe.measure.recipe`) into
the text of a Python module that imports torch, numpy and Pillow only: the dataset's files and
labels listed as torchvision lists them (`probe.present.migrate.dataset_lines`), the same batch
size, shuffle, drop_last and sampler, and the job's transforms with three changes that keep
their output:

- a JPEG is decoded at 1/2, 1/4 or 1/8 scale (`Image.draft`) where the first step's crop or
  resize still has at least the output's pixels after it; the crop is drawn on the full size;
- the workers hand over uint8 pixels; they are scaled and normalized on the GPU after the copy
  (on the CPU alone, in the workers, as the job's were);
- the workers are kept between epochs (`persistent_workers=True`).

A step it has no code for (a function, a transform it does not know) is kept as it was: the
module takes it from the job's own loader (`loader(original=...)`), and the gain is predicted
without it. What it cannot give as the job's loader gave (a custom collate_fn, sampler or
target_transform) is refused by name (`Unmovable`), and nothing partial is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from probe.measure.recipe import refusals
from probe.present.migrate import (
    Unmovable,
    Written,
    dataset_lines,
    described,
    size_of,
)

# The steps the module computes itself; any other step is the job's own, kept as it was
_GEOMETRY = ("RandomResizedCrop", "Resize")
_INTERPOLATIONS = {"bilinear": "bilinear", "bicubic": "bicubic", "nearest": "nearest",
                   2: "bilinear", 3: "bicubic", 0: "nearest"}  # fmt: skip
# torchvision's transforms that take a PIL image and give one: a step of the job's own among
# them leaves the steps after it to the module
IMAGE_TO_IMAGE = frozenset(
    {
        "ColorJitter", "GaussianBlur", "RandomGrayscale", "Grayscale", "RandomRotation",
        "RandomAffine", "RandomPerspective", "RandomAutocontrast", "RandomEqualize",
        "RandomPosterize", "RandomSolarize", "RandomAdjustSharpness", "RandomInvert",
        "AutoAugment", "RandAugment", "TrivialAugmentWide", "AugMix", "RandomVerticalFlip",
        "Pad", "RandomCrop", "CenterCrop", "Resize", "RandomResizedCrop",
    }
)  # fmt: skip
# torchvision's float dtypes, as ConvertImageDtype's field reads
_FLOATS = ("torch.float32", "torch.float")


@dataclass(frozen=True)
class TorchSetting:
    """The DataLoader's workers for the written loader, and where they were found.

    Attributes:
        num_workers: the DataLoader's worker processes.
        source: a sentence naming where they were found, e.g. "doctor session ...: 812
            images/s".
        predicted_images_per_s: what the recipe gave at `num_workers` where it was measured
            (None: not measured).
    """

    num_workers: int
    source: str = ""
    predicted_images_per_s: float | None = None
    prefetch_factor: int | None = None

    def describe(self) -> str:
        """ "4 workers, kept between epochs"."""
        count = f"{self.num_workers} worker{'s' if self.num_workers != 1 else ''}"
        return f"{count}, kept between epochs" if self.num_workers else "no workers"


@dataclass
class _Steps:
    """The transform as the module's STEPS: (name, arguments) each, `kept` for the job's own."""

    steps: list[tuple[str, dict[str, Any]]]
    kept: list[str]  # the kept steps, as `described` writes them
    reduced: bool  # the first step lets the decoder decode at a reduced scale
    handover: str  # "uint8": scaled and normalized after the copy; "float": in the workers


def torch_module(recipe: Mapping[str, Any], setting: TorchSetting, origin: str) -> Written:
    """The text of a module giving the DataLoader's batches from feedscope's recipe.

    Args:
        recipe: what `probe.measure.recipe.recipe_of` read of the DataLoader.
        setting: its workers, and where they were found.
        origin: what the DataLoader was, e.g. "run 20261127-053256-1c2f of main.py (training
            loader)".

    Returns:
        The module's text, and the text of its sibling file list when the dataset's samples
        are too many to write into it.

    Raises:
        Unmovable: with one line per thing the written loader cannot give as the job's did.
    """
    refused: list[str] = []
    dataset = dataset_lines(recipe)
    steps = _steps(recipe, refused)
    refused += refusals(recipe, "the written DataLoader")
    if refused or steps is None:
        raise Unmovable(refused, "this loader cannot be written as a DataLoader")
    files = None
    if dataset.files is not None:
        files = "".join(f"{label}\t{path}\n" for path, label in dataset.files)
    sampler = recipe.get("sampler") or {}
    kept = (
        "none: every step is the module's own"
        if not steps.kept
        else f"{', '.join(steps.kept)}: the job's own, from loader(original=...)"
    )
    header = _HEADER.format(
        origin=origin,
        steps=", ".join(str(step.get("name")) for step in recipe.get("transform") or []),
        kept_text=kept,
        dataset=dataset.text.rstrip("\n"),
        batch_size=int(recipe["batch_size"]),
        shuffle=bool(recipe.get("shuffle")),
        drop_last=bool(recipe.get("drop_last")),
        sampler=repr(str(sampler.get("name"))),
        sampler_seed=int(sampler.get("seed", 0)),
        sampler_drop_last=bool(sampler.get("drop_last", False)),
        num_workers=setting.num_workers,
        source=setting.source or "the job's own",
        prefetch_factor=setting.prefetch_factor,
        steps_text="\n".join(f"    ({name!r}, {arguments!r})," for name, arguments in steps.steps),
        kept=len(steps.kept),
        reduced=steps.reduced,
        handover=repr(steps.handover),
    )
    return Written(header + _BODY, files, tuple(steps.kept))


def _steps(recipe: Mapping[str, Any], refused: list[str]) -> _Steps | None:
    """The module's steps for the recipe's transform (None where it has none to batch). A step
    of the job's own keeps a PIL image a PIL image where torchvision's names it so
    (`IMAGE_TO_IMAGE`); after any other, what it gives is not known, and every later step is
    the job's own too, finished in the workers."""
    transforms = recipe.get("transform")
    if transforms is None:  # `refusals` says so
        return None
    steps: list[tuple[str, dict[str, Any]]] = []
    kept: list[str] = []
    tensor: str | None = None  # None: still a PIL image; "float" or "uint8"
    normalized = False
    unknown = False  # after a step of the job's own whose output is not known
    after_tensor_kept = False  # a step of the job's own on the tensor: the workers finish it
    for index, step in enumerate(transforms):
        name = str(step.get("name"))
        fields: Mapping[str, Any] = step.get("fields") or {}
        own = None
        if not (step.get("callable") or normalized or unknown):
            own = _own(name, fields, tensor)
        if own is None:
            kept.append(described(step))
            steps.append(("kept", {"index": index, "name": name}))
            after_tensor_kept = after_tensor_kept or tensor is not None
            unknown = unknown or (
                tensor is None and (step.get("callable") or name not in IMAGE_TO_IMAGE)
            )
            continue
        if own[0] in ("to_tensor", "to_float"):
            tensor = "float"
        elif own[0] == "pil_to_tensor":
            tensor = "uint8"
        elif own[0] == "normalize":
            normalized = True
        steps.append(own)
    reduced = bool(steps) and steps[0][0] in ("random_resized_crop", "resize")
    # uint8 over to the main process where nothing of the job's own follows the tensor
    handover = "float" if after_tensor_kept or unknown or tensor is None else "uint8"
    if tensor is None and not unknown:
        refused.append(
            "the transform ends on a PIL image, not a tensor (no ToTensor or PILToTensor)"
        )
    return _Steps(steps, kept, reduced, handover)


def _own(  # noqa: PLR0911, PLR0912
    name: str, fields: Mapping[str, Any], tensor: str | None
) -> tuple[str, dict[str, Any]] | None:
    """A step the module computes as torchvision does (None: the job's own is kept)."""
    on_image = tensor is None
    height, width = size_of(fields.get("size"))
    interpolation = _INTERPOLATIONS.get(fields.get("interpolation", "bilinear"))
    if name == "RandomResizedCrop" and on_image and height and width and interpolation:
        scale, ratio = fields.get("scale", [0.08, 1.0]), fields.get("ratio", [3 / 4, 4 / 3])
        return "random_resized_crop", {
            "size": [height, width],
            "scale": [float(s) for s in scale],
            "ratio": [float(r) for r in ratio],
            "interpolation": interpolation,
        }
    if name == "Resize" and on_image and interpolation:
        size = fields.get("size")
        if isinstance(size, list) and len(size) == 1:
            size = size[0]
        if isinstance(size, int) or (height and width):
            return "resize", {
                "size": size if isinstance(size, int) else [height, width],
                "max_size": fields.get("max_size"),
                "interpolation": interpolation,
            }
        return None
    if name == "CenterCrop" and on_image and height and width:
        return "center_crop", {"size": [height, width]}
    if name == "RandomCrop" and on_image and height and width:
        if fields.get("padding") or fields.get("pad_if_needed"):
            return None
        return "random_crop", {"size": [height, width]}
    if name == "RandomHorizontalFlip" and on_image:
        return "flip", {"p": float(fields.get("p", 0.5))}
    if name == "ToTensor" and on_image:
        return "to_tensor", {}
    if name == "PILToTensor" and on_image:
        return "pil_to_tensor", {}
    if name == "ConvertImageDtype" and tensor == "uint8" and str(fields.get("dtype")) in _FLOATS:
        return "to_float", {}
    if name == "Normalize" and tensor == "float":
        mean, std = fields.get("mean"), fields.get("std")
        if isinstance(mean, list) and isinstance(std, list) and len(mean) == len(std):
            return "normalize", {"mean": [float(m) for m in mean], "std": [float(s) for s in std]}
    return None


_HEADER = '''"""A torch DataLoader in place of another: its batches, at less CPU an image.

It replaces the DataLoader of {origin}.
Written by feedscope (`probe migrate --to dataloader`); it needs torch, numpy and Pillow only. It
gives what the DataLoader gave: (images, labels) batches, one epoch per `for`, of the same files,
labels, order, batch size and transform ({steps}); images NCHW, labels int64, on the device.
Three things change:
- JPEGs are decoded at 1/2, 1/4 or 1/8 scale (Pillow's draft mode) where the first crop or
  resize keeps at least its output's pixels after it: their pixels differ from a full-size
  decode's by a fraction of a level on average;
- the workers hand over uint8 pixels, scaled and normalized on the GPU after the copy (on the
  CPU alone, in the workers);
- its workers are kept between epochs (persistent_workers); a step of the job's own keeps the
  state it had when they started.
Steps kept as the job's own: {kept_text}.

    train_loader = loader()  # on torch.cuda.current_device(); the CPU without CUDA
    for epoch in range(epochs):
        train_loader.set_epoch(epoch)  # as a DistributedSampler's
        for images, labels in train_loader:
            ...
"""

from __future__ import annotations

import math
import os
import random

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, DistributedSampler

{dataset}


BATCH_SIZE = {batch_size}
SHUFFLE = {shuffle}
DROP_LAST = {drop_last}
SAMPLER = {sampler}  # the job's
SAMPLER_SEED = {sampler_seed}  # a DistributedSampler's seed and drop_last
SAMPLER_DROP_LAST = {sampler_drop_last}
# The workers: {source}
NUM_WORKERS = {num_workers}
PREFETCH_FACTOR = {prefetch_factor!r}  # None: torch's default
# The transform, step by step; ("kept", ...) is the job's own step at that index
STEPS = [
{steps_text}
]
KEPT = {kept}  # steps of the job's own: loader(original=the job's DataLoader) gives them
REDUCED = {reduced}  # the first step lets a JPEG decode at a reduced scale
HANDOVER = {handover}  # "uint8": normalized after the copy; "float": in the workers
'''

_BODY = '''

def _flattened(transform):
    """A torchvision Compose's steps in order (nested ones flattened), or the one step."""
    inner = getattr(transform, "transforms", None)
    if type(transform).__name__ == "Compose" and isinstance(inner, (list, tuple)):
        return [step for each in inner for step in _flattened(each)]
    return [transform]


def _kept_steps(original):
    """The job's own steps at the indices STEPS keeps, from its DataLoader (or its dataset)."""
    if not KEPT:
        return {}
    if original is None:
        kept = [arguments["name"] for name, arguments in STEPS if name == "kept"]
        raise ValueError(
            f"this loader keeps the job's own {', '.join(kept)}: give its DataLoader, "
            "loader(original=train_loader)"
        )
    dataset = getattr(original, "dataset", original)
    while type(dataset).__name__ == "Subset":
        dataset = dataset.dataset
    steps = _flattened(getattr(dataset, "transform", None))
    found = {}
    for name, arguments in STEPS:
        if name != "kept":
            continue
        index = arguments["index"]
        step = steps[index] if index < len(steps) else None
        called = getattr(step, "__name__", None) or type(step).__name__
        if called != arguments["name"]:
            raise ValueError(
                f"the job's transform has {called} where it had {arguments['name']} (step "
                f"{index + 1}): give the DataLoader this module was written for"
            )
        found[index] = step
    return found


def _box(width, height, size, scale, ratio, rng):
    """RandomResizedCrop's box (left, top, width, height), drawn as torchvision draws it."""
    area = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_ratio))
        crop_width = int(round(math.sqrt(target * aspect)))
        crop_height = int(round(math.sqrt(target / aspect)))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            top = rng.randint(0, height - crop_height)
            left = rng.randint(0, width - crop_width)
            return left, top, crop_width, crop_height
    in_ratio = width / height
    if in_ratio < min(ratio):
        crop_width, crop_height = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        crop_width, crop_height = int(round(height * max(ratio))), height
    else:
        crop_width, crop_height = width, height
    return (width - crop_width) // 2, (height - crop_height) // 2, crop_width, crop_height


def _resized_size(width, height, size, max_size):
    """Resize's output (width, height): a side for the shorter one, as torchvision computes it."""
    if isinstance(size, list):
        return size[1], size[0]
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = size, int(size * long / short)
    if max_size is not None and new_long > max_size:
        new_short, new_long = int(max_size * new_short / new_long), max_size
    return (new_short, new_long) if width <= height else (new_long, new_short)


_FILTERS = {
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "nearest": Image.Resampling.NEAREST,
}


def _reduction(width, height, need_width, need_height):
    """The largest JPEG scale 1/2, 1/4 or 1/8 that keeps width x height at least the need."""
    reduction = 1
    while (
        reduction < 8
        and width >= 2 * reduction * need_width
        and height >= 2 * reduction * need_height
    ):
        reduction *= 2
    return reduction


def _first(image, name, arguments, rng):
    """The first step on an opened, not yet decoded image: the crop drawn on its full size,
    the decoder told to decode at the scale that keeps the output's pixels."""
    width, height = image.size
    if name == "random_resized_crop":
        left, top, crop_width, crop_height = _box(width, height, **{
            k: arguments[k] for k in ("size", "scale", "ratio")}, rng=rng)
        out_height, out_width = arguments["size"]
        need = (crop_width, crop_height)
    else:
        out_width, out_height = _resized_size(width, height, arguments["size"],
                                              arguments["max_size"])
        left, top, crop_width, crop_height = 0, 0, width, height
        need = (width, height)
    reduction = _reduction(need[0], need[1], out_width, out_height)
    scale = 1.0  # of the decoded image against the full size
    if reduction > 1 and image.format == "JPEG":
        # Pillow picks the largest scale whose image is at least this size, and says it
        drafted = image.draft("RGB", (width // reduction, height // reduction))
        if drafted is not None:
            scale = drafted[1][2] / width
    image = image.convert("RGB")  # decodes (at the draft's scale), as ImageFolder's loader
    box = (left * scale, top * scale, (left + crop_width) * scale, (top + crop_height) * scale)
    return _resized(image, box, (out_width, out_height), arguments["interpolation"])


def _resized(image, box, size, interpolation):
    """The box of the image (fractional where it was decoded at a reduced scale) cropped, then
    resized to size (width, height), as torchvision crops and then resizes."""
    outer = (
        math.floor(box[0]),
        math.floor(box[1]),
        min(math.ceil(box[2]), image.size[0]),
        min(math.ceil(box[3]), image.size[1]),
    )
    inner = (box[0] - outer[0], box[1] - outer[1], min(box[2], outer[2]) - outer[0],
             min(box[3], outer[3]) - outer[1])
    return image.crop(outer).resize(size, _FILTERS[interpolation], box=inner)


def _center_crop(image, size):
    """torchvision's CenterCrop: padded with zeros where it is larger than the image."""
    crop_height, crop_width = size
    width, height = image.size
    if crop_width > width or crop_height > height:
        padded = Image.new(image.mode, (max(width, crop_width), max(height, crop_height)))
        left, top = max(0, (crop_width - width) // 2), max(0, (crop_height - height) // 2)
        padded.paste(image, (left, top))
        image, (width, height) = padded, padded.size
    top = int(round((height - crop_height) / 2.0))
    left = int(round((width - crop_width) / 2.0))
    return image.crop((left, top, left + crop_width, top + crop_height))


class Dataset(torch.utils.data.Dataset):
    """The files, decoded and transformed one at a time: (pixels, label)."""

    def __init__(self, pairs, kept, on_gpu, seed):
        self.pairs, self.kept = pairs, kept
        self.uint8 = HANDOVER == "uint8" and on_gpu  # on the CPU alone, finished here
        self.rng = random.Random(seed)  # reseeded in each worker

    def __len__(self):
        return len(self.pairs)

    def __getitem__(self, index):
        path, label = self.pairs[index]
        with Image.open(path) as opened:  # decoded here, and closed
            if REDUCED:  # the first step drawn on the full size, decoded at a reduced scale
                value = _first(opened, STEPS[0][0], STEPS[0][1], self.rng)
            else:
                value = opened.convert("RGB")  # as ImageFolder's loader
        for name, arguments in STEPS[1 if REDUCED else 0 :]:
            value = self._step(name, arguments, value)
        if isinstance(value, Image.Image):
            raise ValueError("the transform ended on a PIL image")
        return value, label

    def _step(self, name, arguments, value):
        rng = self.rng
        if name == "kept":
            return self.kept[arguments["index"]](value)
        if name == "random_resized_crop" or name == "resize":
            width, height = value.size
            if name == "resize":
                size = _resized_size(width, height, arguments["size"], arguments["max_size"])
                return value.resize(size, _FILTERS[arguments["interpolation"]])
            left, top, crop_width, crop_height = _box(width, height, **{
                k: arguments[k] for k in ("size", "scale", "ratio")}, rng=rng)
            out_height, out_width = arguments["size"]
            box = (left, top, left + crop_width, top + crop_height)
            return _resized(value, box, (out_width, out_height), arguments["interpolation"])
        if name == "center_crop":
            return _center_crop(value, arguments["size"])
        if name == "random_crop":
            width, height = value.size
            crop_height, crop_width = arguments["size"]
            top = rng.randint(0, height - crop_height)
            left = rng.randint(0, width - crop_width)
            return value.crop((left, top, left + crop_width, top + crop_height))
        if name == "flip":
            if rng.random() < arguments["p"]:
                if isinstance(value, Image.Image):
                    return value.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
                return value.flip(-1)
            return value
        if name in ("to_tensor", "pil_to_tensor"):
            array = np.array(value, np.uint8)
            if array.ndim == 2:  # one channel (L), as torchvision gives it
                array = array[:, :, None]
            pixels = torch.from_numpy(array).permute(2, 0, 1).contiguous()
            return pixels if self.uint8 or name == "pil_to_tensor" else pixels.float().div_(255)
        if name == "to_float":
            return value if self.uint8 else value.float().div_(255)
        if name == "normalize":
            return value if self.uint8 else _normalized(value, arguments, 1.0)
        raise ValueError(f"unknown step {name}")


def _normalized(images, arguments, scale):
    """(images - mean) / std, the mean and std in 0..1 units times `scale` (255: of uint8)."""
    shape = (-1, 1, 1) if images.dim() == 3 else (1, -1, 1, 1)
    mean = torch.tensor(arguments["mean"], device=images.device).mul(scale).view(shape)
    std = torch.tensor(arguments["std"], device=images.device).mul(scale).view(shape)
    return images.float().sub_(mean).div_(std)


def _after_copy(images):
    """uint8 pixels, copied: scaled and normalized on the device, as the job's steps would."""
    normalize = [arguments for name, arguments in STEPS if name == "normalize"]
    if normalize:
        return _normalized(images, normalize[0], 255.0)
    if any(name in ("to_tensor", "to_float") for name, _ in STEPS):
        return images.float().div_(255)
    return images


class _Shard(DistributedSampler):
    """The job's DistributedSampler, moving to the next epoch's order after each pass by itself:
    a script calls set_epoch on its own sampler, which this loader does not read. A job resumed
    at a later epoch starts again from epoch 0's order unless it calls set_epoch on this
    loader."""

    def __iter__(self):
        order = super().__iter__()
        self.epoch += 1
        return order


class _WorkerSeed:
    """Each worker's random draws, from the seed torch gives it."""

    def __call__(self, worker_id):
        info = torch.utils.data.get_worker_info()
        info.dataset.rng = random.Random(info.seed)


class Loader:
    """The batches: (images, labels), one epoch per `for`; `dataset`, `sampler` and
    `batch_size` as a script may ask of a DataLoader."""

    def __init__(self, batches, device, uint8):
        self.batches, self.device, self.uint8 = batches, device, uint8
        self.dataset, self.sampler = batches.dataset, batches.sampler
        self.batch_size = BATCH_SIZE

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        on_gpu = self.device.type == "cuda"
        for images, labels in self.batches:
            if on_gpu:
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
            yield (_after_copy(images) if self.uint8 else images), labels

    def set_epoch(self, epoch):
        """A DistributedSampler's order for the epoch, as the job's set_epoch gave it (each pass
        moves to the next one by itself)."""
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)


def loader(device=None, seed=None, rank=None, world=None, original=None):
    """The DataLoader on `device` (a CUDA index or torch.device; default: the current CUDA
    device, or the CPU without CUDA), reading shard `rank` of `world` where the job's sampler
    was a DistributedSampler (default: this process's torch.distributed rank and world size,
    else 0 of 1). `seed` seeds the order and the random steps (default: random, as the job's
    were); `original` is the job's DataLoader where the module keeps steps of its own."""
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    on_gpu = device.type == "cuda"
    kept = _kept_steps(original)
    dataset = Dataset(samples(), kept, on_gpu, seed)
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    sampler = None
    if SAMPLER == "DistributedSampler":
        if rank is None or world is None:
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            rank = torch.distributed.get_rank() if distributed else 0
            world = torch.distributed.get_world_size() if distributed else 1
        sampler = _Shard(
            dataset, num_replicas=world, rank=rank, shuffle=SHUFFLE,
            seed=SAMPLER_SEED if seed is None else seed, drop_last=SAMPLER_DROP_LAST,
        )
    options = {}
    if NUM_WORKERS > 0:
        options = {"persistent_workers": True, "worker_init_fn": _WorkerSeed()}
        if PREFETCH_FACTOR is not None:
            options["prefetch_factor"] = PREFETCH_FACTOR
    batches = DataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=SHUFFLE if sampler is None else False,
        sampler=sampler,
        drop_last=DROP_LAST,
        num_workers=NUM_WORKERS,
        pin_memory=on_gpu,
        generator=generator,
        **options,
    )
    return Loader(batches, device, dataset.uint8)
'''
