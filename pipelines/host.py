"""What the host really allows a run: the CPU cores it may use, how much it was throttled, and
the shared memory its DataLoader workers hand batches over in. Plain file reads (Linux's cgroup
files, `/proc/self/cgroup`), no psutil.

A process may run on fewer cores than the machine has: its affinity mask (`taskset`, a batch
scheduler's cpuset) names the cores it may run on, and a cgroup CPU quota (a container's
`--cpus`, a Kubernetes CPU limit) caps the CPU time it gets per period, however many cores it
runs on. The quota of every cgroup above the process binds too, so the smallest counts. Past its
quota a cgroup is throttled: its processes wait until the next period, which a DataLoader's
workers feel as a slower pipeline on an idle-looking machine.

cgroup v2 keeps the quota in `cpu.max` ("max 100000": none; "150000 100000": 1.5 cores), v1 in
`cpu.cfs_quota_us` and `cpu.cfs_period_us` (-1: none), under the cpu controller's own mount
(`cpu` or `cpu,cpuacct`). A container often sees its own cgroup as the mount's root while
`/proc/self/cgroup` names its path on the host: where that path is not under the mount, the
mount's own files are the process's.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.errors import InputError

CGROUP_ROOT = "/sys/fs/cgroup"
PROC_CGROUP = "/proc/self/cgroup"
# the names a cgroup v1 mount of the cpu controller goes by (alone, or with cpuacct)
_V1_CPU_MOUNTS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True)
class CpuLimits:
    """The CPU cores this process may use, and what limits them (None: no such limit)."""

    machine: int  # the machine's cores (os.cpu_count())
    affinity: int | None  # the cores its affinity mask names (None: the platform has no mask)
    quota: float | None  # the smallest cgroup CPU quota over its cgroup and ancestors, in cores
    source: str | None  # the file that gave `quota`
    # for each limit that could not be read: "cgroup CPU quota unknown, because <why>"
    unknown: tuple[str, ...] = ()
    cpu_set: str | None = None  # the cores its affinity mask names, as taskset lists them: 0-15

    @property
    def cores(self) -> float:
        """The cores it may use: the smallest of the machine's, its affinity's and its quota."""
        return min(x for x in (self.machine, self.affinity, self.quota) if x is not None)

    @property
    def text(self) -> str:
        """For people: "8 cores (cgroup quota 8.0 of the machine's 64)", "2 cores"."""
        limits = []
        if self.quota is not None and self.quota < self.machine:
            limits.append((self.quota, f"cgroup quota {round(self.quota, 2)}"))
        if self.affinity is not None and self.affinity < self.machine:
            limits.append((self.affinity, f"affinity: {self.affinity}"))
        cores = self.cores
        head = f"{round(cores, 2):g} core{'' if cores == 1 else 's'}"
        if not limits:
            return head
        limits.sort(key=lambda limit: limit[0])  # the one that binds first
        first, *rest = (words for _, words in limits)
        said = "; ".join([f"{first} of the machine's {self.machine}", *rest])
        return f"{head} ({said})"

    def to_json(self) -> dict[str, Any]:
        return {
            "machine": self.machine,
            "affinity": self.affinity,
            "quota": self.quota,
            "source": self.source,
            "unknown": list(self.unknown),
            "cores": self.cores,
            "cpu_set": self.cpu_set,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CpuLimits:
        """From `to_json()`'s dict; a missing key is a limit not known (the machine: 1 core,
        where neither it nor `cores` was kept)."""
        machine = data.get("machine") or math.ceil(data.get("cores") or 1)
        quota = data.get("quota")
        return cls(
            machine=int(machine),
            affinity=data.get("affinity"),
            quota=None if quota is None else float(quota),
            source=data.get("source"),
            unknown=tuple(data.get("unknown") or ()),
            cpu_set=data.get("cpu_set"),
        )


def cpu_set_text(cores: Iterable[int]) -> str:
    """Cores as taskset lists them, runs joined: {0, 1, 2, 3, 8} -> "0-3,8"."""
    runs: list[list[int]] = []
    for core in sorted(set(cores)):
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def parse_cpu_set(text: str) -> frozenset[int]:
    """Cores as taskset lists them ("0-15,32-47", "3").

    Raises:
        InputError: anything else.
    """
    cores: set[int] = set()
    for part in str(text).split(","):
        found = re.fullmatch(r"\s*(\d+)(?:-(\d+))?\s*", part)
        low, high = (0, -1) if found is None else (int(found[1]), int(found[2] or found[1]))
        if high < low:
            raise InputError(
                f"--cores takes cores as taskset lists them, like 0-15,32-47 (got {text!r})"
            )
        cores.update(range(low, high + 1))
    return frozenset(cores)


def own_cores() -> frozenset[int] | None:
    """The cores this process's affinity mask names (None: the platform has none)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return frozenset(os.sched_getaffinity(0))


