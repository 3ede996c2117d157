"""The DALI loader written for a user in place of a watched torch DataLoader (`probe migrate`).

`dali_module(recipe, setting, origin)` turns a DataLoader's recipe (`probe.measure.recipe`) into
the text of a Python module that imports torch and DALI only: the dataset's files and labels,
listed as torchvision lists them, read by `fn.readers.file` sharded by rank; the transforms as
DALI operators, the crop decoded alone where the chain starts with RandomResizedCrop, as DALI's
ResNet-50 example does; batches of (images, labels) as the DataLoader gave them. What has no
exact counterpart in DALI is refused by name (`Unmovable`), and nothing partial is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.errors import InputError
from probe.fix import dali_text as template
from probe.measure.recipe import refusals

# A list dataset's samples beyond this many go to a sibling file, not into the module.
MAX_WRITTEN_SAMPLES = 20_000
# torchvision's IMG_EXTENSIONS: what ImageFolder reads when it was given no extensions.
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_INTERPOLATIONS = {
    "bilinear": "types.INTERP_LINEAR",
    "bicubic": "types.INTERP_CUBIC",
    "nearest": "types.INTERP_NN",
    2: "types.INTERP_LINEAR",  # PIL's constants, which old torchvision versions kept
    3: "types.INTERP_CUBIC",
    0: "types.INTERP_NN",
}
_NO_COUNTERPART = "DALI's written loader has no exact counterpart"


class Unmovable(InputError):
    """What in a DataLoader's recipe cannot be written (for DALI, or as a DataLoader): one line
    per thing."""

    def __init__(
        self, lines: list[str], title: str = "this loader cannot be written for DALI"
    ) -> None:
        self.lines = lines
        super().__init__(f"{title}:\n" + "\n".join(f"  {line}" for line in lines))


@dataclass(frozen=True)
class DaliSetting:
    """The DALI setting found for the host, and where it was found.

    Attributes:
        num_threads: DALI's CPU threads per pipeline.
        hw_decoder_load: the share of JPEGs given to the hardware decoder (mixed decoder only).
        decoder: "mixed" (nvJPEG on the GPU) or "cpu" (libjpeg-turbo).
        source: a sentence naming where it was found, e.g. "doctor session ...: 2,861 images/s".
        predicted_images_per_s: what the setting gave where it was measured (None: not
            measured).
    """

    num_threads: int
    hw_decoder_load: float
    decoder: str = "mixed"
    source: str = ""
    predicted_images_per_s: float | None = None

    def describe(self) -> str:
        """The setting in a few words: "8 DALI threads, mixed decoder (hw_decoder_load 0.65)"."""
        threads = f"{self.num_threads} DALI thread{'s' if self.num_threads != 1 else ''}"
        if self.decoder == "mixed":
            return f"{threads}, mixed decoder (hw_decoder_load {self.hw_decoder_load:g})"
        return f"{threads}, {self.decoder} decoder"


@dataclass(frozen=True)
class Written:
    """A written module's text, its sibling file list's text (None: the files are in it), and
    the steps it keeps as the job's own (its `loader(original=...)` takes them)."""

    module: str
    files: str | None = None
    keeps: tuple[str, ...] = ()


def files_name(module_path: str) -> str:
    """Where the sibling file list of a module written to `module_path` goes."""
    stem = module_path[:-3] if module_path.endswith(".py") else module_path
    return stem + ".files.txt"


def dali_module(recipe: Mapping[str, Any], setting: DaliSetting, origin: str) -> Written:
    """The text of a module giving the DataLoader's batches from DALI.

    Args:
        recipe: what `probe.measure.recipe.recipe_of` read of the DataLoader.
        setting: DALI's threads and decoder found for the host, and where they were found.
        origin: what the DataLoader was, e.g. "run 20261127-053256-1c2f of main.py (training
            loader)".

    Returns:
        The module's text, and the text of its sibling file list when the dataset's samples are
        too many to write into it.

    Raises:
        Unmovable: with one line per thing that DALI cannot do as the DataLoader did.
    """
    refused: list[str] = []
    dataset = dataset_lines(recipe)
    graph = _Graph()
    _map_transforms(recipe, graph, refused)
    refused += refusals(recipe, "DALI's written loader")
    if setting.decoder not in ("mixed", "cpu"):
        refused.append(f"decoder {setting.decoder!r}: DALI's image decoder is mixed or cpu")
    if refused:
        raise Unmovable(refused)
    files = None
    if dataset.files is not None:
        files = "".join(f"{label}\t{path}\n" for path, label in dataset.files)
    shuffle = bool(recipe.get("shuffle"))
    sampler = recipe.get("sampler") or {}
    sharded = isinstance(sampler, Mapping) and sampler.get("name") == "DistributedSampler"
    text = template.TEMPLATE.format(
        origin=origin,
        dataset=dataset.text.rstrip("\n"),
        batch_size=int(recipe["batch_size"]),
        shuffle=shuffle,
        drop_last=bool(recipe.get("drop_last")),
        shuffle_seed=int(sampler.get("seed", 0)) if isinstance(sampler, Mapping) else 0,
        source=setting.source or "the default setting",
        num_threads=setting.num_threads,
        hw_decoder_load=setting.hw_decoder_load,
        decoder=setting.decoder,
        shard=sharded,
        shard_comment=(
            "its rank's shard under torch.distributed, as the DistributedSampler read"
            if sharded
            else "every rank reads every file, as the DataLoader did (it had no DistributedSampler)"
        ),
        graph="\n".join(f"    {line}" for line in graph.body()),
        steps=", ".join(str(step.get("name")) for step in recipe.get("transform") or []),
    )
    return Written(text, files)


