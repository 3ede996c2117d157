"""A Ctrl-C stops the test run within seconds, with pytest's summary: while a test waits for a
command (which takes its time to stop, and started a process of its own), where pytest was
started with SIGINT ignored (as a shell starts a background job), and where the test running
catches the KeyboardInterrupt, as a probe run in pytest's process does, and goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import STOP_GRACE_S
from interrupts import AGAIN_S

TESTS = Path(__file__).resolve().parent
STOPPED_WITHIN_S = 30.0  # a few seconds on the 2-core machine; before, it went on to the end

# A command that takes no notice of Ctrl-C, and a process it started that outlives it.
STUBBORN = """
import pathlib, signal, subprocess, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
pathlib.Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(600)
"""

RUNS = {
    "a command": f"""
        import sys, time
        from pathlib import Path
        from helpers import run_captured

        def test_first():
            pass

        def test_waits_for_a_command(tmp_path):
            run_captured([sys.executable, "-c", {STUBBORN!r}, Path(__file__).with_name("ready")])

        def test_never_run():
            time.sleep(600)
        """,
    "a test that catches it and goes on": """
        import time
        from pathlib import Path

        def test_first():
            pass

        def test_catches_it():
            Path(__file__).with_name("ready").write_text("")
            try:
                time.sleep(600)
            except KeyboardInterrupt:  # as a probe run does: it stops cleanly and returns
                pass
            time.sleep(600)

        def test_never_run():
            time.sleep(600)
        """,
    "a test that catches it and ends": """
        import time
        from pathlib import Path

        def test_first():
            pass

        def test_catches_it():
            Path(__file__).with_name("ready").write_text("")
            try:
                time.sleep(600)
            except KeyboardInterrupt:
                pass

        def test_never_run():
            time.sleep(600)
        """,
}


def ended(pid: int) -> bool:
    """Whether the process is gone (or a zombie no one reaped: ended all the same)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


# (the test file, how many of its tests pass, whether pytest starts with SIGINT ignored)
CASES = {
    "a-command": ("a command", 1, False),
    "a-test-that-goes-on": ("a test that catches it and goes on", 1, False),
    "sigint-ignored-at-start": ("a test that catches it and ends", 2, True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_ctrl_c_stops_the_run_with_its_summary(tmp_path: Path, case: str) -> None:
    run, passed, ignored = CASES[case]
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(RUNS[run]))
    ready, log = tmp_path / "ready", tmp_path / "pytest.log"
    pytest_ = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider",
               "-p", "interrupts", "test_inner.py"]  # fmt: skip
    command = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *pytest_] if ignored else pytest_
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
    with open(log, "w") as output:
        inner = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=output,
                                 stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300  # its start, on a busy machine
        while not (ready.exists() and (ready.read_text() or run != "a command")):
            assert time.monotonic() < deadline and inner.poll() is None, log.read_text()
            time.sleep(0.2)
        time.sleep(0.5)  # into the wait
        os.killpg(inner.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
        sent = time.monotonic()
        inner.wait(timeout=STOPPED_WITHIN_S + 30)
        took = time.monotonic() - sent
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()
    out = log.read_text()
    assert took < STOPPED_WITHIN_S, out
    assert inner.returncode == pytest.ExitCode.INTERRUPTED, out
    assert out.splitlines()[-1].startswith(f"{passed} passed in "), out  # the summary line
    if run == "a command":
        assert ended(int(ready.read_text())), "the command's own process outlived it"
        assert took >= STOP_GRACE_S * 0.9  # it was given its time to stop
    if run == "a test that catches it and goes on":
        assert took >= AGAIN_S * 0.9  # interrupted again
