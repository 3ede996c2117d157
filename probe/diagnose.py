"""The diagnosis: from stored runs, whether each GPU starves, why, and what to change.

Pure functions of what the store holds. `lane_facts` gathers what the rules need for one lane;
`judge_lane` turns facts into a verdict with its evidence; `judge_run` adds what only several
lanes show (shard imbalance, loaders sharing too few cores); `analyze_sweep` finds a sweep's knee
and the settings past it that made things slower; `recommend` turns one run's verdicts into
ranked, exact changes, each with the throughput it predicts and how that was predicted.

Thresholds are named below with their reasons. Starvation is the share of wall time the consumer
waits for data; TensorFlow's input-pipeline analyzer calls >= 20% highly and >= 5% moderately
input-bound, and so does this.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from probe.steady import MIN_BLOCKS, Estimate, at_least, plus_minus
from probe.store import LaneRecord, RunRecord, RunStatus, Store
from probe.summary import figures_from_store

WAIT_HIGH = 0.20  # data-wait share of wall time: highly input-bound
WAIT_MODERATE = 0.05  # moderately input-bound; below it, fed
CPU_SATURATED_PCT = 85.0  # host busy share above which decoding has no CPU left
THREADS_SATURATED = 0.90  # a DALI lane keeps this share of its threads' time busy: all of them
MAIN_THREAD_BOUND_PCT = 90.0  # the training loop's thread is busy all the time
IOWAIT_BOUND_PCT = 10.0  # share of CPU time spent waiting for the disk
NVJPG_SATURATED_PCT = 90.0  # hardware JPEG decoder busy share
KNEE_WITHIN = 0.05  # a sweep's knee: the smallest setting within 5% of the best
PAST_PEAK = 0.05  # larger settings this far below the best are oversubscribed
DALI_WORTH_IT = 0.15  # a DALI migration must gain at least 15% over the best DataLoader
IMBALANCE = 0.15  # lanes' images/s differing by more than this share of the fastest
STEP_STALL = 1.5  # mean step over median step: steps stall (the loop waits for CPU too)
EPOCH_START_SHARE = 0.05  # epoch starts costing this share of the time are a finding
LONGER_EPOCHS = 4  # "longer epochs" is predicted for epochs this many times as long
# Other processes using this share of the host's cores (and at least OTHER_LOAD_MIN_CORES), or
# this much steal, could have moved a CPU-bound answer: the figures are not trusted then.
OTHER_LOAD_SHARE = 0.10
OTHER_LOAD_MIN_CORES = 0.25
STEAL_MOVES_PCT = 5.0


class VerdictKind(str, Enum):
    FED = "fed"
    STARVED_CPU_HEADROOM = "starved_cpu_headroom"
    STARVED_CPU_SATURATED = "starved_cpu_saturated"
    STARVED_LOADER_LIMIT = "starved_loader_limit"
    OVERSUBSCRIBED = "oversubscribed"
    MAIN_PROCESS_BOUND = "main_process_bound"
    IO_BOUND = "io_bound"
    DALI_DECODER_SATURATED = "dali_decoder_saturated"
    DALI_THREADS_SATURATED = "dali_threads_saturated"
    SHARD_IMBALANCE = "shard_imbalance"
    SHARED_CORES = "shared_cores"
    EPOCH_START_STALL = "epoch_start_stall"
    HOST_BUSY = "host_busy"
    PIPELINE_ONLY = "pipeline_only"
    UNKNOWN = "unknown"


STARVED = frozenset(
    {
        VerdictKind.STARVED_CPU_HEADROOM,
        VerdictKind.STARVED_CPU_SATURATED,
        VerdictKind.STARVED_LOADER_LIMIT,
        VerdictKind.OVERSUBSCRIBED,
        VerdictKind.MAIN_PROCESS_BOUND,
        VerdictKind.IO_BOUND,
        VerdictKind.DALI_DECODER_SATURATED,
        VerdictKind.DALI_THREADS_SATURATED,
        VerdictKind.SHARED_CORES,
        VerdictKind.EPOCH_START_STALL,
    }
)

TITLES = {
    VerdictKind.FED: "fed: compute-bound",
    VerdictKind.STARVED_CPU_HEADROOM: "starved, with CPU headroom: too few workers",
    VerdictKind.STARVED_CPU_SATURATED: (
        "starved, with the CPU saturated: decoding needs more cores or the GPU"
    ),
    VerdictKind.STARVED_LOADER_LIMIT: "starved, though the CPU has room: more workers do not help",
    VerdictKind.OVERSUBSCRIBED: "oversubscribed: more workers made it slower",
    VerdictKind.MAIN_PROCESS_BOUND: "starved by the main process (collation, host-to-device copy)",
    VerdictKind.IO_BOUND: "starved by storage: I/O bound",
    VerdictKind.DALI_DECODER_SATURATED: "starved: the hardware JPEG decoder is saturated",
    VerdictKind.DALI_THREADS_SATURATED: "starved: DALI's CPU threads are saturated",
    VerdictKind.SHARD_IMBALANCE: "shard imbalance: some GPUs wait for the slowest",
    VerdictKind.SHARED_CORES: "several lanes' loaders share too few cores",
    VerdictKind.EPOCH_START_STALL: (
        "starved at epoch starts: the loader's prefetch drains at every epoch's end"
    ),
    VerdictKind.HOST_BUSY: (
        "the host was busy: other processes took CPU the pipeline needs, so these figures "
        "cannot be trusted"
    ),
    VerdictKind.PIPELINE_ONLY: "the pipeline alone: its capacity (no consumer to starve)",
    VerdictKind.UNKNOWN: "not enough measured to judge",
}


class Severity(str, Enum):
    HIGH = "high"
    MODERATE = "moderate"
    NONE = "none"


def severity_of(data_wait_frac: float | None) -> Severity:
    if data_wait_frac is None:
        return Severity.NONE
    if data_wait_frac >= WAIT_HIGH:
        return Severity.HIGH
    if data_wait_frac >= WAIT_MODERATE:
        return Severity.MODERATE
    return Severity.NONE


@dataclass(frozen=True)
class Evidence:
    metric: str  # the metric's name, as stored
    value: float | None
    text: str  # the number and what it means, for people


@dataclass(frozen=True)
class Verdict:
    kind: VerdictKind
    severity: Severity
    data_wait_frac: float | None
    evidence: tuple[Evidence, ...]
    lane: int | None = None  # None: the whole run
    partial: bool = False  # judged from a run that did not complete
    reliable: bool = True  # False: the host's other load could have moved it

    @property
    def title(self) -> str:
        return TITLES[self.kind]

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(kind=self.kind.value, severity=self.severity.value, title=self.title)
        return out


@dataclass(frozen=True)
class Recommendation:
    action: str  # what to do, in words
    setting: str  # the exact change, e.g. "num_workers=12"
    predicted_images_per_s: float | None
    basis: str  # how the prediction was made
    measured_images_per_s: float | None = None  # once verified by running it
    notes: tuple[str, ...] = ()  # what it frees and costs, or why not more
    predicted_error: float | None = None  # of a prediction measured: its 95% half-width

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LaneFacts:
    """What the rules read about one lane (None: not measured)."""

    lane: int
    status: str
    backend: str  # "torch" or "dali"
    consumer: str  # "none", "sleep:MS", "model:NAME"
    batch_size: int
    batches: int
    images_per_s: float
    data_wait_frac: float | None
    step_ms_p50: float | None
    step_ms_mean: float | None
    num_workers: int | None  # DataLoader
    pin_memory: bool | None
    output_dtype: str | None
    num_threads: int | None  # DALI
    decoder: str | None
    on_gpu: bool
    hostname: str
    host_cpus: int
    lanes_on_host: int
    host_cpu_pct: float | None  # busy share of all cores
    iowait_pct: float | None
    steal_pct: float | None
    disk_read_mib_s: float | None
    lane_cpu_pct: float | None  # the lane's processes, % of one core
    main_thread_cpu_pct: float | None
    sm_active_pct: float | None
    sm_active_source: str | None
    kernel_active_pct: float | None
    nvjpg_pct: float | None
    memory_used_mib: float | None
    images_per_s_error: float | None = None  # 95% interval half-width
    data_wait_frac_error: float | None = None
    blocks: int = 0  # the blocks its errors rest on
    persistent_workers: bool | None = None  # DataLoader
    epoch_start: dict[str, Any] | None = None  # what its epoch starts cost (probe.summary)
    consumer_alone: dict[str, Any] | None = None  # the consumer on batches on the device
    host_other_cores: float | None = None  # cores other processes used meanwhile ...
    machine_cores: int | None = None  # ... of all the machine's (not only those it may use)

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
        if self.consumer_alone and self.consumer_alone.get("images_per_s"):
            return float(self.consumer_alone["images_per_s"])
        if not self.step_ms_p50 or self.step_ms_p50 <= 0.01:
            return None
        return self.batch_size / (self.step_ms_p50 / 1000)

    @property
    def epoch_share(self) -> float:
        """The share of the time its epoch starts cost (0 when none was measured)."""
        return float(self.epoch_start["share"]) if self.epoch_start else 0.0

    @property
    def epoch_stalls_most(self) -> bool:
        """Whether epoch starts cost EPOCH_START_SHARE or more, and most of the data-wait."""
        wait = self.data_wait_frac or 0.0
        return self.epoch_share >= EPOCH_START_SHARE and self.epoch_share >= wait / 2

    @property
    def steady_wait(self) -> float | None:
        """Its data-wait with the epoch starts' stalls taken out."""
        wait = self.data_wait_frac
        share = self.epoch_share
        if wait is None or not share or share >= 1:
            return wait
        return max(0.0, (wait - share) / (1 - share))

    @property
    def cpu_saturated(self) -> bool:
        """Whether the host, or the lane's share of its cores, has no CPU left."""
        if self.host_cpu_pct is not None and self.host_cpu_pct >= CPU_SATURATED_PCT:
            return True
        share = CPU_SATURATED_PCT * self.cores_per_lane
        return self.lane_cpu_pct is not None and self.lane_cpu_pct >= share

    @property
    def host_busy(self) -> bool:
        """Whether other processes (or the hypervisor) took enough CPU to move the answer."""
        steal = self.steal_pct or 0.0
        other = self.host_other_cores or 0.0
        cores = self.machine_cores or self.host_cpus
        enough = max(OTHER_LOAD_MIN_CORES, OTHER_LOAD_SHARE * cores)
        return steal >= STEAL_MOVES_PCT or other >= enough

    @property
    def setting(self) -> str:
        if self.backend == "dali":
            return f"DALI decoder={self.decoder} num_threads={self.num_threads}"
        return f"num_workers={self.num_workers}"


