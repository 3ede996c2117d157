#!/usr/bin/env bash
# A user's own job judged on one GPU (a stage a call; the output in OUT/STAGE.log, the store in
# OUT/feedscope.db): `bash tests/benchmarks/watch_cases.sh STAGE OUT`
#   data      3,072 camera-sized JPEGs (about 700 KB) in /tmp/data/train, 256 in /tmp/data/val
#   watchW    pytorch/examples' ImageNet script (ResNet-18, batch 128, 8 epochs, a validation
#             pass and a checkpoint after each), unchanged, with W workers, under
#             `probe watch --`, held to 16 cores; its script at .outside/imagenet_main.py
#   like      `probe doctor --like` the newest watched job, then a 60 s `probe run` of the DALI
#             setting it found best (tests/benchmarks/like_check.py)
#   long      its own data (1,536 camera-sized JPEGs, each linked 16 times: 24,576 files, 192
#             batches an epoch), then the script as in watch16 for 2 epochs: epochs long enough
#             that the CPU, not the epoch ends, sets its rate
set -euo pipefail
stage="$1"; out="$2"
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../.." && pwd)"
export FEEDSCOPE_DB="$out/feedscope.db" PYTHONUNBUFFERED=1
mkdir -p "$out"
camera=(--width 1600-2000 --height 1200-1500)
case "$stage" in
  data)
    python3 -m probe data make /tmp/data/train --count 3072 "${camera[@]}" --seed 1
    python3 -m probe data make /tmp/data/val --count 256 "${camera[@]}" --seed 2
    du -sh /tmp/data ;;
  watch*)
    workers="${stage#watch}"
    mkdir -p /tmp/work && cd /tmp/work  # the script writes its checkpoints here
    taskset -c 0-15 python3 -m probe watch -- python3 "$root/.outside/imagenet_main.py" \
      /tmp/data -a resnet18 -j "$workers" -b 128 --epochs 8 --gpu 0 -p 100
    python3 -m probe runs --limit 4 ;;
  long)
    python3 -m probe data make /tmp/long/base --count 1536 "${camera[@]}" --seed 1
    python3 - <<'LINKS'
from pathlib import Path
for folder in sorted(Path("/tmp/long/base").iterdir()):
    train, val = Path("/tmp/long/train", folder.name), Path("/tmp/long/val", folder.name)
    train.mkdir(parents=True), val.mkdir(parents=True)
    for n, file in enumerate(sorted(folder.glob("*.jpg"))):
        for k in range(16):
            (train / f"{k}-{file.name}").symlink_to(file)
        if n < 32:
            (val / file.name).symlink_to(file)
LINKS
    mkdir -p /tmp/work && cd /tmp/work
    taskset -c 0-15 python3 -m probe watch -- python3 "$root/.outside/imagenet_main.py" \
      /tmp/long -a resnet18 -j 16 -b 128 --epochs 2 --gpu 0 -p 100
    python3 -m probe runs --limit 4 ;;
  like)
    taskset -c 0-15 python3 "$here/like_check.py" --out "$out/like" --long-s 60 ;;
  *) echo "usage: watch_cases.sh data|watchW|like|long OUT" >&2; exit 2 ;;
esac
