"""The table of a watched job's loaders: the job's own, feedscope's DataLoader recipe written for
it, and DALI's where it ran; each under `probe watch --`, and the answer's prediction for the
recipe against what the job measured with it (the store: $FEEDSCOPE_DB).

    python loaders_table.py ORIGINAL RECIPE [DALI]
"""

from __future__ import annotations

import sys

from probe.judge.changes import Knob
from probe.judge.diagnosis import diagnose_run
from probe.store.db import Store
from probe.store.documents import read_run


def main(original: str, recipe: str, dali: str | None = None) -> None:
    with Store() as store:
        answer = diagnose_run(store, original).recommendations
        named = [r for r in answer if r.change.knob is Knob.RECIPE]
        runs = [("the job's", original), ("the recipe's", recipe)]
        runs += [("DALI's", dali)] if dali else []
        rows = [(label, run, read_run(store, run).lanes[0].figures) for label, run in runs]
    base = rows[0][2].images_per_s
    print("| loader | run | images/s | vs the job's | CPU per image | data-wait |")
    print("|---|---|---:|---:|---:|---:|")
    for label, run, f in rows:
        cpu = f"{f.cpu_ms_per_image:.1f} ms" if f.cpu_ms_per_image else "-"
        wait = f"{f.data_wait_frac:.0%}" if f.data_wait_frac is not None else "-"
        print(f"| {label} | {run} | {f.images_per_s:,.1f} ± {f.images_per_s_error or 0:,.1f} | "
              f"{f.images_per_s / base:.2f}x | {cpu} | {wait} |")  # fmt: skip
    print(f"\nthe answer's changes: {'; '.join(r.setting for r in answer)}")
    predicted = named[0].predicted_images_per_s if named else None
    if predicted is None:
        print("the answer named no recipe with a figure")
        return
    got, error = rows[1][2].images_per_s, rows[1][2].images_per_s_error or 0.0
    within = "within" if abs(got - predicted) <= error else "outside"
    print(f"the answer: {named[0].setting}, predicted {predicted:,.1f} ± "
          f"{named[0].predicted_error or 0:,.1f} images/s ({named[0].basis}); measured "
          f"{got:,.1f} ± {error:,.1f}: {got / predicted - 1:+.1%} against the prediction, "
          f"which lies {within} the measured interval")  # fmt: skip


if __name__ == "__main__":
    main(*sys.argv[1:])
