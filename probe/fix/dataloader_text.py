"""The text of the DataLoader module `probe.fix.dataloader` writes."""

HEADER = '''"""A torch DataLoader in place of another: its batches, at less CPU an image.

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

BODY = '''

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
