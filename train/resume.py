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
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from train.checkpoint.manifest import STEP_RE, read_manifest
from train.errors import CheckpointError, ConfigError
from train.runfiles import write_text
from train.spec.config import TrainConfig
from train.spec.confighash import config_hash

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
    training fields that differ from the checkpoint's config, or why the run is refused."""

    path: str | None = None
    changed: tuple[str, ...] = ()
    error: str | None = None


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
    return run_dir / "configs" / f"{digest}.json"


def record_config(run_dir: Path, config: TrainConfig) -> None:
    """Keep ``config`` as ``RUN_DIR/configs/HASH.json`` (rank 0; atomic; never overwritten)."""
    path = _config_file(run_dir, config_hash(config))
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    write_text(tmp, json.dumps(config.model_dump(mode="json"), sort_keys=True))
    os.replace(tmp, path)


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
        names = [p.name for p in ckpt_root.iterdir() if STEP_RE.match(p.name)]
    except OSError:
        return []
    return sorted(names, key=lambda n: int(n.split("-")[1]), reverse=True)


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
    latest_valid: Any,
    *,
    allow_change: bool = False,
) -> ResumePlan:
    """Rank 0: where to start. ``want``: True = newest valid checkpoint, a path = that one,
    None/False = a fresh start. ``latest_valid()`` finds the newest valid checkpoint."""
    ckpt_root = run_dir / "checkpoints"
    existing = _existing(ckpt_root)
    path: Path | None = None
    if want is None or want is False:
        if existing:
            return ResumePlan(
                error=f"run directory {run_dir} already holds checkpoints of an earlier run "
                f"({', '.join(existing[:3])}): resume it with --resume (same config) or choose "
                "another run directory (--run-dir / train.run_dir)"
            )
    elif want is True:
        path = latest_valid()
        if path is None and existing:
            log.warning("resume: no valid checkpoint among %s, starting fresh", existing)
        elif path is None:
            log.warning("resume: no valid checkpoint in %s, starting fresh", ckpt_root)
    else:
        path = Path(str(want))
        if existing and path.resolve().parent != ckpt_root.resolve():
            return ResumePlan(
                error=f"run directory {run_dir} already holds checkpoints of another run "
                f"({existing[0]}); resume from {path} in a new run directory"
            )
    if path is None:
        return ResumePlan()
    changed = tuple(_compare(path, config))
    if changed and not allow_change:
        return ResumePlan(
            error=f"resume from {path}: the config changed in fields that alter training: "
            f"{'; '.join(changed)}. Resume with the checkpoint's config, or allow the change "
            "with --allow-config-change (or train.allow_config_change: true); the run is then "
            "no longer an exact resume"
        )
    return ResumePlan(path=str(path), changed=changed)


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
    from train.checkpoint.manager import load_model_state  # torch: only when a checkpoint is loaded

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
