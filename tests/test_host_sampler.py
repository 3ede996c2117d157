"""The host sampler, for real: per-core CPU, and CPU attributed to the processes of each lane."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from probe.measure.samplers.host import HostSampler, host_facts

BURN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
# a process that burns one core itself and starts a child that burns another
BURN_WITH_CHILD = (
    f"import subprocess, sys\nchild = subprocess.Popen([sys.executable, '-c', {BURN!r}])\n" + BURN
)


def test_lane_processes_and_their_children_are_attributed_to_the_lane() -> None:
    lane = subprocess.Popen([sys.executable, "-c", BURN_WITH_CHILD])
    try:
        sampler = HostSampler()
        sampler.lane_pids[0] = lane.pid
        time.sleep(1.0)  # let the child start
        sampler.sample(time.monotonic_ns())
        time.sleep(1.0)
        host, lanes = sampler.sample(time.monotonic_ns())
    finally:
        for process in psutil.Process(lane.pid).children(recursive=True):
            process.kill()
        lane.kill()
    (sample,) = lanes
    assert sample.lane == 0
    assert sample.processes == 2
    assert 60 <= sample.main_cpu_pct <= 110  # the lane process: one busy core
    assert 60 <= sample.main_thread_cpu_pct <= 110
    assert sample.cpu_pct >= sample.main_cpu_pct + 40  # its child burns too (2 cores here)
    assert len(host.per_core_pct) == psutil.cpu_count()
    assert host.cpu_pct / 100 * len(host.per_core_pct) > 1.2  # two busy processes, in cores
    assert host.tree_cpu_pct is not None and host.memory_used_mib is not None
    assert host.tree_cpu_pct >= sample.cpu_pct - 1
    assert host.memory_used_mib > 0
    assert host.iowait_pct is not None and host.steal_pct is not None  # Linux has both


def test_host_facts() -> None:
    facts = host_facts()
    assert facts["cpu_cores_total"] == psutil.cpu_count()
    assert facts["memory_mib"] > 100


# a process that starts short-lived children one after another, each burning 0.3 s of CPU
CHURN = (
    "import subprocess, sys, time\n"
    "burn = 'import time\\nend = time.process_time() + 0.3\\n'\n"
    "burn += 'while time.process_time() < end: pass'\n"
    "for _ in range(8):\n"
    "    subprocess.run([sys.executable, '-c', burn])\n"
    "time.sleep(30)\n"
)


def test_children_that_end_between_readings_are_counted_once() -> None:
    """Workers started anew each epoch live shorter than the trees are read (once a second):
    they are counted once, whether they were seen running or not."""
    sampler = HostSampler()
    lane = subprocess.Popen([sys.executable, "-c", CHURN])
    counted, last = 0.0, time.monotonic_ns()

    def read() -> None:
        nonlocal counted, last
        time.sleep(0.1)
        now = time.monotonic_ns()
        _, lanes = sampler.sample(now)
        counted += sum(s.cpu_pct for s in lanes) / 100 * (now - last) / 1e9
        last = now

    try:
        sampler.lane_pids[0] = lane.pid
        root = psutil.Process(lane.pid)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            read()
            times = root.cpu_times()
            if times.children_user + times.children_system >= 8 * 0.3 and not root.children():
                break
        for _ in range(3):  # what ended last reaches the counters at the next readings
            read()
        times = root.cpu_times()
        truth = times.user + times.system + times.children_user + times.children_system
    finally:
        lane.kill()
    assert truth >= 8 * 0.3
    assert counted == pytest.approx(truth, rel=0.1)
