"""The training sections of a job spec: ``train``, ``requeue`` and ``entrypoint`` (torch-free).

A job spec YAML file holds more than training (resources, partition, ...); ``jobs`` validates
those. Here we validate strictly only the three sections train reads, and ignore the others:

    train:        TrainConfig       model, data, optimizer, batch, strategy, checkpoints, ...
    requeue:      RequeueConfig     signal, its lead time, requeue budgets
    entrypoint:   EntrypointConfig  optional: run the user's function or command instead

The ``requeue`` and ``entrypoint`` models live in :mod:`train.spec.policy`, their strict base in
:mod:`train.spec.base` (both importable from here too) and the trajectory hash in
:mod:`train.spec.confighash`. Every field has a default, so ``train: {}`` is a valid (CIFAR ResNet
on synthetic data) spec. ``jobs.spec`` composes these models into its ``JobSpec``; this module
(and those it imports) must never import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    model_validator,
)

from train.spec.base import StrictModel
from train.spec.messages import FieldIssue
from train.spec.policy import EntrypointConfig, RequeueConfig

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "OptimizerConfig",
    "RunConfig",
    "RunSpecFile",
    "TrainConfig",
    "check_sections",
    "load_run_config",
]


class DataConfig(StrictModel):
    """Where the images come from."""

    kind: Annotated[
        Literal["synthetic", "cifar10"],
        Field(
            description="synthetic: generated, learnable CIFAR-shaped data; cifar10: read from path"
        ),
    ] = "synthetic"
    path: Annotated[
        str | None,
        Field(
            description="cifar10: directory holding data_batch_1.bin..test_batch.bin (binary) or "
            "data_batch_1..test_batch (python pickles); synthetic: optional directory to write "
            "the generated set to in the binary format and read it back"
        ),
    ] = None
    train_size: Annotated[
        int, Field(description="synthetic: number of training images", ge=10, le=1_000_000)
    ] = 10_000
    test_size: Annotated[
        int, Field(description="synthetic: number of held-out images", ge=10, le=200_000)
    ] = 2_000
    noise: Annotated[
        float, Field(description="synthetic: noise level (0 = clean patterns)", ge=0.0, le=4.0)
    ] = 0.5
    augment: Annotated[
        bool, Field(description="random crop (pad 4) + horizontal flip on training images")
    ] = True

    @model_validator(mode="after")
    def _path_for_cifar(self) -> DataConfig:
        if self.kind == "cifar10" and not self.path:
            raise ValueError(
                "data.kind 'cifar10' needs data.path (the directory with data_batch_1.bin.. or "
                "cifar-10-batches-py); use data.kind: synthetic where the data set is not available"
            )
        return self


class OptimizerConfig(StrictModel):
    """Optimizer and learning-rate schedule."""

    name: Annotated[Literal["sgd", "adamw"], Field(description="optimizer")] = "sgd"
    lr: Annotated[float, Field(description="peak learning rate", gt=0.0, le=10.0)] = 0.1
    momentum: Annotated[float, Field(description="SGD momentum", ge=0.0, lt=1.0)] = 0.9
    nesterov: Annotated[bool, Field(description="SGD Nesterov momentum")] = True
    weight_decay: Annotated[float, Field(description="weight decay", ge=0.0, le=1.0)] = 5e-4
    schedule: Annotated[
        Literal["constant", "cosine", "onecycle"],
        Field(description="lr schedule over the whole run (stepped once per optimizer step)"),
    ] = "onecycle"
    warmup_steps: Annotated[
        int, Field(description="linear warm-up steps (cosine/constant); onecycle warms 30%", ge=0)
    ] = 0


class CheckpointConfig(StrictModel):
    """When and how checkpoints are written (RUN_DIR/checkpoints/step-N)."""

    interval_steps: Annotated[
        int,
        Field(description="save every N optimizer steps (0 = only at the end / on signal)", ge=0),
    ] = 500
    keep_last: Annotated[int, Field(description="number of recent checkpoints kept", ge=1)] = 3
    keep_best: Annotated[
        bool, Field(description="also keep the checkpoint with the best test accuracy")
    ] = True
    async_save: Annotated[
        bool,
        Field(
            description="write checkpoints in a background thread (YAML key `async`)",
            validation_alias=AliasChoices("async", "async_save"),
        ),
    ] = False


class WandbConfig(StrictModel):
    """Optional Weights & Biases logging of the same scalars as TensorBoard (``pip install wandb``).

    The W&B run id is kept in ``RUN_DIR/wandb-id``, so a requeued job continues the same run.
    """

    project: Annotated[str, Field(description="W&B project", min_length=1)]
    entity: Annotated[str | None, Field(description="W&B entity (user or team)")] = None
    name: Annotated[str | None, Field(description="display name of the run")] = None
    group: Annotated[str | None, Field(description="group (e.g. a sweep's name)")] = None
    # pydantic copies field defaults per instance (ruff cannot see StrictModel is a BaseModel).
    tags: Annotated[list[str], Field(description="tags of the run")] = []  # noqa: RUF012
    mode: Annotated[
        Literal["online", "offline", "disabled"] | None,
        Field(description="online, offline (sync later with `wandb sync`) or disabled"),
    ] = None


class TrainConfig(StrictModel):
    """The ``train`` section: everything the built-in trainer needs. All fields have defaults."""

    model: Annotated[
        Literal["resnet", "tinycnn"],
        Field(description="resnet: ResNet-9-like CIFAR net (~0.6M-6M params); tinycnn: for tests"),
    ] = "resnet"
    norm: Annotated[
        Literal["batch", "none"],
        Field(description="batch: BatchNorm after each conv; none: no normalisation layers"),
    ] = "batch"
    width: Annotated[int, Field(description="base channel width of the model", ge=4, le=512)] = 16
    data: Annotated[DataConfig, Field(description="data set")] = DataConfig()
    optimizer: Annotated[OptimizerConfig, Field(description="optimizer")] = OptimizerConfig()
    epochs: Annotated[int, Field(description="passes over the training set", ge=1)] = 10
    max_steps: Annotated[
        int | None,
        Field(description="stop after this many optimizer steps (overrides epochs)", ge=1),
    ] = None
    batch_size: Annotated[
        int,
        Field(description="global batch per optimizer step, over all ranks and micro-steps", ge=1),
    ] = 256
    grad_accum: Annotated[
        int, Field(description="micro-steps accumulated per optimizer step", ge=1, le=1024)
    ] = 1
    strategy: Annotated[
        Literal["ddp", "dp", "pipeline", "single"],
        Field(
            description="ddp: one task per device; dp: nn.DataParallel in one task over all local "
            "devices; pipeline: model split in stages over local devices; single: one process"
        ),
    ] = "ddp"
    pipeline_chunks: Annotated[
        int, Field(description="pipeline: micro-batches each batch is split into", ge=1, le=256)
    ] = 4
    sync_batchnorm: Annotated[
        bool, Field(description="ddp: convert BatchNorm to SyncBatchNorm (global batch statistics)")
    ] = False
    checkpoint: Annotated[CheckpointConfig, Field(description="checkpointing")] = CheckpointConfig()
    run_dir: Annotated[
        str | None,
        Field(description="run directory (checkpoints, metrics, logs); --run-dir overrides"),
    ] = None
    seed: Annotated[int, Field(description="seed for init, data order and augmentation", ge=0)] = 0
    deterministic: Annotated[
        bool, Field(description="torch.use_deterministic_algorithms: bitwise reproducible resume")
    ] = False
    num_threads: Annotated[
        int | None,
        Field(
            description="torch intra-op threads per rank (default: SLURM_CPUS_PER_TASK or torch's)",
            ge=1,
            le=1024,
        ),
    ] = None
    allow_cpu_fallback: Annotated[
        bool,
        Field(description="train on CPU when GPUs are allocated but CUDA is unavailable"),
    ] = False
    precision: Annotated[
        Literal["fp32", "bf16", "fp16"],
        Field(
            description="autocast precision on CUDA (fp16 uses a GradScaler); CPU runs fp32/bf16"
        ),
    ] = "fp32"
    channels_last: Annotated[
        bool,
        Field(description="NHWC memory format for model and inputs (faster convolutions on GPUs)"),
    ] = False
    compile: Annotated[
        bool,
        Field(description="torch.compile the model in place (slower first steps, then faster)"),
    ] = False
    log_interval: Annotated[
        int, Field(description="optimizer steps between metric lines (host syncs only then)", ge=1)
    ] = 50
    eval_every_epochs: Annotated[
        int,
        Field(description="evaluate on held-out data every N epochs (and always at the end)", ge=1),
    ] = 1
    stop_check_s: Annotated[
        float,
        Field(
            description="distributed runs: seconds of training between the ranks' checks for a "
            "stop signal (the stop follows within about twice this); 0 = every step",
            ge=0.0,
            le=60.0,
        ),
    ] = 0.5
    target_accuracy: Annotated[
        float | None,
        Field(
            description="finish at the first evaluation whose test accuracy reaches this "
            "(a fraction, e.g. 0.94); the run then counts as complete",
            gt=0.0,
            le=1.0,
        ),
    ] = None
    wandb: Annotated[
        WandbConfig | None, Field(description="also log to Weights & Biases (optional)")
    ] = None
    allow_config_change: Annotated[
        bool,
        Field(
            description="resume even though fields that alter training changed; the new values "
            "take effect and the run is no longer an exact resume (--allow-config-change)"
        ),
    ] = False

    @model_validator(mode="after")
    def _batch_divides(self) -> TrainConfig:
        if self.batch_size % self.grad_accum != 0:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}; "
                "choose batch_size = grad_accum * (per-micro-step batch)"
            )
        return self


class RunConfig(BaseModel):
    """The sections of a job spec that train reads; other top-level sections are ignored here."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, allow_inf_nan=False)

    train: Annotated[TrainConfig, Field(description="training")] = TrainConfig()
    requeue: Annotated[RequeueConfig, Field(description="requeue policy")] = RequeueConfig()
    entrypoint: Annotated[
        EntrypointConfig | None, Field(description="user code instead of the built-in trainer")
    ] = None


