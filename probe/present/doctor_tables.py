"""The doctor's own tables and lines, beside the sweep's (`probe.present.tables`): its answer
and notes, the DALI settings its search measured, and the job from 1 GPU to N.

Pure: documents in, headers and text cells out, as `probe.present.tables`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from probe.judge.changes import Change, workers
from probe.judge.dali_run import DaliRun
from probe.judge.doctor.alternation import PIPELINES_SPREAD, pair_ratio, runs_pairs
from probe.judge.results import DALI, TORCH, Scaling, Session, alternation_source
from probe.metrics import (
    CPU,
    DATA_WAIT,
    IMAGES_PER_S,
    NVJPG,
    against_text,
    counted,
    job_scope,
    signed,
)
from probe.present.tables import (
    Grid,
    because,
    diagnosis_lines,
    epochs_lines,
    run_again,
)
from probe.steady import Estimate


def doctor_lines(session: Session) -> list[str]:
    """The doctor's answer: verdict, DALI, the epoch reading, recommendations and
    verification, as text."""
    if session.verdict is None:
        return [f"session {session.session_id}: no answer{because(session.reason)}"]
    agreed = session.verify is None or session.verify.verified
    return diagnosis_lines(
        session.verdict,
        session.recommendations,
        session.asides,
        job_scope(session.devices),
        agreed,
    ) + doctor_notes(session)


def verified_what(session: Session) -> str:
    """What the verification re-ran ("verified" only where it bore its prediction out, else
    "measured again"), and where that is not the first recommendation, which one it is and
    that the first was measured once."""
    assert session.verify is not None
    word = "verified" if session.verify.verified else "measured again"
    setting = session.verify.change.setting
    rank = run_again(session)
    if rank is None or rank == 1:
        return f"{word} {setting}"
    first = session.recommendations[0].setting
    return f"{word} {setting} (recommendation {rank}; recommendation 1, {first}, measured once)"


def doctor_notes(session: Session) -> list[str]:
    """What the doctor measured besides its sweep: DALI, the epoch reading, the verification,
    its start-up and its consumer."""
    lines = []
    if session.dali is not None:
        lines += dali_lines(session)
    lines += epochs_lines(session.epochs)
    verify = session.verify
    if verify is None:
        lines.append(f"not verified{because(session.not_verified)}")
    elif verify.error_frac is not None:
        agrees = "within" if verify.agrees else "more than"
        if not verify.precise:
            agrees = "not known within the precision asked; " + agrees
        if verify.host_busy:
            agrees = "measured while other processes took the host's CPU, not trusted; " + agrees
        predicted = IMAGES_PER_S.cell(
            verify.predicted_images_per_s, verify.predicted_images_per_s_error
        )
        measured = IMAGES_PER_S.text(
            verify.measured_images_per_s, verify.measured_images_per_s_error
        )
        against = against_text(verify.measured_images_per_s, verify.predicted_images_per_s)
        if verify.pairs:  # its first figure, not one of the runs pooled, against those runs
            mean = alternation_source(verify.run_ids)
            lines.append(
                f"the pairs in alternation are the check: {verify.change.setting}, predicted at "
                f"first {predicted}, measured {measured}, {mean} ({against}: {agrees} their "
                "errors and the drift between runs)"
            )
        else:
            # one prediction a setting: where the answer revised it, the first is said so
            answer = next((r for r in session.recommendations if r.change == verify.change), None)
            revised = answer is not None and answer.predicted_images_per_s != (
                verify.predicted_images_per_s
            )
            first = "predicted at first" if revised else "predicted"
            lines.append(
                f"{verified_what(session)}: {first} {predicted}, measured {measured} "
                f"({against}: {agrees} their errors and the drift between runs; run "
                f"{verify.run_id})"
            )
        lines += [
            f"  in alternation: {item.setting}: "
            f"{IMAGES_PER_S.text(item.images_per_s, item.images_per_s_error)} (run {item.run_id})"
            for item in verify.in_turn
        ]
        told = [note for item in session.recommendations for note in item.notes]
        said = verify.outcome is not None and any(note in verify.outcome for note in told)
        if verify.outcome and not said:  # said once: in the answer's notes, else here
            lines.append(f"  so: {verify.outcome}")
    if session.startup_s:
        lines.append(
            f"the lanes started, with the consumer tuned and timed alone, in "
            f"{session.startup_s:.1f} s"
        )
    if session.consumer_note:
        lines.append(f"consumer: {session.consumer_note}")
    return lines


def pairs_gain(session: Session) -> tuple[Estimate, str] | None:
    """DALI over the DataLoader setting it was measured in alternation with, from the pairs,
    and that setting; None where no pair of the two was measured. A document from before the
    verification kept the pairs' ratio has it computed from its runs, as the doctor did."""
    verify, dali = session.verify, session.dali
    if verify is None or dali is None or not verify.pairs:
        return None
    if verify.ratio is not None and verify.ratio_over is not None:
        if verify.ratio_over == dali.change.setting:
            return None  # DALI was the reference: no call between the two pipelines
        return Estimate(verify.ratio, verify.ratio_error, verify.pairs), verify.ratio_over
    settings = {item.setting for item in verify.in_turn}
    if dali.change.setting not in settings or len(settings) != 2:
        return None
    (over,) = settings - {dali.change.setting}
    ratio = pair_ratio(runs_pairs(verify.in_turn, Change.parse(over)), PIPELINES_SPREAD)
    return None if ratio is None else (ratio, over)


