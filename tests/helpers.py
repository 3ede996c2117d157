"""Test helpers: images whose colour tells which file they came from; the probe command."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageFilter

# Solid-colour images whose colour encodes the file's index: any crop, resize or flip of them
# keeps the colour, so a batch tells exactly which files a pipeline read, whatever the backend.
CODE_STEP = 24  # grey levels between codes; JPEG moves a flat colour by a level or two
CODES_PER_CHANNEL = 10


def code_color(index: int) -> tuple[int, int, int]:
    """The RGB colour of file number `index` (up to 100 files)."""
    red, green = index % CODES_PER_CHANNEL, index // CODES_PER_CHANNEL
    return 12 + CODE_STEP * red, 12 + CODE_STEP * green, 128


def decode_codes(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]) -> list[int]:
    """File numbers of a batch of normalized float images of `code_color` files."""
    mean_t = torch.tensor(mean).view(1, 3, 1, 1) * 255
    std_t = torch.tensor(std).view(1, 3, 1, 1) * 255
    pixels = (images.float().cpu() * std_t + mean_t).mean(dim=(2, 3))
    red = ((pixels[:, 0] - 12) / CODE_STEP).round().long()
    green = ((pixels[:, 1] - 12) / CODE_STEP).round().long()
    return (green * CODES_PER_CHANNEL + red).tolist()


def write_jpeg(path: Path, pixels: np.ndarray, quality: int = 95) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, "JPEG", quality=quality)
    return path


def solid(color: tuple[int, int, int], height: int = 72, width: int = 96) -> np.ndarray:
    pixels: np.ndarray = np.broadcast_to(np.array(color, np.uint8), (height, width, 3)).copy()
    return pixels


# A dataset folder whose path holds markup, and a label that does: what a report or a page shows
# of them must stay text.
HOSTILE_FOLDER = ("<script>window.pwned=1<", "script>")
HOSTILE_LABEL = '<img src=x onerror="window.pwned=2">'


def probe_cli(
    *args: Any, timeout: float = 600, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m probe ARGS`, its output captured; `env` added to this process's."""
    return run_captured(
        [sys.executable, "-m", "probe", *args],
        timeout=timeout, env=None if env is None else {**os.environ, **env},
    )  # fmt: skip


STOP_GRACE_S = 3.0  # what a stopped command has to end on its own before it is killed


