"""A busy host is other processes' CPU on the cores the run may use: the run's own processes
(kept workers, workers started anew each epoch, its threads) are never others, and load on the
machine's other cores is context, not a reason to distrust the figures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import photo_folder, probe_cli
from probe.judge.diagnosis import diagnose_run
from probe.judge.facts import host_load, run_facts
from probe.judge.thresholds import OTHER_LOAD_MIN_CORES
from probe.measure.samplers.host import HostSampler
from probe.store.db import Store

BURN = "while True: pass"


def machine(cores: int, affinity: int | None = None, quota: float | None = None) -> dict[str, Any]:
    """A run's host description, as `describe_host` writes it."""
    usable = min(x for x in (cores, affinity, quota) if x is not None)
    return {"cpus": int(usable), "cpu_cores_total": cores,
            "cpu_limits": {"machine": cores, "affinity": affinity, "quota": quota,
                           "cores": usable}}  # fmt: skip


def test_load_on_the_machines_other_cores_is_context_not_the_runs() -> None:
    """A job held to 4 of 32 cores while other jobs keep 12 of the rest busy: nothing taken from
    it; the same job with 2 of its own 4 cores taken is busy."""
    quiet = host_load({"cpu_pct": 50.0, "job_cpu_pct": 100.0, "tree_cpu_pct": 395.0},
                      machine(32, affinity=4))  # fmt: skip
    assert quiet.other_cores == pytest.approx(0.05)
    assert quiet.elsewhere_cores == pytest.approx(12.0)
    assert (quiet.job_cores, quiet.machine_cores, quiet.cpu_pct) == (4, 32, 100.0)
    taken = host_load({"cpu_pct": 50.0, "job_cpu_pct": 100.0, "tree_cpu_pct": 200.0},
                      machine(32, affinity=4))  # fmt: skip
    assert taken.other_cores == pytest.approx(2.0)


def test_a_quota_below_the_runs_cores_leaves_the_rest_to_others() -> None:
    """A container of 2 cores' quota on 8 cores: others may use 6 of them without taking any of
    the run's; beyond that, what they take counts."""
    assert host_load({"cpu_pct": 87.5, "tree_cpu_pct": 200.0},
                     machine(8, quota=2.0)).other_cores == 0.0  # fmt: skip
    assert host_load({"cpu_pct": 100.0, "tree_cpu_pct": 100.0},
                     machine(8, quota=2.0)).other_cores == pytest.approx(1.0)  # fmt: skip


def test_a_store_without_the_runs_own_cores_knows_others_only_on_the_whole_machine() -> None:
    """Samples from before the run's own cores were read: where the run had every core, the
    machine's busy share is its own; where it had some, others' share on them is not known."""
    whole = host_load({"cpu_pct": 100.0, "tree_cpu_pct": 150.0}, machine(2))
    assert whole.other_cores == pytest.approx(0.5) and whole.cpu_pct == 100.0
    some = host_load({"cpu_pct": 100.0, "tree_cpu_pct": 150.0}, machine(4, affinity=2))
    assert some.other_cores is None and some.cpu_pct is None


def test_a_new_child_of_the_run_is_in_its_tree_at_the_next_sample() -> None:
    """The run's tree gains a process within a sample, not at the next once-a-second reading:
    its CPU is shown where it ran, not as other processes'."""
    script = textwrap.dedent(
        f"""
        import subprocess, sys
        sys.stdin.readline()
        subprocess.Popen([sys.executable, "-c", {BURN!r}]).wait()
        """
    )
    root = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, text=True)
    try:
        sampler = HostSampler(root_pid=root.pid)
        first, _ = sampler.sample()  # the trees read now: the next reading is a second away
        assert first.tree_processes == 1
        assert root.stdin is not None
        root.stdin.write("\n")
        root.stdin.flush()
        deadline = time.monotonic() + 10
        while not psutil.Process(root.pid).children() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        host, _ = sampler.sample()
        assert (host.t_ns - first.t_ns) / 1e9 < 0.9  # before the trees' next reading is due
        assert host.tree_processes == 2
        assert host.tree_cpu_pct is not None and host.tree_cpu_pct > 20  # the child's burn
    finally:
        for process in psutil.Process(root.pid).children(recursive=True):
            process.kill()
        root.kill()
        root.wait()


