"""A training script shaped like pytorch/examples' imagenet/main.py, for the CPU: `DIR/train` and
`DIR/val` in class folders read by ImageFolder through the script's transforms (torchvision's;
where torchvision cannot be imported, `tests/fake_torchvision.py`'s, the same by name and fields,
computed with PIL), a DataLoader for each, `train()` and `validate()` per epoch, and the script's
own meter of the time its loop spent waiting for data (`Data` in its log), which `probe watch`
is checked against. It knows nothing of feedscope.

    python main.py DIR [-j WORKERS] [--epochs N] [-b BATCH] [--lr LR] [-p PRINT_FREQ] [--gpu I]
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.utils.data
from torch import nn

try:
    from torchvision import datasets, transforms
except Exception:  # torchvision has no build for some machines: its transforms by name, in PIL
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    import fake_torchvision as transforms

    datasets = transforms

parser = argparse.ArgumentParser(description="ImageNet-shaped training, on the CPU")
parser.add_argument("data", metavar="DIR", help="path to dataset")
parser.add_argument("-j", "--workers", default=2, type=int, metavar="N")
parser.add_argument("--epochs", default=2, type=int, metavar="N")
parser.add_argument("-b", "--batch-size", default=8, type=int, metavar="N")
parser.add_argument("--lr", "--learning-rate", default=0.05, type=float, metavar="LR")
parser.add_argument("-p", "--print-freq", default=10, type=int, metavar="N")
parser.add_argument("--image-size", default=64, type=int)
parser.add_argument(
    "--gpu", default=None, help="GPU id to use, or local: LOCAL_RANK's (default: the CPU)"
)


class AverageMeter:
    def __init__(self):
        self.val = self.sum = self.count = 0.0

    @property
    def avg(self):
        return self.sum / max(self.count, 1)

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n


def make_model(classes):
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, classes),
    )


def main():
    args = parser.parse_args()
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_dataset = datasets.ImageFolder(
        os.path.join(args.data, "train"),
        transforms.Compose([
            transforms.RandomResizedCrop(args.image_size),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            normalize,
        ]),
    )  # fmt: skip
    val_dataset = datasets.ImageFolder(
        os.path.join(args.data, "val"),
        transforms.Compose([
            transforms.Resize(args.image_size * 8 // 7),
            transforms.CenterCrop(args.image_size),
            transforms.ToTensor(),
            normalize,
        ]),
    )  # fmt: skip
    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=True, num_workers=args.workers
    )
    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False, num_workers=args.workers
    )
    gpu = os.environ.get("LOCAL_RANK", "0") if args.gpu == "local" else args.gpu
    device = torch.device("cpu" if gpu is None else f"cuda:{gpu}")
    if gpu is not None:
        torch.cuda.set_device(device)
    model = make_model(len(train_dataset.classes)).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        data_time = train(train_loader, model, criterion, optimizer, epoch, device, args)
        print(f"Epoch {epoch} data time {data_time:.4f} s")
        validate(val_loader, model, criterion, device, args)


def train(train_loader, model, criterion, optimizer, epoch, device, args):
    data_time, losses = AverageMeter(), AverageMeter()
    model.train()
    end = time.perf_counter()
    for i, (images, target) in enumerate(train_loader):
        data_time.update(time.perf_counter() - end)
        inputs, labels = images.to(device, non_blocking=True), target.to(device, non_blocking=True)
        loss = criterion(model(inputs), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.update(loss.item(), images.size(0))
        if i % args.print_freq == 0:
            print(
                f"Epoch: [{epoch}][{i}/{len(train_loader)}]\tData {data_time.val:.3f} "
                f"({data_time.avg:.3f})\tLoss {losses.val:.4f} ({losses.avg:.4f})"
            )
        end = time.perf_counter()
    return data_time.sum


def validate(val_loader, model, criterion, device, args):
    losses = AverageMeter()
    model.eval()
    with torch.no_grad():
        for images, target in val_loader:
            inputs, labels = images.to(device), target.to(device)
            losses.update(criterion(model(inputs), labels).item(), images.size(0))
    print(f" * Loss {losses.avg:.4f}")
    return losses.avg


if __name__ == "__main__":
    main()
