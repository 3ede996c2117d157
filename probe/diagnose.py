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
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

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
STOP_SWEEP_BELOW = 0.90  # a sweep stops once a point past the peak falls below 90% of it
DALI_WORTH_IT = 0.15  # a DALI migration must gain at least 15% over the best DataLoader
IMBALANCE = 0.15  # lanes' images/s differing by more than this share of the fastest
STEP_STALL = 1.5  # mean step over median step: steps stall (the loop waits for CPU too)


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
        """What the consumer alone could take: a batch per median step."""
        if not self.step_ms_p50 or self.step_ms_p50 <= 0.01:
            return None
        return self.batch_size / (self.step_ms_p50 / 1000)

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
        output_dtype=loader.get("output_dtype") if torch_lane else None,
        num_threads=None if torch_lane else dali.get("num_threads"),
        decoder=None if torch_lane else _dali_decoder(dali, lane),
        on_gpu=lane.gpu_index is not None,
        hostname=lane.hostname,
        host_cpus=int(run.host.get("nodes", {}).get(lane.hostname, run.host).get("cpus") or 1),
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
    )


def judge_lane(facts: LaneFacts) -> Verdict:
    """One lane's verdict, and the numbers it rests on."""
    partial = facts.status != RunStatus.COMPLETED.value
    wait = facts.data_wait_frac

    def verdict(kind: VerdictKind, severity: Severity, evidence: Iterable[Evidence]) -> Verdict:
        return Verdict(kind, severity, wait, tuple(evidence), facts.lane, partial)

    if facts.batches == 0:
        note = Evidence("batches", 0.0, f"lane {facts.lane} measured no batch ({facts.status})")
        return Verdict(VerdictKind.UNKNOWN, Severity.NONE, None, (note,), facts.lane, True)
    gpu = _gpu_evidence(facts)
    if facts.consumer == "none":
        evidence = [_rate_evidence(facts), *_cpu_evidence(facts), _wait_evidence(facts), *gpu]
        return verdict(VerdictKind.PIPELINE_ONLY, Severity.NONE, evidence)
    severity = severity_of(wait)
    if severity is Severity.NONE:
        return verdict(VerdictKind.FED, severity, [_wait_evidence(facts), *gpu, *_step(facts)])
    kind, why = _cause(facts)
    return verdict(kind, severity, [_wait_evidence(facts), *gpu, *why])


def _cause(facts: LaneFacts) -> tuple[VerdictKind, list[Evidence]]:
    """Why a starved lane starves: the first rule whose numbers are met."""
    for rule in (_io_bound, _dali_limits, _main_process_bound, _cpu_limits):
        found = rule(facts)
        if found is not None:
            return found
    room = Evidence(
        "num_workers" if facts.backend == "torch" else "num_threads",
        float(facts.loaders or 0),
        f"{facts.loaders_text} for {facts.cores_per_lane_text}, yet the CPU is not saturated",
    )
    return VerdictKind.STARVED_LOADER_LIMIT, [*_cpu_evidence(facts), room, *_stalls(facts)]


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
    if _cpu_saturated(facts):
        return VerdictKind.STARVED_CPU_SATURATED, [*_cpu_evidence(facts), *_stalls(facts)]
    if facts.loaders is not None and facts.loaders < facts.cores_per_lane:
        return VerdictKind.STARVED_CPU_HEADROOM, [*_cpu_evidence(facts), *_stalls(facts)]
    return None


def _cpu_saturated(facts: LaneFacts) -> bool:
    if facts.host_cpu_pct is not None and facts.host_cpu_pct >= CPU_SATURATED_PCT:
        return True
    share = CPU_SATURATED_PCT / 100 * 100 * facts.cores_per_lane
    return facts.lane_cpu_pct is not None and facts.lane_cpu_pct >= share


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


def diagnose_run(store: Store, run_id: str) -> RunDiagnosis:
    """Diagnoses one stored run. A failed or interrupted run is judged on what it recorded and
    marked partial."""
    run = store.run(run_id)
    facts = [lane_facts(store, run, lane) for lane in store.lanes(run.run_id)]
    return judge_run(run.run_id, run.status, facts)


def judge_run(run_id: str, status: RunStatus, facts: Sequence[LaneFacts]) -> RunDiagnosis:
    lanes = tuple(judge_lane(f) for f in facts)
    findings = tuple(_across_lanes(facts, lanes))
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
    )
    return RunDiagnosis(run_id, overall, lanes, findings, tuple(recommend(facts, lanes)), partial)


def _rank(verdict: Verdict) -> tuple[int, float]:
    order = {Severity.HIGH: 3, Severity.MODERATE: 2, Severity.NONE: 1}
    known = 0 if verdict.kind is VerdictKind.UNKNOWN else 1
    return order[verdict.severity] * 2 + known, verdict.data_wait_frac or 0.0


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


