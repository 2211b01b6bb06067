"""Which checkpoint a run starts from, and whether it may (decided once, by rank 0).

A run directory belongs to the run that wrote its checkpoints. A second run in it either resumes
it (``--resume``, or a Slurm restart) or is refused with one line (exit 2): it never starts over
beside, replaces or prunes checkpoints it did not write.

A resume compares the config with the one the checkpoint was written with. Every checkpoint
manifest carries ``spec_hash`` (:func:`train.spec.confighash.config_hash`), and the run directory
keeps
each config it trained with as ``RUN_DIR/configs/HASH.json``, so the changed fields can be named.
A change that alters training (optimizer, lr, schedule, batch size, seed, model, data, epochs,
...) is refused unless allowed (``--allow-config-change`` / ``train.allow_config_change``);
then the new values take effect (see :mod:`train.loop.trainer`) and a ``config_changed`` event says
the run is no longer an exact resume. Fields in :data:`FREE_FIELDS` resume freely.

Which line of the checkpoint history a run follows (:mod:`train.checkpoint.branches`): an
automatic resume (a restart, ``--resume`` without a path) takes the newest valid checkpoint on
the current branch's line. An explicit ``--resume PATH`` of a checkpoint that is not the newest
of its branch starts a new branch from it, recorded in ``checkpoints/branch.json`` by rank 0
before the run trains (:attr:`ResumePlan.record`), with the name of that checkpoint. A restart
of a job started with an explicit path (the same command line again) continues the line when
``branch.json`` says it was started from that checkpoint: the restart never forks again from the
old checkpoint, and a restart whose first attempt died before recording anything does what
the first attempt was asked to do.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from train.checkpoint import (
    STEP_RE,
    Line,
    branch_entries,
    current_line,
    next_line,
    read_branch_record,
    read_manifest,
)
from train.errors import CheckpointError, ConfigError
from train.runfiles import CHECKPOINTS, CONFIGS, atomic_write, make_dirs
from train.spec import TrainConfig, config_hash

__all__ = [
    "FREE_FIELDS",
    "ResumePlan",
    "changed_fields",
    "load_training_state",
    "plan_resume",
    "record_config",
    "recorded_config",
    "retarget",
]

log = logging.getLogger(__name__)

#: ``train`` fields that do not alter the training trajectory: a resume may change them freely.
FREE_FIELDS = frozenset(
    {
        "run_dir",
        "checkpoint",
        "log_interval",
        "eval_every_epochs",
        "stop_check_s",
        "num_threads",
        "allow_cpu_fallback",
        "allow_config_change",
    }
)


@dataclass(frozen=True)
class ResumePlan:
    """Rank 0's decision, broadcast to every rank: the checkpoint (None: fresh start), the
    training fields that differ from the checkpoint's config, or why the run is refused; the
    line of the history the run follows, and whether rank 0 must record it as the current one
    (``branch.json``) before the run trains."""

    path: str | None = None
    changed: tuple[str, ...] = ()
    error: str | None = None
    line: Line = field(default_factory=Line)
    record: bool = False
    resumed_from: str | None = None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}."))
        else:
            out[name] = value
    return out


def changed_fields(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """``train.x.y (old -> new)`` for each field that alters training and differs."""
    a, b = _flatten(old), _flatten(new)
    out = []
    for key in sorted(a.keys() | b.keys()):
        if key.split(".")[0] in FREE_FIELDS:
            continue
        if a.get(key) != b.get(key):
            out.append(f"train.{key} ({a.get(key)!r} -> {b.get(key)!r})")
    return out


def _config_file(run_dir: Path, digest: str) -> Path:
    return run_dir / CONFIGS / f"{digest}.json"


def record_config(run_dir: Path, config: TrainConfig) -> None:
    """Keep ``config`` as ``RUN_DIR/configs/HASH.json`` (rank 0; atomic; never overwritten)."""
    path = _config_file(run_dir, config_hash(config))
    if path.exists():
        return
    make_dirs(run_dir, CONFIGS)  # never through a planted link
    atomic_write(path, json.dumps(config.model_dump(mode="json"), sort_keys=True))


def recorded_config(run_dir: Path, digest: str) -> dict[str, Any] | None:
    """The config recorded under ``digest`` in ``run_dir``; None if missing or damaged."""
    if not digest or not all(c in "0123456789abcdef" for c in digest):
        return None
    try:
        data = json.loads(_config_file(run_dir, digest).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _existing(ckpt_root: Path) -> list[str]:
    try:
        found = [(STEP_RE.match(p.name), p.name) for p in ckpt_root.iterdir()]
    except OSError:
        return []
    return [n for m, n in sorted((int(m.group(1)), n) for m, n in found if m)[::-1]]


def _inside(path: Path, ckpt_root: Path) -> bool:
    try:
        return path.resolve().parent == ckpt_root.resolve()
    except OSError:
        return False


def _line_after(path: Path, ckpt_root: Path, current: Line) -> Line:
    """The line a run follows after an explicit resume from ``path``: its branch when ``path``
    is the newest of it, else a new branch from it; ``current`` for a path outside the root
    or an invalid one (loading it fails with the reason)."""
    if not _inside(path, ckpt_root):
        return current
    found = branch_entries(ckpt_root)
    target = next((e for e in found if e.path.name == path.name), None)
    if target is None:
        return current
    return next_line(found, target, current)


def _compare(path: Path, config: TrainConfig) -> list[str]:
    """The training fields in which ``config`` differs from checkpoint ``path``'s config."""
    try:
        digest = str(read_manifest(path).get("spec_hash") or "")
    except CheckpointError:
        return []  # not a valid checkpoint: loading it fails with the reason
    now = config_hash(config)
    if not digest or digest == now:
        return []
    old = recorded_config(path.parent.parent, digest)
    if old is None:
        return [f"unknown fields (checkpoint config hash {digest}, now {now})"]
    return changed_fields(old, config.model_dump(mode="json"))


