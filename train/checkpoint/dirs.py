"""The checkpoint root as a directory: listing, ownership, committing, pruning, leftovers.

Rules every function here keeps (issue 14): a symbolic link is never a checkpoint, never
followed, never deleted through (a leftover link is removed as a link); a checkpoint is only
pruned or replaced when its manifest proves it belongs to a run in ``owned`` (its ``run_id``);
a damaged or foreign manifest proves nothing, so such a directory is never touched; pruning
and the search for the newest checkpoint follow the current line of the history and never
delete anything another branch's line holds (:mod:`train.checkpoint.branches`). Used by
:class:`train.checkpoint.manager.CheckpointManager`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Literal

from train.checkpoint import branches as _branches
from train.checkpoint import manifest as _io
from train.checkpoint.branches import Line
from train.checkpoint.digest import ALGORITHMS, FORMAT_VERSION
from train.errors import CheckpointError

__all__ = [
    "checkpoint_run_id",
    "checkpoint_step",
    "collect_markers",
    "commit",
    "foreign_checkpoints",
    "latest_valid",
    "owned_dirs",
    "prune",
    "remove_all",
    "remove_leftovers",
    "step_dirs",
    "tmp_dir",
    "warn_skipped",
]

log = logging.getLogger("train.checkpoint.manager")

STEP_RE = _io.STEP_RE
TMP_RE = re.compile(r"^\.step-(\d+)\.tmp$")
# directories this code renamed to delete them; ``.corrupt-*`` (set aside) are kept for people
JUNK_RE = re.compile(r"^\.step-(\d+)(?:\.b\d+)?\.del-\d+$")


def checkpoint_run_id(path: str | os.PathLike[str]) -> str | None:
    """The ``run_id`` recorded in checkpoint ``path``'s manifest; None when there is none or the
    manifest is missing, damaged, foreign, or ``path`` is a link (nothing to prove ownership)."""
    try:
        rid = _io.read_manifest(Path(path)).get("run_id")
    except CheckpointError:
        return None
    return rid or None


def _remove(p: Path) -> None:
    """Delete a leftover of ours: a link as a link (never its target), a directory as a tree."""
    if p.is_symlink():
        p.unlink(missing_ok=True)
    else:
        shutil.rmtree(p, ignore_errors=True)


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``step-N`` directories, newest first; links are not checkpoints and are left out."""
    out = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and not p.is_symlink() and p.is_dir():
            out.append((int(m.group(1)), p))
    return sorted(out, reverse=True)


def owned_dirs(root: Path, owned: Collection[str]) -> list[tuple[int, Path, dict[str, Any]]]:
    """Checkpoints of the runs in ``owned`` (readable manifest, owned run id), newest first."""
    out = []
    for s, p in step_dirs(root):
        try:
            manifest = _io.read_manifest(p)
        except CheckpointError:
            continue  # damaged or foreign: nobody can prove it is ours, so never touched
        if manifest.get("run_id") in owned:
            out.append((s, p, manifest))
    return out


def foreign_checkpoints(root: Path, owned: Collection[str]) -> list[Path]:
    """``step-N`` entries (newest first) not of an owned run: another run's, damaged, links."""
    entries = []
    for p in root.iterdir():
        m = STEP_RE.match(p.name)
        if m and (p.is_symlink() or checkpoint_run_id(p) not in owned):
            entries.append((int(m.group(1)), p))
    return [p for _, p in sorted(entries, reverse=True)]


def tmp_dir(root: Path, step: int, rank: int) -> Path:
    """``ROOT/.step-N.tmp``, where every rank writes its part of checkpoint ``step``; a link
    planted there is removed by rank 0 and refused by the others (never written through)."""
    tmp = root / f".step-{step}.tmp"
    if rank == 0 and tmp.is_symlink():
        tmp.unlink()
    tmp.mkdir(exist_ok=True)
    if tmp.is_symlink():
        raise CheckpointError(f"{tmp} is a symbolic link; refusing to write through it")
    return tmp


def remove_leftovers(root: Path) -> None:
    """Remove ``.step-N.tmp`` (interrupted saves) and ``.step-N.del-*`` (interrupted prunes)."""
    for p in root.iterdir():
        if TMP_RE.match(p.name):
            log.warning("removing %s: an incomplete checkpoint from an interrupted save", p)
            _remove(p)
        elif JUNK_RE.match(p.name):
            _remove(p)


