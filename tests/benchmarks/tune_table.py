"""The table of a `probe tune` benchmark (tests/benchmarks/tune_gpu.sh): every watched process
of the store ($FEEDSCOPE_DB), oldest first, by its training loader (the one with the most
batches: a written loader may be its `NAME (loader 2)`), the others (validation) left out: the
job's own (`original`), the tune's trials (runs its session names) and the verification runs
(`verify-*`), each with its images/s as `probe show` reads it (for all its lanes), its
data-wait and its session; then each tune's pick where the store has a table `tunes`, and the
last `probe migrate` line of the tune's log. What cannot be read is "-".

    python tune_table.py [ORIGINAL] [TUNE_LOG]
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
from pathlib import Path
from typing import Any

from probe.store.db import Store
from probe.store.documents import read_run

OTHER_LOADER = re.compile(r" \(loader \d+\)$")


def figures(store: Store, run_id: str) -> tuple[str, str, str, float | None]:
    """images/s (± its 95% interval), data-wait, status; images/s as a number for the ratio."""
    try:
        document = read_run(store, run_id)
        rate, error = document.images_per_s, document.images_per_s_error
        wait = document.data_wait_frac
        shown = f"{rate:,.1f} ± {error:,.1f}" if error is not None else f"{rate:,.1f}"
        return (
            shown if rate else "-",
            f"{wait:.1%}" if wait is not None else "-",
            document.status,
            rate or None,
        )
    except Exception as error:  # a run that cannot be read is a row of "-"
        return "-", "-", f"unread: {type(error).__name__}", None


def strings(value: Any) -> set[str]:
    """Every string in a JSON value (a tune's document: the run ids of its trials among them)."""
    if isinstance(value, str):
        return {value}
    if isinstance(value, dict):
        return set().union(*(strings(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(strings(v) for v in value)) if value else set()
    return set()


def tunes(path: Path) -> tuple[list[str], set[str]]:
    """Each tune of the store's table `tunes` in a line (its id, the run it tuned, its status
    and its document's pick), and the strings of their documents; ([], set()) without one."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        db.row_factory = sqlite3.Row
        try:
            if not db.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'tunes'"
            ).fetchone():
                return [], set()
            lines, named = [], set()
            for row in db.execute("SELECT * FROM tunes ORDER BY created"):
                keys = row.keys()
                try:
                    document = json.loads(row["document"]) if "document" in keys else {}
                except (TypeError, ValueError):
                    document = {}
                named |= strings(document)
                pick = document.get("pick", "-") if isinstance(document, dict) else "-"
                shown = pick if isinstance(pick, str) else json.dumps(pick, default=str)
                cells = [f"{k}={row[k]}" for k in keys if k in ("tune_id", "run_id", "status")]
                reason = row["reason"] if "reason" in keys and row["reason"] else None
                cells += [f"reason={reason}"] if reason else []
                lines.append(f"{', '.join(cells)}; pick: {shown[:400]}")
            return lines, named
        finally:
            db.close()
    except sqlite3.Error as error:
        return [f"- (the table tunes could not be read: {error})"], set()


def pick_line(log: str | None) -> str:
    """The tune log's last line that names `probe migrate`, else "-"."""
    if not log or not Path(log).is_file():
        return "-"
    lines = [x.strip() for x in Path(log).read_text(errors="replace").splitlines()]
    named = [x for x in lines if "probe migrate " in x]
    return named[-1] if named else "-"


def main(original: str | None = None, log: str | None = None) -> None:
    with Store() as store:
        path = Path(store.path)
        tuned, named = tunes(path)
        runs, seen = [], set()
        for run in reversed(store.runs()):  # oldest first; of a process, its training loader
            if run.run_id in seen:
                continue
            loaders = store.loaders(run)
            seen |= {r.run_id for r in loaders} | {run.run_id}
            runs.append(loaders[0])
        rows = []
        for run in runs:
            label = OTHER_LOADER.sub("", run.label or "")
            if run.run_id == original or (original is None and label == "original"):
                kind = "the job's"
            elif label.startswith("verify-"):
                kind = "verify"
            elif run.run_id in named:
                kind = "tune trial"
            else:
                kind = "other"
            rate, wait, status, number = figures(store, run.run_id)
            rows.append(
                (kind, label or "-", run.run_id, rate, wait, status, run.session_id, number)
            )
    base = next((r[7] for r in rows if r[0] == "the job's" and r[7]), None)
    print("| loader | label | run | images/s | vs the job's | data-wait | status | session |")
    print("|---|---|---|---:|---:|---:|---|---|")
    for kind, label, run_id, rate, wait, status, session, number in rows:
        ratio = f"{number / base:.2f}x" if number and base else "-"
        print(f"| {kind} | {label} | {run_id} | {rate} | {ratio} | {wait} | {status} | "
              f"{session or '-'} |")  # fmt: skip
    if not rows:
        print("| - | - | - | - | - | - | - | - |")
    print("\nthe tunes (table tunes):" if tuned else "\nno tune in the store (table tunes): -")
    for line in tuned:
        print(f"- {line}")
    print(f"the tune's log, its last `probe migrate` line: {pick_line(log)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