def _dali_named(dali: DaliRun, after: str = "") -> str:
    """How DALI's figure is named: "at its best" only of several settings its search tried."""
    return (
        f"DALI at its best{after}" if len(dali.tried) > 1 else "DALI, the one setting it searched"
    )


def dataloader_against_dali(session: Session) -> str | None:
    """The DataLoader against DALI in a doctor session's own figures, those its answer weighed:
    where the two were measured in alternation, that DataLoader setting and DALI, each its runs
    pooled, and DALI's gain over the pairs; else the best DataLoader setting it measured and
    DALI at its best, with their errors; None where it did not measure both."""
    best, dali = session.best, session.dali
    if best is None or not best.images_per_s or dali is None or not dali.judged:
        return None
    scope = job_scope(session.devices)
    theirs = session.shown(dali.change.setting)
    assert theirs is not None  # judged: measured
    gain = pairs_gain(session)
    loader = None if gain is None else session.shown(gain[1])
    at_best = _dali_named(dali)
    if gain is not None and loader is not None:
        ratio, over = gain
        error = "" if ratio.error is None else f" ± {ratio.error:.0%}"
        return (
            f"measured in alternation, {counted(ratio.blocks, 'pair')}: "
            f"the DataLoader at {over}, {loader.text}{scope} ({loader.source}); "
            f"{at_best}, {dali.change.setting.removeprefix('DALI ')}, {theirs.text}{scope} "
            f"({theirs.source}); DALI {signed(ratio.value - 1)}{error} over the pairs"
        )
    mine = session.shown(workers(best.setting).setting)
    assert mine is not None  # the best point: measured
    which = (
        "the best DataLoader setting" if len(session.points) > 1 else "the one DataLoader setting"
    )
    return (
        f"{which} it measured, num_workers={best.setting}, "
        f"{mine.text}{scope}; {at_best}, {dali.change.setting.removeprefix('DALI ')}, "
        f"{theirs.text}{scope} ({theirs.images_per_s / mine.images_per_s:.2f}x)"
    )


