"""Evidence: the numbers a verdict rests on, each with its metric's name (`probe.metrics`) and a
sentence for people that says what the number means; and what DDP's ranks wait for each other
(`held_share`), whose step without that wait (`unwaited_step`) `probe doctor --like` copies."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from probe.judge.facts import HostLoad, LaneFacts
from probe.judge.thresholds import (
    CPU_SATURATED_PCT,
    DATALOADER_THREADS,
    STEAL_MOVES_PCT,
    STEP_CPU_SHARE,
    STEP_SLOWED,
    STEP_STALL,
    WAIT_HIGH,
    WAIT_MODERATE,
    Severity,
    in_step,
    severity_of,
)
from probe.metrics import (
    CPU,
    CPU_PER_IMAGE,
    DATA_WAIT,
    IMAGES_PER_S,
    KERNEL_ACTIVE,
    MAIN_THREAD_CPU,
    NVJPG,
    PSS,
    SM_ACTIVE,
    STAGE_BY_NAME,
    STEP,
    Metric,
    Source,
    counted,
    signed,
)
from probe.records import BatchAcross


@dataclass(frozen=True)
class Evidence:
    metric: str  # the metric's name, as stored
    value: float | None
    text: str  # the number and what it means, for people

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Evidence:
        return cls(data["metric"], data["value"], data["text"])


def measured(metric: Metric, value: float | None, error: float | None = None) -> str:
    """A value in running text with its metric's label and source: 'SM activity 48% (GPM)',
    'kernel-active 62% (NVML utilization.gpu, overstates)', 'data-wait 31.0%'."""
    shown = f"{metric.label} {metric.text(value, error)}"
    if metric.source is Source.BATCHES:
        return shown
    return f"{shown} ({metric.source.value}{f' {metric.note}' if metric.note else ''})"


def wait_evidence(facts: LaneFacts) -> Evidence:
    wait = facts.figures.data_wait_frac
    if facts.consumer == "none":
        text = f"{measured(DATA_WAIT, wait)}: no consumer, so all time is waiting"
        return Evidence(DATA_WAIT.name, wait, text)
    bound = {
        Severity.HIGH: f">= {WAIT_HIGH:.0%}: high",
        Severity.MODERATE: f">= {WAIT_MODERATE:.0%}: moderate",
        Severity.NONE: f"< {WAIT_MODERATE:.0%}",
    }[severity_of(wait)]
    if facts.fed_by_interval:
        bound = (
            f"its interval below {WAIT_HIGH:.0%} throughout, its error as large as the figure: "
            "fed, or at most moderately input-bound"
        )
    judged, error = facts.wait, facts.figures.data_wait_frac_error
    shown = measured(DATA_WAIT, wait, None if judged is None else judged.error)
    if judged is not None and judged.error != error:
        bound += (
            f"; its error with its epoch starts counted as measured, not as noise in their "
            f"blocks (the blocks' own: ± {DATA_WAIT.text(error)})"
        )
    return Evidence(DATA_WAIT.name, wait, f"{shown} of wall time ({bound})")


def rate_evidence(facts: LaneFacts) -> Evidence:
    figures = facts.figures
    shown = IMAGES_PER_S.text(figures.images_per_s, figures.images_per_s_error)
    return Evidence(
        IMAGES_PER_S.name,
        figures.images_per_s,
        f"{shown}{facts.per_lane()} ({facts.change.setting})",
    )


def gpu_evidence(facts: LaneFacts) -> list[Evidence]:
    """The GPU's busy-ness as each metric sees it, and DALI's hardware JPEG decoder."""
    figures = facts.figures
    out = []
    if figures.busy is SM_ACTIVE and figures.sm_active_pct is not None:
        out.append(Evidence(SM_ACTIVE.name, figures.sm_active_pct,
                            measured(SM_ACTIVE, figures.sm_active_pct)))  # fmt: skip
    if figures.kernel_active_pct is not None:
        out.append(Evidence(KERNEL_ACTIVE.name, figures.kernel_active_pct,
                            measured(KERNEL_ACTIVE, figures.kernel_active_pct)))  # fmt: skip
    if facts.backend == "dali" and figures.nvjpg_pct is not None:
        text = f"hardware {measured(NVJPG, figures.nvjpg_pct)}"
        out.append(Evidence(NVJPG.name, figures.nvjpg_pct, text))
    return out


def cpu_evidence(facts: LaneFacts) -> list[Evidence]:
    """The host's CPU, the lane's processes' and the training loop's thread's."""
    out = []
    busy = facts.host.cpu_pct
    if busy is not None:
        out.append(Evidence("host_cpu_pct", busy, host_cpu_text(facts.host, busy)))
    cpu = facts.figures.cpu_pct
    if cpu is not None:
        text = (
            f"the lane's processes use {CPU.text(cpu)} "
            f"({facts.loaders_text}; {facts.cores_per_lane_text})"
        )
        out.append(Evidence(CPU.name, cpu, text))
    main = facts.figures.main_thread_cpu_pct
    if main is not None:
        text = f"{MAIN_THREAD_CPU.label} {MAIN_THREAD_CPU.text(main)} busy"
        out.append(Evidence(MAIN_THREAD_CPU.name, main, text))
    return [*out, *cores_evidence(facts)]


