#!/usr/bin/env bash
# The first answer and a watched job's what-if on one GPU, as a newcomer meets them there, in
# steps of one device call each, back to back on one machine (the store /tmp/fa/feedscope.db,
# kept there from step to step, copied to OUT/feedscope.db after each):
#   bash tests/benchmarks/first_answer_gpu.sh OUT data|doctor1|doctor2|watch
#   data      12,800 JPEGs of the sample data's size (300-640 px a side) in /tmp/fa/train, 512 in
#             /tmp/fa/val
#   doctorN   `probe doctor --data /tmp/fa/train`, all else default (every core, the GPU), then
#             `probe show last --json`
#   watch     pytorch/examples' ImageNet script (ResNet-50, batch 128, 4 workers, 2 epochs of 100
#             batches, a validation pass after each), unchanged, under `probe watch --`, held to 8
#             cores (`taskset -c 0-7`: room for more workers); then `probe show RUN`, `probe
#             doctor --like RUN` and `probe show RUN` again (text and JSON). Its script at
#             .outside/imagenet_main.py
set -euo pipefail
out="$1" step="$2"
root="$(cd "$(dirname "$0")/../.." && pwd)"
export FEEDSCOPE_DB=/tmp/fa/feedscope.db PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out" /tmp/work /tmp/fa
trap '[ -f "$FEEDSCOPE_DB" ] && cp "$FEEDSCOPE_DB" "$out/feedscope.db"' EXIT
case "$step" in
data)
  git -C "$root" rev-parse --short HEAD > "$out/commit.txt" 2>/dev/null || true
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$out/card.txt" || true
  nproc > "$out/cores.txt"
  python3 -m probe data make /tmp/fa/train --count 12800 --seed 1 > "$out/data.log" 2>&1
  python3 -m probe data make /tmp/fa/val --count 512 --seed 2 >> "$out/data.log" 2>&1
  ;;
doctor1 | doctor2)
  python3 -m probe doctor --data /tmp/fa/train > "$out/$step.txt" 2>&1 || echo "doctor rc $?" >> "$out/$step.txt"
  python3 -m probe show last --json > "$out/$step.json" 2>> "$out/$step.txt" || true
  ;;
watch)
  (cd /tmp/work && taskset -c 0-7 python3 -m probe watch --name watched -- python3 \
    "$root/.outside/imagenet_main.py" /tmp/fa -a resnet50 -j 4 -b 128 --epochs 2 --gpu 0 -p 50) \
    > "$out/watch.txt" 2>&1 || echo "watch rc $?" >> "$out/watch.txt"
  run="$(python3 -m probe runs --json | python3 -c 'import json,sys; print([r["run_id"] for r in json.load(sys.stdin) if r.get("label") == "watched"][0])')"
  echo "$run" > "$out/watched-run.txt"
  python3 -m probe show "$run" > "$out/show-before-like.txt" 2>&1 || true
  python3 -m probe doctor --like "$run" > "$out/like.txt" 2>&1 || echo "doctor rc $?" >> "$out/like.txt"
  python3 -m probe show last --json > "$out/like.json" 2>> "$out/like.txt" || true
  python3 -m probe show "$run" > "$out/show-after-like.txt" 2>&1 || true
  python3 -m probe show "$run" --json > "$out/show-after-like.json" 2>&1 || true
  ;;
*)
  echo "first_answer_gpu.sh: unknown step '$step' (data, doctor1, doctor2 or watch)" >&2
  exit 2
  ;;
esac
