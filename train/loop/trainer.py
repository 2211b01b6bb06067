"""The built-in training loop: ``run_training(config, env, run_dir, max_steps) -> TrainResult``.

One optimizer step = ``grad_accum`` micro-steps on every rank; the global batch is
``batch_size = world_size x grad_accum x micro_batch`` and each micro-loss is divided by
``grad_accum`` (DDP averages over ranks), so the gradient is the mean over the global batch.
Per step the loop does no host sync and no host-to-device copy: metrics stay on the device
until a log interval, the data order and the augmentation draws reach the device once per epoch,
and the stop flag is agreed over a CPU (gloo) group so a CUDA stream never waits.

Resume is exact: the global batches are a function of (seed, epoch, step) and so is their
augmentation (:mod:`train.loop.order`: the world size only decides which rank computes which
slice), and model/optimizer/scheduler/RNG/position come from the checkpoint, so an interrupted
and resumed run matches an uninterrupted one bitwise on CPU with ``deterministic: true``. A run
resumed on another world size continues with the same global batches (fewer ranks accumulate
more micro-steps) and, without BatchNorm, the parameters of a run trained at the new size
throughout, up to the float reduction order; its resume event says ``exact: false`` either way
and, for a BatchNorm model, why it is not the same computation.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from train.checkpoint import capture_rng_state, restore_rng_state
from train.device import DeviceInfo
from train.env import DistEnv
from train.errors import TrainingError
from train.loop.data import Augmenter
from train.loop.metrics import MetricsWriter, StepMeter, StepTimer, evaluate, progress_line
from train.loop.optim import build_optimizer, build_scheduler, lr_factor
from train.loop.order import epoch_batches, plan_split
from train.loop.setup import build_training_model, shard_data
from train.loop.strategies import Strategy
from train.resume import load_training_state
from train.runtime import StopPoll, precision_context
from train.session import RunSession
from train.spec import RequeueConfig, TrainConfig
from train.startup import mark
from train.stop import PreemptionGuard
from train.tracking import Tracker, wandb_options

__all__ = ["BATCH_HOOKS", "WARMUP_STEPS", "TrainResult", "run_training"]

log = logging.getLogger(__name__)

#: Steps after (re)start excluded from images/s: allocation, autotuning, first-touch costs.
WARMUP_STEPS = 5

#: Called as ``hook(step, epoch, indices)`` before each optimizer step with the training-set
#: indices this rank computes in it (``int64``, on the data's device): observers (a test that
#: checks every sample is seen once) hook in here; nothing is called when the list is empty.
BATCH_HOOKS: list[Callable[[int, int, torch.Tensor], None]] = []


@dataclass
class TrainResult:
    """What a run did. ``exit_code`` 0: finished; otherwise the process exit code (requeue)."""

    steps: int = 0
    epoch: int = 0
    exit_code: int = 0
    stopped: str | None = None
    loss: float | None = None
    train_accuracy: float | None = None
    test_loss: float | None = None
    test_accuracy: float | None = None
    images_per_s: float | None = None
    wall_s: float = 0.0
    checkpoint: Path | None = None
    resumed_from: Path | None = None
    metrics: list[dict[str, Any]] = field(default_factory=list)


class _Loop:
    """State of one run; :meth:`run` is the loop. Built by :func:`run_training`."""

    def __init__(self, config: TrainConfig, session: RunSession) -> None:
        env, rt, devices = session.env, session.rt, session.devices
        self.config, self.env, self.session = config, env, session
        self.run_dir, self.ckpt, self.rt = session.run_dir, session.ckpt, rt
        data = shard_data(
            config, env, rt, session.checkpoint_world_size, keep_micro=self._kept_micro()
        )
        self.split, self.micro = data.split, data.micro
        self.steps_per_epoch = data.steps_per_epoch
        self.planned = config.max_steps or config.epochs * self.steps_per_epoch
        self.strat: Strategy = build_training_model(config, devices, env)
        self.optimizer = build_optimizer(config.optimizer, self.strat.model)
        self.scheduler = build_scheduler(config.optimizer, self.optimizer, self.planned)
        self.autocast, self.scaler = precision_context(config, devices)
        in_dev, self.out_dev = self.strat.input_device, self.strat.output_device
        self.train_set, self.test_set = data.train_set.to(in_dev), data.test_set.to(in_dev)
        self.aug = Augmenter(in_dev, augment=config.data.augment, seed=config.seed)
        self.crops: torch.Tensor | None = None  # this epoch's augmentation draws
        self.meter = StepMeter(self.out_dev)
        self.timer = StepTimer(self.out_dev)
        self.metrics = MetricsWriter(self.run_dir, env.is_main)
        self.tracker: Tracker | None = None  # TensorBoard on rank 0, opened after the resume
        self.step = self.epoch = self.epoch_step = 0
        self.best: float | None = None
        self.result = TrainResult(metrics=self.metrics.records)
        self.saving_s = 0.0  # interval saves' blocking seconds since the last train line

    # -- checkpoints ---------------------------------------------------------------------------
    def restore(self, path: Path) -> None:
        """Load model/optimizer/scheduler/scaler/RNG and the position from checkpoint ``path``."""
        # Another world size: the position is the run's (the manifest), and every rank takes
        # rank 0's RNG state (rank files exist for the old ranks only; training draws nothing
        # from the global generators, augmentation is keyed by (seed, epoch, step)).
        loaded = self.ckpt.load(path, rank=0 if self.reshaped else None)
        factor = lr_factor(self.config.optimizer, loaded.step, self.planned)
        changed = bool(self.session.config_changed)
        load_training_state(
            self.strat.model, self.optimizer, self.scheduler, loaded, changed, factor
        )
        if self.scaler is not None and loaded.shared.get("scaler"):
            self.scaler.load_state_dict(loaded.shared["scaler"])
        self.best = (loaded.shared.get("metrics") or {}).get("best_test_accuracy")
        if loaded.rank_state is not None:
            restore_rng_state(loaded.rank_state["rng"])
        self.step = loaded.step
        self.epoch = int(loaded.manifest["epoch"])
        self.epoch_step = int(loaded.manifest["epoch_step"])
        if self.epoch_step >= self.steps_per_epoch:
            self.epoch, self.epoch_step = self.epoch + 1, 0
        self.result.resumed_from = path
        log.info(
            f"resumed from {path}: step {self.step} (epoch {self.epoch}, step {self.epoch_step})"
        )

    def _kept_micro(self) -> int | None:
        """The micro-batch of the checkpoint resumed from (its manifest's split), which this
        attempt keeps (train.loop.order), unless the batch itself was changed on purpose
        (an allowed config change of ``train.batch_size`` or ``train.grad_accum``)."""
        split = self.session.checkpoint_split
        changed = {c.split(" ", 1)[0] for c in self.session.config_changed}
        if split is None or changed & {"train.batch_size", "train.grad_accum"}:
            return None
        return split["micro_batch"]

    @property
    def reshaped(self) -> bool:
        """Resumed from a checkpoint written at another world size."""
        was = self.session.checkpoint_world_size
        return was is not None and was != self.env.world_size

    def resume_note(self) -> dict[str, Any]:
        """The resume event's fields, for every resume: the split this attempt computes each
        global batch with (``grad_accum`` micro-steps of ``micro_batch``), the checkpoint's
        where it differs (``was_*``), and whether the run computes exactly what it would have
        computed without the stop (``exact``; ``why`` not). World size changes are named by
        the session (``was_world_size``)."""
        cfg, world = self.config, self.env.world_size
        was_world = self.session.checkpoint_world_size or world
        was = self.session.checkpoint_split or (  # a checkpoint that records no split: the old
            plan_split(cfg.batch_size, was_world, cfg.grad_accum).to_json()  # rule's guess
        )
        k, m = self.split.grad_accum, self.micro
        fields: dict[str, Any] = {"grad_accum": k, "micro_batch": m}
        why: list[str] = []
        batch_norm = cfg.norm == "batch"
        if (was["grad_accum"], was["micro_batch"]) != (k, m):
            fields.update(was_grad_accum=was["grad_accum"], was_micro_batch=was["micro_batch"])
            if batch_norm and was["micro_batch"] != m:
                why.append(
                    "BatchNorm normalises with the statistics of each micro-batch on each "
                    f"rank; micro-batches of {was['micro_batch']} became {m}"
                )
            else:
                why.append(
                    f"{was['grad_accum']} micro-step(s) of {was['micro_batch']} became {k} of "
                    f"{m}: sums are reduced in another order"
                )
        if was_world != world:
            if batch_norm:
                why.append(
                    "BatchNorm's running statistics are updated on each rank per micro-batch "
                    f"(rank 0's are kept): {was_world} rank(s) -> {world} keep other ones"
                )
            why.append(
                f"world size {was_world} -> {world}: same global batches; sums are reduced "
                "in another order"
            )
        fields["exact"] = not why
        if why:
            fields["why"] = "; ".join(why)
        return fields

    def save(self, metric: float | None = None, *, interval: bool = False) -> None:
        """Checkpoint the current step (every rank; collective through marker files).
        ``interval``: a save during training (its blocking time goes to metrics.jsonl)."""
        self.timer.pause()
        shared = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "metrics": {"best_test_accuracy": self.best, "step": self.step},
        }
        rank_state = {
            "rng": capture_rng_state(),
            "epoch": self.epoch,
            "epoch_step": self.epoch_step,
        }
        if self.tracker is not None:  # every step up to this checkpoint is on disk first
            self.tracker.flush()
        with self.session.busy("save"):  # and rank 0's collection of the other ranks' parts
            path = self.ckpt.save(
                self.step,
                shared,
                rank_state,
                epoch=self.epoch,
                epoch_step=self.epoch_step,
                model=self.strat.model,
                metric=metric,
                split=self.split.to_json(),
            )
        # None: this step was already saved (an interval save right before a stop signal).
        self.result.checkpoint = path or self.result.checkpoint
        if interval and path is not None:  # on the next train line (the goodput ledger)
            self.saving_s += self.ckpt.last_blocking_s

    def event(self, name: str, **fields: Any) -> None:
        """Append to RUN_DIR/events.jsonl (rank 0)."""
        self.session.event(name, self.step, **fields)

    # -- the loop ------------------------------------------------------------------------------
    def run_eval(self, stop_at: int) -> bool:
        """Evaluate on the held-out set; record test loss/accuracy. True: a new best."""
        self.timer.pause()
        began = time.perf_counter()
        with self.session.busy("eval"):  # no step for as long as it takes: not a hang
            loss, acc = evaluate(
                self.strat.eval_module,
                self.test_set,
                self.aug,
                self.env,
                max(self.micro * 2, 256),
                self.out_dev,
                waiting=self.session.waiting,  # the all-reduce at its end waits for the others
            )
        improved = self.best is None or acc > self.best
        self.best = acc if self.best is None else max(self.best, acc)
        self.result.test_loss, self.result.test_accuracy = loss, acc
        rec = self.metrics.write(
            "eval",
            step=self.step,
            epoch=self.epoch,
            test_loss=loss,
            test_accuracy=acc,
            seconds=round(time.perf_counter() - began, 4),
        )
        if self.tracker is not None:
            self.tracker.record(rec)
        if self.env.is_main:
            log.info("%s", progress_line(rec, stop_at))
        return improved

    def target_reached(self) -> bool:
        """``train.target_accuracy`` reached (by this run, or before the checkpoint it resumed)."""
        target = self.config.target_accuracy
        return target is not None and self.best is not None and self.best >= target

    def end_epoch(self, stop_at: int) -> None:
        """Evaluate when due, move to the next epoch, and save when the interval or a new best
        (``checkpoint.keep_best``: the best checkpoint holds the model that scored it) asks.
        The interval save of an epoch's last step happens here, after the evaluation, so the
        checkpoint carries its score."""
        cfg = self.config.checkpoint
        evaluated = (self.epoch + 1) % self.config.eval_every_epochs == 0 or self.step >= stop_at
        improved = self.run_eval(stop_at) if evaluated else False
        self.epoch, self.epoch_step = self.epoch + 1, 0
        if self.target_reached():
            self.event("target", test_accuracy=self.best, target=self.config.target_accuracy)
            return  # the loop ends; the final save follows
        interval_due = cfg.interval_steps and self.step % cfg.interval_steps == 0
        if self.step < stop_at and (interval_due or (improved and cfg.keep_best)):
            self.save(metric=self.result.test_accuracy if evaluated else None, interval=True)
        self.timer.start()

    def train_step(self, order: torch.Tensor) -> None:
        """One optimizer step: ``grad_accum`` micro-steps, DDP sync on the last one only."""
        k, micro, strat = self.split.grad_accum, self.micro, self.strat
        crops = None if self.crops is None else self.crops[self.epoch_step]
        for hook in BATCH_HOOKS:
            hook(self.step, self.epoch, order[self.epoch_step])
        for m in range(k):
            idx = order[self.epoch_step, m * micro : (m + 1) * micro]
            x = self.aug.apply(self.train_set.images[idx], crops, m * micro)
            if self.config.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            y = self.train_set.labels[idx].to(self.out_dev, non_blocking=True)
            with strat.no_sync(m < k - 1):
                with self.autocast():
                    logits = strat(x)
                loss = nn.functional.cross_entropy(logits.float(), y)
                scaled = loss / k
                (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()
            self.meter.add(loss.detach(), logits.detach(), y)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1
        self.epoch_step += 1
        self.timer.count(self.config.batch_size)

    def log_train(self, stop_at: int, since: tuple[float, int]) -> tuple[float, int]:
        """Reduce the step meters over ranks (the only host sync) and write a metrics line."""
        stats = self.meter.reduce()
        now = time.perf_counter()
        if not math.isfinite(stats["loss"]):
            raise TrainingError(
                f"loss is {stats['loss']} at step {self.step}: lower train.optimizer.lr "
                "or check the data"
            )
        rec = self.metrics.write(
            "train",
            step=self.step,
            epoch=self.epoch,
            loss=stats["loss"],
            accuracy=stats["accuracy"],
            lr=self.scheduler.get_last_lr()[0],
            images_per_s=(self.step - since[1])
            * self.config.batch_size
            / max(now - since[0], 1e-9),
            **({"checkpoint_s": round(self.saving_s, 4)} if self.saving_s else {}),
        )
        self.saving_s = 0.0
        if self.tracker is not None:
            self.tracker.record(rec)
        self.result.loss, self.result.train_accuracy = stats["loss"], stats["accuracy"]
        if self.env.is_main:
            log.info("%s", progress_line(rec, stop_at))
        return now, self.step

    def run(self, stop_at: int, guard: PreemptionGuard) -> TrainResult:
        """Train until ``stop_at`` steps or a stop signal; returns the result."""
        cfg, spe = self.config, self.steps_per_epoch
        n_epochs = math.ceil(self.planned / spe)
        start_step, since = self.step, (time.perf_counter(), self.step)
        poll = StopPoll(self.rt, cfg.stop_check_s, start_step, skip=WARMUP_STEPS)
        self.strat.train(True)
        while self.step < stop_at and self.epoch < n_epochs and not self.target_reached():
            # the epoch's global batches, this rank's slice of each (train.loop.order)
            mine = self.split.rank_slice(self.env.rank)
            batches = epoch_batches(
                len(self.train_set),
                seed=cfg.seed,
                epoch=self.epoch,
                batch_size=cfg.batch_size,
                steps=spe,
            )
            order = batches[:, mine].contiguous().to(self.train_set.images.device)
            # this epoch's crops and flips, drawn for the whole global batch (rank 0's key:
            # the same draws at every world size) and sliced like the order: one copy per epoch
            crops = self.aug.draw_epoch(cfg.batch_size, spe, epoch=self.epoch, rank=0)
            self.crops = None if crops is None else crops[:, :, mine].contiguous()
            while self.epoch_step < spe and self.step < stop_at:
                if self.step - start_step == WARMUP_STEPS:
                    self.timer.armed = True
                    self.timer.start()
                self.train_step(order)
                self.session.progress(self.step)
                if self.step % cfg.log_interval == 0 or self.step == stop_at:
                    since = self.log_train(stop_at, since)
                interval = cfg.checkpoint.interval_steps
                # the run's last step: the final save; an epoch's: end_epoch, after its eval
                last = self.step >= stop_at or self.epoch_step >= spe
                if interval and self.step % interval == 0 and not last:
                    self.save(interval=True)
                    self.timer.start()
                # Lagged: the flag's reduce overlaps the next steps (no round trip per check).
                if poll.due(self.step) and guard.should_stop(self.rt.lagged_max):
                    return self.stop(guard)
            if self.epoch_step >= spe:
                self.end_epoch(stop_at)
        if not self.metrics.records or self.metrics.records[-1]["kind"] != "eval":
            self.run_eval(stop_at)
        self.save(metric=self.result.test_accuracy)
        with self.session.busy("save"):
            self.ckpt.wait()
        self.session.complete(self.step, test_accuracy=self.result.test_accuracy)
        return self.finish()

    def stop(self, guard: PreemptionGuard) -> TrainResult:
        """Stop signal agreed: save, wait, barrier, requeue (the session); return the result."""
        self.result.exit_code = self.session.stop(self.step, self.save)
        self.result.stopped = self.session.stopped
        return self.finish()

    def finish(self) -> TrainResult:
        self.timer.pause()
        r = self.result
        r.steps, r.epoch, r.images_per_s = self.step, self.epoch, self.timer.images_per_s
        self.metrics.close()
        if self.tracker is not None:
            if r.stopped:
                self.tracker.event(str(r.stopped), self.step)
            self.tracker.close()
        return r


def run_training(
    config: TrainConfig,
    env: DistEnv,
    run_dir: Path,
    max_steps: int | None = None,
    *,
    resume: bool | str | Path | None = None,
    requeue: RequeueConfig | None = None,
    guard: PreemptionGuard | None = None,
    devices: DeviceInfo | None = None,
    allow_config_change: bool = False,
) -> TrainResult:
    """Train ``config`` in this process as rank ``env.rank`` and return what happened.

    ``max_steps`` truncates the run (the LR schedule still spans the configured length, so a
    truncated run is a prefix of the full one). ``resume``: True = newest valid checkpoint, a
    path = that checkpoint, None = only when ``env.restart_count > 0``. A stop signal (``guard``;
    one is installed when none is given) saves, waits, meets at a barrier and returns
    ``request_requeue``'s exit code in ``TrainResult.exit_code``. Set-up and take-down are the
    :class:`train.session.RunSession` (process group, checkpoints, the resume choice and its
    config check: ``allow_config_change`` lets fields that alter training differ).
    """
    t0 = time.perf_counter()
    wandb = wandb_options(config)
    session = RunSession(
        config,
        requeue or RequeueConfig(),
        env,
        Path(run_dir),
        resume=resume,
        guard=guard,
        devices=devices,
        allow_config_change=allow_config_change,
    )
    with session:
        loop = _Loop(config, session)
        try:
            mark("data_model")
            if session.resume_from is not None:
                loop.restore(session.resume_from)
                mark("restored")
            session.started(loop.step, **(loop.resume_note() if session.resume_from else {}))
            loop.tracker = Tracker(
                loop.run_dir,
                is_main=env.is_main,
                resumed_step=loop.step if session.resume_from is not None else None,
                restart_count=env.restart_count,
                wandb=wandb,
            )
            stop_at = min(loop.planned, max_steps) if max_steps else loop.planned
            if env.is_main:
                c, w, k = config, env.world_size, loop.split.grad_accum
                log.info(
                    f"training {c.model}/{c.strategy} on {session.devices.device}: {w} rank(s), "
                    f"global batch {c.batch_size} = {w} rank(s) x {k} micro-step(s) x {loop.micro}"
                    f", {loop.steps_per_epoch} steps/epoch, steps {loop.step}..{stop_at}"
                )
            try:
                result = loop.run(stop_at, session.guard)
            except Exception as exc:
                # A failure while training is recorded and requeued while requeue.max_failures
                # allows; the run resumes from the newest valid checkpoint.
                code = session.fail(exc, f"training failed at step {loop.step}", loop.step)
                result = loop.finish()
                result.stopped, result.exit_code = "failure", code
            result.wall_s = time.perf_counter() - t0
            return result
        finally:
            loop.strat.release()  # before the session destroys the group, on every path
