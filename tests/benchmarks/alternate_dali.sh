#!/usr/bin/env bash
# Two or more DALI settings of a tuned DDP job run in turn, ROUNDS times each, 3 epochs a run,
# under `probe watch --loader` (the module `probe migrate` writes for each setting, swapped in
# for the job's loader): how far one setting's runs spread beside the gaps between settings.
#   bash tests/benchmarks/alternate_dali.sh OUT DB RUN ROUNDS THREADS:SHARE...
# DB: a copy of the store that recorded RUN (tune_gpu.sh's feedscope-ddp.db); the data of
# tune_gpu.sh's `data` stage in /tmp/data; the job tests/benchmarks/ddp_train.py on GPUs 0 and 1
# sharing cores 0-7, as tune_gpu.sh ran it. OUT gets the logs, the store and the table.
set -euo pipefail
out="$(mkdir -p "$1" && cd "$1" && pwd)"; db="$2"; run="$3"; rounds="$4"; shift 4
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../.." && pwd)"
export PYTHONPATH="/tmp/dali-site:$root" PYTHONUNBUFFERED=1 FEEDSCOPE_DB="$out/feedscope.db"
cp "$db" "$FEEDSCOPE_DB"
mkdir -p /tmp/work
for setting in "$@"; do
  threads="${setting%:*}"; share="${setting#*:}"
  python3 -m probe migrate "$run" --to dali --threads "$threads" --hw-decoder-load "$share" \
    -o "/tmp/work/alt_t${threads}_s${share/./}.py" --force > "$out/migrate-t$threads-s$share.log" 2>&1
done
for round in $(seq "$rounds"); do
  for setting in "$@"; do
    threads="${setting%:*}"; share="${setting#*:}"; name="alt-t$threads-s$share-$round"
    (cd /tmp/work && taskset -c 0-7 torchrun --standalone --nproc-per-node=2 -m probe watch \
      --name "$name" --loader "/tmp/work/alt_t${threads}_s${share/./}.py" -- \
      "$here/ddp_train.py" /tmp/data -j 4 -b 64 --epochs 3) > "$out/$name.log" 2>&1 \
      || echo "$name: exit $?" >> "$out/$name.log"
  done
done
python3 "$here/tune_table.py" > "$out/table.md" 2>&1 || true
grep -E "alt-" "$out/table.md" || cat "$out/table.md"
