#!/usr/bin/env bash
# The doctor's checks on a GPU host, one case a call (each resumable: results under
# ${CHECKS:-/tmp/checks}/CASE, read again by a second call): `bash doctor_checks.sh large`
# (1,500 camera-sized JPEGs, ResNet-50, 60 s long runs), `rn50` and `rn18` (the sample data,
# 120 s long runs, a 300-batch sweep for ResNet-50), `first` (`probe doctor` with no flag).
set -euo pipefail
case_="$1"; checks="${CHECKS:-/tmp/checks}"; mkdir -p "$checks"
check() { python3 "$(dirname "$0")/doctor_check.py" --out "$checks/$1" "${@:2}"; }
case "$case_" in
  large)
    [ -d /tmp/large ] || python3 -m probe data make /tmp/large --count 1500 \
      --width 1600-2000 --height 1200-1500 --seed 1
    check large --long-s 60 -- --gpus 0 --consumer model:resnet50 --data /tmp/large ;;
  rn50) check rn50 --long-s 120 --sweep 8,12,16 --sweep-batches 300 -- --gpus 0 \
          --consumer model:resnet50 ;;
  rn18) check rn18 --long-s 120 -- --gpus 0 --consumer model:resnet18 ;;
  first) check first --long-s 120 --sweep 8,12,16 --sweep-batches 300 -- ;;
  *) echo "usage: doctor_checks.sh large|rn50|rn18|first" >&2; exit 2 ;;
esac
