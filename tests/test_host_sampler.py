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


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def test_lane_processes_and_their_children_are_attributed_to_the_lane() -> None:
    """What the sampler attributes to a lane meets the lane's processes' own CPU time over the
    same window, however busy the machine is with other work."""
    lane = subprocess.Popen([sys.executable, "-c", BURN_WITH_CHILD])
    try:
        sampler = HostSampler()
        sampler.lane_pids[0] = lane.pid
        main = psutil.Process(lane.pid)
        deadline = time.monotonic() + 30
        while not main.children() and time.monotonic() < deadline:
            time.sleep(0.1)  # let the child start
        (child,) = main.children()
        _, (first,) = sampler.sample()
        main_before, child_before = cpu_seconds(main), cpu_seconds(child)
        time.sleep(1.0)
        host, lanes = sampler.sample()
        main_spent = cpu_seconds(main) - main_before
        child_spent = cpu_seconds(child) - child_before
    finally:
        for process in psutil.Process(lane.pid).children(recursive=True):
            process.kill()
        lane.kill()
    (sample,) = lanes
    seconds = (sample.t_ns - first.t_ns) / 1e9
    assert sample.lane == 0
    assert sample.processes == 2
    assert main_spent > 0.05 and child_spent > 0.05  # both burned, however loaded the host
    # each read a few ms from the sampler's own reading, in clock ticks (10 ms)
    assert sample.main_cpu_pct == pytest.approx(100 * main_spent / seconds, abs=8)
    assert sample.cpu_pct == pytest.approx(100 * (main_spent + child_spent) / seconds, abs=12)
    assert len(host.per_core_pct) == psutil.cpu_count()
    host_cores = host.cpu_pct / 100 * len(host.per_core_pct)
    assert host_cores >= (main_spent + child_spent) / seconds - 0.15  # the lane is on the host
    assert host.tree_cpu_pct is not None and host.memory_used_mib is not None
    assert host.tree_cpu_pct >= sample.cpu_pct - 1
    assert host.memory_used_mib > 0
    assert host.iowait_pct is not None and host.steal_pct is not None  # Linux has both


def test_a_process_found_late_never_shows_more_cpu_than_the_host_has() -> None:
    """A lane's processes are found when the trees are read: CPU they used before that comes
    in one sample. It is spread over the following samples, at most the host's cores each,
    and none of it is lost."""
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    sampler = HostSampler(root_pid=idle.pid)  # a run whose tree does not hold the lane yet
    lane = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        process = psutil.Process(lane.pid)
        cores = psutil.cpu_count() or 1
        last, counted, shown = time.monotonic_ns(), 0.0, []
        for step in range(60):  # 10 Hz, 6 s; the lane known from 1.5 s on
            if step == 15:
                sampler.lane_pids[0] = lane.pid
            time.sleep(0.1)
            host, lanes = sampler.sample()
            if lanes:
                shown.append(lanes[0].cpu_pct)
                counted += lanes[0].cpu_pct / 100 * (host.t_ns - last) / 1e9
            last = host.t_ns
        truth = cpu_seconds(process)
    finally:
        lane.kill()
        idle.kill()
    assert max(shown) <= 100 * cores + 1
    assert counted == pytest.approx(truth, abs=0.15)


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
        host, lanes = sampler.sample()
        counted += sum(s.cpu_pct for s in lanes) / 100 * (host.t_ns - last) / 1e9
        last = host.t_ns

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


def test_a_sampler_held_up_before_it_reads_shows_no_more_than_was_used() -> None:
    """A sampler thread held up between its tick and its reading (a host whose cores are all
    busy) divides each interval's CPU by that interval: a process burning one core reads one
    core on average, and its one thread never more than 100%."""
    lane = subprocess.Popen([sys.executable, "-c", BURN])
    try:
        sampler = HostSampler()
        sampler.lane_pids[0] = lane.pid
        process = psutil.Process(lane.pid)
        time.sleep(0.3)
        _, (first,) = sampler.sample()
        before = cpu_seconds(process)
        shown, threads, last = 0.0, [], first.t_ns
        for step in range(30):
            time.sleep(0.1 + (0.15 if step % 3 == 2 else 0.0))  # held up now and then
            _, (sample,) = sampler.sample()
            shown += sample.cpu_pct / 100 * (sample.t_ns - last) / 1e9
            threads.append(sample.main_thread_cpu_pct)
            last = sample.t_ns
        truth = cpu_seconds(process) - before
    finally:
        lane.kill()
    assert truth > 0.5  # it burned, however loaded the host
    assert shown == pytest.approx(truth, abs=0.1)
    assert max(threads) <= 100.0 + 1e-6
