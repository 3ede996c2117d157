"""Benchmark: one store under everything at once, for ten minutes.

A probe (`probe run`, a CPU lane feeding a 20 ms step) and a `watch` loop (dict batches of 8,
a 20 ms step) write to one store, while two dashboards (Streamlit's AppTest, each a fresh
session, as a reload is) open the Live and Runs pages every 3 s, and a third process takes the
store's write lock for 12 s every minute, longer than the store's busy timeout. At the end it
prints a table: errors seen (each process's tracebacks, exit codes and page exceptions), rows
written against rows expected, and the pages' refresh times.

Rows expected: a probe lane numbers its batches 0, 1, 2, ...; a lane holding N rows up to index
N - 1 lost none. The watch loop counts its own iterations. Hardware samples have no count to
meet, so the table shows their largest gap (the sampling interval when none were lost).

    python tests/benchmarks/soak.py [--minutes 10] [--lock-s 12] [--lock-every-s 60] [--keep DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

APP = Path(__file__).resolve().parents[2] / "app" / "streamlit_app.py"
ROOT = Path(__file__).resolve().parents[2]


def run_dashboard(db: Path, seconds: float, out: Path) -> None:
    """Opens Live and Runs in turn, every 3 s, until `seconds` have passed."""
    os.environ["FEEDSCOPE_DB"] = str(db)
    from streamlit.testing.v1 import AppTest

    times: dict[str, list[float]] = {"live": [], "runs": []}
    errors: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        started = time.monotonic()
        for page, seconds_taken in times.items():
            t0 = time.perf_counter()
            try:
                at = AppTest.from_file(str(APP), default_timeout=120)
                at.switch_page(f"views/{page}.py")
                at.run()
                errors.extend(f"{page}: {e.message}" for e in at.exception)
            except Exception as error:  # a benchmark counts every failure
                errors.append(f"{page}: {type(error).__name__}: {error}")
            seconds_taken.append(time.perf_counter() - t0)
        time.sleep(max(0.0, 3.0 - (time.monotonic() - started)))
    out.write_text(json.dumps({"times": times, "errors": errors}))


def run_watch(db: Path, seconds: float, out: Path) -> None:
    """A training loop of dict batches under `watch`, counting its own iterations."""
    import torch

    from probe import watch

    def batches() -> Iterator[dict[str, torch.Tensor]]:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            yield {"image": torch.zeros(8, 3, 32, 32), "label": torch.zeros(8)}

    count = 0
    for _ in watch(batches(), name="soak-watch", db=db):
        time.sleep(0.02)
        count += 1
    out.write_text(json.dumps({"batches": count}))


def run_locker(db: Path, seconds: float, hold_s: float, every_s: float, out: Path) -> None:
    """Takes the store's write lock for `hold_s` every `every_s`, starting half a period in."""
    held: list[tuple[float, float]] = []
    begin = time.monotonic()
    next_at = begin + every_s / 2
    while next_at + hold_s < begin + seconds:
        time.sleep(max(0.0, next_at - time.monotonic()))
        connection = sqlite3.connect(db, timeout=60, isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")
        got = time.monotonic()
        time.sleep(hold_s)
        connection.execute("COMMIT")
        connection.close()
        held.append((got - begin, time.monotonic() - got))
        next_at += every_s
    out.write_text(json.dumps({"held": held}))


def spawn(role: str, db: Path, seconds: float, out: Path, *extra: str) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "--role", role, "--db", str(db)]
    command += ["--seconds", str(seconds), "--out", str(out), *extra]
    return subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--lock-s", type=float, default=12.0)
    parser.add_argument("--lock-every-s", type=float, default=60.0)
    parser.add_argument("--keep", type=Path, help="a folder to keep the store and logs in")
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--db", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "dashboard":
        run_dashboard(args.db, args.seconds, args.out)
    elif args.role == "watch":
        run_watch(args.db, args.seconds, args.out)
    elif args.role == "locker":
        run_locker(args.db, args.seconds, args.lock_s, args.lock_every_s, args.out)
    else:
        folder = args.keep or Path(tempfile.mkdtemp(prefix="feedscope-soak-"))
        folder.mkdir(parents=True, exist_ok=True)
        errors = soak(folder, args.minutes * 60, args.lock_s, args.lock_every_s)
        print_table(folder, args.minutes, args.lock_s, errors)


