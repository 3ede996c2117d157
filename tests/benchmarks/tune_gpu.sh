#!/usr/bin/env bash
# `probe tune` on two jobs, and its pick checked against settings run by hand, a stage a call
# (the machine keeps /tmp while it is warm; a call is at most 10 minutes):
#   bash tests/benchmarks/tune_gpu.sh OUT STAGE     (STAGE OUT, as shared_node_gpu.sh, also does)
#   data        4,096 (COUNT) ImageNet-sized JPEGs (400-500 x 330-375 px, 8 classes) in
#               /tmp/data/train and 64 (VAL) in /tmp/data/val, made once; OUT/card.txt,
#               OUT/data.log (with DALI's version)
#   one-tune    pytorch/examples' imagenet/main.py (.outside/imagenet_main.py, carried: ResNet-18
#               fp32, batches of 64, 4 workers, GPU 0) held to cores 0-3, 4 epochs under
#               `probe watch --name original`; `probe tune` of its training loader, 6 trials,
#               timed (OUT/one-tune.log, OUT/wall.txt)
#   one-verify  the script and copies of it with its training loader's lines changed to a
#               module `probe migrate` wrote (DALI 2 threads share 1.0, 3 0.9, 4 0.75; the
#               DataLoader recipe with 4 workers; the tune's pick), 3 epochs each under
#               `probe watch --name verify-SETTING`, on the same cores; OUT/one-table.md
#   one         one-tune, then one-verify
#   ddp-tune    tests/benchmarks/ddp_train.py (ResNet-50 bf16, batches of 64, 4 workers a rank)
#               by torchrun on GPUs 0 and 1 sharing cores 0-7, 7 epochs, watched, and tuned
#   ddp-verify  as one-verify, the copies of ddp_train.py with its `train_loader = ` line changed
#   ddp         ddp-tune, then ddp-verify
# The stores are OUT/feedscope-one.db and OUT/feedscope-ddp.db (the job's run id in
# OUT/CASE-original.id); OUT under /tmp keeps them between calls. Logs are OUT/CASE-*.log.
set -euo pipefail
stages=" data one one-tune one-verify ddp ddp-tune ddp-verify "
usage() { echo "usage: tune_gpu.sh OUT data|one|one-tune|one-verify|ddp|ddp-tune|ddp-verify" >&2
  exit 2; }
[ $# -eq 2 ] || usage
if [[ "$stages" == *" $1 "* ]]; then stage="$1"; dir="$2"; else dir="$1"; stage="$2"; fi
[[ "$stages" == *" $stage "* ]] || usage
out="$(mkdir -p "$dir" && cd "$dir" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../.." && pwd)"
export PYTHONPATH="/tmp/dali-site:$root" PYTHONUNBUFFERED=1
main="${MAIN:-$root/.outside/imagenet_main.py}"  # MAIN, DDP: other copies, for tests
ddp_train="${DDP:-$here/ddp_train.py}"
one=(/tmp/data -a resnet18 -b 64 -j 4 --gpu 0 -p 100)
ddp=(/tmp/data -j 4 -b 64)
images=(--width 400-500 --height 330-375)
mkdir -p /tmp/work
started=$(date +%s.%N)
since() {  # START: the seconds since START (date +%s.%N), to 0.1 s
  python3 -c "import sys; print(round(float(sys.argv[1]) - float(sys.argv[2]), 1))" \
    "$(date +%s.%N)" "$1"
}
[ -f "$out/card.txt" ] || { nvidia-smi --query-gpu=name,driver_version,memory.total \
  --format=csv,noheader 2>&1 || echo "no nvidia-smi"; nproc
  git -C "$root" log --oneline -1 2>/dev/null || true; } > "$out/card.txt"
