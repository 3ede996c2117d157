"""What a watched iterable is, as far as it can be read without changing it: its kind (a torch
DataLoader, a DALI iterator, anything else), its settings, the image files it reads, and what its
batches hold (how many samples, the images' size).

The files are what `probe doctor --like RUN` measures the other pipelines on: a dataset that
names them (torchvision's `ImageFolder` and `DatasetFolder` by their `root` and `samples`, a
dataset holding a list of paths as `samples`, `imgs` or `files`, or a list of paths itself; a
`Subset` of any of these), or a DALI pipeline's file reader (`fn.readers.file`, by its
`file_root`, `files` or `file_list`), gives the folder they share, and how many it reads. Any
other dataset, or DALI source (TFRecord, webdataset, external_source), is recorded as not known,
with its type or the reader's name, and the doctor asks for `--data`.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from pipelines import DaliOptions
from probe.measure.recipe import recipe_of

# A dataset's attributes that may list its files: torchvision's DatasetFolder, then lists.
_FILE_LISTS = ("samples", "imgs", "files")
# DALI's file reader, as `fn.readers.file` (or `ops.readers.File`), and its old names
# `fn.file_reader` and `ops.FileReader`, lower-cased
_FILE_READERS = ("readers.file", "file_reader", "filereader")
NOT_KNOWN = "not known"  # the words a data folder that could not be read ends with


def describe(iterable: Any) -> tuple[str, dict[str, Any]]:
    """The pipeline kind ("torch", "dali" or "custom") and what can be read of its settings."""
    module = type(iterable).__module__
    if module.startswith("torch.utils.data"):
        workers = int(getattr(iterable, "num_workers", 0))
        return "torch", {
            **data_of(getattr(iterable, "dataset", None)),
            "recipe": {**recipe_of(iterable), **loop_site(iterable)},
            "batch_size": getattr(iterable, "batch_size", None),
            "dataloader": {
                "num_workers": workers,
                "pin_memory": bool(getattr(iterable, "pin_memory", False)),
                "prefetch_factor": getattr(iterable, "prefetch_factor", None),
                "persistent_workers": bool(getattr(iterable, "persistent_workers", False)),
                "output_dtype": None,
            },
            "dali": {},
        }
    if module.startswith("nvidia.dali"):
        pipes = getattr(iterable, "_pipes", None) or [None]
        decoder, load = dali_decoder(pipes[0])
        return "dali", {
            **dali_files(pipes[0]),
            "batch_size": getattr(iterable, "batch_size", None),
            "dataloader": {},
            "dali": {"num_threads": getattr(pipes[0], "num_threads", None), "decoder": decoder,
                     "hw_decoder_load": load},
        }  # fmt: skip
    return "custom", {
        "data_dir": f"{type_name(iterable)} ({NOT_KNOWN})", "batch_size": None,
        "dataloader": {}, "dali": {},
    }  # fmt: skip


# Frames that are not the user's loop: feedscope's own, the loaders', the interpreter's
_OURS = str(Path(__file__).resolve().parents[1])
_NOT_THE_LOOP = tuple(f"{os.sep}{name}{os.sep}" for name in ("torch", "nvidia", "lightning"))
# installed packages' (the loaders, tqdm) and the standard library's
_LIBRARIES = tuple(
    {str(Path(path).resolve()) for key, path in sysconfig.get_paths().items()
     if key in ("stdlib", "platstdlib", "purelib", "platlib")}
)  # fmt: skip


def shard_of(iterable: Any) -> dict[str, int | None]:
    """What one epoch of a loader reads, as it says before it starts: `batches_per_epoch`, its
    length, and `images`, its batch sampler's sampler's length (a DistributedSampler's: the
    rank's shard), as a probe's lanes record them; None where it does not say (an iterable
    dataset, a DALI iterator without a reader's size). Ranks given unequal shards are told
    apart by these."""
    batches = images = None
    with suppress(Exception):  # a length it cannot give is no length
        batches = len(iterable)
    sampler = getattr(getattr(iterable, "batch_sampler", None), "sampler", None)
    if sampler is not None:
        with suppress(Exception):
            images = len(sampler)
    return {"batches_per_epoch": batches, "images": images}


def loop_site(iterable: Any) -> dict[str, Any]:
    """Where the user's code iterates `iterable`: its file and the line of its loop (the first
    frame out of feedscope and the loaders), and the name the loader has where it is made (the
    outermost of the user's frames that holds it: `val_loader` in `main`, not `loader` in the
    function it is passed to); what cannot be read is left out."""
    try:
        site: dict[str, Any] = {}
        frame: Any = sys._getframe(1)
        while frame is not None:
            if not _not_the_loop(frame.f_code.co_filename):
                if not site:
                    site = {"file": frame.f_code.co_filename, "line": frame.f_lineno}
                names = [k for k, v in frame.f_locals.items() if v is iterable and k != "self"]
                site["variable"] = names[0] if names else site.get("variable")
            frame = frame.f_back
        return site
    except Exception:  # never break training
        return {}


def _not_the_loop(filename: str) -> bool:
    return (
        filename.startswith((_OURS, "<", *_LIBRARIES))
        or any(part in filename for part in _NOT_THE_LOOP)
        or f"{os.sep}site-packages{os.sep}" in filename
    )


def dali_decoder(pipe: Any) -> tuple[str | None, float | None]:
    """A built DALI pipeline's image decoder: its device ("mixed" or "cpu") and, mixed, the
    share of JPEGs it sends to the hardware decoder (DALI's default 0.65 where not set); (None,
    None) where it has no decoder that can be read. Read from the operators' specs as DALI
    prints them: a DALI that prints them otherwise gives None, and the advice says less."""
    for op in getattr(pipe, "_ops", None) or ():
        try:
            spec = repr(op.spec)
        except Exception:  # never break training: a DALI of another make
            return None, None
        if "_module: nvidia.dali.fn.decoders" not in spec:
            continue
        device = re.search(r"^\s*device: (\w+)", spec, re.MULTILINE)
        if device is None:
            return None, None
        load = re.search(r"^\s*hw_decoder_load: ([\d.]+)", spec, re.MULTILINE)
        if device.group(1) != "mixed":
            return device.group(1), None
        return "mixed", float(load.group(1)) if load else DaliOptions.hw_decoder_load
    return None, None


def dali_files(pipe: Any) -> dict[str, Any]:
    """Where a built DALI pipeline's images are, as `data_of` says a dataset's: its file reader's
    (`fn.readers.file`) `files` or `file_list` (each relative to `file_root` where given; the
    list's lines to the list's folder otherwise), or `file_root` alone, whose files DALI counted.
    Any other source (TFRecord, webdataset, external_source) is named, its files not known."""
    source = None  # the first operator that brings data in, by its name
    try:
        for op in getattr(pipe, "_ops", None) or ():
            given = _arguments(op)
            name = _dali_name(given)
            if name.lower() in _FILE_READERS:
                source = name
                return _reader_files(given, _epoch_size(pipe, op.name)) or _not_read(source)
            source = source or (name if _is_source(name) else None)
    except Exception:  # never break training: a DALI of another make
        pass
    return _not_read(source)


def _reader_files(given: dict[str, Any], counted: int | None) -> dict[str, Any] | None:
    """`_shared` of a file reader's arguments (`counted`: the files DALI found under its
    `file_root`); None where they name no folder."""
    root = str(given["file_root"]) if given.get("file_root") else None
    files, listed, base = given.get("files") or [], given.get("file_list"), root
    if isinstance(files, str):
        files = [files]
    if listed:  # "path label" lines (a path may hold spaces), relative to the list's folder
        with open(listed, encoding="utf-8") as lines:
            files = [line.rstrip().rsplit(maxsplit=1)[0] for line in lines if line.strip()]
        base = root or os.path.dirname(os.path.abspath(listed))
    paths = [os.path.join(base, os.fspath(f)) if base else os.fspath(f) for f in files]
    return _shared(paths, root, counted)


def _epoch_size(pipe: Any, reader: str) -> int | None:
    """How many files DALI's reader `reader` reads (on all shards), as DALI counted them; None
    where it does not say."""
    try:
        size = pipe.reader_meta(reader)["epoch_size"]
    except Exception:  # a DALI of another make, a reader not yet prepared
        return None
    return size if isinstance(size, int) and size > 0 else None


def _arguments(op: Any) -> dict[str, Any]:
    """A DALI operator's arguments as given: DALI's own dict of them (private), else read from
    its spec as DALI prints it ("    name: value" lines, lists as "[a, b, ]")."""
    given = getattr(getattr(op, "_op", None), "_init_args", None)
    if isinstance(given, dict) and "_module" in given:
        return given
    return {
        key: [item for item in value[1:-1].split(", ") if item] if value.startswith("[") else value
        for key, value in re.findall(r"^    (\w+): (.*)$", repr(op.spec), re.MULTILINE)
    }


def _dali_name(given: dict[str, Any]) -> str:
    """An operator's name as DALI's Python API spells it: "readers.file", "external_source"."""
    package = str(given.get("_module", "")).removeprefix("nvidia.dali.").partition(".")[2]
    return ".".join(part for part in (package, str(given.get("_display_name", ""))) if part)


def _is_source(name: str) -> bool:
    """Whether a DALI operator brings data into the pipeline: a reader, or an external source."""
    return "readers." in name or name.lower().replace("_", "") == "externalsource"


def _not_read(source: str | None) -> dict[str, Any]:
    """A DALI pipeline's files not known, with the source that reads them where it is known."""
    by = f"DALI's {source}" if source else "the DALI pipeline"
    return {"data_dir": f"(read by {by}: its files {NOT_KNOWN})", "data_files": None}


