"""A training loop as users write it, watched: ResNet-50 fed by a torchvision DataLoader, under
DDP when torchrun starts it. The README's example; `tests/test_probe_gpu.py` runs it.

    torchrun --nproc-per-node=2 tests/watch_resnet50.py --data DIR --workers 16 --db STORE
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torchvision
from torch.nn import functional
from torchvision import transforms

from probe import watch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="class-per-folder images")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--batches", type=int, default=120, help="per rank")
    parser.add_argument("--db", default=None, help="the feedscope store")
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if distributed:
        dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)

    dataset = torchvision.datasets.ImageFolder(
        args.data,
        transforms.Compose(
            [transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
             transforms.PILToTensor()]
        ),
    )  # fmt: skip
    samples = args.batch_size * args.batches
    sampler = torch.utils.data.RandomSampler(dataset, replacement=True, num_samples=samples)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, sampler=sampler, num_workers=args.workers,
        pin_memory=True, drop_last=True, persistent_workers=True,
    )  # fmt: skip
    model = torchvision.models.resnet50().to(device, memory_format=torch.channels_last)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    mean = torch.tensor([0.485, 0.456, 0.406], device=device).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=device).view(1, 3, 1, 1) * 255

    for pixels, labels in watch(loader, name="resnet50-dataloader", db=args.db):
        images = pixels.to(device, non_blocking=True).float().sub_(mean).div_(std)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images.contiguous(memory_format=torch.channels_last))
            loss = functional.cross_entropy(logits, labels.to(device, non_blocking=True))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        loss.item()  # logging the loss: the step ends when the GPU is done with it
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
