"""Writes inside a run directory never follow a symbolic link (torch-free, stdlib only).

A link planted in a shared run directory (``events.jsonl -> ~/.bashrc``) must not make a rank
truncate or append to a file elsewhere. Every file this project writes in ``RUN_DIR`` (events,
metrics, heartbeats, hang stacks and reports, markers, the saved config, tracking ids) is
opened here, with ``O_NOFOLLOW``: the open fails (``ELOOP``) before anything is truncated,
and the error says which path is a link. Checkpoints follow the same rule in
:mod:`train.checkpoint` (links are never loaded, replaced or written through).
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import IO

__all__ = ["LinkRefusedError", "default_run_dir", "open_fd", "open_text", "touch", "write_text"]


class LinkRefusedError(OSError):
    """A write inside the run directory met a symbolic link where a file should be."""


def open_fd(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a link in the last component of ``path``."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LinkRefusedError(
                errno.ELOOP, f"{path} is a symbolic link: refusing to write through it"
            ) from exc
        raise


def open_text(path: str | os.PathLike[str], mode: str = "w") -> IO[str]:
    """A text file opened for writing (``"w"``) or appending (``"a"``), links refused."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "a" else os.O_TRUNC)
    return os.fdopen(open_fd(path, flags), mode, encoding="utf-8")


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """``Path.write_text`` that refuses a link."""
    with open_text(path, "w") as f:
        f.write(text)


def touch(path: str | os.PathLike[str]) -> None:
    """Create ``path`` if missing (a marker), refusing a link."""
    os.close(open_fd(Path(path), os.O_WRONLY | os.O_CREAT))


def default_run_dir(run_dir: str | os.PathLike[str] | None, job_id: str | None) -> Path:
    """The run directory: ``train.run_dir`` when the spec gives one, else ``runs/job-JOBID``
    (stable across requeues), else ``runs/local``."""
    if run_dir:
        return Path(run_dir)
    return Path("runs") / (f"job-{job_id}" if job_id else "local")
