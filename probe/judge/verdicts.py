"""Verdicts: whether a lane starves and why (`judge_lane`), and what only several lanes show
(`judge_lanes`: shard imbalance, the rank that holds the job, loaders sharing too few cores,
epoch starts besides another cause; `held_lanes`: the ranks it holds). Pure functions of
`LaneFacts`; each verdict carries the evidence it rests on."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum
from typing import Any

from probe.judge.evidence import (
    Evidence,
    consumer_evidence,
    cpu_demand_evidence,
    cpu_evidence,
    epoch_evidence,
    gpu_evidence,
    gpu_sharing,
    gpu_sharing_evidence,
    held_share,
    host_load_evidence,
    loader_threads,
    memory_evidence,
    rate_evidence,
    shm_needed_mib,
    slowdown_evidence,
    stage_evidence,
    stall_evidence,
    step_evidence,
    step_slowdown,
    threads_evidence,
    time_split_evidence,
    transfer_evidence,
    wait_evidence,
)
from probe.judge.facts import LaneFacts
from probe.judge.thresholds import (
    CPU_SATURATED_PCT,
    EPOCH_START_SHARE,
    HELD_SHARE,
    IMBALANCE,
    IOWAIT_BOUND_PCT,
    MAIN_THREAD_BOUND_PCT,
    NVJPG_SATURATED_PCT,
    THREADS_SATURATED,
    Severity,
    severity_of,
)
from probe.metrics import CPU, DATA_WAIT, HELD, IMAGES_PER_S, NVJPG, counted
from probe.records import RunStatus
from probe.steady import MIN_JUDGED_BLOCKS, Estimate


class VerdictKind(str, Enum):
    FED = "fed"
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

TITLES = {
    VerdictKind.FED: "fed: compute-bound",
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
    severity = severity_of(wait)
    if severity is Severity.NONE:  # fed even with the host's other load: that answer holds
        evidence = [wait_evidence(facts), *gpu, *step_evidence(facts), *alone, *stages, *load]
        return verdict(VerdictKind.FED, severity, evidence)
    if facts.host_busy:
        evidence = [wait_evidence(facts), *load, *stages, *cpu_evidence(facts), *gpu, *alone]
        return verdict(VerdictKind.HOST_BUSY, severity, evidence, reliable=False)
    if facts.epoch_stalls_most and not facts.cpu_caps_epochs:
        evidence = [wait_evidence(facts), *epoch_evidence(facts), *stages, *gpu, *alone]
        return verdict(VerdictKind.EPOCH_START_STALL, severity, evidence)
    kind, why = _cause(facts)
    return verdict(kind, severity, [wait_evidence(facts), *stages, *gpu, *why, *alone])


def _wait(facts: LaneFacts) -> Estimate | None:
    """A lane's data-wait as an estimate (None: not measured)."""
    figures = facts.figures
    if figures.data_wait_frac is None:
        return None
    return Estimate(figures.data_wait_frac, figures.data_wait_frac_error, figures.blocks)


def decided(facts: LaneFacts) -> bool:
    """Whether a lane's data-wait can tell fed from starved: judged (`Estimate.judged`), and
    an error not as large as the figure where the figure's upper end is starved. A short
    loader (a validation pass of a few batches) cannot."""
    wait = _wait(facts)
    if wait is None or wait.error is None or not wait.judged:
        return False
    return wait.error < wait.value or severity_of(wait.value + wait.error) is Severity.NONE


def _too_few(facts: LaneFacts) -> Evidence:
    figures = facts.figures
    if not figures.batches:
        warm = figures.warmup_batches
        text = (
            f"lane {facts.lane} measured no batch ({facts.status}"
            f"{f'; its {warm} were warm-up' if warm else ''})"
        )
        return Evidence("batches", 0.0, text)
    wait = _wait(facts)
    shown = DATA_WAIT.text(figures.data_wait_frac, figures.data_wait_frac_error)
    if wait is None or not wait.judged:
        why = f"its error needs {MIN_JUDGED_BLOCKS} blocks of batches"
    else:
        why = "an error as large as the figure: fed cannot be told from starved"
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


