"""Checkpoint history with branches: which checkpoints make up the run's current line.

Resuming from a checkpoint that is not the newest of its branch (``--resume
RUN_DIR/checkpoints/step-40`` while ``step-50`` and ``step-60`` exist) and training on starts a
new branch. Its checkpoints are named ``step-N.bB`` (``B``: a whole number; branch 0, the first
line of history, keeps the plain ``step-N``), and each manifest records ``branch: B`` and
``parents: [[P, S], ...]``: the fork points back to the root, nearest first (branch ``B``
continues branch ``P`` after its step ``S``). A manifest without ``branch`` (written before
branches existed) is of branch 0 with no parents: an old history is one implicit branch.

The **line** of a branch is the branch itself plus each ancestor up to its fork point. The
**current** line is ``ROOT/branch.json`` (``{"branch": B, "parents": [[P, S], ...]}``), one
small file written atomically (temporary file, fsync, rename, fsync of ``ROOT``; never through
a link) by rank 0 when a run starts or switches a branch, *before* the first save on it:

- automatic resumes (Slurm restarts, ``--resume`` without a path) take the newest valid
  checkpoint on the current line (:func:`latest_on_line`);
- pruning (``keep_last``/``keep_best``) considers only this run's checkpoints on the current
  line that are on no other branch's line (:func:`prune_candidates`): nothing of another
  branch, not even the fork point it grew from, is ever deleted unasked;
- a save names ``step-N`` or ``step-N.bB`` (:func:`dir_name`), so no branch's checkpoint
  ever replaces another branch's.

Crashes: before ``branch.json`` is replaced nothing has changed (the old line holds). After it,
before the first save of the new branch, the new line has no checkpoint of its own yet, so its
newest checkpoint is the fork point itself: an automatic resume starts there again, on the new
branch, and the abandoned checkpoints stay where they are. A missing or damaged ``branch.json``
is not trusted: the line of the most recently written checkpoint (manifest ``time``) is
followed, with a warning. Who decides: :func:`train.resume.plan_resume` (rank 0, broadcast to
every rank with the plan); other ranks read at most ``branch.json``, never the others' files.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.checkpoint import manifest as _io
from train.errors import CheckpointError
from train.runfiles import LinkRefusedError

__all__ = [
    "BRANCH_FILE",
    "Entry",
    "Line",
    "Record",
    "current",
    "dir_name",
    "entries",
    "line_of",
    "next_line",
    "on_line",
    "parse_line",
    "prune_candidates",
    "read_current",
    "read_record",
    "write_current",
]

log = logging.getLogger("train.checkpoint.manager")

BRANCH_FILE = "branch.json"


@dataclass(frozen=True)
class Line:
    """A branch and its ancestry: ``parents`` are ``(branch, step)`` fork points, nearest
    first. ``Line()`` is branch 0, the first line of history."""

    branch: int = 0
    parents: tuple[tuple[int, int], ...] = ()

    def holds(self, branch: int, step: int) -> bool:
        """Whether checkpoint ``step`` of ``branch`` is on this line."""
        if branch == self.branch:
            return True
        return any(b == branch and step <= s for b, s in self.parents)

    def depth(self, branch: int) -> int:
        """0 for this branch, 1 for its parent, ...: among two checkpoints of the same step on
        one line (a save at the fork step), the nearer branch's is the newer."""
        if branch == self.branch:
            return 0
        for i, (b, _) in enumerate(self.parents):
            if b == branch:
                return i + 1
        return len(self.parents) + 1

    def ids(self) -> set[int]:
        return {self.branch, *(b for b, _ in self.parents)}

    def to_json(self) -> dict[str, Any]:
        return {"branch": self.branch, "parents": [[b, s] for b, s in self.parents]}

    def describe(self) -> str:
        if not self.parents:
            return f"branch {self.branch}"
        b, s = self.parents[0]
        return f"branch {self.branch} (from step {s} of branch {b})"


def dir_name(step: int, branch: int) -> str:
    """``step-N`` on branch 0, ``step-N.bB`` on branch ``B``."""
    return f"step-{step}" if branch == 0 else f"step-{step}.b{branch}"


def parse_line(data: object, where: str) -> Line:
    """The line recorded in a manifest or ``branch.json`` (``branch`` absent: branch 0 without
    parents); CheckpointError naming the first field of a wrong type or shape."""
    if not isinstance(data, dict):
        raise CheckpointError(f"{where}: not a JSON object")
    branch, parents = _io.check_line(data, where)
    return Line(branch, parents)


def line_of(manifest: dict[str, Any]) -> Line:
    """The line of a checked manifest (:func:`train.checkpoint.manifest.check_manifest`
    checked ``branch`` and ``parents`` already)."""
    return parse_line(manifest, "manifest")


