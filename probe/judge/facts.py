"""The facts the rules read about each lane of a stored run: its figures (`LaneFigures`), how
its pipeline was set, and the host's load while it measured (cut to the lane's window)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines import CpuLimits, parse_cpu_set
from probe.judge.changes import Change, Knob, to_dali, workers
from probe.judge.thresholds import (
    CPU_CAP_NEAR,
    CPU_SATURATED_PCT,
    EPOCH_START_SHARE,
    OTHER_LOAD_MIN_CORES,
    OTHER_LOAD_SHARE,
    STEAL_MOVES_PCT,
    Severity,
    severity_of,
)
from probe.lane_figures import LaneFigures
from probe.measure.described import files_known
from probe.metrics import per_device
from probe.records import LaneRecord, RunRecord
from probe.steady import Estimate, at_least
from probe.store.db import Store
from probe.store.documents import lane_figures_of


@dataclass(frozen=True)
class HostLoad:
    """The host's figures over a lane's measured window (None: not measured). The run's
    processes may run on `job_cores` of the machine's cores (their affinity: `taskset`, a
    scheduler's cpuset): other processes' CPU there is CPU the run could have had
    (`other_cores`); on the machine's other cores it is the node's other jobs, context only
    (`elsewhere_cores`)."""

    cpu_pct: float | None = None  # busy share of the cores the run may run on
    iowait_pct: float | None = None
    steal_pct: float | None = None
    disk_read_mib_s: float | None = None
    other_cores: float | None = None  # cores other processes took of those the run may use
    machine_cores: int | None = None  # all the machine's cores
    job_cores: int | None = None  # those the run may run on
    elsewhere_cores: float | None = None  # busy cores outside them: other jobs', not the run's


@dataclass(frozen=True)
class LaneFacts:
    """What the rules read about one lane."""

    lane: int
    status: str
    backend: str  # "torch" or "dali"
    consumer: str  # "none", "sleep:MS", "model:NAME"
    batch_size: int
    figures: LaneFigures
    hostname: str
    host_cpus: int  # the cores the run may use on its host
    lanes_on_host: int
    on_gpu: bool
    num_workers: int | None = None  # DataLoader
    pin_memory: bool | None = None
    output_dtype: str | None = None
    persistent_workers: bool | None = None
    num_threads: int | None = None  # DALI
    decoder: str | None = None
    hw_decoder_load: float | None = None  # DALI mixed: the share of JPEGs to the hardware
    host: HostLoad = field(default_factory=HostLoad)
    step_ms_mean: float | None = None  # the measured batches' mean step
    cpu_limits: CpuLimits | None = None  # what the host allows (None: not recorded)
    shm_free_mib: float | None = None  # /dev/shm free when the run started
    prefetch_factor: int | None = None  # DataLoader
    image_size: int | None = None
    reason: str | None = None  # why the lane failed or stopped
    run_lanes: int = 1  # the run's lanes on every host: a lane's figures are one of them
    watched_run: str | None = None  # the run's id where it watched a job of one's own
    watched_files: bool = False  # its files are known: `probe doctor --like` measures on them
    # What the lane's rank was given, as its run's entry for it says (None: not recorded): its
    # own cores (a rank's affinity; the host's `cpu_limits` are one rank's), its shard's
    # images and batches an epoch, and the folder of its files.
    cpu_set: frozenset[int] | None = None
    shard_images: int | None = None
    shard_batches: int | None = None
    data_dir: str | None = None
    # images/s the lane's loader was measured to make at this CPU elsewhere (a doctor's other
    # runs of the DataLoader): the CPU cap, an estimate, is never below it
    measured_up_to: float = 0.0

    @property
    def device_word(self) -> str:
        """What a lane drives: "GPU", or "lane" on the CPU."""
        return "GPU" if self.on_gpu else "lane"

    def per_lane(self, rate: float | None = None) -> str:
        """`per_device` for this lane's run: " per GPU (8,554 for all 2 GPUs)"."""
        return per_device(self.device_word, self.run_lanes, rate)

    @property
    def batch_mib(self) -> float | None:
        """A batch's pixels as workers hand them over, in MiB."""
        if not self.image_size or self.backend != "torch":
            return None
        item = 1 if self.output_dtype == "uint8" else 4
        return self.batch_size * 3 * self.image_size**2 * item / 2**20

    @property
    def batch_ms_mean(self) -> float | None:
        """Its measured batches' mean time, wait plus step (None: none measured)."""
        figures = self.figures
        if not figures.batches or figures.seconds <= 0:
            return None
        return figures.seconds / figures.batches * 1e3

    @property
    def cores_per_lane(self) -> float:
        return self.host_cpus / max(1, self.lanes_on_host)

    @property
    def cores_per_lane_text(self) -> str:
        """ "16 cores per GPU", or "1 core per lane" on the CPU."""
        cores = self.cores_per_lane
        return f"{cores:g} core{'' if cores == 1 else 's'} per {'GPU' if self.on_gpu else 'lane'}"

    @property
    def loaders(self) -> int | None:
        """DataLoader workers or DALI threads."""
        return self.num_workers if self.backend == "torch" else self.num_threads

    @property
    def loaders_text(self) -> str:
        """ "8 workers", "1 worker", "4 DALI threads"."""
        name = "worker" if self.backend == "torch" else "DALI thread"
        return f"{self.loaders} {name}{'' if self.loaders == 1 else 's'}"

    @property
    def consumer_images_per_s(self) -> float | None:
        """What the consumer alone could take: as measured on batches already on the device,
        else a batch per median step (under the loader's load)."""
        alone = self.figures.consumer_alone
        if alone and alone.get("images_per_s"):
            return float(alone["images_per_s"])
        step = self.figures.step_ms_p50
        if not step or step <= 0.01:
            return None
        return self.batch_size / (step / 1000)

    @property
    def wait(self) -> Estimate | None:
        """Its data-wait as an estimate, as the rules judge it (None: not measured): where its
        epoch starts were measured, with their error (`EpochStartCost.wait_error`): a transient
        measured apart, not noise in the blocks it falls in (one start of a second in one of 16
        blocks spreads them by as much as the figure)."""
        figures = self.figures
        if figures.data_wait_frac is None:
            return None
        error = figures.data_wait_frac_error
        start = figures.epoch_start
        if start is not None and start.wait_error is not None:
            error = start.wait_error
        return Estimate(figures.data_wait_frac, error, figures.blocks)

    @property
    def fed_by_interval(self) -> bool:
        """Whether its data-wait tells it fed by its interval alone: judged, an error as large
        as the figure (it cannot be told from no wait at all), its upper end below WAIT_HIGH and
        at WAIT_MODERATE or above (below that, the figure tells it fed outright). Fed, or at
        most moderately input-bound: no loader change is worth making for it."""
        wait = self.wait
        if wait is None or wait.error is None or not wait.judged or wait.error < wait.value:
            return False
        return severity_of(wait.value + wait.error) is Severity.MODERATE

    @property
    def epoch_share(self) -> float:
        """The share of the time its epoch starts cost (0 when none was measured)."""
        start = self.figures.epoch_start
        return start.share if start else 0.0

    @property
    def epoch_stalls_most(self) -> bool:
        """Whether epoch starts cost EPOCH_START_SHARE or more, and most of the data-wait."""
        wait = self.figures.data_wait_frac or 0.0
        return self.epoch_share >= EPOCH_START_SHARE and self.epoch_share >= wait / 2

    @property
    def steady_wait(self) -> float | None:
        """Its data-wait with the epoch starts' stalls taken out."""
        wait = self.figures.data_wait_frac
        share = self.epoch_share
        if wait is None or not share or share >= 1:
            return wait
        return max(0.0, (wait - share) / (1 - share))

    @property
    def cpu_saturated(self) -> bool:
        """Whether the host, or the lane's share of its cores, has no CPU left."""
        if self.host.cpu_pct is not None and self.host.cpu_pct >= CPU_SATURATED_PCT:
            return True
        cpu = self.figures.cpu_pct
        return cpu is not None and cpu >= CPU_SATURATED_PCT * self.cores_per_lane

    @property
    def other_cores_per_lane(self) -> float:
        """The lane's share of the cores other processes took from the run (0: none measured)."""
        return (self.host.other_cores or 0.0) / max(1, self.lanes_on_host)

    @property
    def loader_cores(self) -> float:
        """The cores the lane may use less its share of those other processes took from them
        meanwhile (`HostLoad.other_cores`: on the run's own cores, beyond what its quota
        leaves)."""
        return max(0.0, self.cores_per_lane - self.other_cores_per_lane)

    @property
    def cpu_demand_cores(self) -> float | None:
        """The cores the loader needs to feed the step: the CPU each image costs (workers and
        training process) at the rate the step could take; None where either is not measured."""
        cpu_ms, rate = self.figures.cpu_ms_per_image, self.consumer_images_per_s
        if cpu_ms is None or rate is None:
            return None
        return cpu_ms * rate / 1000

    @property
    def cpu_cap_images_per_s(self) -> float | None:
        """The most images/s the lane's cores (`loader_cores`) can make at the CPU each image
        costs; None where that cost is not measured. An estimate: where the lane measured more
        (or `measured_up_to` says its loader did elsewhere), it is raised to that."""
        cpu_ms = self.figures.cpu_ms_per_image
        if not cpu_ms:
            return None
        return max(
            self.loader_cores * 1000 / cpu_ms, self.figures.images_per_s, self.measured_up_to
        )

    @property
    def cpu_short(self) -> bool:
        """Whether the loader needs more of the lane's cores than can be had to feed the step
        (CPU_SATURATED_PCT of them: cores are never all usable): its CPU cap is below the
        step's rate, whatever holds it now."""
        demand = self.cpu_demand_cores
        return demand is not None and demand >= CPU_SATURATED_PCT / 100 * self.loader_cores

    @property
    def workers_hold(self) -> bool:
        """Whether its workers (or DALI threads), fewer than the lane's cores, hold the loader
        below its CPU cap: its images/s, with their error, stay under CPU_CAP_NEAR of the cap.
        Each loader then keeps about a core busy while the others have room: more loaders
        make more, up to the cap."""
        cap, figures = self.cpu_cap_images_per_s, self.figures
        if not self.loaders or self.loaders >= self.cores_per_lane or cap is None:
            return False
        rate = Estimate(figures.images_per_s, figures.images_per_s_error, figures.blocks)
        return not at_least(rate, CPU_CAP_NEAR, Estimate(cap, None, figures.blocks))

    @property
    def cpu_capped(self) -> bool:
        """Whether the CPU caps the loader: it needs more cores than the lane has (`cpu_short`)
        and it is not held below its cap by too few workers (`workers_hold`), whatever its
        average busy share: a loop whose epochs are too short to keep its workers busy averages
        room it cannot use."""
        return self.cpu_short and not self.workers_hold

    @property
    def cpu_caps_epochs(self) -> bool:
        """Whether the CPU caps the loader below what its epochs give between their starts and
        tails (`LaneFigures.windows_images_per_s`): reading across epoch ends cannot give it."""
        cap, windows = self.cpu_cap_images_per_s, self.figures.windows_images_per_s
        return self.cpu_capped and cap is not None and windows is not None and cap < windows

    @property
    def host_busy(self) -> bool:
        """Whether other processes took enough of the CPU the run may use (or the hypervisor
        enough of the machine's) to move the answer; their load on other cores does not."""
        steal = self.host.steal_pct or 0.0
        other = self.host.other_cores or 0.0
        enough = max(OTHER_LOAD_MIN_CORES, OTHER_LOAD_SHARE * self.host_cpus)
        return steal >= STEAL_MOVES_PCT or other >= enough

    @property
    def change(self) -> Change:
        """Its own setting, as a change would set it."""
        if self.backend == "dali":
            if self.decoder is None:  # a watched iterator's, unread
                return Change(Knob.NUM_THREADS, self.num_threads or 1)
            return to_dali(self.decoder, self.num_threads or 1)
        return workers(self.num_workers or 0)