def keep_to_cores(text: str) -> frozenset[int]:
    """Keeps this process, and what it starts from now on, to the cores `text` lists
    (`parse_cpu_set`), as `taskset -c` would; returns them.

    Raises:
        InputError: a list it cannot read, or cores this process may not use.
    """
    cores = parse_cpu_set(text)
    allowed = own_cores()
    if allowed is None:
        raise InputError("--cores: this platform has no CPU affinity to set")
    if not cores <= allowed:
        raise InputError(
            f"--cores {text}: cores {cpu_set_text(cores - allowed)} are not this process's to "
            f"use (it may use {cpu_set_text(allowed)})"
        )
    os.sched_setaffinity(0, cores)
    return cores


@dataclass(frozen=True)
class Throttling:
    """A cgroup's CPU throttling counters (cumulative since it was made; subtract two readings
    for an interval): enforcement periods, those in which it ran out of quota, and the time its
    processes waited for the next period."""

    periods: int
    throttled_periods: int
    throttled_s: float

    def __sub__(self, other: Throttling) -> Throttling:
        return Throttling(
            self.periods - other.periods,
            self.throttled_periods - other.throttled_periods,
            self.throttled_s - other.throttled_s,
        )

    @property
    def throttled_share(self) -> float | None:
        """The share of periods that were throttled (None: no periods)."""
        return self.throttled_periods / self.periods if self.periods > 0 else None


class _Unreadable(Exception):
    """A cgroup file that is there but cannot be read or parsed; its message says why."""