def lane_facts(store: Store, run: RunRecord, lane: LaneRecord) -> LaneFacts:
    """The facts of one lane, from the store (host figures cut to the lane's window)."""
    figures = lane.summary if lane.summary is not None else figures_from_store(store, run, lane)
    stats = store.batch_stats(run.run_id, lane.lane)
    host: dict[str, float | None] = {}
    if stats["n"]:
        host = store.host_means(run.run_id, lane.hostname, stats["start_ns"], stats["end_ns"])
    spec = run.config.get("spec", {})
    loader, dali = spec.get("dataloader", {}), spec.get("dali", {})
    torch_lane = run.pipeline == "torch"
    on_gpu = lane.gpu_index is not None
    machine = run.host.get("nodes", {}).get(lane.hostname, run.host)
    other = None
    cores = machine.get("cpu_cores_total") or machine.get("cpus") or 1
    busy, tree = host.get("cpu_pct"), host.get("tree_cpu_pct")
    if busy is not None and tree is not None:  # the machine's busy cores less the run's own
        other = max(0.0, busy / 100 * cores - tree / 100)
    return LaneFacts(
        lane=lane.lane,
        status=lane.status.value,
        backend=run.pipeline,
        consumer=run.consumer,
        batch_size=int(spec.get("batch_size", 0)),
        batches=figures["batches"],
        images_per_s=figures["images_per_s"],
        data_wait_frac=figures["data_wait_frac"],
        step_ms_p50=figures.get("step_ms_p50"),
        step_ms_mean=stats["step_mean_s"] * 1e3 if stats["n"] else None,
        num_workers=loader.get("num_workers") if torch_lane else None,
        pin_memory=loader.get("pin_memory") if torch_lane else None,
        output_dtype=(loader.get("output_dtype") or ("uint8" if on_gpu else "float32"))
        if torch_lane
        else None,
        num_threads=None if torch_lane else dali.get("num_threads"),
        decoder=None if torch_lane else _dali_decoder(dali, lane),
        on_gpu=on_gpu,
        hostname=lane.hostname,
        host_cpus=int(machine.get("cpus") or 1),
        lanes_on_host=sum(1 for x in store.lanes(run.run_id) if x.hostname == lane.hostname),
        host_cpu_pct=host.get("cpu_pct"),
        iowait_pct=host.get("iowait_pct"),
        steal_pct=host.get("steal_pct"),
        disk_read_mib_s=host.get("disk_read_mib_s"),
        lane_cpu_pct=figures.get("cpu_pct"),
        main_thread_cpu_pct=figures.get("main_thread_cpu_pct"),
        sm_active_pct=figures.get("sm_active_pct"),
        sm_active_source=figures.get("sm_active_source"),
        kernel_active_pct=figures.get("kernel_active_pct"),
        nvjpg_pct=figures.get("nvjpg_pct"),
        memory_used_mib=figures.get("memory_used_mib"),
        images_per_s_error=figures.get("images_per_s_error"),
        data_wait_frac_error=figures.get("data_wait_frac_error"),
        blocks=figures.get("blocks") or 0,
        persistent_workers=loader.get("persistent_workers") if torch_lane else None,
        epoch_start=figures.get("epoch_start"),
        consumer_alone=figures.get("consumer_alone"),
        host_other_cores=other,
        machine_cores=int(cores),
    )


