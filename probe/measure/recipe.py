"""A torch DataLoader's recipe: what it reads and how it changes each sample, as JSON.

The recipe is what `probe migrate` writes a DALI loader from: the dataset's files and labels
(torchvision's `ImageFolder`/`DatasetFolder` by its `root` and `class_to_idx`, which list the
files again exactly; any dataset holding a list of `(path, label)` as `samples` or `imgs`, by the
list itself), a `Subset`'s indices, the transforms by class name and public fields, batch size,
shuffle, drop_last, the sampler and the collate function.

Everything is read by attribute names (torchvision is never imported), and nothing raises: this
runs inside a user's training job, where an unreadable part becomes "unknown" or null.
"""

from __future__ import annotations

import enum
import functools
import inspect
import os
from collections.abc import Mapping
from typing import Any

# Beyond this many samples or subset indices the recipe would outweigh the run it belongs to.
MAX_SAMPLES = 200_000
_COLLATE_DEFAULTS = ("default_collate", "default_convert")
# torchvision's steps that feedscope's DataLoader recipe computes itself (`probe migrate --to
# dataloader`); it keeps any other as the job's own
RECIPE_STEPS = frozenset(
    {
        "RandomResizedCrop",
        "Resize",
        "CenterCrop",
        "RandomCrop",
        "RandomHorizontalFlip",
        "ToTensor",
        "PILToTensor",
        "ConvertImageDtype",
        "Normalize",
    }
)


def recipe_of(loader: Any) -> dict[str, Any]:
    """The recipe of a torch DataLoader: dataset, subset, transforms, batching and sampler.

    Args:
        loader: a `torch.utils.data.DataLoader` (read by its attributes only).

    Returns:
        A JSON-serialisable dict: `dataset`, `subset`, `transform`, `target_transform`,
        `loader_text`, `batch_size`, `shuffle`, `drop_last`, `sampler`, `collate_fn`.
    """
    dataset = _safe(lambda: getattr(loader, "dataset", None))
    subset, inner, too_many = _subset_of(dataset)
    transform, loader_text = _safe(lambda: _transform_of(inner), (None, None))
    sampler = _safe(lambda: _sampler_of(loader), {"name": "unknown"})
    batch_size = _safe(lambda: getattr(loader, "batch_size", None))
    return {
        "dataset": {"kind": "unknown", "type": type(inner).__name__, "note": "too many files"}
        if too_many
        else _safe(lambda: _dataset_of(inner), {"kind": "unknown", "type": "unknown"}),
        "subset": subset,
        "transform": transform,
        "target_transform": _safe(lambda: _target_transform_of(inner)),
        "loader_text": loader_text,
        "batch_size": batch_size if isinstance(batch_size, int) else None,
        "shuffle": sampler["name"] == "RandomSampler"
        or (sampler["name"] == "DistributedSampler" and bool(sampler.get("shuffle"))),
        "drop_last": bool(_safe(lambda: getattr(loader, "drop_last", False), False)),
        "sampler": sampler,
        "collate_fn": _safe(lambda: _collate_of(loader), "unknown"),
    }


def _subset_of(dataset: Any) -> tuple[list[int] | None, Any, bool]:
    """The indices of a torch `Subset` (nested ones composed), the dataset under it, and
    whether they were too many (or unreadable) to record."""
    indices: list[int] | None = None
    try:
        while type(dataset).__name__ == "Subset" and hasattr(dataset, "dataset"):
            if len(dataset.indices) > MAX_SAMPLES:
                return None, dataset.dataset, True
            own = [int(i) for i in dataset.indices]
            indices = own if indices is None else [own[i] for i in indices]
            dataset = dataset.dataset
    except Exception:
        return None, dataset, True
    return indices, dataset, False


def _dataset_of(dataset: Any) -> dict[str, Any]:
    kind = type(dataset).__name__
    if all(hasattr(dataset, name) for name in ("root", "class_to_idx", "samples")):
        extensions = getattr(dataset, "extensions", None)
        if isinstance(extensions, str):
            extensions = [extensions]
        loader = getattr(dataset, "loader", None)
        return {
            "kind": "folder",
            "type": kind,
            "root": _absolute(dataset.root),
            "class_to_idx": {str(name): int(i) for name, i in dataset.class_to_idx.items()},
            "extensions": [str(e) for e in extensions] if extensions is not None else None,
            # what the written module checks its own listing against: the same files, or none
            "count": len(dataset.samples),
            "first": _absolute(dataset.samples[0][0]) if len(dataset.samples) else None,
            "loader": None
            if loader is None
            else getattr(loader, "__name__", type(loader).__name__),
        }
    for name in ("samples", "imgs"):
        listed = getattr(dataset, name, None)
        if isinstance(listed, (list, tuple)) and listed:
            if len(listed) > MAX_SAMPLES:
                return {"kind": "unknown", "type": kind, "note": "too many files"}
            try:
                samples = [[_absolute(path), int(label)] for path, label in listed]
            except (TypeError, ValueError):
                break
            return {"kind": "list", "type": kind, "samples": samples}
    return {"kind": "unknown", "type": kind}


def _name(function: Any) -> str:
    return str(getattr(function, "__name__", type(function).__name__))


def _absolute(path: Any) -> str:
    return str(os.path.abspath(os.fspath(path)))


def _transform_of(dataset: Any) -> tuple[list[dict[str, Any]] | None, str | None]:
    """The dataset's transform as a list of steps, and why not when it cannot be one."""
    transform = getattr(dataset, "transform", None)
    if transform is None:
        return None, None
    if _is_function(transform):
        step = _step(transform)
        return [step], f"the transform is the function {step['name']}, not a list of steps"
    return _flatten(transform), None


