"""The PyTorch DataLoader backend: Pillow decoding and ImageNet training augmentation.

Written as the baseline a careful engineer would write, so that a comparison with DALI is fair:

- let libjpeg decode at 1/2, 1/4 or 1/8 scale (`Image.draft`) when the crop is still at least the
  output size after it; crop in Pillow, resize with torch's uint8 antialiased bilinear kernel
  (twice as fast as Pillow's), straight into the CHW layout the batch has;
- to a GPU, workers hand over uint8 pixels (4x less shared memory and host-to-device traffic
  than float32), stacked straight into shared memory, normalized on the device after the copy;
  on the CPU they hand over normalized float32, so that the main process has nothing left to do;
- EXIF orientation applied before the crop, as DALI's decoders do (`adjust_orientation`): the
  same image gives the same pixels in both backends;
- pinned memory and non-blocking copies on a GPU, persistent workers, seeded augmentation;
- each stage's CPU time is timed where it runs (`WORKER_STAGES` in the workers, on their
  thread's clock, with what else their process spent as `worker_rest`; `MAIN_STAGES` in the
  training process, on the clock of the thread that runs the loop): `last_stages`; and how long
  a worker's thread was busy making the batch (`last_serial_ns`: its wall time from the first
  sample to the stacked batch, less its waits for a core; its waits for the GIL, which the
  queue's thread holds while it hands the last batch over, and for the disk count);
- `stream()` reads through one endless batch sampler: the shard's read order again and again,
  so that the workers never drain at an epoch's end (a `for` over the pipeline, one epoch,
  restarts the DataLoader's iterator, as a training loop's `for batch in loader` does).

No torchvision: the augmentation follows torchvision's RandomResizedCrop and RandomHorizontalFlip.
"""

from __future__ import annotations

import contextlib
import io
import math
import multiprocessing
import multiprocessing.util
import os
import random
import shutil
import signal
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from PIL import Image, ImageOps
from torch.nn import functional
from torch.utils.data import DataLoader, default_collate, get_worker_info

from pipelines.dataset import Dataset
from pipelines.errors import CorruptImageError, InputError
from pipelines.loader import (
    MAIN_STAGES,
    NOTHING_TO_READ,
    WORKER_STAGES,
    Batch,
    InputPipeline,
    ReadStart,
    use_device,
)
from pipelines.spec import Augmentation, Backend, OutputDtype, PipelineSpec

# One sample as a worker returns it: CHW uint8 pixels (None if undecodable), label, error, and
# the CPU nanoseconds of its read, decode, crop_resize and flip stages, and its wall time.
_Sample = tuple[torch.Tensor | None, int, str | None, tuple[int, int, int, int, int]]
# One batch as the main process receives it: images, labels, "path: reason" of failures, and
# the CPU nanoseconds of each of WORKER_STAGES followed by the worker's busy nanoseconds (0 in
# the training process). Labels travel as plain ints: every tensor in a
# batch costs a file-descriptor handshake with the worker (torch's default sharing), and a batch
# of labels is a few hundred bytes.
_WorkerBatch = tuple[torch.Tensor, tuple[int, ...], tuple[str, ...], tuple[int, ...]]


