#!/usr/bin/env bash
# Several GPUs of one host, measured (a stage a call; results under OUT/STAGE, and each call's
# output in OUT/STAGE.log): `bash tests/benchmarks/several_gpus.sh STAGE OUT [GPUS]`
#   data      1,500 camera-sized JPEGs in /tmp/large (the sample data is made by the first probe)
#   ranks     torchrun, a rank per GPU: the DataLoader and DALI mixed on /tmp/large (ResNet-50,
#             20 s measured), and `probe watch` of an ImageNet-shaped script (one run, N lanes)
#   doctor16  `probe doctor --scaling` with the job held to 16 cores (taskset -c 0-15), then a
#             60 s `probe run` of its first recommendation (tests/benchmarks/doctor_check.py)
#   doctorall the same on all the host's cores
#   first     `probe doctor` with no flag (the first visit's command), and 60 s of its answer
# GPUS: the CUDA indices (default 0,1,2,3).
set -euo pipefail
stage="$1"; out="$2"; gpus="${3:-0,1,2,3}"
count=$(( $(tr -cd ',' <<<"$gpus" | wc -c) + 1 ))
here="$(cd "$(dirname "$0")" && pwd)"
export FEEDSCOPE_DB="$out/feedscope.db" PYTHONUNBUFFERED=1
mkdir -p "$out"
check() { python3 "$here/doctor_check.py" --out "$out/$1" --long-s 60 --only-recommended "${@:2}"; }
large=(--data /tmp/large --consumer model:resnet50)
case "$stage" in
  data)
    python3 -m probe data make /tmp/large --count 1500 --width 1600-2000 --height 1200-1500 \
      --seed 1 ;;
  ranks)
    for pipeline in torch dali; do
      torchrun --standalone --nproc-per-node="$count" -m probe run --pipeline "$pipeline" \
        "${large[@]}" --duration 20 --label "torchrun $count ranks, $pipeline" \
        --json > "$out/ranks-$pipeline.json"
      python3 -m probe show last
    done
    python3 -m probe data make /tmp/imagenet/train --count 2048 --classes 8 --seed 2
    python3 -m probe data make /tmp/imagenet/val --count 256 --classes 8 --seed 3
    torchrun --standalone --nproc-per-node="$count" -m probe watch -- \
      "$here/../data/imagenet_shaped/main.py" /tmp/imagenet -j 4 --epochs 2 -b 64 \
      --image-size 160 --gpu local
    python3 -m probe runs ;;
  doctor16) taskset -c 0-15 python3 "$here/doctor_check.py" --out "$out/doctor16" --long-s 60 \
              --only-recommended -- --gpus "$gpus" "${large[@]}" --scaling ;;
  doctorall) check doctorall -- --gpus "$gpus" "${large[@]}" --scaling ;;
  first) check first -- ;;
  *) echo "usage: several_gpus.sh data|ranks|doctor16|doctorall|first OUT [GPUS]" >&2; exit 2 ;;
esac