def warn_skipped(root: Path, newest: int) -> None:
    """Say which entries a search for the newest checkpoint passes over without trying."""
    for p in sorted(root.iterdir()):
        m = TMP_RE.match(p.name)
        if m and int(m.group(1)) >= newest:
            log.warning("skipping %s: incomplete checkpoint (interrupted save)", p.name)
        elif STEP_RE.match(p.name) and p.is_symlink():
            log.warning("skipping %s: a symbolic link, never loaded as a checkpoint", p.name)


def prune(
    root: Path,
    owned: Collection[str],
    *,
    keep: Path,
    keep_last: int,
    keep_best: bool,
    best_mode: Literal["max", "min"],
    line: Line | None = None,
) -> list[Path]:
    """Keep the newest ``keep_last`` checkpoints of the current line and its best one; set
    the others aside.

    Only checkpoints of owned runs on ``line`` (default: the current line,
    :mod:`train.checkpoint.branches`) are candidates, and of those none that another branch's
    line holds (the abandoned branch, the fork point it grew from): another run's checkpoint,
    a damaged one, a link or anything of another branch is never deleted. Runs only after
    checkpoint ``keep`` is complete, so the only good one is never removed. Each doomed
    ``step-N`` is renamed to ``.step-N.del-*`` (no longer a checkpoint); returns those for
    :func:`remove_all` (which a caller may run in the background: deleting 50 MB takes longer
    than renaming it; leftovers go at the next start).
    """
    line = line if line is not None else _branches.current(root)
    held, protected = _branches.prune_candidates(_branches.entries(root), line)
    mine = [e for e in held if e.manifest.get("run_id") in owned]
    kept = {e.path for e in mine[:keep_last]} | {keep} | protected
    if keep_best:
        best: tuple[float, Path] | None = None
        for e in mine:
            metric = e.manifest.get("metric")
            if isinstance(metric, int | float):
                score = float(metric) if best_mode == "max" else -float(metric)
                if best is None or score > best[0]:
                    best = (score, e.path)
        if best is not None:
            kept.add(best[1])
    doomed = []
    for e in mine:
        p = e.path
        if p in kept or p.is_symlink():
            continue
        # rename first: a half-deleted directory must never look like a checkpoint
        aside = p.with_name(f".{p.name}.del-{time.time_ns()}")
        try:
            os.rename(p, aside)
        except OSError:
            continue
        doomed.append(aside)
    return doomed


def remove_all(doomed: list[Path]) -> None:
    """Delete what :func:`prune` set aside (links as links)."""
    for p in doomed:
        _remove(p)


def _marker_entry(marker: object, step: int) -> dict[str, Any] | None:
    """The file entry of a rank's marker for ``step``; None for a stale or damaged marker."""
    if not isinstance(marker, dict) or marker.get("step") != step:
        return None
    algo = ALGORITHMS[FORMAT_VERSION]
    size, digest = marker.get("size"), marker.get(algo)
    if not isinstance(size, int) or isinstance(size, bool) or not isinstance(digest, str):
        return None
    return {"size": size, algo: digest}


#: Once the step is ending (``ending``), how long a pending rank's part may stay as it is
#: (its file neither growing nor touched) before the save gives up on it: a rank that died mid-
#: save (srun ends the step at its bad exit) never writes its marker, and waiting for it would
#: hold the node until Slurm's KillWait kills this rank too (30 s by default).
ENDING_IDLE_S = 3.0


def _part_state(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns)


def collect_markers(
    tmp: Path,
    step: int,
    ranks: Collection[int],
    timeout_s: float,
    ending: Callable[[], bool] | None = None,
    idle_s: float = ENDING_IDLE_S,
) -> dict[str, dict[str, Any]]:
    """Wait until each of ``ranks`` dropped its marker for ``step``; return their file entries.

    A stale or damaged marker counts as not there yet (and times out like a dead rank).
    ``ending``: whether the step is ending (srun's TERM, not the run's stop signal): from then
    on a pending rank whose part stays as it is for ``idle_s`` is taken for dead."""
    deadline = time.monotonic() + timeout_s
    files: dict[str, dict[str, Any]] = {}
    pending = set(ranks)
    parts: dict[int, tuple[int, int] | None] | None = None  # as last seen once ending
    moved = 0.0  # when a pending part last changed (or the ending was first seen)
    while pending:
        for r in sorted(pending):
            try:
                raw = json.loads((tmp / _io.marker_file(r)).read_bytes().decode("utf-8"))
            except (OSError, ValueError, RecursionError):
                continue
            entry = _marker_entry(raw, step)
            if entry is not None:
                files[_io.rank_file(r)] = entry
                pending.discard(r)
        if pending:
            now = time.monotonic()
            if now > deadline:
                raise CheckpointError(
                    f"checkpoint step-{step}: ranks {sorted(pending)} did not finish writing "
                    f"within {timeout_s:g}s (did a rank die?)"
                )
            if ending is not None and ending():
                seen = {r: _part_state(tmp / _io.rank_file(r)) for r in pending}
                if seen != parts:
                    parts, moved = seen, now
                elif now - moved > idle_s:
                    raise CheckpointError(
                        f"checkpoint step-{step}: ranks {sorted(pending)} did not finish writing "
                        f"and stopped writing as the step ends (did a rank die?)"
                    )
            time.sleep(0.02)
    return files