class TorchPipeline(InputPipeline):
    """A torch DataLoader over one shard, yielding normalized float32 batches on the device."""

    backend: ClassVar[Backend] = Backend.TORCH

    def __init__(self, spec: PipelineSpec, dataset: Dataset) -> None:
        super().__init__(spec, dataset)
        self._device = torch.device("cpu")
        if spec.device is not None:
            self._device = torch.device("cuda", spec.device)
            use_device(spec.device)  # the pin-memory thread pins for the current device
        self._normalize = Normalizer(spec.augmentation, self._device)
        self._dataset = ShardDataset(self.shard.files, self.shard.labels, spec)
        self._loaders: dict[str, tuple[DataLoader[Any], _WorkerInit]] = {}  # built when used
        self._stream: Any = None  # the stream's DataLoader iterator, once started

    def __iter__(self) -> Iterator[Batch]:
        loader, init = self._loader("epoch")
        started_ns = time.monotonic_ns()
        with _quiet_about_worker_count():
            batches = iter(loader)
        yield from self._batches(batches, init, started_ns, time.monotonic_ns())

    def stream(self) -> Iterator[Batch]:
        loader, init = self._loader("stream")
        started_ns = time.monotonic_ns()
        with _quiet_about_worker_count():
            self._stream = iter(loader)
        yield from self._batches(self._stream, init, started_ns, time.monotonic_ns())

    def _batches(
        self, batches: Iterable[_WorkerBatch], init: _WorkerInit, started_ns: int, iterated_ns: int
    ) -> Iterator[Batch]:
        """The batches of one reading, which `iter()` started at `started_ns` and returned from
        at `iterated_ns`."""
        normalize_here = self.spec.output_dtype is OutputDtype.UINT8
        in_process = self.spec.dataloader.num_workers == 0  # the workers' stages run here
        unread = 0  # samples skipped since the last one that decoded
        clock = time.thread_time_ns  # this thread's: the training loop's own work
        asked = clock()
        for position, (host_images, host_labels, failures, timed) in enumerate(batches):
            received = clock()
            *worker, serial = timed
            receive = received - asked
            if in_process:  # next() ran the workers' stages here: they are counted apart
                receive = max(0, receive - sum(worker))
            if position == 0:
                self.starts.append(ReadStart(started_ns, init.ready_ns(started_ns, iterated_ns)))
            if failures:
                if not self.spec.skip_corrupt:
                    path, _, reason = failures[0].partition("\t")
                    raise CorruptImageError(path, reason)
                for failure in failures:  # each file once, whatever the epochs
                    path = failure.partition("\t")[0]
                    if path not in self.skipped_files:
                        self.skipped_files.append(path)
                unread = 0 if host_labels else unread + len(failures)
                if unread >= len(self.shard):  # a whole pass of the shard, and nothing read
                    raise InputError(NOTHING_TO_READ)
                if len(host_labels) == 0:
                    continue
            images = host_images.to(self._device, non_blocking=True)
            labels = torch.tensor(host_labels, dtype=torch.int64).to(
                self._device, non_blocking=True
            )
            copied = clock()
            if normalize_here:
                images = self._normalize(images)
            normalized = clock()
            self.last_stages = {
                **dict(zip(WORKER_STAGES, worker, strict=True)),
                **dict(zip(MAIN_STAGES, (receive, copied - received, normalized - copied),
                           strict=True)),
            }  # fmt: skip
            self.last_serial_ns = serial or None
            yield Batch(images, labels)
            asked = clock()

    def _loader(self, kind: str) -> tuple[DataLoader[Any], _WorkerInit]:
        """The DataLoader for epochs (`epoch`) or for the endless stream (`stream`)."""
        if kind in self._loaders:
            return self._loaders[kind]
        spec, options = self.spec, self.spec.dataloader
        workers = options.num_workers
        context = multiprocessing.get_context(_start_method(options.start_method))
        init = _WorkerInit(context, workers)
        if kind == "stream":
            batching: dict[str, Any] = {
                "batch_sampler": EndlessBatches(len(self.shard), spec.batch_size)
            }
        else:
            batching = {"batch_size": spec.batch_size, "shuffle": False, "drop_last": False}
        with _quiet_about_worker_count():
            loader = DataLoader(
                self._dataset,
                **batching,  # the read order is the dataset's, the same as DALI's
                num_workers=workers,
                collate_fn=_Collate(spec),
                pin_memory=options.pin_memory and spec.device is not None,
                prefetch_factor=options.prefetch_factor if workers > 0 else None,
                persistent_workers=options.persistent_workers and workers > 0,
                worker_init_fn=init,
                generator=torch.Generator().manual_seed(spec.seed),
                multiprocessing_context=context if workers > 0 else None,
            )
        self._loaders[kind] = (loader, init)
        return loader, init

    def close(self) -> None:
        iterators = [self._stream] + [  # persistent workers keep the epoch iterator alive
            getattr(loader, "_iterator", None) for loader, _ in self._loaders.values()
        ]
        for iterator in iterators:
            if iterator is not None and hasattr(iterator, "_shutdown_workers"):
                iterator._shutdown_workers()
        for loader, _ in self._loaders.values():
            loader._iterator = None
        self._stream = None


