#!/usr/bin/env bash
# The first answer and a watched job's what-if, as a newcomer meets them on this machine's CPU:
#   bash tests/benchmarks/first_answer.sh OUT
#   doctor   two `probe doctor --gpus none` on the built-in sample data, in a row, one store
#   watch    tests/benchmarks/imagenet_shaped.py (2 workers, batches of 16, a 5 ms step) on the
#            sample data (its folders as train/), 4 epochs, under `probe watch --`
#   like     `probe doctor --like` the watched run, then `probe show` of the run and the session
# The store is OUT/feedscope.db; each command's text OUT/*.txt and its JSON OUT/*.json.
set -euo pipefail
out="$(mkdir -p "$1" && cd "$1" && pwd)"
here="$(cd "$(dirname "$0")" && pwd)"; root="$(cd "$here/../.." && pwd)"
export FEEDSCOPE_DB="$out/feedscope.db" PYTHONPATH="$root/tests:$root" PYTHONUNBUFFERED=1
git -C "$root" rev-parse --short HEAD > "$out/commit.txt"
sample="$(python -c "from pipelines.sample_data import default_sample_dir; print(default_sample_dir())")"
data="$out/data"; mkdir -p "$data"
for i in 1 2; do
  python -m probe doctor --gpus none > "$out/doctor$i.txt" 2>&1
  python -m probe show last --json > "$out/doctor$i.json"
done
[ -e "$data/train" ] || ln -s "${SAMPLE:-$sample}" "$data/train"
(cd "$here" && python -m probe watch --name watched -- python imagenet_shaped.py "$data" \
  --epochs 4) > "$out/watch.txt" 2>&1
run="$(python -m probe runs --json | python -c 'import json,sys; print([r["run_id"] for r in json.load(sys.stdin) if r.get("label")=="watched" or r.get("name")=="watched"][-1])')"
echo "$run" > "$out/watched-run.txt"
python -m probe show "$run" > "$out/show-before-like.txt" 2>&1
python -m probe doctor --like "$run" > "$out/like.txt" 2>&1
python -m probe show last --json > "$out/like.json"
python -m probe show "$run" > "$out/show-after-like.txt" 2>&1
python -m probe show "$run" --json > "$out/show-after-like.json"