def judge_lanes(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> list[Verdict]:
    """What only several lanes show, and epoch starts that cost a lane besides another cause."""
    return [
        *_across_lanes(facts, verdicts),
        *_holding_findings(facts, verdicts),
        *_epoch_findings(facts, verdicts),
        *(found for fact in facts for found in _host_findings(fact)),
    ]


def _host_findings(facts: LaneFacts) -> list[Verdict]:
    """What a lane's host did to it: a step slowed by the loader's CPU (the noisy neighbour),
    more busy threads than the cores it may use, /dev/shm too small for the batches in flight,
    a worker killed by a signal."""
    out = []
    wait = facts.figures.data_wait_frac

    def finding(kind: VerdictKind, severity: Severity, evidence: list[Evidence]) -> None:
        out.append(Verdict(kind, severity, wait, tuple(evidence), facts.lane))

    slowdowns = (  # the step slower than alone: the loader's CPU, or DALI on the same GPU
        (VerdictKind.NOISY_NEIGHBOUR, step_slowdown(facts),
         [*slowdown_evidence(facts), *stage_evidence(facts), *cpu_evidence(facts)]),
        (VerdictKind.GPU_SHARED, gpu_sharing(facts),
         [*gpu_sharing_evidence(facts), *cpu_evidence(facts)]),
    )  # fmt: skip
    for kind, slowed, evidence in slowdowns:
        if slowed is None or not facts.figures.batches:
            continue
        severity = severity_of(1 - 1 / (1 + slowed))  # the share of the consumer's speed lost
        if severity is not Severity.NONE:
            finding(kind, severity, evidence)
    if (
        facts.backend == "torch"
        and facts.num_workers
        and facts.figures.batches
        and loader_threads(facts) > facts.cores_per_lane
    ):
        why = [*threads_evidence(facts), *cpu_evidence(facts)]
        finding(VerdictKind.CORES_OVERSUBSCRIBED, Severity.MODERATE, why)
    need = shm_needed_mib(facts)
    if need is not None and facts.shm_free_mib is not None and need > facts.shm_free_mib:
        finding(VerdictKind.SHM_TOO_SMALL, Severity.HIGH, memory_evidence(facts))
    if facts.reason and "killed by signal" in facts.reason:
        cause = Evidence("worker_killed", None, f"lane {facts.lane} failed: {facts.reason}")
        finding(VerdictKind.WORKER_KILLED, Severity.HIGH, [cause, *memory_evidence(facts)])
    return out


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
        out.append(
            Verdict(
                VerdictKind.EPOCH_START_STALL,
                severity_of(fact.epoch_share),
                fact.figures.data_wait_frac,
                tuple(epoch_evidence(fact)),
                fact.lane,
            )
        )
    return out


def _across_lanes(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> list[Verdict]:
    measured = [(f, v) for f, v in zip(facts, verdicts, strict=True) if f.figures.batches > 0]
    if len(measured) < 2 or measured[0][0].consumer == "none":
        return []
    out = []
    worst_wait = max(f.figures.data_wait_frac or 0.0 for f, _ in measured)
    rates = [f.figures.images_per_s for f, _ in measured]
    several_hosts = len({f.hostname for f, _ in measured}) > 1
    if (max(rates) - min(rates)) / max(rates) > IMBALANCE:
        # Under DDP every step waits for the slowest rank: its rate is everybody's.
        slowest = min(measured, key=lambda item: item[0].figures.images_per_s)[0]
        evidence = tuple(
            Evidence(
                IMAGES_PER_S.name,
                f.figures.images_per_s,
                f"lane {f.lane}{f' on {f.hostname}' if several_hosts else ''}: "
                f"{IMAGES_PER_S.text(f.figures.images_per_s)}, "
                f"{DATA_WAIT.label} {DATA_WAIT.text(f.figures.data_wait_frac)}",
            )
            for f, _ in measured
        )
        severity = severity_of(worst_wait)
        out.append(
            Verdict(VerdictKind.SHARD_IMBALANCE, severity, worst_wait, evidence, slowest.lane)
        )
    for hostname in dict.fromkeys(f.hostname for f, _ in measured):  # CPU is shared per host
        starved = [f for f, v in measured if v.kind in STARVED and f.hostname == hostname]
        busy = starved[0].host.cpu_pct if starved else None
        if len(starved) < 2 or busy is None or busy < CPU_SATURATED_PCT:
            continue
        host = starved[0]
        on = f" of {hostname}" if several_hosts else ""
        evidence = (
            Evidence(
                "host_cpu_pct",
                busy,
                f"host{on} CPU {busy:.0f}% busy (saturated from {CPU_SATURATED_PCT:.0f}%)",
            ),
            Evidence(
                "lanes",
                float(host.lanes_on_host),
                f"{host.lanes_on_host} lanes' loaders share {host.host_cpus} cores{on}: "
                f"{host.cores_per_lane:g} each",
            ),
        )
        wait = max(f.figures.data_wait_frac or 0.0 for f in starved)
        out.append(Verdict(VerdictKind.SHARED_CORES, severity_of(wait), wait, evidence))
    return out


@dataclass(frozen=True)
class Holding:
    """A rank whose data-wait holds the job, its own verdict, and each rank it holds with the
    share of that rank's step spent waiting for it (`held_share`)."""

    rank: LaneFacts
    verdict: Verdict
    held: tuple[tuple[LaneFacts, float], ...]


def holding_rank(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> Holding | None:
    """The rank that holds the job, where one does. Under DDP each step ends at the gradient
    all-reduce, which waits for the last rank to reach it: one rank's slow loader makes every
    rank wait, and shows as its data-wait while the others show little data-wait and a long
    step, all at one images/s (which `SHARD_IMBALANCE` compares). It is the judged rank that
    waits most for data, input-bound itself (`severity_of`), holding at least one other: a
    rank in step with it whose data-wait is below its own beyond both errors, and that spends
    HELD_SHARE of its step or more waiting for it. Ranks that wait alike hold nobody."""
    judged = [
        (fact, verdict)
        for fact, verdict in zip(facts, verdicts, strict=True)
        if fact.figures.batches
        and fact.consumer != "none"
        and verdict.kind is not VerdictKind.UNKNOWN
    ]
    if len(judged) < 2:
        return None
    top, own = max(judged, key=lambda item: item[0].figures.data_wait_frac or 0.0)
    wait = top.figures.data_wait_frac or 0.0
    if severity_of(wait) is Severity.NONE:
        return None
    held = []
    for fact, _ in judged:
        share = None if fact.lane == top.lane else held_share(fact, top)
        errors = (fact.figures.data_wait_frac_error or 0.0, top.figures.data_wait_frac_error or 0.0)
        below = wait - (fact.figures.data_wait_frac or 0.0)
        if share is not None and share >= HELD_SHARE and below > math.hypot(*errors):
            held.append((fact, share))
    return Holding(top, own, tuple(held)) if held else None


def held_lanes(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The lanes' verdicts, with each rank held by another (`holding_rank`) told so where its
    own verdict calls it fed: the wait in its step is not its compute."""
    holding = holding_rank(facts, verdicts)
    if holding is None:
        return list(verdicts)
    shares = {fact.lane: share for fact, share in holding.held}
    severity = severity_of(holding.rank.figures.data_wait_frac)
    out = []
    for fact, verdict in zip(facts, verdicts, strict=True):
        share = shares.get(fact.lane)
        if share is None or verdict.kind is not VerdictKind.FED:
            out.append(verdict)
            continue
        evidence = (_held_evidence(fact, share, holding.rank), wait_evidence(fact))
        out.append(
            replace(verdict, kind=VerdictKind.HELD_BY_RANK, severity=severity, evidence=evidence)
        )
    return out


def _holding_findings(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> list[Verdict]:
    """The rank that holds the job (`holding_rank`): how much more it waits for data than the
    others, the share of their steps spent waiting for it, and where its fix lies."""
    holding = holding_rank(facts, verdicts)
    if holding is None:
        return []
    top = holding.rank
    wait = top.figures.data_wait_frac
    others = [f for f in facts if f.lane != top.lane and f.figures.batches]
    most = max(f.figures.data_wait_frac or 0.0 for f in others)
    paced = Evidence(
        DATA_WAIT.name,
        wait,
        f"rank {_named(top, facts)} waits for data "
        f"{DATA_WAIT.text(wait, top.figures.data_wait_frac_error)} of its time, the other "
        f"ranks at most {DATA_WAIT.text(most)}: under DDP its loader sets every rank's pace",
    )
    held = [_held_evidence(fact, share, top) for fact, share in holding.held]
    compared = ", ".join(f"rank {fact.lane}'s" for fact, _ in holding.held)
    fix = Evidence(
        "rank",
        float(top.lane),
        f"the fix is rank {top.lane}'s loader (its own verdict: {holding.verdict.title}): its "
        f"shard, its host's cores, its disk and data path, against {compared}; a change to "
        f"the other ranks gains nothing while rank {top.lane} holds them",
    )
    severity = severity_of(wait)
    return [Verdict(VerdictKind.RANK_HOLDS_JOB, severity, wait, (paced, *held, fix), top.lane)]


def _held_evidence(fact: LaneFacts, share: float, top: LaneFacts) -> Evidence:
    """The share of a rank's step spent waiting for the rank that holds it, and its figures."""
    text = (
        f"rank {fact.lane}: {HELD.label} {HELD.text(share)} (rank {top.lane}, at the "
        f"all-reduce): a mean step of {fact.step_ms_mean or 0:.1f} ms against rank {top.lane}'s "
        f"own {top.step_ms_mean or 0:.1f} ms, in step ({fact.batch_ms_mean or 0:.1f} and "
        f"{top.batch_ms_mean or 0:.1f} ms a batch); its own {DATA_WAIT.label} "
        f"{DATA_WAIT.text(fact.figures.data_wait_frac)}"
    )
    return Evidence(HELD.name, share, text)


def _named(fact: LaneFacts, facts: Sequence[LaneFacts]) -> str:
    """A rank's number, with its host where the run has several."""
    several = len({f.hostname for f in facts}) > 1
    return f"{fact.lane} on {fact.hostname}" if several else str(fact.lane)
