"""A DDP script's loop over written loader modules, run by each rank under torchrun on the CPU:

    python -m torch.distributed.run --standalone --nproc-per-node=2 ranks_read.py OUT MODULE.py...

Each rank joins the job (gloo), makes each module's loader as the line `probe migrate` says to
change does (`loader()`, no arguments: the rank and world from torch.distributed), iterates it
for EPOCHS epochs calling `set_epoch` first, as a DDP script does, and writes OUT/rank{R}.json:
per module, its len(), its sampler's len() and each epoch's batches as the files they hold (the
images are `helpers.code_color` files, normalized by `fake_torchvision`'s MEAN and STD) and
their labels, and the device each batch came on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from fake_torchvision import MEAN, STD

from helpers import decode_codes, imported

EPOCHS = 2


def read(path: Path) -> dict[str, Any]:
    """What one written module's default loader gave this rank."""
    train_loader = imported(path).loader()
    epochs = []
    for epoch in range(EPOCHS):
        train_loader.set_epoch(epoch)
        epochs.append(
            [
                {
                    "files": decode_codes(images, MEAN, STD),
                    "labels": labels.tolist(),
                    "devices": sorted({images.device.type, labels.device.type}),
                }
                for images, labels in train_loader
            ]
        )
    return {"len": len(train_loader), "shard": len(train_loader.sampler), "epochs": epochs}


def main(out: Path, modules: list[Path]) -> None:
    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        document = {
            "world": dist.get_world_size(),
            "cuda": torch.cuda.is_available(),
            "modules": {path.stem: read(path) for path in modules},
        }
        (out / f"rank{rank}.json").write_text(json.dumps(document))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(arg) for arg in sys.argv[2:]])
