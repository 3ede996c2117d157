"""Every figure true where it is shown (issue 47), on recorded doctor sessions: each run named
beside a figure is the run that measured it, a pooled figure says it is pooled, "verified" only
over a verification that held, one figure a setting on the Session page's tiles, and the
DataLoader against DALI in one comparison.

`doctor_2core_in_alternation.json` is `probe show last --json` of `probe doctor --consumer
sleep:30` on the idle 2-core machine (sample data, 2026-11-28): num_workers=2 kept, DALI's cpu
decoder "either" after 5 pairs in alternation. It was recorded before the verification kept the
pairs' ratio, as older documents are read.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from probe.judge.results import Session
from probe.metrics import against_text, counted, signed
from probe.present.doctor_tables import dataloader_against_dali, doctor_lines
from probe.present.tables import verification_summary
from probe.records import RunStatus, SessionRecord
from probe.store.db import Store

DATA = Path(__file__).parent / "data"
APP = str(Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py")
RUN = r"\d{8}-\d{6}-[0-9a-f]{4}"
# a figure, then (without crossing a clause) a parenthesis that names the run it is of
QUOTED = re.compile(
    rf"(?<![=\d,.])(\d[\d,]*)(?: ± [\d,]+)? images/s[^;()]*\([^()]*?\brun ({RUN})[;)]"
)


def recorded(name: str = "doctor_2core_in_alternation.json") -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / name).read_text())
    return data


def run_figures(document: dict[str, Any]) -> dict[str, float]:
    """Each run's own images/s, as the session's document holds them."""
    figures = {p["run_id"]: p["images_per_s"] for p in document["sweep"]}
    figures |= {t["run_id"]: t["images_per_s"] for t in document["dali"]["tried"] if t["run_id"]}
    verify = document.get("verify") or {}
    figures |= {r["run_id"]: r["images_per_s"] for r in verify.get("in_turn", [])}
    epochs = document.get("epochs") or {}
    if epochs.get("run_id"):
        figures[epochs["run_id"]] = epochs["images_per_s"]
    return figures


def test_each_run_named_beside_a_figure_measured_it() -> None:
    """The issue's "measured 583 ± 9 images/s (...; run ...-7434)": that run measured 518, and
    583 was the mean of the five runs in alternation. Every run quoted beside a figure in the
    answer is the run that measured it, and the pooled figure says it is pooled."""
    document = recorded()
    figures = run_figures(document)
    text = "\n".join(doctor_lines(Session.from_json(document)))
    quoted = QUOTED.findall(text)
    assert len(quoted) >= 10  # the sweep's, DALI's, the runs in alternation
    for figure, run_id in quoted:
        assert figure == f"{figures[run_id]:,.0f}", (figure, run_id)
    verify = document["verify"]
    pooled = (
        f"{verify['measured_images_per_s']:,.0f} ± {verify['measured_images_per_s_error']:,.0f}"
    )
    assert f"measured {pooled} images/s, the mean of its 5 runs in alternation (" in text


def test_verified_only_over_a_verification_that_held() -> None:
    """The Session page's "recommendation 2 verified, and the first one measured again beside
    it" over a miss of -10.7%: the summary says "verified" only where the verification held."""
    session = Session.from_json(recorded())
    assert session.verify is not None and session.verify.verified
    pairs = "recommendations 1 and 2 measured in alternation, the pairs their check"
    assert verification_summary(session) == pairs
    missed = replace(session.verify, agrees=False)
    dali_first = replace(session, recommendations=session.recommendations[::-1], verify=missed)
    assert verification_summary(dali_first) == pairs  # neither went unchecked
    assert "verified" not in "\n".join(doctor_lines(dali_first))
    alone = replace(session, verify=replace(missed, in_turn=()))  # one run again, no pair
    assert verification_summary(alone) == "the first one measured again"


def test_a_setting_measured_in_alternation_is_shown_as_its_runs_pooled() -> None:
    session = Session.from_json(recorded())
    assert session.verify is not None and session.dali is not None
    loader = session.shown("num_workers=2")
    dali = session.shown(session.dali.change.setting)
    assert loader is not None and dali is not None
    assert loader.images_per_s == pytest.approx(session.verify.measured_images_per_s)
    assert len(loader.run_ids) == len(dali.run_ids) == 5
    assert loader.source == "the mean of its 5 runs in alternation"
    assert session.shown("num_workers=1") is not None  # a point of the sweep: its one run
    one = session.shown("num_workers=1")
    assert one is not None and one.source.startswith("run ")


def test_the_dataloader_against_dali_is_one_comparison() -> None:
    """Issue 47: "652 ± 19 images/s (1.25x)" beside "+4% ± 22% over 5 pairs". Where the pairs
    measured the two, the comparison is theirs: each side its runs pooled, DALI's gain over the
    pairs, and no ratio of single runs minutes apart; a document from before the pairs' ratio
    was kept has it computed from its runs, the figure its answer gave."""
    document = recorded()
    told = dataloader_against_dali(Session.from_json(document))
    assert told is not None and "x)" not in told
    assert told.startswith("measured in alternation, 5 pairs: the DataLoader at num_workers=2, ")
    assert "(the mean of its 5 runs in alternation)" in told
    assert told.endswith("DALI +12% ± 14% over the pairs")
    assert "DALI gave +12% ± 14% over 5 pairs" in document["verify"]["outcome"]
    document["verify"] |= {"ratio": 1.31, "ratio_error": 0.05, "ratio_over": "num_workers=2"}
    kept = dataloader_against_dali(Session.from_json(document))  # the one the doctor kept
    assert kept is not None and kept.endswith("DALI +31% ± 5% over the pairs")
    document["verify"] = None  # no pair: the best DataLoader run against DALI's, their ratio
    alone = dataloader_against_dali(Session.from_json(document))
    assert alone is not None and alone.endswith("(1.14x)")


