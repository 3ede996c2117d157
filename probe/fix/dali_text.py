"""The text of the DALI module `probe.fix.dali` writes: how it lists its samples, and the
module around them."""

FOLDER_SAMPLES = '''

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
'''

LIST_SAMPLES = '''

def samples() -> list[tuple[str, int]]:
    """The (path, label) pairs, in the dataset's order."""
    return SAMPLES if SUBSET is None else [SAMPLES[i] for i in SUBSET]
'''

FILE_SAMPLES = '''

def samples() -> list[tuple[str, int]]:
    """The (path, label) pairs, in the dataset's order."""
    with open(SAMPLES_FILE, encoding="utf-8") as lines:
        rows = [line.rstrip("\\n").split("\\t", 1) for line in lines]
    found = [(path, int(label)) for label, path in rows]
    return found if SUBSET is None else [found[i] for i in SUBSET]
'''

TEMPLATE = '''"""A DALI loader in place of a torch DataLoader.

It replaces the DataLoader of {origin}.
Written by feedscope (`probe migrate`); it needs torch and nvidia-dali only. It gives what the
DataLoader gave: (images, labels) batches, one epoch per `for`, of this rank's share of the
dataset; images NCHW on the device, through the job's transform as DALI operators, labels int64.
The transform: {steps}.
Sharded by rank, every rank reads as many files an epoch, as a DistributedSampler gives them: the
first files of the order are read again where the files do not divide by the ranks.

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

{dataset}


BATCH_SIZE = {batch_size}
SHUFFLE = {shuffle}
DROP_LAST = {drop_last}
SHUFFLE_SEED = {shuffle_seed}  # the same on every rank, so that the shards stay apart
# {shard_comment}
SHARD = {shard}
# The DALI setting: {source}
NUM_THREADS = {num_threads}
HW_DECODER_LOAD = {hw_decoder_load!r}  # the share of JPEGs for the hardware decoder
DECODER = "{decoder}"  # on a GPU; on the CPU, libjpeg-turbo ("cpu")
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
        # the last batch padded within the shard, and the padding not returned
        pad_last_batch=True,
        name=READER,
    )
    decoder_options = {{"hw_decoder_load": HW_DECODER_LOAD}} if decoder == "mixed" else {{}}
{graph}
    return images, labels.gpu() if on_gpu else labels


class Shard:
    """This rank's share of the files, as a DistributedSampler's len() gives it: every rank's
    is as long."""

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


def _padded(pairs, world):
    """The pairs, then their first ones again until they divide by `world`, as a
    DistributedSampler pads: every rank reads as many files and batches (DDP's all-reduce needs
    it). DALI's own shards differ by a file: a rank whose shard ends on a batch's end would get an
    empty last batch, and with drop_last the next epoch would start on the padding."""
    total = -(-len(pairs) // world) * world
    return [pairs[index % len(pairs)] for index in range(total)]


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
        world = torch.distributed.get_world_size() if distributed else 1
    order_seed = SHUFFLE_SEED if seed is None else seed
    pairs = samples()
    if SHUFFLE:
        # the same order on every rank, whose first files pad the shards (DALI's reader then
        # draws every epoch's order from the seed)
        random.Random(order_seed).shuffle(pairs)
    read = _padded(pairs, world)
    pipeline = _pipeline(
        files=[path for path, _ in read],
        labels=[label for _, label in read],
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
'''
