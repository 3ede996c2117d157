"""Verdicts: whether a lane starves and why (`judge_lane`), and their order (`rank`). What only
several lanes show is `probe.judge.across_lanes`'. Pure functions of `LaneFacts`; each verdict
carries the evidence it rests on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from enum import Enum
from typing import Any

from probe.judge.evidence import (
    Evidence,
    consumer_evidence,
    cpu_demand_evidence,
    cpu_evidence,
    epoch_evidence,
    gpu_evidence,
    host_load_evidence,
    rate_evidence,
    stage_evidence,
    stall_evidence,
    step_evidence,
    time_split_evidence,
    transfer_evidence,
    wait_evidence,
)
from probe.judge.facts import LaneFacts
from probe.judge.thresholds import (
    EPOCH_START_SHARE,
    IOWAIT_BOUND_PCT,
    MAIN_THREAD_BOUND_PCT,
    NVJPG_SATURATED_PCT,
    THREADS_SATURATED,
    WAIT_HIGH,
    Severity,
    severity_of,
)
from probe.metrics import CPU, DATA_WAIT, NVJPG, counted
from probe.records import RunStatus
from probe.steady import MIN_JUDGED_BLOCKS


class VerdictKind(str, Enum):
    FED = "fed"
    FED_WITHIN_ERROR = "fed_within_error"
    STARVED_CPU_HEADROOM = "starved_cpu_headroom"
    DALI_THREADS_TOO_FEW = "dali_threads_too_few"
    STARVED_CPU_SATURATED = "starved_cpu_saturated"
    STARVED_LOADER_LIMIT = "starved_loader_limit"
    OVERSUBSCRIBED = "oversubscribed"
    MAIN_PROCESS_BOUND = "main_process_bound"
    IO_BOUND = "io_bound"
    DALI_DECODER_SATURATED = "dali_decoder_saturated"
    DALI_THREADS_SATURATED = "dali_threads_saturated"
    SHARD_IMBALANCE = "shard_imbalance"
    RANK_HOLDS_JOB = "rank_holds_job"
    HELD_BY_RANK = "held_by_rank"
    SHARED_CORES = "shared_cores"
    EPOCH_START_STALL = "epoch_start_stall"
    HOST_BUSY = "host_busy"
    NOISY_NEIGHBOUR = "noisy_neighbour"
    GPU_SHARED = "gpu_shared"
    CORES_OVERSUBSCRIBED = "cores_oversubscribed"
    SHM_TOO_SMALL = "shm_too_small"
    WORKER_KILLED = "worker_killed"
    PIPELINE_ONLY = "pipeline_only"
    UNKNOWN = "unknown"


STARVED = frozenset(
    {
        VerdictKind.STARVED_CPU_HEADROOM,
        VerdictKind.DALI_THREADS_TOO_FEW,
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

# Fed: by its figure, or by its interval, below WAIT_HIGH throughout (`LaneFacts.fed_by_interval`)
FED_KINDS = frozenset({VerdictKind.FED, VerdictKind.FED_WITHIN_ERROR})

TITLES = {
    VerdictKind.FED: "fed: compute-bound",
    VerdictKind.FED_WITHIN_ERROR: (
        "fed, or at most moderately input-bound: the loader is not what holds the job"
    ),
    VerdictKind.STARVED_CPU_HEADROOM: "starved, with CPU headroom: too few workers",
    VerdictKind.DALI_THREADS_TOO_FEW: "starved, with CPU headroom: too few DALI threads",
    VerdictKind.STARVED_CPU_SATURATED: (
        "starved: the CPU caps the loader: decoding needs more cores or the GPU"
    ),
    VerdictKind.STARVED_LOADER_LIMIT: "starved, though the CPU has room: more workers do not help",
    VerdictKind.OVERSUBSCRIBED: "oversubscribed: more workers made it slower",
    VerdictKind.MAIN_PROCESS_BOUND: "starved by the main process (collation, host-to-device copy)",
    VerdictKind.IO_BOUND: "starved by storage: I/O bound",
    VerdictKind.DALI_DECODER_SATURATED: "starved: the hardware JPEG decoder is saturated",
    VerdictKind.DALI_THREADS_SATURATED: "starved: DALI's CPU threads are saturated",
    VerdictKind.SHARD_IMBALANCE: "shard imbalance: some GPUs wait for the slowest",
    VerdictKind.RANK_HOLDS_JOB: (
        "one rank holds the job: the other ranks wait for its data at the all-reduce"
    ),
    VerdictKind.HELD_BY_RANK: (
        "held by another rank: its step waits at the all-reduce for that rank's data, "
        "not for its own compute"
    ),
    VerdictKind.SHARED_CORES: "several lanes' loaders share too few cores",
    VerdictKind.EPOCH_START_STALL: (
        "starved at epoch starts: the loader's prefetch drains at every epoch's end"
    ),
    VerdictKind.HOST_BUSY: (
        "the host was busy: other processes took CPU the pipeline needs, so these figures "
        "cannot be trusted"
    ),
    VerdictKind.NOISY_NEIGHBOUR: (
        "the loader slows the training step: its CPU use costs throughput that data-wait "
        "does not show"
    ),
    VerdictKind.GPU_SHARED: (
        "DALI's decoding shares the GPU with the training step: the step is slower than alone"
    ),
    VerdictKind.CORES_OVERSUBSCRIBED: "more busy threads than the cores the host allows",
    VerdictKind.SHM_TOO_SMALL: "/dev/shm is smaller than the workers' batches in flight",
    VerdictKind.WORKER_KILLED: "a worker was killed by a signal (the OOM killer, most likely)",
    VerdictKind.PIPELINE_ONLY: "the pipeline alone: its capacity (no consumer to starve)",
    VerdictKind.UNKNOWN: "too few batches to judge",
}


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

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(
            kind=self.kind.value,
            severity=self.severity.value,
            evidence=[asdict(e) for e in self.evidence],
            title=self.title,
        )
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(
            kind=VerdictKind(data["kind"]),
            severity=Severity(data["severity"]),
            data_wait_frac=data["data_wait_frac"],
            evidence=tuple(Evidence.from_json(e) for e in data["evidence"]),
            lane=data.get("lane"),
            partial=data.get("partial", False),
            reliable=data.get("reliable", True),
        )


def judge_lane(facts: LaneFacts) -> Verdict:
    """One lane's verdict, and the numbers it rests on."""
    partial = facts.status != RunStatus.COMPLETED.value
    wait = facts.figures.data_wait_frac

    def verdict(
        kind: VerdictKind, severity: Severity, evidence: Iterable[Evidence], reliable: bool = True
    ) -> Verdict:
        return Verdict(kind, severity, wait, tuple(evidence), facts.lane, partial, reliable)

    if not facts.figures.batches or (facts.consumer != "none" and not decided(facts)):
        return verdict(VerdictKind.UNKNOWN, Severity.NONE, [_too_few(facts)])
    gpu = gpu_evidence(facts)
    load = host_load_evidence(facts)
    alone = consumer_evidence(facts)
    stages = stage_evidence(facts)
    if facts.consumer == "none":
        evidence = [rate_evidence(facts), *stages, *cpu_evidence(facts), wait_evidence(facts), *gpu]
        if facts.epoch_share >= EPOCH_START_SHARE:  # its capacity, less its epoch starts
            evidence += epoch_evidence(facts)
        return verdict(VerdictKind.PIPELINE_ONLY, Severity.NONE, [*evidence, *load])
    within = facts.fed_by_interval
    severity = Severity.NONE if within else severity_of(wait)
    if severity is Severity.NONE:  # fed even with the host's other load: that answer holds
        evidence = [wait_evidence(facts), *gpu, *step_evidence(facts), *alone, *stages, *load]
        kind = VerdictKind.FED_WITHIN_ERROR if within else VerdictKind.FED
        return verdict(kind, severity, evidence)
    if facts.host_busy:
        evidence = [wait_evidence(facts), *load, *stages, *cpu_evidence(facts), *gpu, *alone]
        return verdict(VerdictKind.HOST_BUSY, severity, evidence, reliable=False)
    if facts.epoch_stalls_most and not facts.cpu_caps_epochs:
        evidence = [wait_evidence(facts), *epoch_evidence(facts), *stages, *gpu, *alone]
        return verdict(VerdictKind.EPOCH_START_STALL, severity, evidence)
    kind, why = _cause(facts)
    return verdict(kind, severity, [wait_evidence(facts), *stages, *gpu, *why, *alone])