def dali_grid(dali: DaliRun, devices: Sequence[str]) -> Grid:
    """The DALI settings the doctor's search measured, in order (decoder, num_threads and
    hw_decoder_load, the hardware decoder's share): why each, what was predicted and measured
    (images/s for the job), and what each lane's worst read: the hardware decoder's busy share,
    DALI's threads' CPU, the step against the consumer alone, what held it."""
    header = (
        "decoder, threads, share",
        "why",
        "predicted",
        IMAGES_PER_S.heading + job_scope(devices),
        "measured vs predicted",
        NVJPG.label,
        "DALI threads' CPU cores",
        "step vs alone",
        "held by",
        "run",
    )
    rows = []
    for point in dali.tried:
        chosen = point.run_id == dali.run_id and point.run_id is not None
        measured = (
            IMAGES_PER_S.cell(point.images_per_s, point.images_per_s_error)
            if point.images_per_s
            else f"not judged{because(point.reason)}"
        )
        against = (
            against_text(point.images_per_s, point.predicted_images_per_s)
            if point.images_per_s and point.predicted_images_per_s
            else "-"
        )
        slowed = "-" if point.step_slowed is None else signed(point.step_slowed)
        pipeline = point.pipeline
        share = "-" if pipeline.hw_decoder_load is None else f"{pipeline.hw_decoder_load:g}"
        rows.append(
            (
                f"{pipeline.decoder}, {pipeline.num_threads}, {share}"
                + (" (chosen)" if chosen else ""),
                point.why,
                IMAGES_PER_S.cell(point.predicted_images_per_s),
                measured,
                against,
                NVJPG.cell(point.nvjpg_pct),
                CPU.cell(point.threads_cpu_pct),
                slowed,
                point.holds or "-",
                point.run_id or "",
            )
        )
    return Grid(header, tuple(rows), frozenset({2, 3, 4, 5, 6, 7}))


def dali_lines(session: Session) -> list[str]:
    """DALI's answer (a doctor's `session.dali`): the setting chosen, at its figure on the
    session's pages (`shown`: where the pairs measured it, its runs in alternation pooled, with
    its search's run beside), against where the search started; what holds it there with its
    evidence, the change as code, and what was not searched."""
    dali = session.dali
    assert dali is not None
    if not dali.judged:
        return [f"DALI: not measured{because(dali.reason)}"]
    scope = job_scope(session.devices)
    searched = IMAGES_PER_S.text(dali.images_per_s, dali.images_per_s_error)
    figure = session.shown(dali.change.setting)
    assert figure is not None  # judged: measured
    line = f"{_dali_named(dali, ' measured')}, {dali.change.setting}: {figure.text}{scope}"
    wait = f"{DATA_WAIT.label} {DATA_WAIT.text(dali.data_wait_frac)}"
    if figure.run_ids != (dali.run_id,):
        line += f", {figure.source} (its search's run: {searched}, {wait})"
    else:
        line += f", {wait}"
    first = dali.first
    if first is not None and dali.gain is not None:
        start = IMAGES_PER_S.text(first.images_per_s, first.images_per_s_error)
        line += (
            f"; {signed(dali.gain)} on where its search started, {first.setting} ({start}), of "
            f"{len(dali.tried)} settings measured"
        )
    lines = [line + (f": {dali.advice}" if dali.advice else "")]
    point = next((t for t in dali.tried if t.run_id == dali.run_id), None)
    if dali.holds is not None and point is not None:
        read = []
        if point.nvjpg_pct is not None:
            read.append(f"the hardware {NVJPG.label} {NVJPG.text(point.nvjpg_pct)} busy")
        if point.threads_cpu_pct is not None:
            feeder = " (and the thread feeding its GPU stage)" if dali.decoder == "mixed" else ""
            threads = counted(dali.num_threads, "thread")
            read.append(f"DALI's {threads}{feeder} using {CPU.text(point.threads_cpu_pct)}")
        if point.step_slowed is not None:
            read.append(f"the step {signed(point.step_slowed)} against the consumer alone")
        evidence = f" ({'; '.join(read)}, worst lane)" if read else ""
        remedy = f"; the first remedy: {dali.remedy}" if dali.remedy else ""
        lines.append(f"what holds DALI there: {dali.holds}{evidence}{remedy}")
    if dali.advice is None:  # DALI helps: the change to write
        lines.append(f"as code: {dali.pipeline.code}")
    if dali.not_searched:
        lines.append(f"not searched: {dali.not_searched}")
    return lines