@dataclass(frozen=True)
class _Hierarchy:
    """One cgroup hierarchy holding the cpu controller, and the process's cgroup within it."""

    version: int  # 1 or 2
    mount: Path
    path: str  # the cgroup's path as /proc/self/cgroup gives it, "/" for the root

    def chain(self) -> list[Path]:
        """The process's cgroup folder and its ancestors up to the mount, nearest first; the
        mount alone where the path is not under it (a namespaced container)."""
        parts = [p for p in self.path.split("/") if p]
        own = self.mount.joinpath(*parts)
        if not own.is_dir():
            return [self.mount]
        return [self.mount.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def cpu_limits(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> CpuLimits:
    """The CPU cores this process may use and what limits them: the machine, the affinity mask,
    and the smallest cgroup CPU quota over its cgroup and ancestors (`root`: where the cgroup
    file systems are mounted; `proc_cgroup`: the process's cgroup list). Never raises: what
    cannot be read is a sentence in `unknown`."""
    unknown: list[str] = []
    affinity = cpu_set = None
    if hasattr(os, "sched_getaffinity"):
        try:
            mask = os.sched_getaffinity(0)
            affinity, cpu_set = len(mask), cpu_set_text(mask)
        except OSError as error:
            unknown.append(f"CPU affinity unknown, because {error.strerror}")
    quota: float | None = None
    source = None
    try:
        hierarchies = _hierarchies(Path(root), proc_cgroup)
    except _Unreadable as error:
        hierarchies = []
        unknown.append(f"cgroup CPU quota unknown, because {error}")
    for hierarchy in hierarchies:
        for folder in hierarchy.chain():
            try:
                found = _quota(folder, hierarchy.version)
            except _Unreadable as error:
                unknown.append(f"cgroup CPU quota unknown, because {error}")
                continue
            if found is not None and (quota is None or found[0] < quota):
                quota, source = found
    return CpuLimits(
        machine=os.cpu_count() or 1,
        affinity=affinity,
        quota=quota,
        source=source,
        unknown=tuple(dict.fromkeys(unknown)),
        cpu_set=cpu_set,
    )


def available_cpus() -> int:
    """Whole CPU cores this process may use: its affinity mask and cgroup quota included, not
    the machine's total (at least 1)."""
    return max(1, math.floor(cpu_limits().cores))


def cpu_throttling(root: str = CGROUP_ROOT, proc_cgroup: str = PROC_CGROUP) -> Throttling | None:
    """The throttling counters of the process's cgroup, from a `cpu.stat`: of the cgroup whose
    quota binds where one does (a parent's quota throttles its children, and its counters say
    so), else of the nearest cgroup up from the process's own that keeps them (one without the
    cpu controller has none). None where there are none or they cannot be read."""
    try:
        hierarchies = _hierarchies(Path(root), proc_cgroup)
    except _Unreadable:
        return None
    binding: tuple[float, Path] | None = None
    nearest: list[Path] = []  # each hierarchy's chain, one after the other
    for hierarchy in hierarchies:
        chain = hierarchy.chain()
        nearest += chain
        for folder in chain:
            try:
                found = _quota(folder, hierarchy.version)
            except _Unreadable:
                continue
            if found is not None and (binding is None or found[0] < binding[0]):
                binding = found[0], folder
    for folder in [binding[1]] if binding is not None else nearest:
        try:
            stats = _read_stat(folder / "cpu.stat")
        except _Unreadable:
            continue
        if stats is None or "nr_periods" not in stats or "nr_throttled" not in stats:
            continue
        if "throttled_usec" in stats:  # v2
            throttled_s = stats["throttled_usec"] / 1e6
        elif "throttled_time" in stats:  # v1, in ns
            throttled_s = stats["throttled_time"] / 1e9
        else:
            continue
        return Throttling(stats["nr_periods"], stats["nr_throttled"], throttled_s)
    return None


def shm_free_mib(path: str = "/dev/shm") -> float | None:
    """Free space in the shared memory file system, in MiB (DataLoader workers hand their
    batches over there); None where there is none."""
    try:
        return shutil.disk_usage(path).free / 2**20
    except OSError:
        return None


def _hierarchies(root: Path, proc_cgroup: str) -> list[_Hierarchy]:
    """The cgroup hierarchies that may hold the process's CPU quota: v1's cpu controller, and
    v2's unified one; none where the process has no cgroup list (not Linux)."""
    text = _read(Path(proc_cgroup))
    if text is None:
        return []
    hierarchies = []
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy_id, controllers, path = fields
        if hierarchy_id == "0" and not controllers:
            hierarchies.append(_Hierarchy(2, root, path))
        elif "cpu" in controllers.split(","):
            mounts = (controllers, *_V1_CPU_MOUNTS)
            mount = next((root / m for m in mounts if (root / m).is_dir()), None)
            if mount is not None:
                hierarchies.append(_Hierarchy(1, mount, path))
    return hierarchies


def _quota(folder: Path, version: int) -> tuple[float, str] | None:
    """The CPU quota a cgroup folder sets, in cores, and the file it is in; None: no quota."""
    if version == 2:
        path = folder / "cpu.max"
        text = _read(path)
        if text is None:
            return None
        fields = text.split()
        if not fields or fields[0] == "max":
            return None
        try:
            quota = int(fields[0])
            period = int(fields[1]) if len(fields) > 1 else 100_000
        except ValueError:
            raise _Unreadable(f"{path} holds {text.strip()!r}, not '<quota> <period>'") from None
    else:
        path = folder / "cpu.cfs_quota_us"
        text = _read(path)
        if text is None:
            return None
        quota = _integer(path, text)
        if quota < 0:
            return None
        period_path = folder / "cpu.cfs_period_us"
        period_text = _read(period_path)
        if period_text is None:
            raise _Unreadable(f"{path} has no {period_path.name} beside it")
        period = _integer(period_path, period_text)
    if quota <= 0 or period <= 0:
        return None
    return quota / period, str(path)


def _read_stat(path: Path) -> dict[str, int] | None:
    """A cgroup's `cpu.stat` ("key value" lines); None where there is none."""
    text = _read(path)
    if text is None:
        return None
    stats = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2:
            try:
                stats[fields[0]] = int(fields[1])
            except ValueError:
                raise _Unreadable(f"{path} holds {line!r}, not '<key> <count>'") from None
    return stats


def _integer(path: Path, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise _Unreadable(f"{path} holds {text.strip()!r}, not a number") from None


def _read(path: Path) -> str | None:
    """A small file's text; None where it does not exist. Raises `_Unreadable` where it is
    there but cannot be read (a folder in its place, no permission)."""
    try:
        return path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
        raise _Unreadable(f"{path}: {why}") from None