def cpu_demand_evidence(facts: LaneFacts) -> list[Evidence]:
    """The cores the loader needs to feed the step (`LaneFacts.cpu_demand_cores`) against those
    the lane may use, and the images/s these can make: where it needs more, the CPU caps the
    loader whatever its average busy share, unless fewer workers than cores hold it well below
    that cap (`LaneFacts.workers_hold`): then more workers give at most the cap."""
    demand, cap = facts.cpu_demand_cores, facts.cpu_cap_images_per_s
    cpu_ms, rate = facts.figures.cpu_ms_per_image, facts.consumer_images_per_s
    if demand is None or cap is None or cpu_ms is None or rate is None:
        return []
    cores = facts.cores_per_lane
    others = cores - facts.loader_cores
    used = f", {others:.1f} of them used by other processes" if others > 0 else ""
    text = (
        f"each image costs {CPU_PER_IMAGE.text(cpu_ms)} of CPU (workers and training process); "
        f"the step could take {IMAGES_PER_S.text(rate)}{facts.per_lane(rate)}, "
        f"{CPU.text(demand * 100)}' worth; the lane may use {cores:g} "
        f"core{'s' * (cores != 1)}{facts.per_lane()}{used}: "
    )
    if facts.cpu_capped:
        text += f"the CPU caps the loader near {IMAGES_PER_S.text(cap)}{facts.per_lane(cap)}"
    elif facts.cpu_short:  # held by its workers below a cap short of the step's rate
        measured = IMAGES_PER_S.text(facts.figures.images_per_s, facts.figures.images_per_s_error)
        hold = "holds" if facts.loaders == 1 else "hold"
        more = "workers" if facts.backend == "torch" else "DALI threads"
        text += (
            f"the {facts.loaders_text} {hold} the loader, not the CPU (it measured {measured} "
            f"of a cap near {IMAGES_PER_S.text(cap)}{facts.per_lane(cap)}); more {more} give at "
            f"most about that cap, short of what the step could take (it needs "
            f"{CPU.text(demand * 100)}, has {cores:g} {'core' if cores == 1 else 'cores'})"
        )
    else:
        text += f"room for that (they could make {IMAGES_PER_S.text(cap)}{facts.per_lane(cap)})"
    return [Evidence("cpu_demand_cores", demand, text)]


def time_split_evidence(facts: LaneFacts) -> list[Evidence]:
    """Where a loop read epoch by epoch spent its wall time (`probe.lane_figures.TimeSplit`): the
    windows between epoch starts and tails, the starts, the tails and the time outside the
    loop's iteration."""
    split, start = facts.figures.time_split, facts.figures.epoch_start
    if split is None or start is None:
        return []

    def part(seconds: float) -> str:
        return f"{split.share(seconds):.0%} ({seconds:,.1f} s)"

    parts = [
        f"{part(split.windows_s)} in the windows between epoch starts and tails",
        f"{part(split.starts_s)} in {start.starts} epoch start{'s' * (start.starts != 1)}",
    ]
    if start.ends:
        last = "batch" if start.tail_batches == 1 else f"{start.tail_batches} batches"
        parts.append(
            f"{part(split.tails_s)} in {start.ends} epoch tail{'s' * (start.ends != 1)} (the "
            f"last {last} of each, made while some of the {facts.loaders_text} sit idle)"
        )
    parts.append(f"{part(split.outside_s)} outside the loop's iteration (validation, checkpoints)")
    text = (
        f"of the {split.wall_s:,.1f} s from the first measured batch to the last one's end: "
        f"{'; '.join(parts)}"
    )
    return [Evidence("wall_s", split.wall_s, text)]