def scaling_grid(scaling: Scaling) -> Grid:
    """The job on 1 to N GPUs: the DataLoader's workers per GPU, and for each pipeline the
    job's images/s predicted, measured where it was (against the prediction), and per GPU
    (measured where it was, else predicted). DALI's setting is the same on every row
    (`scaling_lines` says it)."""
    device = scaling.device
    header = [f"{device}s"]
    pipelines = [(key, name) for key, name in ((TORCH, "DataLoader"), (DALI, "DALI"))
                 if scaling.at(key, 1) is not None]  # fmt: skip
    for key, name in pipelines:
        header += [*(["workers"] if key == TORCH else []), f"{name} predicted",
                   f"{name} measured", f"{name} per {device}"]  # fmt: skip
    rows = []
    for gpus in range(1, scaling.lanes + 1):
        row = [str(gpus)]
        for key, _ in pipelines:
            point = scaling.at(key, gpus)
            assert point is not None
            rate = point.images_per_s
            measured = IMAGES_PER_S.cell(
                point.measured_images_per_s, point.measured_images_per_s_error
            )
            if point.error_frac is not None:
                measured += f" ({signed(point.error_frac, 1)})"
            if key == TORCH:
                row.append(point.setting.removeprefix("num_workers="))
            row += [
                IMAGES_PER_S.cell(point.predicted_images_per_s),
                measured,
                IMAGES_PER_S.cell(None if rate is None else rate / gpus),
            ]
        rows.append(tuple(row))
    numeric = set(range(len(header)))
    return Grid(tuple(header), tuple(rows), frozenset(numeric))


def scaling_lines(scaling: Scaling) -> list[str]:
    """What the scaling table says: whose figures, the cores per GPU each pipeline needs to keep
    up with the consumer alone, the GPUs this host's cores feed, and each check."""
    device, cores = scaling.device, f"{scaling.cores:g}"
    dali = scaling.at(DALI, 1)
    lines = [
        f"scaling on this host's {cores} cores, 1 to {scaling.lanes} {device}s, one process "
        f"per {device}: images/s for the job, and per {device}; predicted from the runs on "
        f"{scaling.lanes}"
        + ("" if dali is None else f"; DALI as {dali.setting.removeprefix('DALI ')} on each")
        + (f"; {scaling.unchecked}" if scaling.unchecked else "")
    ]
    alone = scaling.consumer_images_per_s
    for key, name in ((TORCH, "the DataLoader"), (DALI, "DALI")):
        need = scaling.cores_needed(key)
        cpu_ms = scaling.cpu_ms(key)
        if need is None or alone is None or cpu_ms is None:
            continue
        other = (
            f" (less the {scaling.other_cores:.1f} other processes use)"
            if scaling.other_cores >= 0.05
            else ""
        )
        fed = scaling.feeds(key)
        assert fed is not None  # known where the cores needed are
        feeds = (
            f"{fed:.1f} of a {device}'s worth"
            if fed < 1
            else f"{math.floor(fed)} {device}{'' if math.floor(fed) == 1 else 's'}"
        )
        lines.append(
            f"{name} needs {need:.1f} cores per {device} to keep up with the consumer alone "
            f"({alone:,.0f} images/s per {device}, {cpu_ms:.2f} ms of CPU per image): the "
            f"host's {cores} cores{other} feed {feeds} at that rate"
        )
    for point in scaling.points:
        if point.error_frac is None:
            continue
        shown = IMAGES_PER_S.text(point.measured_images_per_s, point.measured_images_per_s_error)
        lines.append(
            f"checked on {point.gpus} {device}{'' if point.gpus == 1 else 's'}: "
            f"{point.setting} predicted {IMAGES_PER_S.text(point.predicted_images_per_s)}, "
            f"measured {shown} ({signed(point.error_frac, 1)} against the prediction"
            + (
                ", beyond its error and the drift between runs: the measured figure stands"
                if point.missed
                else ""
            )
            + f"; run {point.run_id})"
        )
    return lines