def decided(facts: LaneFacts) -> bool:
    """Whether a lane's data-wait can tell fed from starved: judged (`Estimate.judged`), and
    an error smaller than the figure, or an interval wholly below WAIT_HIGH
    (`LaneFacts.fed_by_interval`). A short loader (a validation pass of a few batches) cannot,
    nor an interval that straddles WAIT_HIGH."""
    wait = facts.wait
    if wait is None or wait.error is None or not wait.judged:
        return False
    return wait.error < wait.value or wait.value + wait.error < WAIT_HIGH


def _too_few(facts: LaneFacts) -> Evidence:
    figures = facts.figures
    if not figures.batches:
        warm = figures.warmup_batches
        text = (
            f"lane {facts.lane} measured no batch ({facts.status}"
            f"{f'; its {warm} were warm-up' if warm else ''})"
        )
        return Evidence("batches", 0.0, text)
    wait = facts.wait
    shown = DATA_WAIT.text(figures.data_wait_frac, None if wait is None else wait.error)
    if wait is None or not wait.judged:
        why = f"its error needs {MIN_JUDGED_BLOCKS} blocks of batches"
    else:
        why = (
            f"an error as large as the figure, its interval reaching {WAIT_HIGH:.0%}: fed "
            "cannot be told from starved"
        )
    text = (
        f"{counted(figures.batches, 'batch')} measured on {counted(figures.blocks, 'block')}, "
        f"{DATA_WAIT.label} {shown} ({why}); measure longer"
    )
    return Evidence("batches", float(figures.batches), text)


_Cause = tuple[VerdictKind, list[Evidence]] | None


