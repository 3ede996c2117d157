"""torchvision's transforms and ImageFolder, by their names and fields, computed with PIL as
torchvision computes them (torchvision itself cannot be installed here).

The transforms are `torch.nn.Module`s with torchvision's public fields (`size`, `interpolation`
as a str Enum, ...), so that a recipe reads them as it reads torchvision's own.
"""

from __future__ import annotations

import math
import os
import random
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageFilter

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class InterpolationMode(str, Enum):
    NEAREST = "nearest"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"


_PIL_FILTERS = {
    InterpolationMode.NEAREST: Image.Resampling.NEAREST,
    InterpolationMode.BILINEAR: Image.Resampling.BILINEAR,
    InterpolationMode.BICUBIC: Image.Resampling.BICUBIC,
}


class Compose:
    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = list(transforms)

    def __call__(self, image: Any) -> Any:
        for transform in self.transforms:
            image = transform(image)
        return image


def _resize(image: Image.Image, size: tuple[int, int], mode: InterpolationMode) -> Image.Image:
    """PIL's resize to (height, width): what torchvision's F.resize does on a PIL image."""
    return image.resize((size[1], size[0]), _PIL_FILTERS[mode])


class Resize(torch.nn.Module):
    def __init__(
        self,
        size: int | Sequence[int],
        interpolation: InterpolationMode = InterpolationMode.BILINEAR,
        max_size: int | None = None,
        antialias: bool | None = True,
    ) -> None:
        super().__init__()
        self.size = size
        self.max_size = max_size
        self.interpolation = interpolation
        self.antialias = antialias

    def forward(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        if isinstance(self.size, int):
            # torchvision's _compute_resized_output_size: the longer side truncated
            short, long = (width, height) if width <= height else (height, width)
            new_short, new_long = self.size, int(self.size * long / short)
            new_width, new_height = (
                (new_short, new_long) if width <= height else (new_long, new_short)
            )
            return _resize(image, (new_height, new_width), self.interpolation)
        return _resize(image, (self.size[0], self.size[1]), self.interpolation)


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (size[0], size[-1])


class CenterCrop(torch.nn.Module):
    def __init__(self, size: int | Sequence[int]) -> None:
        super().__init__()
        self.size = _pair(size)

    def forward(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        crop_height, crop_width = self.size
        top = round((height - crop_height) / 2.0)
        left = round((width - crop_width) / 2.0)
        return image.crop((left, top, left + crop_width, top + crop_height))


class RandomCrop(torch.nn.Module):
    def __init__(
        self,
        size: int | Sequence[int],
        padding: int | None = None,
        pad_if_needed: bool = False,
        fill: int = 0,
        padding_mode: str = "constant",
    ) -> None:
        super().__init__()
        self.size = _pair(size)
        self.padding = padding
        self.pad_if_needed = pad_if_needed
        self.fill = fill
        self.padding_mode = padding_mode

    def forward(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        top = random.randint(0, height - self.size[0])
        left = random.randint(0, width - self.size[1])
        return image.crop((left, top, left + self.size[1], top + self.size[0]))


class RandomResizedCrop(torch.nn.Module):
    def __init__(
        self,
        size: int | Sequence[int],
        scale: tuple[float, float] = (0.08, 1.0),
        ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: InterpolationMode = InterpolationMode.BILINEAR,
        antialias: bool | None = True,
    ) -> None:
        super().__init__()
        self.size = _pair(size)
        self.interpolation = interpolation
        self.antialias = antialias
        self.scale = scale
        self.ratio = ratio

    def forward(self, image: Image.Image) -> Image.Image:
        width, height = image.size
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target_area = area * random.uniform(*self.scale)
            aspect = math.exp(random.uniform(*log_ratio))
            crop_width = round(math.sqrt(target_area * aspect))
            crop_height = round(math.sqrt(target_area / aspect))
            if 0 < crop_width <= width and 0 < crop_height <= height:
                top = random.randint(0, height - crop_height)
                left = random.randint(0, width - crop_width)
                crop = image.crop((left, top, left + crop_width, top + crop_height))
                return _resize(crop, self.size, self.interpolation)
        return _resize(CenterCrop(min(width, height))(image), self.size, self.interpolation)


class RandomHorizontalFlip(torch.nn.Module):
    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = p

    def forward(self, image: Image.Image) -> Image.Image:
        if random.random() < self.p:
            return image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image


class ColorJitter(torch.nn.Module):
    """Fields only, as torchvision keeps them: (min, max) ranges, or None."""

    def __init__(
        self, brightness: float = 0, contrast: float = 0, saturation: float = 0, hue: float = 0
    ) -> None:
        super().__init__()
        self.brightness = (max(0.0, 1 - brightness), 1 + brightness) if brightness else None
        self.contrast = (max(0.0, 1 - contrast), 1 + contrast) if contrast else None
        self.saturation = (max(0.0, 1 - saturation), 1 + saturation) if saturation else None
        self.hue = (-hue, hue) if hue else None


class GaussianBlur(torch.nn.Module):
    """A transform DALI's written loader has no counterpart for (blurred at the mean sigma)."""

    def __init__(self, kernel_size: Sequence[int], sigma: tuple[float, float]) -> None:
        super().__init__()
        self.kernel_size = tuple(kernel_size)
        self.sigma = sigma

    def forward(self, image: Image.Image) -> Image.Image:
        return image.filter(ImageFilter.GaussianBlur(sum(self.sigma) / 2))


class ToTensor:
    def __call__(self, image: Image.Image) -> torch.Tensor:
        array = np.asarray(image, dtype=np.float32) / 255.0
        return torch.from_numpy(array.transpose(2, 0, 1).copy())


class PILToTensor:
    def __call__(self, image: Image.Image) -> torch.Tensor:
        return torch.from_numpy(np.array(image, np.uint8).transpose(2, 0, 1).copy())


class Normalize(torch.nn.Module):
    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        super().__init__()
        self.mean = mean
        self.std = std
        self.inplace = inplace

    def forward(self, tensor: torch.Tensor) -> torch.Tensor:
        mean = torch.tensor(self.mean, dtype=tensor.dtype).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=tensor.dtype).view(-1, 1, 1)
        return (tensor - mean) / std


def default_loader(path: str) -> Image.Image:
    """torchvision's: the file opened with PIL, as RGB."""
    with Image.open(path) as opened:
        image: Image.Image = opened.convert("RGB")
    return image


class ImageFolder(torch.utils.data.Dataset[tuple[Any, int]]):
    """torchvision's ImageFolder: classes are the sorted sub-folders, files listed as its
    make_dataset lists them."""

    def __init__(self, root: str, transform: Callable[[Any], Any] | None = None) -> None:
        self.root = root
        self.loader = default_loader
        self.transform = transform
        self.target_transform = None
        self.extensions = IMG_EXTENSIONS
        self.classes = sorted(entry.name for entry in os.scandir(root) if entry.is_dir())
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}
        self.samples: list[tuple[str, int]] = []
        for name in sorted(self.class_to_idx):
            folder = os.path.join(root, name)
            for parent, _, names in sorted(os.walk(folder, followlinks=True)):
                for file_name in sorted(names):
                    path = os.path.join(parent, file_name)
                    if path.lower().endswith(IMG_EXTENSIONS):
                        self.samples.append((path, self.class_to_idx[name]))
        self.targets = [label for _, label in self.samples]
        self.imgs = self.samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        path, label = self.samples[index]
        image: Any = self.loader(path)
        if self.transform is not None:
            image = self.transform(image)
        return image, label


# ImageNet's mean and std, and the chains pytorch/examples' ImageNet script builds of them
MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]


