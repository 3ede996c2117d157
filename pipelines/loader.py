"""The interface both backends implement, and the one way to build a pipeline from a spec.

This module imports neither torch nor DALI at load time: each backend module alone imports its
framework, so a machine without DALI can still build DataLoader pipelines.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from pipelines.dataset import Dataset, discover, read_order, shard
from pipelines.errors import InputError
from pipelines.spec import Backend, PipelineSpec

if TYPE_CHECKING:
    import torch

# The stages a DataLoader pipeline times, in the order an image meets them: in the workers, then
# in the training loop's thread (the step, and the training process's other threads, are timed
# by whoever runs the loop).
WORKER_STAGES = ("read", "decode", "crop_resize", "flip", "collate", "worker_rest")
MAIN_STAGES = ("receive", "to_device", "normalize")
NOTHING_TO_READ = "every image of the shard was skipped as corrupt: nothing to read"


class Batch(NamedTuple):
    """What both backends yield: images and labels on the spec's device."""

    images: torch.Tensor  # float32, N x 3 x H x W, normalized with the spec's mean and std
    labels: torch.Tensor  # int64, N


@dataclass(frozen=True)
class ReadStart:
    """One start of reading: an epoch's `iter()`, or a stream's only one.

    Its cost is the wait for the first batch after it, which splits at `ready_ns`: before it,
    the loader started (worker processes spawned or forked, the dataset sent to them,
    `worker_init_fn`; persistent workers told to resume); after it, the first batch was made
    while the prefetch queue refilled.
    """

    started_ns: int  # monotonic: when reading was asked to start
    ready_ns: int  # monotonic: when the worker making the first batch was ready for it


class InputPipeline(abc.ABC):
    """One shard of a dataset as batches on a device.

    Iterating yields one epoch: every file of the shard once, in the dataset's read order; its
    last batch may be smaller than the batch size. Iterating again starts the next epoch, and a
    DataLoader's prefetch starts empty again. `stream()` reads the shard again and again with no
    epoch ends, as a long training job sees it once it runs.
    """

    backend: ClassVar[Backend]

    def __init__(self, spec: PipelineSpec, dataset: Dataset) -> None:
        """Builds the pipeline.

        Args:
            spec: what to build.
            dataset: every file of the dataset, in read order; the pipeline reads its shard.
        """
        self.spec = spec
        self.dataset = dataset
        self.shard = shard(dataset, spec.shard_id, spec.num_shards)
        self.skipped_files: list[str] = []  # undecodable files skipped (spec.skip_corrupt)
        self.starts: list[ReadStart] = []  # each start of reading, as its first batch arrives
        # The CPU nanoseconds of the batch just yielded, by stage (`STAGE_NAMES`); None where
        # the backend does not time its stages.
        self.last_stages: dict[str, int] | None = None
        # How long the worker that made the batch just yielded was busy on it, in nanoseconds
        # (its thread's wall time, its waits for a core left out); None where not timed.
        self.last_serial_ns: int | None = None

    @property
    def samples_per_epoch(self) -> int:
        return len(self.shard)

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(len(self.shard) / self.spec.batch_size)

    @abc.abstractmethod
    def __iter__(self) -> Iterator[Batch]:
        """Yields the batches of one epoch."""

    def stream(self) -> Iterator[Batch]:
        """Yields batches without end, reading the shard again and again in its read order.

        Here epoch after epoch; a backend whose epochs restart its loader (the DataLoader)
        reads one endless stream instead, so that nothing drains between epochs.

        Raises:
            InputError: the shard yields nothing (every image of it was skipped as corrupt).
        """
        while True:
            yielded = False
            for batch in self:
                yielded = True
                yield batch
            if not yielded:
                raise InputError(NOTHING_TO_READ)

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Stops worker processes or threads; the pipeline cannot be used afterwards."""

    def __enter__(self) -> InputPipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def build_pipeline(
    spec: PipelineSpec, backend: Backend | str, *, dataset: Dataset | None = None
) -> InputPipeline:
    """Builds the DataLoader or DALI pipeline that `spec` describes.

    Args:
        spec: the pipeline.
        backend: `torch` or `dali`.
        dataset: the result of `discover(spec.data_dir)`, to skip walking the folder again.

    Raises:
        InputError: the dataset, the shard or the device cannot work, or DALI is not installed
            (`BackendUnavailable`).
    """
    backend = Backend(backend)
    if dataset is None:
        dataset = discover(spec.data_dir)
    ordered = read_order(dataset, shuffle=spec.shuffle, seed=spec.seed)
    check_device(spec.device)
    if backend is Backend.DALI:
        from pipelines.dali_loader import DaliPipeline

        return DaliPipeline(spec, ordered)
    from pipelines.torch_loader import TorchPipeline

    return TorchPipeline(spec, ordered)


def check_backend(backend: Backend | str) -> None:
    """Checks that a backend's library is installed.

    Raises:
        BackendUnavailable: it is not (DALI is an optional extra); the message says how to
            install it.
    """
    if Backend(backend) is Backend.DALI:
        import pipelines.dali_loader  # noqa: F401 - its import fails with the install hint


def check_device(device: int | None) -> None:
    """Checks that CUDA device `device` exists (None, the CPU, always does).

    Raises:
        InputError: CUDA is not available, or there is no device with that index.
    """
    if device is None:
        return
    import torch

    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else "no GPU or driver found"
        raise InputError(
            f"GPU {device} was asked for, but CUDA is not available here "
            f"(torch {torch.__version__}, {build}); use the CPU instead"
        )
    count = torch.cuda.device_count()
    if device >= count:
        raise InputError(
            f"GPU {device} does not exist: CUDA sees {count} device(s), 0..{count - 1}"
        )


def cuda_device_count() -> int:
    """CUDA devices this process sees (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def use_device(device: int) -> None:
    """Makes CUDA device `device` this thread's current one."""
    import torch

    torch.cuda.set_device(device)
