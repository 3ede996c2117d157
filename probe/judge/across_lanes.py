"""What only several lanes, or a lane's host, show besides each lane's own verdict
(`probe.judge.verdicts.judge_lane`): shard imbalance, the rank that holds the job and the ranks
it holds (`holding_rank`, `held_lanes`), loaders sharing too few cores, epoch starts besides
another cause, and what a lane's host did to it. Pure functions of `LaneFacts` and the lanes'
verdicts; each finding carries the evidence it rests on."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from probe.judge.evidence import (
    Evidence,
    cpu_evidence,
    epoch_evidence,
    gpu_sharing,
    gpu_sharing_evidence,
    held_share,
    loader_threads,
    memory_evidence,
    shm_needed_mib,
    slowdown_evidence,
    stage_evidence,
    step_slowdown,
    threads_evidence,
    wait_evidence,
)
from probe.judge.facts import LaneFacts
from probe.judge.thresholds import (
    CPU_SATURATED_PCT,
    EPOCH_START_SHARE,
    HELD_SHARE,
    IMBALANCE,
    Severity,
    severity_of,
)
from probe.judge.verdicts import FED_KINDS, STARVED, Verdict, VerdictKind
from probe.metrics import DATA_WAIT, HELD, IMAGES_PER_S


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
        if share is None or verdict.kind not in FED_KINDS:
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