@dataclass(frozen=True)
class Entry:
    """A ``step-N[.bB]`` directory whose manifest is readable and matches its name."""

    step: int
    branch: int
    path: Path
    manifest: dict[str, Any]

    @property
    def line(self) -> Line:
        return line_of(self.manifest)


def entries(root: Path) -> list[Entry]:
    """Every checkpoint under ``root`` with a readable manifest (links, damaged or foreign
    manifests and names that disagree with their manifest left out), newest step first.
    Reads one small ``manifest.json`` per checkpoint, no rank's file."""
    out = []
    try:
        names = list(root.iterdir())
    except OSError:
        return []
    for p in names:
        m = _io.STEP_RE.match(p.name)
        if not m or p.is_symlink() or not p.is_dir():
            continue
        try:
            manifest = _io.read_manifest(p)
        except CheckpointError:
            continue
        step, branch = int(m.group(1)), int(m.group(2) or 0)
        if manifest["step"] != step or manifest.get("branch", 0) != branch:
            continue  # renamed by hand: nothing can say which it is
        out.append(Entry(step, branch, p, manifest))
    return sorted(out, key=lambda e: (e.step, -e.branch), reverse=True)


@dataclass(frozen=True)
class Record:
    """What ``branch.json`` holds: the current line and, when a run was started from an
    explicit checkpoint, that checkpoint's name (a restart of the same command line then
    continues the line instead of forking from it again: :func:`train.resume.plan_resume`)."""

    line: Line
    resumed_from: str | None = None


def read_record(root: Path) -> Record | None:
    """``ROOT/branch.json``; None when missing, a link, unreadable or damaged (a warning
    says so for anything but missing)."""
    path = root / BRANCH_FILE
    try:
        if path.is_symlink():
            raise CheckpointError(f"{path} is a symbolic link")
        data = json.loads(path.read_bytes().decode("utf-8"))
        line = parse_line(data, str(path))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, CheckpointError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return None
    start = data.get("resumed_from")
    return Record(line, start if isinstance(start, str) and _io.STEP_RE.match(start) else None)


def read_current(root: Path) -> Line | None:
    """The line ``ROOT/branch.json`` records (None: no trustworthy file)."""
    record = read_record(root)
    return record.line if record is not None else None


def current(root: Path, *, scan: bool = True) -> Line:
    """The current line: ``branch.json``; without a trustworthy one (``scan``), the line of
    the most recently written checkpoint (manifest ``time``), else branch 0."""
    line = read_current(root)
    if line is not None or not scan:
        return line or Line()
    found = entries(root)
    if not found:
        return Line()
    newest = max(found, key=lambda e: float(e.manifest.get("time") or 0.0))
    line = newest.line
    if line != Line() or any(e.branch != 0 for e in found):
        log.warning(
            "%s: no usable %s; following %s, the line of the newest written checkpoint %s",
            root,
            BRANCH_FILE,
            line.describe(),
            newest.path.name,
        )
    return line


def write_current(root: Path, line: Line, resumed_from: str | None = None) -> None:
    """Make ``line`` the current one (atomic and durable; a link is refused, not followed);
    ``resumed_from``: the checkpoint (its name) an explicit resume started it from."""
    data = {**line.to_json(), **({"resumed_from": resumed_from} if resumed_from else {})}
    try:
        _io.write_json_atomic(data, root / BRANCH_FILE)
    except LinkRefusedError as exc:
        raise CheckpointError(str(exc)) from exc
    except OSError as exc:
        raise CheckpointError(f"cannot write {root / BRANCH_FILE}: {exc}") from exc


def on_line(found: list[Entry], line: Line) -> list[Entry]:
    """The entries of ``found`` on ``line``, newest first (at one step, the nearer branch)."""
    held = [e for e in found if line.holds(e.branch, e.step)]
    return sorted(held, key=lambda e: (-e.step, line.depth(e.branch)))


def next_line(found: list[Entry], target: Entry, current_line: Line) -> Line:
    """The line a run continues after resuming from ``target`` (a checkpoint of this root).

    ``target`` the newest checkpoint of its branch: that branch goes on (a resume from the
    head abandons nothing). Otherwise a new branch forks from ``target``; its number is one
    above any this root has recorded (manifests, their parents, the current line)."""
    tline = target.line
    if not any(e.branch == target.branch and e.step > target.step for e in found):
        return tline
    used = set(current_line.ids())
    for e in found:
        used |= e.line.ids()
    return Line(max(used) + 1, ((target.branch, target.step), *tline.parents))


def prune_candidates(found: list[Entry], line: Line) -> tuple[list[Entry], set[Path]]:
    """What pruning may weigh on ``line``: its checkpoints (newest first), and the paths of
    those it must keep whatever ``keep_last`` says, because another branch's line holds them
    (the abandoned branch, and every fork point another branch grew from)."""
    held = on_line(found, line)
    others = {e.line for e in found if e.branch != line.branch}
    protected = {e.path for e in held if any(o.holds(e.branch, e.step) for o in others)}
    return held, protected