@dataclass
class _Dataset:
    text: str
    files: list[tuple[str, int]] | None = None  # written to the sibling file


def dataset_lines(recipe: Mapping[str, Any]) -> _Dataset:
    """The module's dataset constants and its `samples()` function (none where its dataset
    names no files: `probe.measure.recipe.refusals` says so)."""
    dataset = recipe.get("dataset") or {}
    subset = recipe.get("subset")
    subset_text = (
        "SUBSET = None  # a torch Subset's indices: none\n"
        if subset is None
        else f"SUBSET = {[int(i) for i in subset]!r}  # the torch Subset's indices\n"
    )
    kind = dataset.get("kind")
    if kind == "folder":
        extensions = dataset.get("extensions")
        extensions_comment = "" if extensions else "  # torchvision's IMG_EXTENSIONS"
        return _Dataset(
            f"# {dataset.get('type')}: listed again as torchvision lists it (make_dataset)\n"
            f"ROOT = {dataset['root']!r}\n"
            f"CLASS_TO_IDX = {_dict_text(dataset['class_to_idx'])}\n"
            f"EXTENSIONS = {tuple(extensions or IMG_EXTENSIONS)!r}{extensions_comment}\n"
            f"COUNT = {dataset.get('count')!r}  # the files the job's dataset held\n"
            + subset_text
            + template.FOLDER_SAMPLES
        )
    if kind == "list":
        samples = [(str(path), int(label)) for path, label in dataset["samples"]]
        if len(samples) > MAX_WRITTEN_SAMPLES:
            return _Dataset(
                f"# {dataset.get('type')}'s {len(samples):,} (path, label) samples, in the\n"
                "# file beside this one: a label, a tab and a path per line\n"
                'SAMPLES_FILE = os.path.splitext(__file__)[0] + ".files.txt"\n'
                + subset_text
                + template.FILE_SAMPLES,
                files=samples,
            )
        listed = "".join(f"    ({path!r}, {label}),\n" for path, label in samples)
        return _Dataset(
            f"# {dataset.get('type')}'s (path, label) samples\n"
            f"SAMPLES: list[tuple[str, int]] = [\n{listed}]\n" + subset_text + template.LIST_SAMPLES
        )
    return _Dataset("")


def _dict_text(mapping: Mapping[str, Any]) -> str:
    items = [f"{key!r}: {value!r}" for key, value in mapping.items()]
    one_line = "{" + ", ".join(items) + "}"
    if len(one_line) <= 80:
        return one_line
    return "{\n" + "".join(f"    {item},\n" for item in items) + "}"