def step_evidence(facts: LaneFacts) -> list[Evidence]:
    """The consumer's median step, and the rate it could take at that step."""
    rate, step = facts.consumer_images_per_s, facts.figures.step_ms_p50
    if rate is None or step is None:
        return []
    per = facts.per_lane()
    text = f"step {step:.1f} ms (median): the consumer could take {rate:,.0f} images/s{per}"
    return [Evidence("step_ms_p50", step, text)]


def stall_evidence(facts: LaneFacts) -> list[Evidence]:
    """The step, and whether steps stall (the training loop waits for CPU too)."""
    out = step_evidence(facts)
    mean, median = facts.step_ms_mean, facts.figures.step_ms_p50
    if mean and median and mean >= STEP_STALL * median:
        text = (
            f"steps stall: mean {mean:.0f} ms against a median of {median:.0f} ms "
            "(the training loop waits for CPU too)"
        )
        out.append(Evidence("step_ms_mean", mean, text))
    return out


def consumer_evidence(facts: LaneFacts) -> list[Evidence]:
    """The consumer alone, as measured on batches already on the device: what no input fix
    can go past."""
    alone = facts.figures.consumer_alone
    if not alone or not alone.get("images_per_s"):
        return []
    rate = alone["images_per_s"]
    text = (
        f"the consumer alone, on batches already on the device: "
        f"{IMAGES_PER_S.text(rate, alone.get('images_per_s_error'))}{facts.per_lane(rate)}"
        f" ({alone.get('step_ms_p50') or 0:.1f} ms a step): the most "
        "any input fix can give"
    )
    return [Evidence("consumer_images_per_s", rate, text)]


def host_cpu_text(host: HostLoad, busy: float) -> str:
    """The busy share of the cores the run may run on, and the machine's other cores' load
    beside it where the run has only some of them: "host CPU 97% busy (1.9 of the machine's
    2 cores)", "CPU 95% busy on the run's 4 cores (cores 0-3 of the machine's 32; the other
    28: 12.3 busy, other jobs', not counted against it)"."""
    machine = host.machine_cores or 1
    job = host.job_cores or machine
    if job >= machine:
        used = busy / 100 * machine
        return f"host CPU {busy:.0f}% busy ({used:.1f} of the machine's {machine} cores)"
    text = f"CPU {busy:.0f}% busy on the run's {job} cores (of the machine's {machine}"
    if host.elsewhere_cores is not None:
        text += (
            f"; the other {machine - job}: {host.elsewhere_cores:.1f} busy, other jobs', not "
            "counted against it"
        )
    return text + ")"


def host_load_evidence(facts: LaneFacts) -> list[Evidence]:
    """The host's other load, where it could have moved the answer: other processes' CPU on the
    cores the run may use (their load on the machine's other cores cannot)."""
    if not facts.host_busy:
        return []
    out = []
    other, steal = facts.host.other_cores, facts.host.steal_pct
    if other is not None:
        cores = facts.host_cpus
        text = (
            f"other processes used {other:.1f} of the {cores} core{'s' * (cores != 1)} the run "
            f"may use ({other / max(1, cores):.0%}) while it measured"
        )
        out.append(Evidence("host_other_cores", other, text))
    if steal is not None and steal >= STEAL_MOVES_PCT:
        text = f"CPU steal {steal:.0f}%: the hypervisor gave these cores to others"
        out.append(Evidence("steal_pct", steal, text))
    return out


def epoch_evidence(facts: LaneFacts) -> list[Evidence]:
    """What the epoch starts cost, split into the loader's start and the prefetch's refill
    where the lane saw them apart, and where the lane's wall time went (`time_split_evidence`)."""
    start = facts.figures.epoch_start
    if not start:
        return []
    split = ""
    if start.loader_start_ms is not None:
        split = (
            f": {start.loader_start_ms:.0f} ms to start the loader, "
            f"{start.refill_ms or 0:.0f} ms to refill its prefetch"
        )
    text = (
        f"epoch starts cost {start.share:.1%} of the time: {start.starts} of them, "
        f"{start.stall_ms:,.0f} ms each{split}; {start.batches_per_epoch:.0f} batches per "
        f"epoch; between them {DATA_WAIT.label} is {DATA_WAIT.text(facts.steady_wait)}"
    )
    return [Evidence("epoch_start_share", start.share, text), *time_split_evidence(facts)]