def plan_resume(
    want: bool | str | Path | None,
    run_dir: Path,
    config: TrainConfig,
    latest_valid: Callable[[Line], Path | None],
    *,
    allow_change: bool = False,
    restarted: bool = False,
    command: bool = False,
) -> ResumePlan:
    """Rank 0: where to start. ``want``: True = newest valid checkpoint, a path = that one,
    None/False = a fresh start. ``latest_valid(line)`` finds the newest valid checkpoint on a
    line. ``restarted``: a restart of the same command line (an explicit path recorded as
    the start of the current line then means "continue": see the module docstring). ``command``: an
    ``entrypoint.command``, which may keep checkpoints of its own in the run directory."""
    ckpt_root = run_dir / CHECKPOINTS
    existing = _existing(ckpt_root)
    record = read_branch_record(ckpt_root) if existing else None
    recorded = record.line if record is not None else Line()
    current = current_line(ckpt_root) if existing else Line()
    line, start = current, None
    path: Path | None = None
    if want is None or want is False:
        if existing:
            return ResumePlan(
                error=f"run directory {run_dir} already holds checkpoints of an earlier run "
                f"({', '.join(existing[:3])}): resume it with --resume (same config) or choose "
                "another run directory (--run-dir / train.run_dir)"
            )
    elif want is True or (
        restarted
        and record is not None
        and record.resumed_from == Path(str(want)).name
        and _inside(Path(str(want)), ckpt_root)
    ):
        path = latest_valid(current)
        if path is None:
            _no_checkpoint(ckpt_root, existing, run_dir, command)
    else:
        path = Path(str(want))
        if existing and path.resolve().parent != ckpt_root.resolve():
            return ResumePlan(
                error=f"run directory {run_dir} already holds checkpoints of another run "
                f"({existing[0]}); resume from {path} in a new run directory"
            )
        line = _line_after(path, ckpt_root, current)
        start = path.name if _inside(path, ckpt_root) else None
    write = line != recorded or start is not None
    if path is None:
        return ResumePlan(line=line, record=write)
    changed = tuple(_compare(path, config))
    if changed and not allow_change:
        return ResumePlan(
            error=f"resume from {path}: the config changed in fields that alter training: "
            f"{'; '.join(changed)}. Resume with the checkpoint's config, or allow the change "
            "with --allow-config-change (or train.allow_config_change: true); the run is then "
            "no longer an exact resume"
        )
    if line != current:
        log.info("resume from %s: %s from now on", path, line.describe())
    return ResumePlan(path=str(path), changed=changed, line=line, record=write, resumed_from=start)


