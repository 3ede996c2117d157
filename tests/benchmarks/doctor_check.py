"""Benchmark: the doctor's answer against long runs that check it.

Runs `probe doctor` with the flags given after `--`, then, on the same data, consumer and
devices, long `probe run`s (fixed length, no early stop) of your setting and of the doctor's
first recommendation, and optionally a sweep of DataLoader settings each measured for a fixed
number of batches. Prints a table: each long run's images/s against what the doctor predicted
for it, and the best of the long sweep against the recommendation. Every document is written
to `--out` (doctor.json, yours.json, recommended.json, sweep-N.json); run again with the same
`--out`, it reads what is there and measures only what is missing.

    python tests/benchmarks/doctor_check.py --out DIR [--long-s 120] [--sweep 8,12,16]
        [--sweep-batches 300] -- --gpus 0 --consumer model:resnet50 [--data DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from probe.judge.results import Session
from probe.present.doctor_tables import doctor_lines, scaling_lines
from probe.present.terminal import dali_table, scaling_table, sweep_table


def probe(out: Path, name: str, *args: str) -> tuple[dict[str, Any] | None, float, int]:
    """`python -m probe ARGS --json`: its document (saved as NAME.json), wall time, exit; a
    document saved by an earlier call into the same `--out` is read instead (wall time and
    exit read from NAME.wall), so that a check cut short goes on where it stopped."""
    saved = out / f"{name}.json"
    if saved.exists():
        wall, code = json.loads((out / f"{name}.wall").read_text())
        return json.loads(saved.read_text()), wall, code
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "probe", *args, "--json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    wall = time.monotonic() - started
    (out / f"{name}.log").write_text(result.stderr)
    if not result.stdout.strip():
        return None, wall, result.returncode
    (out / f"{name}.wall").write_text(json.dumps([wall, result.returncode]))
    saved.write_text(result.stdout)
    return json.loads(result.stdout), wall, result.returncode


def run_flags(change: dict[str, Any]) -> list[str]:
    """The `probe run` flags that make a recommendation's change."""
    value = change["value"]
    if change["knob"] == "num_workers":
        return ["--pipeline", "torch", "--workers", str(value)]
    if change["knob"] == "pipeline":
        load = value.get("hw_decoder_load")
        return ["--pipeline", "dali", "--threads", str(value["num_threads"]),
                "--decoder", value["decoder"],
                *([] if load is None else ["--hw-decoder-load", f"{load:g}"])]  # fmt: skip
    raise SystemExit(f"no probe run makes the change {change}")


def rate(document: dict[str, Any] | None) -> tuple[float | None, float | None]:
    if document is None:
        return None, None
    return document.get("images_per_s"), document.get("images_per_s_error")


def show_session(console: Console, session: Session) -> None:
    """The doctor's answer, its points and its scaling, as `probe show` prints them."""
    searched = dali_table(session)
    if searched is not None:
        console.print(searched)
    for line in doctor_lines(session):
        console.print(line, markup=False, highlight=False)
    console.print(sweep_table(session))
    if session.scaling is not None:
        console.print(scaling_table(session.scaling))
        for line in scaling_lines(session.scaling):
            console.print(line, markup=False, highlight=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--long-s", type=float, default=120.0, help="each long run's length")
    parser.add_argument("--sweep", default="", help="DataLoader settings, e.g. 8,12,16")
    parser.add_argument("--sweep-batches", type=int, default=300)
    parser.add_argument(
        "--only-recommended", action="store_true", help="a long run of the recommendation alone"
    )
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the doctor's flags")
    args = parser.parse_args()
    flags = [f for f in args.flags if f != "--"]
    args.out.mkdir(parents=True, exist_ok=True)
    # the same data, consumer and devices: all but the doctor's own flags
    common = [f for f in flags if f != "--scaling"]
    if "--budget" in common:
        at = common.index("--budget")
        del common[at : at + 2]

    doctor, doctor_s, code = probe(args.out, "doctor", "doctor", *flags)
    console = Console(width=160)
    if doctor is None or not doctor.get("recommendations"):
        console.print(f"doctor: exit {code} after {doctor_s:.0f} s, no answer")
        return
    if "--consumer" not in common:  # the doctor's default is not `probe run`'s
        common += ["--consumer", doctor["consumer"]]
    top = doctor["recommendations"][0]
    yours = next(p for p in doctor["sweep"] if p["run_id"] == doctor["verdict"]["run_id"])
    table = Table(title=f"doctor: exit {code}, {doctor_s:.0f} s wall, {doctor['elapsed_s']:.0f} "
                        f"s of its {doctor['budget_s']:g} s budget; verdict "
                        f"{doctor['verdict']['kind']}")  # fmt: skip
    for column in ("run", "setting", "images/s", "data-wait", "doctor predicted", "against it"):
        table.add_column(column, justify="right" if column != "run" else "left")

    def row(name: str, setting: str, document: dict[str, Any] | None, predicted: float) -> None:
        value, error = rate(document)
        wait = None if document is None else document.get("data_wait_frac")
        table.add_row(
            name, setting,
            "-" if value is None else f"{value:,.0f} ± {error or 0:,.0f}",
            "-" if wait is None else f"{wait:.1%}",
            f"{predicted:,.0f}",
            "-" if value is None else f"{value / predicted - 1:+.1%}",
        )  # fmt: skip

    long = ["--duration", f"{args.long_s:g}"]
    if not args.only_recommended:
        mine, _, _ = probe(args.out, "yours", "run", *common, "--workers",
                           str(yours["num_workers"]), *long)  # fmt: skip
        row(f"yours, {args.long_s:g} s", f"num_workers={yours['num_workers']}", mine,
            yours["images_per_s"])  # fmt: skip
    if top["change"]["knob"] in ("num_workers", "pipeline") and top["setting"] != (
        f"num_workers={yours['num_workers']}"
    ):
        chosen, _, _ = probe(args.out, "recommended", "run", *common,
                             *run_flags(top["change"]), *long)  # fmt: skip
        row(f"recommended, {args.long_s:g} s", top["setting"], chosen,
            top["predicted_images_per_s"])  # fmt: skip
    best: tuple[float, str] | None = None
    for value in [v for v in args.sweep.split(",") if v]:
        point, _, _ = probe(args.out, f"sweep-{value}", "run", *common, "--workers", value,
                            "--batches", str(args.sweep_batches))  # fmt: skip
        images = rate(point)[0]
        row(f"sweep, {args.sweep_batches} batches", f"num_workers={value}", point,
            top["predicted_images_per_s"])  # fmt: skip
        if images is not None and (best is None or images > best[0]):
            best = (images, f"num_workers={value}")
    console.print(table)
    console.print(f"recommendation 1: {top['setting']}: {top['action']}")
    show_session(console, Session.from_json(doctor))
    if best is not None:
        console.print(
            f"the long sweep's best: {best[1]}, {best[0]:,.0f} images/s; the recommendation's "
            f"prediction {top['predicted_images_per_s']:,.0f} is "
            f"{top['predicted_images_per_s'] / best[0] - 1:+.1%} on it"
        )


if __name__ == "__main__":
    main()