def transfer_evidence(facts: LaneFacts) -> list[Evidence]:
    """How batches reach the GPU: unpinned buffers, float32 pixels."""
    out = []
    if facts.pin_memory is False and facts.on_gpu:
        text = "pin_memory is off: every copy to the GPU is synchronous"
        out.append(Evidence("pin_memory", 0.0, text))
    if facts.output_dtype == "float32" and facts.on_gpu:
        text = "workers hand over float32: 4x the bytes of uint8"
        out.append(Evidence("output_dtype", 4.0, text))
    return out


def stage_evidence(facts: LaneFacts) -> list[Evidence]:
    """The pipeline's biggest stage, by CPU time per image (the training step left out: it is
    the consumer's), and what the stages add up to against the lane's measured CPU."""
    training = ("step", "main_threads")  # the consumer's, not the pipeline's
    stages = {k: v for k, v in (facts.figures.stages_ms or {}).items() if k not in training}
    total = sum(stages.values())
    if not stages or total <= 0:
        return []
    name, ms = max(stages.items(), key=lambda item: item[1])
    label = STAGE_BY_NAME[name].label if name in STAGE_BY_NAME else name
    text = f"{label} takes {ms / total:.0%} of each image's CPU time ({ms:.2f} ms of {total:.2f} ms"
    everything = facts.figures.stage_ms()
    measured_cpu = facts.figures.cpu_ms_per_image
    if everything is not None and measured_cpu:
        text += f"; with the training process's {everything - total:.2f} ms, the stages add up to "
        if everything >= measured_cpu:  # two clocks (each thread's, the processes' sampled)
            text += (
                f"{everything:.2f} ms: all of the {measured_cpu:.2f} ms the lane's processes "
                "used, within what the two clocks differ by"
            )
        else:
            text += f"{everything:.2f} ms of the {measured_cpu:.2f} ms the lane's processes used"
    text += ")"
    if name == "decode" and facts.on_gpu:
        text += ": DALI's mixed decoder moves exactly that to the GPU"
    return [Evidence(f"stage_{name}_ms", ms, text)]


def cores_evidence(facts: LaneFacts) -> list[Evidence]:
    """What the host allows the run (the cgroup quota and affinity, not the machine's core
    count), what of it could not be read, and the cgroup's throttling while it measured."""
    limits, figures = facts.cpu_limits, facts.figures
    out = []
    if limits is not None:
        out.append(Evidence("cores_available", limits.cores, f"the host allows {limits.text}"))
        out += [Evidence("cores_available", None, why) for why in limits.unknown]
    if figures.throttled_periods and figures.cfs_periods:
        text = (
            f"the cgroup throttled the lane's CPU in {figures.throttled_periods:,} of "
            f"{figures.cfs_periods:,} periods ({figures.throttled_s or 0:.1f} s) while it measured"
        )
        out.append(Evidence("throttled_periods", float(figures.throttled_periods), text))
    return out


def loader_threads(facts: LaneFacts) -> int:
    """The threads the loader keeps busy at once: per worker its loop, and the busy threads
    beyond a DataLoader worker's own two (its loop and its queue's feeder thread, which a
    float32 batch keeps busy), which its dataset started."""
    busy = facts.figures.worker_threads or 1
    extra = max(0, busy - DATALOADER_THREADS)
    return (facts.num_workers or 0) * (1 + extra)


def threads_evidence(facts: LaneFacts) -> list[Evidence]:
    """The busy threads the loader runs against the cores the lane may use."""
    if facts.backend != "torch" or not facts.num_workers:
        return []
    per_worker = facts.figures.worker_threads or 1
    extra = max(0, per_worker - DATALOADER_THREADS)
    each = (
        f" x {per_worker} busy threads each ({extra} beyond a worker's loop and queue thread)"
        if extra
        else ""
    )
    text = (
        f"num_workers={facts.num_workers}{each}: {loader_threads(facts)} threads at work for "
        f"{facts.cores_per_lane_text}"
    )
    return [Evidence("busy_threads", float(loader_threads(facts)), text)]


