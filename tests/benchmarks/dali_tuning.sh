#!/usr/bin/env bash
# DALI at its best, measured on one GPU (a stage a call; results under OUT/STAGE*, the output
# in OUT/STAGE.log): `bash tests/benchmarks/dali_tuning.sh STAGE OUT`
#   data      1,500 camera-sized JPEGs (about 700 KB) in /tmp/large
#   doctorC   `probe doctor` held to C cores (taskset -c 0-(C-1)), ResNet-50 on /tmp/large, then
#             a 60 s `probe run` of its first recommendation (tests/benchmarks/doctor_check.py)
#   gridC-T   DALI mixed with T threads (several joined by _, as 1_2) x hw_decoder_load 0.65,
#             0.8, 0.9, 0.95, 1.0, each 20 s measured, held to C cores (tests/benchmarks/dali_grid.py)
set -euo pipefail
stage="$1"; out="$2"
here="$(cd "$(dirname "$0")" && pwd)"
export FEEDSCOPE_DB="$out/feedscope.db" PYTHONUNBUFFERED=1
mkdir -p "$out"
large=(--gpus 0 --data /tmp/large --consumer model:resnet50)
cpus() { echo "0-$(( $1 - 1 ))"; }
case "$stage" in
  data)
    python3 -m probe data make /tmp/large --count 1500 --width 1600-2000 --height 1200-1500 \
      --seed 1
    du -sh /tmp/large ;;
  doctor*)
    cores="${stage#doctor}"
    taskset -c "$(cpus "$cores")" python3 "$here/doctor_check.py" --out "$out/$stage" \
      --long-s 60 --only-recommended -- "${large[@]}" ;;
  grid*)
    spec="${stage#grid}"; cores="${spec%%-*}"; threads="${spec#*-}"; threads="${threads//_/,}"
    taskset -c "$(cpus "$cores")" python3 "$here/dali_grid.py" \
      --out "$out/$stage.json" --threads "$threads" --loads 0.65,0.8,0.9,0.95,1 \
      --seconds 20 -- "${large[@]}" ;;
  *) echo "usage: dali_tuning.sh data|doctorC|gridC-T[_T] OUT" >&2; exit 2 ;;
esac
