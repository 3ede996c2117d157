"""What only several lanes, or a lane's host, show besides each lane's own verdict
(`probe.judge.verdicts.judge_lane`): shard imbalance, the rank that holds the job and the ranks
it holds (`holding_rank`, `held_lanes`), loaders sharing too few cores (and a job's ranks judged
together on the cores they share), epoch starts besides another cause, and what a lane's host
did to it. Pure functions of `LaneFacts` and the lanes' verdicts; each finding carries the
evidence it rests on."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from pipelines import cpu_set_text
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
from probe.measure.described import files_known
from probe.metrics import CPU, DATA_WAIT, HELD, IMAGES_PER_S


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
    holding = holding_rank(facts, verdicts)
    for hostname in dict.fromkeys(f.hostname for f, _ in measured):  # CPU is shared per host
        here = [(f, v) for f, v in measured if f.hostname == hostname]
        starved = [f for f, v in here if v.kind in STARVED]
        busy = (starved or [here[0][0]])[0].host.cpu_pct  # over its measured window
        saturated = busy is not None and busy >= CPU_SATURATED_PCT
        together = [] if holding is not None else _judged_together(here)
        if not together and (len(starved) < 2 or not saturated):
            continue
        host = (starved or [here[0][0]])[0]
        on = f" of {hostname}" if several_hosts else ""
        shown: list[Evidence] = []
        if busy is not None:
            shown.append(
                Evidence(
                    "host_cpu_pct",
                    busy,
                    f"host{on} CPU {busy:.0f}% busy (saturated from {CPU_SATURATED_PCT:.0f}%)",
                )
            )
        if together:  # what they share first: `probe show` tells a finding's first evidence
            shown[:0] = _together_evidence(together)
            starved = together
        else:
            shown.append(
                Evidence(
                    "lanes",
                    float(host.lanes_on_host),
                    f"{host.lanes_on_host} lanes' loaders share {host.host_cpus} cores{on}: "
                    f"{host.cores_per_lane:g} each",
                )
            )
        wait = max(f.figures.data_wait_frac or 0.0 for f in starved)
        out.append(Verdict(VerdictKind.SHARED_CORES, severity_of(wait), wait, tuple(shown)))
    return out


def _judged_together(lanes: Sequence[tuple[LaneFacts, Verdict]]) -> list[LaneFacts]:
    """A watched job's ranks on one host that are judged together, where no rank holds the
    others (`holding_rank`): two or more, nothing recorded telling them apart (`_given_apart`:
    they share their cores, their shards agree, they read the same files), one at least
    waiting for data itself (`_waits_itself`), and the CPU they share capping them
    (`_cpu_caps`). Their waits may differ, by the share of the cores each got or whose
    prefetch got ahead at the start: the fix is the CPU they share, not one rank's loader.
    Empty where they are not."""
    ranks = [(f, v) for f, v in lanes if f.watched_run is not None and f.consumer != "none"]
    if len(ranks) < 2 or not any(_waits_itself(f, v) for f, v in ranks):
        return []
    if any(_given_apart(a, b) for a, _ in ranks for b, _ in ranks if a.lane != b.lane):
        return []
    alike = [f for f, _ in ranks]
    return alike if _cpu_caps(alike) else []


def _together_evidence(ranks: Sequence[LaneFacts]) -> list[Evidence]:
    """The cores ranks judged together share, their shards, each one's data-wait, and the CPU
    their processes use of those cores, where measured."""
    sets = [f.cpu_set for f in ranks]
    if all(cores is not None for cores in sets):
        known = [cores for cores in sets if cores is not None]
        shared, allowed = frozenset.intersection(*known), len(frozenset.union(*known))
        cores = f"share cores {_cores_text(shared)}" if shared else "share their cores"
        if any(other != known[0] for other in known):  # overlapping sets of one size
            each = (
                f"rank {f.lane} on {cpu_set_text(c)}" for f, c in zip(ranks, known, strict=True)
            )
            cores += f" ({', '.join(each)})"
    else:
        shared, allowed = None, ranks[0].host_cpus
        cores = f"share the host's {allowed} cores"
    images, shard = [f.shard_images for f in ranks], ""
    if images[0] is not None and all(n == images[0] for n in images):
        shard = f", equal shards ({images[0]:,} images an epoch)"
    waits = ", ".join(
        f"rank {f.lane} {DATA_WAIT.text(f.figures.data_wait_frac, f.figures.data_wait_frac_error)}"
        for f in ranks
    )
    evidence = [
        Evidence(
            "cpu_set",
            None if shared is None else float(len(shared)),
            f"{_ranks_text(ranks)} {cores}{shard}, and the CPU caps them ({DATA_WAIT.label} "
            f"{waits}): no rank holds the others. Given alike, the one that waits most got "
            "less of the cores they share, or its prefetch fell behind at the start, not a "
            "slower loader; the fix is the same for every rank (less CPU an image, or more "
            "cores), not one rank's loader",
        )
    ]
    used = [f.figures.cpu_pct for f in ranks]
    if all(cpu is not None for cpu in used):
        busy = sum(cpu or 0.0 for cpu in used)  # % of one core
        left = sum(f.loader_cores for f in ranks)
        others = f" ({left:.1f} left by other processes)" if left < allowed - 0.05 else ""
        text = f"their processes use {CPU.text(busy)} of the {allowed} they may use{others}"
        evidence.append(Evidence(CPU.name, busy, text))
    return evidence


@dataclass(frozen=True)
class Holding:
    """A rank whose data-wait holds the job, its own verdict, each rank it holds with the
    share of that rank's step spent waiting for it (`held_share`), and what tells it apart
    from them (`_given_apart`; empty where nothing recorded does, and a held rank's loader
    keeps up on its own: what it reads differs)."""

    rank: LaneFacts
    verdict: Verdict
    held: tuple[tuple[LaneFacts, float], ...]
    apart: tuple[str, ...] = ()


def holding_rank(facts: Sequence[LaneFacts], verdicts: Sequence[Verdict]) -> Holding | None:
    """The rank that holds the job, where one does. Under DDP each step ends at the gradient
    all-reduce, which waits for the last rank to reach it: one rank's slow loader makes every
    rank wait, and shows as its data-wait while the others show little data-wait and a long
    step, all at one images/s (which `SHARD_IMBALANCE` compares). It is the judged rank that
    waits most for data, input-bound itself (`severity_of`), holding at least one other: a
    rank in step with it whose data-wait is below its own beyond both errors, and that spends
    HELD_SHARE of its step or more waiting for it. Ranks that wait alike hold nobody.

    A rank is named only where it differs from those it holds: in what it was given or reads
    as recorded (`_given_apart`: fewer or other cores, a larger shard, other files, another
    host), or, given alike, where a rank it holds keeps up on its own while the CPU has room
    (what the slow one reads costs more: its files, its disk or data path). Ranks given alike
    hold nobody where the CPU they share caps them (`_cpu_caps`: which of them waits most is
    the share of the cores each got, or whose prefetch got ahead at the start, not its loader;
    they are judged together, `_judged_together`), nor where all of them wait for data."""
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
    held, waiting = [], []
    for fact, verdict in judged:
        share = None if fact.lane == top.lane else held_share(fact, top)
        errors = (fact.figures.data_wait_frac_error or 0.0, top.figures.data_wait_frac_error or 0.0)
        below = wait - (fact.figures.data_wait_frac or 0.0)
        if share is not None and share >= HELD_SHARE and below > math.hypot(*errors):
            held.append((fact, share))
            waiting.append(_waits_itself(fact, verdict))
    if not held:
        return None
    apart = tuple(dict.fromkeys(text for fact, _ in held for text in _given_apart(top, fact)))
    if not apart and (all(waiting) or _cpu_caps([fact for fact, _ in judged])):
        return None
    return Holding(top, own, tuple(held), apart)


def _cpu_caps(ranks: Sequence[LaneFacts]) -> bool:
    """Whether the CPU that ranks given alike share caps them: their processes (workers
    included) use CPU_SATURATED_PCT or more of the cores left to them (the cores they may use
    less other processes' share: `LaneFacts.loader_cores`); where their CPU was not measured,
    whether the host's cores were that busy. A loader slowed by what it reads (a disk, a
    remote store, a sleep) uses little of its cores."""
    used = [f.figures.cpu_pct for f in ranks]
    if any(cpu is None for cpu in used):
        busy = ranks[0].host.cpu_pct
        return busy is not None and busy >= CPU_SATURATED_PCT
    left = sum(f.loader_cores for f in ranks)
    return left > 0 and sum(cpu or 0.0 for cpu in used) / 100 >= CPU_SATURATED_PCT / 100 * left


def _waits_itself(fact: LaneFacts, verdict: Verdict) -> bool:
    """Whether a rank waits for data itself, not only for another rank: its own data-wait
    input-bound (`severity_of`) and its own verdict not fed. A rank held at the all-reduce
    has its prefetch refilled meanwhile: where it still waits for data, its own loader falls
    behind its step too."""
    wait = fact.figures.data_wait_frac
    return severity_of(wait) is not Severity.NONE and verdict.kind not in FED_KINDS


def _given_apart(rank: LaneFacts, other: LaneFacts) -> list[str]:
    """What `rank` was given or reads that `other` was not, as recorded, each in words naming
    both (empty: nothing recorded tells them apart): another host (its cores, disk and data
    path), fewer cores than `other`'s or a set apart from them (on one host), a shard larger
    by more than a batch (what a split's rounding gives), or other files."""
    apart = []
    theirs = f"rank {other.lane}'s"
    if rank.hostname != other.hostname:
        apart.append(
            f"its host, {rank.hostname}, against {theirs} {other.hostname} (the host's cores, "
            "its disk and data path)"
        )
    mine, yours = rank.cpu_set, other.cpu_set
    if mine is not None and yours is not None and mine != yours:
        same_host = rank.hostname == other.hostname
        if len(mine) < len(yours) or (same_host and not mine & yours):
            apart.append(
                f"its cores, {_cores_text(mine) if same_host else len(mine)}, against {theirs} "
                f"{_cores_text(yours) if same_host else len(yours)}"
            )
    if rank.shard_images is not None and other.shard_images is not None:
        if rank.shard_images - other.shard_images > rank.batch_size:
            apart.append(
                f"its shard, {rank.shard_images:,} images an epoch, against {theirs} "
                f"{other.shard_images:,}"
            )
    elif (
        rank.shard_batches is not None
        and other.shard_batches is not None
        and rank.shard_batches - other.shard_batches > 1
    ):
        apart.append(
            f"its shard, {rank.shard_batches:,} batches an epoch, against {theirs} "
            f"{other.shard_batches:,}"
        )
    if (
        files_known(rank.data_dir)
        and files_known(other.data_dir)
        and rank.data_dir != other.data_dir
    ):
        apart.append(f"its files, in {rank.data_dir}, against {theirs} in {other.data_dir}")
    return apart


def _cores_text(cores: frozenset[int]) -> str:
    """ "0-3 (4 cores)", "0 (1 core)"."""
    return f"{cpu_set_text(cores)} ({len(cores)} core{'' if len(cores) == 1 else 's'})"


def _ranks_text(ranks: Sequence[LaneFacts]) -> str:
    """ "ranks 0 and 1", "ranks 0, 1 and 2"."""
    numbers = [str(f.lane) for f in ranks]
    return f"ranks {', '.join(numbers[:-1])} and {numbers[-1]}"


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
    if holding.apart:
        why = f"it was given or reads otherwise than the ranks it holds: {'; '.join(holding.apart)}"
    else:  # given alike: a held rank's loader keeps up where this one's does not
        keeps_up = min(
            (fact for fact, _ in holding.held), key=lambda x: x.figures.data_wait_frac or 0.0
        )
        why = (
            f"nothing recorded of what it was given tells it from {compared} (cores, shard, "
            f"files), yet rank {keeps_up.lane}'s loader keeps up on its own ({DATA_WAIT.label} "
            f"{DATA_WAIT.text(keeps_up.figures.data_wait_frac)}): what rank {top.lane} reads "
            "costs more (its files, their sizes, its disk or data path)"
        )
    fix = Evidence(
        "rank",
        float(top.lane),
        f"the fix is rank {top.lane}'s loader (its own verdict: {holding.verdict.title}): "
        f"{why}; a change to the other ranks gains nothing while rank {top.lane} holds them",
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