def session_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, document: dict[str, Any]
) -> AppTest:
    """The Session page of a recorded session, in a store of its own."""
    tmp_path.mkdir(exist_ok=True)
    db = tmp_path / "store.db"
    with Store(db) as store:
        store.save_session(
            SessionRecord(document["session_id"], "doctor", document["created"],
                          RunStatus.COMPLETED, document["reason"], "host", None, document)
        )  # fmt: skip
    monkeypatch.setenv("FEEDSCOPE_DB", str(db))
    monkeypatch.setattr("probe.measure.devices.cuda_devices", lambda: [])
    at = AppTest.from_file(APP, default_timeout=60)
    at.switch_page("views/session.py")
    at.query_params["session"] = document["session_id"]
    return at.run()


def test_the_tiles_show_one_figure_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's "yours 550 ± 24" beside "recommended 584 ± 18" for "no change": where the
    answer keeps yours, one tile gives it; measured in alternation, at its runs there pooled,
    the figure the answer weighed against DALI's tile, pooled the same way."""
    document = recorded()
    at = session_page(tmp_path, monkeypatch, document)
    assert not at.exception, at.exception
    tiles = {metric.label: metric.value for metric in at.metric}
    assert "yours" not in tiles and "recommended" not in tiles and "best DataLoader" not in tiles
    verify = document["verify"]
    mine = f"{verify['measured_images_per_s']:,.0f} ± {verify['measured_images_per_s_error']:,.0f}"
    assert tiles["yours, the answer"] == mine  # its 5 runs in alternation pooled
    session = Session.from_json(document)
    assert session.dali is not None
    dali = session.shown(session.dali.change.setting)
    assert dali is not None and len(dali.run_ids) == 5
    assert tiles["DALI"] == f"{dali.images_per_s:,.0f} ± {dali.error:,.0f}"
    told = dataloader_against_dali(session)  # the comparison's two figures are the tiles'
    assert told is not None and mine in told and tiles["DALI"] in told
    document["verify"] = None  # not measured again: yours at the answer's prediction
    at = session_page(tmp_path / "alone", monkeypatch, document)
    top = document["recommendations"][0]
    alone = {metric.label: metric.value for metric in at.metric}
    predicted = f"{top['predicted_images_per_s']:,.0f} ± {top['predicted_error']:,.0f}"
    assert alone["yours, the answer"] == predicted


def test_a_count_of_one_is_singular() -> None:
    """The issue's "1 blocks", "1 workers", "1 batches"."""
    assert counted(1, "block") == "1 block" and counted(3, "block") == "3 blocks"
    assert counted(1, "batch") == "1 batch" and counted(2, "batch") == "2 batches"
    assert counted(1, "worker") == "1 worker" and counted(1_000, "run") == "1,000 runs"
    assert counted(0, "pair") == "0 pairs"


# `probe doctor` on the idle 2-core machine after the change (tests/benchmarks/results/
# 2026-11-28-figures): the pairs' ratio kept in the verification
PAIRS = Path(__file__).parent / "benchmarks" / "results" / "2026-11-28-figures" / "show1.json"


def test_a_session_recorded_with_its_pairs_says_each_figure_once() -> None:
    """The issue's sentence that did not parse ("... differ by of the bar: no longer session
    would decide it"), repeated up to five times an answer: said once, in the answer's note;
    each run named beside a figure measured it; the comparison is the pairs' kept ratio."""
    document = json.loads(PAIRS.read_text())
    session = Session.from_json(document)
    text = "\n".join(doctor_lines(session))
    assert text.count("session would decide it") == 1
    assert session.verify is not None and session.verify.outcome is not None
    assert text.count(session.verify.outcome) == 1
    figures = run_figures(document)
    quoted = QUOTED.findall(text)
    assert len(quoted) >= 11
    for figure, run_id in quoted:
        assert figure == f"{figures[run_id]:,.0f}", (figure, run_id)
    assert session.verify.ratio is not None and session.verify.ratio_over == "num_workers=2"
    told = dataloader_against_dali(session)
    assert told is not None and told.endswith(
        f"DALI {session.verify.ratio - 1:+.0%} ± {session.verify.ratio_error:.0%} over the pairs"
    )


@pytest.mark.parametrize(
    ("share", "digits", "text"),
    [(-0.004, 0, "+0%"), (0.004, 0, "+0%"), (-0.0004, 1, "+0.0%"), (-0.006, 0, "-1%"),
     (0.071, 0, "+7%"), (-0.024, 1, "-2.4%")],
)  # fmt: skip
def test_a_change_that_rounds_to_nothing_reads_plus_zero(
    share: float, digits: int, text: str
) -> None:
    """A gain of -0.4% shown to the percent is no loss: "+0%", never "-0%"; a change that
    rounds to something keeps its sign."""
    assert signed(share, digits) == text
    assert against_text(100 * (1 + share), 100.0, digits) == text
