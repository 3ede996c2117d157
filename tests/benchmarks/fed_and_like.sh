#!/usr/bin/env bash
# A fed job told so, and `probe doctor --like last` copying it, on one GPU (one call; the output
# under OUT, the store in OUT/feedscope.db): `bash tests/benchmarks/fed_and_like.sh OUT`
#   data    12,800 JPEGs of the sample data's size (300-640 px a side) in /tmp/fed/train, 512 in
#           /tmp/fed/val
#   watch   pytorch/examples' ImageNet script (ResNet-50, batch 128, 12 workers, 2 epochs of 100
#           batches, a validation pass after each), unchanged, under `probe watch --`, held to 12
#           cores (`taskset -c 0-11`); its script at .outside/imagenet_main.py
#   like    `probe doctor --like last`: the training loader, on GPU 0 and cores 0-11
set -euo pipefail
out="$1"
root="$(cd "$(dirname "$0")/../.." && pwd)"
export FEEDSCOPE_DB="$out/feedscope.db" PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out" /tmp/work
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/card.txt" || true
nproc > "$out/cores.txt"
if [ ! -d /tmp/fed/val ]; then  # made by an earlier call on the same machine: kept
  python3 -m probe data make /tmp/fed/train --count 12800 --seed 1 > "$out/data.log" 2>&1
  python3 -m probe data make /tmp/fed/val --count 512 --seed 2 >> "$out/data.log" 2>&1
fi
cd /tmp/work  # the script writes its checkpoints here
taskset -c 0-11 python3 -m probe watch -- python3 "$root/.outside/imagenet_main.py" /tmp/fed \
  -a resnet50 -j 12 -b 128 --epochs 2 --gpu 0 -p 50 > "$out/watch.log" 2>&1 || echo "watch rc $?" >> "$out/watch.log"
python3 -m probe show last > "$out/show.txt" 2>&1 || true
python3 -m probe doctor --like last --budget 120 --json > "$out/doctor.json" 2> "$out/doctor.log" \
  || echo "doctor rc $?" >> "$out/doctor.log"
python3 -m probe runs --limit 12 > "$out/runs.txt" 2>&1 || true