@dataclass(frozen=True)
class SweepAnalysis:
    knob: str  # "num_workers" or "num_threads"
    points: tuple[SweepPoint, ...]  # by setting
    best: SweepPoint
    knee: SweepPoint  # the smallest setting within KNEE_WITHIN of the best
    oversubscribed: tuple[SweepPoint, ...]  # past the best and more than PAST_PEAK below it

    def as_dict(self) -> dict[str, Any]:
        return {
            "knob": self.knob,
            "points": [asdict(p) for p in self.points],
            "best": asdict(self.best),
            "knee": asdict(self.knee),
            "oversubscribed": [asdict(p) for p in self.oversubscribed],
        }


def analyze_sweep(points: Sequence[SweepPoint], knob: str = "num_workers") -> SweepAnalysis:
    """The knee and the oversubscribed settings of a sweep.

    Raises:
        ValueError: no point measured anything.
    """
    measured = sorted((p for p in points if p.images_per_s > 0), key=lambda p: p.setting)
    if not measured:
        raise ValueError("no sweep point measured any throughput")
    best = max(measured, key=lambda p: p.images_per_s)
    floor = (1 - KNEE_WITHIN) * best.images_per_s
    knee = next(p for p in measured if p.images_per_s >= floor)
    slower = (1 - PAST_PEAK) * best.images_per_s
    over = tuple(p for p in measured if p.setting > best.setting and p.images_per_s < slower)
    return SweepAnalysis(knob, tuple(measured), best, knee, over)


def past_the_peak(points: Sequence[SweepPoint]) -> bool:
    """Whether a sweep has clearly fallen past its peak: its last point, at a larger setting
    than the best, is below STOP_SWEEP_BELOW of the best."""
    if len(points) < 2:
        return False
    best = max(points, key=lambda p: p.images_per_s)
    last = points[-1]
    return last.setting > best.setting and last.images_per_s < STOP_SWEEP_BELOW * best.images_per_s


def ladder(cores_per_lane: int) -> list[int]:
    """Settings to sweep: powers of two up to the cores per GPU, the core count itself, and one
    step past it, to see oversubscription."""
    cores = max(1, cores_per_lane)
    steps = [2**i for i in range(int(math.log2(cores)) + 1)]
    steps.append(cores)
    steps.append(2 ** math.ceil(math.log2(cores + 1)))
    return sorted(set(steps))


def recommend(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> list[Recommendation]:
    """Recommendations from one run alone (no sweep): estimates, and said to be."""
    lane, verdict = max(zip(facts, verdicts, strict=True), key=lambda item: _rank(item[1]))
    out: list[Recommendation] = []
    if verdict.kind is VerdictKind.FED:
        out.append(
            Recommendation(
                "no change: compute-bound; the pipeline keeps up and DALI would not help",
                "no change",
                sum(f.images_per_s for f in facts),
                "measured in this run",
            )
        )
    if verdict.kind is VerdictKind.STARVED_CPU_HEADROOM and lane.backend == "torch":
        out.append(_more_workers(lane))
    if verdict.kind is VerdictKind.DALI_THREADS_SATURATED:
        out += _more_threads(lane)
    if verdict.kind in STARVED - {VerdictKind.IO_BOUND} and lane.backend == "torch":
        out += _transfer_fixes(lane)
        if verdict.kind in (
            VerdictKind.STARVED_CPU_SATURATED,
            VerdictKind.STARVED_LOADER_LIMIT,
            VerdictKind.MAIN_PROCESS_BOUND,
        ):
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
    if lane.output_dtype == "float32":
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
    return Evidence("data_wait_frac", wait, f"data-wait {_pct(wait)} of wall time ({bound})")


def _rate_evidence(facts: LaneFacts) -> Evidence:
    return Evidence(
        "images_per_s", facts.images_per_s, f"{facts.images_per_s:,.0f} images/s ({facts.setting})"
    )


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
    if facts.steal_pct is not None and facts.steal_pct >= 5:
        text = f"CPU steal {facts.steal_pct:.0f}%: the hypervisor gives these cores to others"
        out.append(Evidence("steal_pct", facts.steal_pct, text))
    return out


def _step(facts: LaneFacts) -> list[Evidence]:
    rate = facts.consumer_images_per_s
    if rate is None or facts.step_ms_p50 is None:
        return []
    text = f"step {facts.step_ms_p50:.1f} ms (median): the consumer could take {rate:,.0f} images/s"
    return [Evidence("step_ms_p50", facts.step_ms_p50, text)]


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
    if facts.output_dtype == "float32":
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


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"
