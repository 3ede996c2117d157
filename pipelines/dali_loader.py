"""The NVIDIA DALI backend: file reader, image decoder with random crop, resize, normalize.

`readers.file` (sharded by DALI, named) -> `decoders.image_random_crop` (`mixed`: nvJPEG and the
hardware JPEG decoder on a GPU; `cpu`: libjpeg-turbo) -> `resize` -> `crop_mirror_normalize`
(CHW, float32, random mirror), exposed through `DALIGenericIterator` with `reader_name`. The
reader gets the same file list, in the same order, as the DataLoader backend and no shuffling of
its own (its `random_shuffle` re-orders the list before sharding, with a fixed internal seed), so
both backends read the same files for a shard. Read epoch by epoch, an epoch's last batch may be
partial; read as a stream, the reader wraps around the shard with no epoch end and every batch
is full, as the DataLoader's stream (`EndlessBatches`) is. DALI is imported here and nowhere
else.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from PIL import Image

from pipelines.dataset import Dataset, shard
from pipelines.errors import DALI_INSTALL_HINT, BackendUnavailable, CorruptImageError, InputError
from pipelines.loader import NOTHING_TO_READ, Batch, InputPipeline, ReadStart
from pipelines.spec import Backend, Decoder, PipelineSpec

try:
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
except ImportError as error:  # an extra: only this backend is unavailable without it
    raise BackendUnavailable(DALI_INSTALL_HINT) from error

READER_NAME = "Reader"
# Scratch buffers sized for ImageNet, as in DALI's ResNet-50 example: no reallocation mid-run.
DEVICE_MEMORY_PADDING = 211_025_920
HOST_MEMORY_PADDING = 140_544_512
_DECODE_FAILURE = re.compile(r"Failed to decode sample #\d+ : (.+)$", re.MULTILINE)
_DATA_FAILURES = ("fn.decoders.", "fn.readers.file", "Failed to decode")


class DaliPipeline(InputPipeline):
    """A DALI pipeline over one shard, yielding normalized float32 batches on the device."""

    backend: ClassVar[Backend] = Backend.DALI

    def __init__(self, spec: PipelineSpec, dataset: Dataset) -> None:
        super().__init__(spec, dataset)
        self._batches_read = 0  # in the current epoch: where a failure happened
        self._streaming = False  # whether `_iterator` reads the stream, or epochs
        self._iterator: Any = None  # built when reading starts: for epochs or for the stream
        self._built: list[Any] = []  # DALI pipelines not shut down yet (the iterator's)

    def __iter__(self) -> Iterator[Batch]:
        # DALI's reader goes on past an epoch's end and its pipeline keeps decoding ahead: an
        # epoch starts with nothing to start or refill.
        yield from self._read(stream=False)

    def stream(self) -> Iterator[Batch]:
        """Full batches without end: the reader wraps around the shard (a batch may hold the end
        of one pass and the start of the next), one start of reading, no epoch end."""
        yield from self._read(stream=True)

    def _read(self, stream: bool) -> Iterator[Batch]:
        if self._iterator is None or stream != self._streaming:
            self._release()  # another way of reading's buffers go before these come
            self._iterator, self._streaming = self._start(stream), stream
        started_ns = time.monotonic_ns()
        while True:
            self._batches_read = 0
            try:
                for outputs in self._iterator:
                    if self._batches_read == 0 and (
                        not self.starts or self.starts[-1].started_ns != started_ns
                    ):
                        self.starts.append(ReadStart(started_ns, started_ns))
                    self._batches_read += 1
                    images, labels = outputs[0]["images"], outputs[0]["labels"]
                    yield Batch(images, labels.view(-1).long())
                return
            except RuntimeError as error:
                self._release()  # DALI's pipeline is dead after a decode error
                self._skip_or_raise(error)
                # Build one without the file: the shard's epoch starts over, and shard bounds
                # move by the files skipped.
                self._iterator = self._start(stream)

    def close(self) -> None:
        self._release()

    def _release(self) -> None:
        """Shuts the DALI pipelines built so far down now, their threads joined.

        Not left to the garbage collector: a failure's traceback can keep a pipeline in a
        reference cycle, and the collector may meet it first in a process forked from this one
        (a DataLoader worker), which has none of its threads; its shutdown there waits for them
        forever.
        """
        self._iterator = None
        for pipeline in self._built:
            pipeline._shutdown()  # what DALI's own exit hook calls; it has no public one
        self._built.clear()

    def _start(self, stream: bool = False) -> Any:
        """Builds the DALI pipeline and its iterator, which starts decoding at once:
        epoch by epoch (the reader names the epoch's size; its last batch partial), or as a
        stream (no size: the reader wraps around, and the iterator never ends)."""
        while True:
            try:
                if stream:
                    return DALIGenericIterator(self._build(stream), ["images", "labels"])
                return DALIGenericIterator(
                    self._build(stream),
                    ["images", "labels"],
                    reader_name=READER_NAME,
                    last_batch_policy=LastBatchPolicy.PARTIAL,
                    auto_reset=True,
                )
            except RuntimeError as error:
                self._release()
                self._batches_read = 0
                self._skip_or_raise(error)

    def _skip_or_raise(self, error: RuntimeError) -> None:
        """Names the undecodable file behind a DALI failure, or records it as skipped."""
        culprits = self._undecodable_files(str(error))
        if not culprits:
            raise error
        if not self.spec.skip_corrupt:
            raise CorruptImageError(culprits[0], _unreadable_reason(culprits[0])) from None
        new = [path for path in culprits if path not in self.skipped_files]
        if not new:
            raise error
        self.skipped_files.extend(new)

    def _undecodable_files(self, message: str) -> list[str]:
        """The files behind a reader or decoder failure.

        DALI names the file when libjpeg-turbo fails mid-stream, but not when a header cannot be
        parsed or a file is empty. Then the culprit is among the batches in flight: the ones after
        those read so far, up to the prefetch depth. Those files are decoded with Pillow.
        """
        if not any(marker in message for marker in _DATA_FAILURES):
            return []
        named = _DECODE_FAILURE.search(message)
        if named is not None:
            return [named.group(1).strip()]
        files = shard(self._readable(), self.spec.shard_id, self.spec.num_shards).files
        batch = self.spec.batch_size
        start = self._batches_read * batch
        window = min(len(files), (self.spec.dali.prefetch_queue_depth + 2) * batch)
        candidates = [files[(start + i) % len(files)] for i in range(window)]
        return [path for path in candidates if not _decodable(path)]

    def _readable(self) -> Dataset:
        """The dataset less the files skipped: what DALI's reader gets (and shards)."""
        skipped = set(self.skipped_files)
        kept = [
            (path, label)
            for path, label in zip(self.dataset.files, self.dataset.labels, strict=True)
            if path not in skipped
        ]
        return Dataset(
            root=self.dataset.root,
            classes=self.dataset.classes,
            files=tuple(path for path, _ in kept),
            labels=tuple(label for _, label in kept),
        )

    def _build(self, stream: bool) -> Any:
        spec, augmentation = self.spec, self.spec.augmentation
        readable = self._readable()
        if not shard(readable, spec.shard_id, spec.num_shards).files:
            raise InputError(NOTHING_TO_READ)
        decoder = spec.dali_decoder
        decoder_options: dict[str, Any] = {}
        if decoder is Decoder.MIXED:
            decoder_options = {
                "hw_decoder_load": spec.dali.hw_decoder_load,
                "device_memory_padding": DEVICE_MEMORY_PADDING,
                "host_memory_padding": HOST_MEMORY_PADDING,
            }
        on_gpu = spec.device is not None

        @pipeline_def(  # type: ignore[untyped-decorator]
            batch_size=spec.batch_size,
            num_threads=spec.dali.num_threads,
            device_id=spec.device,
            seed=spec.seed,
            prefetch_queue_depth=spec.dali.prefetch_queue_depth,
        )
        def graph() -> tuple[Any, Any]:
            encoded, labels = fn.readers.file(
                files=list(readable.files),
                labels=list(readable.labels),
                shard_id=spec.shard_id,
                num_shards=spec.num_shards,
                random_shuffle=False,
                stick_to_shard=True,
                # epochs: with PARTIAL, they end exactly at the shard's end; a stream: wraps
                pad_last_batch=not stream,
                name=READER_NAME,
            )
            images: Any = fn.decoders.image_random_crop(
                encoded,
                device=decoder.value,
                output_type=types.RGB,
                random_area=list(augmentation.crop_area),
                random_aspect_ratio=list(augmentation.crop_aspect_ratio),
                num_attempts=augmentation.crop_attempts,
                **decoder_options,
            )
            images = fn.resize(
                images,
                resize_x=spec.image_size,
                resize_y=spec.image_size,
                interp_type=types.INTERP_LINEAR,
                antialias=True,
            )
            if on_gpu and decoder is Decoder.CPU:
                images = (
                    images.gpu()
                )  # resized on the CPU: the smallest copy; normalized on the GPU
            images = fn.crop_mirror_normalize(
                images,
                dtype=types.FLOAT,
                output_layout="CHW",
                mean=[m * 255 for m in augmentation.mean],
                std=[s * 255 for s in augmentation.std],
                mirror=fn.random.coin_flip(probability=augmentation.flip_probability),
            )
            return images, labels.gpu() if on_gpu else labels

        pipeline = graph()
        self._built.append(pipeline)
        return pipeline


def _decodable(path: str) -> bool:
    try:
        with Image.open(path) as image:
            image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return False
    return True


def _unreadable_reason(path: str) -> str:
    """Why DALI could not use a file: it cannot be opened (permissions), or not decoded."""
    try:
        with open(path, "rb"):
            pass
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror}"
    return "DALI could not read or decode it"


def iterator_class() -> type:
    """The base class of DALI's framework iterators (`DALIGenericIterator` and its kind), whose
    `__iter__` `probe watch` wraps."""
    from nvidia.dali.plugin.base_iterator import _DaliBaseIterator

    base: type = _DaliBaseIterator
    return base
