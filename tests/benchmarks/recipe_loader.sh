#!/usr/bin/env bash
# feedscope's DataLoader recipe, written for an ImageNet-shaped script, against the script's own
# loader and DALI's written loader, each under probe watch, on this machine's CPU:
#   bash tests/benchmarks/recipe_loader.sh OUT
#   data     600 camera-sized JPEGs (probe data make --width 1600-2000 --height 1200-1500) in
#            $DATA/train (default /tmp/recipe-data), made once
#   watch    tests/benchmarks/imagenet_shaped.py (2 workers, batches of 16, a 5 ms step), as is
#   doctor   probe doctor --like the watched run; probe show it: the answer names the recipe
#   recipe   probe migrate --to dataloader; the script with its loader's line changed, watched
#   dali     probe migrate (DALI, on the CPU); the script with that line changed, watched
# The store is OUT/feedscope.db; each step's output is OUT/*.log; the table is OUT/table.md.
set -euo pipefail
out="$(mkdir -p "$1" && cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../.." && pwd)"
data="${DATA:-/tmp/recipe-data}"
epochs="${EPOCHS:-4}"
export FEEDSCOPE_DB="$out/feedscope.db" PYTHONPATH="$root/tests:$root" PYTHONUNBUFFERED=1
work="$out/work"; mkdir -p "$work"
cp "$here/imagenet_shaped.py" "$work/"
[ -d "$data/train" ] || python -m probe data make "$data/train" --count 600 --classes 8 \
  --width 1600-2000 --height 1200-1500
watched() {  # NAME SCRIPT: the script under probe watch
  (cd "$work" && python -m probe watch --name "$1" -- python "$2" "$data" --epochs "$epochs") \
    > "$out/watch-$1.log" 2>&1
}
run_of() {  # NAME: the id of its newest run
  python - "$1" <<'PY'
import sys
from probe.store.db import Store
with Store() as store:
    print([r for r in store.runs() if r.label == sys.argv[1]][-1].run_id)
PY
}
changed() {  # MODULE SCRIPT: imagenet_shaped.py with its loader's line changed to MODULE's
  python - "$work/imagenet_shaped.py" "$1" "$work/$2" <<'PY'
import sys
source, module, target = sys.argv[1:]
lines = open(source).read().splitlines(keepends=True)
made = [i for i, line in enumerate(lines) if line.lstrip().startswith("train_loader = ")]
assert len(made) == 1, "the script's loader line is not as expected"
lines[made[0]] = f"    train_loader = {module}.loader()\n"
at = lines.index("import torch\n")
lines.insert(at + 1, f"import {module}\n")
open(target, "w").write("".join(lines))
PY
}
watched original imagenet_shaped.py
original="$(run_of original)"
python -m probe doctor --like "$original" > "$out/doctor.log" 2>&1
python -m probe show "$original" > "$out/show-original.log" 2>&1
(cd "$work" && python -m probe migrate "$original" --to dataloader --force) > "$out/migrate.log" 2>&1
changed torch_train_loader recipe.py
watched recipe recipe.py
(cd "$work" && python -m probe migrate "$original" --force) > "$out/migrate-dali.log" 2>&1
changed dali_train_loader dali.py
watched dali dali.py
python "$here/loaders_table.py" "$original" "$(run_of recipe)" "$(run_of dali)" > "$out/table.md"
cat "$out/table.md"