WATCHED = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    import torch
    from PIL import Image
    from pathlib import Path

    class Photos(torch.utils.data.Dataset):
        def __init__(self, root):
            self.files = sorted(Path(root).glob("*/*.jpg"))
        def __len__(self):
            return len(self.files)
        def __getitem__(self, index):
            with Image.open(self.files[index]) as image:
                pixels = np.asarray(image.convert("RGB").resize((96, 96)))
            return torch.from_numpy(pixels.copy()).permute(2, 0, 1).float() / 255, 0

    loader = torch.utils.data.DataLoader(Photos(sys.argv[1]), batch_size=8, shuffle=True,
                                         num_workers=2, persistent_workers=sys.argv[2] == "kept")
    for epoch in range(4):
        for images, labels in loader:
            time.sleep(0.002)
    """
)


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """160 photo-like JPEGs of 480 x 360 px in 2 classes: a loader that keeps 2 workers busy."""
    return photo_folder(tmp_path_factory.mktemp("photos"), [(480, 360)] * 80, classes=2)


@pytest.mark.parametrize("workers", ["kept", "started anew each epoch"])
def test_a_watched_loader_on_an_idle_machine_is_not_busy(
    tmp_path: Path, photos: Path, workers: str
) -> None:
    """Its workers (kept between epochs, or started at each), its pin-memory and feedscope's
    own threads are the job's: on an idle machine no other process takes its CPU."""
    script = tmp_path / "train.py"
    script.write_text(WATCHED)
    db = tmp_path / "s.db"
    result = probe_cli("watch", "--db", db, "--", sys.executable, script, photos,
                       workers.split(maxsplit=1)[0], timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr
    with Store(db) as store:
        (run,) = store.runs()
        (facts,) = run_facts(store, run.run_id)
        verdict = diagnose_run(store, run.run_id).verdict
    assert facts.figures.batches >= 60
    assert facts.host.cpu_pct is not None and facts.host.cpu_pct > 50  # the loader kept it busy
    assert facts.host.other_cores is not None
    assert facts.host.other_cores < OTHER_LOAD_MIN_CORES, facts.host
    assert not facts.host_busy and verdict.reliable
    assert "busy" not in result.stderr.split("feedscope:", 1)[-1].split("\n")[0], result.stderr


def burner(core: int) -> subprocess.Popen[bytes]:
    """A process that keeps core `core` busy."""
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.skip("taskset is not installed (util-linux)")
    return subprocess.Popen([taskset, "-c", str(core), sys.executable, "-c", BURN])


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two cores")
@pytest.mark.parametrize(("burned", "busy"), [(1, False), (0, True)])
def test_a_probe_held_to_core_0_is_busy_only_where_another_process_burns_core_0(
    tmp_path: Path, photos: Path, burned: int, busy: bool
) -> None:
    """A probe held to core 0 (`--cores 0`) beside a process burning core 1 gives its answer; the
    burner on core 0 takes half of its core, and the probe says so."""
    hot = burner(burned)
    try:
        time.sleep(0.5)
        result = probe_cli(
            "run", "--gpus", "none", "--data", photos, "--cores", "0", "--workers", "1",
            "--batch-size", "8", "--image-size", "96", "--consumer", "sleep:5",
            "--duration", "6", "--json", "--db", tmp_path / "s.db", timeout=300,
        )  # fmt: skip
    finally:
        hot.kill()
        hot.wait()
    assert result.returncode == 0, result.stderr
    with Store(tmp_path / "s.db") as store:
        (run,) = store.runs()
        (facts,) = run_facts(store, run.run_id)
    assert facts.host.job_cores == 1 and facts.host.machine_cores == os.cpu_count()
    assert facts.host_busy is busy, facts.host
    if busy:
        assert facts.host.other_cores is not None and facts.host.other_cores >= 0.25
    else:
        assert facts.host.elsewhere_cores is not None and facts.host.elsewhere_cores > 0.7
