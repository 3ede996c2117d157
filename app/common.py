"""What every page shares: the store, cached reads, and errors shown as messages.

The dashboard reads the store with short-lived connections (a probe may be writing it) and
never writes it except through `probe`'s launch functions.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import streamlit as st

from probe import InputError
from probe.fix.setting import tune_told
from probe.judge.changes import Recommendation
from probe.judge.diagnosis import RunDiagnosis, diagnose_run
from probe.judge.results import Session, read_session
from probe.judge.thresholds import Severity
from probe.judge.verdicts import Verdict, VerdictKind
from probe.present import launch
from probe.present.listing import run_rows, session_rows
from probe.present.report import build_report, render
from probe.present.tables import ASIDE, headline, recommendation_text
from probe.records import LaunchRecord
from probe.store.connection import default_db_path
from probe.store.db import Store
from probe.store.documents import RunDocument, read_run
from probe.store.series import latency_histogram, run_series

logger = logging.getLogger(__name__)


def db_path() -> str:
    """The store: $FEEDSCOPE_DB, else the user's data folder."""
    return str(default_db_path())


@contextmanager
def store() -> Iterator[Store]:
    with Store(db_path()) as connection:
        yield connection


def page(body: Callable[..., None]) -> Callable[..., None]:
    """Runs a page (or a fragment of one) so that no traceback reaches it: user errors and
    failures become messages."""

    @functools.wraps(body)
    def guarded(*args: Any) -> None:
        try:
            body(*args)
        except InputError as error:
            st.error(str(error))
        except Exception as error:
            if type(error).__module__.startswith("streamlit"):
                raise  # rerun and stop requests are Streamlit's own control flow
            logger.exception("a dashboard page failed")
            st.error(f"This page could not be shown: {type(error).__name__}: {error}")

    return guarded


@st.cache_data(ttl=2, show_spinner=False)
def runs_listing(db: str) -> list[dict[str, Any]]:
    with Store(db) as connection:
        return [row.__dict__ for row in run_rows(connection)]


@st.cache_data(max_entries=256, show_spinner=False)
def diagnosis(db: str, run_id: str, version: str) -> RunDiagnosis:
    """A run's diagnosis; `version` (its status and end) keys the cache."""
    with Store(db) as connection:
        return diagnose_run(connection, run_id)


@st.cache_data(max_entries=32, show_spinner=False)
def document(db: str, run_id: str, version: str) -> RunDocument:
    with Store(db) as connection:
        return read_run(connection, run_id)


@st.cache_data(max_entries=16, show_spinner=False)
def run_view(db: str, run_id: str, version: str) -> dict[str, Any]:
    """What the Run page shows: the run, its diagnosis, its series and its latency histogram
    (each a bounded read of the store's rollups, whatever the run's length)."""
    with Store(db) as connection:
        return {
            "document": read_run(connection, run_id),
            "diagnosis": diagnose_run(connection, run_id),
            "series": run_series(connection, run_id),
            "histogram": latency_histogram(connection, run_id),
            "tuned": tune_told(connection, run_id),
        }


def version_of(run: dict[str, Any], db: str | None = None) -> str:
    """What changes while a run goes on: its status and how far it got; with `db`, also the
    sessions and tune sessions stored since, which measure a watched run's what-if."""
    version = f"{run['status']}:{run.get('images_per_s')}"
    if db is None:
        return version
    with Store(db) as store:
        return f"{version}:{len(store.sessions())}:{len(store.tunes(run['run_id']))}"


@st.cache_data(ttl=2, show_spinner=False)
def sessions_listing(db: str) -> list[dict[str, Any]]:
    with Store(db) as connection:
        return [row.__dict__ for row in session_rows(connection)]


@st.cache_data(max_entries=32, show_spinner=False)
def session(db: str, session_id: str, version: str) -> Session:
    """A stored session; `version` (its status) keys the cache."""
    with Store(db) as connection:
        return read_session(connection, session_id)