@dataclass
class _Graph:
    """The DALI operators after the reader, built step by step from the transforms."""

    random_crop: str | None = None  # the decoder's random crop arguments
    lines: list[str] = field(default_factory=list)  # on the decoded HWC uint8 images
    crop: str | None = None  # a crop not yet written: crop_mirror_normalize's arguments
    mirror_probability: float | None = None
    tensor: str | None = None  # "float" (scaled to 0..1) or "uint8"; None: still an image
    mean: list[float] | None = None
    std: list[float] | None = None

    def add(self, line: str) -> None:
        self.write_crop()
        self.lines.append(line)

    def write_crop(self) -> None:
        """Writes the pending crop: a later step needs it done first."""
        if self.crop is not None:
            self.lines.append(f"images = fn.crop(images, {self.crop})")
            self.crop = None

    def body(self) -> list[str]:
        if self.random_crop is not None:
            decode = [
                "# the decoder decodes only the crop (RandomResizedCrop's area and ratio), as",
                "# DALI's ResNet-50 example does; the mixed one on nvJPEG and the hardware decoder",
                "images = fn.decoders.image_random_crop(encoded, device=decoder, "
                f"output_type=types.RGB, {self.random_crop}, **decoder_options)",
            ]
        else:
            decode = [
                "images = fn.decoders.image(encoded, device=decoder, output_type=types.RGB, "
                "**decoder_options)"
            ]
        arguments = ["images"]
        if self.tensor == "uint8":
            arguments.append("dtype=types.UINT8")  # PILToTensor: uint8, not scaled
        else:
            # ToTensor's /255 and Normalize folded into one: (x - 255 * mean) / (255 * std)
            mean = [255 * m for m in self.mean or [0.0]]
            std = [255 * s for s in self.std or [1.0]]
            arguments += ["dtype=types.FLOAT", f"mean={floats(mean)}", f"std={floats(std)}"]
        arguments.append('output_layout="CHW"')
        if self.crop is not None:
            arguments.append(self.crop)
        if self.mirror_probability is not None:
            arguments.append(f"mirror=fn.random.coin_flip(probability={self.mirror_probability!r})")
        statements = [
            *decode,
            *self.lines,
            'if on_gpu and decoder == "cpu":',
            "    images = images.gpu()  # after the CPU's resize: the smallest copy",
            f"images = fn.crop_mirror_normalize({', '.join(arguments)})",
        ]
        return [line for statement in statements for line in _wrapped(statement)]


def _wrapped(statement: str, width: int = 96) -> list[str]:
    """A call too long for one line, as one argument a line, as ruff's formatter writes it."""
    opening = statement.find("(")
    if len(statement) <= width or opening < 0 or not statement.endswith(")"):
        return [statement]
    arguments, depth, start = [], 0, opening + 1
    for index, character in enumerate(statement[opening + 1 : -1], opening + 1):
        depth += character in "([{"
        depth -= character in ")]}"
        if character == "," and depth == 0:
            arguments.append(statement[start:index].strip())
            start = index + 1
    arguments.append(statement[start:-1].strip())
    return [statement[: opening + 1], *(f"    {argument}," for argument in arguments), ")"]


def _map_transforms(recipe: Mapping[str, Any], graph: _Graph, refused: list[str]) -> None:
    """Adds the DALI operators for the transforms to `graph`, or a line to `refused` for each
    one that DALI cannot do as torchvision does."""
    transforms = recipe.get("transform")
    if transforms is None:  # `refusals` says so
        return
    if recipe.get("loader_text") and not any(step.get("callable") for step in transforms):
        refused.append(str(recipe["loader_text"]))
    for index, step in enumerate(transforms):
        line = _map_step(step, index, graph)
        if line is not None:
            refused.append(line)
    if graph.tensor is None and transforms:
        refused.append(
            "the transform ends on a PIL image, not a tensor (no ToTensor or PILToTensor)"
        )


def _map_step(step: Mapping[str, Any], index: int, graph: _Graph) -> str | None:  # noqa: PLR0911, PLR0912
    """Adds one transform to the graph; the line refusing it when DALI cannot do it."""
    name = str(step.get("name"))
    fields: Mapping[str, Any] = step.get("fields") or {}
    shown = described(step)
    if step.get("callable"):
        return f"{name}: a function, which DALI cannot run: {_NO_COUNTERPART}"
    if graph.mean is not None:
        return f"{shown}: comes after Normalize, an order DALI's loader cannot follow"
    on_image = graph.tensor is None
    if name in ("RandomResizedCrop", "Resize"):
        return _resize(name, fields, shown, graph, first=index == 0)
    if name in ("CenterCrop", "RandomCrop"):
        height, width = size_of(fields.get("size"))
        if height is None or width is None:
            return f"{shown}: its size cannot be read"
        if name == "RandomCrop" and (fields.get("padding") or fields.get("pad_if_needed")):
            return f"{shown}: padding {_NO_COUNTERPART}"
        position = (
            ""
            if name == "CenterCrop"
            else ", crop_pos_x=fn.random.uniform(range=[0.0, 1.0]), "
            "crop_pos_y=fn.random.uniform(range=[0.0, 1.0])"
        )
        graph.write_crop()
        # torchvision pads a crop larger than the image with zeros, as "pad" does
        graph.crop = f'crop=[{height}, {width}]{position}, out_of_bounds_policy="pad"'
        return None
    if name == "RandomHorizontalFlip":
        p = float(fields.get("p", 0.5))
        before = graph.mirror_probability
        # two flips: mirrored when exactly one of them flipped
        graph.mirror_probability = p if before is None else before * (1 - p) + p * (1 - before)
        return None
    if name == "ColorJitter":
        return _color_jitter(fields, shown, graph)
    if name == "ToTensor" or (
        name == "ConvertImageDtype" and str(fields.get("dtype")) in ("torch.float32", "torch.float")
    ):
        if name == "ToTensor" and not on_image:
            return f"{shown}: a tensor given to ToTensor, {_NO_COUNTERPART}"
        if name == "ConvertImageDtype" and graph.tensor != "uint8":
            return f"{shown}: {_NO_COUNTERPART} but after PILToTensor"
        graph.tensor = "float"
        return None
    if name == "PILToTensor" and on_image:
        graph.tensor = "uint8"
        return None
    if name == "Normalize" and graph.tensor == "float":
        mean, std = fields.get("mean"), fields.get("std")
        if not isinstance(mean, list) or not isinstance(std, list):
            return f"{shown}: its mean and std cannot be read"
        graph.mean, graph.std = [float(m) for m in mean], [float(s) for s in std]
        return None
    return f"{shown}: {_NO_COUNTERPART}"