def judge_lane(facts: LaneFacts) -> Verdict:
    """One lane's verdict, and the numbers it rests on."""
    partial = facts.status != RunStatus.COMPLETED.value
    wait = facts.data_wait_frac

    def verdict(
        kind: VerdictKind, severity: Severity, evidence: Iterable[Evidence], reliable: bool = True
    ) -> Verdict:
        return Verdict(kind, severity, wait, tuple(evidence), facts.lane, partial, reliable)

    if facts.batches == 0:
        note = Evidence("batches", 0.0, f"lane {facts.lane} measured no batch ({facts.status})")
        return Verdict(VerdictKind.UNKNOWN, Severity.NONE, None, (note,), facts.lane, True)
    gpu = _gpu_evidence(facts)
    load = _host_load_evidence(facts)
    alone = _consumer_evidence(facts)
    if facts.consumer == "none":
        evidence = [_rate_evidence(facts), *_cpu_evidence(facts), _wait_evidence(facts), *gpu]
        if facts.epoch_share >= EPOCH_START_SHARE:  # its capacity, less its epoch starts
            evidence += _epoch_evidence(facts)
        return verdict(VerdictKind.PIPELINE_ONLY, Severity.NONE, [*evidence, *load])
    severity = severity_of(wait)
    if severity is Severity.NONE:  # fed even with the host's other load: that answer holds
        evidence = [_wait_evidence(facts), *gpu, *_step(facts), *alone, *load]
        return verdict(VerdictKind.FED, severity, evidence)
    if facts.host_busy:
        evidence = [_wait_evidence(facts), *load, *_cpu_evidence(facts), *gpu, *alone]
        return verdict(VerdictKind.HOST_BUSY, severity, evidence, reliable=False)
    if facts.epoch_stalls_most:
        evidence = [_wait_evidence(facts), *_epoch_evidence(facts), *gpu, *alone]
        return verdict(VerdictKind.EPOCH_START_STALL, severity, evidence)
    kind, why = _cause(facts)
    return verdict(kind, severity, [_wait_evidence(facts), *gpu, *why, *alone])