def validation(size: int = 256, crop: int = 224) -> Compose:
    return Compose([Resize(size), CenterCrop(crop), ToTensor(), Normalize(MEAN, STD)])


def training(size: int = 224, scale: tuple[float, float] = (0.08, 1.0)) -> Compose:
    return Compose(
        [RandomResizedCrop(size, scale=scale), RandomHorizontalFlip(), ToTensor(),
         Normalize(MEAN, STD)]
    )  # fmt: skip


def to_unit(images: torch.Tensor) -> torch.Tensor:
    """Images normalized with MEAN and STD (NCHW) back in 0..1 units."""
    return images * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)


def crops_seen(
    batches: Any, size: int, side: int, pixels_a_level: int
) -> tuple[list[float], list[float], int]:
    """Each crop's area (a share of the source) and aspect ratio, and how many were mirrored,
    read off normalized batches of a source `side` pixels square whose red is its x and green
    its y, `pixels_a_level` pixels a level."""
    areas, aspects, mirrored = [], [], 0
    for images, _ in batches:
        for image in to_unit(images) * 255 * pixels_a_level:
            first_x, last_x = float(image[0, :, 0].mean()), float(image[0, :, -1].mean())
            first_y, last_y = float(image[1, 0, :].mean()), float(image[1, -1, :].mean())
            # edge pixels' centres lie half an output pixel inside the crop window
            width = abs(last_x - first_x) * size / (size - 1)
            height = (last_y - first_y) * size / (size - 1)
            areas.append(width * height / side**2)
            aspects.append(width / height)
            mirrored += last_x < first_x
    return areas, aspects, mirrored