def data_of(dataset: Any) -> dict[str, Any]:
    """Where a dataset's images are: `data_dir`, the folder its files share (or its type and
    "not known"), and `data_files`, how many files it reads (None: not known)."""
    unknown = {"data_dir": f"{type_name(dataset)} (its files {NOT_KNOWN})", "data_files": None}
    try:
        root = getattr(_inner(dataset), "root", None)
        root = os.fspath(root) if isinstance(root, (str, os.PathLike)) else None
        return _shared(files_of(dataset), root) or unknown
    except (OSError, TypeError, ValueError):  # paths of mixed drives, odd items: not known
        return unknown


def _shared(
    files: Sequence[str], root: str | None, counted: int | None = None
) -> dict[str, Any] | None:
    """`data_dir`, the folder `files` and `root` share, and `data_files`, how many files: those
    listed, else `counted` for a `root` that is a folder; None where neither names one."""
    if files:
        folders = {os.path.abspath(folder) for folder in {os.path.dirname(f) for f in files}}
        shared = os.path.commonpath([*folders, *([os.path.abspath(root)] if root else [])])
        return {"data_dir": shared, "data_files": len(files)}
    if root is not None and os.path.isdir(root):
        return {"data_dir": os.path.abspath(root), "data_files": counted}
    return None


