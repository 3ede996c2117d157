#!/usr/bin/env bash
# From "DALI is the answer" to the user's script running DALI, on one GPU held to 16 cores (a
# stage a call, on one machine kept warm between them: the store is /tmp/fs/feedscope.db there,
# copied to OUT/feedscope.db as each stage ends):
#   bash tests/benchmarks/migrate_cases.sh STAGE OUT
#   data     3,072 camera-sized JPEGs in /tmp/data/train, 256 in /tmp/data/val
#   watch    pytorch/examples' ImageNet script (.outside/imagenet_main.py, ResNet-18, batch 128,
#            16 workers, 6 epochs with validation and checkpoints), unchanged, under probe watch
#   like     probe doctor --like the training loader; probe migrate both loaders with its
#            setting; the script with those two lines changed, under probe watch
#   grid     the migrated script at other DALI settings (THREADSxSHARE in $GRID), under probe
#            watch
#   defaults the migrated script, its modules written at DALI's defaults, under probe watch
#   standin  feedscope's own DALI lane fed by stand-ins for the watched step and by a model
#            (tests/benchmarks/stand_in.py)
set -euo pipefail
stage="$1"; out="$2"
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../.." && pwd)"
export FEEDSCOPE_DB=/tmp/fs/feedscope.db PYTHONUNBUFFERED=1
mkdir -p "$out" /tmp/work /tmp/fs
trap 'python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); s.execute(\"VACUUM INTO ?\", (sys.argv[2],))" /tmp/fs/feedscope.db "$out/feedscope.db" 2>/dev/null || true' EXIT
camera=(--width 1600-2000 --height 1200-1500)
epochs="${EPOCHS:-12}"
script=(-a resnet18 -b 128 --gpu 0 -p 100)
original() {  # the DataLoader job's training loader (train) or validation loader (val)
  python3 - "$1" <<'PY'
import sys
from probe.store.db import Store
label = {"train": "imagenet_main.py", "val": "imagenet_main.py (loader 2)"}[sys.argv[1]]
with Store() as store:
    print([r for r in store.runs() if r.kind == "watch" and r.label == label][-1].run_id)
PY
}
migrated() {  # the script with its two loaders' lines changed, beside the written modules
  python3 - "$root/.outside/imagenet_main.py" /tmp/work/main_dali.py <<'PY'
import sys
text = open(sys.argv[1]).read()
old = """    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)

    val_loader = torch.utils.data.DataLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False,
        num_workers=args.workers, pin_memory=True, sampler=val_sampler)
"""
new = """    import dali_train, dali_val
    train_loader = dali_train.loader()
    val_loader = dali_val.loader()
"""
assert text.count(old) == 1, "the script's loader lines are not as expected"
open(sys.argv[2], "w").write(text.replace(old, new))
PY
}
run_migrated() {  # THREADS SHARE: write both modules at that setting, watch the script
  python3 -m probe migrate "$(original train)" -o /tmp/work/dali_train.py --force \
    --threads "$1" --hw-decoder-load "$2"
  python3 -m probe migrate "$(original val)" -o /tmp/work/dali_val.py --force \
    --threads "$1" --hw-decoder-load "$2"
  (cd /tmp/work && taskset -c 0-15 python3 -m probe watch --name "dali-$1x$2" -- \
    python3 main_dali.py /tmp/data "${script[@]}" --epochs "$epochs")
}
case "$stage" in
  data)
    python3 -m probe data make /tmp/data/train --count 3072 "${camera[@]}" --seed 1
    python3 -m probe data make /tmp/data/val --count 256 "${camera[@]}" --seed 2
    du -sh /tmp/data ;;
  watch)
    cd /tmp/work
    taskset -c 0-15 python3 -m probe watch -- python3 "$root/.outside/imagenet_main.py" \
      /tmp/data "${script[@]}" -j 16 --epochs 6
    python3 -m probe runs --limit 4 ;;
  like)
    train="$(original train)"
    taskset -c 0-15 python3 -m probe doctor --like "$train" --gpus 0 --json \
      > "$out/doctor.json"
    python3 -m probe show "$train" > "$out/watch-show.txt" 2>&1 || true
    python3 -m probe migrate "$train" -o /tmp/work/dali_train.py --force
    python3 -m probe migrate "$(original val)" -o /tmp/work/dali_val.py --force
    cp /tmp/work/dali_train.py /tmp/work/dali_val.py "$out/"
    migrated
    (cd /tmp/work && taskset -c 0-15 python3 -m probe watch --name dali-like -- \
      python3 main_dali.py /tmp/data "${script[@]}" --epochs "$epochs")
    python3 -m probe runs --limit 6 ;;
  grid)
    migrated
    for setting in ${GRID:-2x1.0 4x0.95 8x0.9 12x0.65}; do
      run_migrated "${setting%x*}" "${setting#*x}"
    done
    python3 -m probe runs --limit 12 ;;
  defaults)  # the migrated script with the modules written at DALI's defaults
    python3 -m probe migrate "$(original train)" -o /tmp/work/dali_train.py --force
    python3 -m probe migrate "$(original val)" -o /tmp/work/dali_val.py --force
    migrated
    (cd /tmp/work && taskset -c 0-15 python3 -m probe watch --name dali-defaults -- \
      python3 main_dali.py /tmp/data "${script[@]}" --epochs "$epochs") ;;
  standin)
    taskset -c 0-15 python3 "$here/stand_in.py" --data /tmp/data/train --out "$out" \
      --run "$(original train)" ${ALSO_MS:+--also-ms "$ALSO_MS"} ;;
  *) echo "usage: migrate_cases.sh data|watch|like|grid|standin OUT" >&2; exit 2 ;;
esac
