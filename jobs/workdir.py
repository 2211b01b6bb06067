"""Where a command runs, and an earlier run's files there (torch-free).

``entrypoint.command`` runs in the folder ``jobs submit`` was called from (as ``sbatch`` and
submitit do): the user's relative paths (``data/``, ``configs/x.yaml``, the script itself) mean
what they mean in their shell. A script that also keeps its checkpoint there under a fixed name
(``snapshot.pt``: pytorch/examples' ``multinode.py``) would make a NEW submission continue the
LAST one, silently. So before a command is submitted, :func:`earlier_checkpoints` looks in that
folder for checkpoint files written since an earlier run was submitted from it (the index,
``runs.jsonl``, keeps where each run was submitted from): files that were there before any run
(pretrained weights) are not an earlier run's. Found, ``jobs submit`` refuses in one line that
names the file and the two choices: move it away (a fresh start), or ``--continue-files``
(continue from it, on purpose). ``RUN_DIR`` (a folder of its own per run) is where a script
should keep what it writes.

The look is bounded: the folder's own entries and, one level down, folders named like checkpoint
folders (``checkpoints/``, ``ckpt/``, ``snapshots/``, Lightning's ``lightning_logs/*/checkpoints``),
at most :data:`MAX_ENTRIES` entries in all: a stat each, no read.
"""

from __future__ import annotations

import os
import re
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT_SUFFIXES", "MAX_ENTRIES", "earlier_checkpoints", "refusal"]

CHECKPOINT_SUFFIXES = frozenset(
    {".pt", ".pth", ".ckpt", ".safetensors", ".bin", ".pkl", ".pickle", ".h5", ".npz", ".distcp"}
)
_CHECKPOINT_DIRS = re.compile(r"(checkpoints?|ckpts?|snapshots?|saved?_models?)", re.IGNORECASE)
MAX_ENTRIES = 2000


def _entries(folder: Path, budget: list[int]) -> Iterable[os.DirEntry[str]]:
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if budget[0] <= 0:
                    return
                budget[0] -= 1
                yield entry
    except OSError:
        return


def _candidates(folder: Path, skip: Path | None) -> Iterable[Path]:
    budget = [MAX_ENTRIES]
    for entry in _entries(folder, budget):
        path = Path(entry.path)
        if skip is not None and path == skip:
            continue  # our own run directories
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
        except OSError:
            continue
        if not is_dir:
            if path.suffix.lower() in CHECKPOINT_SUFFIXES:
                yield path
            continue
        if _CHECKPOINT_DIRS.fullmatch(entry.name):
            yield path  # a checkpoint folder of the script's own: its newest entry counts
        elif entry.name == "lightning_logs":
            for version in _entries(path, budget):
                ckpts = Path(version.path) / "checkpoints"
                if ckpts.is_dir():
                    yield ckpts


def _written_at(path: Path) -> float:
    """When ``path`` (a file; a folder: the newest entry in it) was last written."""
    try:
        info = path.lstat()
    except OSError:
        return 0.0
    if not stat.S_ISDIR(info.st_mode):
        return info.st_mtime
    newest = 0.0
    for entry in _entries(path, [200]):
        try:
            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
        except OSError:
            continue
    return newest


def _same(a: str, b: Path) -> bool:
    try:
        return os.path.realpath(a) == os.path.realpath(b)
    except (OSError, ValueError):
        return False


def earlier_checkpoints(
    folder: Path, index: Iterable[Mapping[str, Any]], runs_root: Path | None = None
) -> list[tuple[Path, float]]:
    """Checkpoint files (or folders) in ``folder`` written since the first run submitted from
    it (``index``: runs.jsonl's entries, each with ``submit_dir`` and ``submitted_at``),
    newest first, with when each was written. Empty when no run was submitted from here."""
    since = min(
        (
            float(e["submitted_at"])
            for e in index
            if isinstance(e.get("submit_dir"), str)
            and isinstance(e.get("submitted_at"), int | float)
            and _same(e["submit_dir"], folder)
        ),
        default=None,
    )
    if since is None:
        return []
    skip = runs_root.resolve() if runs_root is not None else None
    found = [(p, _written_at(p)) for p in _candidates(folder, skip)]
    return sorted(((p, t) for p, t in found if t >= since), key=lambda pt: -pt[1])


def refusal(found: list[tuple[Path, float]], folder: Path) -> str:
    """The one line ``jobs submit`` refuses with (``found`` not empty)."""
    path, written = found[0]
    others = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(written))
    try:
        shown = f"./{path.relative_to(folder)}"
    except ValueError:
        shown = str(path)
    return (
        f"{shown}{others}, written {when} after an earlier run was submitted from this folder, "
        "is in the folder your command runs in: a script that resumes from it would continue "
        "that run. Move it away to start afresh, or pass --continue-files to continue from it "
        "(keep a script's checkpoints in $RUN_DIR: a folder of its own per run)"
    )
