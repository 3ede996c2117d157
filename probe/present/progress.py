"""Progress of long work, as one line of text a log keeps and a page reads back: the CLI prints
it where no terminal draws a bar (a launch's log), and the dashboard turns its last one into a
progress bar."""

from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"^(?P<what>.+): (?P<done>\d+) of (?P<total>\d+) (?P<unit>\w+)")


@dataclass(frozen=True)
class Progress:
    """How far some work got: `done` of `total` `unit`, and the line that said so."""

    what: str
    done: int
    total: int
    unit: str
    line: str

    @property
    def share(self) -> float:
        return min(1.0, self.done / self.total) if self.total else 0.0


def progress_line(what: str, done: int, total: int, unit: str, elapsed_s: float) -> str:
    """'writing the sample data: 250 of 1000 images, 31 s so far, about 1 min 33 s left'."""
    line = f"{what}: {done} of {total} {unit}, {_duration(elapsed_s)} so far"
    if 0 < done < total:
        line += f", about {_duration(elapsed_s / done * (total - done))} left"
    return line


def last_progress(text: str) -> Progress | None:
    """The last progress line in a log's text (None: none)."""
    for line in reversed(text.splitlines()):
        match = _LINE.match(line.strip())
        if match:
            return Progress(
                match["what"], int(match["done"]), int(match["total"]), match["unit"], line.strip()
            )
    return None


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"
