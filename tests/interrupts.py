"""Ctrl-C stops the test run within seconds, with pytest's summary (a plugin: conftest.py loads it).

Two things kept a run going after a Ctrl-C. A shell starts a background job with SIGINT ignored,
and Python then never turns a Ctrl-C into KeyboardInterrupt: pytest went on as if nothing had
happened. And a probe run in pytest's own process (`run_probe`, the doctor) takes Ctrl-C as its
cue to stop cleanly and returns, as it does for a user's script: the test, and the run of the
suite, went on. Here a Ctrl-C always raises KeyboardInterrupt; a test that went on regardless is
interrupted again every few seconds, and the run stops after it in any case.

Commands a test waits for are stopped by `helpers.run_captured`, with everything they started.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Generator
from types import FrameType
from typing import Any

import pytest

AGAIN_S = 3.0  # a test still running this long after a Ctrl-C that it caught is interrupted again

_caught = threading.Event()  # a Ctrl-C came
_stopping = threading.Event()  # pytest is stopping on it (or the run ended): no more interrupts
_previous: dict[str, Any] = {}  # the handler found at the start


def _on_ctrl_c(signum: int, frame: FrameType | None) -> None:
    if not _caught.is_set():
        _caught.set()
        threading.Thread(target=_interrupt_again, name="ctrl-c-again", daemon=True).start()
    raise KeyboardInterrupt


def _interrupt_again() -> None:
    """Sends SIGINT to the main thread every AGAIN_S until pytest stops: a blocking call there
    (a pipe, a queue, a sleep) is woken, and the code that caught the last one meets another."""
    main = threading.main_thread().ident
    while not _stopping.wait(AGAIN_S) and main is not None:
        signal.pthread_kill(main, signal.SIGINT)


def pytest_configure(config: pytest.Config) -> None:
    previous = _previous["handler"] = signal.getsignal(signal.SIGINT)
    # Python's own handler, or none (SIGINT ignored, as in a shell's background job); a handler
    # someone else installed (a debugger's) is left to do its work.
    if previous in (signal.default_int_handler, signal.SIG_IGN, signal.SIG_DFL):
        signal.signal(signal.SIGINT, _on_ctrl_c)


def pytest_unconfigure(config: pytest.Config) -> None:
    _stopping.set()
    if signal.getsignal(signal.SIGINT) is _on_ctrl_c:
        signal.signal(signal.SIGINT, _previous["handler"])


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    _stopping.set()  # pytest tears down and prints its summary: let it


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(
    item: pytest.Item, nextitem: pytest.Item | None
) -> Generator[None, object, object]:
    result = yield
    if _caught.is_set() and not _stopping.is_set():  # the test caught it and ended
        _stopping.set()
        item.session.shouldstop = "Ctrl-C, caught by the test that was running"
    return result
