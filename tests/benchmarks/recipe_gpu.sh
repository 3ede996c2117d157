#!/usr/bin/env bash
# feedscope's DataLoader recipe written for pytorch/examples' ImageNet script, on one GPU held to
# 16 cores, in one call (the machine keeps nothing between calls):
#   bash tests/benchmarks/recipe_gpu.sh OUT
# 1,280 camera-sized JPEGs (and 64 for validation); the script (.outside/imagenet_main.py,
# ResNet-18, batches of 32, 16 workers, 4 epochs) under probe watch; probe doctor --like its training
# loader; probe migrate --to dataloader; the script with its training loader's lines changed to
# the written module, under probe watch; the table (tests/benchmarks/loaders_table.py).
set -euo pipefail
out="$(mkdir -p "$1" && cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../.." && pwd)"
export FEEDSCOPE_DB="$out/feedscope.db" PYTHONPATH="$root" PYTHONUNBUFFERED=1
camera=(--width 1600-2000 --height 1200-1500)
script=(/tmp/data -a resnet18 -b "${BATCH:-32}" --gpu 0 -p 100 -j 16 --epochs "${EPOCHS:-4}")
mkdir -p /tmp/work
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc;
  git -C "$root" log --oneline -1 2>/dev/null || true; } > "$out/card.txt"
python3 -m probe data make /tmp/data/train --count "${COUNT:-1280}" "${camera[@]}" --seed 1 \
  > "$out/data.log"
python3 -m probe data make /tmp/data/val --count 64 "${camera[@]}" --seed 2 >> "$out/data.log"
(cd /tmp/work && taskset -c 0-15 python3 -m probe watch --name original -- \
  python3 "$root/.outside/imagenet_main.py" "${script[@]}") > "$out/watch-original.log" 2>&1
train="$(python3 - <<'PY'
from probe.store.db import Store
with Store() as store:
    print([r for r in store.runs() if r.label == "original"][-1].run_id)
PY
)"
taskset -c 0-15 python3 -m probe doctor --like "$train" --gpus 0 --budget "${BUDGET:-220}" \
  > "$out/doctor.log" 2>&1 || true
python3 -m probe show "$train" > "$out/show-original.log" 2>&1 || true
python3 -m probe migrate "$train" --to dataloader -o /tmp/work/torch_train.py --force \
  > "$out/migrate.log" 2>&1
python3 - "$root/.outside/imagenet_main.py" /tmp/work/main_recipe.py <<'PY'
import sys
text = open(sys.argv[1]).read()
old = """    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)
"""
new = """    import torch_train
    train_loader = torch_train.loader()
"""
assert text.count(old) == 1, "the script's loader lines are not as expected"
open(sys.argv[2], "w").write(text.replace(old, new))
PY
cp /tmp/work/torch_train.py /tmp/work/main_recipe.py "$out/"
(cd /tmp/work && taskset -c 0-15 python3 -m probe watch --name recipe -- \
  python3 main_recipe.py "${script[@]}") > "$out/watch-recipe.log" 2>&1
recipe="$(python3 - <<'PY'
from probe.store.db import Store
with Store() as store:
    print([r for r in store.runs() if r.label == "recipe"][-1].run_id)
PY
)"
python3 "$here/loaders_table.py" "$train" "$recipe" > "$out/table.md"
cat "$out/table.md"
