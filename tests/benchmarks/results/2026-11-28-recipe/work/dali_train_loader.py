"""A DALI loader in place of a torch DataLoader.

It replaces the DataLoader of run 20261128-073710-345f of original.
Written by feedscope (`probe migrate`); it needs torch and nvidia-dali only. It gives what the
DataLoader gave: (images, labels) batches, one epoch per `for`, of this rank's share of the
dataset; images NCHW on the device, through the job's transform as DALI operators, labels int64.
The transform: RandomResizedCrop, RandomHorizontalFlip, ToTensor, Normalize.

    train_loader = loader()  # on torch.cuda.current_device(); the CPU without CUDA
    for epoch in range(epochs):
        train_loader.set_epoch(epoch)  # accepted; DALI's reader reshuffles by itself
        for images, labels in train_loader:
            ...
"""

from __future__ import annotations

import os
import random

import torch
from nvidia.dali import fn, pipeline_def, types
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

# ImageFolder: listed again as torchvision lists it (make_dataset)
ROOT = '/tmp/cam/train'
CLASS_TO_IDX = {
    'class_00': 0,
    'class_01': 1,
    'class_02': 2,
    'class_03': 3,
    'class_04': 4,
    'class_05': 5,
    'class_06': 6,
    'class_07': 7,
}
EXTENSIONS = ('.jpg', '.jpeg', '.png', '.ppm', '.bmp', '.pgm', '.tif', '.tiff', '.webp')
COUNT = 600  # the files the job's dataset held
SUBSET = None  # a torch Subset's indices: none


def samples() -> list[tuple[str, int]]:
    """The (path, label) pairs, in the order torchvision's ImageFolder lists them."""
    found = []
    for name in sorted(CLASS_TO_IDX):
        folder = os.path.join(ROOT, name)
        if not os.path.isdir(folder):
            continue
        for parent, _, names in sorted(os.walk(folder, followlinks=True)):
            for file_name in sorted(names):
                if file_name.lower().endswith(EXTENSIONS):
                    found.append((os.path.join(parent, file_name), CLASS_TO_IDX[name]))
    if COUNT is not None and len(found) != COUNT:
        raise RuntimeError(
            f"{ROOT} lists {len(found)} files where the job's dataset held {COUNT}: its files "
            "changed, or the dataset chose them otherwise; write this module again"
        )
    return found if SUBSET is None else [found[i] for i in SUBSET]


BATCH_SIZE = 16
SHUFFLE = True
DROP_LAST = False
SHUFFLE_SEED = 0  # the same on every rank, so that the shards stay apart
# every rank reads every file, as the DataLoader did (it had no DistributedSampler)
SHARD = False
# The DALI setting: doctor session doctor-20261128-073737-2bb7, measured like this run: 156 images/s per GPU
NUM_THREADS = 2
HW_DECODER_LOAD = 0.65  # the share of JPEGs for the hardware decoder
DECODER = "cpu"  # on a GPU; on the CPU, libjpeg-turbo ("cpu")
READER = "Reader"