def lane_facts(store: Store, run: RunRecord, lane: LaneRecord) -> LaneFacts:
    """The facts of one lane, from the store (host figures cut to the lane's window)."""
    stats = store.batch_stats(run.run_id, lane.lane)
    spec = run.config.get("spec", {})
    loader, dali = spec.get("dataloader", {}), spec.get("dali", {})
    torch_lane = run.pipeline == "torch"
    on_gpu = lane.gpu_index is not None
    machine = run.host.get("nodes", {}).get(lane.hostname, run.host)
    host = HostLoad()
    if stats["n"]:
        means = store.host_means(run.run_id, lane.hostname, stats["start_ns"], stats["end_ns"])
        host = host_load(means, machine)
    figures = lane_figures_of(store, run, lane)
    lanes = run.config.get("lanes", [])
    given: dict[str, Any] = next((x for x in lanes if x.get("lane") == lane.lane), {})
    # A watched iterable of unknown kind has no batch size set: the batches' own mean serves.
    batch_size = spec.get("batch_size") or round(figures.images / max(1, figures.batches))
    return LaneFacts(
        lane=lane.lane,
        status=lane.status.value,
        backend=run.pipeline,
        consumer=run.consumer,
        batch_size=int(batch_size),
        figures=figures,
        hostname=lane.hostname,
        host_cpus=int(machine.get("cpus") or 1),
        lanes_on_host=sum(1 for x in store.lanes(run.run_id) if x.hostname == lane.hostname),
        on_gpu=on_gpu,
        num_workers=loader.get("num_workers") if torch_lane else None,
        pin_memory=loader.get("pin_memory") if torch_lane else None,
        output_dtype=(loader.get("output_dtype") or ("uint8" if on_gpu else "float32"))
        if torch_lane
        else None,
        persistent_workers=loader.get("persistent_workers") if torch_lane else None,
        num_threads=None if torch_lane else dali.get("num_threads"),
        decoder=None if torch_lane else _dali_decoder(dali, lane, run.kind == "watch"),
        hw_decoder_load=None if torch_lane else dali.get("hw_decoder_load"),
        host=host,
        step_ms_mean=stats["step_mean_s"] * 1e3 if stats["n"] else None,
        cpu_limits=CpuLimits.from_json(machine["cpu_limits"])
        if machine.get("cpu_limits")
        else None,
        shm_free_mib=machine.get("shm_free_mib"),
        prefetch_factor=loader.get("prefetch_factor") if torch_lane else None,
        image_size=spec.get("image_size"),
        reason=lane.reason,
        run_lanes=len(store.lanes(run.run_id)),
        watched_run=run.run_id if run.kind == "watch" else None,
        watched_files=run.kind == "watch" and files_known(spec.get("data_dir")),
        cpu_set=parse_cpu_set(given["cpu_set"]) if given.get("cpu_set") else None,
        shard_images=given.get("images"),
        shard_batches=given.get("batches_per_epoch"),
        data_dir=given.get("data_dir") or spec.get("data_dir"),
    )


