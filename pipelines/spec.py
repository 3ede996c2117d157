"""One frozen description of an input pipeline, read by both backends.

A `PipelineSpec` says what to read (a class-per-folder dataset, one shard of it), how to
augment it (ImageNet training: random resized crop, horizontal flip, normalize), where the
batches go (a CUDA device index, or None for the CPU) and the options of each backend. Both the
DataLoader and the DALI pipeline built from one spec yield the same thing: float32 NCHW images
normalized with the spec's mean and std, and int64 labels, on the spec's device.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from pipelines.errors import InputError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class Backend(str, Enum):
    """Which library feeds the GPU."""

    TORCH = "torch"
    DALI = "dali"


class Decoder(str, Enum):
    """Where DALI decodes JPEGs: `mixed` (nvJPEG and the hardware decoder) or `cpu`."""

    MIXED = "mixed"
    CPU = "cpu"


class OutputDtype(str, Enum):
    """What DataLoader workers hand over to the main process and copy to the device.

    `uint8`: raw pixels (4x less shared memory and host-to-device traffic), normalized on the
    device after the copy: the default on a GPU. `float32`: normalized in the workers, as
    torchvision's ToTensor and Normalize do: the default on the CPU, where there is no copy to
    save and the main process would otherwise normalize every batch alone.
    """

    FLOAT32 = "float32"
    UINT8 = "uint8"


@dataclass(frozen=True)
class Augmentation:
    """ImageNet training augmentation: random resized crop, horizontal flip, normalize."""

    crop_area: tuple[float, float] = (0.08, 1.0)  # share of the image's area
    crop_aspect_ratio: tuple[float, float] = (3 / 4, 4 / 3)  # width / height
    crop_attempts: int = 10  # random draws before falling back to a center crop
    flip_probability: float = 0.5
    mean: tuple[float, float, float] = IMAGENET_MEAN  # of RGB values scaled to [0, 1]
    std: tuple[float, float, float] = IMAGENET_STD

    def __post_init__(self) -> None:
        low, high = self.crop_area
        _require(
            0 < low <= high <= 1, f"crop area must satisfy 0 < low <= high <= 1 (got {low}, {high})"
        )
        low, high = self.crop_aspect_ratio
        _require(
            0 < low <= high, f"crop aspect ratio must satisfy 0 < low <= high (got {low}, {high})"
        )
        _require(self.crop_attempts >= 1, f"crop attempts must be >= 1 (got {self.crop_attempts})")
        _require(
            0 <= self.flip_probability <= 1,
            f"flip probability must be within 0..1 (got {self.flip_probability})",
        )
        _require(len(self.mean) == 3 and len(self.std) == 3, "mean and std need 3 values (R, G, B)")
        _require(all(s > 0 for s in self.std), f"std values must be > 0 (got {self.std})")


@dataclass(frozen=True)
class DataLoaderOptions:
    """Options of the PyTorch DataLoader backend."""

    num_workers: int = 4
    prefetch_factor: int = 2  # batches loaded ahead by each worker
    pin_memory: bool = True  # used only when the device is a GPU
    persistent_workers: bool = True  # used only with num_workers > 0
    output_dtype: OutputDtype | None = None  # None: uint8 to a GPU, float32 on the CPU
    # How workers start: fork, forkserver or spawn; None: what a fresh Python process uses
    # (fork on Linux before Python 3.14), not what the calling process inherited.
    start_method: str | None = None

    def __post_init__(self) -> None:
        _require_int(self.num_workers, "num_workers", minimum=0)
        _require_int(self.prefetch_factor, "prefetch_factor", minimum=1)
        methods = multiprocessing.get_all_start_methods()
        _require(
            self.start_method is None or self.start_method in methods,
            f"unknown worker start method {self.start_method!r} "
            f"(choose from: {', '.join(methods)})",
        )
        if self.output_dtype is not None:
            object.__setattr__(
                self, "output_dtype", _as_enum(OutputDtype, self.output_dtype, "output dtype")
            )


@dataclass(frozen=True)
class DaliOptions:
    """Options of the NVIDIA DALI backend."""

    num_threads: int = 4  # DALI's CPU worker threads
    decoder: Decoder | None = None  # None: mixed on a GPU, cpu without one
    hw_decoder_load: float = 0.65  # share of JPEGs sent to the hardware decoder (mixed only)
    prefetch_queue_depth: int = 2

    def __post_init__(self) -> None:
        _require_int(self.num_threads, "DALI num_threads", minimum=1)
        _require_int(self.prefetch_queue_depth, "DALI prefetch_queue_depth", minimum=1)
        _require(
            0 <= self.hw_decoder_load <= 1,
            f"hw_decoder_load must be within 0..1 (got {self.hw_decoder_load})",
        )
        if self.decoder is not None:
            object.__setattr__(self, "decoder", _as_enum(Decoder, self.decoder, "DALI decoder"))


@dataclass(frozen=True)
class PipelineSpec:
    """Everything both backends need to build the same input pipeline.

    Validation happens on construction and raises `InputError` (a `ValueError`) with a message a
    user can act on. Whether the dataset folder holds images, and whether the device exists, is
    checked when a pipeline is built: those are facts of the machine, not of the spec.
    """

    data_dir: Path
    batch_size: int = 128
    image_size: int = 224  # output side in pixels (square)
    augmentation: Augmentation = field(default_factory=Augmentation)
    device: int | None = None  # CUDA device index; None for the CPU
    shard_id: int = 0
    num_shards: int = 1
    seed: int = 0
    shuffle: bool = True  # read files in one seeded order, the same for every shard
    skip_corrupt: bool = False  # skip and count undecodable files instead of failing
    dataloader: DataLoaderOptions = field(default_factory=DataLoaderOptions)
    dali: DaliOptions = field(default_factory=DaliOptions)

    def __post_init__(self) -> None:
        object.__setattr__(self, "data_dir", Path(self.data_dir))
        _require_int(self.batch_size, "batch size", minimum=1)
        _require_int(self.image_size, "image size", minimum=1)
        _require_int(self.num_shards, "num_shards", minimum=1)
        _require_int(self.shard_id, "shard_id", minimum=0)
        _require(
            self.shard_id < self.num_shards,
            f"shard_id {self.shard_id} is out of range for {self.num_shards} shard(s) "
            f"(valid: 0..{self.num_shards - 1})",
        )
        _require_int(self.seed, "seed", minimum=0)
        _require(self.seed < 2**31, f"seed must be below 2**31 (got {self.seed})")
        if self.device is not None:
            _require(
                isinstance(self.device, int) and not isinstance(self.device, bool),
                f"device must be a CUDA index or None for the CPU (got {self.device!r})",
            )
            _require(self.device >= 0, f"CUDA device index must be >= 0 (got {self.device})")
        if self.dali.decoder is Decoder.MIXED and self.device is None:
            raise InputError(
                "DALI decoder 'mixed' needs a GPU: pick a CUDA device or use decoder 'cpu'"
            )

    @property
    def dali_decoder(self) -> Decoder:
        """The DALI decoder in effect: the one asked for, else mixed on a GPU and cpu without."""
        if self.dali.decoder is not None:
            return self.dali.decoder
        return Decoder.CPU if self.device is None else Decoder.MIXED

    @property
    def output_dtype(self) -> OutputDtype:
        """What DataLoader workers hand over: the one asked for, else uint8 to a GPU and
        float32 on the CPU."""
        if self.dataloader.output_dtype is not None:
            return self.dataloader.output_dtype
        return OutputDtype.FLOAT32 if self.device is None else OutputDtype.UINT8

    def batch_dtype(self, backend: Backend) -> OutputDtype:
        """What one output batch holds: DALI's are float32, a DataLoader's `output_dtype`."""
        return OutputDtype.FLOAT32 if backend is Backend.DALI else self.output_dtype

    def batch_bytes(self, backend: Backend) -> int:
        """One output batch's size: batch x 3 x image size x image size of `batch_dtype`."""
        item = 4 if self.batch_dtype(backend) is OutputDtype.FLOAT32 else 1
        return self.batch_size * 3 * self.image_size**2 * item

    def batch_text(self, backend: Backend) -> str:
        """ "batch 256 x 3 x 224 x 224 float32 (154 MB)"."""
        size = self.image_size
        return (
            f"batch {self.batch_size} x 3 x {size} x {size} {self.batch_dtype(backend).value} "
            f"({bytes_text(self.batch_bytes(backend))})"
        )

    def in_flight(self, backend: Backend) -> int:
        """Batches the pipeline holds ahead of the consumer at most: a DataLoader's workers x
        prefetch_factor, DALI's prefetch queue (filled while the consumer is slower, they
        are then handed over faster than they are made)."""
        if backend is Backend.DALI:
            return self.dali.prefetch_queue_depth
        return self.dataloader.num_workers * self.dataloader.prefetch_factor

    def with_shard(self, shard_id: int, num_shards: int) -> PipelineSpec:
        """The same pipeline reading another shard."""
        return dataclasses.replace(self, shard_id=shard_id, num_shards=num_shards)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready): enums as their values, paths as strings."""
        return _plain(dataclasses.asdict(self))  # type: ignore[no-any-return]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> PipelineSpec:
        """The spec `as_dict` described (validated again)."""
        fields = dict(values)
        augmentation = dict(fields.pop("augmentation", {}))
        for pair in ("crop_area", "crop_aspect_ratio", "mean", "std"):
            if pair in augmentation:
                augmentation[pair] = tuple(augmentation[pair])
        return cls(
            augmentation=Augmentation(**augmentation),
            dataloader=DataLoaderOptions(**fields.pop("dataloader", {})),
            dali=DaliOptions(**fields.pop("dali", {})),
            **fields,
        )


_E = TypeVar("_E", bound=Enum)


def bytes_text(count: float) -> str:
    """1.5e9 -> "1.5 GB" (decimal units, as memory sizes are quoted)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            return f"{count:.3g} {unit}"
        count /= 1000
    raise AssertionError("unreachable")


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    return value


def _as_enum(kind: type[_E], value: object, what: str) -> _E:
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(member.value) for member in kind)
        raise InputError(f"unknown {what} {value!r} (choose from: {choices})") from None


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InputError(message)


def _require_int(value: object, what: str, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{what} must be a whole number (got {value!r})")
    if value < minimum:
        raise InputError(f"{what} must be >= {minimum} (got {value})")
