"""`probe watch -- python train.py ARGS`: a training script run unchanged, every DataLoader and
DALI iterator it iterates watched as if its code wrapped each in `watch`.

The script runs in this process as `python train.py ARGS` (or `python -m pkg.train ARGS`) would
run it: as `__main__`, its folder first on `sys.path`, `sys.argv` its own. Under torchrun each
rank runs it so (`torchrun ... -m probe watch -- train.py ARGS`), and each is a lane of one run,
as with `watch`.

Each loader object is one run, named after the script (`train.py`; the second loader iterated,
such as a validation loader, `train.py (loader 2)`), and each `for` over it an epoch of that run.
The loaders' classes are patched for the script's lifetime only: `DataLoader.__iter__` and DALI's
iterators' base class, where DALI is installed. A loader the script already wraps in `watch` is
left to it: one run, not two.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import BackendUnavailable, InputError
from probe.measure.recording import Answer
from probe.measure.watch import Outlets, Watched, iterated_by_watch
from probe.records import RunStatus


@dataclass
class Script:
    """What to run: a file or a module, and its arguments."""

    path: Path | None
    module: str | None
    args: list[str]

    @property
    def name(self) -> str:
        return self.path.name if self.path is not None else str(self.module)

    @classmethod
    def of(cls, command: Sequence[str]) -> Script:
        """`python train.py ARGS`, `train.py ARGS`, or `python -m pkg.train ARGS`.

        Raises:
            InputError: no script, or a file that is not there.
        """
        words = list(command)
        if words and Path(words[0]).name.startswith("python"):
            words = words[1:]
        if not words:
            raise InputError("probe watch needs the script to run: probe watch -- train.py ARGS")
        if words[0] == "-m":
            if len(words) < 2:
                raise InputError("probe watch -- -m needs a module: probe watch -- -m pkg.train")
            return cls(None, words[1], words[2:])
        path = Path(words[0])
        if not path.is_file():
            raise InputError(f"no script {path}: the file is not there")
        return cls(path, None, words[1:])


@dataclass
class Watching:
    """The loaders a script iterated, each with its `Watched`, in the order first iterated."""

    script: Script
    options: dict[str, Any]  # watch()'s: name, db, sample_hz, warmup
    outlets: Outlets
    watched: list[Watched[Any]] = field(default_factory=list)
    _of: dict[int, Watched[Any]] = field(default_factory=dict)  # id(loader): kept alive here

    def iterate(self, loader: Any, original: Callable[[Any], Iterator[Any]]) -> Iterator[Any]:
        if iterated_by_watch():  # a loader's own iter(), or one your code wraps in watch()
            return original(loader)
        watched = self._of.get(id(loader))
        if watched is None:
            name = self.options.get("name") or self.script.name
            if self.watched:
                name = f"{name} (loader {len(self.watched) + 1})"
            watched = Watched(loader, name, self.options.get("db"), self.options["sample_hz"],
                              self.options["warmup"], self.outlets)  # fmt: skip
            self._of[id(loader)] = watched
            self.watched.append(watched)
        return iter(watched)


def run_script(script: Script, watching: Watching) -> int:
    """Runs `script` with its loaders watched; returns its exit code. Every run it started is
    ended: completed where the script exited 0, else interrupted (the exit code or the error
    said in its reason). An error of the script is printed as Python prints it."""
    code, reason = 0, None
    Answer.elsewhere = True  # `probe watch` tells the answer when the script ends
    saved_argv, saved_path = sys.argv, list(sys.path)
    saved_db = os.environ.get("FEEDSCOPE_DB")
    if watching.options.get("db") is not None:  # the script's own watch() calls write there too
        os.environ["FEEDSCOPE_DB"] = str(watching.options["db"])
    try:
        with _patched(watching):
            if script.path is not None:
                sys.argv = [str(script.path), *script.args]
                sys.path.insert(0, str(script.path.resolve().parent))
                runpy.run_path(str(script.path), run_name="__main__")
            else:
                sys.argv = [str(script.module), *script.args]
                sys.path.insert(0, "")
                runpy.run_module(str(script.module), run_name="__main__", alter_sys=True)
    except SystemExit as exit_:
        code, reason = _exit_code(exit_.code), f"the script exited with code {exit_.code}"
    except KeyboardInterrupt:
        code, reason = 130, "interrupted (Ctrl-C)"
    except BaseException as error:
        traceback.print_exc()
        code, reason = 1, f"the script failed: {type(error).__name__}: {error}".splitlines()[0]
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if saved_db is None:
            os.environ.pop("FEEDSCOPE_DB", None)
        else:
            os.environ["FEEDSCOPE_DB"] = saved_db
    for watched in watching.watched:
        if code == 0:
            watched.close(RunStatus.COMPLETED)
        else:
            watched.close(RunStatus.INTERRUPTED, reason)
    return code


@contextmanager
def _patched(watching: Watching) -> Iterator[None]:
    """`__iter__` of DataLoader and of DALI's iterators, watched while the block runs."""
    from torch.utils.data import DataLoader

    classes: list[Any] = [cls for cls in (DataLoader, _dali_iterators()) if cls is not None]
    originals = {cls: cls.__dict__["__iter__"] for cls in classes}

    def patch(original: Callable[[Any], Iterator[Any]]) -> Callable[[Any], Iterator[Any]]:
        def __iter__(self: Any) -> Iterator[Any]:
            return watching.iterate(self, original)

        return __iter__

    for cls, original in originals.items():
        cls.__iter__ = patch(original)
    try:
        yield
    finally:
        for cls, original in originals.items():
            cls.__iter__ = original


def _dali_iterators() -> type | None:
    """DALI's iterators' base class, None where DALI is not installed."""
    try:
        from pipelines.dali_loader import iterator_class
    except BackendUnavailable:
        return None
    return iterator_class()


def _exit_code(code: object) -> int:
    """sys.exit's argument as the process's exit code, as Python makes it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