def run_captured(
    command: Sequence[Any],
    *,
    timeout: float = 600,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run(command, capture_output=True, text=True)`, except where the wait ends
    early: on a Ctrl-C (or the timeout, or pytest-timeout's) the command is stopped as a Ctrl-C
    stops it, killed with every process it started if it has not ended within STOP_GRACE_S,
    and the interrupt goes on to pytest. The command runs in a process group of its own, so
    nothing it started outlives the test: killed alone, `probe data make` left its pool's
    workers waiting forever, and a probe its lanes."""
    with subprocess.Popen(
        [str(part) for part in command], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=cwd, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            stop_group(process)
            raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def torchrun_watch(
    script: Path, db: Path, *args: Any, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`torchrun -m probe watch -- SCRIPT ARGS`, 2 gloo ranks on this machine (a free port),
    sampling at 5 Hz into `db`, run from the script's folder, this checkout first on the path;
    `env` added."""
    root = Path(__file__).resolve().parents[1]
    return run_captured(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
         "--master-port", free_port(), "-m", "probe", "watch", "--db", db, "--sample-hz", "5",
         "--", script, *args],
        timeout=120, cwd=script.parent,
        env={**os.environ, "PYTHONPATH": str(root), **(env or {})},
    )  # fmt: skip


def stop_group(process: subprocess.Popen[str]) -> None:
    """SIGINT to the process group `process` leads, then SIGKILL to what is left of it after
    STOP_GRACE_S (or at once, on a second Ctrl-C)."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=STOP_GRACE_S)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)


def free_port() -> int:
    """A TCP port no one listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium() -> tuple[str | None, str | None]:
    """Debian's Chromium for Playwright: its path, or why it cannot be had. With
    FEEDSCOPE_REQUIRE_BROWSER=1 (CI sets it) a missing browser is an error, not a skip."""
    import os
    import shutil

    path = shutil.which("chromium") or shutil.which("chromium-browser")
    missing = None
    if path is None:
        missing = "needs Debian's chromium package"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            missing = "needs playwright (the test extra)"
    if missing is not None and os.environ.get("FEEDSCOPE_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"the browser tests {missing}, and FEEDSCOPE_REQUIRE_BROWSER=1")
    return path, missing


# A test that compares measurements taken minutes apart on the 2-core machine (a prediction
# against a later run, a short point against long ones) runs again once where it fails: the
# shared machine's speed can move between two of its runs with no other process to show it
# (a 2-worker point read 22% low in two of three full CI runs, and never alone). A wrong model
# or rule fails both times; the rerun is in pytest's summary.
MOVED = pytest.mark.flaky(reruns=1)


def skip_on_a_busy_host(document: Mapping[str, Any]) -> None:
    """Skips a test of the answer an idle host gives, where the probe found its host busy: other
    processes' CPU or steal could have moved it, and the probe says so (a `host_busy` verdict,
    an unreliable lane, the other load as evidence, a session's busy points)."""
    diagnosis = document.get("diagnosis") or {}
    verdicts = [diagnosis["verdict"], *diagnosis.get("lanes", [])] if diagnosis else []
    busy = any(
        v["kind"] == "host_busy"
        or not v.get("reliable", True)
        or any(e["metric"] in ("host_other_cores", "steal_pct") for e in v["evidence"])
        for v in verdicts
    )
    if busy or document.get("host_busy"):
        pytest.skip("the probe found this host busy with other work: no idle host's answer")


def files_dataset(photos: Path, side: int) -> Any:
    """A dataset that names its files as torchvision's ImageFolder does, `samples` of (path,
    label) pairs (the JPEGs of `photos`' class folders), each item a blank image of `side`."""
    import torch
    from torch.utils.data import Dataset

    class Files(Dataset[torch.Tensor]):
        def __init__(self) -> None:
            self.samples = [(str(p), 0) for p in sorted(photos.glob("*/*.jpg"))]

        def __len__(self) -> int:
            return len(self.samples)

        def __getitem__(self, index: int) -> torch.Tensor:
            return torch.zeros(3, side, side)

    return Files()


def natural_image(width: int, height: int, seed: int) -> Image.Image:
    """Smooth gradients under a few soft-edged shapes: what a photo's pixels look like."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    base = np.stack(
        [
            128 + 100 * np.sin(x / width * np.pi * rng.uniform(0.5, 2) + rng.uniform(0, 3)),
            128 + 100 * np.cos(y / height * np.pi * rng.uniform(0.5, 2)),
            255 * (x + y) / (width + height),
        ],
        axis=-1,
    )
    image = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(image)
    for _ in range(6):
        left, top = int(rng.integers(0, width - 40)), int(rng.integers(0, height - 40))
        box = (left, top, left + int(rng.integers(20, 120)), top + int(rng.integers(20, 120)))
        color = tuple(int(c) for c in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=color)
    return image.filter(ImageFilter.GaussianBlur(1.5))


def data_loader(dataset: Any, batch_size: int, shuffle: bool, **options: Any) -> Any:
    """A DataLoader of no workers over `dataset`."""
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=shuffle, num_workers=0, **options
    )


def written_module(written: Any, path: Path) -> ModuleType:
    """A module `probe migrate` wrote (`probe.fix.dali.Written`), saved at `path` with
    its file list beside it where it has one, and imported."""
    from probe.fix.dali import files_name

    path.write_text(written.module)
    if written.files is not None:
        Path(files_name(str(path))).write_text(written.files)
    return imported(path)


def imported(path: Path) -> ModuleType:
    """The Python file at `path`, imported as a module of its name."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def photo_folder(root: Path, sizes: Sequence[tuple[int, int]], classes: int) -> Path:
    """JPEGs of `natural_image` in `classes` class folders (class0, ...), one of each size in
    each; seeds 10 a class apart."""
    for label in range(classes):
        (root / f"class{label}").mkdir()
        for n, (width, height) in enumerate(sizes):
            image = natural_image(width, height, seed=label * 10 + n)
            image.save(root / f"class{label}" / f"{n}.jpg", quality=90)
    return root


def outside_imports(text: str) -> set[str]:
    """The top-level packages a module's text imports, the standard library's left out."""
    imported = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    return imported - set(sys.stdlib_module_names)