def _resize(
    name: str, fields: Mapping[str, Any], described: str, graph: _Graph, first: bool
) -> str | None:
    """Adds a RandomResizedCrop or a Resize to the graph; the line refusing it."""
    on_image = graph.tensor is None
    interpolation = _INTERPOLATIONS.get(fields.get("interpolation", "bilinear"))
    if interpolation is None:
        return f"{described}: interpolation {fields.get('interpolation')} {_NO_COUNTERPART}"
    # torchvision antialiases on PIL images whatever `antialias` says
    antialias = True if on_image else fields.get("antialias") is not False
    resample = f"interp_type={interpolation}, antialias={antialias}"
    height, width = size_of(fields.get("size"))
    if name == "RandomResizedCrop":
        crop = (
            f"random_area={floats(fields.get('scale', [0.08, 1.0]))}, "
            f"random_aspect_ratio={floats(fields.get('ratio', [3 / 4, 4 / 3]))}, "
            "num_attempts=10"
        )
        if height is None or width is None:
            return f"{described}: its size cannot be read"
        if first:
            graph.random_crop = crop
            graph.add(
                f"images = fn.resize(images, resize_x={width}, resize_y={height}, {resample})"
            )
        else:
            graph.add(
                f"images = fn.random_resized_crop(images, size=[{height}, {width}], "
                f"{crop}, {resample})"
            )
        return None
    size = fields.get("size")
    if isinstance(size, int) or (isinstance(size, list) and len(size) == 1):
        shorter = size if isinstance(size, int) else size[0]
        max_size = fields.get("max_size")
        limit = f", max_size={int(max_size)}" if max_size else ""
        graph.add("# the longer side: torchvision truncates it, DALI rounds it (a pixel at most)")
        graph.add(
            f"images = fn.resize(images, resize_shorter={shorter}{limit}, "
            f"{resample}, subpixel_scale=False)"
        )
        return None
    if height is None or width is None:
        return f"{described}: its size cannot be read"
    graph.add(f"images = fn.resize(images, resize_x={width}, resize_y={height}, {resample})")
    return None


def _color_jitter(fields: Mapping[str, Any], described: str, graph: _Graph) -> str | None:
    arguments = []
    for name in ("brightness", "contrast", "saturation", "hue"):
        span = fields.get(name)
        if span is None:
            continue
        if not (isinstance(span, list) and len(span) == 2):
            return f"{described}: its {name} range cannot be read"
        scale = 360.0 if name == "hue" else 1.0  # torchvision: a fraction of the circle
        low, high = (float(value) * scale for value in span)
        arguments.append(f"{name}=fn.random.uniform(range={floats([low, high])})")
    if arguments:
        graph.add(
            "# ColorJitter: torchvision applies its four in a random order, DALI in a fixed one"
        )
        graph.add(f"images = fn.color_twist(images, {', '.join(arguments)})")
    return None


def size_of(size: Any) -> tuple[int | None, int | None]:
    """(height, width) of a torchvision size: an int (a square) or [h, w] or [s]."""
    if isinstance(size, int):
        return size, size
    if isinstance(size, list) and len(size) == 1 and isinstance(size[0], int):
        return size[0], size[0]
    if isinstance(size, list) and len(size) == 2 and all(isinstance(s, int) for s in size):
        return size[0], size[1]
    return None, None


def floats(values: Sequence[Any]) -> str:
    return "[" + ", ".join(_float(float(value)) for value in values) + "]"


def _float(value: float) -> str:
    """A float to 10 significant digits (57.12, not 57.120000000000005)."""
    return repr(float(f"{value:.10g}"))


def described(step: Mapping[str, Any]) -> str:
    """A transform as `Name(field=value, ...)`, cut short past 80 characters."""
    fields = step.get("fields") or {}
    inner = ", ".join(f"{key}={value!r}" for key, value in fields.items())
    if len(inner) > 80:
        inner = inner[:77] + "..."
    return f"{step.get('name')}({inner})"