def _cause(facts: LaneFacts) -> tuple[VerdictKind, list[Evidence]]:
    """Why a starved lane starves: the first rule whose numbers are met. When none is met, it
    says that what holds the loader was not measured, and what to measure next."""
    for rule in (_io_bound, _dali_limits, _main_process_bound, _cpu_limits):
        found = rule(facts)
        if found is not None:
            return found
    setting = "num_workers" if facts.backend == "torch" else "num_threads"
    more = 2 * (facts.loaders or 1)
    main = facts.figures.main_thread_cpu_pct
    ruled_out = [
        f"the training loop's thread ({'not measured' if main is None else f'{main:.0f}%'} busy)"
    ]
    if facts.host.iowait_pct is not None:
        ruled_out.append(f"storage (iowait {facts.host.iowait_pct:.0f}%)")
    if facts.host.other_cores is not None:
        ruled_out.append(f"the host's other load ({facts.host.other_cores:.1f} cores)")
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
    why = [*cpu_evidence(facts), *cpu_demand_evidence(facts), unknown, *stall_evidence(facts)]
    return VerdictKind.STARVED_LOADER_LIMIT, why


def _io_bound(facts: LaneFacts) -> _Cause:
    iowait, reads = facts.host.iowait_pct, facts.host.disk_read_mib_s
    if iowait is None or iowait < IOWAIT_BOUND_PCT:
        return None
    evidence = [
        Evidence("iowait_pct", iowait,
                 f"iowait {iowait:.0f}% of CPU time (>= {IOWAIT_BOUND_PCT:.0f}%)"),
        Evidence("disk_read_mib_s", reads,
                 f"disk reads {'-' if reads is None else f'{reads:,.1f}'} MiB/s"),
    ]  # fmt: skip
    return VerdictKind.IO_BOUND, [*evidence, *cpu_evidence(facts)]


def _dali_limits(facts: LaneFacts) -> _Cause:
    if facts.backend != "dali":
        return None
    nvjpg = facts.figures.nvjpg_pct
    if facts.decoder == "mixed" and nvjpg is not None and nvjpg >= NVJPG_SATURATED_PCT:
        text = (
            f"hardware {NVJPG.label} {NVJPG.text(nvjpg)} busy ({NVJPG.source.value}; saturated "
            f"from {NVJPG_SATURATED_PCT:.0f}%)"
        )
        busy = Evidence(NVJPG.name, nvjpg, text)
        return VerdictKind.DALI_DECODER_SATURATED, [busy, *cpu_evidence(facts)]
    threads = facts.num_threads or 1
    cpu = facts.figures.cpu_pct
    if cpu is not None and cpu >= THREADS_SATURATED * 100 * threads:
        text = f"the lane uses {CPU.text(cpu)} with {threads} DALI threads: all of them are busy"
        return VerdictKind.DALI_THREADS_SATURATED, [
            Evidence(CPU.name, cpu, text),
            *cpu_evidence(facts),
        ]
    return None


def _main_process_bound(facts: LaneFacts) -> _Cause:
    main = facts.figures.main_thread_cpu_pct
    if facts.backend != "torch" or main is None or main < MAIN_THREAD_BOUND_PCT:
        return None
    return VerdictKind.MAIN_PROCESS_BOUND, [*cpu_evidence(facts), *transfer_evidence(facts)]


def _cpu_limits(facts: LaneFacts) -> _Cause:
    """The CPU caps the loader where its busy share is saturated, or where the loader needs
    more of its cores than can be had to feed the step (`LaneFacts.cpu_capped`), however
    little of them it used on average; else more workers may use the room it has, up to that
    cap where fewer workers than cores hold it well below it (`LaneFacts.workers_hold`)."""
    demand = cpu_demand_evidence(facts)
    if facts.cpu_capped:
        split = time_split_evidence(facts)
        why = [*demand, *cpu_evidence(facts), *split, *stall_evidence(facts)]
        return VerdictKind.STARVED_CPU_SATURATED, why
    if facts.cpu_saturated:
        return VerdictKind.STARVED_CPU_SATURATED, [*cpu_evidence(facts), *stall_evidence(facts)]
    if facts.loaders is not None and facts.loaders < facts.cores_per_lane:
        why = [*cpu_evidence(facts), *demand, *stall_evidence(facts)]
        if facts.backend == "dali":
            return VerdictKind.DALI_THREADS_TOO_FEW, why
        return VerdictKind.STARVED_CPU_HEADROOM, why
    return None


def rank(verdict: Verdict) -> tuple[int, int, int, float]:
    """The order of verdicts, worst last: untrusted figures (nothing else can be judged then),
    then by severity, then the rank that holds the job before its own lane's verdict (the same
    data-wait: the job's pace is what the run is about), then by data-wait."""
    order = {Severity.HIGH: 3, Severity.MODERATE: 2, Severity.NONE: 1}
    known = 0 if verdict.kind is VerdictKind.UNKNOWN else 1
    return (
        (0 if verdict.reliable else 1),
        order[verdict.severity] * 2 + known,
        (1 if verdict.kind is VerdictKind.RANK_HOLDS_JOB else 0),
        (verdict.data_wait_frac or 0.0),
    )
