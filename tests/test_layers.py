"""The architecture, checked on the source: which layer may import which, and which module alone
may use each outside API. Every import counts, at any depth (in functions, under TYPE_CHECKING).

A pattern `pkg.*` means the package and everything in it; any other pattern, that one module.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST_PARTY = ("app", "probe", "pipelines")

# probe's layers go downward only: present -> fix -> judge -> measure -> store -> base (and
# pipelines)
BASE = ("probe.metrics", "probe.lane_figures", "probe.steady", "probe.records", "pipelines.*")
STORE = ("probe.store.*", *BASE)
MEASURE = ("probe.measure.*", *STORE)
JUDGE = ("probe.judge.*", *MEASURE)
FIX = ("probe.fix.*", *JUDGE)
PRESENT = ("probe.present.*", *FIX)
LAYERS: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    # (the modules of a layer, the first-party modules they may import)
    (("pipelines.*",), ("pipelines.*",)),
    (("app.*",), ("app.*", "probe.*")),  # through probe, never pipelines directly
    (("probe", "probe.__main__"), ("probe.*", "pipelines.*")),
    (("probe.present.*",), PRESENT),
    (("probe.fix.*",), FIX),
    (("probe.judge.*",), JUDGE),
    (("probe.measure.*",), MEASURE),
    (("probe.store.*",), STORE),
    (BASE[:4], BASE),
]

# One door per outside API (ruff's banned-api in pyproject.toml; it exempts a file from every
# ban at once, so here each API is held to its own owners)
FENCES: dict[str, tuple[str, ...]] = {
    "torch.cuda": ("probe.measure.devices", "pipelines.loader"),
    "pynvml": ("probe.measure.samplers.nvml",),
    "psutil": ("probe.measure.samplers.host",),
    "plotly": ("probe.present.charts.*",),
    "rich": ("probe.present.console", "probe.present.terminal"),
    "nvidia.dali": ("pipelines.dali_loader",),
    "streamlit": ("app.*",),
    "prometheus_client": ("probe.measure.prometheus",),
    "tensorboard": ("probe.measure.tensorboard",),
    "torch.utils.tensorboard": ("probe.measure.tensorboard",),
    "lightning": ("probe.measure.lightning",),
}


def matches(module: str, patterns: tuple[str, ...]) -> bool:
    return any(
        module == p[:-2] or module.startswith(p[:-1]) if p.endswith(".*") else module == p
        for p in patterns
    )


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {module_name(p): p for top in FIRST_PARTY for p in sorted((ROOT / top).rglob("*.py"))}


def imports(module: str, uses: bool = False) -> Iterator[tuple[int, str]]:
    """(line, dotted name) of each import in a module (`from a import b` gives `a.b`;
    `__import__("a")` and `importlib.import_module("a")` give `a`); with `uses`, also each
    `name.attribute`, its name read through the module's import aliases, which shows
    `torch.cuda.x()` however torch was bound."""
    path = SOURCES[module]
    package = module.split(".")[: None if path.name == "__init__.py" else -1]
    tree = ast.parse(path.read_text(), str(path))
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = (
                    alias.name if alias.asname else alias.name.split(".")[0]
                )
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) + 1 - node.level] if node.level else []
            source = ".".join([*base, *filter(None, [node.module])])
            for alias in node.names:
                aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
                yield node.lineno, f"{source}.{alias.name}"
        elif isinstance(node, ast.Call) and _imports_by_name(node):
            argument = node.args[0] if node.args else None
            if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                yield node.lineno, argument.value
    if uses:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                name = aliases.get(node.value.id, node.value.id)
                yield node.lineno, f"{name}.{node.attr}"


def _imports_by_name(call: ast.Call) -> bool:
    """Whether a call imports a module named by a string: `__import__`, `import_module`."""
    function = call.func
    if isinstance(function, ast.Name):
        return function.id in ("__import__", "import_module")
    return isinstance(function, ast.Attribute) and function.attr == "import_module"


def ours(name: str) -> str | None:
    """The module of ours that an imported name is, or is in (None: not ours)."""
    parts = name.split(".")
    if parts[0] not in FIRST_PARTY:
        return None
    prefixes = (".".join(parts[:n]) for n in range(len(parts), 0, -1))
    return next((m for m in prefixes if m in SOURCES), parts[0])


def where(module: str, line: int, name: str) -> str:
    return f"{SOURCES[module].relative_to(ROOT)}:{line} imports {name}"


@pytest.mark.parametrize("module", sorted(SOURCES))
def test_imports_go_down_the_layers(module: str) -> None:
    allowed = next((allowed for own, allowed in LAYERS if matches(module, own)), None)
    assert allowed is not None, f"{module} is in no layer: add it to LAYERS in test_layers.py"
    bad = sorted(
        where(module, line, target)
        for line, name in imports(module)
        if (target := ours(name)) is not None and not matches(target, allowed)
    )
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("api", FENCES)
def test_each_outside_api_is_used_by_its_owner_alone(api: str) -> None:
    bad = sorted(
        {
            where(module, line, name)
            for module in SOURCES
            if not matches(module, FENCES[api])
            for line, name in imports(module, uses=True)
            if matches(name, (api, f"{api}.*"))
        }
    )
    assert not bad, "\n".join(bad)


def test_the_fences_are_ruffs_banned_apis() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert ruff["flake8-tidy-imports"]["banned-api"].keys() == FENCES.keys()
    exempt = {path for path, rules in ruff["per-file-ignores"].items() if "TID251" in rules}
    owners = {
        p[:-2].replace(".", "/") + "/**" if p.endswith(".*") else p.replace(".", "/") + ".py"
        for patterns in FENCES.values()
        for p in patterns
    }
    assert exempt - {"tests/**"} == owners