def run_facts(store: Store, run_id: str) -> list[LaneFacts]:
    """The facts of each lane of a stored run."""
    run = store.run(run_id)
    return [lane_facts(store, run, lane) for lane in store.lanes(run.run_id)]


def host_load(means: Mapping[str, float | None], machine: Mapping[str, Any]) -> HostLoad:
    """The host's load over a window. Other processes' CPU on the run's cores is their busy
    share less the run's processes' (which run there alone); a cgroup quota below those cores
    leaves the rest to others, so only what they took beyond it counts against the run. A store
    from before the run's own cores were sampled knows them only where they are the machine's."""
    cores = int(machine.get("cpu_cores_total") or machine.get("cpus") or 1)
    limits = machine.get("cpu_limits") or {}
    job_cores = int(limits.get("affinity") or cores)
    usable = min(float(limits.get("cores") or machine.get("cpus") or job_cores), job_cores)
    busy, tree, job = means.get("cpu_pct"), means.get("tree_cpu_pct"), means.get("job_cpu_pct")
    if job is None and job_cores >= cores:
        job = busy
    other = elsewhere = None
    if job is not None and tree is not None:
        on_job = max(0.0, job / 100 * job_cores - tree / 100)
        other = max(0.0, on_job - (job_cores - usable))
    if job is not None and busy is not None and job_cores < cores:
        elsewhere = max(0.0, busy / 100 * cores - job / 100 * job_cores)
    return HostLoad(
        cpu_pct=job,
        iowait_pct=means.get("iowait_pct"),
        steal_pct=means.get("steal_pct"),
        disk_read_mib_s=means.get("disk_read_mib_s"),
        other_cores=other,
        machine_cores=cores,
        job_cores=job_cores,
        elsewhere_cores=elsewhere,
    )


def _dali_decoder(dali: Mapping[str, Any], lane: LaneRecord, watched: bool) -> str | None:
    """The decoder a DALI lane ran: as set, else the probe's default (cpu without a GPU, mixed
    on one); a watched iterator's that could not be read is not known (None)."""
    asked = dali.get("decoder")
    if asked or watched:
        return str(asked) if asked else None
    return "cpu" if lane.gpu_index is None else "mixed"
