"""The doctor's DALI search, from recorded points: what it measures next, where it stops, what
it answers, and what it leaves alone (no hardware decoder to read, the cpu decoder)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from helpers import probe_cli
from probe.judge.changes import Change, DaliPipeline, to_dali
from probe.judge.dali_model import SHARES, Host, best_predicted, candidates
from probe.judge.dali_run import DaliRun, DaliTried
from probe.judge.doctor.dali_search import MAX_POINTS, finish, search
from probe.judge.scaling import predict as predict_scaling
from probe.present.doctor_tables import scaling_lines


@dataclass(frozen=True)
class World:
    """A lane whose DALI follows the three terms, with terms the search does not know: CPU per
    image `fixed + hybrid x (1 - share)`, a hardware decoder of `decoder` images/s, a consumer
    of `alone` images/s slowed by `sm_fixed + sm_hybrid x (1 - share)`."""

    cores: float = 4.0
    alone: float = 3000.0
    hybrid: float = 0.010  # core-seconds per image nvJPEG's CPU part takes
    fixed: float = 0.0006
    main: float = 0.00015
    decoder: float = 2600.0
    sm_fixed: float = 0.05
    sm_hybrid: float = 0.6
    nvjpg_read: bool = True

    def rate(self, pipeline: DaliPipeline) -> tuple[float, str, float, float]:
        """images/s, what holds it, the threads' CPU %, the step's slowdown."""
        mixed = pipeline.decoder == "mixed"
        share = (pipeline.hw_decoder_load or 0.0) if mixed else 0.0
        per_image = self.fixed + self.hybrid * (1 - share) if mixed else 2.2 * self.hybrid
        feeder = 0.5 if mixed else 0.0  # the thread that feeds DALI's GPU stage
        threads = min(
            0.95 * (pipeline.num_threads + feeder) / per_image,
            self.cores / (per_image + self.main),
        )
        decoder = self.decoder / share if share else float("inf")
        slowed = self.sm_fixed + self.sm_hybrid * (1 - share) if mixed else 0.0
        sms = self.alone / (1 + slowed)
        consumer = "the SMs" if slowed else "nothing: the consumer sets the pace"
        bounds = {"its CPU threads": threads, "the hardware decoder": decoder, consumer: sms}
        holds = min(bounds, key=lambda k: bounds[k])
        return bounds[holds], holds, per_image * bounds[holds] * 100, slowed

    def measure(
        self, pipeline: DaliPipeline, why: str, predicted: float | None, later: int
    ) -> DaliTried:
        rate, holds, threads_cpu, slowed = self.rate(pipeline)
        nvjpg = rate * (pipeline.hw_decoder_load or 0.0) / self.decoder * 100
        return DaliTried(
            pipeline, why, predicted,
            images_per_s=rate, images_per_s_error=rate * 0.02, run_id=pipeline.setting,
            nvjpg_pct=nvjpg if pipeline.decoder == "mixed" and self.nvjpg_read else None,
            threads_cpu_pct=threads_cpu, step_slowed=slowed if slowed > 0.05 else None,
            holds=holds, lane_images_per_s=rate, main_cpu_pct=self.main * rate * 100,
        )  # fmt: skip

    def grid_best(self, threads: range, decoder: str = "mixed") -> float:
        return max(
            self.rate(DaliPipeline(decoder, t, s if decoder == "mixed" else None))[0]
            for t in threads
            for s in (SHARES if decoder == "mixed" else (None,))
        )

    def host(self) -> Host:
        return Host(self.cores, self.alone, self.nvjpg_read)


def always(later: int) -> str | None:
    return None


def run_search(world: World, start: DaliPipeline) -> tuple[DaliRun, list[DaliTried]]:
    first = world.measure(start, "DALI's defaults", None, 1)
    tried, stopped = search(first, world.host(), 1, world.measure, always, 1)
    empty = DaliRun(start.decoder, start.num_threads, hw_decoder_load=start.hw_decoder_load)
    return finish(empty, tried, world.host(), stopped), tried


@pytest.mark.parametrize(
    "world",
    [
        World(),  # 4 cores: the hardware decoder's share is most of the gain
        World(cores=8.0),  # 8 cores
        World(cores=16.0, decoder=4000.0),  # 16 cores: the SMs hold it
        World(cores=4.0, decoder=1500.0),  # a slow hardware decoder: a share below 1 is best
    ],
    ids=["4 cores", "8 cores", "16 cores", "slow NVJPG"],
)
def test_the_search_reaches_its_grids_best_from_dalis_defaults(world: World) -> None:
    start = DaliPipeline("mixed", int(world.cores), 0.65)
    answer, tried = run_search(world, start)
    best = world.grid_best(range(1, int(world.cores) + 1))
    assert answer.images_per_s is not None
    assert answer.images_per_s >= 0.95 * best
    assert len(tried) <= MAX_POINTS
    assert tried[0].pipeline == start and tried[0].predicted_images_per_s is None
    # each point after the first was predicted before it was measured
    assert all(t.predicted_images_per_s for t in tried[1:])
    assert answer.first is tried[0] and answer.gain == pytest.approx(
        answer.images_per_s / (tried[0].images_per_s or 1) - 1
    )
    assert answer.holds in {t.holds for t in tried}
    assert answer.not_searched is None


def test_a_starved_default_gains_most_where_cores_are_few() -> None:
    answer, _ = run_search(World(), DaliPipeline("mixed", 4, 0.65))
    assert answer.gain is not None and answer.gain > 0.8
    assert answer.hw_decoder_load is not None and answer.hw_decoder_load > 0.65


def test_where_nvml_cannot_read_the_hardware_decoder_the_share_is_not_searched() -> None:
    world = World(nvjpg_read=False)
    answer, tried = run_search(world, DaliPipeline("mixed", 4, 0.65))
    assert {t.pipeline.hw_decoder_load for t in tried} == {0.65}
    assert answer.not_searched is not None
    assert "hw_decoder_load was not searched" in answer.not_searched
    assert {c.hw_decoder_load for c in candidates(world.host(), "mixed")} == {0.65}


@pytest.mark.parametrize("share", [0.8, 1.0])
def test_unread_the_share_stays_where_it_started(share: float) -> None:
    """No NVJPG reading: the threads are searched at the share the search started from."""
    world = World(nvjpg_read=False)
    first = world.measure(DaliPipeline("mixed", 4, share), "the setting asked for", None, 1)
    host = Host(world.cores, world.alone, False, share)
    tried, stopped = search(first, host, 1, world.measure, always, 1)
    assert {t.pipeline.hw_decoder_load for t in tried} == {share}
    answer = finish(DaliRun("mixed", 4, hw_decoder_load=share), tried, host, stopped)
    assert answer.hw_decoder_load == share
    assert answer.not_searched is not None and "was not searched" in answer.not_searched


def test_the_cpu_decoder_on_a_gpu_says_it_has_no_share() -> None:
    world = World(cores=4.0)
    host = Host(4.0, world.alone, True)
    first = world.measure(DaliPipeline("cpu", 4), "the setting asked for", None, 1)
    tried, stopped = search(first, host, 1, world.measure, always, 1)
    answer = finish(DaliRun("cpu", 4), tried, host, stopped)
    assert answer.not_searched is not None and "no hardware decoder's share" in answer.not_searched


def test_a_search_with_nothing_judged_has_no_answer() -> None:
    first = DaliTried(DaliPipeline("mixed", 4, 0.65), "DALI's defaults", None, reason="failed")
    host = World().host()
    tried, stopped = search(first, host, 1, World().measure, always, 1)
    assert tried == [first] and stopped is not None
    answer = finish(DaliRun("mixed", 4, hw_decoder_load=0.65), tried, host, stopped)
    assert not answer.judged and answer.reason == stopped


def test_the_cpu_decoder_has_no_share_to_search() -> None:
    world = World(cores=2.0, alone=5000.0, nvjpg_read=False)
    host = Host(2.0, None, False)
    assert {c.hw_decoder_load for c in candidates(host, "cpu")} == {None}
    first = world.measure(DaliPipeline("cpu", 2), "the setting asked for", None, 1)
    tried, stopped = search(first, host, 1, world.measure, always, 1)
    answer = finish(DaliRun("cpu", 2), tried, host, stopped)
    assert all(t.pipeline.decoder == "cpu" for t in tried)
    assert answer.hw_decoder_load is None
    assert answer.change.setting == "DALI decoder=cpu num_threads=2"
    assert answer.not_searched is not None and "no hardware decoder's share" in answer.not_searched


def test_where_the_sms_hold_mixed_the_cpu_decoder_is_measured_if_predicted_faster() -> None:
    # many cores, a light CPU decode, a model the SMs share badly with nvJPEG
    world = World(cores=64.0, alone=3000.0, hybrid=0.004, decoder=1200.0, sm_fixed=0.5)
    answer, tried = run_search(world, DaliPipeline("mixed", 8, 0.65))
    assert len(tried) <= MAX_POINTS
    assert tried[-1].pipeline.decoder == "cpu"
    assert "the SMs hold mixed" in tried[-1].why
    assert answer.decoder == "cpu"


def test_a_search_the_budget_ends_says_what_it_did_not_measure() -> None:
    world = World()
    first = world.measure(DaliPipeline("mixed", 4, 0.65), "DALI's defaults", None, 1)

    def short(later: int) -> str | None:
        return "the budget cannot fit it: --budget 240 would"

    tried, stopped = search(first, world.host(), 1, world.measure, short, 1)
    assert tried == [first]
    assert stopped is not None and "was not measured: the budget cannot fit it" in stopped
    answer = finish(DaliRun("mixed", 4, hw_decoder_load=0.65), tried, world.host(), stopped)
    assert answer.change.setting == "DALI decoder=mixed num_threads=4 hw_decoder_load=0.65"
    assert answer.not_searched == stopped


def test_the_search_stops_where_nothing_is_predicted_faster_beyond_the_error() -> None:
    # fed at the defaults, the step not slowed: the consumer alone is the most any setting
    # can give, and the search says so rather than measure more
    world = World(cores=16.0, alone=500.0, sm_fixed=0.0, sm_hybrid=0.0)
    answer, tried = run_search(world, DaliPipeline("mixed", 16, 0.65))
    assert len(tried) == 1
    prediction = best_predicted([t.point for t in tried if t.point], world.host(), "mixed")
    assert prediction is not None and prediction.holds == "consumer"
    assert answer.images_per_s == world.alone and (answer.holds or "").startswith("nothing")


def test_a_dali_change_writes_its_share_and_reads_back() -> None:
    change = to_dali("mixed", 4, 0.9)
    assert change.setting == "DALI decoder=mixed num_threads=4 hw_decoder_load=0.9"
    assert Change.parse(change.setting) == change
    assert Change.from_json(change.to_json()) == change
    assert to_dali("cpu", 4, 0.9).setting == "DALI decoder=cpu num_threads=4"  # no share there
    assert Change.parse("DALI decoder=mixed num_threads=8") == to_dali("mixed", 8)
    assert isinstance(change.value, DaliPipeline)
    code = change.value.code
    assert "DaliOptions(num_threads=4, decoder=Decoder.MIXED, hw_decoder_load=0.9)" in code
    assert 'fn.decoders.image(..., device="mixed", hw_decoder_load=0.9)' in code


def test_a_doctors_dali_reads_back_with_its_search() -> None:
    answer, tried = run_search(World(), DaliPipeline("mixed", 4, 0.65))
    again = DaliRun.from_json(answer.to_json())
    assert again == answer
    assert again.tried == tuple(tried)
    # a document written before the search: one setting, no share
    old = {k: v for k, v in answer.to_json().items() if k not in ("tried", "holds", "code")}
    old["setting"] = "DALI decoder=mixed num_threads=8"
    assert DaliRun.from_json(old).hw_decoder_load is None


H200_GRID = Path(__file__).parent / "data" / "dali_grid_h200_4cores.json"


def recorded_world() -> tuple[dict[DaliPipeline, dict[str, Any]], Host]:
    """DALI mixed on one H200 held to 4 cores, ResNet-50, camera-sized JPEGs: every setting
    of threads 1-4 x hw_decoder_load 0.65-1, 20 s each (tests/benchmarks/dali_grid.py)."""
    grid = json.loads(H200_GRID.read_text())
    rows = {Change.parse(row["setting"]).value: row for row in grid["rows"]}
    host = Host(float(grid["cores"]), grid["consumer_alone_images_per_s"], True)
    return {p: row for p, row in rows.items() if isinstance(p, DaliPipeline)}, host


def recorded(rows: dict[DaliPipeline, dict[str, Any]]) -> Any:
    def measure(pipeline: DaliPipeline, why: str, predicted: float | None, later: int) -> DaliTried:
        row = rows[pipeline]  # a setting the grid did not measure fails the test here
        threads = row["threads_cpu_pct"]
        return DaliTried(
            pipeline, why, predicted,
            images_per_s=row["images_per_s"], images_per_s_error=row["images_per_s_error"],
            run_id=row["run_id"], nvjpg_pct=row["nvjpg_pct"], threads_cpu_pct=threads,
            step_slowed=row["step_slowed"], data_wait_frac=row["data_wait_frac"],
            lane_images_per_s=row["images_per_s"], main_cpu_pct=row["cpu_pct"] - threads,
        )  # fmt: skip

    return measure


@pytest.mark.parametrize("threads", [4, 3, 2, 1])
def test_on_recorded_h200_points_the_search_finds_the_grids_best(threads: int) -> None:
    """From DALI's defaults (4 threads, 0.65: 1,373 images/s) the grid's best is 3,191 at 2
    threads and a share of 1; from any thread count at 0.65, the search ends within 5% of it,
    in at most MAX_POINTS settings, each predicted before it was measured."""
    rows, host = recorded_world()
    measure = recorded(rows)
    start = DaliPipeline("mixed", threads, 0.65)
    first = measure(start, "the setting asked for", None, 1)
    tried, stopped = search(first, host, 1, measure, always, 1)
    answer = finish(DaliRun("mixed", threads, hw_decoder_load=0.65), tried, host, stopped)
    best = max(row["images_per_s"] for row in rows.values())
    assert answer.images_per_s is not None and answer.images_per_s >= 0.95 * best
    assert len(tried) <= MAX_POINTS and stopped is None
    if threads == 4:  # DALI's defaults here
        assert answer.images_per_s >= 1.8 * (first.images_per_s or 0.0)
        assert len(tried) <= 2  # the first prediction lands on it


def test_the_scaling_lines_name_the_dali_setting_found() -> None:
    """The job from 1 GPU to N is predicted from the DALI the search chose, and says which."""
    dali = DaliRun("mixed", 2, images_per_s=6_400.0, images_per_s_error=60.0, run_id="r",
                   cpu_pct=380.0, hw_decoder_load=1.0)  # fmt: skip
    scaling = predict_scaling(None, dali, 4_100.0, 2, 16.0, on_gpu=True)
    assert scaling is not None
    text = "\n".join(scaling_lines(scaling))
    assert "DALI as decoder=mixed num_threads=2 hw_decoder_load=1 on each" in text
    assert "DALI needs 2.4 cores per GPU" in text


def test_a_sweep_of_the_share_sets_it_in_whole_percent(tmp_path: Path) -> None:
    from probe.judge.session import SHARE_PCT, with_setting
    from probe.present.options import config_of

    config = config_of("run", {"gpus": "none", "backend": "dali", "data_dir": tmp_path})
    swept = with_setting(config, SHARE_PCT, 90)
    assert swept.spec.dali.hw_decoder_load == pytest.approx(0.9)
    assert swept.label == "DALI hw_decoder_load=0.9"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--knob", "hw_decoder_load", "--gpus", "none"], "--pipeline dali"),
        (["--pipeline", "dali", "--knob", "hw_decoder_load", "--gpus", "none"],
         "needs a GPU (--gpus) and --decoder mixed"),
        (["--pipeline", "dali", "--knob", "threads"], "Invalid value for '--knob'"),
    ],
)  # fmt: skip
def test_a_sweep_of_the_share_refuses_what_has_no_share(
    tmp_path: Path, flags: list[str], message: str
) -> None:
    result = probe_cli("sweep", *flags, "--db", tmp_path / "s.db")
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_run_refuses_a_share_outside_0_to_1(tmp_path: Path) -> None:
    result = probe_cli("run", "--pipeline", "dali", "--gpus", "none", "--hw-decoder-load",
                       "1.5", "--db", tmp_path / "s.db")  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: hw_decoder_load must be within 0..1 (got 1.5)"
    )