@pipeline_def
def _pipeline(files, labels, shard_id, num_shards, order_seed, decoder, on_gpu):
    encoded, labels = fn.readers.file(
        files=files,
        labels=labels,
        shard_id=shard_id,
        num_shards=num_shards,
        # a torch RandomSampler draws a new order of the whole dataset every epoch: so does
        # shuffle_after_epoch (random_shuffle only shuffles within a buffer), with one seed on
        # every rank; it moves each rank to another shard of the new order every epoch
        shuffle_after_epoch=SHUFFLE,
        shuffle_after_epoch_seed=order_seed if SHUFFLE else None,
        stick_to_shard=not SHUFFLE,
        # every rank reads as many batches (torch DDP needs it); the padding is not returned
        pad_last_batch=True,
        name=READER,
    )
    decoder_options = {"hw_decoder_load": HW_DECODER_LOAD} if decoder == "mixed" else {}
    # the decoder decodes only the crop (RandomResizedCrop's area and ratio), as
    # DALI's ResNet-50 example does; the mixed one on nvJPEG and the hardware decoder
    images = fn.decoders.image_random_crop(
        encoded,
        device=decoder,
        output_type=types.RGB,
        random_area=[0.08, 1.0],
        random_aspect_ratio=[0.75, 1.333333333],
        num_attempts=10,
        **decoder_options,
    )
    images = fn.resize(
        images,
        resize_x=224,
        resize_y=224,
        interp_type=types.INTERP_LINEAR,
        antialias=True,
    )
    if on_gpu and decoder == "cpu":
        images = images.gpu()  # after the CPU's resize: the smallest copy
    images = fn.crop_mirror_normalize(
        images,
        dtype=types.FLOAT,
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        output_layout="CHW",
        mirror=fn.random.coin_flip(probability=0.5),
    )
    return images, labels.gpu() if on_gpu else labels


class Shard:
    """This rank's share of the files, as a DistributedSampler's len() gives it."""

    def __init__(self, files, world):
        self.files, self.world = files, world

    def __len__(self):
        return -(-self.files // self.world)

    def set_epoch(self, epoch):
        """Accepted; DALI's reader reshuffles after each epoch."""


class Loader:
    """The batches of one rank's shard: (images, labels), one epoch per `for`; `dataset` the
    (path, label) pairs and `sampler` this rank's share, as a script may ask of a DataLoader."""

    def __init__(self, pipeline, drop_last, pairs, world):
        self.batch_size = BATCH_SIZE
        self.dataset = pairs
        self.sampler = Shard(len(pairs), world)
        self._batches = DALIGenericIterator(
            [pipeline],
            ["images", "labels"],
            reader_name=READER,
            # an epoch's last batch: short (as the DataLoader's), or left out with drop_last
            last_batch_policy=LastBatchPolicy.DROP if drop_last else LastBatchPolicy.PARTIAL,
            auto_reset=True,
        )

    def __len__(self):
        return len(self._batches)

    def __iter__(self):
        for outputs in self._batches:
            yield outputs[0]["images"], outputs[0]["labels"].view(-1).long()

    def set_epoch(self, epoch):
        """Accepted as DistributedSampler's is; DALI's reader reshuffles after each epoch."""


def loader(device=None, seed=None, rank=None, world=None):
    """The DALI loader on `device` (a CUDA index or torch.device; default: the current CUDA
    device, or the CPU without CUDA), reading shard `rank` of `world` (default: this process's
    torch.distributed rank and world size, else 0 of 1). `seed` seeds the file order and the
    random augmentations (default: SHUFFLE_SEED for the order, a random one for the rest)."""
    if device is None:
        device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    on_gpu = device.type == "cuda"
    if on_gpu and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if rank is None or world is None:
        distributed = SHARD and torch.distributed.is_available()
        distributed = distributed and torch.distributed.is_initialized()
        rank = torch.distributed.get_rank() if distributed else 0
        world = torch.distributed.get_worldsize_of() if distributed else 1
    order_seed = SHUFFLE_SEED if seed is None else seed
    pairs = samples()
    if SHUFFLE:
        # DALI's reader reshuffles after each epoch: this shuffles the first one
        random.Random(order_seed).shuffle(pairs)
    pipeline = _pipeline(
        files=[path for path, _ in pairs],
        labels=[label for _, label in pairs],
        shard_id=rank,
        num_shards=world,
        order_seed=order_seed,
        decoder=DECODER if on_gpu else "cpu",
        on_gpu=on_gpu,
        batch_size=BATCH_SIZE,
        num_threads=NUM_THREADS,
        # None: a CPU-only pipeline
        device_id=device.index if on_gpu else None,
        seed=None if seed is None else seed + rank,
    )
    return Loader(pipeline, DROP_LAST, pairs, world)