def memory_evidence(facts: LaneFacts) -> list[Evidence]:
    """The lane's memory (PSS), and /dev/shm against what the workers' prefetch holds."""
    out = []
    if facts.figures.pss_mib is not None:
        text = (
            f"the lane's processes held {PSS.text(facts.figures.pss_mib)} at most "
            "(shared pages split among the processes sharing them)"
        )
        out.append(Evidence(PSS.name, facts.figures.pss_mib, text))
    need = shm_needed_mib(facts)
    if need is not None and facts.shm_free_mib is not None:
        text = (
            f"/dev/shm: the workers' prefetch needs {need:,.0f} MiB "
            f"({counted(facts.num_workers or 0, 'worker')} x prefetch {facts.prefetch_factor} x "
            f"{facts.batch_mib:,.1f} MiB a batch); {facts.shm_free_mib:,.0f} MiB free"
        )
        out.append(Evidence("shm_needed_mib", need, text))
    return out


def shm_needed_mib(facts: LaneFacts) -> float | None:
    """The shared memory the workers' batches in flight take: workers x prefetch x batch."""
    if not facts.num_workers or facts.batch_mib is None or facts.prefetch_factor is None:
        return None
    return facts.num_workers * facts.prefetch_factor * facts.batch_mib


def step_works_on_cpu(facts: LaneFacts) -> bool:
    """Whether the step asks for CPU: its CPU time (the training process's, beyond receiving
    batches: the `step` and `main_threads` stages) is STEP_CPU_SHARE of its
    time or more. Where the stage was not timed, whether it is more than a sleep on the CPU."""
    stages = facts.figures.stages_ms or {}
    step = facts.figures.step_ms_p50
    if "step" in stages and step:
        work = stages["step"] + stages.get("main_threads", 0.0)  # its own threads' too
        return work * facts.batch_size >= STEP_CPU_SHARE * step
    return facts.on_gpu or not facts.consumer.startswith("sleep")


def step_slowdown(facts: LaneFacts) -> float | None:
    """How much slower the median step was under the loader's load than the consumer alone
    (0.3: 30% slower), where that is more than both medians' errors and STEP_SLOWED, and the
    step asks for CPU (a step that does not, a sleep, wakes later on a busy host, but the
    loader does not take its work's CPU); else None. Not where DALI decodes on the same GPU
    with CPU to spare: that slowdown is `gpu_sharing`'s."""
    if not step_works_on_cpu(facts) or gpu_sharing(facts) is not None:
        return None
    return slower_step(facts)


def gpu_sharing(facts: LaneFacts) -> float | None:
    """How much slower the median step was with DALI's `mixed` decoder on the training GPU
    than the consumer alone, where the CPU has room: DALI's kernels (nvJPEG, resize,
    normalize) take SMs from the model. Any step on a GPU pays it, a model's or a `sleep:MS`
    kernel's, whatever CPU it asks for. None where the lane does not decode on its GPU, the
    CPU is saturated (then the CPU may explain it), or the step is not significantly slower."""
    if facts.backend != "dali" or facts.decoder != "mixed" or not facts.on_gpu:
        return None
    # The CPU is ruled out where neither the host nor the lane's cores are saturated: DALI's
    # threads may all be busy then (DALI_THREADS_SATURATED), yet they leave the step its cores.
    if facts.cpu_saturated:
        return None
    # No `step_works_on_cpu` here: on a GPU, `sleep:MS` is `_GpuBusy`, matrix products that
    # fill the SMs for MS (probe/measure/consumers.py), so DALI's kernels delay it as they do a
    # model's; only on the CPU is it a sleep, and there nothing decodes on a GPU.
    return slower_step(facts)


def slower_step(facts: LaneFacts) -> float | None:
    """How much slower the median step was than the consumer alone's, where that is more than
    both medians' errors and STEP_SLOWED; else None."""
    alone = facts.figures.consumer_alone or {}
    alone_ms, loaded_ms = alone.get("step_ms_p50"), facts.figures.step_ms_p50
    if not alone_ms or not loaded_ms:
        return None
    errors = [alone.get("step_ms_p50_error"), facts.figures.step_ms_p50_error]
    if any(e is None for e in errors):
        return None
    slower = loaded_ms - alone_ms
    if slower <= sum(float(e) for e in errors if e is not None) or slower < STEP_SLOWED * alone_ms:
        return None
    return float(slower / alone_ms)


