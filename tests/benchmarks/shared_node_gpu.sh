#!/usr/bin/env bash
# A shared node's GPUs, measured a stage a call (the machine keeps /tmp while it is warm):
#   bash tests/benchmarks/shared_node_gpu.sh STAGE OUT
#   data     4,096 JPEGs of 400-600 x 300-450 px in /tmp/ddp/train (8 classes), and the built-in
#            sample data, made once
#   doctor   `probe doctor` with no flag on GPU 0 held to 16 cores (taskset -c 0-15), timed:
#            OUT/doctor.json, OUT/doctor.log, OUT/doctor-wall.txt
#   ddp      tests/benchmarks/ddp_train.py (ResNet-50 bf16, 4 workers a rank) on GPUs 0 and 1
#            sharing cores 16-23, under `probe watch`, while 8 processes burn cores 24-31 (other
#            jobs on the node); `probe migrate` of its run (DALI) and the script run again by
#            torchrun with its loader's line changed to the written module's `loader()`, watched;
#            the same with `probe migrate --to dataloader`; each script's epochs, the shards
#            checked, in OUT/ddp-*.log
#   like     `probe doctor --like` of the watched DDP run, held to its cores
# The store is OUT/feedscope.db.
set -euo pipefail
stage="$1"; out="$(mkdir -p "$2" && cd "$2" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../.." && pwd)"
export FEEDSCOPE_DB="$out/feedscope.db" PYTHONUNBUFFERED=1
script=(/tmp/ddp -j 4 -b 64 --epochs 3)
ranks=(taskset -c 16-23 torchrun --standalone --nproc-per-node=2)
run_of() {  # NAME: the id of its newest run
  python3 - "$1" <<'PY'
import sys
from probe.store.db import Store
with Store() as store:
    print([r for r in store.runs() if r.label == sys.argv[1]][-1].run_id)
PY
}
changed() {  # MODULE SCRIPT: ddp_train.py with its loader's line changed to MODULE's loader()
  python3 - "$here/ddp_train.py" "$1" "$2" <<'PY'
import sys
source, module, target = sys.argv[1:]
lines = open(source).read().splitlines(keepends=True)
made = [i for i, line in enumerate(lines) if line.lstrip().startswith("train_loader = ")]
assert len(made) == 1, "the script's loader line is not as expected"
lines[made[0]] = f"    import {module}\n    train_loader = {module}.loader()\n"
open(target, "w").write("".join(lines))
PY
}
watched() {  # NAME SCRIPT: the script under probe watch, by torchrun, on cores 16-23
  (cd /tmp/work && "${ranks[@]}" -m probe watch --name "$1" -- "$2" "${script[@]}") \
    > "$out/ddp-$1.log" 2>&1 || echo "$1: exit $?" >> "$out/ddp-$1.log"
}
case "$stage" in
  data)
    { nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc;
      git -C "$root" log --oneline -1 2>/dev/null || true; } > "$out/card.txt"
    [ -d /tmp/ddp/train ] || python3 -m probe data make /tmp/ddp/train --count 4096 --classes 8 \
      --width 400-600 --height 300-450 --seed 3 > "$out/data.log"
    python3 -c "from pipelines.sample_data import ensure_default_dataset as e; print(e())" \
      >> "$out/data.log" ;;
  doctor)
    start=$(date +%s.%N)
    CUDA_VISIBLE_DEVICES=0 taskset -c 0-15 python3 -m probe doctor --json \
      > "$out/doctor.json" 2> "$out/doctor.log" || echo "exit $?" >> "$out/doctor.log"
    python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 1))" \
      "$(date +%s.%N)" "$start" > "$out/doctor-wall.txt"
    python3 -m probe show last >> "$out/doctor.log" 2>&1 || true ;;
  ddp)
    mkdir -p /tmp/work
    burners=()
    for core in 24 25 26 27 28 29 30 31; do
      taskset -c "$core" python3 -c "while True: pass" & burners+=($!)
    done
    watched original "$here/ddp_train.py"
    kill "${burners[@]}"
    original="$(run_of original)"
    python3 -m probe show "$original" > "$out/show-original.log" 2>&1 || true
    (cd /tmp/work && python3 -m probe migrate "$original" -o /tmp/work/dali_loader.py --force) \
      > "$out/migrate-dali.log" 2>&1
    changed dali_loader /tmp/work/ddp_dali.py
    watched dali /tmp/work/ddp_dali.py
    (cd /tmp/work && python3 -m probe migrate "$original" --to dataloader \
      -o /tmp/work/torch_loader.py --force) > "$out/migrate-recipe.log" 2>&1
    changed torch_loader /tmp/work/ddp_recipe.py
    watched recipe /tmp/work/ddp_recipe.py
    cp /tmp/work/dali_loader.py /tmp/work/torch_loader.py "$out/"
    for name in dali recipe; do
      python3 -m probe show "$(run_of "$name")" > "$out/show-$name.log" 2>&1 || true
    done ;;
  like)
    original="$(run_of original)"
    taskset -c 16-23 python3 -m probe doctor --like "$original" --gpus 0,1 \
      > "$out/like.log" 2>&1 || echo "exit $?" >> "$out/like.log" ;;
  *) echo "usage: shared_node_gpu.sh data|doctor|ddp|like OUT" >&2; exit 2 ;;
esac
