"""What the host really allows a run: CPU limits read from fake cgroup trees (v1 and v2, nested
quotas, unreadable files), and for real under `taskset` and in a cgroup made for the test; the
cgroup's throttling counters, free shared memory; the lane figures the host sampler reads once a
second (PSS, a worker's threads), and how the store keeps them.
"""

from __future__ import annotations

import math
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from helpers import probe_cli
from pipelines import (
    CpuLimits,
    InputError,
    Throttling,
    available_cpus,
    cpu_limits,
    cpu_set_text,
    cpu_throttling,
    parse_cpu_set,
    shm_free_mib,
)
from probe.measure.samplers.host import HostSampler
from probe.present.options import ran_on_cores
from probe.records import LaneCpuSample, LaneRecord, RunRecord, RunStatus
from probe.store.db import Store
from probe.store.schema import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
MACHINE = os.cpu_count() or 1
AFFINITY = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
PRINT_CORES = "from pipelines import cpu_limits; print(cpu_limits().cores)"


def tree(tmp_path: Path, cgroup: str, files: dict[str, str]) -> tuple[str, str]:
    """A fake cgroup mount under `tmp_path` holding `files` (path under the mount -> text),
    and a /proc/self/cgroup file saying `cgroup`; returns (root, proc_cgroup)."""
    root = tmp_path / "cgroup"
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(cgroup)
    return str(root), str(proc)


def test_v2_quota_of_the_process_cgroup(tmp_path: Path) -> None:
    root, proc = tree(
        tmp_path,
        "0::/kubepods/pod1\n",
        {"kubepods/pod1/cpu.max": "150000 100000\n", "kubepods/cpu.max": "max 100000\n"},
    )
    limits = cpu_limits(root, proc)
    assert limits.quota == 1.5
    assert limits.source == f"{root}/kubepods/pod1/cpu.max"
    assert limits.unknown == ()
    assert limits.machine == MACHINE and limits.affinity == AFFINITY
    assert limits.cores == min(1.5, MACHINE, AFFINITY or MACHINE)


def test_v2_without_a_quota(tmp_path: Path) -> None:
    root, proc = tree(tmp_path, "0::/a\n", {"a/cpu.max": "max 100000\n", "cpu.stat": "x 1\n"})
    limits = cpu_limits(root, proc)
    assert (limits.quota, limits.source, limits.unknown) == (None, None, ())
    assert limits.cores == min(MACHINE, AFFINITY or MACHINE)


def test_a_parents_smaller_quota_binds_v2(tmp_path: Path) -> None:
    root, proc = tree(
        tmp_path,
        "0::/job/step\n",
        {"job/step/cpu.max": "400000 100000\n", "job/cpu.max": "50000 100000\n"},
    )
    limits = cpu_limits(root, proc)
    assert limits.quota == 0.5
    assert limits.source == f"{root}/job/cpu.max"
    assert limits.cores == 0.5


