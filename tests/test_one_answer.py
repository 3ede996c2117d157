"""One answer per session, everywhere: `last` names what the user started (a session, not its
verification run); `probe show`, `probe report` and a session's runs give the doctor's measured
recommendations, never a run's own estimate beside them; "yours" is the user's setting and "no
change" keeps it. On a store real CPU probes filled (tests/conftest.py)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from helpers import probe_cli
from pipelines import InputError
from probe.judge.changes import Recommendation
from probe.judge.diagnosis import diagnose_run
from probe.judge.results import focus_run, read_session, resolve_subject
from probe.present.progress import last_progress, progress_line
from probe.present.tables import ASIDE
from probe.records import RunRecord, RunStatus
from probe.store.db import Store


def test_last_is_the_newest_run_or_session_a_user_started(
    filled_store: dict[str, Any], tmp_path: Path
) -> None:
    with Store(filled_store["db"]) as store:
        # the hostile-folder run came after the sweep, and no session run counts on its own
        assert resolve_subject(store, "last") == filled_store["hostile"]["run_id"]
        runs = store.runs()
        sessions = store.sessions()
    copy = tmp_path / "store.db"
    with Store(copy) as store:
        for session in sessions:
            store.save_session(session)
        sweep = filled_store["sweep"]
        # a session's own runs are newer than its start, and still it is named, not them
        for run in runs:
            if run.session_id == sweep["session_id"]:
                store.create_run(replace(run, status=RunStatus.COMPLETED), [])
        assert resolve_subject(store, "last") == sweep["session_id"]
        assert focus_run(store, sweep["session_id"]) == sweep["knee"]["run_id"]
        # a session still measuring: its runs count as runs until it is stored
        late = _run(runs[0], "20991231-000000-late", "doctor-20991231-000000-abcd")
        store.create_run(late, [])
        assert resolve_subject(store, "last") == late.run_id
        assert resolve_subject(store, sweep["session_id"][:14]) == sweep["session_id"]
    with Store(tmp_path / "empty.db") as store, pytest.raises(InputError, match="no runs yet"):
        resolve_subject(store, "last")


def _run(like: RunRecord, run_id: str, session_id: str) -> RunRecord:
    return replace(like, run_id=run_id, created="2099-12-31T00:00:00Z", session_id=session_id)


def test_show_and_report_of_last_give_the_doctors_answer(
    filled_store: dict[str, Any], tmp_path: Path
) -> None:
    """`probe show last` and `probe report last` after a doctor: its answer, not its
    verification run's."""
    db = tmp_path / "store.db"
    doctor = filled_store["doctor"]
    with Store(filled_store["db"]) as source, Store(db) as store:
        store.save_session(source.session(doctor["session_id"]))
        for run in source.runs():
            if run.session_id == doctor["session_id"]:
                store.create_run(run, [])
    shown = json.loads(probe_cli("show", "last", "--db", db, "--json").stdout)
    assert shown["session_id"] == doctor["session_id"]
    assert shown["recommendations"] == doctor["recommendations"]
    text = probe_cli("show", "last", "--db", db)
    assert text.returncode == 0, text.stderr
    top = Recommendation.from_json(doctor["recommendations"][0])
    assert f"1. {top.setting}: {top.action}" in text.stdout
    report = probe_cli("report", "last", "--db", db)
    assert report.returncode == 0, report.stderr
    assert f"doctor session {doctor['session_id']}" in report.stdout
    assert top.setting in report.stdout


def test_a_sessions_runs_give_its_measured_recommendations_not_their_own(
    filled_store: dict[str, Any],
) -> None:
    doctor = filled_store["doctor"]
    with Store(filled_store["db"]) as store:
        for run_id in doctor["run_ids"]:
            diagnosis = diagnose_run(store, run_id)
            assert diagnosis.answered_by == doctor["session_id"]
            assert [r.to_json() for r in diagnosis.recommendations] == doctor["recommendations"]
        two = diagnose_run(store, filled_store["two"]["run_id"])  # no session: its own
        assert two.answered_by is None
    verify = doctor["verify"]
    if verify is not None:
        shown = probe_cli("show", verify["run_id"], "--db", filled_store["db"])
        assert f"doctor session {doctor['session_id']}'s, measured" in shown.stderr
        text = shown.stdout + shown.stderr
        listed = text.split("recommendations:", 1)[1].split(ASIDE, 1)[0]  # not those set aside
        ranked = [line.strip() for line in listed.splitlines() if re.match(r"\s+\d+\. ", line)]
        expected = [Recommendation.from_json(r) for r in doctor["recommendations"]]
        assert len(ranked) == len(expected)
        for rank, (line, item) in enumerate(zip(ranked, expected, strict=True), 1):
            assert line.startswith(f"{rank}. {item.setting}: {item.action}")


def test_yours_is_your_setting_and_no_change_keeps_it(filled_store: dict[str, Any]) -> None:
    doctor = filled_store["doctor"]
    with Store(filled_store["db"]) as store:
        session = read_session(store, doctor["session_id"])
    yours = next(p for p in session.points if p.run_id == session.verdict_run_id)
    for item in session.recommendations:
        if item.action.startswith("no change"):
            assert item.setting == f"num_workers={yours.setting}"
        elif item.setting.startswith("num_workers="):
            assert item.setting != f"num_workers={yours.setting}"
            assert f"from {yours.setting} to " in item.action
    assert session.verdict is not None
    for evidence in session.verdict.evidence:
        if ", yours, " in evidence.text:
            assert f"num_workers={yours.setting}, yours," in evidence.text
        if "on yours, " in evidence.text:
            assert f"on yours, num_workers={yours.setting}" in evidence.text


def test_progress_lines_read_back() -> None:
    line = progress_line("writing the sample data", 250, 1000, "images", 30.0)
    assert line == (
        "writing the sample data: 250 of 1000 images, 30 s so far, about 1 min 30 s left"
    )
    log = f"generating the built-in sample dataset\n{line}\nnoise: 3 of\n"
    progress = last_progress(log)
    assert progress is not None
    assert (progress.done, progress.total, progress.unit) == (250, 1000, "images")
    assert progress.share == 0.25
    assert last_progress("nothing here\n") is None
