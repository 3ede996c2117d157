"""A synthetic dataset of natural-looking JPEGs, and the built-in default one.

Decoding cost depends on what is in a JPEG: random noise compresses badly and decodes slowly,
flat colour decodes fast. These images sit in between, like photos: smooth backgrounds, objects
with soft edges, textured surfaces and mild sensor noise; 300-640 px a side, quality 90, about
60 KB on average (ImageNet's photos average about 110 KB at a similar size), or of the width and
height asked for (a camera's 1600-2000 x 1200-1500 px come to about 0.7 MB each, and decode
about ten times as slowly). Each class has its own hue, so the labels mean something. Output is
deterministic for a seed.
"""

from __future__ import annotations

import colorsys
import contextlib
import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

from pipelines.errors import InputError
from pipelines.host import available_cpus

GENERATOR_VERSION = 1
JPEG_QUALITY = 90
MIN_SIDE, MAX_SIDE = 16, 8192  # pixels a side a generated image may have
MANIFEST = "feedscope-sample.json"


@dataclass(frozen=True)
class SampleParams:
    """What to generate: `count` images spread over `classes` class folders; each image's
    width and height drawn from `width` and `height` (inclusive ranges of pixels), or, where
    they are None, the built-in shapes (400-640 px on the long side, three in four landscape)."""

    count: int = 1000
    classes: int = 8
    seed: int = 0
    width: tuple[int, int] | None = None
    height: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.count < 1:
            raise InputError(f"image count must be >= 1 (got {self.count})")
        if not 1 <= self.classes <= self.count:
            raise InputError(f"classes must be within 1..count ({self.count}) (got {self.classes})")
        if self.seed < 0:
            raise InputError(f"seed must be >= 0 (got {self.seed})")
        if (self.width is None) != (self.height is None):
            raise InputError("give both a width and a height range, or neither")
        for name, span in (("width", self.width), ("height", self.height)):
            if span is not None and not MIN_SIDE <= span[0] <= span[1] <= MAX_SIDE:
                raise InputError(
                    f"{name} must be a range of pixels within {MIN_SIDE}..{MAX_SIDE}, its low end "
                    f"first (got {span[0]}-{span[1]})"
                )


DEFAULT_SAMPLE = SampleParams()


@dataclass(frozen=True)
class SampleSummary:
    """What was written."""

    root: Path
    count: int
    classes: int
    total_bytes: int

    @property
    def mean_kb(self) -> float:
        return self.total_bytes / self.count / 1000


