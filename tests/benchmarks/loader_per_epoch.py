"""`probe watch` on a script that makes its DataLoader anew each epoch (2 workers, a dataset
of 4,000 samples at 2 ms each, a 5 ms step), as Lightning's reload_dataloaders_every_n_epochs
does: the watching process's threads and CPU, every 10 s, then how each loader's run ended
after a Ctrl-C (SIGINT to the watching process):

    python tests/benchmarks/loader_per_epoch.py OUT [--seconds 150]

Prints the table and writes it, with the runs' ends, to OUT/table.txt; the store is
OUT/feedscope.db.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent("""\
    import time, torch
    from torch.utils.data import DataLoader, Dataset
    class Slow(Dataset):
        def __len__(self):
            return 4000
        def __getitem__(self, i):
            time.sleep(0.002)
            return torch.zeros(3)
    for epoch in range(10_000):
        for batch in DataLoader(Slow(), batch_size=8, num_workers=2):
            time.sleep(0.005)
    """)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=150.0)
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.py").write_text(SCRIPT)
    db = out / "feedscope.db"
    db.unlink(missing_ok=True)
    job = subprocess.Popen(
        [sys.executable, "-m", "probe", "watch", "--db", str(db), "--", "python",
         str(out / "train.py")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=out,
    )  # fmt: skip
    watching = psutil.Process(job.pid)
    rows = ["   t (s)  threads  CPU (% of a core, the last 10 s)"]
    started, cpu = time.monotonic(), watching.cpu_times()
    while time.monotonic() - started < args.seconds:
        time.sleep(10.0)
        now = watching.cpu_times()
        used = (now.user + now.system) - (cpu.user + cpu.system)
        cpu = now
        rows.append(f"{time.monotonic() - started:8.0f}  {watching.num_threads():7d}  "
                    f"{100 * used / 10.0:6.0f}")  # fmt: skip
        print(rows[-1], flush=True)
    stopped = time.monotonic()
    job.send_signal(signal.SIGINT)
    _, stderr = job.communicate(timeout=600)
    rows.append(f"exit {job.returncode}, {time.monotonic() - stopped:.1f} s after the Ctrl-C")

    sys.path.insert(0, str(ROOT))
    from probe.store.db import Store

    with Store(db) as store:
        ends = collections.Counter(
            (lane.status.value, lane.reason) for run in store.runs()
            for lane in store.lanes(run.run_id)
        )  # fmt: skip
    rows.append(f"{sum(ends.values())} loaders' runs, ended:")
    rows += [f"  {count:4d}  {status}: {reason or '-'}" for (status, reason), count in
             ends.most_common()]  # fmt: skip
    warned = [line for line in stderr.splitlines() if "recording stopped" in line]
    rows += [f"warned: {line.strip()}" for line in warned[:3]]
    (out / "table.txt").write_text("\n".join(rows) + "\n")
    print("\n".join(rows[-len(ends) - 2 - len(warned[:3]) :]))


if __name__ == "__main__":
    main()
