"""Errors a user can act on. Their messages are one line and name the problem."""

from __future__ import annotations

import re


class InputError(ValueError):
    """Bad input from the user: a setting, a path or a device that cannot work."""


class CorruptImageError(InputError):
    """An image file in the dataset cannot be decoded."""

    def __init__(self, path: str, reason: str) -> None:
        if "PermissionError" in reason or "ermission denied" in reason:
            problem, fix = "image file that cannot be read", "give this user read access to it"
        else:
            problem, fix = "corrupt or truncated image", "remove it"
        super().__init__(
            f"{problem}: {path} ({reason}); "
            f"{fix}, or skip and count such files (--skip-corrupt, skip_corrupt=True)"
        )
        self.path = path
        self.reason = reason


class BackendUnavailable(InputError):
    """A pipeline backend (DALI) is not installed on this machine."""


DALI_INSTALL_HINT = (
    "NVIDIA DALI is not installed: pip install 'feedscope[dali]' (CUDA 12) "
    "or 'feedscope[dali-cuda13]' (CUDA 13)"
)


# A line that reads as an error: the probe's own ("error: ...", a session's "no answer: ..."),
# one naming an exception (a traceback's last line), or a lane's failure ("lane 0: failed: ...").
_ERROR_LINE = re.compile(r"^(error|no answer):|(Error|Exception)\b|\bfailed: ")


def error_line(text: str) -> str | None:
    """The last non-empty line of `text` that reads as an error; None if none does."""
    lines = (line.strip() for line in reversed(text.replace("\r", "\n").splitlines()))
    return next((line for line in lines if line and _ERROR_LINE.search(line)), None)
