"""feedscope's DataLoader recipe written for a user's own job (`probe migrate --to dataloader`).

`torch_module(recipe, setting, origin)` turns a DataLoader's recipe (`probe.measure.recipe`) into
the text of a Python module that imports torch, numpy and Pillow only: the dataset's files and
labels listed as torchvision lists them (`probe.fix.dali.dataset_lines`), the same batch
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

from probe.fix import dataloader_text as template
from probe.fix.dali import (
    Unmovable,
    Written,
    dataset_lines,
    described,
    size_of,
)
from probe.measure.recipe import refusals

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
    header = template.HEADER.format(
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
    return Written(header + template.BODY, files, tuple(steps.kept))


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