def _cause(facts: LaneFacts) -> tuple[VerdictKind, list[Evidence]]:
    """Why a starved lane starves: the first rule whose numbers are met. When none is met, it
    says that what holds the loader was not measured, and what to measure next."""
    for rule in (_io_bound, _dali_limits, _main_process_bound, _cpu_limits):
        found = rule(facts)
        if found is not None:
            return found
    setting = "num_workers" if facts.backend == "torch" else "num_threads"
    more = 2 * (facts.loaders or 1)
    ruled_out = [f"the training loop's thread ({_pct_of(facts.main_thread_cpu_pct)} busy)"]
    if facts.iowait_pct is not None:
        ruled_out.append(f"storage (iowait {facts.iowait_pct:.0f}%)")
    if facts.host_other_cores is not None:
        ruled_out.append(f"the host's other load ({facts.host_other_cores:.1f} cores)")
    if facts.epoch_share < EPOCH_START_SHARE:
        ruled_out.append(f"epoch starts ({facts.epoch_share:.1%} of the time)")
    unknown = Evidence(
        setting,
        float(facts.loaders or 0),
        f"{facts.loaders_text} for {facts.cores_per_lane_text}, yet the CPU is not saturated; "
        f"not {', not '.join(ruled_out)}: what holds the loader is not measured here. Measure "
        "next: the pipeline alone (--consumer none), to see what it can give, and "
        f"{setting}={more} (`probe sweep --values {facts.loaders},{more}`), to see whether "
        "more help",
    )
    return VerdictKind.STARVED_LOADER_LIMIT, [*_cpu_evidence(facts), unknown, *_stalls(facts)]


_Cause = tuple[VerdictKind, list[Evidence]] | None


def _io_bound(facts: LaneFacts) -> _Cause:
    if facts.iowait_pct is None or facts.iowait_pct < IOWAIT_BOUND_PCT:
        return None
    iowait = Evidence(
        "iowait_pct",
        facts.iowait_pct,
        f"iowait {facts.iowait_pct:.0f}% of CPU time (>= {IOWAIT_BOUND_PCT:.0f}%)",
    )
    reads = Evidence(
        "disk_read_mib_s", facts.disk_read_mib_s, f"disk reads {_num(facts.disk_read_mib_s)} MiB/s"
    )
    return VerdictKind.IO_BOUND, [iowait, reads, *_cpu_evidence(facts)]


def _dali_limits(facts: LaneFacts) -> _Cause:
    if facts.backend != "dali":
        return None
    if facts.decoder == "mixed" and (facts.nvjpg_pct or 0.0) >= NVJPG_SATURATED_PCT:
        busy = Evidence(
            "nvjpg_pct",
            facts.nvjpg_pct,
            f"hardware JPEG decoder {facts.nvjpg_pct:.0f}% busy (NVML; saturated from "
            f"{NVJPG_SATURATED_PCT:.0f}%)",
        )
        return VerdictKind.DALI_DECODER_SATURATED, [busy, *_cpu_evidence(facts)]
    threads = facts.num_threads or 1
    if (facts.lane_cpu_pct or 0.0) >= THREADS_SATURATED * 100 * threads:
        busy = Evidence(
            "cpu_pct",
            facts.lane_cpu_pct,
            f"the lane uses {(facts.lane_cpu_pct or 0) / 100:.1f} cores with {threads} DALI "
            "threads: all of them are busy",
        )
        return VerdictKind.DALI_THREADS_SATURATED, [busy, *_cpu_evidence(facts)]
    return None


def _main_process_bound(facts: LaneFacts) -> _Cause:
    if facts.backend != "torch" or (facts.main_thread_cpu_pct or 0.0) < MAIN_THREAD_BOUND_PCT:
        return None
    return VerdictKind.MAIN_PROCESS_BOUND, [*_cpu_evidence(facts), *_transfer_evidence(facts)]


def _cpu_limits(facts: LaneFacts) -> _Cause:
    if facts.cpu_saturated:
        return VerdictKind.STARVED_CPU_SATURATED, [*_cpu_evidence(facts), *_stalls(facts)]
    if facts.loaders is not None and facts.loaders < facts.cores_per_lane:
        return VerdictKind.STARVED_CPU_HEADROOM, [*_cpu_evidence(facts), *_stalls(facts)]
    return None


@dataclass(frozen=True)
class RunDiagnosis:
    """A run's verdict, its lanes' verdicts, and recommendations from this run alone."""

    run_id: str
    verdict: Verdict
    lanes: tuple[Verdict, ...]
    findings: tuple[Verdict, ...]  # what only several lanes show
    recommendations: tuple[Recommendation, ...]
    partial: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "partial": self.partial,
            "verdict": self.verdict.as_dict(),
            "lanes": [v.as_dict() for v in self.lanes],
            "findings": [v.as_dict() for v in self.findings],
            "recommendations": [r.as_dict() for r in self.recommendations],
        }


def run_facts(store: Store, run_id: str) -> list[LaneFacts]:
    """The facts of each lane of a stored run."""
    run = store.run(run_id)
    return [lane_facts(store, run, lane) for lane in store.lanes(run.run_id)]


def diagnose_run(store: Store, run_id: str) -> RunDiagnosis:
    """Diagnoses one stored run. A failed or interrupted run is judged on what it recorded and
    marked partial."""
    run = store.run(run_id)
    return judge_run(run.run_id, run.status, run_facts(store, run.run_id))


def judge_run(run_id: str, status: RunStatus, facts: Sequence[LaneFacts]) -> RunDiagnosis:
    lanes = tuple(judge_lane(f) for f in facts)
    findings = (*_across_lanes(facts, lanes), *_epoch_findings(facts, lanes))
    partial = status is not RunStatus.COMPLETED or any(v.partial for v in lanes)
    candidates = [*lanes, *findings]
    if not candidates:
        none = Evidence("lanes", 0.0, "the run has no lanes")
        empty = Verdict(VerdictKind.UNKNOWN, Severity.NONE, None, (none,), partial=True)
        return RunDiagnosis(run_id, empty, (), (), (), True)
    worst = max(candidates, key=_rank)
    waits = [v.data_wait_frac for v in lanes if v.data_wait_frac is not None]
    overall = Verdict(
        worst.kind,
        worst.severity,
        max(waits) if waits else None,
        worst.evidence,
        worst.lane,
        partial,
        all(v.reliable for v in candidates),
    )
    recommendations = tuple(recommend(facts, lanes, findings))
    return RunDiagnosis(run_id, overall, lanes, findings, recommendations, partial)


