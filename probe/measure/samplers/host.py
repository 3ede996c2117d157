"""Host samples from psutil: CPU per core, iowait, steal, disk reads, memory, and the run's
processes (each lane's process, its threads and its DataLoader workers, their memory).

CPU figures are differences of cumulative counters between two samples, so every sample covers
the interval since the previous one. A core's busy share leaves out idle, iowait and steal: steal
is time the hypervisor gave this machine's CPUs to someone else, which a virtual machine shows as
cores that are there but do less work.

The run's processes are read as a tree from its root, and a process that joins it (a DataLoader
starts its workers anew each epoch) is counted from the sample it started in: each sample looks
for new processes where the kernel made any since the last (the last process id
`/proc/loadavg` gives), through the cheap `/proc/PID/task/TID/children` lists. Found a second
late instead, a new worker's first second would come in one sample, more than the cores had,
and on a saturated host never be shown: the busy cores it used would read as other processes'.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from pipelines import cpu_limits, own_cores
from probe.records import HostSample, LaneCpuSample, Unavailable

SLOW_REFRESH_NS = 1_000_000_000  # process trees, thread counts, disk and memory: once a second
BUSY_THREAD_SHARE = 0.10  # a thread using this share of a core or more is busy
CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass
class _Tree:
    """A process and its descendants, as last read (once a second)."""

    root_pid: int
    members: list[psutil.Process]
    threads: int
    pss_mib: float | None = None  # the members' PSS together (lanes' trees only)
    worker_threads: int | None = None  # the most busy threads of one member but the root


class HostSampler:
    """Samples the host; `lane_pids` (lane -> process id) says which processes are whose."""

    def __init__(self, root_pid: int | None = None) -> None:
        self.root_pid = root_pid if root_pid is not None else os.getpid()
        self.lane_pids: dict[int, int] = {}
        self._unavailable: list[Unavailable] = []
        self._last_ns = time.monotonic_ns()
        self.allowed_cores = cpu_limits().cores  # the cores the run may use: affinity, quota
        # which cores: the run's processes run on those their affinity names (a scheduler's
        # cpuset narrows it too); another process's CPU there is CPU the run could have had
        self.job_cores = _job_cores(self.root_pid)
        self._cpu = psutil.cpu_times(percpu=True)
        self._disk = _disk_counters()
        if self._disk is None:
            self._unavailable.append(
                Unavailable("host", "", "disk_read_mib_s", "no disk counters here (a container?)")
            )
        # (what, pid, start time) -> CPU seconds last read; what: own, ended (its ended
        # children's), thread (its main thread's)
        self._cpu_seconds: dict[tuple[str, int, float], float] = {}
        # Processes already running: only their time from now on counts. Told by pid and start
        # time, not by clock: psutil's start times come from the boot time, which can be off
        # from time.time() by a second in a virtual machine.
        self._older = {(p.pid, p.info["create_time"]) for p in psutil.process_iter(["create_time"])}
        # tree (or ("thread", lane)) -> CPU seconds to show in later samples
        self._carry: dict[Any, float] = {}
        self._trees: dict[int, _Tree] = {}  # -1: the whole run
        self._slow_ns = 0
        self._trees_ns = 0  # when the process trees were last read
        self._children_files = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")
        self._last_pid = _last_pid()
        self._disk_read_mib_s: float | None = None
        self._memory_used_mib = psutil.virtual_memory().used / 2**20
        self._processes: dict[int, psutil.Process] = {}
        self._pss_unavailable = False  # recorded once
        self._thread_seconds: dict[tuple[int, int], float] = {}  # (pid, thread id) -> CPU s
        self._cpu_delta(self._process(self.root_pid))  # its time before now is not the run's

    def unavailable(self) -> list[Unavailable]:
        return list(self._unavailable)

    def sample(self) -> tuple[HostSample, list[LaneCpuSample]]:
        """The host and each lane since the last sample, stamped with the time their counters
        were read: a share is CPU seconds over the interval between two readings of the same
        counters, so a sampler thread held up by a busy host (between its tick and its
        reading) neither inflates nor deflates it."""
        cores = psutil.cpu_times(percpu=True)
        per_core, iowait, steal = _core_shares(self._cpu, cores)  # shares of one reading's own
        self._cpu = cores
        # What changes slowly is read once a second: process trees, thread counts, disk, memory.
        now_ns = time.monotonic_ns()
        if now_ns - self._slow_ns >= SLOW_REFRESH_NS or set(self.lane_pids) - set(self._trees):
            self._refresh_slow(now_ns)
        elif self._trees_changed():
            self._refresh_trees(now_ns)
        lanes_now = sorted((lane, tree) for lane, tree in self._trees.items() if lane >= 0)
        # One CPU reading per process, shared by the run's tree and the lane trees within it,
        # and the clock read around them.
        members = {p.pid: p for tree in self._trees.values() for p in tree.members}
        before_ns = time.monotonic_ns()
        deltas = {pid: self._cpu_delta(process) for pid, process in members.items()}
        threads = {
            ("thread", lane): self._carry.pop(("thread", lane), 0.0)
            + self._main_thread_delta(tree.root_pid)
            for lane, tree in lanes_now
        }
        t_ns = (before_ns + time.monotonic_ns()) // 2
        seconds = max((t_ns - self._last_ns) / 1e9, 1e-6)
        self._last_ns = t_ns
        most = self.allowed_cores * seconds  # the CPU seconds the run's cores had
        spent = self._within(
            {lane: self._tree_seconds(lane, tree, deltas) for lane, tree in lanes_now}, most
        )
        lanes = [
            LaneCpuSample(
                t_ns=t_ns,
                lane=lane,
                cpu_pct=100 * spent[lane] / seconds,
                main_cpu_pct=100 * min(most, deltas.get(tree.root_pid, (0.0, 0.0))[0]) / seconds,
                main_thread_cpu_pct=100 * self._one_thread(threads, lane, seconds) / seconds,
                processes=len(tree.members),
                threads=tree.threads,
                pss_mib=tree.pss_mib,
                worker_threads=tree.worker_threads,
            )
            for lane, tree in lanes_now
        ]
        run_tree = self._trees.get(-1)
        run_members = run_tree.members if run_tree is not None else []
        run_spent = self._within({-1: self._tree_seconds(-1, run_tree, deltas)}, most)[-1]
        host = HostSample(
            t_ns=t_ns,
            cpu_pct=sum(per_core) / len(per_core),
            per_core_pct=tuple(per_core),
            iowait_pct=iowait,
            steal_pct=steal,
            disk_read_mib_s=self._disk_read_mib_s,
            memory_used_mib=self._memory_used_mib,
            tree_cpu_pct=100 * run_spent / seconds,
            tree_processes=len(run_members),
            job_cpu_pct=_mean_of(per_core, self.job_cores),
        )
        return host, lanes

    def _refresh_slow(self, t_ns: int) -> None:
        self._refresh_trees(t_ns)
        disk = _disk_counters()
        if disk is not None and self._disk is not None and self._slow_ns:
            seconds = max((t_ns - self._slow_ns) / 1e9, 1e-6)
            self._disk_read_mib_s = (disk.read_bytes - self._disk.read_bytes) / seconds / 2**20
        self._disk = disk
        self._memory_used_mib = psutil.virtual_memory().used / 2**20
        self._slow_ns = t_ns

    def _trees_changed(self) -> bool:
        """Whether a tree gained or lost a process since it was read: looked for only where the
        kernel made a process (or thread) since the last look, and only where the children
        lists can be read (else the trees are read once a second)."""
        last = _last_pid()
        if not self._children_files or last is None or last == self._last_pid:
            return False
        self._last_pid = last
        roots = {-1: self.root_pid, **self.lane_pids}
        return any(
            key in self._trees and _descendants(pid) != {p.pid for p in self._trees[key].members}
            for key, pid in roots.items()
        )

    def _refresh_trees(self, t_ns: int) -> None:
        """Reads the process trees again, at `t_ns`."""
        seconds = (t_ns - self._trees_ns) / 1e9 if self._trees_ns else 0.0
        self._trees_ns = t_ns
        trees = {-1: self.root_pid, **self.lane_pids}
        before = {key: {p.pid: p for p in tree.members} for key, tree in self._trees.items()}
        self._trees = {}
        for key, pid in trees.items():
            root = self._process(pid)
            if root is None:
                continue
            try:
                members = [root, *root.children(recursive=True)]
            except psutil.Error:
                members = [root]
            members = [self._processes.setdefault(p.pid, p) for p in members]
            threads = {p.pid: _threads(p) for p in members}
            tree = _Tree(pid, members, sum(threads.values()))
            if key >= 0:  # a lane's: its memory, and its DataLoader workers' busy threads
                tree.pss_mib = self._pss_mib(members)
                busy = [self._busy_threads(p, seconds) for p in members if p.pid != pid]
                tree.worker_threads = max((n for n in busy if n is not None), default=None)
            self._trees[key] = tree
        # A member gone from its tree ended and was reaped since the last reading: its parent's
        # counters of ended children now hold its whole time; take back what was counted of it.
        gone: dict[tuple[str, int, float], float] = {}
        for key, was in before.items():
            now = {p.pid for p in self._trees[key].members} if key in self._trees else set()
            for pid, process in was.items():
                if pid not in now:
                    counted = ("own", pid, process.create_time())
                    gone[counted] = self._cpu_seconds.get(counted, 0.0)
                    self._carry[key] = self._carry.get(key, 0.0) - gone[counted]
        for counted in gone:
            self._cpu_seconds.pop(counted, None)

    def _busy_threads(self, process: psutil.Process, seconds: float) -> int | None:
        """How many of a process's threads used BUSY_THREAD_SHARE of a core or more since the
        last reading (None at its first): a DataLoader worker's own loop is one, its queue's
        feeder threads idle; a dataset that starts threads of its own (OpenCV, BLAS, a pool)
        shows them here."""
        try:
            threads = process.threads()
        except psutil.Error:
            return None
        busy, seen = 0, False
        for thread in threads:
            key = (process.pid, thread.id)
            spent = thread.user_time + thread.system_time
            before = self._thread_seconds.get(key)
            self._thread_seconds[key] = spent
            if before is not None and seconds > 0:
                seen = True
                busy += (spent - before) / seconds >= BUSY_THREAD_SHARE
        return busy if seen else None

    def _pss_mib(self, members: list[psutil.Process]) -> float | None:
        """The proportional set size of `members` together, in MiB (shared pages split among
        the processes that share them); None where one cannot be read (no permission, or no
        PSS on this platform), which is recorded once as unavailable. A member that ended
        meanwhile counts for nothing."""
        total = 0
        for process in members:
            try:
                pss = getattr(process.memory_full_info(), "pss", None)
            except psutil.NoSuchProcess:  # ended (or a zombie): nothing left to count
                continue
            except (psutil.Error, OSError, NotImplementedError) as error:
                self._no_pss(f"a lane's process memory cannot be read ({type(error).__name__})")
                return None
            if pss is None:
                self._no_pss("psutil gives no PSS on this platform")
                return None
            total += pss
        return total / 2**20

    def _no_pss(self, reason: str) -> None:
        if not self._pss_unavailable:
            self._pss_unavailable = True
            self._unavailable.append(Unavailable("host", "", "pss_mib", reason))

    def _process(self, pid: int) -> psutil.Process | None:
        if pid not in self._processes:
            try:
                self._processes[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return self._processes[pid]

    def _cpu_delta(self, process: psutil.Process | None) -> tuple[float, float]:
        """CPU seconds `process` used since it was last read (since it started, at first), and
        those of its children that ended meanwhile. A child that ends between two readings of
        the trees (a DataLoader's workers, started anew each epoch) is not lost: its parent's
        counters of ended children take it in, and what was counted of it while it ran is
        taken back once, when it is gone (as a negative own time)."""
        if process is None:
            return 0.0, 0.0
        created = process.create_time()  # cached by psutil: works once it is gone
        key = ("own", process.pid, created)
        try:
            times = process.cpu_times()
        except psutil.Error:
            return -self._cpu_seconds.pop(key, 0.0), 0.0
        ended = getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0)
        return (
            self._since_last(key, times.user + times.system),
            self._since_last(("ended", process.pid, created), ended),
        )

    def _tree_seconds(
        self, key: int, tree: _Tree | None, deltas: dict[int, tuple[float, float]]
    ) -> float:
        """A tree's CPU seconds since the last sample, with what was carried on to it."""
        if tree is None:
            return 0.0
        return self._carry.pop(key, 0.0) + sum(sum(deltas.get(p.pid, (0.0, 0.0)))
                                               for p in tree.members)  # fmt: skip

    def _within(self, spent: dict[Any, float], most: float) -> dict[Any, float]:
        """`spent` CPU seconds shown within `most`, together: a process is found when the trees
        are read (once a second), so its time until then comes in one sample, and an ended
        child gives back what was counted of it before its parent's counters take it in. What
        is over (or under nothing) is carried on to the next samples, each key's own, so that
        nothing is lost and no sample shows more than the cores had: no lane above the run's
        cores, the lanes together neither, no thread above one core."""
        shown = {key: max(value, 0.0) for key, value in spent.items()}
        total = sum(shown.values())
        if total > most:
            shown = {key: value * most / total for key, value in shown.items()}
        for key, value in spent.items():
            if value != shown[key]:
                self._carry[key] = self._carry.get(key, 0.0) + value - shown[key]
        return shown

    def _one_thread(self, threads: dict[Any, float], lane: int, seconds: float) -> float:
        """A lane's main thread's CPU seconds, at most the sample's own (one core)."""
        key = ("thread", lane)
        return self._within({key: threads[key]}, seconds)[key]

    def _main_thread_delta(self, pid: int) -> float:
        """CPU seconds of the process's main thread (the Python loop) since it was last read."""
        process = self._processes.get(pid)
        if process is None:
            return 0.0
        try:
            # One small file, where psutil's threads() would read one per thread (DALI has ~40).
            with open(f"/proc/{pid}/task/{pid}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            seconds = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
            key = ("thread", pid, process.create_time())
        except (OSError, IndexError, ValueError, psutil.Error):
            return 0.0
        return self._since_last(key, seconds)

    def _since_last(self, key: tuple[str, int, float], cpu_seconds: float) -> float:
        """CPU seconds since `key` was last read. At its first reading, all of a process's time
        if it started while this sampler ran, else none: what a lane kept warm from an earlier
        run did before this one is not this run's."""
        if key not in self._cpu_seconds and key[1:] in self._older:
            self._cpu_seconds[key] = cpu_seconds
            return 0.0
        previous = self._cpu_seconds.get(key, 0.0)
        self._cpu_seconds[key] = cpu_seconds
        return max(cpu_seconds - previous, 0.0)


def _core_shares(
    before: list[Any], after: list[Any]
) -> tuple[list[float], float | None, float | None]:
    """Per-core busy %, and iowait % and steal % of all cores, between two cpu_times readings."""
    per_core = []
    iowait_total = steal_total = all_total = 0.0
    for old, new in zip(before, after, strict=False):
        delta = {field: getattr(new, field) - getattr(old, field) for field in new._fields}
        # guest time is already counted in user and nice on Linux
        total = sum(v for k, v in delta.items() if k not in ("guest", "guest_nice"))
        idle = delta.get("idle", 0.0) + delta.get("iowait", 0.0) + delta.get("steal", 0.0)
        per_core.append(100 * (total - idle) / total if total > 0 else 0.0)
        iowait_total += delta.get("iowait", 0.0)
        steal_total += delta.get("steal", 0.0)
        all_total += total
    has = after[0]._fields if after else ()
    iowait = 100 * iowait_total / all_total if all_total > 0 and "iowait" in has else None
    steal = 100 * steal_total / all_total if all_total > 0 and "steal" in has else None
    return per_core, iowait, steal


def _job_cores(root_pid: int) -> frozenset[int] | None:
    """The cores the run's processes may run on: this process's affinity and its root's (under
    torchrun the launcher's, which a rank that pins itself narrows only for itself); None
    where the platform has no affinity."""
    cores = own_cores()
    if cores is None:
        return None
    with suppress(psutil.Error, AttributeError):
        cores |= frozenset(psutil.Process(root_pid).cpu_affinity())
    return cores


def _mean_of(per_core: list[float], cores: Iterable[int] | None) -> float | None:
    """The mean busy share of `cores` (None: not known, or cores the reading does not list,
    where some are offline and psutil's list no longer runs by their numbers)."""
    chosen = sorted(cores) if cores is not None else []
    if not chosen or chosen[-1] >= len(per_core):
        return None
    return sum(per_core[core] for core in chosen) / len(chosen)


def _last_pid() -> int | None:
    """The process id the kernel gave last (a thread's too), from /proc/loadavg."""
    try:
        with open("/proc/loadavg", "rb") as loadavg:
            return int(loadavg.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _descendants(pid: int) -> set[int]:
    """The process and its descendants, from each task's children list."""
    found, todo = set(), [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:  # gone meanwhile
            continue
        found.add(parent)
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children", "rb") as children:
                    todo += [int(child) for child in children.read().split()]
            except (OSError, ValueError):
                continue
    return found


def _threads(process: psutil.Process) -> int:
    try:
        return process.num_threads()
    except psutil.Error:
        return 0


def _disk_counters() -> Any:
    try:
        return psutil.disk_io_counters()
    except (OSError, RuntimeError):
        return None


def host_facts() -> dict[str, Any]:
    """The CPU model, the machine's core count and memory: for the run's host description."""
    model = None
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(
                (
                    line.split(":", 1)[1].strip()
                    for line in cpuinfo
                    if line.startswith("model name")
                ),
                None,
            )
    except OSError:
        pass
    return {
        "cpu_model": model,
        "cpu_cores_total": psutil.cpu_count(),
        "memory_mib": round(memory_bytes() / 2**20),
    }


def memory_bytes() -> int:
    """This host's memory, in bytes."""
    return int(psutil.virtual_memory().total)


def _tree(pid: int) -> list[psutil.Process]:
    """The process and its descendants (a lane, its DataLoader workers and their helpers)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def process_states(pid: int) -> list[str]:
    """Each process of the tree: its state, where in the kernel it sleeps (`wait_for_partner`: a
    FIFO's open; `nfs_...`, `io_schedule`: a file system or disk), and its CPU time."""
    states = []
    for process in _tree(pid):
        try:
            status, cpu = process.status(), sum(process.cpu_times()[:2])
            wchan = Path(f"/proc/{process.pid}/wchan").read_text().strip().split(".")[0]
        except (psutil.Error, OSError):
            continue
        where = f" in {wchan}" if wchan not in ("", "0") else ""
        role = "the lane" if process.pid == pid else "worker"
        states.append(f"{role} {process.pid} {status}{where}, {cpu:.1f} s CPU")
    return states


def tree_cpu_s(pid: int) -> float:
    """The CPU seconds the process and its descendants have used (user and system)."""
    total = 0.0
    for process in _tree(pid):
        with suppress(psutil.Error):
            total += sum(process.cpu_times()[:2])
    return total


def kill_tree(pid: int, grace_s: float = 2.0) -> None:
    """Ends the process and its descendants: SIGTERM first, which lets them remove what they
    made (a loader's worker, its temporary folder), then SIGKILL to those still there after
    `grace_s`: a worker stuck in the kernel outlives its parent, and keeps what it holds."""
    tree = _tree(pid)
    for process in tree:
        with suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(tree, timeout=grace_s)
    for process in alive:
        with suppress(psutil.Error):
            process.kill()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` is still running (a zombie, which waits to be reaped, is not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
