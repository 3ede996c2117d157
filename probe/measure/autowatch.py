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

`probe watch --loader MODULE` (`Swap`) runs the job with a written module's loader in place of
the training loader, with no edit: the loader the run watched (iterated at the recorded line
of its script, else the first one iterated) gives the module's batches from its first `for`,
`MODULE.loader(original=...)` made then, after the script has chosen its device and joined its
ranks. `--workers N` runs the job's own loader at N workers instead. With `--batches N` the job
stops after N batches beyond the warm-up (`TrialEnd`), the same batch on every rank: `probe
tune`'s trials are this.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import runpy
import sys
import traceback
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines import BackendUnavailable, InputError
from probe.measure.recording import Answer
from probe.measure.watch import Outlets, Watched, iterated_by_watch, leaving_alone, unwatched
from probe.records import RunStatus


class TrialEnd(BaseException):
    """The swapped loader gave the batches asked for: the job ends here, completed."""


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
class Swap:
    """What takes the place of the job's training loader: a written module's loader
    (`module`), or the job's own at `workers`; `site` the (file name, line) where the loader
    to swap is iterated (None: the first loader iterated); `batches` the batches beyond the
    warm-up after which the job stops (None: as long as it runs)."""

    module: Path | None = None
    workers: int | None = None
    site: tuple[str, int] | None = None
    batches: int | None = None
    warmup: int = 0
    _loaded: Any = None

    def load(self) -> None:
        """Imports the module, before the script starts.

        Raises:
            InputError: no such file, or it cannot be imported, or it has no `loader()`.
        """
        if self.module is None:
            return
        if not self.module.is_file():
            raise InputError(f"--loader {self.module}: the file is not there")
        name = f"feedscope_swap_{self.module.stem}"
        try:
            spec = importlib.util.spec_from_file_location(name, self.module)
            if spec is None or spec.loader is None:
                raise ImportError("not a Python module")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except Exception as error:
            cause = f"{type(error).__name__}: {error}".splitlines()[0]
            raise InputError(f"--loader {self.module}: cannot import it: {cause}") from None
        if not callable(getattr(module, "loader", None)):
            raise InputError(f"--loader {self.module}: it has no loader() to call")
        self._loaded = module

    def describe(self) -> dict[str, Any]:
        """What took the loader's place, as the run records it."""
        return {"module": None if self.module is None else str(self.module),
                "workers": self.workers, "batches": self.batches}  # fmt: skip

    def takes(self, loader: Any, site: tuple[str, int] | None, first: bool) -> bool:
        """Whether `loader`, iterated at `site`, is the one to swap."""
        if self.site is None:
            return first
        return site is not None and site == self.site

    def source(self, loader: Any) -> Any:
        """What the job iterates in place of `loader`."""
        if self._loaded is None:
            if self.workers is not None:
                if self.workers > 0 and getattr(loader, "prefetch_factor", 2) is None:
                    loader.prefetch_factor = 2  # torch's default, set only with workers
                loader.num_workers = self.workers
            return loader
        make = self._loaded.loader
        takes_original = "original" in inspect.signature(make).parameters
        return _Swapped(make(original=loader) if takes_original else make())


class _Swapped:
    """A written module's loader, iterated as the job's own: its inner loaders (a DataLoader,
    DALI's iterator) are its own, not loaders of the script to watch."""

    def __init__(self, made: Any) -> None:
        self.made = made
        # what the run describes: the module's own DataLoader or DALI iterator
        self.feedscope_inner = next(
            (getattr(made, name) for name in ("batches", "_batches") if hasattr(made, name)), made
        )

    def __len__(self) -> int:
        return len(self.made)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.made, name)

    def __iter__(self) -> Iterator[Any]:
        batches = unwatched(self.made)
        while True:
            with leaving_alone():  # the first step starts the module's inner loader
                batch = next(batches, _END)
            if batch is _END:
                return
            yield batch


_END = object()