def _no_checkpoint(ckpt_root: Path, existing: list[str], run_dir: Path, command: bool) -> None:
    """Say truly what a resume without a checkpoint of ours does."""
    if command:  # the command's own files (Lightning's hpc_ckpt, ...) are not ours to judge
        what = f"holds no valid checkpoint ({', '.join(existing[:3])})" if existing else "is empty"
        log.info(
            "resume: train's checkpoint directory %s %s; the command starts as it would and "
            "may resume from its own files in %s or in the folder it runs in, %s",
            ckpt_root,
            what,
            run_dir,
            os.getcwd(),
        )
    elif existing:
        log.warning("resume: no valid checkpoint among %s, starting fresh", existing)
    else:
        log.warning("resume: no valid checkpoint in %s, starting fresh", ckpt_root)


def retarget(
    optimizer: Any, scheduler: Any, old_state: dict[str, Any], step: int, factor: float
) -> None:
    """After an allowed config change: ``optimizer`` and ``scheduler`` (a ``LambdaLR``), built
    from the NEW config, continue at ``step`` with the new settings. The optimizer's state
    (momentum, Adam moments) is loaded only when the checkpoint's optimizer is of the same kind
    (same hyper-parameter names); the new hyper-parameters then replace the loaded ones. The
    lr is the new peak times ``factor`` (the new schedule at ``step``): loading the old
    scheduler state would bring the old base lr back."""
    fresh = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    old_keys = [set(g) - {"params"} for g in old_state.get("param_groups", [])]
    if old_keys == [set(g) for g in fresh]:
        optimizer.load_state_dict(old_state)
        for group, new in zip(optimizer.param_groups, fresh, strict=True):
            group.update(new)
    else:
        log.warning("the optimizer changed: its state (moments, momentum) starts afresh")
    scheduler.last_epoch = step
    for group, base in zip(optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["lr"] = base * factor
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]


def load_training_state(
    model: Any, optimizer: Any, scheduler: Any, loaded: Any, changed: bool, factor: float
) -> None:
    """Model, optimizer and schedule from checkpoint ``loaded`` (a ``LoadedCheckpoint``). After an
    allowed config change (``changed``) the new settings take effect (:func:`retarget`, the new
    schedule's ``factor`` at the checkpoint's step), and weights that do not fit the new model
    are bad input (one line), not a crash."""
    from train.checkpoint import load_model_state  # torch: only when a checkpoint is loaded

    try:
        load_model_state(model, loaded.shared["model"])
    except (RuntimeError, CheckpointError) as exc:
        if not changed:
            raise
        raise ConfigError(  # a changed model (allowed by the user) cannot load
            f"{loaded.path}: the checkpoint's weights do not fit train.model/width/norm of this "
            f"config ({str(exc).splitlines()[0][:200]}); start a new run for a new model"
        ) from exc
    if changed:
        retarget(optimizer, scheduler, loaded.shared["optimizer"], loaded.step, factor)
    else:
        optimizer.load_state_dict(loaded.shared["optimizer"])
        scheduler.load_state_dict(loaded.shared["scheduler"])