def check_sections(train: bool, entrypoint: bool) -> None:
    """THE rule of what a spec file runs, for ``jobs`` and ``train`` alike (one rule, one
    behaviour): ``entrypoint:`` runs the user's code, and a ``train:`` beside it holds the
    settings that code and its session read (checkpoints, run dir, the numbers a function
    takes from ``ctx.config.train``); without ``entrypoint:``, ``train:`` runs the built-in
    trainer. A file with neither says nothing of what to run: refused (FieldIssue)."""
    if not train and not entrypoint:
        raise FieldIssue(
            "train",
            "give `train:` (the built-in trainer) or `entrypoint:` (your code); "
            "add `train: {}` for the trainer's defaults",
        )


class RunSpecFile(RunConfig):
    """:class:`RunConfig` read from a spec file: it must say what it runs (:func:`check_sections`,
    the rule ``jobs submit`` applies to the same file)."""

    @model_validator(mode="after")
    def _sections(self) -> RunSpecFile:
        check_sections("train" in self.model_fields_set, self.entrypoint is not None)
        return self


def load_run_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read the train/requeue/entrypoint sections of a job-spec YAML file, apply ``--set``s.

    ``path`` may be None (defaults + overrides only). The file, the YAML, the overrides and the
    error lines are :mod:`train.spec.load`'s, shared with ``python -m jobs``: the same file and
    overrides give the same values and the same ``file:line:column: field: problem (hint)``.
    Raises :class:`train.errors.SpecError` (a :class:`ConfigError`).
    """
    from train.spec.load import load_source, read_spec_file
    from train.spec.messages import validate

    if path is None:
        text, filename = "{}", "<defaults>"
    else:
        filename = str(path)
        text = read_spec_file(path)
    source, parsed, data = load_source(text, filename, overrides)
    sections = {k: data[k] for k in ("train", "requeue", "entrypoint") if data.get(k) is not None}
    if path is None:  # no file: the defaults and the overrides
        return validate(RunConfig, sections, source, parsed)
    return validate(RunSpecFile, sections, source, parsed)