@dataclass
class Watching:
    """The loaders a script iterated, each with its `Watched`, in the order first iterated;
    the training loader swapped where `swap` says."""

    script: Script
    options: dict[str, Any]  # watch()'s: name, db, sample_hz, warmup; the run's command
    outlets: Outlets
    swap: Swap | None = None
    # Each loader's `Watched`, held by the loader itself: a loader the script drops (one made
    # anew each epoch) ends its run, and its samplers, when it is collected, not at the exit.
    watched: list[weakref.ref[Watched[Any]]] = field(default_factory=list)
    _of: dict[int, weakref.ref[Watched[Any]]] = field(default_factory=dict)  # by id(loader)
    _kept: list[Watched[Any]] = field(default_factory=list)  # those a loader cannot hold
    _swapped: int | None = None  # id(loader) swapped
    _given = 0  # batches the swapped loader gave

    def iterate(self, loader: Any, original: Callable[[Any], Iterator[Any]]) -> Iterator[Any]:
        if iterated_by_watch():  # a loader's own iter(), or one your code wraps in watch()
            return original(loader)
        known = self._of.get(id(loader))
        watched = None if known is None else known()
        if watched is None:
            source = loader
            swapping = self.swap is not None and self._swapped is None
            if swapping and self.swap.takes(loader, _site(), not self.watched):  # type: ignore[union-attr]
                source, self._swapped = self.swap.source(loader), id(loader)  # type: ignore[union-attr]
            name = self.options.get("name") or self.script.name
            if self.watched:
                name = f"{name} (loader {len(self.watched) + 1})"
            watched = Watched(source, name, self.options.get("db"), self.options["sample_hz"],
                              self.options["warmup"], self.outlets)  # fmt: skip
            watched.command = self.options.get("command")
            if id(loader) == self._swapped and self.swap is not None and watched.command:
                watched.command = {**watched.command, "swapped": self.swap.describe()}
            self._hold(loader, watched)
        if id(loader) == self._swapped and self.swap is not None and self.swap.batches:
            return self._bounded(iter(watched), self.swap.warmup + self.swap.batches)
        return iter(watched)

    def _hold(self, loader: Any, watched: Watched[Any]) -> None:
        """`watched` kept alive by `loader` (or here, for the swapped loader, whose id must
        not be taken by another, and for a loader without attributes of its own)."""
        self._of[id(loader)] = weakref.ref(watched)
        self.watched.append(weakref.ref(watched))
        if id(loader) != self._swapped:
            with suppress(AttributeError, TypeError, ValueError):
                loader._feedscope_watched = watched
                return
        self._kept.append(watched)

    @property
    def swapped(self) -> bool:
        """Whether a loader of the script was swapped."""
        return self._swapped is not None

    def _bounded(self, batches: Iterator[Any], limit: int) -> Iterator[Any]:
        """The swapped loader's batches until `limit` in all, across its epochs; then the job
        ends (`TrialEnd`), once the step of the last one is done."""
        for batch in batches:
            self._given += 1
            yield batch
            if self._given >= limit:
                close = getattr(batches, "close", None)
                if close is not None:
                    close()  # the last batch's step recorded
                raise TrialEnd


def rerun_record(command: Sequence[str], rank: Any) -> dict[str, Any]:
    """What running the job again needs (`probe tune`): its command, folder and interpreter,
    the cores it was held to and its visible GPUs, and under torchrun its ranks per node and
    nodes (`rank` this process's `Rank`, None without torchrun)."""
    try:  # under torchrun the launcher's, which started every rank
        cores = sorted(os.sched_getaffinity(os.getppid() if rank is not None else 0))
    except OSError:
        cores = sorted(os.sched_getaffinity(0))
    return {
        "argv": list(command),
        "cwd": os.getcwd(),
        "python": sys.executable,
        "cores": cores,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nproc_per_node": None if rank is None else rank.local_world_size,
        "nnodes": None if rank is None else max(1, rank.world_size // rank.local_world_size),
    }


def _site() -> tuple[str, int] | None:
    """(file name, line) where the script iterates the loader being started."""
    from probe.measure.described import loop_site

    site = loop_site(None)
    if "file" not in site:
        return None
    return Path(str(site["file"])).name, int(site["line"])


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
            _run(script)
    except TrialEnd:
        code, reason = 0, None
    # Ended within each `except`: the error's frames still hold the script's loaders there, so
    # that none is collected first and read completed (a loader dropped earlier was).
    except SystemExit as exit_:
        code, reason = _exit_code(exit_.code), f"the script exited with code {exit_.code}"
        _end_runs(watching, code, reason)
    except KeyboardInterrupt:
        code, reason = 130, "interrupted (Ctrl-C)"
        _end_runs(watching, code, reason)
    except BaseException as error:
        traceback.print_exc()
        code, reason = 1, f"the script failed: {type(error).__name__}: {error}".splitlines()[0]
        _end_runs(watching, code, reason)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        if saved_db is None:
            os.environ.pop("FEEDSCOPE_DB", None)
        else:
            os.environ["FEEDSCOPE_DB"] = saved_db
    _end_runs(watching, code, reason)
    return code


def _end_runs(watching: Watching, code: int, reason: str | None) -> None:
    """Ends the runs of the loaders still alive: completed where the script exited 0, else
    interrupted with `reason` (a run already ended keeps its end)."""
    for ref in watching.watched:
        watched = ref()
        if watched is None:  # collected: its run ended then
            continue
        if code == 0:
            watched.close(RunStatus.COMPLETED)
        else:
            watched.close(RunStatus.INTERRUPTED, reason)


def _run(script: Script) -> None:
    """Runs the script as `python` would: as `__main__`, its folder first on `sys.path`."""
    if script.path is not None:
        sys.argv = [str(script.path), *script.args]
        sys.path.insert(0, str(script.path.resolve().parent))
        runpy.run_path(str(script.path), run_name="__main__")
    else:
        sys.argv = [str(script.module), *script.args]
        sys.path.insert(0, "")
        runpy.run_module(str(script.module), run_name="__main__", alter_sys=True)


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
