"""Experiment tracking that survives requeues: TensorBoard scalars (and optional W&B) on rank 0.

``RUN_DIR/tensorboard/`` holds the event files, so ``tensorboard --logdir runs/`` shows every
run with no flag. What makes the curves of a preempted run clean:

- a resumed attempt opens its writer with ``purge_step = resumed step + 1``: TensorBoard's
  reader then drops every event of earlier files at or after that step (the steps written
  after the last checkpoint, which this attempt redoes), and this attempt writes them again;
- a value for a step at or before the resumed step is not written again (the earlier attempt
  wrote it before its checkpoint), so every tag has every step exactly once, in order;
- interruptions and resumes are events too: text under ``run/events`` and the scalar
  ``run/resumed_from`` at the step training continues from.

Weights & Biases (optional, ``wandb={"project": ..., ...}``): the same scalars; the W&B run id
is kept in ``RUN_DIR/wandb-id`` so a requeued job continues the same W&B run. Without the
``wandb`` package that option is a one-line :class:`TrackingError`. Everything here is a no-op
on ranks other than 0. Feed it the records ``train.loop.metrics.MetricsWriter`` writes::

    tracker = Tracker(run_dir, is_main=env.is_main, resumed_step=loaded.step or None)
    tracker.record(metrics.write("train", step=..., loss=..., ...))
    tracker.event("preempted", step)
    tracker.close()
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from train.errors import ConfigError
from train.runfiles import TENSORBOARD, WANDB_ID, write_text

if TYPE_CHECKING:
    from train.spec import TrainConfig

__all__ = ["SCALARS", "Tracker", "TrackingError"]

log = logging.getLogger(__name__)

#: metrics.jsonl field -> TensorBoard tag, per record kind
SCALARS: dict[str, dict[str, str]] = {
    "train": {
        "loss": "train/loss",
        "accuracy": "train/accuracy",
        "lr": "train/lr",
        "images_per_s": "train/images_per_s",
        "step_time_s": "train/step_time_s",
    },
    "eval": {"test_loss": "test/loss", "test_accuracy": "test/accuracy"},
}
WANDB_ID_FILE = WANDB_ID


class TrackingError(ConfigError):
    """A tracker asked for cannot be set up (e.g. ``wandb`` is not installed): bad input."""


def wandb_options(config: TrainConfig) -> dict[str, Any] | None:
    """``wandb.init`` options from ``train.wandb`` (None when unset), checked before anything
    starts: every rank refuses the same way, in one line, when the package is missing."""
    section = config.wandb
    if section is None:
        return None
    import importlib.util

    if importlib.util.find_spec("wandb") is None:
        raise TrackingError(
            "train.wandb is set but the wandb package is not installed "
            "(pip install wandb, or remove train.wandb)"
        )
    options: dict[str, Any] = section.model_dump(exclude_none=True)
    if not options.get("tags"):
        options.pop("tags", None)
    return options


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


class Tracker:
    """TensorBoard (and optionally W&B) writer of one run attempt; see the module docstring."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        is_main: bool,
        resumed_step: int | None = None,
        restart_count: int = 0,
        wandb: Mapping[str, Any] | None = None,
        tensorboard: bool = True,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.resumed_step = resumed_step
        self._tb: Any = None
        self._wandb: Any = None
        # TensorBoard is imported at the first write (~0.15 s), not before the first step
        self._want_tb = is_main and tensorboard
        self._pending: list[tuple[str, int, dict[str, Any]]] = []
        if not is_main:
            return
        if wandb is not None:
            self._wandb = _start_wandb(self.run_dir, dict(wandb))
        if resumed_step is not None:
            self._pending.append(("resume", resumed_step, {"restart_count": restart_count}))

    def _open(self) -> None:
        """Create the writer on first use (purge_step: see the module docstring)."""
        if not self._want_tb:
            return
        self._want_tb = False
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("tensorboard is not installed: no TensorBoard scalars for this run")
        else:
            purge = self.resumed_step + 1 if self.resumed_step is not None else None
            self._tb = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD), purge_step=purge)
        pending, self._pending = self._pending, []
        for name, step, fields in pending:
            self.event(name, step, **fields)

    @property
    def writer(self) -> Any:
        """The TensorBoard ``SummaryWriter`` (None on other ranks or without tensorboard), for
        user code; write only steps after :attr:`resumed_step`."""
        self._open()
        return self._tb

    def _fresh(self, step: int) -> bool:
        return self.resumed_step is None or step > self.resumed_step

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Write ``tag -> value`` at ``step`` (skipped at or before the resumed step)."""
        if not self._fresh(step) or not values:
            return
        self._open()
        if self._tb is not None:
            for tag, v in values.items():
                self._tb.add_scalar(tag, v, global_step=step)
        if self._wandb is not None:
            self._wandb.log(dict(values), step=step)

    def record(self, rec: Mapping[str, Any]) -> None:
        """Write one ``metrics.jsonl`` record (``kind`` train or eval) as scalars."""
        tags = SCALARS.get(str(rec.get("kind")), {})
        step = rec.get("step")
        if not tags or not isinstance(step, int):
            return
        values = {}
        for key, tag in tags.items():
            v = _number(rec.get(key))
            if v is not None:
                values[tag] = v
        self.scalars(step, values)

    def event(self, name: str, step: int, **fields: Any) -> None:
        """An interruption, resume or other run event, as text at ``step``."""
        detail = ", ".join(f"{k}={v}" for k, v in fields.items())
        text = f"{name} at step {step}" + (f" ({detail})" if detail else "")
        self._open()
        if self._tb is not None:
            self._tb.add_text("run/events", text, global_step=step)
            if name == "resume":
                self._tb.add_scalar("run/resumed_from", step, global_step=step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log({"run/event": text}, step=step)

    def flush(self) -> None:
        """Write everything queued to disk: call before a checkpoint commits, so no step at or
        before it is lost with a killed process (those steps are not redone)."""
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        self._open()  # a resume event still pending is written
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def _start_wandb(run_dir: Path, options: dict[str, Any]) -> Any:
    """A W&B run that a requeued attempt continues: its id lives in ``RUN_DIR/wandb-id``."""
    try:
        import wandb
    except ImportError:
        raise TrackingError(
            "train.wandb is set but the wandb package is not installed (pip install wandb)"
        ) from None
    id_file = run_dir / WANDB_ID_FILE
    try:
        run_id = id_file.read_text(encoding="utf-8").strip()
    except OSError:
        run_id = ""
    if not run_id.isalnum():  # missing or damaged: a new id, kept for the next attempt
        run_id = uuid.uuid4().hex[:16]
        write_text(id_file, run_id + "\n")
    options.setdefault("dir", str(run_dir))
    return wandb.init(id=run_id, resume="allow", **options)