def held_share(waiting: LaneFacts, holding: LaneFacts) -> float | None:
    """The share of `waiting`'s step spent waiting at DDP's all-reduce for `holding`: its mean
    step less `holding`'s own (the step both have in common: `holding` reaches the all-reduce
    last and waits for nobody), over its mean step. None where a figure is not measured, where
    its step is not longer, or where the two do not run in step (`in_step`, of their mean batch
    times and steps)."""
    step, own = waiting.step_ms_mean, holding.step_ms_mean
    batch, held_batch = waiting.batch_ms_mean, holding.batch_ms_mean
    if step is None or own is None or batch is None or held_batch is None or step <= own:
        return None
    if not in_step(abs(batch - held_batch), step - own):
        return None
    return (step - own) / step


@dataclass(frozen=True)
class UnwaitedStep:
    """The step a DDP job's ranks took without waiting for each other (`unwaited_step`)."""

    step_ms: float  # the median of each batch's shortest step across the ranks
    ranks: int
    batches: int  # the batch indices every rank measured


def unwaited_step(batches: Sequence[BatchAcross], ranks: int) -> UnwaitedStep | None:
    """The step of a job's ranks without their wait for each other. Under DDP each step ends at
    the gradient all-reduce, which waits for the last rank to reach it: the rank whose data
    came last waits least there, so each batch's shortest step across the ranks is the job's
    own work, the all-reduce's own time in it (part of the job's real step), whichever rank
    came last; their median is the step. Where one rank holds the others it is that rank's
    step (`held_share`'s "own"); where ranks take turns waiting for data, no one rank's is.
    None for one rank, no batch every rank measured, or ranks not in step (`in_step`, summed
    over the batches: batch times as far apart as the steps are ranks each their own loop,
    whose shortest step would be no step of the job's)."""
    if ranks < 2 or not batches:
        return None
    batch_apart = sum(b.batch_max_s - b.batch_min_s for b in batches)
    step_apart = sum(b.step_max_s - b.step_min_s for b in batches)
    if not in_step(batch_apart, step_apart):
        return None
    step_ms = statistics.median(b.step_min_s * 1e3 for b in batches)
    return UnwaitedStep(step_ms, ranks, len(batches))


def gpu_sharing_evidence(facts: LaneFacts) -> list[Evidence]:
    """The step with DALI decoding on its GPU against the step alone, the GPU's busy-ness and
    the host's CPU, which rules the CPU out."""
    slowed = gpu_sharing(facts)
    if slowed is None:
        return []
    alone = facts.figures.consumer_alone or {}
    figures = facts.figures
    host = (
        ""
        if facts.host.cpu_pct is None
        else f", while the host's CPU was {facts.host.cpu_pct:.0f}% busy (saturated from "
        f"{CPU_SATURATED_PCT:.0f}%)"
    )
    text = (
        f"the step took {STEP.text(figures.step_ms_p50, figures.step_ms_p50_error)} with DALI "
        f"decoding on the same GPU against "
        f"{STEP.text(alone['step_ms_p50'], alone.get('step_ms_p50_error'))} alone "
        f"({signed(slowed)}){host}: DALI's kernels take SMs from the model, so training runs at "
        f"{1 / (1 + slowed):.0%} of the consumer's speed"
    )
    return [Evidence("step_slowdown", slowed, text), *gpu_evidence(facts)]


def slowdown_evidence(facts: LaneFacts) -> list[Evidence]:
    """The step under the loader's load against the consumer alone, and the host's CPU."""
    slowed = step_slowdown(facts)
    if slowed is None:
        return []
    alone = facts.figures.consumer_alone or {}
    figures = facts.figures
    host = (
        "" if facts.host.cpu_pct is None else f"; the host's CPU was {facts.host.cpu_pct:.0f}% busy"
    )
    text = (
        f"the step took {STEP.text(figures.step_ms_p50, figures.step_ms_p50_error)} under the "
        f"loader's load against {STEP.text(alone['step_ms_p50'], alone.get('step_ms_p50_error'))} "
        f"alone: {slowed:.0%} slower, so training runs at {1 / (1 + slowed):.0%} of the "
        f"consumer's speed{host} ({facts.loaders_text} using {CPU.text(figures.cpu_pct)})"
    )
    return [Evidence("step_slowdown", slowed, text)]