class EndlessBatches:
    """Batches of a shard's indices without end: 0 .. n-1 in order, again and again. A batch
    may hold the end of one pass and the start of the next, so every batch is full."""

    def __init__(self, samples: int, batch_size: int) -> None:
        self.samples, self.batch_size = samples, batch_size

    def __iter__(self) -> Iterator[list[int]]:
        first = 0
        while True:
            yield [(first + i) % self.samples for i in range(self.batch_size)]
            first = (first + self.batch_size) % self.samples


class Normalizer:
    """uint8 NCHW pixels to float32 normalized with the spec's mean and std, on one device."""

    def __init__(self, augmentation: Augmentation, device: torch.device) -> None:
        mean = torch.tensor(augmentation.mean, dtype=torch.float32).mul(255).view(1, 3, 1, 1)
        std = torch.tensor(augmentation.std, dtype=torch.float32).mul(255).view(1, 3, 1, 1)
        self._mean = mean.to(device)
        self._inv_std = std.reciprocal().to(device)

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        return images.float().sub_(self._mean).mul_(self._inv_std)


class ShardDataset(torch.utils.data.Dataset[_Sample]):
    """The files of one shard, decoded and augmented one at a time.

    Undecodable files are returned as errors rather than raised, so that the main process can
    name the file in one clean message, or skip and count it.
    """

    def __init__(self, files: Sequence[str], labels: Sequence[int], spec: PipelineSpec) -> None:
        self.files = files
        self.labels = labels
        self.image_size = spec.image_size
        self.augmentation = spec.augmentation
        self.rng = random.Random(spec.seed)  # reseeded per worker by _WorkerInit

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> _Sample:
        path, label = self.files[index], self.labels[index]
        times = StageTimes()
        try:
            pixels = load_augmented(path, self.image_size, self.augmentation, self.rng, times)
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
            return None, label, f"{path}\t{type(error).__name__}: {error}", times.spent()
        return pixels, label, None, times.spent()


class StageTimes:
    """The CPU time of one sample's stages, on the thread's clock: `mark(stage)` ends a stage
    begun at the previous mark (or at the start); and the sample's wall time."""

    def __init__(self) -> None:
        self.ns = {"read": 0, "decode": 0, "crop_resize": 0, "flip": 0}
        self._began = time.monotonic_ns()
        self._last = time.thread_time_ns()

    def mark(self, stage: str) -> None:
        now = time.thread_time_ns()
        self.ns[stage] += now - self._last
        self._last = now

    def spent(self) -> tuple[int, int, int, int, int]:
        ns, wall = self.ns, time.monotonic_ns() - self._began
        return ns["read"], ns["decode"], ns["crop_resize"], ns["flip"], wall