def soak(folder: Path, seconds: float, lock_s: float, lock_every_s: float) -> list[str]:
    """Runs everything at once on `folder`/soak.db; returns the errors its processes showed."""
    db = folder / "soak.db"
    env = {**os.environ, "FEEDSCOPE_DB": str(db)}
    # the sample data first, so that the probe's start-up is not its writing
    subprocess.run([sys.executable, "-m", "probe", "runs"], env=env, check=True,
                   capture_output=True)  # fmt: skip
    command = [
        sys.executable, "-m", "probe", "run", "--gpus", "none", "--consumer", "sleep:20",
        "--batch-size", "16", "--workers", "1", "--duration", str(seconds),
        "--label", "soak-probe", "--db", str(db),
    ]  # fmt: skip
    processes = {
        "probe": subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        ),
        "watch": spawn("watch", db, seconds, folder / "watch.json"),
        "dashboard 1": spawn("dashboard", db, seconds, folder / "dash1.json"),
        "dashboard 2": spawn("dashboard", db, seconds, folder / "dash2.json"),
        "locker": spawn(
            "locker",
            db,
            seconds,
            folder / "locker.json",
            "--lock-s",
            str(lock_s),
            "--lock-every-s",
            str(lock_every_s),
        ),
    }
    errors: list[str] = []
    for name, process in processes.items():
        stdout, stderr = process.communicate(timeout=seconds + 600)
        (folder / f"{name.replace(' ', '-')}.log").write_text(stdout + stderr)
        if process.returncode != 0:
            errors.append(f"{name}: exit {process.returncode}")
        if "Traceback" in stderr:
            errors.append(f"{name}: a traceback ({stderr.strip().splitlines()[-1]})")
    return errors


def print_table(folder: Path, minutes: float, lock_s: float, errors: list[str]) -> None:
    """The table: rows written against rows expected, refresh times, errors."""
    dashboards = [json.loads((folder / f"dash{i}.json").read_text()) for i in (1, 2)]
    errors = errors + [error for d in dashboards for error in d["errors"]]
    watched = json.loads((folder / "watch.json").read_text())["batches"]
    held = json.loads((folder / "locker.json").read_text())["held"]
    with sqlite3.connect(f"file:{folder / 'soak.db'}?mode=ro", uri=True) as store:
        runs = store.execute("SELECT run_id, label, status, reason FROM runs").fetchall()
        probe_id = next(run_id for run_id, label, *_ in runs if label == "soak-probe")
        watch_id = next(run_id for run_id, label, *_ in runs if label == "soak-watch")
        lanes = store.execute(
            "SELECT lane, COUNT(*), MAX(idx) + 1 FROM batches WHERE run_id = ? GROUP BY lane",
            (probe_id,),
        ).fetchall()
        watch_rows = store.execute(
            "SELECT COUNT(*) FROM batches WHERE run_id = ?", (watch_id,)
        ).fetchone()[0]
        host_t = [
            t
            for (t,) in store.execute(
                "SELECT t_ns FROM host_samples WHERE run_id = ? ORDER BY t_ns", (probe_id,)
            )
        ]
    gap = max((b - a for a, b in itertools.pairwise(host_t)), default=0) / 1e9
    times = ", ".join(f"{t:.0f}" for t, _ in held)
    print(f"soak: {minutes:g} min; the write lock held {len(held)} times for {lock_s:g} s "
          f"(at {times} s); store and logs in {folder}")  # fmt: skip
    for _, label, status, reason in runs:
        print(f"run {label}: {status}{f' ({reason})' if reason else ''}")
    print()
    print("| what | written | expected |")
    print("|---|---:|---:|")
    for lane, count, expected in lanes:
        print(f"| probe lane {lane}: batch rows | {count:,} | {expected:,} |")
    print(f"| watch loop: batch rows | {watch_rows:,} | {watched:,} |")
    print(f"| probe: host samples (largest gap) | {len(host_t):,} ({gap:.2f} s) | - |")
    print()
    print("| page | refreshes | median | worst |")
    print("|---|---:|---:|---:|")
    for page in ("live", "runs"):
        seconds = [t for d in dashboards for t in d["times"][page]]
        print(f"| {page} | {len(seconds)} | {statistics.median(seconds):.2f} s "
              f"| {max(seconds):.2f} s |")  # fmt: skip
    print()
    print(f"errors: {len(errors)}")
    for error in errors:
        print(f"  {error}")


if __name__ == "__main__":
    main()
