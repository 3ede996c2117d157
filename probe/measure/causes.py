"""A lane's failure in one line that names its cause.

The exception a lane catches often wraps the real error: a DataLoader worker's carries the
worker's traceback in its message ("Caught RuntimeError in DataLoader worker process 0 ...
Original Traceback ..."), and DALI's says "Critical error in pipeline:" with the operator and
its error further down. The reason keeps the real error; for memory it says what the batch
needed. The whole traceback is kept beside it (the lane's `traceback`).
"""

from __future__ import annotations

import re

from pipelines import Backend, PipelineSpec
from pipelines.spec import bytes_text

_ALLOCATION = re.compile(r"(?:you tried to allocate|Can't allocate) (\d+) bytes")
_CUDA_ALLOCATION = re.compile(r"Tried to allocate ([\d.]+ [KMGT]iB)")
_DALI_OPERATOR = re.compile(r"Error in (\w+) operator `(?:nvidia\.dali\.)?([\w.]+)`")
_DALI_ERROR = re.compile(r"encountered:\s*\n\s*(.+)")
_OUT_OF_MEMORY = (
    "std::bad_alloc", "can't allocate memory", "MemoryError", "out of memory",
    "OutOfMemoryError", "Cannot allocate memory", "Can't allocate",
)  # fmt: skip


def failure_reason(
    error: BaseException, spec: PipelineSpec | None = None, backend: Backend | None = None
) -> str:
    """`error` in one line, its real cause first; for memory, what `spec`'s batch needs."""
    text = _chain_text(error)
    cause = _inner_cause(text) or _first_line(error)
    if not any(mark in text for mark in _OUT_OF_MEMORY):
        return cause
    on_gpu = any(mark in text for mark in ("CUDA out of memory", "cudaErrorMemoryAllocation",
                                            "bytes on device"))  # fmt: skip
    what = "out of GPU memory" if on_gpu else "out of memory"
    tried = _ALLOCATION.search(text) or _CUDA_ALLOCATION.search(text)
    if tried is not None:
        amount = tried.group(1)
        what += f" (an allocation of {bytes_text(int(amount)) if amount.isdigit() else amount})"
    if spec is not None and backend is not None:
        what += f": {spec.batch_text(backend)} per batch"
    return f"{what}; {cause}"


def _chain_text(error: BaseException) -> str:
    """The messages of `error` and of the errors it was raised from."""
    texts, seen = [], set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        texts.append(f"{type(current).__name__}: {current}")
        current = current.__cause__ or current.__context__
    return "\n".join(texts)


def _inner_cause(text: str) -> str | None:
    if "Original Traceback" in text:  # a DataLoader worker's: its last line is the error
        lines = [line.strip() for line in text.split("Original Traceback", 1)[1].splitlines()]
        errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line)]
        if errors:
            return _short(errors[-1])
    operator, dali_error = _DALI_OPERATOR.search(text), _DALI_ERROR.search(text)
    if dali_error is not None:
        where = f"DALI's {operator.group(2)} ({operator.group(1)})" if operator else "DALI"
        return _short(f"{where}: {dali_error.group(1).strip()}")
    return None


def _first_line(error: BaseException) -> str:
    lines = [line for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    return _short(lines[0])


def _short(line: str, limit: int = 300) -> str:
    def readable(match: re.Match[str]) -> str:
        return match.group(0).replace(f"{match.group(1)} bytes", bytes_text(int(match.group(1))))

    line = _ALLOCATION.sub(readable, line)
    return line if len(line) <= limit else line[: limit - 3] + "..."
