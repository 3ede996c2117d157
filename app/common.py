"""What every page shares: the store, cached reads, and errors shown as messages.

The dashboard reads the store with short-lived connections (a probe may be writing it) and
never writes it except through `probe`'s launch functions.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import streamlit as st

from probe import InputError
from probe.judge.diagnosis import RunDiagnosis, diagnose_run
from probe.present.listing import run_rows
from probe.present.report import build_report, render
from probe.store.db import Store, default_db_path
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
    """What the Run page shows: the run, its diagnosis, its series and its latency histogram,
    read side by side (each mostly SQLite scanning, which lets go of the GIL)."""

    def read(work: Callable[[Store], Any]) -> Any:
        with Store(db) as connection:
            return work(connection)

    parts = {
        "document": lambda s: read_run(s, run_id),
        "diagnosis": lambda s: diagnose_run(s, run_id),
        "series": lambda s: run_series(s, run_id),
        "histogram": lambda s: latency_histogram(s, run_id),
    }
    with ThreadPoolExecutor(max_workers=len(parts)) as pool:
        futures = {name: pool.submit(read, work) for name, work in parts.items()}
        return {name: future.result() for name, future in futures.items()}


def version_of(run: dict[str, Any]) -> str:
    """What changes while a run goes on: its status and how far it got."""
    return f"{run['status']}:{run.get('images_per_s')}"


EXPORTS = (
    ("html", "HTML report", "text/html"),
    ("md", "Markdown summary", "text/markdown"),
    ("json", "JSON (everything)", "application/json"),
)


def export_buttons(db: str, subject: str, key: str) -> None:
    """Download buttons for the report of a run or session, in each format; each report is
    made when its button is clicked (an HTML report of a long run takes a second or two)."""

    def maker(form: str) -> Callable[[], str]:
        def make() -> str:
            with Store(db) as connection:
                return render(build_report(connection, subject), form)

        return make

    for column, (form, label, mime) in zip(st.columns(len(EXPORTS)), EXPORTS, strict=True):
        column.download_button(
            label,
            maker(form),
            file_name=f"feedscope-{subject}.{form}",
            mime=mime,
            key=f"{key}-{form}",
        )
