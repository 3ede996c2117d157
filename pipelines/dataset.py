"""Image discovery in a class-per-folder tree, the read order, and the shard split.

The layout is the one torchvision's ImageFolder and DALI's file reader expect:
`root/<class>/<...>/<image>`, with labels given by the sorted class folder names. Both backends
get the same explicit list of files, in the same order, and DALI's shard formula decides which
part of it a shard reads, so a DataLoader and a DALI pipeline of one shard read the same files.
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass, replace
from pathlib import Path

from pipelines.errors import InputError

# The extensions DALI's file reader accepts; Pillow decodes all of them too.
IMAGE_EXTENSIONS = frozenset(
    {".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".jp2"}
    | {".pnm", ".ppm", ".pgm", ".pbm"}
)


@dataclass(frozen=True)
class Dataset:
    """Image files with their labels, in the order they will be read."""

    root: Path
    classes: tuple[str, ...]  # label i is classes[i]
    files: tuple[str, ...]  # absolute paths
    labels: tuple[int, ...]
    # Links to folders not followed: each real folder is read once (a link back up the tree, or
    # to a folder read anyway, would loop or count its images again).
    skipped_links: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.files)


def discover(root: Path | str) -> Dataset:
    """Finds the images of a class-per-folder dataset, in sorted order.

    Classes are the sorted names of the folders directly under `root` (hidden ones excluded);
    images are searched recursively inside each class folder, as ImageFolder does, following
    links: to files anywhere, and to folders outside the dataset, each real folder once. A link to
    a folder inside the dataset (a loop, or another class's images again) is skipped and listed
    in `skipped_links`.

    Raises:
        InputError: the folder is missing, empty, unreadable, or holds no images in class folders.
    """
    root = Path(root).expanduser().absolute()
    if not root.exists():
        raise InputError(f"dataset folder not found: {root}")
    if not root.is_dir():
        raise InputError(f"dataset path is not a folder: {root}")
    try:
        entries = sorted(os.scandir(root), key=lambda entry: entry.name)
    except OSError as error:
        raise InputError(f"cannot read dataset folder {root}: {error.strerror}") from None
    if not entries:
        raise InputError(f"dataset folder is empty: {root}")

    classes = tuple(e.name for e in entries if e.is_dir() and not e.name.startswith("."))
    files: list[str] = []
    labels: list[int] = []
    skipped: list[str] = []
    seen: set[tuple[int, int]] = set()  # real folders read, by device and inode
    for label, name in enumerate(classes):
        for folder, names in sorted(_walk(str(root / name), os.path.realpath(root), seen, skipped)):
            for file_name in sorted(names):
                if _is_image(file_name):
                    files.append(os.path.join(folder, file_name))
                    labels.append(label)
    if not files:
        loose = sum(1 for e in entries if e.is_file() and _is_image(e.name))
        if loose:
            raise InputError(
                f"no class folders in {root}: expected {root}/<class>/<image>, "
                f"found {loose} image(s) directly in it"
            )
        extensions = ", ".join(sorted(IMAGE_EXTENSIONS))
        raise InputError(
            f"no images found in the class folders of {root} (looked for {extensions})"
        )
    return Dataset(
        root=root,
        classes=classes,
        files=tuple(files),
        labels=tuple(labels),
        skipped_links=tuple(sorted(skipped)),
    )


def _walk(
    top: str, root: str, seen: set[tuple[int, int]], skipped: list[str]
) -> list[tuple[str, list[str]]]:
    """The folders under `top` with their file names, each real folder once; links to folders
    inside `root` (a real path) are added to `skipped` instead of followed."""
    found: list[tuple[str, list[str]]] = []
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            info = os.stat(folder)
            entries = list(os.scandir(folder))
        except OSError:
            continue  # unreadable: os.walk skips such folders too
        key = (info.st_dev, info.st_ino)
        if key in seen:
            skipped.append(folder)
            continue
        seen.add(key)
        names = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                continue
            if not is_dir:
                names.append(entry.name)
            elif entry.is_symlink() and _inside(os.path.realpath(entry.path), root):
                skipped.append(entry.path)
            else:
                stack.append(entry.path)
        found.append((folder, names))
    return found


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def read_order(dataset: Dataset, *, shuffle: bool, seed: int) -> Dataset:
    """The dataset in the order every shard and both backends read it.

    With `shuffle`, one seeded permutation of all files, the same in every process, so that the
    shards stay disjoint; without it, the sorted order (where a shard holds whole classes).
    """
    if not shuffle:
        return dataset
    order = list(range(len(dataset)))
    random.Random(seed).shuffle(order)
    return replace(
        dataset,
        files=tuple(dataset.files[i] for i in order),
        labels=tuple(dataset.labels[i] for i in order),
    )


def shard_bounds(num_files: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """The [start, end) range of files that shard `shard_id` of `num_shards` reads.

    The formula of DALI's readers (`size * shard_id / shard_num`, in integers): shards are
    contiguous, disjoint, cover every file, and differ in size by at most one.
    """
    if not 0 <= shard_id < num_shards:
        raise InputError(f"shard_id {shard_id} is out of range for {num_shards} shard(s)")
    return num_files * shard_id // num_shards, num_files * (shard_id + 1) // num_shards


def shard(dataset: Dataset, shard_id: int, num_shards: int) -> Dataset:
    """The part of `dataset` (in read order) that one shard reads.

    Raises:
        InputError: the shard would hold no files (more shards than images).
    """
    start, end = shard_bounds(len(dataset), shard_id, num_shards)
    if start == end:
        raise InputError(
            f"shard {shard_id} of {num_shards} would be empty: "
            f"the dataset has only {len(dataset)} image(s)"
        )
    return replace(dataset, files=dataset.files[start:end], labels=dataset.labels[start:end])


def _is_image(file_name: str) -> bool:
    return not file_name.startswith(".") and Path(file_name).suffix.lower() in IMAGE_EXTENSIONS
