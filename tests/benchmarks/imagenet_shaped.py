"""An ImageNet-shaped training script for the CPU machine: torchvision's ImageFolder,
RandomResizedCrop, RandomHorizontalFlip, ToTensor and Normalize (`tests/fake_torchvision.py`: the
same names and fields, computed with PIL as torchvision computes them, since torchvision has no
CPU build there), a DataLoader of 2 workers, and a short step that sleeps (a GPU's step, which
leaves the CPU to the loader).

    python imagenet_shaped.py DATA [--epochs 3] [-b 16] [-j 2] [--step-ms 5]

DATA holds train/ (a folder per class). The DataLoader is made in one line, the line
`probe migrate --to dataloader` names.
"""

from __future__ import annotations

import argparse
import os
import time

import fake_torchvision as tv
import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("-b", "--batch-size", type=int, default=16)
    parser.add_argument("-j", "--workers", type=int, default=2)
    parser.add_argument("--step-ms", type=float, default=5.0)
    args = parser.parse_args()
    train_dataset = tv.ImageFolder(
        os.path.join(args.data, "train"),
        tv.Compose(
            [
                tv.RandomResizedCrop(224),
                tv.RandomHorizontalFlip(),
                tv.ToTensor(),
                tv.Normalize(tv.MEAN, tv.STD),
            ]
        ),
    )
    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers)  # noqa: E501  # fmt: skip
    for epoch in range(args.epochs):
        started, images = time.monotonic(), 0
        for batch, _labels in train_loader:
            time.sleep(args.step_ms / 1000)  # the step
            images += len(batch)
        print(f"epoch {epoch}: {images / (time.monotonic() - started):.1f} images/s", flush=True)


if __name__ == "__main__":
    main()