def test_v1_quota_nested_parent_smaller(tmp_path: Path) -> None:
    root, proc = tree(
        tmp_path,
        "4:memory:/docker/c1\n3:cpu,cpuacct:/docker/c1\n0::/\n",
        {
            "cpu,cpuacct/docker/c1/cpu.cfs_quota_us": "400000\n",
            "cpu,cpuacct/docker/c1/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/docker/cpu.cfs_quota_us": "150000\n",
            "cpu,cpuacct/docker/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    limits = cpu_limits(root, proc)
    assert limits.quota == 1.5
    assert limits.source == f"{root}/cpu,cpuacct/docker/cpu.cfs_quota_us"
    assert limits.unknown == ()


def test_v1_without_a_quota_as_on_this_kind_of_host(tmp_path: Path) -> None:
    """A hybrid host: v1 controllers, each at its own mount, and the v2 line of an unused
    unified hierarchy."""
    root, proc = tree(
        tmp_path,
        "4:memory:/process_api/x\n2:cpuacct:/\n1:cpu:/\n0::/\n",
        {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"},
    )
    limits = cpu_limits(root, proc)
    assert (limits.quota, limits.unknown) == (None, ())


def test_a_namespaced_path_falls_back_to_the_mounts_own_files(tmp_path: Path) -> None:
    """In a container the cgroup path names the host's hierarchy, which is not under the
    container's mount: the mount's own files are the container's cgroup."""
    root, proc = tree(
        tmp_path, "0::/process_api/6b27897c\n", {"cpu.max": "200000 100000\n", "cpu.stat": ""}
    )
    limits = cpu_limits(root, proc)
    assert limits.quota == 2.0
    assert limits.source == f"{root}/cpu.max"


def test_no_cgroup_list_means_no_quota_not_an_error(tmp_path: Path) -> None:
    limits = cpu_limits(str(tmp_path), str(tmp_path / "absent"))
    assert (limits.quota, limits.source, limits.unknown) == (None, None, ())


def test_a_folder_in_place_of_the_quota_file_is_unknown_not_an_error(tmp_path: Path) -> None:
    root, proc = tree(tmp_path, "0::/a\n", {"cpu.max": "300000 100000\n"})
    (Path(root) / "a" / "cpu.max").mkdir(parents=True)
    limits = cpu_limits(root, proc)
    because = f"{root}/a/cpu.max: Is a directory"
    assert limits.unknown == (f"cgroup CPU quota unknown, because {because}",)
    assert limits.quota == 3.0  # what could be read still counts


def test_a_quota_file_of_nonsense_is_unknown_not_an_error(tmp_path: Path) -> None:
    root, proc = tree(
        tmp_path,
        "1:cpu:/a\n",
        {"cpu/a/cpu.cfs_quota_us": "lots\n", "cpu/a/cpu.cfs_period_us": "100000\n"},
    )
    limits = cpu_limits(root, proc)
    assert limits.quota is None
    assert limits.unknown == (
        f"cgroup CPU quota unknown, because {root}/cpu/a/cpu.cfs_quota_us holds 'lots', "
        "not a number",
    )


def test_an_unreadable_quota_file_is_unknown_not_an_error(tmp_path: Path) -> None:
    root, proc = tree(tmp_path, "0::/a\n", {"a/cpu.max": "100000 100000\n"})
    quota_file = Path(root) / "a" / "cpu.max"
    quota_file.chmod(0)
    try:
        try:
            quota_file.read_text()
        except PermissionError:
            pass
        else:
            pytest.skip("this user (root) reads a file of mode 000")
        limits = cpu_limits(root, proc)
    finally:
        quota_file.chmod(0o644)
    assert limits.quota is None
    assert limits.unknown == (f"cgroup CPU quota unknown, because {quota_file}: Permission denied",)


def test_an_unreadable_cgroup_list_is_unknown_not_an_error(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    limits = cpu_limits(str(tmp_path), str(tmp_path / "proc"))
    assert limits.unknown == (
        f"cgroup CPU quota unknown, because {tmp_path / 'proc'}: Is a directory",
    )


def test_cores_text_and_json() -> None:
    quota = CpuLimits(machine=64, affinity=64, quota=8.0, source="/sys/fs/cgroup/cpu.max")
    assert quota.cores == 8.0
    assert quota.text == "8 cores (cgroup quota 8.0 of the machine's 64)"
    pinned = CpuLimits(machine=2, affinity=1, quota=None, source=None)
    assert pinned.text == "1 core (affinity: 1 of the machine's 2)"
    assert CpuLimits(machine=2, affinity=2, quota=None, source=None).text == "2 cores"
    both = CpuLimits(machine=64, affinity=4, quota=1.5, source="q")
    assert both.text == "1.5 cores (cgroup quota 1.5 of the machine's 64; affinity: 4)"
    unknown = CpuLimits(2, None, None, None, ("cgroup CPU quota unknown, because x: y",))
    assert unknown.cores == 2
    for limits in (quota, pinned, both, unknown):
        assert CpuLimits.from_json(limits.to_json()) == limits
    assert quota.to_json()["cores"] == 8.0
    assert CpuLimits.from_json({}) == CpuLimits(1, None, None, None, ())
    assert CpuLimits.from_json({"cores": 3.5}).machine == 4


def test_available_cpus_are_the_whole_cores_of_the_limits() -> None:
    assert available_cpus() == max(1, math.floor(cpu_limits().cores))


def test_throttling_v2_v1_and_their_difference(tmp_path: Path) -> None:
    stat_v2 = "usage_usec 9\nnr_periods 10\nnr_throttled 3\nthrottled_usec 250000\n"
    root, proc = tree(tmp_path / "v2", "0::/a\n", {"a/cpu.stat": stat_v2})
    before = cpu_throttling(root, proc)
    assert before == Throttling(10, 3, 0.25)
    (Path(root) / "a" / "cpu.stat").write_text(
        "nr_periods 30\nnr_throttled 13\nthrottled_usec 1250000\n"
    )
    after = cpu_throttling(root, proc)
    assert after is not None
    assert after - before == Throttling(20, 10, 1.0)
    assert (after - before).throttled_share == 0.5
    assert Throttling(0, 0, 0.0).throttled_share is None

    stat_v1 = "nr_periods 4\nnr_throttled 1\nthrottled_time 2000000000\n"
    root, proc = tree(tmp_path / "v1", "2:cpu,cpuacct:/\n", {"cpu,cpuacct/cpu.stat": stat_v1})
    assert cpu_throttling(root, proc) == Throttling(4, 1, 2.0)


def test_throttling_is_read_where_the_quota_binds(tmp_path: Path) -> None:
    """A parent's quota throttles its children; its own counters say so, not theirs."""
    root, proc = tree(
        tmp_path,
        "0::/job/step\n",
        {
            "job/cpu.max": "100000 100000\n",
            "job/cpu.stat": "nr_periods 50\nnr_throttled 20\nthrottled_usec 3000000\n",
            "job/step/cpu.max": "max 100000\n",
            "job/step/cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
        },
    )
    assert cpu_throttling(root, proc) == Throttling(50, 20, 3.0)


def test_throttling_of_a_cgroup_without_the_cpu_controller_is_its_nearest_ancestors(
    tmp_path: Path,
) -> None:
    """As on a host whose process's cgroup has only the memory controller: its `cpu.stat` has
    usage but no bandwidth counters, its parent's has them."""
    root, proc = tree(
        tmp_path,
        "0::/process_api/a1\n",
        {
            "process_api/a1/cpu.stat": "usage_usec 5\nuser_usec 4\n",
            "process_api/cpu.max": "max 100000\n",
            "process_api/cpu.stat": "usage_usec 9\nnr_periods 7\nnr_throttled 0\n"
            "throttled_usec 0\n",
        },
    )
    assert cpu_throttling(root, proc) == Throttling(7, 0, 0.0)


def test_no_throttling_counters(tmp_path: Path) -> None:
    root, proc = tree(tmp_path, "0::/\n", {"cpu.stat": "usage_usec 5\nuser_usec 4\n"})
    assert cpu_throttling(root, proc) is None  # a root cgroup: usage, no bandwidth counters
    root, proc = tree(tmp_path / "none", "0::/\n", {})
    assert cpu_throttling(root, proc) is None
    (Path(root) / "cpu.stat").mkdir()
    assert cpu_throttling(root, proc) is None  # unreadable
    assert cpu_throttling(str(tmp_path), str(tmp_path / "absent")) is None


def test_shm_free_mib(tmp_path: Path) -> None:
    free = shm_free_mib(str(tmp_path))
    assert free is not None
    assert free == pytest.approx(shutil.disk_usage(tmp_path).free / 2**20, rel=0.01)
    assert shm_free_mib(str(tmp_path / "absent")) is None


def test_one_core_under_taskset() -> None:
    taskset = shutil.which("taskset")
    if taskset is None:
        pytest.skip("taskset is not installed (util-linux)")
    out = subprocess.run(
        [taskset, "-c", "0", sys.executable, "-c", PRINT_CORES],
        cwd=ROOT, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert float(out.stdout) == 1.0


def _make_quota_cgroup(name: str) -> tuple[Path, str]:
    """A cgroup with a quota of one core, and the file a pid is written to to move it in:
    under v1's cpu mount, else under the v2 mount. Skips where neither can be made."""
    why = []
    for mount, version in ((Path("/sys/fs/cgroup/cpu"), 1), (Path("/sys/fs/cgroup"), 2)):
        if version == 1 and not (mount / "cpu.cfs_quota_us").exists():
            why.append(f"{mount}: no v1 cpu controller")
            continue
        if version == 2 and "cpu" not in _read(mount / "cgroup.subtree_control").split():
            why.append(f"{mount}: no v2 cpu controller for its children")
            continue
        folder = mount / name
        try:
            folder.mkdir()
        except OSError as error:
            why.append(f"{folder}: {error.strerror}")
            continue
        try:
            if version == 1:
                (folder / "cpu.cfs_period_us").write_text("100000")
                (folder / "cpu.cfs_quota_us").write_text("100000")
                return folder, str(folder / "tasks")
            (folder / "cpu.max").write_text("100000 100000")
            return folder, str(folder / "cgroup.procs")
        except OSError as error:
            why.append(f"{folder}: {error.strerror}")
            folder.rmdir()
    pytest.skip(f"cannot make a cgroup with a CPU quota here ({'; '.join(why)})")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def test_one_core_in_a_cgroup_with_a_quota_of_one_core() -> None:
    if os.geteuid() != 0:
        pytest.skip("making a cgroup takes root")
    folder, procs = _make_quota_cgroup(f"feedscope-test-{os.getpid()}")
    try:
        out = subprocess.run(
            ["sh", "-c", f'echo $$ > {procs} && exec "$0" -c "$1"', sys.executable, PRINT_CORES],
            cwd=ROOT, capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        folder.rmdir()  # empty once the child ended
    assert float(out.stdout) == 1.0
    assert not folder.exists()


# a lane process with one child (a worker) that starts 3 threads beside its own, each hashing
# without end (hashlib lets go of the GIL: they run at once), while its own thread sleeps
WORKER = (
    "import hashlib, threading, time\n"
    "def burn():\n"
    "    data = bytes(1 << 22)\n"
    "    while True:\n"
    "        hashlib.sha256(data).digest()\n"
    "for _ in range(3):\n"
    "    threading.Thread(target=burn, daemon=True).start()\n"
    "time.sleep(60)\n"
)
LANE_WITH_WORKER = (
    f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {WORKER!r}])\n"
    "time.sleep(60)\n"
)


def test_the_sampler_reads_a_lanes_pss_and_its_workers_busy_threads() -> None:
    lane = subprocess.Popen([sys.executable, "-c", LANE_WITH_WORKER])
    alone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        root = psutil.Process(lane.pid)
        deadline = time.monotonic() + 60  # a busy machine starts them slowly
        while time.monotonic() < deadline:
            children = root.children()
            if children and children[0].num_threads() >= 4:
                break
            time.sleep(0.05)
        sampler = HostSampler()
        sampler.lane_pids.update({0: lane.pid, 1: alone.pid})
        _, first = sampler.sample()
        _, between = sampler.sample()  # before the next slow refresh
        time.sleep(1.5)
        _, later = sampler.sample()  # a refresh: threads' CPU since the first
    finally:
        for process in psutil.Process(lane.pid).children(recursive=True):
            process.kill()
        lane.kill()
        alone.kill()
    with_worker, without = first
    assert with_worker.processes == 2
    assert with_worker.worker_threads is None  # busy needs two readings
    assert later[0].worker_threads == 3  # the hashing threads; the sleeping one is not busy
    assert with_worker.pss_mib is not None and without.pss_mib is not None
    assert 0 < without.pss_mib < with_worker.pss_mib  # one python, then two
    assert without.worker_threads is None and later[1].worker_threads is None  # no children
    assert [(s.pss_mib, s.worker_threads) for s in between] == [
        (s.pss_mib, s.worker_threads) for s in first
    ]
    assert [u for u in sampler.unavailable() if u.metric == "pss_mib"] == []


def run_record(run_id: str) -> RunRecord:
    return RunRecord(
        run_id=run_id, kind="probe", created="2026-11-21T10:00:00Z", status=RunStatus.RUNNING,
        reason=None, pipeline="torch", consumer="none", label=None, config={}, host={},
        hostname="here", pid=None, started_ns=0, ended_ns=None,
    )  # fmt: skip


def test_the_store_keeps_pss_and_worker_threads(tmp_path: Path) -> None:
    samples = [
        LaneCpuSample(5, 0, 150.0, 90.0, 80.0, 3, 20, pss_mib=812.5, worker_threads=4),
        LaneCpuSample(6, 0, 150.0, 90.0, 80.0, 3, 20),
    ]
    with Store(tmp_path / "s.db") as store:
        store.create_run(run_record("r1"), [])
        store.add_lane_cpu("r1", samples)
        assert store.lane_cpu("r1") == samples


def test_a_schema_5_store_gains_the_lane_memory_columns(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with Store(path) as store:  # a store as schema 5 made it: lane_cpu without the columns
        store.create_run(run_record("old"), [LaneRecord(
            "old", 0, None, None, 0, 1, "here", None, RunStatus.COMPLETED, None, None
        )])  # fmt: skip
    old = sqlite3.connect(path)
    old.executescript(
        """
        DROP TABLE lane_cpu;
        CREATE TABLE lane_cpu (run_id TEXT NOT NULL, lane INTEGER NOT NULL,
            t_ns INTEGER NOT NULL, cpu_pct REAL NOT NULL, main_cpu_pct REAL NOT NULL,
            main_thread_cpu_pct REAL NOT NULL, processes INTEGER NOT NULL,
            threads INTEGER NOT NULL, PRIMARY KEY (run_id, lane, t_ns)) WITHOUT ROWID;
        INSERT INTO lane_cpu VALUES ('old', 0, 5, 150.0, 90.0, 80.0, 3, 20);
        UPDATE meta SET value = '5' WHERE key = 'schema_version';
        """
    )
    old.close()
    with Store(path) as store:
        assert store.lane_cpu("old") == [LaneCpuSample(5, 0, 150.0, 90.0, 80.0, 3, 20)]
        store.add_lane_cpu("old", [LaneCpuSample(6, 0, 1.0, 1.0, 1.0, 2, 9, 100.0, 5)])
        assert [(s.pss_mib, s.worker_threads) for s in store.lane_cpu("old")] == [
            (None, None),
            (100.0, 5),
        ]
    version = sqlite3.connect(path).execute("SELECT value FROM meta").fetchone()[0]
    assert int(version) == SCHEMA_VERSION == 10


def test_cores_are_read_and_written_as_taskset_lists_them() -> None:
    assert cpu_set_text([3, 0, 1, 2, 8, 10, 11]) == "0-3,8,10-11"
    assert parse_cpu_set("0-3,8,10-11") == frozenset({0, 1, 2, 3, 8, 10, 11})
    assert parse_cpu_set(" 5 ") == frozenset({5})
    for bad in ("", "a", "3-1", "-2", "0-"):
        with pytest.raises(InputError, match="--cores takes cores as taskset lists them"):
            parse_cpu_set(bad)
    limits = cpu_limits()
    if AFFINITY is not None:
        assert limits.cpu_set == cpu_set_text(os.sched_getaffinity(0))
    assert CpuLimits.from_json(limits.to_json()) == limits


def test_a_run_kept_to_fewer_cores_than_its_machine_is_copied_by_them() -> None:
    """`--like` copies the cores a run's affinity kept it to, where fewer than its machine's."""
    narrow = CpuLimits(machine=32, affinity=16, quota=None, source=None, cpu_set="0-15")
    assert ran_on_cores({"cpu_limits": narrow.to_json()}) == "0-15"
    whole = CpuLimits(machine=32, affinity=32, quota=None, source=None, cpu_set="0-31")
    assert ran_on_cores({"cpu_limits": whole.to_json()}) is None
    assert ran_on_cores({}) is None  # recorded before the cores were


@pytest.mark.skipif(AFFINITY is None, reason="no CPU affinity on this platform")
def test_cores_this_process_may_not_use_are_one_line_and_exit_2(tmp_path: Path) -> None:
    beyond = max(os.sched_getaffinity(0)) + 1
    result = probe_cli("run", "--gpus", "none", "--cores", f"0,{beyond}", "--db",
                       tmp_path / "s.db")  # fmt: skip
    assert result.returncode == 2 and not result.stdout
    assert result.stderr.strip().splitlines() == [
        f"error: --cores 0,{beyond}: cores {beyond} are not this process's to use (it may use "
        f"{cpu_set_text(os.sched_getaffinity(0))})"
    ]
