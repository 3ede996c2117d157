"""A DDP training script as users write one: torchvision's ImageFolder and the standard training
chain, a DistributedSampler, a torchvision ResNet in bf16, one process a GPU under torchrun (nccl;
gloo on the CPU). After each epoch it sums, across the ranks, the images every rank got and their
labels, and rank 0 prints them beside the dataset's own: a loader put in the place of its
DataLoader is checked for its shards. It knows nothing of feedscope.

    torchrun --nproc-per-node=2 ddp_train.py DATA [--epochs 3] [-b 64] [-j 4] [-a resnet50]

DATA holds train/ (a folder per class). The DataLoader is made in one line, `train_loader = `,
which tests/benchmarks/shared_node_gpu.sh replaces with a written module's `loader()`.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torchvision
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data.distributed import DistributedSampler
from torchvision import datasets, transforms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("-b", "--batch-size", type=int, default=64)
    parser.add_argument("-j", "--workers", type=int, default=4)
    parser.add_argument("-a", "--arch", default="resnet50")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, local = dist.get_rank(), int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    train_dataset = datasets.ImageFolder(
        os.path.join(args.data, "train"),
        transforms.Compose(
            [
                transforms.RandomResizedCrop(224),
                transforms.RandomHorizontalFlip(),
                transforms.ToTensor(),
                transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
            ]
        ),
    )
    train_sampler: DistributedSampler[Any] = DistributedSampler(train_dataset)
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers, pin_memory=True)  # noqa: E501  # fmt: skip
    model = torchvision.models.get_model(args.arch).to(device)
    model = DistributedDataParallel(model, device_ids=[local] if cuda else None)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    expected = (len(train_dataset), sum(label for _, label in train_dataset.samples))
    for epoch in range(args.epochs):
        train_sampler.set_epoch(epoch)
        seen = torch.zeros(2, dtype=torch.float64, device=device)
        started = time.monotonic()
        for batch, targets in train_loader:
            images = batch.to(device, non_blocking=True)
            labels = targets.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
                loss = criterion(model(images), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen[0] += labels.numel()
            seen[1] += labels.sum()
        dist.all_reduce(seen)
        if rank == 0:
            count, total = int(seen[0].item()), int(seen[1].item())
            rate = count / (time.monotonic() - started)
            print(
                f"epoch {epoch}: {count} images (the dataset's {expected[0]}), labels' sum "
                f"{total} ({expected[1]}), {rate:.0f} images/s",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