def _rank(verdict: Verdict) -> tuple[int, int, float]:
    """Untrusted figures first (nothing else can be judged then), then by severity."""
    order = {Severity.HIGH: 3, Severity.MODERATE: 2, Severity.NONE: 1}
    known = 0 if verdict.kind is VerdictKind.UNKNOWN else 1
    return (
        (0 if verdict.reliable else 1),
        order[verdict.severity] * 2 + known,
        (verdict.data_wait_frac or 0.0),
    )


def _epoch_findings(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> list[Verdict]:
    """Epoch starts that cost a lane EPOCH_START_SHARE or more of its time while it also
    starves between them (where that is all it does, its own verdict says so)."""
    out = []
    for fact, verdict in zip(facts, verdicts, strict=True):
        if fact.epoch_share < EPOCH_START_SHARE or verdict.kind in (
            VerdictKind.EPOCH_START_STALL,
            VerdictKind.HOST_BUSY,
            VerdictKind.PIPELINE_ONLY,  # no consumer to starve: its evidence says what they cost
            VerdictKind.UNKNOWN,
        ):
            continue
        share = fact.epoch_share
        out.append(
            Verdict(
                VerdictKind.EPOCH_START_STALL,
                severity_of(share),
                fact.data_wait_frac,
                tuple(_epoch_evidence(fact)),
                fact.lane,
            )
        )
    return out


def _across_lanes(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> list[Verdict]:
    measured = [(f, v) for f, v in zip(facts, verdicts, strict=True) if f.batches > 0]
    if len(measured) < 2 or measured[0][0].consumer == "none":
        return []
    out = []
    worst_wait = max(f.data_wait_frac or 0.0 for f, _ in measured)
    rates = [f.images_per_s for f, _ in measured]
    several_hosts = len({f.hostname for f, _ in measured}) > 1
    if (max(rates) - min(rates)) / max(rates) > IMBALANCE:
        # Under DDP every step waits for the slowest rank: its rate is everybody's.
        slowest = min(measured, key=lambda item: item[0].images_per_s)[0]
        evidence = tuple(
            Evidence(
                "images_per_s",
                f.images_per_s,
                f"lane {f.lane}{f' on {f.hostname}' if several_hosts else ''}: "
                f"{f.images_per_s:,.0f} images/s, data-wait {_pct(f.data_wait_frac)}",
            )
            for f, _ in measured
        )
        severity = severity_of(worst_wait)
        out.append(
            Verdict(VerdictKind.SHARD_IMBALANCE, severity, worst_wait, evidence, slowest.lane)
        )
    for hostname in dict.fromkeys(f.hostname for f, _ in measured):  # CPU is shared per host
        starved = [f for f, v in measured if v.kind in STARVED and f.hostname == hostname]
        if len(starved) < 2 or (starved[0].host_cpu_pct or 0.0) < CPU_SATURATED_PCT:
            continue
        host = starved[0]
        on = f" of {hostname}" if several_hosts else ""
        evidence = (
            Evidence(
                "host_cpu_pct",
                host.host_cpu_pct,
                f"host{on} CPU {host.host_cpu_pct:.0f}% busy "
                f"(saturated from {CPU_SATURATED_PCT:.0f}%)",
            ),
            Evidence(
                "lanes",
                float(host.lanes_on_host),
                f"{host.lanes_on_host} lanes' loaders share {host.host_cpus} cores{on}: "
                f"{host.cores_per_lane:g} each",
            ),
        )
        wait = max(f.data_wait_frac or 0.0 for f in starved)
        out.append(Verdict(VerdictKind.SHARED_CORES, severity_of(wait), wait, evidence))
    return out


@dataclass(frozen=True)
class SweepPoint:
    setting: int  # num_workers or num_threads
    images_per_s: float
    data_wait_frac: float | None = None
    cpu_pct: float | None = None
    run_id: str | None = None
    images_per_s_error: float | None = None  # 95% interval half-width
    blocks: int = MIN_BLOCKS  # the blocks its error rests on
    data_wait_frac_error: float | None = None
    host_busy: bool = False  # other processes took enough CPU to move it

    @property
    def estimate(self) -> Estimate:
        return Estimate(self.images_per_s, self.images_per_s_error, self.blocks)


@dataclass(frozen=True)
class SweepAnalysis:
    knob: str  # "num_workers" or "num_threads"
    points: tuple[SweepPoint, ...]  # by setting
    best: SweepPoint
    knee: SweepPoint  # the smallest setting not significantly below (1 - KNEE_WITHIN) x best
    oversubscribed: tuple[SweepPoint, ...]  # past the best, significantly below (1 - PAST_PEAK)

    def as_dict(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "points": [asdict(p) for p in self.points],
            "best": asdict(self.best),
            "knee": asdict(self.knee),
            "oversubscribed": [asdict(p) for p in self.oversubscribed],
        }


def analyze_sweep(points: Sequence[SweepPoint], knob: str = "num_workers") -> SweepAnalysis:
    """The knee and the oversubscribed settings of a sweep, judged with each point's error:
    the knee is the smallest setting whose images/s is not significantly below 95% of the
    best's; a setting past the best that is significantly below that is oversubscribed.

    Raises:
        ValueError: no point measured anything.
    """
    measured = sorted((p for p in points if p.images_per_s > 0), key=lambda p: p.setting)
    if not measured:
        raise ValueError("no sweep point measured any throughput")
    best = max(measured, key=lambda p: p.images_per_s)
    knee = next(p for p in measured if at_least(p.estimate, 1 - KNEE_WITHIN, best.estimate))
    over = tuple(
        p
        for p in measured
        if p.setting > best.setting and not at_least(p.estimate, 1 - PAST_PEAK, best.estimate)
    )
    return SweepAnalysis(knob, tuple(measured), best, knee, over)


def past_the_peak(points: Sequence[SweepPoint]) -> bool:
    """Whether a sweep has clearly fallen past its peak: its last point, at a larger setting
    than the best, is significantly below 95% of the best."""
    if len(points) < 2:
        return False
    best = max(points, key=lambda p: p.images_per_s)
    last = points[-1]
    return last.setting > best.setting and not at_least(last.estimate, 1 - PAST_PEAK, best.estimate)


def ladder(cores_per_lane: int) -> list[int]:
    """Settings to sweep: powers of two up to the cores per GPU, the core count itself, and one
    step past it, to see oversubscription."""
    cores = max(1, cores_per_lane)
    steps = [2**i for i in range(int(math.log2(cores)) + 1)]
    steps.append(cores)
    steps.append(2 ** math.ceil(math.log2(cores + 1)))
    return sorted(set(steps))


def recommend(
    facts: Sequence[LaneFacts], verdicts: Sequence[Verdict], findings: Sequence[Verdict] = ()
) -> list[Recommendation]:
    """Recommendations from one run alone (no sweep): estimates, and said to be."""
    lane, verdict = max(zip(facts, verdicts, strict=True), key=lambda item: _rank(item[1]))
    if not verdict.reliable:
        return [_measure_again()]
    out: list[Recommendation] = []
    if verdict.kind is VerdictKind.FED:
        out.append(
            Recommendation(
                "compute-bound: the pipeline keeps up, and DALI would not help",
                "no change",
                sum(f.images_per_s for f in facts),
                "measured in this run",
            )
        )
    if verdict.kind is VerdictKind.STARVED_CPU_HEADROOM and lane.backend == "torch":
        out.append(_more_workers(lane))
    if verdict.kind is VerdictKind.DALI_THREADS_SATURATED:
        out += _more_threads(lane)
    epochs = [*verdicts, *findings]
    if any(v.kind is VerdictKind.EPOCH_START_STALL for v in epochs):
        out += epoch_fixes(facts)
    if verdict.kind in STARVED - {VerdictKind.IO_BOUND, VerdictKind.EPOCH_START_STALL} and (
        lane.backend == "torch"
    ):
        out += _transfer_fixes(lane)
        # Not for a loader held by something unmeasured: DALI is no answer to an unknown.
        if verdict.kind in (VerdictKind.STARVED_CPU_SATURATED, VerdictKind.MAIN_PROCESS_BOUND):
            out.append(_to_dali_estimate(lane))
    if verdict.kind is VerdictKind.IO_BOUND:
        out.append(
            Recommendation(
                "faster storage or a local copy of the data: the loader waits for reads, and "
                "DALI will not fix storage",
                "storage",
                None,
                "not predicted: storage is outside the pipeline",
            )
        )
    if verdict.kind is VerdictKind.DALI_DECODER_SATURATED:
        out.append(
            Recommendation(
                "send fewer JPEGs to the hardware decoder and more to nvJPEG on the SMs",
                "DALI hw_decoder_load=0.5",
                None,
                "not predicted: the split between the decoders is not measured apart",
            )
        )
    return sorted(out, key=lambda r: -(r.predicted_images_per_s or 0.0))


def _measure_again() -> Recommendation:
    return Recommendation(
        "measure again on a quiet host: other processes took CPU the pipeline needs, so what "
        "more workers or DALI would give cannot be told from these figures",
        "measure again",
        None,
        "not predicted: the figures are not trusted",
    )


def epoch_fixes(
    facts: Sequence[LaneFacts], stream: Mapping[int, float] | None = None, basis: str = ""
) -> list[Recommendation]:
    """What takes the epoch starts' stalls away, ranked by the images/s each is predicted to
    give. A fix that removes a share of a lane's stall moves its time per image that share of
    the way to its rate without them: measured where `stream` gives it (the same setting read
    as one stream, per lane; `basis` says where), else its rate between epoch starts."""
    stalled = [f for f in facts if f.epoch_start and f.epoch_start["stall_ms"] and f.batches]
    if not stalled:
        return []

    def predicted(removes: Callable[[LaneFacts, dict[str, Any]], float | None]) -> float | None:
        """All lanes' images/s with the share `removes(lane, start)` of each stall taken away
        (None where that share cannot be told)."""
        total = 0.0
        for f in facts:
            start = f.epoch_start
            if f not in stalled or start is None or not f.images_per_s:
                total += f.images_per_s
                continue
            share = removes(f, start)
            if share is None:
                return None
            steady = (stream or {}).get(f.lane) or start["steady_images_per_s"]
            floor = 1 / steady if steady else 0.0
            total += 1 / (floor + (1 / f.images_per_s - floor) * (1 - share))
        return total

    first = stalled[0]
    start = first.epoch_start or {}
    split = start.get("loader_start_ms") is not None
    steady = basis or "estimated: the rate measured between epoch starts"
    out = [
        Recommendation(
            "read across epoch ends: one endless sampler over the shard's epochs (the read "
            "order of each epoch kept), so that the prefetch never drains, as feedscope's "
            "stream reading and timm's MultiEpochsDataLoader do",
            "sampler=endless",
            predicted(lambda f, start: 1.0),
            steady,
        ),
        Recommendation(
            f"make an epoch {LONGER_EPOCHS}x longer (the shard {LONGER_EPOCHS} times over in "
            "its sampler): the same stall, a quarter as often",
            f"epoch_length={LONGER_EPOCHS}x",
            predicted(lambda f, start: 1 - 1 / LONGER_EPOCHS),
            "estimated: the measured stalls, a quarter as often",
        ),
    ]
    not_split = "not predicted: the loader's start is not measured apart here"
    if first.backend == "torch" and first.persistent_workers is False:
        out.append(
            Recommendation(
                "keep the workers from one epoch to the next (persistent_workers=True): an "
                "epoch start no longer starts them; but dataset state set per epoch in the main "
                "process (set_epoch) then no longer reaches them",
                "persistent_workers=True",
                predicted(_starting_share),
                "estimated: the stall less the loader's measured start" if split else not_split,
            )
        )
    per_epoch = start.get("batches_per_epoch") or 0
    workers = first.num_workers or 0
    if first.backend == "torch" and workers > per_epoch > 0:
        fewer = max(1, math.floor(per_epoch))
        out.append(
            Recommendation(
                f"fewer workers than batches per epoch: {workers} workers for {per_epoch:.0f} "
                f"batches, so {workers - fewer} of them sit idle at every epoch start, yet each "
                "is started or resumed with it",
                f"num_workers={fewer}",
                predicted(
                    lambda f, start: (
                        None
                        if _starting_share(f, start) is None
                        else (_starting_share(f, start) or 0.0) * (1 - fewer / workers)
                    )
                ),
                "estimated: the loader's measured start, for fewer workers" if split else not_split,
            )
        )
    return sorted(out, key=lambda r: -(r.predicted_images_per_s or 0.0))


def _starting_share(facts: LaneFacts, start: dict[str, Any]) -> float | None:
    """The share of an epoch start's stall spent starting the loader (None: not measured)."""
    starting, stall = start.get("loader_start_ms"), start.get("stall_ms")
    if starting is None or not stall:
        return None
    return min(1.0, float(starting) / float(stall))


def _more_workers(lane: LaneFacts) -> Recommendation:
    workers = max(lane.num_workers or 1, 1)
    per_worker = lane.images_per_s / workers
    wanted = lane.consumer_images_per_s or lane.images_per_s * 2
    needed = math.ceil(wanted / per_worker) if per_worker > 0 else workers * 2
    target = int(min(max(needed, workers + 1), lane.cores_per_lane))
    predicted = per_worker * target
    if lane.consumer_images_per_s is not None:
        predicted = min(predicted, lane.consumer_images_per_s)
    return Recommendation(
        f"raise num_workers from {workers} to {target}",
        f"num_workers={target}",
        predicted,
        "estimated: images/s per worker times workers, at most the consumer's own rate "
        "(min(pipeline, consumer)); `probe sweep` measures the knee",
    )


def _more_threads(lane: LaneFacts) -> list[Recommendation]:
    threads = lane.num_threads or 1
    target = int(min(threads * 2, lane.cores_per_lane))
    if target <= threads:
        return []
    predicted = lane.images_per_s * target / threads
    if lane.consumer_images_per_s is not None:
        predicted = min(predicted, lane.consumer_images_per_s)
    return [
        Recommendation(
            f"raise DALI num_threads from {threads} to {target}",
            f"DALI num_threads={target}",
            predicted,
            "estimated: images/s per thread times threads, at most the consumer's own rate",
        )
    ]


def _transfer_fixes(lane: LaneFacts) -> list[Recommendation]:
    basis = "not predicted: the copy's share of the wait is not measured apart"
    out = []
    if lane.on_gpu and lane.pin_memory is False:
        out.append(
            Recommendation(
                "pin the host buffers, so that copies to the GPU run asynchronously",
                "pin_memory=True",
                None,
                basis,
            )
        )
    if lane.output_dtype == "float32" and lane.on_gpu:
        out.append(
            Recommendation(
                "hand over uint8 pixels and normalize on the device (4x less traffic)",
                "output_dtype=uint8",
                None,
                basis,
            )
        )
    return out


def _to_dali_estimate(lane: LaneFacts) -> Recommendation:
    decoder = "mixed" if lane.on_gpu else "cpu"
    where = "nvJPEG and the hardware decoder" if decoder == "mixed" else "its CPU decoder"
    return Recommendation(
        f"move decoding to DALI ({where})",
        f"DALI decoder={decoder} num_threads={min(8, max(1, int(lane.cores_per_lane)))}",
        lane.consumer_images_per_s,
        "estimated: at best the consumer's own rate, if DALI keeps up; `probe doctor` measures it",
    )


# evidence


def _wait_evidence(facts: LaneFacts) -> Evidence:
    wait = facts.data_wait_frac
    if facts.consumer == "none":
        return Evidence(
            "data_wait_frac", wait, f"data-wait {_pct(wait)}: no consumer, so all time is waiting"
        )
    bound = {
        Severity.HIGH: f">= {WAIT_HIGH:.0%}: high",
        Severity.MODERATE: f">= {WAIT_MODERATE:.0%}: moderate",
        Severity.NONE: f"< {WAIT_MODERATE:.0%}",
    }[severity_of(wait)]
    error = facts.data_wait_frac_error
    shown = _pct(wait) if error is None else f"{_pct(wait)} ± {error:.1%}"
    return Evidence("data_wait_frac", wait, f"data-wait {shown} of wall time ({bound})")


def _rate_evidence(facts: LaneFacts) -> Evidence:
    shown = plus_minus(facts.images_per_s, facts.images_per_s_error)
    return Evidence("images_per_s", facts.images_per_s, f"{shown} images/s ({facts.setting})")


def _gpu_evidence(facts: LaneFacts) -> list[Evidence]:
    out = []
    if facts.sm_active_source == "gpm" and facts.sm_active_pct is not None:
        text = f"SM activity {facts.sm_active_pct:.0f}% (GPM)"
        out.append(Evidence("sm_active_pct", facts.sm_active_pct, text))
    if facts.kernel_active_pct is not None:
        text = f"kernel-active {facts.kernel_active_pct:.0f}% (NVML utilization.gpu: overstates)"
        out.append(Evidence("kernel_active_pct", facts.kernel_active_pct, text))
    if facts.backend == "dali" and facts.nvjpg_pct is not None:
        text = f"hardware JPEG decoder {facts.nvjpg_pct:.0f}% (NVML)"
        out.append(Evidence("nvjpg_pct", facts.nvjpg_pct, text))
    return out


def _cpu_evidence(facts: LaneFacts) -> list[Evidence]:
    out = []
    if facts.host_cpu_pct is not None:
        cores = facts.host_cpu_pct / 100 * facts.host_cpus
        text = f"host CPU {facts.host_cpu_pct:.0f}% busy ({cores:.1f} of {facts.host_cpus} cores)"
        out.append(Evidence("host_cpu_pct", facts.host_cpu_pct, text))
    if facts.lane_cpu_pct is not None:
        text = (
            f"the lane's processes use {facts.lane_cpu_pct / 100:.1f} cores "
            f"({facts.loaders_text}; {facts.cores_per_lane_text})"
        )
        out.append(Evidence("cpu_pct", facts.lane_cpu_pct, text))
    if facts.main_thread_cpu_pct is not None:
        text = f"training loop thread {facts.main_thread_cpu_pct:.0f}% busy"
        out.append(Evidence("main_thread_cpu_pct", facts.main_thread_cpu_pct, text))
    return out


def _step(facts: LaneFacts) -> list[Evidence]:
    rate = facts.consumer_images_per_s
    if rate is None or facts.step_ms_p50 is None:
        return []
    text = f"step {facts.step_ms_p50:.1f} ms (median): the consumer could take {rate:,.0f} images/s"
    return [Evidence("step_ms_p50", facts.step_ms_p50, text)]


def _consumer_evidence(facts: LaneFacts) -> list[Evidence]:
    """The consumer alone, as measured on batches already on the device: what no input fix
    can go past."""
    alone = facts.consumer_alone
    if not alone or not alone.get("images_per_s"):
        return []
    rate, error = alone["images_per_s"], alone.get("images_per_s_error")
    text = (
        f"the consumer alone, on batches already on the device: {plus_minus(rate, error)} images/s "
        f"({alone.get('step_ms_p50') or 0:.1f} ms a step): the most any input fix can give"
    )
    return [Evidence("consumer_images_per_s", rate, text)]


def _host_load_evidence(facts: LaneFacts) -> list[Evidence]:
    """The host's other load, where it could have moved the answer."""
    if not facts.host_busy:
        return []
    out = []
    if facts.host_other_cores is not None:
        cores = facts.machine_cores or facts.host_cpus
        share = facts.host_other_cores / max(1, cores)
        text = (
            f"other processes used {facts.host_other_cores:.1f} of the machine's {cores} cores "
            f"({share:.0%}) while it measured"
        )
        out.append(Evidence("host_other_cores", facts.host_other_cores, text))
    if (facts.steal_pct or 0.0) >= STEAL_MOVES_PCT:
        text = f"CPU steal {facts.steal_pct:.0f}%: the hypervisor gave these cores to others"
        out.append(Evidence("steal_pct", facts.steal_pct, text))
    return out


def _epoch_evidence(facts: LaneFacts) -> list[Evidence]:
    start = facts.epoch_start
    if not start:
        return []
    split = ""
    if start.get("loader_start_ms") is not None:
        split = (
            f": {start['loader_start_ms']:.0f} ms to start the loader, "
            f"{start['refill_ms']:.0f} ms to refill its prefetch"
        )
    text = (
        f"epoch starts cost {start['share']:.1%} of the time: {start['starts']} of them, "
        f"{start['stall_ms']:,.0f} ms each{split}; {start['batches_per_epoch']:.0f} batches per "
        f"epoch; between them data-wait is {_pct(facts.steady_wait)}"
    )
    return [Evidence("epoch_start_share", start["share"], text)]


def _stalls(facts: LaneFacts) -> list[Evidence]:
    out = _step(facts)
    mean, median = facts.step_ms_mean, facts.step_ms_p50
    if mean and median and mean >= STEP_STALL * median:
        text = (
            f"steps stall: mean {mean:.0f} ms against a median of {median:.0f} ms "
            "(the training loop waits for CPU too)"
        )
        out.append(Evidence("step_ms_mean", mean, text))
    return out


def _transfer_evidence(facts: LaneFacts) -> list[Evidence]:
    out = []
    if facts.pin_memory is False and facts.on_gpu:
        text = "pin_memory is off: every copy to the GPU is synchronous"
        out.append(Evidence("pin_memory", 0.0, text))
    if facts.output_dtype == "float32" and facts.on_gpu:
        text = "workers hand over float32: 4x the bytes of uint8"
        out.append(Evidence("output_dtype", 4.0, text))
    return out


def _dali_decoder(dali: dict[str, Any], lane: LaneRecord) -> str:
    asked = dali.get("decoder")
    return str(asked) if asked else ("cpu" if lane.gpu_index is None else "mixed")


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _pct_of(value: float | None) -> str:
    """A percentage of one core, as measured: '7%', or 'not measured'."""
    return "not measured" if value is None else f"{value:.0f}%"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"
