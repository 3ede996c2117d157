"""A torchrun probe of one rank per GPU, faulted mid-run, as a table: the fault, how long after it
the launcher ended, the run's status and reason, and each lane's status and measured batches.

    python tests/benchmarks/rank_faults.py --data DIR --out OUT [--ranks 2] [PROBE FLAGS...]

Faults: SIGKILL to rank 1 once every rank measured --after batches, then SIGTERM to torchrun.
Each case's store, stderr and `probe show --json` go under OUT/CASE/.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from probe.store.spool import spool_dir


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--after", type=int, default=30, help="batches each rank measures first")
    args, flags = parser.parse_known_args()
    rows = [fault(args, flags, case) for case in ("kill-rank-1", "term-torchrun")]
    print(f"{'case':<14} {'ended after':>11}  {'status':<11} lanes (status, batches); reason")
    for row in rows:
        print(f"{row['case']:<14} {row['ended_after_s']:>9.1f} s  {row['status']:<11} "
              f"{row['lanes']}; {row['reason']}")  # fmt: skip
    (args.out / "rank_faults.json").write_text(json.dumps(rows, indent=1))
    return 0


def fault(args: argparse.Namespace, flags: list[str], case: str) -> dict[str, object]:
    out = args.out / case
    (out / "tmp").mkdir(parents=True)
    db = out / "store.db"
    env = {**os.environ, "TMPDIR": str(out / "tmp")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc-per-node={args.ranks}", "-m", "probe", "run", "--data", args.data,
               "--duration", "300", "--db", str(db), *flags]  # fmt: skip
    with (out / "stderr.txt").open("w") as stderr:
        job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                               start_new_session=True)  # fmt: skip
        pids = measuring(db, args.ranks, args.after)
        faulted = time.monotonic()
        if case == "kill-rank-1":
            os.kill(pids[1], signal.SIGKILL)
        else:
            job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
    took = time.monotonic() - faulted
    shown = subprocess.run([sys.executable, "-m", "probe", "show", "last", "--db", str(db),
                            "--json"], capture_output=True, text=True, check=False)  # fmt: skip
    (out / "show.json").write_text(shown.stdout)
    document = json.loads(shown.stdout)
    left = sorted(p.name for p in (out / "tmp").iterdir() if not p.name.startswith("torchelastic_"))
    return {
        "case": case, "ended_after_s": took, "torchrun_exit": job.returncode,
        "status": document["status"], "reason": document["reason"],
        "lanes": [(x["lane"], x["status"], x["batches"]) for x in document["lanes"]],
        "spools_left": spool_dir(db).exists(), "tmp_left": left,
        "line": [x for x in (out / "stderr.txt").read_text().splitlines() if x.startswith("run ")],
    }  # fmt: skip


def measuring(db: Path, ranks: int, batches: int, timeout: float = 400) -> list[int]:
    """Once every rank's spool holds `batches` batches: the ranks' process ids."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        spools = sorted(spool_dir(db).glob("*.rank*.db")) if spool_dir(db).is_dir() else []
        try:
            found = [_spool(path) for path in spools]
        except (sqlite3.Error, ValueError):  # not written yet
            found = []
        if len(found) == ranks and all(count >= batches for _, count in found):
            return [pid for pid, _ in found]
        time.sleep(0.5)
    raise SystemExit(f"the ranks did not measure {batches} batches each in {timeout:.0f} s")


def _spool(path: Path) -> tuple[int, int]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as spool:
        [(pid,)] = spool.execute("SELECT pid FROM runs").fetchall()
        [(count,)] = spool.execute("SELECT COUNT(*) FROM batches WHERE NOT warmup").fetchall()
    return int(pid), int(count)


if __name__ == "__main__":
    sys.exit(main())