def _flatten(transform: Any) -> list[dict[str, Any]]:
    """A Compose-like object's steps in order (nested ones flattened), or the one step."""
    steps = getattr(transform, "transforms", None)
    # Compose alone: RandomApply, RandomChoice and RandomOrder hold `transforms` too, and apply
    # them by chance, so each stays one step (which the writer refuses by name)
    if type(transform).__name__ == "Compose" and isinstance(steps, (list, tuple)):
        return [step for inner in steps for step in _flatten(inner)]
    return [_step(transform)]


def _step(transform: Any) -> dict[str, Any]:
    if _is_function(transform):
        name = getattr(transform, "__name__", None) or type(transform).__name__
        return {"name": str(name), "fields": {}, "callable": True}
    return {"name": type(transform).__name__, "fields": _fields(transform)}


def _is_function(value: Any) -> bool:
    return (
        inspect.isfunction(value)
        or inspect.isbuiltin(value)
        or inspect.ismethod(value)
        or isinstance(value, functools.partial)
    )


def _fields(value: Any) -> dict[str, Any]:
    """An object's public instance attributes ("training", nn.Module's, left out), as JSON."""
    try:
        attributes = vars(value)
    except TypeError:
        return {}
    return {
        name: _json(field)
        for name, field in attributes.items()
        if not name.startswith("_") and name != "training"
    }


def _json(value: Any, depth: int = 0) -> Any:
    """A field as JSON: enums by value, tuples as lists, a dtype as its name, else its repr."""
    if isinstance(value, enum.Enum) and depth < 8:
        value = value.value  # torchvision's InterpolationMode is a str Enum: "bilinear"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and depth < 8:
        return [_json(item, depth + 1) for item in value]
    if isinstance(value, Mapping) and depth < 8:
        return {str(key): _json(item, depth + 1) for key, item in value.items()}
    if type(value).__name__ == "dtype" and type(value).__module__ == "torch":
        return str(value)
    return _safe(lambda: repr(value), type(value).__name__)


def _target_transform_of(dataset: Any) -> dict[str, Any] | None:
    transform = getattr(dataset, "target_transform", None)
    return None if transform is None else _step(transform)


def _sampler_of(loader: Any) -> dict[str, Any]:
    batch_sampler = getattr(loader, "batch_sampler", None)
    sampler: Any = getattr(loader, "sampler", None)
    if batch_sampler is not None and type(batch_sampler).__name__ != "BatchSampler":
        return {"name": type(batch_sampler).__name__}  # a custom batch sampler: batches its own
    name = type(sampler).__name__
    if name == "DistributedSampler":
        return {
            "name": name,
            "num_replicas": int(sampler.num_replicas),
            "rank": int(sampler.rank),
            "shuffle": bool(sampler.shuffle),
            "seed": int(sampler.seed),
            "drop_last": bool(sampler.drop_last),
        }
    return {"name": name}


def _collate_of(loader: Any) -> str:
    collate = getattr(loader, "collate_fn", None)
    name = getattr(collate, "__name__", None) or type(collate).__name__
    return "default" if name in _COLLATE_DEFAULTS else str(name)


def _safe(read: Any, default: Any = None) -> Any:
    """What `read()` gives, or the default when anything in it fails (a user's object)."""
    try:
        return read()
    except Exception:
        return default


# Samplers a written loader reads as (DALI's reader, or the written DataLoader)
WRITTEN_SAMPLERS = ("RandomSampler", "SequentialSampler", "DistributedSampler")
# torchvision's loaders of a DatasetFolder that give RGB images (None: not recorded)
PIL_LOADERS = (None, "default_loader", "pil_loader", "accimage_loader")


def refusals(recipe: Mapping[str, Any], writer: str) -> list[str]:
    """What of a DataLoader's recipe `writer` (a written loader) cannot give as the DataLoader
    did, one line each: a dataset naming no files, or read by another loader than PIL's; no
    transform; batches of a batch sampler, another sampler, a collate_fn, a target_transform."""
    refused = []
    dataset = recipe.get("dataset") or {}
    kind = dataset.get("kind")
    if kind == "folder" and dataset.get("loader") not in PIL_LOADERS:
        refused.append(
            f"the dataset {dataset.get('type')} reads its files with {dataset.get('loader')}, "
            "not torchvision's default (PIL, RGB)"
        )
    elif kind not in ("folder", "list"):
        name = dataset.get("type", "unknown")
        note = f" ({dataset['note']})" if dataset.get("note") else ""
        refused.append(
            f"the dataset {name}{note} names no files: only torchvision's ImageFolder/"
            "DatasetFolder or a list of (path, label) can be written"
        )
    if recipe.get("transform") is None:
        refused.append(
            "the dataset has no transform: its samples are PIL images, which a DataLoader with"
            " the default collate_fn cannot batch"
        )
    if not isinstance(recipe.get("batch_size"), int):
        refused.append("batch_size None: the DataLoader's batches are made by its batch sampler")
    sampler = recipe.get("sampler") or {}
    name = sampler.get("name") if isinstance(sampler, Mapping) else None
    if name not in WRITTEN_SAMPLERS:
        refused.append(
            f"sampler {name}: {writer} reads as RandomSampler, SequentialSampler and "
            "DistributedSampler only"
        )
    no_counterpart = f"{writer} has no exact counterpart"
    collate = recipe.get("collate_fn")
    if collate != "default":
        refused.append(f"collate_fn {collate}: {no_counterpart}")
    target = recipe.get("target_transform")
    if isinstance(target, Mapping):
        refused.append(f"target_transform {target.get('name')}: {no_counterpart}")
    return refused