def load_augmented(
    path: str,
    size: int,
    augmentation: Augmentation,
    rng: random.Random,
    times: StageTimes | None = None,
) -> torch.Tensor:
    """Decodes one image and applies random resized crop and horizontal flip.

    Args:
        times: where to add each stage's CPU time (read, decode, crop_resize, flip).

    Returns:
        3 x size x size uint8 RGB pixels, contiguous.
    """
    times = times or StageTimes()
    with open(path, "rb") as file:
        data = file.read()
    times.mark("read")
    with Image.open(io.BytesIO(data)) as stored:
        # The crop is drawn on the image as shown, its EXIF orientation applied, as DALI does.
        orientation = stored.getexif().get(EXIF_ORIENTATION, 1)
        full_width, full_height = stored.size
        if orientation in TURNED:
            full_width, full_height = full_height, full_width
        left, top, width, height = random_resized_crop(full_width, full_height, augmentation, rng)
        # Decoding at 1/2, 1/4 or 1/8 scale is much cheaper and loses nothing the resize keeps.
        reduction = 1
        while reduction < 8 and min(width, height) >= 2 * reduction * size:
            reduction *= 2
        if reduction > 1 and stored.format == "JPEG":
            # Pillow picks the largest scale whose image is at least this size (a ceiling here
            # would halve the scale of a side that is no multiple of it)
            target = (stored.width // reduction, stored.height // reduction)
            stored.draft(stored.mode, target)
        stored.load()  # decodes (at the draft's scale)
        image = ImageOps.exif_transpose(stored) if orientation != 1 else stored
        times.mark("decode")
        scale_x, scale_y = image.size[0] / full_width, image.size[1] / full_height
        box = (
            round(left * scale_x),
            round(top * scale_y),
            max(round((left + width) * scale_x), round(left * scale_x) + 1),
            max(round((top + height) * scale_y), round(top * scale_y) + 1),
        )
        crop = image.crop(box)
    if crop.mode != "RGB":
        crop = crop.convert("RGB")
    # torch's antialiased bilinear resize of uint8 channels-last images (the one torchvision's v2
    # transforms use) is twice as fast as Pillow's, and its pixels differ by a grey level or two.
    pixels = _pixels(crop).permute(2, 0, 1).unsqueeze(0)
    resized = functional.interpolate(pixels, size=(size, size), mode="bilinear", antialias=True)[0]
    times.mark("crop_resize")
    if rng.random() < augmentation.flip_probability:
        resized = resized.flip(-1)
    times.mark("flip")
    return resized


EXIF_ORIENTATION = 0x0112  # 1: as stored; 2-8: mirrored and/or turned
TURNED = {5, 6, 7, 8}  # the orientations that swap width and height


def _pixels(image: Image.Image) -> torch.Tensor:
    """H x W x 3 uint8 view of an RGB image's pixels."""
    with warnings.catch_warnings():
        # Pillow hands the pixels over as read-only bytes; they are only read here.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(np.asarray(image))


def random_resized_crop(
    width: int, height: int, augmentation: Augmentation, rng: random.Random
) -> tuple[int, int, int, int]:
    """A crop box (left, top, width, height) as torchvision's RandomResizedCrop draws it.

    Up to `crop_attempts` draws of an area share and a log-uniform aspect ratio; if none fits,
    the largest center crop whose aspect ratio is within range.
    """
    area = width * height
    low_ratio, high_ratio = augmentation.crop_aspect_ratio
    log_low, log_high = math.log(low_ratio), math.log(high_ratio)
    for _ in range(augmentation.crop_attempts):
        target_area = area * rng.uniform(*augmentation.crop_area)
        aspect = math.exp(rng.uniform(log_low, log_high))
        crop_width = round(math.sqrt(target_area * aspect))
        crop_height = round(math.sqrt(target_area / aspect))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            left = rng.randint(0, width - crop_width)
            top = rng.randint(0, height - crop_height)
            return left, top, crop_width, crop_height
    ratio = width / height
    if ratio < low_ratio:
        crop_width, crop_height = width, round(width / low_ratio)
    elif ratio > high_ratio:
        crop_width, crop_height = round(height * high_ratio), height
    else:
        crop_width, crop_height = width, height
    return (width - crop_width) // 2, (height - crop_height) // 2, crop_width, crop_height


class _Collate:
    """Stacks a worker's samples into one batch (in shared memory when in a worker), and adds up
    its stages' CPU time: the samples', its own (collate), and in a worker what else the
    worker's process spent since its last batch (worker_rest: handing the last batch over,
    its loop, threads a dataset started); and in a worker, how long its thread was busy on the
    batch, its waits for a core left out (at least its stages' CPU time)."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.image_size = spec.image_size
        self.float_output = spec.output_dtype is OutputDtype.FLOAT32
        self.normalize = Normalizer(spec.augmentation, torch.device("cpu"))

    def __call__(self, samples: list[_Sample]) -> _WorkerBatch:
        collating, collating_wall = time.thread_time_ns(), time.monotonic_ns()
        pixels = [image for image, _, error, _ in samples if image is not None and error is None]
        labels = tuple(label for image, label, _, _ in samples if image is not None)
        failures = tuple(error for _, _, error, _ in samples if error is not None)
        if pixels:
            images = default_collate(pixels)
        else:
            images = torch.empty((0, 3, self.image_size, self.image_size), dtype=torch.uint8)
        if self.float_output:
            images = self.normalize(images)
        stages = [sum(sample[3][i] for sample in samples) for i in range(4)]
        collate = time.thread_time_ns() - collating
        rest = serial = 0
        if get_worker_info() is not None:
            now, queued = time.process_time_ns(), _runqueue_wait_ns()
            rest = max(0, now - _WORKER_CLOCK[0] - sum(stages) - collate)
            busy = sum(sample[3][4] for sample in samples) + time.monotonic_ns() - collating_wall
            waited = queued - _WORKER_CLOCK[1] if queued is not None else busy
            serial = max(sum(stages) + collate, busy - waited)
            _WORKER_CLOCK[:] = [now, queued or 0]
        return images, labels, failures, (*stages, collate, rest, serial)


# A worker's process CPU time and its thread's wait for a core when its last batch was collated
# (when it started, at first).
_WORKER_CLOCK = [0, 0]


def _runqueue_wait_ns() -> int | None:
    """How long this thread has waited for a core, runnable, since it started (Linux's
    schedstat); None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as file:
            return int(file.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def _quiet_about_worker_count() -> Iterator[None]:
    """More workers than cores is a setting to measure here (sweeps go past the cores on
    purpose), not one to warn about: the diagnosis says what it costs."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="This DataLoader will create", category=UserWarning
        )
        yield


def _start_method(asked: str | None) -> str:
    """The start method asked for, else the one a fresh Python process would use.

    Not the calling process's own default: a process that was itself spawned (a probe lane)
    defaults to spawn, and its workers would then start and stop unlike a training script's.
    """
    return asked or multiprocessing.get_all_start_methods()[0]


def _die_tidily(signum: int, _: Any) -> None:
    """A worker's SIGTERM (a launcher stopping the job sends it to the whole process group):
    the worker dies of it as it would, its temporary folder removed first (multiprocessing's,
    where it serves the tensors it hands over), which dying of the signal itself leaves."""
    shutil.rmtree(multiprocessing.util.get_temp_dir(), ignore_errors=True)
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


class _WorkerInit:
    """Each worker's `worker_init_fn`: seeds its augmentation and notes when it was ready, in
    memory shared with the main process (which reads the time its first batch's worker was
    ready: the end of the loader's start, the start of the prefetch's refill)."""

    def __init__(self, context: Any, workers: int) -> None:
        self._ready = context.RawArray("q", max(1, workers))

    def __call__(self, worker_id: int) -> None:
        info = get_worker_info()
        if info is not None and isinstance(info.dataset, ShardDataset):
            # the loader draws each worker's seed from its generator, seeded with spec.seed
            info.dataset.rng = random.Random(info.seed)
        # its start is not its batches' cost
        _WORKER_CLOCK[:] = [time.process_time_ns(), _runqueue_wait_ns() or 0]
        signal.signal(signal.SIGTERM, _die_tidily)
        self._ready[worker_id] = time.monotonic_ns()

    def ready_ns(self, started_ns: int, iterated_ns: int) -> int:
        """When the first batch's worker (worker 0) was ready for a reading that `iter()`
        started at `started_ns` and returned from at `iterated_ns`: when it had started, if it
        started for this reading; else when `iter()` returned (persistent workers, which it
        tells to resume and waits for, or no workers at all)."""
        ready = int(self._ready[0])
        return ready if ready >= started_ns else iterated_ns