run_of() {  # NAME: the id of the training loader (the most batches) of NAME's newest process
  python3 - "$1" <<'PY'
import sys
from probe.store.db import Store
with Store() as store:
    name = sys.argv[1]
    newest = [r for r in store.runs() if (r.label or "").split(" (loader ")[0] == name][0]
    print(store.loaders(newest)[0].run_id)
PY
}
watched() {  # CASE NAME SCRIPT EPOCHS: the script under probe watch, on the case's cores
  if [ "$1" = one ]; then
    (cd /tmp/work && taskset -c 0-3 python3 -m probe watch --name "$2" -- \
      python3 "$3" "${one[@]}" --epochs "$4") > "$out/one-$2.log" 2>&1 \
      || echo "$2: exit $?" >> "$out/one-$2.log"
  else
    (cd /tmp/work && taskset -c 0-7 torchrun --standalone --nproc-per-node=2 -m probe watch \
      --name "$2" -- "$3" "${ddp[@]}" --epochs "$4") > "$out/ddp-$2.log" 2>&1 \
      || echo "$2: exit $?" >> "$out/ddp-$2.log"
  fi
}
changed() {  # SCRIPT MODULE TARGET MIGRATE_LOG: SCRIPT with its training loader made by MODULE
  # (its loader(); loader(original=train_loader) after the job's own where MIGRATE_LOG says so)
  python3 - "$@" <<'PY'
import sys
source, module, target, log = sys.argv[1:]
olds = {
    "imagenet_main.py": """    train_loader = torch.utils.data.DataLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler)
""",
    "ddp_train.py": """    train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler, num_workers=args.workers, pin_memory=True)  # noqa: E501  # fmt: skip
""",
}
old = olds[source.rsplit("/", 1)[-1]]
text = open(source).read()
assert text.count(old) == 1, "the script's loader lines are not as expected"
if f"{module}.loader(original=" in open(log, errors="replace").read():
    new = old + f"    import {module}\n    train_loader = {module}.loader(original=train_loader)\n"
else:
    new = f"    import {module}\n    train_loader = {module}.loader()\n"
open(target, "w").write(text.replace(old, new))
PY
}
migrated() {  # CASE NAME MODULE RUN FLAGS...: `probe migrate RUN FLAGS` to /tmp/work/MODULE.py,
  # the case's script changed to it, under probe watch for 3 epochs
  local case="$1" name="$2" module="$3" run="$4" script; shift 4
  script="$main"; [ "$case" = one ] || script="$ddp_train"
  if (cd /tmp/work && python3 -m probe migrate "$run" "$@" -o "/tmp/work/$module.py" --force) \
    > "$out/$case-migrate-$name.log" 2>&1; then
    changed "$script" "$module" "/tmp/work/$case-$name.py" "$out/$case-migrate-$name.log"
    cp "/tmp/work/$module.py" "$out/$case-$name-$module.py"
    cp "/tmp/work/$case-$name.py" "$out/$case-$name-script.py"
    watched "$case" "$name" "/tmp/work/$case-$name.py" 3
  else
    echo "migrate: exit $?" >> "$out/$case-migrate-$name.log"
  fi
}
picked() {  # LOG: the run and the flags of the last `probe migrate RUN ...` line in LOG, a line
  # each (the flags migrate takes: --to, --workers, --threads, --hw-decoder-load); none without
  python3 - "$1" <<'PY'
import shlex, sys
lines = [x for x in open(sys.argv[1], errors="replace") if "probe migrate " in x]
if lines:
    text = lines[-1].split("probe migrate ", 1)[1].split("`", 1)[0]
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    kept, taken = [], {"--to", "--workers", "--threads", "--hw-decoder-load"}
    for i, word in enumerate(words[1:], 1):
        name = word.split("=", 1)[0]
        if name in taken and "=" in word:
            kept.append(word)
        elif name in taken and i + 1 < len(words):
            kept += [word, words[i + 1]]
    if words and not words[0].startswith("-"):
        print("\n".join([words[0], *kept]))
PY
}
tuned() {  # CASE SCRIPT CORES EPOCHS: the job's own, watched for EPOCHS (enough for tune's
  # 5 + 200 batches a trial); probe tune of its run, timed
  watched "$1" original "$2" "$4"
  run_of original > "$out/$1-original.id"
  original="$(cat "$out/$1-original.id")"
  python3 -m probe show "$original" > "$out/$1-show-original.log" 2>&1 || true
  local start; start=$(date +%s.%N)
  echo "start $(date -Is)" > "$out/$1-tune.log"
  (cd /tmp/work && taskset -c "$3" python3 -m probe tune "$original" --trials 6) \
    >> "$out/$1-tune.log" 2>&1 || echo "tune: exit $?" >> "$out/$1-tune.log"
  echo "end $(date -Is), wall $(since "$start") s" >> "$out/$1-tune.log"
  echo "$1 tune $(since "$start") s" >> "$out/wall.txt"
}
verified() {  # CASE SCRIPT: the job's own and the migrated scripts, 3 epochs each; the table
  local original setting threads share name pick
  original="$(cat "$out/$1-original.id")"
  watched "$1" verify-own "$2" 3
  for setting in 2:1.0 3:0.9 4:0.75; do
    threads="${setting%:*}"; share="${setting#*:}"
    migrated "$1" "verify-dali-t$threads-s$share" dali_train "$original" --to dali \
      --threads "$threads" --hw-decoder-load "$share"
  done
  migrated "$1" verify-torch-w4 torch_train "$original" --to dataloader --workers 4
  mapfile -t pick < <(picked "$out/$1-tune.log")
  if [ "${#pick[@]}" -gt 0 ]; then
    module=pick_dali; [[ " ${pick[*]} " != *" dataloader "* ]] || module=pick_torch
    migrated "$1" verify-pick "$module" "${pick[@]}"
  else
    echo "no \`probe migrate\` line in $1-tune.log: no verify-pick" >> "$out/$1-tune.log"
  fi
  for name in verify-own verify-dali-t2-s1.0 verify-dali-t3-s0.9 verify-dali-t4-s0.75 \
    verify-torch-w4 verify-pick; do
    python3 -m probe show "$(run_of "$name" 2>/dev/null)" > "$out/$1-show-$name.log" 2>&1 || true
  done
  python3 "$here/tune_table.py" "$original" "$out/$1-tune.log" > "$out/$1-table.md" 2>&1 \
    || echo "table: exit $?" >> "$out/$1-table.md"
  cat "$out/$1-table.md"
}
case "$stage" in
  data)
    [ -d /tmp/data/train ] || python3 -m probe data make /tmp/data/train \
      --count "${COUNT:-4096}" "${images[@]}" --seed 1 >> "$out/data.log" 2>&1
    [ -d /tmp/data/val ] || python3 -m probe data make /tmp/data/val --count "${VAL:-64}" \
      "${images[@]}" --seed 2 >> "$out/data.log" 2>&1
    python3 -c "import nvidia.dali as d; print('DALI', d.__version__)" >> "$out/data.log" 2>&1 \
      || echo "DALI: not importable" >> "$out/data.log" ;;
  one|one-tune|one-verify)
    export FEEDSCOPE_DB="$out/feedscope-one.db"
    [ "$stage" = one-verify ] || tuned one "$main" 0-3 4
    [ "$stage" = one-tune ] || verified one "$main" ;;
  ddp|ddp-tune|ddp-verify)
    export FEEDSCOPE_DB="$out/feedscope-ddp.db"
    [ "$stage" = ddp-verify ] || tuned ddp "$ddp_train" 0-7 7
    [ "$stage" = ddp-tune ] || verified ddp "$ddp_train" ;;
esac
echo "$stage $(since "$started") s" >> "$out/wall.txt"