def commit(tmp: Path, final: Path, owned: Collection[str]) -> None:
    """Put the complete ``tmp`` in place as ``final``; never destroy a valid ``final``.

    An existing valid ``step-N`` of an owned run (e.g. written before a ``--resume`` from an
    older step) is swapped atomically with the new one and only then deleted; where an atomic
    swap is not possible the existing one is kept and the new copy discarded. An invalid one is
    set aside as ``.step-N.corrupt-*`` (kept). One of another run, or a link, is never
    touched: CheckpointError (and ``tmp`` is removed).
    """
    root = final.parent
    if final.is_symlink():
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"{final} is a symbolic link; not replacing it")
    if final.exists():
        try:
            existing = _io.verify_checkpoint(final)
        except CheckpointError as exc:
            aside = final.with_name(f".{final.name}.corrupt-{time.time_ns()}")
            log.warning("setting invalid %s aside as %s (%s)", final, aside.name, exc)
            os.rename(final, aside)
        else:
            owner = existing.get("run_id")
            if owner not in owned:
                shutil.rmtree(tmp, ignore_errors=True)
                raise CheckpointError(
                    f"{final} belongs to another run (run id {owner or 'unknown'}); not "
                    "replacing it: use a new run directory, or resume that run"
                )
            if _io.exchange(tmp, final):
                _io.fsync_dir(root)
                log.warning("%s existed; replaced it atomically with this run's", final)
            else:
                log.warning("%s already exists and is valid; keeping it", final)
            shutil.rmtree(tmp, ignore_errors=True)  # the old one after a swap, else the new
            return
    os.rename(tmp, final)
    _io.fsync_dir(root)
    log.info("checkpoint saved: %s", final)


def checkpoint_step(path: str | os.PathLike[str]) -> int | None:
    """The step recorded in checkpoint ``path``'s manifest; None when it is unreadable."""
    try:
        return int(_io.read_manifest(Path(path))["step"])
    except CheckpointError:
        return None


def latest_valid(root: str | os.PathLike[str], line: Line | None = None) -> Path | None:
    """The newest checkpoint on ``line`` (default: the current line,
    :mod:`train.checkpoint.branches`) under ``root`` that verifies completely (read-only:
    creates and removes nothing; a missing ``root`` has none). Invalid newer ones are skipped
    with a warning; checkpoints of other branches are not candidates."""
    root = Path(root)
    if not root.is_dir():
        return None
    line = line if line is not None else _branches.current(root)
    dirs = step_dirs(root)
    warn_skipped(root, dirs[0][0] if dirs else -1)
    candidates = []
    for step, p in dirs:
        m = STEP_RE.match(p.name)
        branch = int(m.group(2) or 0) if m else 0
        if line.holds(branch, step):  # by its name; verifying checks the manifest agrees
            candidates.append((step, line.depth(branch), p))
    for _, _, p in sorted(candidates, key=lambda c: (-c[0], c[1])):
        try:
            _io.verify_checkpoint(p)
        except CheckpointError as exc:
            log.warning("skipping invalid checkpoint: %s", exc)
            continue
        return p
    return None


def main(argv: list[str] | None = None) -> int:
    """``python -m train.checkpoint.dirs RUN_DIR``: the path of the run's newest valid
    checkpoint on its current line (a pipeline's ``${stages.NAME.checkpoint}``, jobs.pipeline),
    or RUN_DIR itself when it has none (a command keeps its own files there)."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m train.checkpoint.dirs RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(args[0])
    found = latest_valid(run_dir / "checkpoints")
    print(found if found is not None else run_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
