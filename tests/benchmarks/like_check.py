"""Benchmark: `probe doctor --like RUN` on a watched job's own files, against a long `probe run`
of the DALI setting the doctor found best, on the same files, batch, image size and consumer.

    python tests/benchmarks/like_check.py --out DIR [--run RUN] [--long-s 60] [-- DOCTOR FLAGS]

RUN defaults to the training loader (the most batches) of the newest watched process. Writes
doctor.json and dali.json (with their logs) to --out and prints a table: the doctor's DALI
point against the long run, and the doctor's first recommendation.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from probe.present.options import reproduce_command
from probe.store.db import Store


def training_run() -> str:
    """The newest watched process's loader with the most batches."""
    with Store() as store:
        watched = [r for r in store.runs() if r.kind == "watch"]
        if not watched:
            raise SystemExit("no watched run in the store")
        loaders = store.loaders(max(watched, key=lambda r: (r.created, r.run_id)))
        return max(loaders, key=lambda r: store.batch_totals(r.run_id, 0).batches).run_id


def probe(out: Path, name: str, *args: str) -> dict[str, Any]:
    """`python -m probe ARGS --json`, its document saved as NAME.json and its log as NAME.log."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "probe", *args, "--json"], capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    (out / f"{name}.log").write_text(result.stderr)
    print(f"{name}: exit {result.returncode} after {time.monotonic() - started:.0f} s", flush=True)
    if not result.stdout.strip():
        raise SystemExit(f"{name}: no document; its log: {out / f'{name}.log'}")
    (out / f"{name}.json").write_text(result.stdout)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run", default=None, help="the watched run  [default: the newest]")
    parser.add_argument("--long-s", type=float, default=60.0)
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then more doctor flags")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    run = args.run or training_run()
    flags = [f for f in args.flags if f != "--"]
    doctor = probe(args.out, "doctor", "doctor", "--like", run, *flags)
    dali = doctor.get("dali") or {}
    first = (doctor.get("recommendations") or [{}])[0]
    rate = first.get("predicted_images_per_s") or 0.0
    print(f"watched run {run}; the doctor's first change: {first.get('setting')}: "
          f"{first.get('action')} ({rate:,.0f} images/s)")  # fmt: skip
    if not dali.get("run_id"):
        raise SystemExit("the doctor measured no DALI point")
    point = probe(args.out, "dali-point", "show", dali["run_id"])
    command = reproduce_command(point, of_session=True)
    assert command is not None
    words = [*shlex.split(command)[2:], "--duration", f"{args.long_s:g}"]
    print("long run: probe run " + shlex.join(words), flush=True)
    long = probe(args.out, "dali", "run", *words)
    measured, predicted = long["images_per_s"], dali["images_per_s"]
    print(f"{'':<28}{'images/s':>18}")
    error = dali["images_per_s_error"] or 0.0
    print(f"{'doctor, ' + dali['setting']:<60}{predicted:>10,.0f} ± {error:,.0f}")
    print(f"{f'probe run, {args.long_s:g} s':<60}{measured:>10,.0f} ± "
          f"{long.get('images_per_s_error') or 0:,.0f}")  # fmt: skip
    print(f"the doctor's DALI point against the long run: {predicted / measured - 1:+.1%}")


if __name__ == "__main__":
    main()