def files_known(data_dir: object) -> bool:
    """Whether a recorded `data_dir` is the folder of the files read, not the words saying they
    are not known (`probe doctor --like` measures on them)."""
    return isinstance(data_dir, str) and bool(data_dir) and not data_dir.endswith(f"{NOT_KNOWN})")


def files_of(dataset: Any) -> list[str]:
    """The image paths a dataset names, in its order (empty: it names none that can be read)."""
    inner, indices = _inner(dataset), getattr(dataset, "indices", None)
    listed: Any = inner if _paths(inner) else None
    for name in _FILE_LISTS:
        if listed is None:
            candidate = getattr(inner, name, None)
            listed = candidate if _paths(candidate) else None
    if listed is None:
        return []
    paths = [str(item[0] if isinstance(item, (tuple, list)) else item) for item in listed]
    if inner is not dataset and indices is not None:  # a Subset: the files it reads
        paths = [paths[i] for i in indices]
    return paths


def _inner(dataset: Any) -> Any:
    """The dataset a `Subset` reads from (the dataset itself otherwise)."""
    inner = getattr(dataset, "dataset", None)
    return inner if inner is not None and hasattr(dataset, "indices") else dataset


def _paths(value: Any) -> bool:
    """Whether `value` lists file paths (or (path, label) pairs), judged by its first item."""
    if not isinstance(value, Sequence) or isinstance(value, (str, bytes)) or not value:
        return False
    first = value[0]
    if isinstance(first, (tuple, list)) and first:
        first = first[0]
    return isinstance(first, (str, os.PathLike)) and os.path.isfile(first)


def batch_size(batch: Any) -> int:
    """How many samples a batch holds: the first dimension of its first tensor (tuples, lists
    and dicts are looked into, as DataLoader and DALI iterators yield them); 1 if none."""
    shape = _first_shape(batch)
    return int(shape[0]) if shape else 1


def image_size(batch: Any) -> int | None:
    """The side of a batch's square images (NCHW or NHWC, 1 to 4 channels), or None where its
    first tensor holds no square images."""
    shape = _first_shape(batch)
    if shape is None or len(shape) != 4:
        return None
    sides = shape[2:] if shape[1] <= 4 else shape[1:3]
    return int(sides[0]) if sides[0] == sides[1] else None


def _first_shape(batch: Any) -> tuple[int, ...] | None:
    for _ in range(4):
        shape = getattr(batch, "shape", None)
        if shape is not None and len(shape) > 0:
            return tuple(int(n) for n in shape)
        if isinstance(batch, dict) and batch:
            batch = next(iter(batch.values()))
        elif isinstance(batch, (list, tuple)) and batch:
            batch = batch[0]
        else:
            break
    return None


def type_name(value: object) -> str:
    return f"{type(value).__module__}.{type(value).__name__}"
