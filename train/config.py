"""The training sections of a job spec: ``train``, ``requeue`` and ``entrypoint`` (torch-free).

A job spec YAML file holds more than training (resources, partition, ...); ``jobs`` validates
those. Here we validate strictly only the three sections train reads, and ignore the others:

    train:        TrainConfig       model, data, optimizer, batch, strategy, checkpoints, ...
    requeue:      RequeueConfig     signal, its lead time, requeue budgets
    entrypoint:   EntrypointConfig  optional: run the user's function or command instead

Every field has a default, so ``train: {}`` is a valid (CIFAR ResNet on synthetic data) spec.
``jobs.spec`` composes these models into its ``JobSpec``; this module must never import torch.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from train.errors import ConfigError

__all__ = [
    "CheckpointConfig",
    "DataConfig",
    "EntrypointConfig",
    "OptimizerConfig",
    "RequeueConfig",
    "RunConfig",
    "StrictModel",
    "TrainConfig",
    "config_hash",
    "load_run_config",
    "parse_overrides",
]


class StrictModel(BaseModel):
    """Base of every spec model: unknown keys are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


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

    @model_validator(mode="after")
    def _batch_divides(self) -> TrainConfig:
        if self.batch_size % self.grad_accum != 0:
            raise ValueError(
                f"batch_size {self.batch_size} is not divisible by grad_accum {self.grad_accum}; "
                "choose batch_size = grad_accum * (per-micro-step batch)"
            )
        return self


_SIGNAL_FORBIDDEN = {"KILL", "STOP"}


class RequeueConfig(StrictModel):
    """How the job is warned before preemption / time limit, and how often it may come back."""

    signal: Annotated[
        str, Field(description="signal Slurm sends before the end (sbatch --signal=B:SIG@delay)")
    ] = "USR2"
    signal_delay_s: Annotated[
        int, Field(description="seconds before the end the signal is sent", ge=10, le=65535)
    ] = 90
    max_preemptions: Annotated[
        int, Field(description="requeues after preemption before giving up", ge=0)
    ] = 20
    max_timeouts: Annotated[
        int, Field(description="requeues after hitting the time limit before giving up", ge=0)
    ] = 10
    max_failures: Annotated[
        int, Field(description="restarts after a failure (non-zero exit) before giving up", ge=0)
    ] = 3

    @field_validator("signal", mode="before")
    @classmethod
    def _signal_name(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        name = value.strip().upper().removeprefix("SIG")
        if name in _SIGNAL_FORBIDDEN or f"SIG{name}" not in signal.Signals.__members__:
            raise ValueError(
                f"unknown or uncatchable signal {value!r}; use one of USR1, USR2, TERM, INT, HUP"
            )
        return name


_FUNCTION_RE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class EntrypointConfig(StrictModel):
    """Run the user's own code instead of the built-in trainer (exactly one of the two)."""

    function: Annotated[
        str | None,
        Field(description='"pkg.module:function" called with a train.entry.TrainContext'),
    ] = None
    command: Annotated[
        list[str] | None,
        Field(description="argv exec'd with RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/PORT exported"),
    ] = None

    @model_validator(mode="after")
    def _exactly_one(self) -> EntrypointConfig:
        if (self.function is None) == (self.command is None):
            raise ValueError(
                'entrypoint needs exactly one of `function: "pkg.mod:fn"` or `command: [argv...]`'
            )
        if self.function is not None and not _FUNCTION_RE.match(self.function):
            raise ValueError(
                f'entrypoint.function {self.function!r} is not of the form "pkg.module:function"'
            )
        if self.command is not None:
            if not self.command:
                raise ValueError("entrypoint.command is empty; give the program and its arguments")
            for arg in self.command:
                if "\x00" in arg or "\n" in arg:
                    raise ValueError(
                        "entrypoint.command arguments must not contain NUL or newlines"
                    )
        return self


class RunConfig(BaseModel):
    """The sections of a job spec that train reads; other top-level sections are ignored here."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True)

    train: Annotated[TrainConfig, Field(description="training")] = TrainConfig()
    requeue: Annotated[RequeueConfig, Field(description="requeue policy")] = RequeueConfig()
    entrypoint: Annotated[
        EntrypointConfig | None, Field(description="user code instead of the built-in trainer")
    ] = None


def config_hash(config: TrainConfig) -> str:
    """A short hash of the fields that change the training trajectory (not paths or logging).

    Stored in checkpoint manifests so a resume with a different model/data/optimizer is noticed.
    """
    data = config.model_dump(
        mode="json", exclude={"run_dir", "checkpoint", "log_interval", "eval_every_epochs"}
    )
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def parse_overrides(overrides: Sequence[str]) -> list[tuple[list[str], Any]]:
    """Parse ``--set a.b=c`` items; values are YAML (``1``, ``0.1``, ``true``, ``[a, b]``)."""
    parsed: list[tuple[list[str], Any]] = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        keys = key.strip().split(".")
        if not sep or not all(k.strip() for k in keys):
            raise ConfigError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. train.batch_size=128")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: value is not valid YAML ({exc})") from exc
        parsed.append(([k.strip() for k in keys], value))
    return parsed


def _apply(data: dict[str, Any], keys: list[str], value: Any, item: str) -> None:
    node = data
    for k in keys[:-1]:
        child = node.get(k)
        if child is None:
            child = {}
            node[k] = child
        if not isinstance(child, dict):
            raise ConfigError(f"--set {item}: {k!r} is not a mapping")
        node = child
    node[keys[-1]] = value


def _yaml_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """Map each key path of a YAML document to its 1-based line (for error messages)."""
    lines: dict[tuple[str | int, ...], int] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines

    def walk(node: yaml.Node, path: tuple[str | int, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = (*path, str(key_node.value))
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                item_path = (*path, i)
                lines[item_path] = item.start_mark.line + 1
                walk(item, item_path)

    if root is not None:
        walk(root, ())
    return lines


def format_validation_error(
    exc: ValidationError, source: str, lines: Mapping[tuple[str | int, ...], int] | None = None
) -> str:
    """One line per problem: ``file:line: field.path: message``."""
    out = []
    for err in exc.errors():
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        line = None
        if lines:
            for n in range(len(loc), 0, -1):
                if loc[:n] in lines:
                    line = lines[loc[:n]]
                    break
        where = f"{source}:{line}" if line else source
        field = ".".join(str(x) for x in loc) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key (check the spelling; see the spec reference for valid keys)"
        out.append(f"{where}: {field}: {msg}")
    return "; ".join(out)


def load_run_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    """Read the train/requeue/entrypoint sections of a job-spec YAML file, apply ``--set``s.

    ``path`` may be None (defaults + overrides only). Raises :class:`ConfigError` with
    ``file:line: field: problem`` for unreadable files, bad YAML or invalid values.
    """
    source = "<defaults>"
    text = ""
    data: Any = {}
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{source}: cannot read config: {exc.strerror or exc}") from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"{source}:{mark.line + 1}" if mark is not None else source
            raise ConfigError(f"{where}: invalid YAML: {getattr(exc, 'problem', exc)}") from exc
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: the spec must be a mapping with a `train:` section")
    for keys, value in parse_overrides(overrides):
        _apply(data, keys, value, ".".join(keys))
    sections = {k: data[k] for k in ("train", "requeue", "entrypoint") if data.get(k) is not None}
    try:
        return RunConfig.model_validate(sections)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, source, _yaml_lines(text))) from exc