def make_sample_dataset(
    root: Path | str,
    params: SampleParams = DEFAULT_SAMPLE,
    *,
    progress: Callable[[int], None] | None = None,
    processes: int | None = None,
) -> SampleSummary:
    """Writes `params.count` JPEGs into `root/class_XX/img_XXXXXX.jpg`.

    The images are rendered in a scratch folder beside `root` and moved in place at the end, so
    an interrupted run leaves no half dataset behind.

    Args:
        root: a folder that does not exist yet or is empty.
        params: how many images and classes, and the seed.
        progress: called with the number of images finished since the last call.
        processes: worker processes (default: the CPUs available, at most 8).

    Raises:
        InputError: `root` is a file or a folder that is not empty.
    """
    root = Path(root).expanduser().absolute()
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise InputError(f"will not write into {root}: it exists and is not an empty folder")
    root.parent.mkdir(parents=True, exist_ok=True)
    scratch = root.parent / f".{root.name}.partial-{os.getpid()}"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        for label in range(params.classes):
            (scratch / _class_name(label)).mkdir(parents=True)
        total_bytes = 0
        for size in _render_all(scratch, params, processes):
            total_bytes += size
            if progress is not None:
                progress(1)
        chosen = {key: value for key, value in asdict(params).items() if value is not None}
        manifest = {**chosen, "generator_version": GENERATOR_VERSION}
        (scratch / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        if root.exists():
            root.rmdir()  # empty, checked above; os.replace needs the name free
        os.replace(scratch, root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return SampleSummary(root, params.count, params.classes, total_bytes)


def default_sample_dir(cache_dir: Path | None = None) -> Path:
    """Where the built-in sample dataset lives: the user's cache folder."""
    if cache_dir is None:
        import platformdirs

        cache_dir = Path(platformdirs.user_cache_dir("feedscope"))
    p = DEFAULT_SAMPLE
    return cache_dir / f"sample-v{GENERATOR_VERSION}-{p.count}x{p.classes}-seed{p.seed}"


def default_dataset_ready(cache_dir: Path | None = None) -> bool:
    """Whether the built-in sample dataset has been generated already."""
    return (default_sample_dir(cache_dir) / MANIFEST).exists()


def ensure_default_dataset(
    *, cache_dir: Path | None = None, progress: Callable[[int], None] | None = None
) -> Path:
    """Returns the built-in sample dataset, generating it first if it is not there yet.

    Several processes may ask at once (one per GPU); a lock makes one of them generate it.

    Args:
        cache_dir: the cache folder (default: the user's cache folder for feedscope).
        progress: as for `make_sample_dataset`, used only if the dataset is generated.
    """
    root = default_sample_dir(cache_dir)
    if default_dataset_ready(cache_dir):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(root.parent / f".{root.name}.lock"):
        if not default_dataset_ready(cache_dir):
            shutil.rmtree(root, ignore_errors=True)  # left by an older, broken run
            make_sample_dataset(root, DEFAULT_SAMPLE, progress=progress)
    return root


def render_image(
    seed: int,
    index: int,
    label: int,
    classes: int,
    size: tuple[tuple[int, int], tuple[int, int]] | None = None,
) -> bytes:
    """One natural-looking JPEG, determined by (seed, index); its hues follow its label; its
    width and height drawn from `size` (two inclusive ranges), else the built-in shapes."""
    rng = np.random.default_rng([seed, index])
    long_side = int(rng.integers(400, 641))
    short_side = int(max(300, long_side * rng.uniform(0.62, 0.9)))
    width, height = (long_side, short_side) if rng.random() < 0.75 else (short_side, long_side)
    if size is not None:
        width, height = (int(rng.integers(low, high + 1)) for low, high in size)
    hue = label / classes

    def color(
        saturation: tuple[float, float] = (0.25, 0.9),
        value: tuple[float, float] = (0.25, 0.95),
        hue_spread: float = 0.08,
    ) -> np.ndarray:
        rgb = colorsys.hsv_to_rgb(
            (hue + rng.normal(0, hue_spread)) % 1, rng.uniform(*saturation), rng.uniform(*value)
        )
        return np.array(rgb, np.float32)

    # Background: a sky-to-ground blend bent by a smooth field, with colour blotches and texture.
    ramp = np.linspace(0, 1, height, dtype=np.float32)[:, None]
    blend = np.clip(ramp + 0.3 * _upsample(rng.standard_normal((3, 3)), width, height), 0, 1)
    sky = color((0.1, 0.5), (0.5, 0.95), 0.25)
    ground = color((0.2, 0.7), (0.2, 0.7), 0.25)
    canvas = sky * (1 - blend[..., None]) + ground * blend[..., None]
    blotches = [_upsample(rng.standard_normal((4, 5)), width, height) for _ in range(3)]
    canvas += 0.08 * np.stack(blotches, axis=-1)
    coarse = _fractal(rng, width, height, octaves=6, base_cells=3, persistence=0.6)
    fine = _fractal(rng, width, height, octaves=2, base_cells=width // 8, persistence=0.7)
    canvas *= (1 + 0.12 * coarse + (0.04 + 0.2 * blend) * fine)[..., None]

    # Objects: a few large and many small soft-edged shapes, lit from above, some textured.
    large = int(rng.integers(4, 10))
    for number in range(large + int(rng.integers(10, 40))):
        scale = (0.06, 0.3) if number < large else (0.01, 0.05)
        _draw_shape(rng, canvas, fine, color(), rng.uniform(*scale) * min(width, height))

    canvas += rng.normal(0, 0.024, canvas.shape).astype(np.float32)  # sensor noise
    image = Image.fromarray(np.clip(canvas * 255 + 0.5, 0, 255).astype(np.uint8))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue()


def _draw_shape(
    rng: np.random.Generator,
    canvas: np.ndarray,
    texture: np.ndarray,
    fill: np.ndarray,
    radius: float,
) -> None:
    height, width = canvas.shape[:2]
    cx, cy = rng.uniform(0, width), rng.uniform(0, height)
    x0, y0 = int(max(0, cx - 1.4 * radius)), int(max(0, cy - 1.4 * radius))
    x1, y1 = int(min(width, cx + 1.4 * radius)), int(min(height, cy + 1.4 * radius))
    if x1 - x0 < 4 or y1 - y0 < 4:
        return
    mask = Image.new("L", (x1 - x0, y1 - y0), 0)
    draw = ImageDraw.Draw(mask)
    ox, oy = cx - x0, cy - y0
    kind = rng.integers(0, 3)
    if kind == 0:
        ry0, ry1 = radius * rng.uniform(0.4, 1.0), radius * rng.uniform(0.4, 1.0)
        draw.ellipse([ox - radius, oy - ry0, ox + radius, oy + ry1], fill=255)
    elif kind == 1:
        corners = int(rng.integers(3, 9))
        angles = np.sort(rng.uniform(0, 2 * np.pi, corners))
        radii = radius * rng.uniform(0.5, 1.3, corners)
        points = [
            (ox + r * np.cos(a), oy + r * np.sin(a)) for r, a in zip(radii, angles, strict=True)
        ]
        draw.polygon(points, fill=255)
    else:
        right, top = radius * rng.uniform(0.3, 1), radius * rng.uniform(0.3, 1)
        draw.rectangle([ox - radius, oy - top, ox + right, oy + radius], fill=255)
    soft = mask.filter(ImageFilter.GaussianBlur(rng.uniform(0.5, 2.0)))
    alpha = np.asarray(soft, np.float32)[..., None] / 255
    light = np.linspace(1.15, 0.8, y1 - y0, dtype=np.float32)[:, None, None]
    surface = 1 + rng.uniform(0, 0.8) * texture[y0:y1, x0:x1, None]
    region = canvas[y0:y1, x0:x1]
    canvas[y0:y1, x0:x1] = region * (1 - alpha) + fill * light * surface * alpha


def _upsample(small: np.ndarray, width: int, height: int) -> np.ndarray:
    field = Image.fromarray(small.astype(np.float32), mode="F")
    return np.asarray(field.resize((width, height), Image.Resampling.BICUBIC))


def _fractal(
    rng: np.random.Generator,
    width: int,
    height: int,
    *,
    octaves: int,
    base_cells: int,
    persistence: float,
) -> np.ndarray:
    """Smooth noise summed over octaves (value noise): roughly zero mean, unit-ish amplitude."""
    total = np.zeros((height, width), np.float32)
    amplitude, norm = 1.0, 0.0
    for octave in range(octaves):
        cells = base_cells * 2**octave
        grid = rng.standard_normal((max(2, cells * height // width + 1), cells + 1))
        total += amplitude * _upsample(grid, width, height)
        norm += amplitude
        amplitude *= persistence
    return total / norm


def _class_name(label: int) -> str:
    return f"class_{label:02d}"


def _write_one(task: tuple[Path, SampleParams, int]) -> int:
    root, params, index = task
    label = index % params.classes
    size = None if params.width is None or params.height is None else (params.width, params.height)
    data = render_image(params.seed, index, label, params.classes, size)
    (root / _class_name(label) / f"img_{index:06d}.jpg").write_bytes(data)
    return len(data)


def _render_all(root: Path, params: SampleParams, processes: int | None) -> Iterator[int]:
    tasks = [(root, params, index) for index in range(params.count)]
    if processes is None:
        processes = min(8, available_cpus())
    if processes <= 1 or params.count < 16:
        yield from map(_write_one, tasks)
        return
    with ProcessPoolExecutor(max_workers=processes) as pool:
        yield from pool.map(_write_one, tasks, chunksize=8)


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    import fcntl

    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