def pick(rows: list[dict[str, Any]], what: str, describe: Callable[[dict[str, Any]], str]) -> str:
    """A selectbox of the runs or sessions in `rows` (`what`: "run" or "session", the id's key
    `what`_id, the page's parameter and the widget's key prefix): the one the address names,
    else the newest, written back to the address. `rows` is not empty."""
    by_id = {row[f"{what}_id"]: row for row in rows}
    ids = list(by_id)
    wanted = st.query_params.get(what)
    if wanted and wanted not in by_id:
        st.warning(f"No {what} {wanted} in the store; showing the newest.")
        wanted = None
    chosen = str(
        st.selectbox(
            what,
            ids,
            index=ids.index(wanted) if wanted else 0,
            key=f"{what}-pick",
            format_func=lambda chosen_id: describe(by_id[chosen_id]),
        )
    )
    if chosen != st.query_params.get(what):
        st.query_params[what] = chosen
    return chosen


def launch_failed(item: LaunchRecord, key: str) -> None:
    """A launch that failed: why, as its last error line says, and the one click on: again with
    the budget that reason names, or as it was (on a quieter host, say)."""
    why = launch.failure_reason(item)
    exit_code = "" if item.exit_code is None else f", exit {item.exit_code}"
    st.error(
        f"{item.launch_id} (probe {item.command}) ended (failed{exit_code}): "
        + markdown_text(why or "it printed no error; its log is " + item.log_path)
    )
    hint = launch.budget_hint(why) if item.command in ("sweep", "doctor") else None
    label = "Run it again" + (f" with --budget {hint}" if hint is not None else "")
    if st.button(label, key=f"{key}-again-{item.launch_id}"):
        with store() as connection:
            launch.again(connection, item, hint)
        st.switch_page("views/live.py")


def markdown_text(text: str) -> str:
    """Text for st.markdown: its `code` marks kept, a dollar sign never read as LaTeX."""
    return text.replace("$", "\\$")


def verdict_box(verdict: Verdict) -> None:
    """A verdict's headline in its colour: red or amber for starvation by its severity; the
    pipeline alone (no consumer) in blue, as capacity, never as an alarm, and too few batches
    to judge in blue, as no verdict; else green."""
    if verdict.kind in (VerdictKind.PIPELINE_ONLY, VerdictKind.UNKNOWN):
        show = st.info
    else:
        show = {Severity.HIGH: st.error, Severity.MODERATE: st.warning}.get(
            verdict.severity, st.success
        )
    show(markdown_text(headline(verdict)))


def recommendation_list(
    recommendations: Sequence[Recommendation],
    asides: Sequence[Recommendation] = (),
    scope: str = "",
    agreed: bool = True,
) -> None:
    """Ranked recommendations as a numbered list: each whole (the change, its images/s
    predicted and verified, `scope`: whose), with its basis and notes under it; then the
    changes set aside, below yours."""
    for title, items in ((None, recommendations), (f"Not recommended: {ASIDE}", asides)):
        if not items:
            continue
        lines = [] if title is None else [f"**{title}**", ""]
        for rank, item in enumerate(items, 1):
            text = recommendation_text(item, scope, agreed)
            lines.append(f"{rank}. **{markdown_text(text)}**")
            lines += [f"   - {markdown_text(text)}" for text in (item.basis, *item.notes)]
        st.markdown("\n".join(lines))


EXPORTS = (
    ("html", "HTML report", "text/html"),
    ("md", "Markdown summary", "text/markdown"),
    ("json", "JSON (everything)", "application/json"),
)


@st.cache_data(max_entries=24, show_spinner="Preparing the report")
def report_file(db: str, subject: str, version: str, form: str) -> str:
    """A report of a run or session in one form, made once per subject and `version` (its
    status and figures) and reused by every click."""
    with Store(db) as connection:
        return render(build_report(connection, subject), form)


def export_buttons(db: str, subject: str, version: str, key: str) -> None:
    """Download buttons for the report of a run or session, in each format. Each file is made
    on its first click (an HTML report of a long run takes a second or two) and kept; a click
    does not rerun the page, so the other buttons stay valid however fast they are clicked."""
    for column, (form, label, mime) in zip(st.columns(len(EXPORTS)), EXPORTS, strict=True):
        column.download_button(
            label,
            functools.partial(report_file, db, subject, version, form),
            file_name=f"feedscope-{subject}.{form}",
            mime=mime,
            key=f"{key}-{form}",
            on_click="ignore",
        )
